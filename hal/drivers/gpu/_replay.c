/*
 * hal.drivers.gpu._replay: a GPU device's repeat of a validated submission, from C.
 *
 * A training loop or a runtime graph-cache hit submits the same reusable command buffer with
 * the same binding table again and again. `Device.queue_execute` recognises such a repeat with a
 * few identity checks (hal/device.py `recall`, hal/validation.py `check_signal_fences`) and the GPU
 * device issues it (`GpuDevice._queue_execute`, `GpuQueue.issue`, the graph command buffer's
 * `issue`, `EventSemaphore.add_timepoint`): some 550 bytecodes of Python around three driver
 * calls, which cost as much host time as the graph launch itself. `Replay` makes the same steps
 * from C for the usual shape of that call and nothing else:
 *
 *   queue_execute([cb], wait=() or [(sem, v)] already ordered on the queue, signal=[(sem, v)],
 *                 binding_tables=None or [table], queue=0)
 *
 * where `cb` was validated before with an equal table (`cb.validated` or `cb.validated_before`
 * at the device's current release count), the signal is a well-formed pair above its
 * semaphore's value, and tracing is off. Anything else, at any check, calls the Python method
 * (`fallback`), which validates and reports exactly as without this module; every check is made
 * before anything changes, so the fallback starts from the same state. After the checks, the
 * steps that are not the usual case (a lost device, a closed queue, a stream command buffer, a
 * graph command buffer whose table must be bound, a semaphore with waiters or out-of-order
 * timepoints) call the Python method of that step, so each rule has one Python definition.
 *
 * It reads and writes the same attributes, under the same locks, in the same order as the
 * Python code it mirrors; `GpuDevice` binds it as its instance's `queue_execute` (see
 * hal/drivers/gpu/replay.py) and `HAL_NATIVE=0` leaves the Python method alone. The same object
 * also makes the usual host wait (_replay_wait.c) and a dispatch's recording (_replay_record.c).
 */
#include "_replay.h"

/* Submission's __slots__, in the order of its constructor's arguments and then the attributes it
   starts as None / False; the replay makes a submission by writing them directly (as __init__ does). */
static const char *const SUBMISSION_FIELDS[] = {"queue", "command_buffers", "tables", "waits", "signals", "action",
                                                "seq", "event", "resources", "retired"};

PyTypeObject *lock_type;
PyObject *lock_acquire, *lock_release;
PyObject *s_sem_lock, *s_closed, *s_queue_closed, *s_release_count, *s_device, *s_validated,
    *s_validated_before, *s_state, *s_value, *s_failure, *s_lost, *s_activate, *s_acquire, *s_release, *s_issue,
    *s_uses_slots, *s_issue_lock, *s_bound_table, *s_launch_exec, *s_graph_launch, *s_free, *s_event_record,
    *s_issue_failed, *s_add_timepoint, *s_timepoints, *s_waiters, *s_issuable, *s_parked, *s_idle, *s_wake, *s_deferred,
    *s_idle_waiters, *s_notify_idle, *s_enabled, *s_queue, *s_wait, *s_signal, *s_binding_tables,
    *s_command_buffers, *s_closed_for_good, *s_event_synchronize, *s_one_shot, *s_listeners, *s_advance, *s_finish,
    *s_run_deferred, *s_timeout, *s_checked_workgroups, *s_whole_refs_at, *s_whole_refs, *s_buffer, *s_allocation,
    *s_ptr, *s_offset, *s_last_export, *s_constants, *s_bindings, *s_args, *s_pending, *s_level, *s_functions,
    *s_workgroup_size;

/* The checked table of a remembered validation `entry` = (count, given, checked) made at the
   release count `count` with a table equal to `given`; NULL (no error) otherwise. Borrowed. */
static PyObject *entry_matches(PyObject *entry, PyObject *count, PyObject *given) {
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3)
        return NULL;
    if (!same(PyTuple_GET_ITEM(entry, 0), count) || !same(PyTuple_GET_ITEM(entry, 1), given))
        return NULL;
    return PyTuple_GET_ITEM(entry, 2);
}

/* hal.device.recall: the checked table of `cb`'s validation with an equal table at the current
   release count, moving an earlier one to the front as recall does; NULL when there is none. New
   reference. */
static PyObject *recall(Replay *self, PyObject *cb, PyObject *given) {
    PyObject *count = PyObject_GetAttr(self->device, s_release_count);
    PyObject *last = count ? PyObject_GetAttr(cb, s_validated) : NULL;
    PyObject *found = NULL, *before = NULL;
    if (last == NULL)
        goto done;
    found = entry_matches(last, count, given);
    if (found != NULL) {
        Py_INCREF(found);
        goto done;
    }
    before = PyObject_GetAttr(cb, s_validated_before);
    if (before == NULL || !PyList_CheckExact(before) || PyList_GET_SIZE(before) == 0)
        goto done;
    if (attr_is(cb, s_state, self->executable_state) != 1)
        goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(before); i++) {
        PyObject *entry = PyList_GET_ITEM(before, i);
        Py_INCREF(entry);
        PyObject *checked = entry_matches(entry, count, given);
        if (checked == NULL) {
            Py_DECREF(entry);
            continue;
        }
        if (i >= PyList_GET_SIZE(before) || PyList_GET_ITEM(before, i) != entry) {
            Py_DECREF(entry);  /* the list changed under the comparisons: not the usual case */
            break;
        }
        if (last != Py_None) {
            Py_INCREF(last);
            PyList_SET_ITEM(before, i, last);  /* the slot's reference to entry is now ours */
            Py_DECREF(entry);
        }
        if (PyObject_SetAttr(cb, s_validated, entry) == 0) {
            found = checked;
            Py_INCREF(found);
        }
        Py_DECREF(entry);
        break;
    }
done:
    if (PyErr_Occurred())
        PyErr_Clear();
    Py_XDECREF(before);
    Py_XDECREF(last);
    Py_XDECREF(count);
    return found;
}

/* A (semaphore, int) pair of this device: the semaphore (borrowed) and the value, else NULL. */
static PyObject *fence_semaphore(Replay *self, PyObject *pair, PyObject **value) {
    if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
        return NULL;
    PyObject *sem = PyTuple_GET_ITEM(pair, 0);
    *value = PyTuple_GET_ITEM(pair, 1);
    if (!PyLong_CheckExact(*value) || !PyObject_TypeCheck(sem, self->semaphore_type))
        return NULL;
    if (attr_is(sem, s_device, self->device) != 1)
        return NULL;
    return sem;
}


/* EventSemaphore.ordered_on: the wait (sem, value) needs nothing from work issued on `queue`. */
static int ordered_on(PyObject *sem, PyObject *value, PyObject *queue) {
    int result = 0;
    if (attr_is(sem, s_failure, Py_None) != 1)
        return 0;
    PyObject *current = PyObject_GetAttr(sem, s_value);
    if (current == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (compare(current, value, Py_GE)) {
        Py_DECREF(current);
        return 1;
    }
    Py_DECREF(current);
    PyObject *timepoints = PyObject_GetAttr(sem, s_timepoints);
    if (timepoints == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (PyList_CheckExact(timepoints) && PyList_GET_SIZE(timepoints) > 0) {
        PyObject *latest = PyList_GET_ITEM(timepoints, PyList_GET_SIZE(timepoints) - 1);
        Py_INCREF(latest);
        if (PyTuple_CheckExact(latest) && PyTuple_GET_SIZE(latest) == 2 &&
            compare(PyTuple_GET_ITEM(latest, 0), value, Py_GE))
            result = attr_is(PyTuple_GET_ITEM(latest, 1), s_queue, queue) == 1;
        Py_DECREF(latest);
    }
    Py_DECREF(timepoints);
    return result;
}

/* A signal pair (the one item of the signal list, held by the caller) that is well-formed and
   above its semaphore's value (check_signal_fences). */
static int usual_signal(Replay *self, PyObject *pair) {
    PyObject *value, *sem = fence_semaphore(self, pair, &value);
    if (sem == NULL || !compare(value, self->max_u64, Py_LE) || attr_is(sem, s_failure, Py_None) != 1)
        return 0;
    PyObject *current = PyObject_GetAttr(sem, s_value);
    if (current == NULL) {
        PyErr_Clear();
        return 0;
    }
    int above = compare(current, value, Py_LT);
    Py_DECREF(current);
    return above;
}

/* A wait list of nothing, or of one pair that work issued on `queue` needs no wait for. */
static int usual_wait(Replay *self, PyObject *wait, PyObject *queue) {
    if (wait == NULL)
        return 1;
    if (!PyTuple_CheckExact(wait) && !PyList_CheckExact(wait))
        return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(wait);
    if (n == 0)
        return 1;
    if (n != 1)
        return 0;
    PyObject *value, *pair = Py_NewRef(PySequence_Fast_ITEMS(wait)[0]); /* the caller's list may change */
    PyObject *sem = fence_semaphore(self, pair, &value);
    int usual = sem != NULL && !compare(value, self->max_u64, Py_GT);
    if (usual && PyLong_AsUnsignedLongLong(value) == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative */
        usual = 0;
    }
    usual = usual && ordered_on(sem, value, queue);
    Py_DECREF(pair);
    return usual;
}







/* The graph command buffer's issue when `table` is the one it has bound (nothing to rebind):
   1 launched (or nothing to launch), 0 not that case, -1 error. */
static int launch_bound_graph(Replay *self, PyObject *cb, PyObject *table) {
    if ((PyObject *)Py_TYPE(cb) != self->graph_type || attr_is(cb, s_uses_slots, Py_True) != 1)
        return 0;
    PyObject *lock = PyObject_GetAttr(cb, s_issue_lock);
    if (lock == NULL || acquire(lock) < 0) {
        Py_XDECREF(lock);
        return -1;
    }
    int result = 0;
    PyObject *bound = PyObject_GetAttr(cb, s_bound_table);
    if (bound == NULL) {
        result = -1;
    } else if (bound == table) {
        PyObject *launch = PyObject_GetAttr(cb, s_launch_exec);
        if (launch == NULL) {
            result = -1;
        } else {
            result = 1;
            if (launch != Py_None) {
                PyObject *args[2] = {launch, self->stream};
                result = call_method(self->api, s_graph_launch, args, 2) < 0 ? -1 : 1;
            }
            Py_DECREF(launch);
        }
    }
    Py_XDECREF(bound);
    if (unlock_keeping(lock, NULL) < 0)
        result = -1;
    Py_DECREF(lock);
    return result;
}

/* GpuQueue.issue's locked part: the commands and the event after them. -1 with an error set. */
static int issue_locked(Replay *self, PyObject *sub, PyObject *cb, PyObject *table, Py_ssize_t *inflight_count) {
    int launched = launch_bound_graph(self, cb, table);
    if (launched < 0)
        return -1;
    if (launched == 0) {
        PyObject *args[3] = {self->queue, table, sub};
        if (call_method(cb, s_issue, args, 3) < 0)
            return -1;
    }
    PyObject *free = PyObject_GetAttr(self->events, s_free), *event;
    if (free == NULL)
        return -1;
    if (PyList_CheckExact(free) && PyList_GET_SIZE(free) > 0) {
        Py_ssize_t last = PyList_GET_SIZE(free) - 1;
        event = PyList_GET_ITEM(free, last);
        Py_INCREF(event);
        if (PyList_SetSlice(free, last, last + 1, NULL) < 0) {
            Py_DECREF(event);
            event = NULL;
        }
    } else {
        event = PyObject_CallMethodNoArgs(self->events, s_acquire);
    }
    Py_DECREF(free);
    if (event == NULL)
        return -1;
    int status = -1;
    PyObject *record[2] = {event, self->stream};
    if (call_method(self->api, s_event_record, record, 2) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (call_method(self->events, s_release, &event, 1) < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else {
            PyErr_Restore(type, value, tb);
        }
        goto done;
    }
    PyObject **slot = (PyObject **)((char *)sub + self->slot[SUB_EVENT]);
    Py_INCREF(event);
    Py_XSETREF(*slot, event);
    if (invoke(self->inflight_append, sub) < 0)
        goto done;
    *inflight_count = PyObject_Size(self->inflight);
    if (*inflight_count >= 0)
        status = 0;
done:
    Py_DECREF(event);
    return status;
}

/* EventSemaphore.add_timepoint for the usual case (a later value than every timepoint, no host
   waiter, nothing parked on the semaphore to wake); else the Python method. 1/0: whether a host
   listener waits on the semaphore; -1: error. */
static int add_timepoint(Replay *self, PyObject *sem, PyObject *value, PyObject *sub) {
    PyObject *lock = PyObject_GetAttr(sem, s_sem_lock);
    if (lock == NULL || acquire(lock) < 0) {
        Py_XDECREF(lock);
        return -1;
    }
    int usual = 0, listened = 0, failed = 0;
    PyObject *current = NULL, *timepoints = NULL, *waiters = NULL, *issuable = NULL, *parked = NULL;
    current = PyObject_GetAttr(sem, s_value);
    if (current == NULL)
        goto unlock;
    int failure_none = attr_is(sem, s_failure, Py_None);
    if (failure_none < 0)
        goto unlock;
    if (!failure_none || compare(value, current, Py_LE)) {
        usual = 1;  /* passed or failed already: no timepoint, nobody to tell */
        goto unlock;
    }
    timepoints = PyObject_GetAttr(sem, s_timepoints);
    waiters = PyObject_GetAttr(sem, s_waiters);
    issuable = PyObject_GetAttr(sem, s_issuable);
    parked = PyObject_GetAttr(sem, s_parked);
    if (timepoints == NULL || waiters == NULL || issuable == NULL || parked == NULL || !PyList_CheckExact(timepoints))
        goto unlock;
    int waited = PyObject_IsTrue(waiters), queued = PyObject_IsTrue(issuable);
    if (waited != 0 || queued != 0)
        goto unlock;  /* host waiters to notify or parked work to issue: the Python method */
    Py_ssize_t n = PyList_GET_SIZE(timepoints);
    int clear = 0;
    if (n > 0) {
        PyObject *first = PyList_GET_ITEM(timepoints, 0), *latest = PyList_GET_ITEM(timepoints, n - 1);
        if (!PyTuple_CheckExact(first) || !PyTuple_CheckExact(latest) || PyTuple_GET_SIZE(latest) != 2 ||
            PyTuple_GET_SIZE(first) != 2)
            goto unlock;
        if (n >= self->prune_at && compare(PyTuple_GET_ITEM(first, 0), current, Py_LE)) {
            if (!compare(PyTuple_GET_ITEM(latest, 0), current, Py_LE))
                goto unlock;  /* a partial prune: the Python method */
            clear = 1;
        } else if (!compare(PyTuple_GET_ITEM(latest, 0), value, Py_LE)) {
            goto unlock;  /* out of order: the Python method inserts it */
        }
    }
    PyObject *pair = PyTuple_Pack(2, value, sub);
    if (pair == NULL || (clear && PyList_SetSlice(timepoints, 0, n, NULL) < 0) || PyList_Append(timepoints, pair) < 0) {
        Py_XDECREF(pair);
        failed = 1;
        goto unlock;
    }
    Py_DECREF(pair);
    listened = PyObject_IsTrue(parked);
    if (listened < 0) {
        failed = 1;
        goto unlock;
    }
    usual = 1;
unlock:
    if (PyErr_Occurred())
        failed = 1;
    if (unlock_keeping(lock, NULL) < 0)
        failed = 1;
    Py_DECREF(lock);
    Py_XDECREF(parked);
    Py_XDECREF(issuable);
    Py_XDECREF(waiters);
    Py_XDECREF(timepoints);
    Py_XDECREF(current);
    if (failed)
        return -1;
    if (usual)
        return listened;
    PyObject *stack[3] = {sem, value, sub};
    PyObject *result = PyObject_VectorcallMethod(s_add_timepoint, stack, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (result == NULL)
        return -1;
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
}


/* Completion's wake-up after an issue, as GpuQueue.issue ends. */
static int wake_completion(Replay *self, int listened, Py_ssize_t inflight) {
    int sleeping = attr_true(self->completion, s_idle);
    if (sleeping < 0)
        return -1;
    if (sleeping) {  /* Completion.wake_for: wake it if a listener or enough work needs it */
        int wake = listened || inflight >= self->wake_inflight ? 1 : attr_true(self->completion, s_deferred);
        if (wake < 0 || (wake && call_method0(self->completion, s_wake) < 0))
            return -1;
    }
    int notify = attr_true(self->completion, s_idle_waiters);
    if (notify < 0)
        return -1;
    return notify ? call_method0(self->completion, s_notify_idle) : 0;
}

/* GpuQueue.issue of `sub` (one command buffer, no device waits, no action). -1 with an error set. */
static int issue(Replay *self, PyObject *sub, PyObject *cb, PyObject *table, PyObject *sem, PyObject *value) {
    if (attr_is(self->device, s_lost, Py_None) != 1)  /* lost (or unreadable): the Python method fails the work */
        return call_method(self->queue, s_issue, &sub, 1);
    Py_ssize_t inflight = 0;
    if (call_method(self->api, s_activate, &self->context, 1) < 0)
        goto failed;
    if (invoke(self->queue_acquire, NULL) < 0)
        goto failed;
    int open = attr_is(self->queue, s_queue_closed, Py_False);
    if (open != 1) {  /* closed since: the Python method fails the work with the reason */
        if (invoke(self->queue_release, NULL) < 0)
            goto failed;
        return call_method(self->queue, s_issue, &sub, 1);
    }
    int issued = issue_locked(self, sub, cb, table, &inflight);
    if (unlock_keeping(NULL, self->queue_release) < 0 || issued < 0)
        goto failed;
    int listened = add_timepoint(self, sem, value, sub);
    if (listened < 0)
        return -1;
    return wake_completion(self, listened, inflight);
failed: {
    /* As GpuQueue.issue: nothing of the submission runs, its signals carry the failure. */
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL && exc != NULL)
        PyException_SetTraceback(exc, tb);
    PyObject *args[2] = {sub, exc ? exc : Py_None};
    int status = call_method(self->queue, s_issue_failed, args, 2);
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    return status;
}
}

/* A new Submission(queue, [cb], [checked], [], [signal_pair], None, seq), its slots written as
   its __init__ writes them. */
static PyObject *new_submission(Replay *self, PyObject *cb, PyObject *checked, PyObject *signal_pair, PyObject *seq) {
    PyTypeObject *type = (PyTypeObject *)self->submission_type;
    PyObject *values[SUBMISSION_SLOTS] = {self->queue, PyList_New(1), PyList_New(1), PyList_New(0), PyList_New(1),
                                          Py_None, seq, Py_None, Py_None, Py_False};
    PyObject *sub = NULL;
    for (int i = SUB_COMMAND_BUFFERS; i <= SUB_SIGNALS; i++)
        if (values[i] == NULL)
            goto done;
    PyList_SET_ITEM(values[SUB_COMMAND_BUFFERS], 0, Py_NewRef(cb));
    PyList_SET_ITEM(values[SUB_TABLES], 0, Py_NewRef(checked));
    PyList_SET_ITEM(values[SUB_SIGNALS], 0, Py_NewRef(signal_pair));
    sub = type->tp_alloc(type, 0);
    if (sub == NULL)
        goto done;
    for (int i = 0; i < SUBMISSION_SLOTS; i++)
        *(PyObject **)((char *)sub + self->slot[i]) = Py_NewRef(values[i]);
done:
    for (int i = SUB_COMMAND_BUFFERS; i <= SUB_SIGNALS; i++)
        Py_XDECREF(values[i]);
    return sub;
}

/* Everything after the checks, under the device's gate: USUAL, NOT_USUAL (closed meanwhile) or FAILED. */
static int submit(Replay *self, PyObject *cb, PyObject *checked, PyObject *signal_pair) {
    if (invoke(self->gate_acquire, NULL) < 0)
        return FAILED;
    int result = FAILED;
    PyObject *seq = NULL, *sub = NULL;
    int open = attr_is(self->device, s_closed, Py_False);
    if (open != 1) {
        result = NOT_USUAL;  /* closed while this thread checked: the Python method says so */
        goto done;
    }
    seq = PyIter_Next(self->sequence);
    if (seq == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the submission sequence ended");
        goto done;
    }
    sub = new_submission(self, cb, checked, signal_pair, seq);
    if (sub == NULL || PyDict_SetItem(self->outstanding, seq, sub) < 0)
        goto done;
    if (issue(self, sub, cb, checked, PyTuple_GET_ITEM(signal_pair, 0), PyTuple_GET_ITEM(signal_pair, 1)) == 0)
        result = USUAL;
done:
    if (unlock_keeping(NULL, self->gate_release) < 0)
        result = FAILED;
    Py_XDECREF(sub);
    Py_XDECREF(seq);
    return result;
}

/* The usual replay, from the arguments of queue_execute (NULL: not given). */
static int replay(Replay *self, PyObject *command_buffers, PyObject *wait, PyObject *signal, PyObject *tables,
                  PyObject *queue_index) {
    PyObject *device = self->device;
    if (attr_is(device, s_closed, Py_False) != 1)
        return NOT_USUAL;
    if (queue_index != NULL && (!PyLong_CheckExact(queue_index) || PyLong_AsLong(queue_index) != 0)) {
        PyErr_Clear();
        return NOT_USUAL;
    }
    if (!PyList_CheckExact(command_buffers) || PyList_GET_SIZE(command_buffers) != 1 || signal == NULL)
        return NOT_USUAL;
    PyObject *given = Py_None;
    if (tables != NULL && tables != Py_None) {
        if (!PyList_CheckExact(tables) || PyList_GET_SIZE(tables) != 1)
            return NOT_USUAL;
        given = PyList_GET_ITEM(tables, 0);
    }
    PyObject *cb = Py_NewRef(PyList_GET_ITEM(command_buffers, 0));
    Py_INCREF(given);
    Py_INCREF(signal);
    int result = NOT_USUAL;
    PyObject *checked = NULL, *enabled = NULL, *signal_pair = NULL;
    if (!PyObject_TypeCheck(cb, self->command_buffer_type) || attr_is(cb, s_device, device) != 1)
        goto done;
    checked = recall(self, cb, given);
    if (checked == NULL)
        goto done;
    if (!PyList_CheckExact(signal) || PyList_GET_SIZE(signal) != 1)
        goto done;
    signal_pair = Py_NewRef(PyList_GET_ITEM(signal, 0));  /* holds the semaphore and the value from here on */
    if (!usual_signal(self, signal_pair))
        goto done;
    enabled = PyObject_GetAttr(self->tracing, s_enabled);
    if (enabled != Py_False || !usual_wait(self, wait, self->queue))
        goto done;
    result = submit(self, cb, checked, signal_pair);
done:
    if (result == NOT_USUAL && PyErr_Occurred())
        PyErr_Clear();
    Py_XDECREF(enabled);
    Py_XDECREF(signal_pair);
    Py_XDECREF(checked);
    Py_DECREF(signal);
    Py_DECREF(given);
    Py_DECREF(cb);
    return result;
}

/* The argument slot of a keyword of queue_execute, or -1: by identity (names in Python source are
   interned), else by value. */
static int keyword_index(PyObject *name) {
    PyObject *names[5] = {s_command_buffers, s_wait, s_signal, s_binding_tables, s_queue};
    for (int i = 0; i < 5; i++)
        if (name == names[i])
            return i;
    if (!PyUnicode_Check(name))
        return -1;
    for (int i = 0; i < 5; i++)
        if (PyUnicode_Compare(name, names[i]) == 0)
            return i;
    return -1;
}

/* queue_execute(command_buffers, wait=(), signal=(), binding_tables=None, *, queue=0) */
static PyObject *Replay_vectorcall(Replay *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *slots[5] = {NULL, NULL, NULL, NULL, NULL}; /* command_buffers, wait, signal, tables, queue */
    int usual = nargs >= 1 && nargs <= 4 && self->device != NULL;
    for (Py_ssize_t i = 0; usual && i < nargs; i++)
        slots[i] = args[i];
    for (Py_ssize_t i = 0; usual && i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        int at = keyword_index(name);
        if (at < 0 || slots[at] != NULL)
            usual = 0;  /* an unknown, non-interned or repeated keyword: the Python method reports it */
        else
            slots[at] = args[nargs + i];
    }
    if (usual) {
        int result = replay(self, slots[0], slots[1], slots[2], slots[3], slots[4]);
        if (result == USUAL)
            Py_RETURN_NONE;
        if (result == FAILED)
            return NULL;
    }
    if (self->device == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the replay was cleared");
        return NULL;
    }
    /* The Python method, with the device as its first argument. */
    Py_ssize_t total = nargs + nkw;
    PyObject *small[16];
    PyObject **stack = total + 1 <= 16 ? small : PyMem_Malloc((total + 1) * sizeof(PyObject *));
    if (stack == NULL)
        return PyErr_NoMemory();
    stack[0] = self->device;
    for (Py_ssize_t i = 0; i < total; i++)
        stack[i + 1] = args[i];
    PyObject *result = PyObject_Vectorcall(self->fallback, stack, nargs + 1, kwnames);
    if (stack != small)
        PyMem_Free(stack);
    return result;
}

/* self->field = obj.name (a new reference); -1 with an error set. */
static int read_into(PyObject **field, PyObject *obj, const char *name) {
    *field = obj == NULL ? NULL : PyObject_GetAttrString(obj, name);
    return *field == NULL ? -1 : 0;
}

/* The byte offsets of `type`'s __slots__ `names` (each a member descriptor holding an object). */
static int slot_offsets(PyObject *type, const char *const *names, int count, Py_ssize_t *offsets) {
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyObject_GetAttrString(type, names[i]);
        if (descr == NULL)
            return -1;
        int usable = Py_TYPE(descr) == &PyMemberDescr_Type &&
                     ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (usable)
            offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!usable) {
            PyErr_Format(PyExc_TypeError, "Replay: %s.%s is not a __slots__ member", ((PyTypeObject *)type)->tp_name,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

/* Submission's slot offsets, and that it can be allocated as its __init__ would. */
static int submission_offsets(Replay *self) {
    if (slot_offsets(self->submission_type, SUBMISSION_FIELDS, SUBMISSION_SLOTS, self->slot) < 0)
        return -1;
    PyTypeObject *type = (PyTypeObject *)self->submission_type;
    if (type->tp_alloc == NULL || type->tp_init == NULL) {
        PyErr_SetString(PyExc_TypeError, "Replay: Submission cannot be allocated");
        return -1;
    }
    return 0;
}

/* Dispatch's slot offsets, in the order of its constructor's arguments. */
static int dispatch_offsets(Replay *self) {
    static const char *const names[DISPATCH_SLOTS] = {"function", "grid", "block", "arg_start", "arg_count"};
    return slot_offsets((PyObject *)self->dispatch_type, names, DISPATCH_SLOTS, self->dispatch_slot);
}

static PyObject *Replay_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"device", "fallback", "command_buffer_type", "semaphore_type", "graph_type",
                               "submission_type", "executable_state", "tracing", "prune_at", "wake_inflight",
                               "event_semaphore_type", "python_wait", "hal_error", "python_dispatch", "dispatch_type",
                               "buffer_type", "recording_state", NULL};
    PyObject *device, *fallback, *cb_type, *sem_type, *graph_type, *submission_type, *state, *tracing;
    PyObject *event_sem_type, *python_wait, *hal_error, *python_dispatch, *dispatch_type, *buffer_type, *recording;
    Py_ssize_t prune_at, wake_inflight;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!O!OO!OOnnO!OO!OO!O!O", keywords, &device, &fallback, &PyType_Type,
                                     &cb_type, &PyType_Type, &sem_type, &graph_type, &PyType_Type, &submission_type,
                                     &state, &tracing, &prune_at, &wake_inflight, &PyType_Type, &event_sem_type,
                                     &python_wait, &PyType_Type, &hal_error, &python_dispatch, &PyType_Type,
                                     &dispatch_type, &PyType_Type, &buffer_type, &recording))
        return NULL;
    if (!PyCallable_Check(fallback) || !PyCallable_Check(python_wait) || !PyCallable_Check(python_dispatch)) {
        PyErr_SetString(PyExc_TypeError, "Replay: fallback, python_wait and python_dispatch must be callable");
        return NULL;
    }
    Replay *self = (Replay *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = (vectorcallfunc)Replay_vectorcall;
    self->device = Py_NewRef(device);
    self->fallback = Py_NewRef(fallback);
    self->command_buffer_type = (PyTypeObject *)Py_NewRef(cb_type);
    self->semaphore_type = (PyTypeObject *)Py_NewRef(sem_type);
    self->graph_type = Py_NewRef(graph_type);
    self->submission_type = Py_NewRef(submission_type);
    self->executable_state = Py_NewRef(state);
    self->tracing = Py_NewRef(tracing);
    self->prune_at = prune_at;
    self->wake_inflight = wake_inflight;
    self->event_semaphore_type = (PyTypeObject *)Py_NewRef(event_sem_type);
    self->python_wait = Py_NewRef(python_wait);
    self->hal_error = Py_NewRef(hal_error);
    self->python_dispatch = Py_NewRef(python_dispatch);
    self->dispatch_type = (PyTypeObject *)Py_NewRef(dispatch_type);
    self->buffer_type = (PyTypeObject *)Py_NewRef(buffer_type);
    self->recording_state = Py_NewRef(recording);
    self->max_u64 = PyLong_FromUnsignedLongLong(0xFFFFFFFFFFFFFFFFull);
    PyObject *queues = NULL, *gate = NULL, *lock = NULL;
    int failed = self->max_u64 == NULL || submission_offsets(self) < 0 || dispatch_offsets(self) < 0 ||
                 read_into(&queues, device, "queues") < 0;
    if (!failed) {
        self->queue = PySequence_GetItem(queues, 0);
        failed = self->queue == NULL || read_into(&self->completion, device, "completion") < 0 ||
                 read_into(&gate, device, "_gate") < 0 || read_into(&self->gate_acquire, gate, "acquire") < 0 ||
                 read_into(&self->gate_release, gate, "release") < 0 || read_into(&lock, self->queue, "lock") < 0 ||
                 read_into(&self->queue_acquire, lock, "acquire") < 0 ||
                 read_into(&self->queue_release, lock, "release") < 0 || read_into(&self->api, self->queue, "api") < 0 ||
                 read_into(&self->context, device, "context") < 0 || read_into(&self->stream, self->queue, "stream") < 0 ||
                 read_into(&self->events, self->queue, "events") < 0 ||
                 read_into(&self->inflight, self->queue, "inflight") < 0 ||
                 read_into(&self->inflight_append, self->inflight, "append") < 0 ||
                 read_into(&self->sequence, self->completion, "sequence") < 0 ||
                 read_into(&self->outstanding, self->completion, "outstanding") < 0 ||
                 read_into(&self->retire_lock, self->queue, "retire_lock") < 0 ||
                 read_into(&self->inflight_popleft, self->inflight, "popleft") < 0;
    }
    if (!failed && (!PyDict_CheckExact(self->outstanding) || !PyIter_Check(self->sequence))) {
        PyErr_SetString(PyExc_TypeError, "Replay: completion.outstanding must be a dict, .sequence an iterator");
        failed = 1;
    }
    Py_XDECREF(lock);
    Py_XDECREF(gate);
    Py_XDECREF(queues);
    if (failed) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

#define REPLAY_FIELDS(X)                                                                                           \
    X(device) X(fallback) X(command_buffer_type) X(semaphore_type) X(graph_type) X(submission_type)               \
    X(executable_state) X(tracing) X(max_u64) X(queue) X(completion) X(gate_acquire) X(gate_release)               \
    X(queue_acquire) X(queue_release) X(api) X(context) X(stream) X(events) X(inflight_append) X(inflight)          \
    X(sequence) X(outstanding) X(event_semaphore_type) X(python_wait) X(hal_error) X(retire_lock)                \
    X(inflight_popleft) X(python_dispatch) X(dispatch_type) X(buffer_type) X(recording_state)

static int Replay_traverse(Replay *self, visitproc visit, void *arg) {
#define VISIT(field) Py_VISIT(self->field);
    REPLAY_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int Replay_clear(Replay *self) {
#define CLEAR(field) Py_CLEAR(self->field);
    REPLAY_FIELDS(CLEAR)
#undef CLEAR
    return 0;
}

static void Replay_dealloc(Replay *self) {
    PyObject_GC_UnTrack(self);
    Replay_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Replay_methods[] = {
    {"wait_on", (PyCFunction)(void (*)(void))Replay_wait_on, METH_FASTCALL | METH_KEYWORDS,
     "wait_on(sem, value, timeout=None): sem.wait(value, timeout) of one of the device's semaphores, the "
     "usual wait (for the latest signal, no timeout) from C; every other through python_wait."},
    {"record_dispatch", (PyCFunction)(void (*)(void))Replay_record_dispatch, METH_FASTCALL | METH_KEYWORDS,
     "record_dispatch(cb, executable, entry_point, workgroups, constants, bindings): cb.dispatch(...) of one of the "
     "device's command buffers, a dispatch like the last one recorded from C; every other through python_dispatch."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReplayType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hal.drivers.gpu._replay.Replay",
    .tp_basicsize = sizeof(Replay),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Replay(device, fallback, command_buffer_type, semaphore_type, graph_type, submission_type, "
              "executable_state, tracing, prune_at, wake_inflight, event_semaphore_type, python_wait, hal_error, "
              "python_dispatch, dispatch_type, buffer_type, recording_state): a GPU device's queue_execute for the repeat of a validated "
              "submission; every other call goes to fallback(device, ...).",
    .tp_new = Replay_new,
    .tp_traverse = (traverseproc)Replay_traverse,
    .tp_clear = (inquiry)Replay_clear,
    .tp_dealloc = (destructor)Replay_dealloc,
    .tp_vectorcall_offset = offsetof(Replay, vectorcall),
    .tp_methods = Replay_methods,
    .tp_call = PyVectorcall_Call,
};

static struct PyModuleDef replay_module = {
    PyModuleDef_HEAD_INIT, "hal.drivers.gpu._replay",
    "A GPU device's repeated work from C: a validated submission, the host wait, a dispatch's recording.",
    -1, NULL,
};

static int intern(PyObject **slot, const char *name) {
    *slot = PyUnicode_InternFromString(name);
    return *slot == NULL ? -1 : 0;
}

/* threading.Lock's type and its acquire / release descriptors. */
static int find_lock_type(void) {
    PyObject *thread = PyImport_ImportModule("_thread");
    PyObject *lock = thread ? PyObject_CallMethod(thread, "allocate_lock", NULL) : NULL;
    Py_XDECREF(thread);
    if (lock == NULL)
        return -1;
    lock_type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(lock));
    Py_DECREF(lock);
    lock_acquire = PyObject_GetAttrString((PyObject *)lock_type, "acquire");
    lock_release = lock_acquire ? PyObject_GetAttrString((PyObject *)lock_type, "release") : NULL;
    return lock_release == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit__replay(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&s_sem_lock, "_lock"}, {&s_closed, "_closed"}, {&s_queue_closed, "closed"},
        {&s_release_count, "_release_count"}, {&s_device, "device"}, {&s_validated, "validated"},
        {&s_validated_before, "validated_before"}, {&s_state, "state"}, {&s_value, "_value"},
        {&s_failure, "_failure"}, {&s_lost, "lost"}, {&s_activate, "activate"}, {&s_acquire, "acquire"},
        {&s_release, "release"}, {&s_issue, "issue"}, {&s_uses_slots, "uses_slots"}, {&s_issue_lock, "issue_lock"},
        {&s_bound_table, "_bound_table"}, {&s_launch_exec, "_launch_exec"}, {&s_graph_launch, "graph_launch"},
        {&s_free, "free"}, {&s_event_record, "event_record"}, {&s_issue_failed, "issue_failed"},
        {&s_add_timepoint, "add_timepoint"}, {&s_timepoints, "_timepoints"}, {&s_waiters, "_waiters"},
        {&s_issuable, "_issuable"}, {&s_parked, "_parked"}, {&s_idle, "idle"}, {&s_wake, "wake"}, {&s_deferred, "_deferred"},
        {&s_idle_waiters, "idle_waiters"}, {&s_notify_idle, "notify_idle"}, {&s_enabled, "ENABLED"},
        {&s_queue, "queue"}, {&s_wait, "wait"}, {&s_signal, "signal"}, {&s_binding_tables, "binding_tables"},
        {&s_command_buffers, "command_buffers"}, {&s_closed_for_good, "closed_for_good"},
        {&s_event_synchronize, "event_synchronize"}, {&s_one_shot, "one_shot"}, {&s_listeners, "_listeners"},
        {&s_advance, "advance"}, {&s_finish, "finish"}, {&s_run_deferred, "_run_deferred"}, {&s_timeout, "timeout"},
        {&s_checked_workgroups, "_checked_workgroups"}, {&s_whole_refs_at, "_whole_refs_at"},
        {&s_whole_refs, "_whole_refs"}, {&s_buffer, "buffer"}, {&s_allocation, "allocation"}, {&s_ptr, "ptr"},
        {&s_offset, "offset"}, {&s_last_export, "_last_export"}, {&s_constants, "constants"},
        {&s_bindings, "bindings"}, {&s_args, "args"}, {&s_pending, "_pending"}, {&s_level, "_level"},
        {&s_functions, "functions"}, {&s_workgroup_size, "workgroup_size"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (intern(names[i].slot, names[i].name) < 0)
            return NULL;
    if (find_lock_type() < 0 || PyType_Ready(&ReplayType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&replay_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&ReplayType);
    if (PyModule_AddObject(module, "Replay", (PyObject *)&ReplayType) < 0) {
        Py_DECREF(&ReplayType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
