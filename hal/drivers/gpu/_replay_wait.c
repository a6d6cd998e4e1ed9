/*
 * A host wait on a GPU device's semaphore, from C: Replay.wait_on.
 *
 * A loop that submits and then waits for the result (reading a loss, a one-op reduction) ends
 * each step in `sem.wait(value)`: hal/semaphore.py `Semaphore.wait`, `EventSemaphore._wait`,
 * `GpuQueue.wait` (the event synchronize), `GpuQueue.retire_through`, `Completion.finish` and
 * two `_advance`s, some 170 bytecodes of Python that run after the work completed, while the
 * caller waits for them. `wait_on` makes the same steps from C for the usual wait and nothing
 * else:
 *
 *   sem.wait(value) or sem.wait(value, timeout=None)
 *
 * where `value` is an int not yet reached, the semaphore has not failed, its latest timepoint is
 * the one covering `value` and was issued on queue 0, the device is open and tracing is off.
 * Anything else, at any check, calls the Python wait (`python_wait`), which checks and reports
 * exactly as without this file. A driver call that fails with a HalError (the event synchronize
 * of a faulted context) also hands over to the Python wait, which makes the call again and
 * records the failure as it does. Retiring a submission that is not the usual one (one-shot
 * command buffers, resources to release) and advancing a semaphore with listeners, host waiters
 * or parked work call the Python method of that step, so each rule keeps one Python definition.
 *
 * `GpuDevice` binds it to each of its semaphores as their instance's `wait` (see
 * hal/drivers/gpu/replay.py); `HAL_NATIVE=0` leaves the Python method.
 */
#include "_replay.h"

#define SUB_FIELD(self, sub, index) (*(PyObject **)((char *)(sub) + (self)->slot[index]))

/* Semaphore._advance (with EventSemaphore's parked-work check) when nothing waits on the
   semaphore but the value: no listener, no host waiter, no parked work; else sem.advance(value).
   -1 with an error set. */
static int advance(Replay *self, PyObject *sem, PyObject *value) {
    if (Py_TYPE(sem) == self->event_semaphore_type) {
        PyObject *lock = PyObject_GetAttr(sem, s_sem_lock);
        if (lock == NULL || acquire(lock) < 0) {
            Py_XDECREF(lock);
            return -1;
        }
        int usual = 0;
        PyObject *current = PyObject_GetAttr(sem, s_value), *listeners = PyObject_GetAttr(sem, s_listeners);
        PyObject *waiters = PyObject_GetAttr(sem, s_waiters), *issuable = PyObject_GetAttr(sem, s_issuable);
        int failure_none = attr_is(sem, s_failure, Py_None);
        if (current != NULL && listeners != NULL && waiters != NULL && issuable != NULL && failure_none >= 0 &&
            PyList_CheckExact(listeners) && PyList_GET_SIZE(listeners) == 0 && PyList_CheckExact(issuable) &&
            PyList_GET_SIZE(issuable) == 0 && PyLong_CheckExact(waiters) && PyLong_AsLong(waiters) == 0) {
            usual = 1;
            if (failure_none == 1 && compare(current, value, Py_LT) && PyObject_SetAttr(sem, s_value, value) < 0)
                usual = -1;
        }
        if (usual == 0)
            PyErr_Clear();
        Py_XDECREF(current);
        Py_XDECREF(listeners);
        Py_XDECREF(waiters);
        Py_XDECREF(issuable);
        int unlocked = unlock_keeping(lock, NULL);
        Py_DECREF(lock);
        if (usual < 0 || unlocked < 0)
            return -1;
        if (usual)
            return 0;
    }
    return call_method(sem, s_advance, &value, 1);
}

/* Completion.finish(sub, None): its signals advance, it leaves the outstanding submissions, the
   deferred releases it held back run. Any submission with more to it (one-shot command buffers,
   resources) goes to the Python method. -1 with an error set. */
static int finish(Replay *self, PyObject *sub) {
    int usual = (PyObject *)Py_TYPE(sub) == self->submission_type &&
                SUB_FIELD(self, sub, SUB_RESOURCES) == Py_None;
    PyObject *command_buffers = usual ? SUB_FIELD(self, sub, SUB_COMMAND_BUFFERS) : NULL;
    PyObject *signals = usual ? SUB_FIELD(self, sub, SUB_SIGNALS) : NULL;
    usual = usual && PyList_CheckExact(command_buffers) && PyList_CheckExact(signals);
    for (Py_ssize_t i = 0; usual && i < PyList_GET_SIZE(command_buffers); i++)
        usual = attr_is(PyList_GET_ITEM(command_buffers, i), s_one_shot, Py_False) == 1;
    if (!usual) {
        PyObject *args[2] = {sub, Py_None};
        return call_method(self->completion, s_finish, args, 2);
    }
    PyObject **retired = &SUB_FIELD(self, sub, SUB_RETIRED);
    Py_SETREF(*retired, Py_NewRef(Py_True));
    Py_INCREF(signals); /* the list may change while a Python advance runs */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(signals); i++) {
        PyObject *pair = PyList_GET_ITEM(signals, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_TypeError, "a submission's signal is not a (semaphore, value) pair");
            Py_DECREF(signals);
            return -1;
        }
        Py_INCREF(pair);
        int status = advance(self, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
        Py_DECREF(pair);
        if (status < 0) {
            Py_DECREF(signals);
            return -1;
        }
    }
    Py_DECREF(signals);
    PyObject *seq = SUB_FIELD(self, sub, SUB_SEQ);
    if (PyDict_DelItem(self->outstanding, seq) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return -1;
        PyErr_Clear(); /* outstanding.pop(seq, None) */
    }
    int deferred = attr_true(self->completion, s_deferred);
    if (deferred < 0 || (deferred && call_method0(self->completion, s_run_deferred) < 0))
        return -1;
    int idle_waiters = attr_true(self->completion, s_idle_waiters);
    if (idle_waiters < 0)
        return -1;
    return idle_waiters && PyDict_GET_SIZE(self->outstanding) == 0 ? call_method0(self->completion, s_notify_idle) : 0;
}

/* GpuQueue.retire_through(sub): retire every submission up to and including `sub`, whose event
   completed. A submission whose retirement raises is reported and the others retire (as the
   Python code prints the traceback and goes on). -1 with an error set. */
static int retire_through(Replay *self, PyObject *sub) {
    if (acquire(self->retire_lock) < 0)
        return -1;
    int status = 0;
    if (SUB_FIELD(self, sub, SUB_RETIRED) != Py_True) { /* else retired by another thread meanwhile */
        for (;;) {
            PyObject *head = PyObject_CallNoArgs(self->inflight_popleft);
            if (head == NULL) {
                status = -1;
                break;
            }
            if (finish(self, head) < 0)
                PyErr_WriteUnraisable(head);
            int last = head == sub;
            Py_DECREF(head);
            if (last)
                break;
        }
    }
    if (unlock_keeping(self->retire_lock, NULL) < 0)
        status = -1;
    return status;
}

/* The usual wait's timepoint: the submission of the latest timepoint when it covers `value` and
   the one before does not, issued on queue 0, not retired, with its event; NULL otherwise (no
   error). New reference. */
static PyObject *latest_timepoint(Replay *self, PyObject *sem, PyObject *value) {
    PyObject *timepoints = PyObject_GetAttr(sem, s_timepoints), *sub = NULL;
    if (timepoints == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_ssize_t n = PyList_CheckExact(timepoints) ? PyList_GET_SIZE(timepoints) : 0;
    if (n > 0) {
        PyObject *latest = PyList_GET_ITEM(timepoints, n - 1), *before = n > 1 ? PyList_GET_ITEM(timepoints, n - 2) : NULL;
        if (PyTuple_CheckExact(latest) && PyTuple_GET_SIZE(latest) == 2 && compare(PyTuple_GET_ITEM(latest, 0), value, Py_GE) &&
            (before == NULL || (PyTuple_CheckExact(before) && PyTuple_GET_SIZE(before) == 2 &&
                                compare(PyTuple_GET_ITEM(before, 0), value, Py_LT)))) {
            PyObject *candidate = PyTuple_GET_ITEM(latest, 1);
            if ((PyObject *)Py_TYPE(candidate) == self->submission_type &&
                SUB_FIELD(self, candidate, SUB_QUEUE) == self->queue &&
                SUB_FIELD(self, candidate, SUB_RETIRED) == Py_False && SUB_FIELD(self, candidate, SUB_EVENT) != Py_None)
                sub = Py_NewRef(candidate);
        }
    }
    Py_DECREF(timepoints);
    return sub;
}

/* The checks of the usual wait (the semaphore is the caller's, held): 1 and *sub (a new
   reference) to wait on; 2 when the value is reached already; 0 for the Python wait. */
static int usual_host_wait(Replay *self, PyObject *sem, PyObject *value, PyObject **sub) {
    *sub = NULL;
    if (Py_TYPE(sem) != self->event_semaphore_type || !PyLong_CheckExact(value))
        return 0;
    if (PyLong_AsUnsignedLongLong(value) == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or above 64 bits: the Python check reports it */
        return 0;
    }
    if (attr_is(sem, s_device, self->device) != 1 || attr_is(self->device, s_closed, Py_False) != 1)
        return 0;
    PyObject *enabled = PyObject_GetAttr(self->tracing, s_enabled);
    int traced = enabled != Py_False;
    Py_XDECREF(enabled);
    if (traced || attr_is(sem, s_failure, Py_None) != 1) {
        PyErr_Clear();
        return 0;
    }
    PyObject *current = PyObject_GetAttr(sem, s_value);
    if (current == NULL) {
        PyErr_Clear();
        return 0;
    }
    int reached = PyLong_CheckExact(current) && compare(current, value, Py_GE);
    Py_DECREF(current);
    if (reached)
        return 2;
    if (attr_is(self->device, s_closed_for_good, Py_False) != 1)
        return 0;
    *sub = latest_timepoint(self, sem, value);
    return *sub != NULL;
}

/* Waits for the event of `sub` on this thread and retires through it: 1 done, 0 a driver call
   failed with a HalError (cleared: the Python wait makes it again), -1 another error. */
static int synchronize_and_retire(Replay *self, PyObject *sub) {
    PyObject *event = Py_NewRef(SUB_FIELD(self, sub, SUB_EVENT));
    int status = call_method(self->api, s_activate, &self->context, 1);
    if (status == 0)
        status = call_method(self->api, s_event_synchronize, &event, 1);
    Py_DECREF(event);
    if (status < 0) {
        if (!PyErr_ExceptionMatches(self->hal_error))
            return -1;
        PyErr_Clear();
        return 0;
    }
    return retire_through(self, sub) < 0 ? -1 : 1;
}

/* wait_on(sem, value, timeout=None) */
PyObject *Replay_wait_on(Replay *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (self->device == NULL || self->python_wait == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the replay was cleared");
        return NULL;
    }
    int usual = nargs == 2 && nkw == 0;
    if ((nargs == 3 && nkw == 0) || (nargs == 2 && nkw == 1 && PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0)) &&
                                     PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_timeout) == 0))
        usual = args[2] == Py_None; /* no timeout: the usual wait; a deadline polls, in Python */
    if (usual) {
        PyObject *sem = args[0], *value = args[1], *sub;
        Py_INCREF(sem);
        Py_INCREF(value);
        int checked = usual_host_wait(self, sem, value, &sub), done = checked == 2;
        if (checked == 1) {
            done = synchronize_and_retire(self, sub);
            Py_DECREF(sub);
            if (done == 1) { /* retired by this thread: reached unless the work failed */
                PyObject *current = PyObject_GetAttr(sem, s_value);
                done = current != NULL && attr_is(sem, s_failure, Py_None) == 1 && compare(current, value, Py_GE);
                Py_XDECREF(current);
                PyErr_Clear();
            }
        }
        Py_DECREF(value);
        Py_DECREF(sem);
        if (done < 0)
            return NULL;
        if (done)
            Py_RETURN_NONE;
    }
    return PyObject_Vectorcall(self->python_wait, args, nargs, kwnames);
}
