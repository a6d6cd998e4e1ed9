/*
 * Recording a dispatch like the last one, from C: Replay.record_dispatch.
 *
 * A stream command buffer recorded in a loop repeats one dispatch with other arguments: the
 * same executable and entry point, the same workgroup tuple, a few constants, whole buffers
 * already bound before. The core's `CommandBuffer.dispatch` recognises those by identity (its
 * `_last_export`, `_checked_workgroups` and `_whole_refs` memos) and the GPU recording's
 * `_dispatch` appends the arguments and a `Dispatch`: some 250 bytecodes a dispatch, about a
 * third of a raw `cuLaunchKernel`'s host time. `record_dispatch` makes the same steps from C for
 * that usual call and nothing else:
 *
 *   cb.dispatch(executable, entry_point, workgroups, constants, bindings)   (positional)
 *
 * where the executable and entry point are the objects of the last dispatch, `workgroups` the
 * tuple the last dispatch checked (no zero in it), the constants a list or tuple of ints in
 * uint32 range of the export's count, and each binding a whole `hal.Buffer` bound by this
 * command buffer before, with no buffer of the device released since. Anything else calls the
 * Python method (`python_dispatch`), which checks and reports exactly as without this file; the
 * checks are made before anything changes.
 *
 * `GpuDevice` binds it to each of its command buffers as their instance's `dispatch` (see
 * hal/drivers/gpu/replay.py); `HAL_NATIVE=0` leaves the Python method.
 */
#include "_replay.h"

#define UINT32_LIMIT 0xFFFFFFFFul

/* The uint32 constants as a tuple, or NULL (no error) when one is not an int in range or the
   count is not the export's. */
static PyObject *usual_constants(PyObject *constants, Py_ssize_t count) {
    if (!(PyList_CheckExact(constants) || PyTuple_CheckExact(constants)) || PySequence_Fast_GET_SIZE(constants) != count)
        return NULL;
    PyObject *values = PyTuple_New(count);
    if (values == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(constants);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = items[i];
        unsigned long bits = PyLong_CheckExact(value) ? PyLong_AsUnsignedLong(value) : (unsigned long)-1;
        if (bits == (unsigned long)-1 || bits > UINT32_LIMIT) {
            PyErr_Clear();
            Py_DECREF(values);
            return NULL;
        }
        PyTuple_SET_ITEM(values, i, Py_NewRef(value));
    }
    return values;
}

/* The workgroup tuple the command buffer checked last, with no zero count (a dispatch of no
   work records nothing: the Python method's case). */
static int usual_grid(PyObject *cb, PyObject *workgroups) {
    if (!PyTuple_CheckExact(workgroups) || PyTuple_GET_SIZE(workgroups) != 3 ||
        attr_is(cb, s_checked_workgroups, workgroups) != 1)
        return 0;
    for (Py_ssize_t i = 0; i < 3; i++) {
        PyObject *count = PyTuple_GET_ITEM(workgroups, i);
        if (!PyLong_CheckExact(count) || PyLong_AsLong(count) <= 0) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Each binding's device address (a new list), when every one is a whole buffer of the
   command buffer's memo, made since the last release of a buffer of the device; else NULL. */
static PyObject *usual_addresses(Replay *self, PyObject *cb, PyObject *bindings, Py_ssize_t count) {
    if (!(PyList_CheckExact(bindings) || PyTuple_CheckExact(bindings)) || PySequence_Fast_GET_SIZE(bindings) != count)
        return NULL;
    PyObject *refs_at = PyObject_GetAttr(cb, s_whole_refs_at), *released = PyObject_GetAttr(self->device, s_release_count);
    int current = refs_at != NULL && released != NULL && same(refs_at, released);
    Py_XDECREF(refs_at);
    Py_XDECREF(released);
    PyObject *refs = current ? PyObject_GetAttr(cb, s_whole_refs) : NULL;
    PyObject *addresses = refs != NULL && PyDict_CheckExact(refs) ? PyList_New(count) : NULL;
    PyObject **items = PySequence_Fast_ITEMS(bindings);
    for (Py_ssize_t i = 0; addresses != NULL && i < count; i++) {
        PyObject *binding = items[i], *address = NULL;
        PyObject *ref = Py_TYPE(binding) == self->buffer_type ? PyDict_GetItemWithError(refs, binding) : NULL;
        PyObject *buffer = ref ? PyObject_GetAttr(ref, s_buffer) : NULL;
        if (buffer != NULL && buffer != Py_None) {
            PyObject *allocation = PyObject_GetAttr(buffer, s_allocation);
            PyObject *ptr = allocation ? PyObject_GetAttr(allocation, s_ptr) : NULL;
            PyObject *base = PyObject_GetAttr(buffer, s_offset), *offset = PyObject_GetAttr(ref, s_offset);
            PyObject *start = ptr && base ? PyNumber_Add(ptr, base) : NULL;
            address = start && offset ? PyNumber_Add(start, offset) : NULL;
            Py_XDECREF(start);
            Py_XDECREF(offset);
            Py_XDECREF(base);
            Py_XDECREF(ptr);
            Py_XDECREF(allocation);
        }
        Py_XDECREF(buffer);
        if (address == NULL) {
            Py_CLEAR(addresses);
            break;
        }
        PyList_SET_ITEM(addresses, i, address);
    }
    Py_XDECREF(refs);
    PyErr_Clear();
    return addresses;
}

/* A Dispatch(function, grid, block, arg_start, arg_count), its slots written as __init__ does. */
static PyObject *new_dispatch(Replay *self, PyObject *function, PyObject *grid, PyObject *block, Py_ssize_t start,
                              Py_ssize_t count) {
    PyTypeObject *type = self->dispatch_type;
    PyObject *values[DISPATCH_SLOTS] = {function, grid, block, PyLong_FromSsize_t(start), PyLong_FromSsize_t(count)};
    PyObject *dispatch = values[3] && values[4] ? type->tp_alloc(type, 0) : NULL;
    for (int i = 0; dispatch != NULL && i < DISPATCH_SLOTS; i++)
        *(PyObject **)((char *)dispatch + self->dispatch_slot[i]) = Py_NewRef(values[i]);
    Py_XDECREF(values[3]);
    Py_XDECREF(values[4]);
    return dispatch;
}

/* The usual dispatch: USUAL recorded, NOT_USUAL (nothing changed: the Python method), FAILED. */
static int record_usual(Replay *self, PyObject *cb, PyObject *executable, PyObject *entry_point, PyObject *workgroups,
                        PyObject *constants, PyObject *bindings) {
    if (attr_is(cb, s_state, self->recording_state) != 1 || attr_is(self->device, s_closed, Py_False) != 1 ||
        attr_is(cb, s_device, self->device) != 1 || !usual_grid(cb, workgroups))
        return NOT_USUAL;
    PyObject *last = PyObject_GetAttr(cb, s_last_export);
    if (last == NULL || !PyTuple_CheckExact(last) || PyTuple_GET_SIZE(last) != 4 ||
        PyTuple_GET_ITEM(last, 0) != executable || PyTuple_GET_ITEM(last, 1) != entry_point) {
        Py_XDECREF(last);
        PyErr_Clear();
        return NOT_USUAL;
    }
    PyObject *ordinal = PyTuple_GET_ITEM(last, 2), *export = PyTuple_GET_ITEM(last, 3);
    PyObject *n_constants = PyObject_GetAttr(export, s_constants), *n_bindings = PyObject_GetAttr(export, s_bindings);
    Py_ssize_t constants_count = n_constants ? PyLong_AsSsize_t(n_constants) : -1;
    Py_ssize_t bindings_count = n_bindings ? PyLong_AsSsize_t(n_bindings) : -1;
    Py_XDECREF(n_constants);
    Py_XDECREF(n_bindings);
    PyErr_Clear();
    int result = NOT_USUAL;
    PyObject *values = NULL, *addresses = NULL, *pending = NULL, *level = NULL, *functions = NULL, *function = NULL;
    PyObject *block = NULL, *args = NULL, *dispatch = NULL;
    if (constants_count < 0 || bindings_count < 0)
        goto done;
    values = usual_constants(constants, constants_count);
    addresses = values ? usual_addresses(self, cb, bindings, bindings_count) : NULL;
    if (addresses == NULL)
        goto done;
    args = PyObject_GetAttr(cb, s_args);
    pending = args ? PyObject_GetAttr(args, s_pending) : NULL;
    level = PyObject_GetAttr(cb, s_level);
    functions = PyObject_GetAttr(executable, s_functions);
    function = functions ? PyObject_GetItem(functions, ordinal) : NULL;
    block = PyObject_GetAttr(export, s_workgroup_size);
    if (pending == NULL || !PyList_CheckExact(pending) || level == NULL || !PyList_CheckExact(level) ||
        function == NULL || block == NULL) {
        PyErr_Clear();
        goto done;
    }
    /* From here on the dispatch is recorded (or fails as the Python code fails). */
    result = FAILED;
    Py_ssize_t start = PyList_GET_SIZE(pending);
    dispatch = new_dispatch(self, function, workgroups, block, start, bindings_count + constants_count);
    if (dispatch == NULL || PyList_SetSlice(pending, start, start, addresses) < 0)
        goto done;
    if (PyList_SetSlice(pending, PyList_GET_SIZE(pending), PyList_GET_SIZE(pending), values) < 0 ||
        PyList_Append(level, dispatch) < 0) {
        PyList_SetSlice(pending, start, PyList_GET_SIZE(pending), NULL); /* as it was */
        goto done;
    }
    result = USUAL;
done:
    Py_XDECREF(dispatch);
    Py_XDECREF(block);
    Py_XDECREF(function);
    Py_XDECREF(functions);
    Py_XDECREF(level);
    Py_XDECREF(pending);
    Py_XDECREF(args);
    Py_XDECREF(addresses);
    Py_XDECREF(values);
    Py_DECREF(last);
    return result;
}

/* record_dispatch(cb, executable, entry_point, workgroups=(1, 1, 1), constants=(), bindings=()) */
PyObject *Replay_record_dispatch(Replay *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (self->device == NULL || self->python_dispatch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the replay was cleared");
        return NULL;
    }
    if (nargs >= 4 && nargs <= 6 && kwnames == NULL) {
        PyObject *empty = PyTuple_New(0);
        if (empty == NULL)
            return NULL;
        int result = record_usual(self, args[0], args[1], args[2], args[3], nargs > 4 ? args[4] : empty,
                                  nargs > 5 ? args[5] : empty);
        Py_DECREF(empty);
        if (result == USUAL)
            Py_RETURN_NONE;
        if (result == FAILED)
            return NULL;
    }
    return PyObject_Vectorcall(self->python_dispatch, args, nargs, kwnames);
}
