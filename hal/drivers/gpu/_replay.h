/*
 * What the C files of hal.drivers.gpu._replay share: the Replay object, the interned attribute
 * names, and small helpers that read attributes, compare, call and take locks as the Python code
 * does (see _replay.c for the submission, _replay_wait.c for the host wait, _replay_record.c for a
 * dispatch's recording).
 */
#ifndef HAL_GPU_REPLAY_H
#define HAL_GPU_REPLAY_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>

enum { DISPATCH_FUNCTION, DISPATCH_GRID, DISPATCH_BLOCK, DISPATCH_ARG_START, DISPATCH_ARG_COUNT, DISPATCH_SLOTS };

enum { SUB_QUEUE, SUB_COMMAND_BUFFERS, SUB_TABLES, SUB_WAITS, SUB_SIGNALS, SUB_ACTION, SUB_SEQ, SUB_EVENT,
       SUB_RESOURCES, SUB_RETIRED, SUBMISSION_SLOTS };

/* threading.Lock's type and its acquire / release, called without a method look-up. */
extern PyTypeObject *lock_type;
extern PyObject *lock_acquire, *lock_release;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *device;
    PyObject *fallback;          /* the class's queue_execute(device, ...) */
    PyTypeObject *command_buffer_type;
    PyTypeObject *semaphore_type;
    PyObject *graph_type;        /* the graph command buffer class: launched inline when bound */
    PyObject *submission_type;
    PyObject *executable_state;  /* CommandBufferState.EXECUTABLE */
    PyObject *tracing;           /* hal.tracing: ENABLED is read on every call */
    PyObject *max_u64;
    Py_ssize_t prune_at;         /* event_semaphore.PRUNE_AT */
    Py_ssize_t wake_inflight;    /* completion.WAKE_INFLIGHT */
    /* What stays the same while the device is open (the replay is removed at close): read once. */
    PyObject *queue;             /* device.queues[0] */
    PyObject *completion;
    PyObject *gate_acquire, *gate_release;   /* device._gate's bound methods */
    PyObject *queue_acquire, *queue_release; /* queue.lock's */
    PyObject *api;               /* queue.api (its methods are looked up on every call: they may be replaced) */
    PyObject *context;
    PyObject *stream;
    PyObject *events;            /* the queue's EventPool */
    PyObject *inflight_append;   /* queue.inflight.append */
    PyObject *inflight;
    PyObject *sequence;          /* completion.sequence */
    PyObject *outstanding;       /* completion.outstanding */
    /* The host wait (_replay_wait.c). */
    PyTypeObject *event_semaphore_type;
    PyObject *python_wait;       /* Semaphore.wait(sem, value, timeout): every other wait */
    PyObject *hal_error;         /* hal.HalError: a driver call failing so goes to the Python wait */
    PyObject *retire_lock;       /* queue.retire_lock */
    PyObject *inflight_popleft;  /* queue.inflight.popleft */
    /* Recording a dispatch (_replay_record.c). */
    PyObject *python_dispatch;   /* CommandBuffer.dispatch(cb, ...): every other dispatch */
    PyTypeObject *dispatch_type; /* recording.Dispatch */
    PyTypeObject *buffer_type;   /* hal.Buffer */
    PyObject *recording_state;   /* CommandBufferState.RECORDING */
    Py_ssize_t dispatch_slot[DISPATCH_SLOTS]; /* byte offsets of Dispatch's __slots__ */
    Py_ssize_t slot[SUBMISSION_SLOTS]; /* byte offsets of Submission's __slots__ */
} Replay;

/* Interned attribute names (defined in _replay.c). */
extern PyObject *s_sem_lock, *s_closed, *s_queue_closed, *s_release_count, *s_device, *s_validated,
    *s_validated_before, *s_state, *s_value, *s_failure, *s_lost, *s_activate, *s_acquire, *s_release, *s_issue,
    *s_uses_slots, *s_issue_lock, *s_bound_table, *s_launch_exec, *s_graph_launch, *s_free, *s_event_record,
    *s_issue_failed, *s_add_timepoint, *s_timepoints, *s_waiters, *s_issuable, *s_parked, *s_idle, *s_wake, *s_deferred,
    *s_idle_waiters, *s_notify_idle, *s_enabled, *s_queue, *s_wait, *s_signal, *s_binding_tables,
    *s_command_buffers, *s_closed_for_good, *s_event_synchronize, *s_one_shot, *s_listeners, *s_advance, *s_finish,
    *s_run_deferred, *s_timeout, *s_checked_workgroups, *s_whole_refs_at, *s_whole_refs, *s_buffer, *s_allocation,
    *s_ptr, *s_offset, *s_last_export, *s_constants, *s_bindings, *s_args, *s_pending, *s_level, *s_functions,
    *s_workgroup_size;

/* Outcome of the checks: not the usual case (take the Python method), or an error to raise. */
enum { NOT_USUAL = 0, USUAL = 1, FAILED = -1 };

/* obj.name is `expected` (1), is not (0), or the read failed (-1, error cleared: not usual). */
static inline int attr_is(PyObject *obj, PyObject *name, PyObject *expected) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        PyErr_Clear();
        return -1;
    }
    int same = value == expected;
    Py_DECREF(value);
    return same;
}

/* a == b as Python's `==` tests it, a failing comparison counting as unequal (hal.device._same). */
static inline int same(PyObject *a, PyObject *b) {
    int equal = PyObject_RichCompareBool(a, b, Py_EQ);
    if (equal < 0) {
        PyErr_Clear();
        return 0;
    }
    return equal;
}

/* `a op b` for ints, a failure counting as false. */
static inline int compare(PyObject *a, PyObject *b, int op) {
    int result = PyObject_RichCompareBool(a, b, op);
    if (result < 0) {
        PyErr_Clear();
        return 0;
    }
    return result;
}

static inline int call_method0(PyObject *obj, PyObject *name) {
    PyObject *result = PyObject_CallMethodNoArgs(obj, name);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

static inline int call_method(PyObject *obj, PyObject *name, PyObject *const *args, size_t nargs) {
    PyObject *stack[4];
    stack[0] = obj;
    for (size_t i = 0; i < nargs; i++)
        stack[i + 1] = args[i];
    PyObject *result = PyObject_VectorcallMethod(name, stack, (nargs + 1) | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* callable() or callable(arg). */
static inline int invoke(PyObject *callable, PyObject *arg) {
    PyObject *result = PyObject_Vectorcall(callable, arg ? &arg : NULL, arg ? 1 : 0, NULL);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* lock.acquire() / lock.release(): a threading.Lock's without a method look-up. */
static inline int acquire(PyObject *lock) {
    return Py_TYPE(lock) == lock_type ? invoke(lock_acquire, lock) : call_method0(lock, s_acquire);
}

static inline int unlock(PyObject *lock) {
    return Py_TYPE(lock) == lock_type ? invoke(lock_release, lock) : call_method0(lock, s_release);
}

/* unlock(lock), or the bound release() when lock is NULL, keeping a pending exception (a release
   that fails too replaces it): -1 when an exception is pending afterwards. */
static inline int unlock_keeping(PyObject *lock, PyObject *bound_release) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int status = lock != NULL ? unlock(lock) : invoke(bound_release, NULL);
    if (type != NULL) {
        if (status < 0) {
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        } else {
            PyErr_Restore(type, value, tb);
        }
        return -1;
    }
    return status;
}

/* bool(obj.name): 1, 0, or -1 with an error set. */
static inline int attr_true(PyObject *obj, PyObject *name) {
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* Replay.wait_on(sem, value, timeout=None): a host wait on an EventSemaphore (_replay_wait.c). */
PyObject *Replay_wait_on(Replay *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* Replay.record_dispatch(cb, executable, entry_point, workgroups, constants, bindings): a dispatch
   like the last one recorded from C (_replay_record.c). */
PyObject *Replay_record_dispatch(Replay *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

#endif
