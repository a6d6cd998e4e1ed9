/*
 * hal.drivers._native: a GPU driver library's hot calls made from C.
 *
 * The Python shims call the vendor bindings (cuda.bindings, hip-python) for everything;
 * on the paths a submission takes every time (kernel launches of a stream command buffer,
 * graph launch, event record / query / synchronize, stream wait) each bindings call costs
 * its argument conversion, its status enum and its result tuple, about as much again as
 * the driver call itself. `Calls` resolves those few functions from the already loaded
 * driver library with dlopen/dlsym at run time (no vendor headers are needed to build) and
 * calls them with handles given as integers. Every method returns the raw status (0: success);
 * the Python shim turns a failing one into its HalError, exactly as for the bindings. Once the
 * shim registered its failure handler (`set_failure`), the `checked_*` methods make the same
 * calls and return nothing (event query: whether the event completed), calling the handler,
 * which raises, only on a failing status: the shim then binds them as its own methods, with
 * no Python frame around each call.
 *
 * The CUDA driver API and the HIP runtime take these calls' arguments alike:
 *   launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, void **params, void **extra)
 *   graph_launch(graph_exec, stream), event_record(event, stream), event_query(event),
 *   event_synchronize(event), stream_wait_event(stream, event, flags).
 *
 * The GIL is released around every call that may block (launches can wait for room in a full
 * launch queue, synchronize waits for the device); event_record and event_query do not block.
 *
 * `activate(context)` is the shim's activate with its per-thread check in C: it calls the shim's
 * own method (`set_activate`), which makes the switch and records it, only when `context` is not
 * the one this thread made current last (a thread-specific slot holding a reference to it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
typedef int (*pair_fn)(void *, void *);
typedef int (*one_fn)(void *);
typedef int (*wait_fn)(void *, void *, unsigned);

/* A prepared launch: ten 64-bit fields, packed once when the command buffer is prepared. */
enum { F_FUNCTION, F_GX, F_GY, F_GZ, F_BX, F_BY, F_BZ, F_SHARED, F_STREAM, F_PARAMS, LAUNCH_FIELDS };
#define LAUNCH_BYTES (LAUNCH_FIELDS * 8)

typedef struct {
    PyObject_HEAD
    void *library;
    launch_fn launch;
    pair_fn graph_launch;
    pair_fn event_record;
    one_fn event_query;
    one_fn event_synchronize;
    wait_fn stream_wait_event;
    PyObject *on_failure; /* fail(status, call name): raises the HalError (set_failure) */
    int not_ready;        /* the status event_query returns for work still running */
    PyObject *make_current; /* the shim's activate(context) (set_activate), called on a switch */
    Py_tss_t current;       /* per thread: the context activate() made current last (a strong reference) */
    int has_current;
} Calls;

/* A handle: an int (the fast path: the shim hands out its handles as ints), None (NULL), or a
   bindings handle object that converts with int(). */
static int handle_arg(PyObject *arg, void **out) {
    if (PyLong_Check(arg)) {
        *out = PyLong_AsVoidPtr(arg);
        return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
    }
    if (arg == Py_None) {
        *out = NULL;
        return 0;
    }
    PyNumberMethods *as_number = Py_TYPE(arg)->tp_as_number;
    if (as_number == NULL || as_number->nb_int == NULL || PyFloat_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "a handle is an int or a handle object that converts with int(), not %.100s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    PyObject *number = PyNumber_Long(arg);
    if (number == NULL)
        return -1;
    *out = PyLong_AsVoidPtr(number);
    Py_DECREF(number);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* The first two arguments of a call taking `want` of them, as handles; `usage` names the call. */
static int two_handles(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *usage, void **first,
                       void **second) {
    if (nargs != want) {
        PyErr_SetString(PyExc_TypeError, usage);
        return -1;
    }
    return handle_arg(args[0], first) < 0 || handle_arg(args[1], second) < 0 ? -1 : 0;
}

static int resolve(void *library, const char *name, void **out) {
    *out = dlsym(library, name);
    if (*out == NULL) {
        PyErr_Format(PyExc_OSError, "the driver library has no function %s", name);
        return -1;
    }
    return 0;
}

static int Calls_init(Calls *self, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"library", "launch", "graph_launch", "event_record", "event_query",
                               "event_synchronize", "stream_wait_event", NULL};
    const char *path, *names[6];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sssssss", keywords, &path, &names[0], &names[1], &names[2],
                                     &names[3], &names[4], &names[5]))
        return -1;
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        const char *why = dlerror();
        PyErr_Format(PyExc_OSError, "cannot open %s: %s", path, why ? why : "unknown error");
        return -1;
    }
    void *functions[6];
    for (int i = 0; i < 6; i++) {
        if (resolve(library, names[i], &functions[i]) < 0) {
            dlclose(library);
            return -1;
        }
    }
    if (self->library != NULL)
        dlclose(self->library);
    self->library = library;
    self->launch = (launch_fn)functions[0];
    self->graph_launch = (pair_fn)functions[1];
    self->event_record = (pair_fn)functions[2];
    self->event_query = (one_fn)functions[3];
    self->event_synchronize = (one_fn)functions[4];
    self->stream_wait_event = (wait_fn)functions[5];
    return 0;
}

/* The callbacks are the shim's bound methods, and the shim holds this object: a cycle the
   collector must see (else every closed device's shim would stay alive). */
static int Calls_traverse(Calls *self, visitproc visit, void *arg) {
    Py_VISIT(self->on_failure);
    Py_VISIT(self->make_current);
    return 0;
}

static int Calls_clear(Calls *self) {
    Py_CLEAR(self->on_failure);
    Py_CLEAR(self->make_current);
    return 0;
}

static void Calls_dealloc(Calls *self) {
    /* The library stays loaded: the vendor bindings hold it too, and a handle closed while
       another thread is inside one of its functions would unmap it. (Each thread's remembered
       context keeps its reference: contexts live as long as their driver.) */
    PyObject_GC_UnTrack(self);
    Calls_clear(self);
    if (self->has_current)
        PyThread_tss_delete(&self->current);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int check_ready(Calls *self) {
    if (self->library == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Calls was not initialised");
        return -1;
    }
    return 0;
}

static int launch_packed(Calls *self, const uint64_t *f) {
    int status;
    void *params = (void *)(uintptr_t)f[F_PARAMS];
    Py_BEGIN_ALLOW_THREADS
    status = self->launch((void *)(uintptr_t)f[F_FUNCTION], (unsigned)f[F_GX], (unsigned)f[F_GY], (unsigned)f[F_GZ],
                          (unsigned)f[F_BX], (unsigned)f[F_BY], (unsigned)f[F_BZ], (unsigned)f[F_SHARED],
                          (void *)(uintptr_t)f[F_STREAM], (void **)params, NULL);
    Py_END_ALLOW_THREADS
    return status;
}

/* pack_launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params) -> bytes */
static PyObject *pack_launch(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != LAUNCH_FIELDS) {
        PyErr_Format(PyExc_TypeError, "pack_launch takes %d arguments, got %zd", LAUNCH_FIELDS, nargs);
        return NULL;
    }
    uint64_t fields[LAUNCH_FIELDS];
    for (int i = 0; i < LAUNCH_FIELDS; i++) {
        if (args[i] == Py_None) {
            fields[i] = 0;
            continue;
        }
        fields[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (fields[i] == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
        if (i >= F_GX && i <= F_SHARED && fields[i] > UINT32_MAX) {
            PyErr_Format(PyExc_OverflowError, "launch field %d does not fit 32 bits", i);
            return NULL;
        }
    }
    return PyBytes_FromStringAndSize((const char *)fields, LAUNCH_BYTES);
}

/* run(calls) -> None, or (index, status) of the first failing call.
   Each item: the bytes of pack_launch (launched here), or a (function, arguments) pair of the
   bindings (called; its result's first item is the status). */
static PyObject *Calls_run(Calls *self, PyObject *calls) {
    if (check_ready(self) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(calls, "run() takes a list of prepared calls");
    if (seq == NULL)
        return NULL;
    /* The size and the item are read again at each step and the item is held: a bindings call
       (Python code) cannot pull a list being run out from under the loop. */
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        Py_INCREF(item);
        PyObject *out = NULL;
        int done = 0; /* 1: stop with `out` (NULL: an exception is set) */
        if (PyBytes_CheckExact(item) && PyBytes_GET_SIZE(item) == LAUNCH_BYTES) {
            uint64_t fields[LAUNCH_FIELDS];
            memcpy(fields, PyBytes_AS_STRING(item), LAUNCH_BYTES);
            int status = launch_packed(self, fields);
            if (status != 0) {
                out = Py_BuildValue("(ni)", i, status);
                done = 1;
            }
        } else if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2 ||
                   !PyTuple_CheckExact(PyTuple_GET_ITEM(item, 1))) {
            PyErr_Format(PyExc_TypeError, "prepared call %zd is neither a packed launch nor (function, arguments)", i);
            done = 1;
        } else {
            PyObject *result = PyObject_Call(PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), NULL);
            if (result == NULL) {
                done = 1;
            } else {
                PyObject *status =
                    PyTuple_Check(result) && PyTuple_GET_SIZE(result) > 0 ? PyTuple_GET_ITEM(result, 0) : result;
                int failed = PyObject_IsTrue(status);
                if (failed != 0) {
                    out = failed < 0 ? NULL : Py_BuildValue("(nO)", i, status);
                    done = 1;
                }
                Py_DECREF(result);
            }
        }
        Py_DECREF(item);
        if (done) {
            Py_DECREF(seq);
            return out;
        }
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

static PyObject *Calls_graph_launch(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    void *graph_exec, *stream;
    int status;
    if (check_ready(self) < 0 || two_handles(args, nargs, 2, "graph_launch(graph_exec, stream)", &graph_exec, &stream) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = self->graph_launch(graph_exec, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyObject *Calls_event_record(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    void *event, *stream;
    if (check_ready(self) < 0 || two_handles(args, nargs, 2, "event_record(event, stream)", &event, &stream) < 0)
        return NULL;
    return PyLong_FromLong(self->event_record(event, stream));
}

static PyObject *Calls_event_query(Calls *self, PyObject *arg) {
    void *event;
    if (check_ready(self) < 0 || handle_arg(arg, &event) < 0)
        return NULL;
    return PyLong_FromLong(self->event_query(event));
}

static PyObject *Calls_event_synchronize(Calls *self, PyObject *arg) {
    void *event;
    int status;
    if (check_ready(self) < 0 || handle_arg(arg, &event) < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    status = self->event_synchronize(event);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyObject *Calls_stream_wait_event(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    void *stream, *event;
    unsigned long flags;
    int status;
    if (check_ready(self) < 0 ||
        two_handles(args, nargs, 3, "stream_wait_event(stream, event, flags)", &stream, &event) < 0)
        return NULL;
    flags = PyLong_AsUnsignedLong(args[2]);
    if (flags == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (flags > UINT_MAX) {
        PyErr_Format(PyExc_OverflowError, "stream_wait_event flags %lu do not fit 32 bits", flags);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->stream_wait_event(stream, event, (unsigned)flags);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

/* set_failure(fail, not_ready): `fail(status, call)` raises the error of a failing status of the
   call named `call` ("graph_launch", ...); `not_ready` is event_query's status for running work. */
static PyObject *Calls_set_failure(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "set_failure(fail, not_ready) takes a callable and an int");
        return NULL;
    }
    long not_ready = PyLong_AsLong(args[1]);
    if (not_ready == -1 && PyErr_Occurred())
        return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(self->on_failure, args[0]);
    self->not_ready = (int)not_ready;
    Py_RETURN_NONE;
}

/* set_activate(make_current): activate(context) calls make_current(context) only when `context` is
   not the one it made current last on this thread (the shim's own activate, which makes the switch
   and records it for the shim's other calls). */
static PyObject *Calls_set_activate(Calls *self, PyObject *make_current) {
    if (!PyCallable_Check(make_current)) {
        PyErr_SetString(PyExc_TypeError, "set_activate(make_current) takes a callable");
        return NULL;
    }
    if (!self->has_current) {
        if (PyThread_tss_create(&self->current) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "cannot create the thread-local current context");
            return NULL;
        }
        self->has_current = 1;
    }
    Py_INCREF(make_current);
    Py_XSETREF(self->make_current, make_current);
    Py_RETURN_NONE;
}

/* activate(context): make `context` current on the calling thread; one thread-local read and an
   identity check when it already is (GpuApi.activate is called before every batch of calls). */
static PyObject *Calls_activate(Calls *self, PyObject *context) {
    if (self->make_current == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "activate() before set_activate()");
        return NULL;
    }
    if ((PyObject *)PyThread_tss_get(&self->current) == context)
        Py_RETURN_NONE;
    PyObject *result = PyObject_CallOneArg(self->make_current, context);
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    /* Read the record only now: make_current ran Python code (a finalizer freeing another device's
       memory, say), which may have entered activate() on this thread and replaced it. */
    PyObject *previous = (PyObject *)PyThread_tss_get(&self->current);
    if (previous == context)
        Py_RETURN_NONE;
    Py_INCREF(context);
    if (PyThread_tss_set(&self->current, context) != 0) {
        Py_DECREF(context);
        PyErr_SetString(PyExc_RuntimeError, "cannot record the thread's current context");
        return NULL;
    }
    Py_XDECREF(previous);
    Py_RETURN_NONE;
}

/* The result of a checked call: None for success, else whatever the failure handler raises. */
static PyObject *checked(Calls *self, PyObject *status, const char *call) {
    if (status == NULL)
        return NULL;
    long code = PyLong_AsLong(status);
    Py_DECREF(status);
    if (code == 0)
        Py_RETURN_NONE;
    if (code == -1 && PyErr_Occurred())
        return NULL;
    if (self->on_failure == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a checked call failed before set_failure() was called");
        return NULL;
    }
    PyObject *result = PyObject_CallFunction(self->on_failure, "ls", code, call);
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    PyErr_Format(PyExc_RuntimeError, "the failure handler returned for status %ld of %s", code, call);
    return NULL;
}

static PyObject *Calls_checked_graph_launch(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    return checked(self, Calls_graph_launch(self, args, nargs), "graph_launch");
}

static PyObject *Calls_checked_event_record(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    return checked(self, Calls_event_record(self, args, nargs), "event_record");
}

static PyObject *Calls_checked_event_synchronize(Calls *self, PyObject *arg) {
    return checked(self, Calls_event_synchronize(self, arg), "event_synchronize");
}

static PyObject *Calls_checked_stream_wait_event(Calls *self, PyObject *const *args, Py_ssize_t nargs) {
    return checked(self, Calls_stream_wait_event(self, args, nargs), "stream_wait_event");
}

static PyObject *Calls_checked_event_query(Calls *self, PyObject *arg) {
    void *event;
    if (check_ready(self) < 0 || handle_arg(arg, &event) < 0)
        return NULL;
    int status = self->event_query(event);
    if (status == 0)
        Py_RETURN_TRUE;
    if (status == self->not_ready)
        Py_RETURN_FALSE;
    PyObject *none = checked(self, PyLong_FromLong(status), "event_query");
    Py_XDECREF(none); /* never None: a failing status raises */
    return NULL;
}

static PyMethodDef Calls_methods[] = {
    {"run", (PyCFunction)Calls_run, METH_O, "run(calls) -> None or (index, status) of the first failing call"},
    {"graph_launch", (PyCFunction)(void (*)(void))Calls_graph_launch, METH_FASTCALL,
     "graph_launch(graph_exec, stream) -> status"},
    {"event_record", (PyCFunction)(void (*)(void))Calls_event_record, METH_FASTCALL,
     "event_record(event, stream) -> status"},
    {"event_query", (PyCFunction)Calls_event_query, METH_O, "event_query(event) -> status"},
    {"event_synchronize", (PyCFunction)Calls_event_synchronize, METH_O, "event_synchronize(event) -> status"},
    {"stream_wait_event", (PyCFunction)(void (*)(void))Calls_stream_wait_event, METH_FASTCALL,
     "stream_wait_event(stream, event, flags) -> status"},
    {"set_activate", (PyCFunction)Calls_set_activate, METH_O,
     "set_activate(make_current): the call activate() makes when the thread's context changes"},
    {"activate", (PyCFunction)Calls_activate, METH_O,
     "activate(context) -> None: make_current(context) unless it is this thread's current one already"},
    {"set_failure", (PyCFunction)(void (*)(void))Calls_set_failure, METH_FASTCALL,
     "set_failure(fail, not_ready): the handler the checked_* methods call on a failing status"},
    {"checked_graph_launch", (PyCFunction)(void (*)(void))Calls_checked_graph_launch, METH_FASTCALL,
     "checked_graph_launch(graph_exec, stream) -> None; a failing status raises through the handler"},
    {"checked_event_record", (PyCFunction)(void (*)(void))Calls_checked_event_record, METH_FASTCALL,
     "checked_event_record(event, stream) -> None; a failing status raises through the handler"},
    {"checked_event_query", (PyCFunction)Calls_checked_event_query, METH_O,
     "checked_event_query(event) -> whether it completed; a failing status raises through the handler"},
    {"checked_event_synchronize", (PyCFunction)Calls_checked_event_synchronize, METH_O,
     "checked_event_synchronize(event) -> None; a failing status raises through the handler"},
    {"checked_stream_wait_event", (PyCFunction)(void (*)(void))Calls_checked_stream_wait_event, METH_FASTCALL,
     "checked_stream_wait_event(stream, event, flags) -> None; a failing status raises through the handler"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CallsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "hal.drivers._native.Calls",
    .tp_basicsize = sizeof(Calls),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Calls_traverse,
    .tp_clear = (inquiry)Calls_clear,
    .tp_doc = "Calls(library, launch, graph_launch, event_record, event_query, event_synchronize, "
              "stream_wait_event): the named functions of a loaded driver library, called from C.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Calls_init,
    .tp_dealloc = (destructor)Calls_dealloc,
    .tp_methods = Calls_methods,
};

static PyMethodDef module_methods[] = {
    {"pack_launch", (PyCFunction)(void (*)(void))pack_launch, METH_FASTCALL,
     "pack_launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params) -> bytes for run()"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "hal.drivers._native", "A driver library's hot calls made from C.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&CallsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&CallsType);
    if (PyModule_AddObject(module, "Calls", (PyObject *)&CallsType) < 0) {
        Py_DECREF(&CallsType);
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "LAUNCH_BYTES", LAUNCH_BYTES) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
