/*
 * runtime._native: the runtime's per-eval and per-op Python in C, where it was measured to matter:
 * the eager graph key walk (lowering.collect_key and live_mask), the node constructors
 * (array.new_node / new_view), the usual cases of unary and binary ops (ops._unary, ops._binary)
 * and handing an eval's results their storage (lowering.attach); the usual choice and submission
 * of a recording (Variants.pick, lowering.submit) and the whole eval of a graph the cache holds
 * (evaluate, eval_arrays); Storage.__del__ and DeviceContext.wait; and the destructor of DLPack
 * capsules (interop), which a consumer may run with its error pending.
 *
 * Every eval walks the pending graph behind its targets to number its nodes, describe it as a
 * key for the graph cache, list its external inputs, and find the nodes read after the eval.
 * In Python that walk is about a hundred bytecodes a node; it was an eighth of an eager
 * training step's host time. This is the same walk, node for node: the same depth-first
 * post-order (a node after every pending input, inputs in order), views numbered as they are
 * met, the same key tuples. Its stack is explicit, so any depth takes the one numbering.
 *
 * Array is a __slots__ class: its fields are read at the offsets of its member descriptors,
 * found once (`setup`). A node of any other type makes `walk` return None, and the caller
 * takes the Python walk.
 *
 * binary(op, a, b) -> the node of ops._binary for two Arrays of one context whose shapes are equal
 *   (or one is 0-d), or an Array and a Python scalar whose constant ops._scalar_operand memoized,
 *   when the (op, promoted dtype) signature is known; None for anything else, which the Python code
 *   then handles (first uses, broadcasting, numpy scalars, other types, errors).
 *
 * unary(op, x) -> ops._unary's node for an Array whose (op, dtype) signature is known, or None.
 *
 * attach(ctx, fresh, n_ext, order, table, value): lowering.attach, the Storage objects made here.
 *
 * setup_dlpack(alive) -> the address of the destructor of interop's DLPack capsules, which keeps
 *   a consumer's pending error aside while it drops the tensor's entry from `alive`.
 *
 * walk(targets, live) -> (order, (parts, views), externals, keep) or None
 *   parts[i] = (op, params, shape, dtype, ins) of order[i]; an input is a pending node's index,
 *   an external's (-1 - slot, dtype, shape), or a view's ("v", index); views[k] = (op, params,
 *   shape, strides, offset, source). keep (live=True; else None): bit i set when node i may be
 *   read afterwards, as lowering.live_mask computes it: referenced by more than `order` and its
 *   consumers' input tuples, or read through a view.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>

enum { S_OP, S_INPUTS, S_PARAMS, S_SHAPE, S_DTYPE, S_BASE, S_STRIDES, S_OFFSET, S_STORAGE, N_SLOTS };
static const char *slot_names[N_SLOTS] = {"op", "inputs", "params", "shape", "dtype", "base", "strides",
                                          "offset", "storage"};
static Py_ssize_t slot_offset[N_SLOTS];
static PyTypeObject *array_type = NULL;
static PyObject *placeholder = NULL; /* the op of a traced placeholder (an external, not computed) */
static PyObject *view_tag = NULL;    /* "v" */
static PyObject *zero = NULL;        /* a new node's offset */
static PyObject *constants_name = NULL; /* "constants": a context's constant cache */
static PyObject *zero_hex = NULL, *negative_zero_hex = NULL; /* (0.0).hex(), (-0.0).hex() */
static Py_ssize_t ctx_offset;        /* Array.ctx (not a field the walk reads) */

#define SLOT(o, s) (*(PyObject **)((char *)(o) + slot_offset[s]))

/* The offsets of a __slots__ class's fields, from their member descriptors. */
static int slot_offsets(PyTypeObject *type, const char **names, int n, Py_ssize_t *offsets) {
    for (int s = 0; s < n; s++) {
        PyObject *d = PyDict_GetItemString(type->tp_dict, names[s]);
        if (d == NULL || !PyObject_TypeCheck(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ field", type->tp_name, names[s]);
            return -1;
        }
        offsets[s] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    return 0;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *type, *ph;
    static const char *ctx_name[1] = {"ctx"};
    if (!PyArg_ParseTuple(args, "O!U:setup", &PyType_Type, &type, &ph))
        return NULL;
    if (slot_offsets((PyTypeObject *)type, slot_names, N_SLOTS, slot_offset) < 0 ||
        slot_offsets((PyTypeObject *)type, ctx_name, 1, &ctx_offset) < 0)
        return NULL;
    Py_INCREF(type);
    Py_XSETREF(array_type, (PyTypeObject *)type);
    Py_INCREF(ph);
    Py_XSETREF(placeholder, ph);
    Py_RETURN_NONE;
}

/* A field, borrowed; NULL with AttributeError when unset (as reading it in Python would raise). */
static inline PyObject *field(PyObject *o, int s) {
    PyObject *v = SLOT(o, s);
    if (v == NULL)
        PyErr_Format(PyExc_AttributeError, "'Array' object has no attribute '%s'", slot_names[s]);
    return v;
}

/* -1 error, 1 a node the eval computes (no storage, not a placeholder), 0 otherwise. */
static int is_pending(PyObject *node) {
    PyObject *storage = field(node, S_STORAGE);
    if (storage == NULL)
        return -1;
    if (storage != Py_None)
        return 0;
    PyObject *op = field(node, S_OP);
    if (op == NULL)
        return -1;
    if (op == placeholder)
        return 0;
    int ne = PyObject_RichCompareBool(op, placeholder, Py_NE);
    return ne;
}

typedef struct {
    PyObject *order, *parts, *views, *externals; /* lists */
    PyObject *node_index, *ext_index, *view_index; /* dicts */
    unsigned char *viewed;                         /* per node: read through a view */
    Py_ssize_t *direct;                            /* per node: consumers' direct references */
    Py_ssize_t cap;
} Walk;

static int grow(Walk *w, Py_ssize_t n) {
    if (n < w->cap)
        return 0;
    Py_ssize_t cap = w->cap ? w->cap * 2 : 64;
    while (cap <= n)
        cap *= 2;
    Py_ssize_t *d = PyMem_Realloc(w->direct, cap * sizeof(Py_ssize_t));
    if (d == NULL)
        goto nomem;
    w->direct = d;
    unsigned char *v = PyMem_Realloc(w->viewed, cap);
    if (v == NULL)
        goto nomem;
    w->viewed = v;
    w->cap = cap;
    return 0;
nomem:
    PyErr_NoMemory();
    return -1;
}

/* Give `o` the next number of `list`: index[o] = len(list), then list.append(o). The number, or -1
   with an error. */
static Py_ssize_t number(PyObject *index, PyObject *list, PyObject *o) {
    Py_ssize_t j = PyList_GET_SIZE(list);
    PyObject *jj = PyLong_FromSsize_t(j);
    if (jj == NULL)
        return -1;
    int bad = PyDict_SetItem(index, o, jj) < 0 || PyList_Append(list, o) < 0;
    Py_DECREF(jj);
    return bad ? -1 : j;
}

/* An external's reference (-1 - slot, dtype, shape), numbering it on first sight. New reference. */
static PyObject *external_ref(Walk *w, PyObject *r) {
    Py_ssize_t j;
    PyObject *known = PyDict_GetItemWithError(w->ext_index, r);
    if (known != NULL) {
        j = PyLong_AsSsize_t(known);
    } else {
        if (PyErr_Occurred())
            return NULL;
        j = number(w->ext_index, w->externals, r);
        if (j < 0)
            return NULL;
    }
    PyObject *dtype = field(r, S_DTYPE), *shape = dtype ? field(r, S_SHAPE) : NULL;
    if (shape == NULL)
        return NULL;
    PyObject *slot = PyLong_FromSsize_t(-1 - j);
    if (slot == NULL)
        return NULL;
    PyObject *ref = PyTuple_Pack(3, slot, dtype, shape);
    Py_DECREF(slot);
    return ref;
}

/* The reference to an input read through view `v`: the chain of views from its root, each
   numbered once as met, and the root (a node's index or an external's reference). New reference. */
static PyObject *view_ref(Walk *w, PyObject *v) {
    PyObject *chain = PyList_New(0);
    if (chain == NULL)
        return NULL;
    PyObject *src = NULL;
    for (;;) {
        PyObject *base = field(v, S_BASE);
        if (base == NULL)
            goto done;
        if (base == Py_None)
            break;
        int known = PyDict_Contains(w->view_index, v);
        if (known < 0)
            goto done;
        if (known)
            break;
        if (PyList_Append(chain, v) < 0)
            goto done;
        PyObject *inputs = field(v, S_INPUTS);
        if (inputs == NULL)
            goto done;
        if (!PyTuple_Check(inputs)) {
            PyErr_SetString(PyExc_TypeError, "a view's inputs are not a tuple");
            goto done;
        }
        v = PyTuple_GET_SIZE(inputs) ? PyTuple_GET_ITEM(inputs, 0) : base;
        if (Py_TYPE(v) != array_type) {
            PyErr_SetString(PyExc_TypeError, "a view of a non-Array");
            goto done;
        }
    }
    if (SLOT(v, S_BASE) != Py_None) {
        PyObject *k = PyDict_GetItemWithError(w->view_index, v);
        if (k == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_KeyError, "view");
            goto done;
        }
        src = PyTuple_Pack(2, view_tag, k);
    } else {
        PyObject *j = PyDict_GetItemWithError(w->node_index, v);
        if (j != NULL) {
            w->viewed[PyLong_AsSsize_t(j)] = 1;
            Py_INCREF(j);
            src = j;
        } else if (!PyErr_Occurred()) {
            src = external_ref(w, v);
        }
    }
    if (src == NULL)
        goto done;
    for (Py_ssize_t i = PyList_GET_SIZE(chain) - 1; i >= 0; i--) {
        PyObject *x = PyList_GET_ITEM(chain, i);
        PyObject *k = PyLong_FromSsize_t(PyList_GET_SIZE(w->views));
        if (k == NULL || PyDict_SetItem(w->view_index, x, k) < 0) {
            Py_XDECREF(k);
            Py_CLEAR(src);
            goto done;
        }
        PyObject *f[5];
        for (int s = 0, which[5] = {S_OP, S_PARAMS, S_SHAPE, S_STRIDES, S_OFFSET}; s < 5; s++) {
            f[s] = field(x, which[s]);
            if (f[s] == NULL) {
                Py_DECREF(k);
                Py_CLEAR(src);
                goto done;
            }
        }
        PyObject *entry = PyTuple_Pack(6, f[0], f[1], f[2], f[3], f[4], src);
        Py_DECREF(src);
        src = NULL;
        if (entry == NULL || PyList_Append(w->views, entry) < 0) {
            Py_XDECREF(entry);
            Py_DECREF(k);
            goto done;
        }
        Py_DECREF(entry);
        src = PyTuple_Pack(2, view_tag, k);
        Py_DECREF(k);
        if (src == NULL)
            goto done;
    }
done:
    Py_DECREF(chain);
    return src;
}

typedef struct {
    /* Owned while the frame lives: the walk allocates, so the cycle collector may run finalizers
       (Python code) in the middle of it, and nothing may then free what a frame reads. */
    PyObject *node;
    PyObject *inputs; /* a tuple */
    PyObject *ins;    /* the key's input references, filled in order */
    Py_ssize_t k;
} Frame;

static void drop_frame(Frame *f) {
    Py_XDECREF(f->ins);
    Py_DECREF(f->inputs);
    Py_DECREF(f->node);
}

/* Number `node` after every pending node it reads from (the recursive walk of collect_key). */
static int visit(Walk *w, PyObject *target) {
    Py_ssize_t depth = 0, cap = 32;
    Frame *stack = PyMem_Malloc(cap * sizeof(Frame));
    if (stack == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = -1;
    PyObject *next = target;
    for (;;) {
        if (next != NULL) { /* enter a node */
            if (depth == cap) {
                Frame *s = PyMem_Realloc(stack, 2 * cap * sizeof(Frame));
                if (s == NULL) {
                    PyErr_NoMemory();
                    goto out;
                }
                stack = s;
                cap *= 2;
            }
            PyObject *inputs = field(next, S_INPUTS);
            if (inputs == NULL)
                goto out;
            if (!PyTuple_Check(inputs)) {
                PyErr_SetString(PyExc_TypeError, "a node's inputs are not a tuple");
                goto out;
            }
            PyObject *ins = PyTuple_New(PyTuple_GET_SIZE(inputs));
            if (ins == NULL)
                goto out;
            Py_INCREF(next);
            Py_INCREF(inputs);
            stack[depth++] = (Frame){next, inputs, ins, 0};
            next = NULL;
        }
        Frame *f = &stack[depth - 1];
        Py_ssize_t n = PyTuple_GET_SIZE(f->inputs);
        while (f->k < n) {
            PyObject *inp = PyTuple_GET_ITEM(f->inputs, f->k);
            if (Py_TYPE(inp) != array_type) {
                PyErr_SetString(PyExc_TypeError, "an input is not an Array");
                goto out;
            }
            PyObject *r = field(inp, S_BASE);
            if (r == NULL)
                goto out;
            PyObject *ref;
            if (r != Py_None) { /* a view: its root first, if pending */
                if (Py_TYPE(r) != array_type) {
                    PyErr_SetString(PyExc_TypeError, "a view of a non-Array");
                    goto out;
                }
                int p = is_pending(r);
                if (p < 0)
                    goto out;
                if (p) {
                    int known = PyDict_Contains(w->node_index, r);
                    if (known < 0)
                        goto out;
                    if (!known) {
                        next = r; /* this input is looked at again once its root is numbered */
                        break;
                    }
                }
                ref = view_ref(w, inp);
                if (ref == NULL)
                    goto out;
            } else {
                PyObject *j = PyDict_GetItemWithError(w->node_index, inp);
                if (j != NULL) {
                    Py_INCREF(j);
                    ref = j;
                    w->direct[PyLong_AsSsize_t(j)] += 1;
                } else {
                    if (PyErr_Occurred())
                        goto out;
                    int p = is_pending(inp);
                    if (p < 0)
                        goto out;
                    if (p) {
                        next = inp;
                        break;
                    }
                    ref = external_ref(w, inp);
                    if (ref == NULL)
                        goto out;
                }
            }
            PyTuple_SET_ITEM(f->ins, f->k, ref);
            f->k++;
        }
        if (next != NULL)
            continue;
        /* every input numbered: number the node */
        PyObject *node = f->node;
        Py_ssize_t j = PyList_GET_SIZE(w->order);
        if (grow(w, j) < 0)
            goto out;
        w->direct[j] = 0;
        w->viewed[j] = 0;
        if (number(w->node_index, w->order, node) < 0)
            goto out;
        PyObject *op = field(node, S_OP), *params = op ? field(node, S_PARAMS) : NULL;
        PyObject *shape = params ? field(node, S_SHAPE) : NULL, *dtype = shape ? field(node, S_DTYPE) : NULL;
        if (dtype == NULL)
            goto out;
        PyObject *part = PyTuple_Pack(5, op, params, shape, dtype, f->ins);
        if (part == NULL)
            goto out;
        int bad = PyList_Append(w->parts, part) < 0;
        Py_DECREF(part);
        if (bad)
            goto out;
        drop_frame(f); /* `order` holds the node now */
        depth--;
        if (depth == 0) {
            rc = 0;
            goto out;
        }
    }
out:
    for (Py_ssize_t i = 0; i < depth; i++)
        drop_frame(&stack[i]);
    PyMem_Free(stack);
    return rc;
}

/* Whether order[i] may be read after the eval: read through a view, or held by more than `order`
   (once) and its consumers' input tuples (`direct` times): the program, the targets list, later nodes. */
static inline int is_live(Walk *w, Py_ssize_t i) {
    return w->viewed[i] || Py_REFCNT(PyList_GET_ITEM(w->order, i)) - w->direct[i] > 1;
}

/* bit i set: order[i] may be read after the eval (lowering.live_mask). */
static PyObject *keep_mask(Walk *w) {
    Py_ssize_t n = PyList_GET_SIZE(w->order);
    if (n <= 64) {
        unsigned long long mask = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (is_live(w, i))
                mask |= 1ull << i;
        return PyLong_FromUnsignedLongLong(mask);
    }
    unsigned char *bits = PyMem_Calloc((size_t)(n + 7) / 8 + 1, 1);
    if (bits == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        if (is_live(w, i))
            bits[i / 8] |= (unsigned char)(1u << (i % 8));
    PyObject *raw = PyBytes_FromStringAndSize((const char *)bits, (n + 7) / 8);
    PyMem_Free(bits);
    if (raw == NULL)
        return NULL;
    PyObject *mask = PyObject_CallMethod((PyObject *)&PyLong_Type, "from_bytes", "Os", raw, "little");
    Py_DECREF(raw);
    return mask;
}

/* walk's answer for a list of targets: a new reference (None: a target is not an Array). */
static PyObject *walk_targets(PyObject *targets, int live) {
    if (array_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup was not called");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(targets); i++)
        if (Py_TYPE(PyList_GET_ITEM(targets, i)) != array_type)
            Py_RETURN_NONE;
    Walk w = {0};
    PyObject *result = NULL, *keep = NULL, *key = NULL;
    w.order = PyList_New(0);
    w.parts = PyList_New(0);
    w.views = PyList_New(0);
    w.externals = PyList_New(0);
    w.node_index = PyDict_New();
    w.ext_index = PyDict_New();
    w.view_index = PyDict_New();
    if (!w.order || !w.parts || !w.views || !w.externals || !w.node_index || !w.ext_index || !w.view_index)
        goto out;
    if (grow(&w, 0) < 0)
        goto out;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(targets); i++) {
        PyObject *t = PyList_GET_ITEM(targets, i);
        int known = PyDict_Contains(w.node_index, t);
        if (known < 0)
            goto out;
        if (!known && visit(&w, t) < 0)
            goto out;
    }
    /* The indexes hold every node: drop them before reference counts are read. */
    Py_CLEAR(w.node_index);
    Py_CLEAR(w.ext_index);
    Py_CLEAR(w.view_index);
    if (live) {
        keep = keep_mask(&w);
        if (keep == NULL)
            goto out;
    } else {
        keep = Py_NewRef(Py_None);
    }
    PyObject *parts = PyList_AsTuple(w.parts), *views = parts ? PyList_AsTuple(w.views) : NULL;
    if (views != NULL)
        key = PyTuple_Pack(2, parts, views);
    Py_XDECREF(parts);
    Py_XDECREF(views);
    if (key == NULL)
        goto out;
    result = PyTuple_Pack(4, w.order, key, w.externals, keep);
out:
    Py_XDECREF(key);
    Py_XDECREF(keep);
    Py_XDECREF(w.order);
    Py_XDECREF(w.parts);
    Py_XDECREF(w.views);
    Py_XDECREF(w.externals);
    Py_XDECREF(w.node_index);
    Py_XDECREF(w.ext_index);
    Py_XDECREF(w.view_index);
    PyMem_Free(w.direct);
    PyMem_Free(w.viewed);
    return result;
}

static PyObject *walk(PyObject *self, PyObject *args) {
    PyObject *targets;
    int live;
    if (!PyArg_ParseTuple(args, "O!p:walk", &PyList_Type, &targets, &live))
        return NULL;
    return walk_targets(targets, live);
}

/* A fresh Array with every field set, `ctx` too (each gets a new reference). */
static PyObject *make_array(PyObject *values[N_SLOTS], PyObject *ctx) {
    PyObject *a = array_type->tp_alloc(array_type, 0);
    if (a == NULL)
        return NULL;
    for (int s = 0; s < N_SLOTS; s++) {
        Py_INCREF(values[s]);
        SLOT(a, s) = values[s];
    }
    Py_INCREF(ctx);
    *(PyObject **)((char *)a + ctx_offset) = ctx;
    return a;
}

/* A root node one kernel computes (array.new_node): no view fields. */
static PyObject *make_node(PyObject *op, PyObject *inputs, PyObject *params, PyObject *shape, PyObject *dtype,
                           PyObject *ctx, PyObject *storage) {
    PyObject *values[N_SLOTS] = {[S_OP] = op, [S_INPUTS] = inputs, [S_PARAMS] = params, [S_SHAPE] = shape,
                                 [S_DTYPE] = dtype, [S_BASE] = Py_None, [S_STRIDES] = Py_None,
                                 [S_OFFSET] = zero, [S_STORAGE] = storage};
    return make_array(values, ctx);
}

static PyObject *new_node(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (array_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup was not called");
        return NULL;
    }
    if (nargs != 6 && nargs != 7) {
        PyErr_Format(PyExc_TypeError, "new_node takes 6 or 7 arguments (%zd given)", nargs);
        return NULL;
    }
    return make_node(args[0], args[1], args[2], args[3], args[4], args[5], nargs == 7 ? args[6] : Py_None);
}

static PyObject *new_view(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (array_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup was not called");
        return NULL;
    }
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "new_view takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *src = args[1];
    if (Py_TYPE(src) != array_type) {
        PyErr_SetString(PyExc_TypeError, "new_view: the source is not an Array");
        return NULL;
    }
    PyObject *base = field(src, S_BASE), *dtype = base ? field(src, S_DTYPE) : NULL;
    PyObject *ctx = dtype ? *(PyObject **)((char *)src + ctx_offset) : NULL;
    if (dtype == NULL)
        return NULL;
    if (ctx == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'Array' object has no attribute 'ctx'");
        return NULL;
    }
    PyObject *inputs = PyTuple_Pack(1, src);
    if (inputs == NULL)
        return NULL;
    PyObject *values[N_SLOTS] = {[S_OP] = args[0], [S_INPUTS] = inputs, [S_PARAMS] = args[2], [S_SHAPE] = args[3],
                                 [S_DTYPE] = dtype, [S_STRIDES] = args[4], [S_OFFSET] = args[5],
                                 [S_STORAGE] = Py_None,
                                 [S_BASE] = base == Py_None ? src : base}; /* the root: src unless a view */
    PyObject *a = make_array(values, ctx);
    Py_DECREF(inputs);
    return a;
}

/* ops._PROMOTE, ops._SIGNATURES, ops._UNARY_SIGNATURES */
static PyObject *promote_table = NULL, *signature_table = NULL, *unary_table = NULL;

static PyObject *setup_ops(PyObject *self, PyObject *args) {
    PyObject *promote, *signatures, *unary;
    if (!PyArg_ParseTuple(args, "O!O!O!:setup_ops", &PyDict_Type, &promote, &PyDict_Type, &signatures,
                          &PyDict_Type, &unary))
        return NULL;
    Py_INCREF(promote);
    Py_XSETREF(promote_table, promote);
    Py_INCREF(signatures);
    Py_XSETREF(signature_table, signatures);
    Py_INCREF(unary);
    Py_XSETREF(unary_table, unary);
    Py_RETURN_NONE;
}

/* A borrowed dict entry under the key (x, y); NULL without an error when absent. */
static PyObject *lookup_pair(PyObject *dict, PyObject *x, PyObject *y) {
    PyObject *key = PyTuple_Pack(2, x, y);
    if (key == NULL)
        return NULL;
    PyObject *v = PyDict_GetItemWithError(dict, key);
    Py_DECREF(key);
    return v;
}

/* The memoized constant of a weak Python scalar operand of `other` (ops._scalar_operand's memo in
   the context's constant cache, filled by the Python code): new references to the constant array,
   and to the result dtype in *dt; NULL without an error when there is none (the Python code then
   decides). */
static PyObject *memoized_scalar(PyObject *value, PyObject *other, PyObject *ctx, PyObject **dt) {
    PyTypeObject *tv = Py_TYPE(value);
    PyObject *keyed = value; /* the value as the memo's key holds it */
    if (tv == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(value);
        if (d != d) /* a NaN is never memoized */
            return NULL;
        if (d == 0.0) /* ±0.0 are keyed by their hex form (float.hex), which tells them apart */
            keyed = signbit(d) ? negative_zero_hex : zero_hex;
    } else if (tv != &PyLong_Type && tv != &PyBool_Type) {
        return NULL;
    }
    PyObject *dtype = SLOT(other, S_DTYPE);
    PyObject *constants = PyObject_GetAttr(ctx, constants_name);
    if (constants == NULL || !PyDict_Check(constants)) {
        Py_XDECREF(constants);
        PyErr_Clear();
        return NULL;
    }
    PyObject *key = dtype ? PyTuple_Pack(4, (PyObject *)tv, keyed, dtype, Py_None) : NULL;
    PyObject *hit = key ? PyDict_GetItemWithError(constants, key) : NULL;
    Py_XDECREF(key);
    Py_DECREF(constants); /* the context keeps the dict, and the dict the entry */
    if (hit == NULL || !PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2 ||
        Py_TYPE(PyTuple_GET_ITEM(hit, 0)) != array_type) {
        PyErr_Clear();
        return NULL;
    }
    *dt = Py_NewRef(PyTuple_GET_ITEM(hit, 1));
    return Py_NewRef(PyTuple_GET_ITEM(hit, 0));
}

static PyObject *binary(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "binary takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *op = args[0], *a = args[1], *b = args[2];
    if (array_type == NULL || signature_table == NULL)
        Py_RETURN_NONE;
    int ta = Py_TYPE(a) == array_type, tb = Py_TYPE(b) == array_type;
    PyObject *ctx, *constant = NULL, *dt = NULL; /* a scalar operand's constant and the promoted dtype: owned */
    PyObject *result = NULL;
    if (ta && tb) {
        ctx = *(PyObject **)((char *)a + ctx_offset);
        if (ctx == NULL || ctx != *(PyObject **)((char *)b + ctx_offset))
            goto decline;
    } else if (ta || tb) {
        /* a weak scalar operand (not for pow: integer powers have their own checks) */
        if (PyUnicode_CompareWithASCIIString(op, "pow") == 0)
            goto decline;
        PyObject *arr = ta ? a : b;
        ctx = *(PyObject **)((char *)arr + ctx_offset);
        if (ctx == NULL)
            goto decline;
        constant = memoized_scalar(ta ? b : a, arr, ctx, &dt);
        if (constant == NULL)
            goto decline;
        if (ta)
            b = constant;
        else
            a = constant;
    } else {
        goto decline;
    }
    PyObject *da = SLOT(a, S_DTYPE), *db = SLOT(b, S_DTYPE), *sa = SLOT(a, S_SHAPE), *sb = SLOT(b, S_SHAPE);
    if (da == NULL || db == NULL || sa == NULL || sb == NULL || !PyTuple_Check(sa) || !PyTuple_Check(sb))
        goto decline;
    PyObject *shape;
    if (sa == sb || PyTuple_GET_SIZE(sb) == 0) {
        shape = sa;
    } else if (PyTuple_GET_SIZE(sa) == 0) {
        shape = sb;
    } else {
        int eq = PyObject_RichCompareBool(sa, sb, Py_EQ);
        if (eq < 0)
            goto done;
        if (!eq)
            goto decline; /* broadcasting: the Python code */
        shape = sa;
    }
    if (dt == NULL) {
        dt = lookup_pair(promote_table, da, db);
        if (dt == NULL)
            goto declined_lookup;
        Py_INCREF(dt);
    }
    PyObject *sig = lookup_pair(signature_table, op, dt);
    if (sig == NULL)
        goto declined_lookup; /* first use of this signature: validated in Python */
    if (!PyTuple_Check(sig) || PyTuple_GET_SIZE(sig) != 2)
        goto decline;
    PyObject *inputs = PyTuple_Pack(2, a, b);
    if (inputs == NULL)
        goto done;
    /* params: the compute dtype; dtype: the result's (ops._binary) */
    result = make_node(op, inputs, PyTuple_GET_ITEM(sig, 1), shape, PyTuple_GET_ITEM(sig, 0), ctx, Py_None);
    Py_DECREF(inputs);
    goto done;
declined_lookup:
    if (PyErr_Occurred())
        goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(constant);
    Py_XDECREF(dt);
    return result;
}

/* unary(op, x): ops._unary's node for an Array whose (op, dtype) signature is known, or None. */
static PyObject *unary(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "unary takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *op = args[0], *x = args[1];
    if (unary_table == NULL || array_type == NULL || Py_TYPE(x) != array_type)
        Py_RETURN_NONE;
    PyObject *ctx = *(PyObject **)((char *)x + ctx_offset), *dtype = SLOT(x, S_DTYPE), *shape = SLOT(x, S_SHAPE);
    if (ctx == NULL || dtype == NULL || shape == NULL)
        Py_RETURN_NONE;
    PyObject *sig = lookup_pair(unary_table, op, dtype);
    if (sig == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (!PyTuple_Check(sig) || PyTuple_GET_SIZE(sig) != 2)
        Py_RETURN_NONE;
    PyObject *inputs = PyTuple_Pack(1, x);
    if (inputs == NULL)
        return NULL;
    PyObject *node = make_node(op, inputs, PyTuple_GET_ITEM(sig, 1), shape, PyTuple_GET_ITEM(sig, 0), ctx, Py_None);
    Py_DECREF(inputs);
    return node;
}

/* ---- attach: the materialized nodes of an eval get their storage -------------------------- */

enum { T_BUFFER, T_BUCKET, T_CTX, T_SEM, T_READY, T_NBYTES, N_STORAGE_SLOTS };
static const char *storage_slot_names[N_STORAGE_SLOTS] = {"buffer", "bucket", "ctx", "sem", "ready", "nbytes"};
static Py_ssize_t storage_offset[N_STORAGE_SLOTS];
static PyTypeObject *storage_type = NULL;
static PyObject *semaphore_name = NULL; /* "semaphore" */

static PyObject *setup_storage(PyObject *self, PyObject *args) {
    PyObject *type;
    if (!PyArg_ParseTuple(args, "O!:setup_storage", &PyType_Type, &type))
        return NULL;
    if (slot_offsets((PyTypeObject *)type, storage_slot_names, N_STORAGE_SLOTS, storage_offset) < 0)
        return NULL;
    Py_INCREF(type);
    Py_XSETREF(storage_type, (PyTypeObject *)type);
    Py_RETURN_NONE;
}

/* Replace a slot's value (NULL when unset) with a new reference to `value`. */
static inline void set_slot(PyObject *o, Py_ssize_t offset, PyObject *value) {
    PyObject **at = (PyObject **)((char *)o + offset);
    PyObject *old = *at;
    Py_INCREF(value);
    *at = value;
    Py_XDECREF(old);
}

/* attach(ctx, fresh, n_ext, order, table, value): lowering.attach. For each (i, bucket, nbytes) of
   `fresh`, k-th: order[i].storage = Storage(table[n_ext + k], bucket, ctx, value, nbytes) (its
   semaphore, ctx.semaphore), and the node drops its op, inputs and params. */
static PyObject *attach_fresh(PyObject *ctx, PyObject *fresh, Py_ssize_t n_ext, PyObject *order, PyObject *table,
                              PyObject *value) {
    if (storage_type == NULL || array_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup_storage was not called");
        return NULL;
    }
    if (!PyList_Check(order) || !PyList_Check(table) || !(PyList_Check(fresh) || PyTuple_Check(fresh))) {
        PyErr_SetString(PyExc_TypeError, "attach: order and table must be lists, fresh a list or tuple");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(fresh, "fresh");
    if (seq == NULL)
        return NULL;
    PyObject *sem = PyObject_GetAttr(ctx, semaphore_name);
    if (sem == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *result = NULL, *empty = PyTuple_New(0);
    if (empty == NULL)
        goto out;
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError, "attach: fresh entries are (index, bucket, nbytes)");
            goto out;
        }
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0)), pos = n_ext + k;
        if (i == -1 && PyErr_Occurred())
            goto out;
        if (i < 0 || i >= PyList_GET_SIZE(order) || pos >= PyList_GET_SIZE(table)) {
            PyErr_SetString(PyExc_IndexError, "attach: a fresh entry outside the order or the table");
            goto out;
        }
        PyObject *node = PyList_GET_ITEM(order, i);
        if (Py_TYPE(node) != array_type) {
            PyErr_SetString(PyExc_TypeError, "attach: a node is not an Array");
            goto out;
        }
        PyObject *storage = storage_type->tp_alloc(storage_type, 0);
        if (storage == NULL)
            goto out;
        PyObject *fields[N_STORAGE_SLOTS] = {PyList_GET_ITEM(table, pos), PyTuple_GET_ITEM(item, 1), ctx, sem,
                                             value, PyTuple_GET_ITEM(item, 2)};
        for (int s = 0; s < N_STORAGE_SLOTS; s++)
            set_slot(storage, storage_offset[s], fields[s]);
        PyObject **at = (PyObject **)((char *)node + slot_offset[S_STORAGE]);
        PyObject *old = *at;
        *at = storage; /* the reference tp_alloc gave */
        Py_XDECREF(old);
        set_slot(node, slot_offset[S_OP], Py_None);
        set_slot(node, slot_offset[S_INPUTS], empty);
        set_slot(node, slot_offset[S_PARAMS], Py_None);
    }
    result = Py_NewRef(Py_None);
out:
    Py_XDECREF(empty);
    Py_DECREF(sem);
    Py_DECREF(seq);
    return result;
}

static PyObject *attach(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "attach takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t n_ext = PyLong_AsSsize_t(args[2]);
    if (n_ext == -1 && PyErr_Occurred())
        return NULL;
    return attach_fresh(args[0], args[1], n_ext, args[3], args[4], args[5]);
}

/* ---- The submission of a recording (lowering.submit's usual case) ------------------------- */

/* lowering.submit for an eval (not rt.compile's queued replays) whose recording ran before and
   whose buffers the cache has free: the buffers of its last table taken again (or others of their
   buckets), the table (with the scratch the recording owns at its end), the queue_execute of
   lowering._hand_over, the bookkeeping of _issue, and the scratch given back. Anything else returns None before changing anything, and the Python
   code runs. */
enum { R_CB, R_N_EXT, R_FRESH, R_TEMPS, R_BUCKETS, R_LAST_TABLE, R_LAST_EXT, R_MOVED, R_TAIL, R_HELD,
       R_FRESH_BUCKETS, R_DEFERRED, N_REC_SLOTS };
static const char *rec_slot_names[N_REC_SLOTS] = {"cb", "n_ext", "fresh", "temps", "buckets", "last_table",
                                                  "last_ext", "moved", "tail", "held", "fresh_buckets", "deferred"};
enum { C_DEVICE, C_SEMAPHORE, C_SUBMITTED, C_COMPLETED, C_FLUSHED, C_QUEUED, C_IN_FLIGHT, C_BUFFERS, C_GRAPHS,
       C_RETIRED_PROGRAMS, C_LOCK, C_IS_GPU, N_CTX_SLOTS };
static const char *ctx_slot_names[N_CTX_SLOTS] = {"device", "semaphore", "submitted", "completed", "flushed",
                                                  "queued", "in_flight", "buffers", "graphs", "retired_programs",
                                                  "lock", "is_gpu"};
enum { B_FREE, B_FREE_BYTES, B_LIMIT_BYTES, B_HITS, B_COMPLETED, N_CACHE_SLOTS };
static const char *cache_slot_names[N_CACHE_SLOTS] = {"_free", "free_bytes", "limit_bytes", "hits", "completed"};
static Py_ssize_t rec_offset[N_REC_SLOTS], context_offset[N_CTX_SLOTS], cache_offset[N_CACHE_SLOTS];
static PyTypeObject *recording_type = NULL, *context_type = NULL, *cache_type = NULL;
static Py_ssize_t max_in_flight = 0;
static PyObject *execute_kwnames = NULL; /* ("wait", "signal", "binding_tables") */
static PyObject *queue_execute_name = NULL, *throttle_name = NULL, *release_name = NULL, *popitem_name = NULL,
                *append_name = NULL;

static PyObject *setup_submit(PyObject *self, PyObject *args) {
    PyObject *rec_t, *ctx_t, *cache_t;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "O!O!O!n", &PyType_Type, &rec_t, &PyType_Type, &ctx_t, &PyType_Type, &cache_t,
                          &limit))
        return NULL;
    if (slot_offsets((PyTypeObject *)rec_t, rec_slot_names, N_REC_SLOTS, rec_offset) < 0 ||
        slot_offsets((PyTypeObject *)ctx_t, ctx_slot_names, N_CTX_SLOTS, context_offset) < 0 ||
        slot_offsets((PyTypeObject *)cache_t, cache_slot_names, N_CACHE_SLOTS, cache_offset) < 0)
        return NULL;
    if (execute_kwnames == NULL) {
        /* interned, as the names of a call in Python source are (a callee may compare them by identity) */
        PyObject *wait = PyUnicode_InternFromString("wait"), *signal = PyUnicode_InternFromString("signal");
        PyObject *tables = PyUnicode_InternFromString("binding_tables");
        execute_kwnames = wait && signal && tables ? PyTuple_Pack(3, wait, signal, tables) : NULL;
        Py_XDECREF(wait);
        Py_XDECREF(signal);
        Py_XDECREF(tables);
        queue_execute_name = PyUnicode_InternFromString("queue_execute");
        throttle_name = PyUnicode_InternFromString("throttle");
        release_name = PyUnicode_InternFromString("release");
        popitem_name = PyUnicode_InternFromString("popitem");
        append_name = PyUnicode_InternFromString("append");
        if (execute_kwnames == NULL || queue_execute_name == NULL || throttle_name == NULL || release_name == NULL ||
            popitem_name == NULL || append_name == NULL)
            return NULL;
    }
    Py_INCREF(rec_t);
    Py_INCREF(ctx_t);
    Py_INCREF(cache_t);
    Py_XSETREF(recording_type, (PyTypeObject *)rec_t);
    Py_XSETREF(context_type, (PyTypeObject *)ctx_t);
    Py_XSETREF(cache_type, (PyTypeObject *)cache_t);
    max_in_flight = limit;
    Py_RETURN_NONE;
}

static inline PyObject *slot_of(PyObject *o, Py_ssize_t offset) {
    return *(PyObject **)((char *)o + offset); /* borrowed; NULL when unset */
}

/* An int slot plus `delta` (a new int stored); -1 on error. */
static int add_to_slot(PyObject *o, Py_ssize_t offset, PyObject *delta, int subtract) {
    PyObject *old = slot_of(o, offset);
    if (old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "an unset counter");
        return -1;
    }
    PyObject *now = subtract ? PyNumber_Subtract(old, delta) : PyNumber_Add(old, delta);
    if (now == NULL)
        return -1;
    set_slot(o, offset, now);
    Py_DECREF(now);
    return 0;
}

/* Whether each bucket's free buffers are enough for the buckets taken from it. */
static int buffers_free(PyObject *free_map, PyObject *buckets) {
    Py_ssize_t n = PyList_GET_SIZE(buckets);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *bucket = PyList_GET_ITEM(buckets, k);
        PyObject *entries = PyDict_GetItemWithError(free_map, bucket);
        if (entries == NULL || !PyDict_CheckExact(entries)) {
            PyErr_Clear();
            return 0;
        }
        Py_ssize_t wanted = 0;
        for (Py_ssize_t j = 0; j < n; j++) {
            int equal = PyObject_RichCompareBool(PyList_GET_ITEM(buckets, j), bucket, Py_EQ);
            if (equal < 0) {
                PyErr_Clear();
                return 0;
            }
            wanted += equal;
        }
        if (PyDict_GET_SIZE(entries) < wanted)
            return 0;
    }
    return 1;
}

/* BufferCache.take(bucket, prefer) when the bucket has free buffers: a new reference. */
static PyObject *take_free(PyObject *cache, PyObject *free_map, PyObject *bucket, PyObject *prefer) {
    PyObject *entries = PyDict_GetItemWithError(free_map, bucket); /* borrowed; checked non-empty */
    if (entries == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_KeyError, "a bucket emptied under the submission");
        return NULL;
    }
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL || add_to_slot(cache, cache_offset[B_HITS], one, 0) < 0 ||
        add_to_slot(cache, cache_offset[B_FREE_BYTES], bucket, 1) < 0) {
        Py_XDECREF(one);
        return NULL;
    }
    Py_DECREF(one);
    PyObject *key = PyLong_FromVoidPtr(prefer), *entry = NULL;
    if (key == NULL)
        return NULL;
    entry = PyDict_GetItemWithError(entries, key);
    if (entry != NULL) {
        Py_INCREF(entry);
        if (PyDict_DelItem(entries, key) < 0) {
            Py_DECREF(entry);
            entry = NULL;
        }
    } else if (!PyErr_Occurred()) {
        PyObject *item = PyObject_CallMethodNoArgs(entries, popitem_name); /* (id, (buffer, fence)) */
        if (item != NULL && PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2)
            entry = Py_NewRef(PyTuple_GET_ITEM(item, 1));
        else if (item != NULL)
            PyErr_SetString(PyExc_TypeError, "a free entry is not (id, (buffer, fence))");
        Py_XDECREF(item);
    }
    Py_DECREF(key);
    if (entry == NULL)
        return NULL;
    PyObject *buffer = NULL;
    if (PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 2)
        buffer = Py_NewRef(PyTuple_GET_ITEM(entry, 0));
    else
        PyErr_SetString(PyExc_TypeError, "a free entry is not (buffer, fence)");
    Py_DECREF(entry);
    return buffer;
}

/* BufferCache.release(buffer, bucket, fence) while the cache has room; else the Python method. */
static int give_back(PyObject *cache, PyObject *free_map, PyObject *buffer, PyObject *bucket, PyObject *fence) {
    PyObject *free_bytes = slot_of(cache, cache_offset[B_FREE_BYTES]), *limit = slot_of(cache, cache_offset[B_LIMIT_BYTES]);
    PyObject *after = free_bytes ? PyNumber_Add(free_bytes, bucket) : NULL;
    int room = after && limit ? PyObject_RichCompareBool(after, limit, Py_LE) : -1;
    Py_XDECREF(after);
    if (room < 0)
        return -1;
    if (!room) {
        PyObject *r = PyObject_CallMethodObjArgs(cache, release_name, buffer, bucket, fence, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    PyObject *empty = PyDict_New();
    if (empty == NULL)
        return -1;
    PyObject *entries = PyDict_SetDefault(free_map, bucket, empty); /* borrowed */
    Py_DECREF(empty);
    PyObject *key = entries ? PyLong_FromVoidPtr(buffer) : NULL;
    PyObject *entry = key ? PyTuple_Pack(2, buffer, fence) : NULL;
    int status = entry ? PyDict_SetItem(entries, key, entry) : -1;
    Py_XDECREF(entry);
    Py_XDECREF(key);
    if (status < 0)
        return -1;
    return add_to_slot(cache, cache_offset[B_FREE_BYTES], bucket, 0);
}

/* pick's and submit's arguments: three, after setup_submit. */
static int check_submit_call(const char *name, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s takes 3 arguments (%zd given)", name, nargs);
        return -1;
    }
    if (recording_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup_submit was not called");
        return -1;
    }
    return 0;
}

/* BufferCache.all_free(table, start, buckets): 1, 0, or -1 (not the usual shapes). */
static int all_free(PyObject *free_map, PyObject *table, Py_ssize_t start, PyObject *buckets) {
    if (!PyList_CheckExact(table) || !PyList_CheckExact(buckets) ||
        PyList_GET_SIZE(table) - start < PyList_GET_SIZE(buckets))
        return -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(buckets); k++) {
        PyObject *entries = PyDict_GetItemWithError(free_map, PyList_GET_ITEM(buckets, k));
        if (entries == NULL) {
            if (PyErr_Occurred()) {
                PyErr_Clear();
                return -1;
            }
            return 0;
        }
        PyObject *key = PyLong_FromVoidPtr(PyList_GET_ITEM(table, start + k));
        int has = key ? PyDict_Contains(entries, key) : -1;
        Py_XDECREF(key);
        if (has <= 0) {
            PyErr_Clear();
            return has < 0 ? -1 : 0;
        }
    }
    return 1;
}

/* pick(recs, ext, buffers): Variants.pick's usual answer, the first recording that last ran with
   these externals and whose buffers are free again, when every recording before it last ran with
   others; None where the Python method must decide (a recording never run, guards, a held
   result, busy buffers, no match). */
static PyObject *pick_usual(PyObject *recs, PyObject *ext, PyObject *cache) {
    if (!PyList_CheckExact(recs) || !PyList_CheckExact(ext) || Py_TYPE(cache) != cache_type)
        Py_RETURN_NONE;
    PyObject *free_map = slot_of(cache, cache_offset[B_FREE]);
    if (free_map == NULL || !PyDict_CheckExact(free_map))
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(recs); i++) {
        PyObject *rec = PyList_GET_ITEM(recs, i);
        if (Py_TYPE(rec) != recording_type)
            Py_RETURN_NONE;
        PyObject *last = slot_of(rec, rec_offset[R_LAST_EXT]);
        if (last == NULL || !PyList_CheckExact(last))
            Py_RETURN_NONE;
        Py_INCREF(rec);
        int equal = PyObject_RichCompareBool(last, ext, Py_EQ);
        if (equal <= 0) {
            Py_DECREF(rec);
            if (equal < 0)
                return NULL;
            continue;
        }
        PyObject *moved = slot_of(rec, rec_offset[R_MOVED]), *held = slot_of(rec, rec_offset[R_HELD]);
        int usable = moved == Py_False ? 1 : -1;
        if (moved == Py_True && held == Py_None) {
            PyObject *n_ext = slot_of(rec, rec_offset[R_N_EXT]);
            Py_ssize_t start = n_ext && PyLong_CheckExact(n_ext) ? PyLong_AsSsize_t(n_ext) : -1;
            usable = start < 0 ? -1 : all_free(free_map, slot_of(rec, rec_offset[R_LAST_TABLE]), start,
                                               slot_of(rec, rec_offset[R_FRESH_BUCKETS]));
        }
        if (usable == 1)
            return rec;
        Py_DECREF(rec);
        Py_RETURN_NONE; /* busy buffers, a held result, or unusual fields: the Python method */
    }
    Py_RETURN_NONE;
}

static PyObject *pick(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_submit_call("pick", nargs) < 0)
        return NULL;
    return pick_usual(args[0], args[1], args[2]);
}

static PyObject *submit_usual(PyObject *ctx, PyObject *rec, PyObject *ext) {
    if (Py_TYPE(ctx) != context_type || Py_TYPE(rec) != recording_type || !PyList_CheckExact(ext))
        Py_RETURN_NONE;
    PyObject *last = slot_of(rec, rec_offset[R_LAST_TABLE]), *buckets = slot_of(rec, rec_offset[R_BUCKETS]);
    PyObject *tail = slot_of(rec, rec_offset[R_TAIL]), *temps = slot_of(rec, rec_offset[R_TEMPS]);
    PyObject *fresh_nodes = slot_of(rec, rec_offset[R_FRESH]), *n_ext_o = slot_of(rec, rec_offset[R_N_EXT]);
    PyObject *cb = slot_of(rec, rec_offset[R_CB]), *queued = slot_of(ctx, context_offset[C_QUEUED]);
    PyObject *cache = slot_of(ctx, context_offset[C_BUFFERS]), *device = slot_of(ctx, context_offset[C_DEVICE]);
    PyObject *sem = slot_of(ctx, context_offset[C_SEMAPHORE]), *in_flight = slot_of(ctx, context_offset[C_IN_FLIGHT]);
    if (last == NULL || !PyList_CheckExact(last) || buckets == NULL || !PyList_CheckExact(buckets) || tail == NULL ||
        !PyList_CheckExact(tail) || temps == NULL || !PyList_CheckExact(temps) ||
        fresh_nodes == NULL || !PyList_CheckExact(fresh_nodes) || n_ext_o == NULL || !PyLong_CheckExact(n_ext_o) ||
        cb == NULL || queued == NULL || !PyList_CheckExact(queued) || PyList_GET_SIZE(queued) != 0 || cache == NULL ||
        Py_TYPE(cache) != cache_type || device == NULL || sem == NULL || in_flight == NULL ||
        PyList_GET_SIZE(ext) != PyLong_AsSsize_t(n_ext_o))
        Py_RETURN_NONE;
    Py_ssize_t n_ext = PyLong_AsSsize_t(n_ext_o), nb = PyList_GET_SIZE(buckets);
    Py_ssize_t temps_at = n_ext + PyList_GET_SIZE(fresh_nodes);
    PyObject *free_map = slot_of(cache, cache_offset[B_FREE]);
    if (PyList_GET_SIZE(last) < n_ext + nb || temps_at + PyList_GET_SIZE(temps) != n_ext + nb || free_map == NULL ||
        !PyDict_CheckExact(free_map) || !buffers_free(free_map, buckets))
        Py_RETURN_NONE;
    /* From here on the submission is made (or fails as the Python code fails). */
    PyObject *objects[] = {ctx, rec, ext, last, buckets, temps, tail, cb, cache, device, in_flight, free_map};
    Py_INCREF(sem);
    for (size_t i = 0; i < sizeof(objects) / sizeof(objects[0]); i++)
        Py_INCREF(objects[i]);
    PyObject *result = NULL, *table = NULL, *value = NULL, *one = NULL, *wait = NULL, *signal = NULL;
    PyObject *cbs = NULL, *tables = NULL, *pair = NULL;
    Py_ssize_t taken = 0;
    Py_ssize_t n_tail = PyList_GET_SIZE(tail);
    table = PyList_New(n_ext + nb + n_tail); /* externals, the buffers taken, the owned scratch (`tail`) */
    if (table == NULL)
        goto out;
    for (Py_ssize_t i = 0; i < n_ext; i++)
        PyList_SET_ITEM(table, i, Py_NewRef(PyList_GET_ITEM(ext, i)));
    for (Py_ssize_t i = n_ext; i < n_ext + nb; i++)
        PyList_SET_ITEM(table, i, Py_NewRef(Py_None));
    for (Py_ssize_t i = 0; i < n_tail; i++)
        PyList_SET_ITEM(table, n_ext + nb + i, Py_NewRef(PyList_GET_ITEM(tail, i)));
    int moved = 0;
    for (; taken < nb; taken++) {
        PyObject *prefer = PyList_GET_ITEM(last, n_ext + taken);
        PyObject *buffer = take_free(cache, free_map, PyList_GET_ITEM(buckets, taken), prefer);
        if (buffer == NULL)
            goto give_back_taken;
        moved |= buffer != prefer;
        PyList_SetItem(table, n_ext + taken, buffer); /* steals; drops the None */
    }
    if (moved)
        set_slot(rec, rec_offset[R_MOVED], Py_True);
    /* _issue and _hand_over */
    one = PyLong_FromLong(1);
    PyObject *submitted = slot_of(ctx, context_offset[C_SUBMITTED]);
    value = one && submitted ? PyNumber_Add(submitted, one) : NULL;
    if (value == NULL)
        goto give_back_taken;
    Py_ssize_t flying = PyObject_Size(in_flight);
    if (flying < 0)
        goto give_back_taken;
    if (flying >= max_in_flight) {
        PyObject *r = PyObject_CallMethodNoArgs(ctx, throttle_name);
        if (r == NULL)
            goto give_back_taken;
        Py_DECREF(r);
    }
    /* Read after the throttle, as _hand_over does (a failed wait there moves to a new semaphore). */
    Py_SETREF(sem, Py_NewRef(slot_of(ctx, context_offset[C_SEMAPHORE])));
    PyObject *flushed = slot_of(ctx, context_offset[C_FLUSHED]), *completed = slot_of(ctx, context_offset[C_COMPLETED]);
    int behind = flushed && completed ? PyObject_RichCompareBool(flushed, completed, Py_GT) : -1;
    if (behind < 0)
        goto give_back_taken;
    if (behind) {
        pair = PyTuple_Pack(2, sem, flushed);
        wait = pair ? PyList_New(1) : NULL;
        if (wait != NULL)
            PyList_SET_ITEM(wait, 0, Py_NewRef(pair));
        Py_CLEAR(pair);
    } else {
        wait = PyTuple_New(0);
    }
    pair = wait ? PyTuple_Pack(2, sem, value) : NULL;
    signal = pair ? PyList_New(1) : NULL;
    cbs = signal ? PyList_New(1) : NULL;
    tables = cbs ? PyList_New(1) : NULL;
    if (tables == NULL)
        goto give_back_taken;
    PyList_SET_ITEM(signal, 0, Py_NewRef(pair));
    PyList_SET_ITEM(cbs, 0, Py_NewRef(cb));
    PyList_SET_ITEM(tables, 0, Py_NewRef(table));
    PyObject *call[5] = {device, cbs, wait, signal, tables};
    PyObject *r = PyObject_VectorcallMethod(queue_execute_name, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                            execute_kwnames);
    if (r == NULL)
        goto give_back_taken;
    Py_DECREF(r);
    set_slot(ctx, context_offset[C_FLUSHED], value);
    r = PyObject_CallMethodOneArg(in_flight, append_name, value);
    if (r == NULL)
        goto out;
    Py_DECREF(r);
    set_slot(rec, rec_offset[R_LAST_TABLE], table);
    set_slot(rec, rec_offset[R_LAST_EXT], ext);
    set_slot(ctx, context_offset[C_SUBMITTED], value);
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(temps); k++) { /* scratch: later submissions run after it */
        if (give_back(cache, free_map, PyList_GET_ITEM(table, temps_at + k), PyList_GET_ITEM(temps, k), value) < 0)
            goto out;
    }
    result = PyTuple_Pack(2, table, value);
    goto out;
give_back_taken: {
    /* As submit's except: the buffers taken go back (fence 0), and the error travels on. */
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    for (Py_ssize_t k = 0; k < taken; k++) {
        PyObject *r = PyObject_CallMethodObjArgs(cache, release_name, PyList_GET_ITEM(table, n_ext + k),
                                                 PyList_GET_ITEM(buckets, k), NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    PyErr_Restore(type, exc, tb);
}
out:
    Py_XDECREF(tables);
    Py_XDECREF(cbs);
    Py_XDECREF(signal);
    Py_XDECREF(pair);
    Py_XDECREF(wait);
    Py_XDECREF(value);
    Py_XDECREF(one);
    Py_XDECREF(table);
    for (size_t i = 0; i < sizeof(objects) / sizeof(objects[0]); i++)
        Py_DECREF(objects[i]);
    Py_DECREF(sem);
    return result;
}

static PyObject *submit(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (check_submit_call("submit", nargs) < 0)
        return NULL;
    return submit_usual(args[0], args[1], args[2]);
}

/* ---- An eval whose graph the cache holds (lowering._evaluate_on's usual case) --------------- */

/* evaluate(ctx, targets, live) -> True, False or walk's (order, key, externals, keep).
   lowering._evaluate_on from the walk to attach when the graph cache holds the graph and a
   recording of it that pick and submit take in C: True, done. False: the walk was not made (a
   node not of type Array), the Python code does everything. The walk's tuple: the Python code
   goes on from it (a graph the cache lacks, a recording pick or submit leave to Python, one with
   fused kernels due, an input with no storage, the cache off); nothing was submitted and the
   cache's counters are as they were (the timeline poll and autodiff's protect may have run: both
   are idempotent). */
enum { G_ENTRIES, G_NEWEST, G_HITS, N_GRAPH_SLOTS };
static const char *graph_slot_names[N_GRAPH_SLOTS] = {"_entries", "_newest", "hits"};
static Py_ssize_t graph_offset[N_GRAPH_SLOTS], variants_recs_offset;
static PyTypeObject *graph_cache_type = NULL, *variants_type = NULL;
static PyObject *graph_cache_globals = NULL; /* graph_cache's module dict: ENABLED, read at each eval */
static PyObject *handed_out = NULL, *protect_fn = NULL; /* autodiff._handed_out, autodiff.protect */
static PyObject *tracing_globals = NULL, *lowering_globals = NULL; /* tracing.ENABLED, lowering.FUSION */
static PyObject *evaluate_walked = NULL; /* lowering._evaluate_walked(ctx, targets, live, walked) */
static PyObject *refresh_name = NULL, *move_to_end_name = NULL, *enabled_name = NULL, *fusion_name = NULL,
                *acquire_name = NULL, *release_lock_name = NULL;

static PyObject *setup_evaluate(PyObject *self, PyObject *args) {
    PyObject *variants_t, *cache_t, *globals, *handed, *protect, *tracing_g, *lowering_g, *walked_fn;
    static const char *recs_name[1] = {"recs"};
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO!O!O:setup_evaluate", &PyType_Type, &variants_t, &PyType_Type, &cache_t,
                          &PyDict_Type, &globals, &PyDict_Type, &handed, &protect, &PyDict_Type, &tracing_g,
                          &PyDict_Type, &lowering_g, &walked_fn))
        return NULL;
    if (slot_offsets((PyTypeObject *)variants_t, recs_name, 1, &variants_recs_offset) < 0 ||
        slot_offsets((PyTypeObject *)cache_t, graph_slot_names, N_GRAPH_SLOTS, graph_offset) < 0)
        return NULL;
    if (refresh_name == NULL) {
        refresh_name = PyUnicode_InternFromString("refresh");
        move_to_end_name = PyUnicode_InternFromString("move_to_end");
        enabled_name = PyUnicode_InternFromString("ENABLED");
        fusion_name = PyUnicode_InternFromString("FUSION");
        acquire_name = PyUnicode_InternFromString("acquire");
        release_lock_name = PyUnicode_InternFromString("release");
        if (refresh_name == NULL || move_to_end_name == NULL || enabled_name == NULL || fusion_name == NULL ||
            acquire_name == NULL || release_lock_name == NULL)
            return NULL;
    }
    Py_XSETREF(tracing_globals, Py_NewRef(tracing_g));
    Py_XSETREF(lowering_globals, Py_NewRef(lowering_g));
    Py_XSETREF(evaluate_walked, Py_NewRef(walked_fn));
    Py_XSETREF(variants_type, (PyTypeObject *)Py_NewRef(variants_t));
    Py_XSETREF(graph_cache_type, (PyTypeObject *)Py_NewRef(cache_t));
    Py_XSETREF(graph_cache_globals, Py_NewRef(globals));
    Py_XSETREF(handed_out, Py_NewRef(handed));
    Py_XSETREF(protect_fn, Py_NewRef(protect));
    Py_RETURN_NONE;
}

/* The external inputs' buffers (a new list), or None (a new reference) when one has no storage. */
static PyObject *external_buffers(PyObject *externals) {
    Py_ssize_t n = PyList_GET_SIZE(externals);
    PyObject *ext = PyList_New(n);
    if (ext == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(externals, i);
        PyObject *st = Py_TYPE(x) == array_type ? SLOT(x, S_STORAGE) : NULL;
        PyObject *buffer = st != NULL && Py_TYPE(st) == storage_type ? slot_of(st, storage_offset[T_BUFFER]) : NULL;
        if (buffer == NULL) {
            Py_DECREF(ext);
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(ext, i, Py_NewRef(buffer));
    }
    return ext;
}

/* The timeline poll of _evaluate_on: ctx.refresh() when it has something newer to say. */
static int refresh_if_behind(PyObject *ctx) {
    PyObject *completed = slot_of(ctx, context_offset[C_COMPLETED]), *submitted = slot_of(ctx, context_offset[C_SUBMITTED]);
    PyObject *retired = slot_of(ctx, context_offset[C_RETIRED_PROGRAMS]);
    int behind = completed && submitted ? PyObject_RichCompareBool(completed, submitted, Py_LT) : 1;
    if (behind < 0)
        return -1;
    if (!behind && retired != NULL) {
        behind = PyObject_IsTrue(retired);
        if (behind < 0)
            return -1;
    }
    if (!behind)
        return 0;
    PyObject *r = PyObject_CallMethodNoArgs(ctx, refresh_name);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* GraphCache.get's bookkeeping of a hit on `entry` (found under `key`). */
static int count_hit(PyObject *graphs, PyObject *entries, PyObject *key, PyObject *entry) {
    if (slot_of(graphs, graph_offset[G_NEWEST]) != entry) {
        PyObject *r = PyObject_CallMethodOneArg(entries, move_to_end_name, key);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        set_slot(graphs, graph_offset[G_NEWEST], entry);
    }
    PyObject *one = PyLong_FromLong(1);
    int status = one ? add_to_slot(graphs, graph_offset[G_HITS], one, 0) : -1;
    Py_XDECREF(one);
    return status;
}

static PyObject *evaluate_targets(PyObject *ctx, PyObject *targets, int live) {
    if (!PyList_CheckExact(targets) || Py_TYPE(ctx) != context_type)
        Py_RETURN_FALSE;
    PyObject *walked = walk_targets(targets, live);
    if (walked == NULL)
        return NULL;
    if (walked == Py_None) {
        Py_DECREF(walked);
        Py_RETURN_FALSE;
    }
    PyObject *order = PyTuple_GET_ITEM(walked, 0), *externals = PyTuple_GET_ITEM(walked, 2);
    if (PyList_GET_SIZE(order) == 0) {
        Py_DECREF(walked);
        Py_RETURN_TRUE;
    }
    Py_INCREF(ctx);
    PyObject *result = NULL, *key = NULL, *ext = NULL, *entry = NULL, *rec = NULL, *submitted = NULL;
    PyObject *graphs = NULL;
    if (refresh_if_behind(ctx) < 0)
        goto out;
    if (PyDict_GET_SIZE(handed_out)) { /* grad nodes handed out: autodiff.protect decides */
        PyObject *r = PyObject_CallOneArg(protect_fn, order);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
    }
    ext = external_buffers(externals);
    if (ext == NULL)
        goto out;
    PyObject *enabled = PyDict_GetItemWithError(graph_cache_globals, enabled_name);
    PyObject *cache_of_graphs = slot_of(ctx, context_offset[C_GRAPHS]);
    if (enabled != Py_True || ext == Py_None || cache_of_graphs == NULL || Py_TYPE(cache_of_graphs) != graph_cache_type)
        goto python;
    graphs = Py_NewRef(cache_of_graphs);
    PyObject *entries = slot_of(graphs, graph_offset[G_ENTRIES]);
    if (entries == NULL || !PyDict_Check(entries))
        goto python;
    key = live ? PyTuple_Pack(2, PyTuple_GET_ITEM(walked, 1), PyTuple_GET_ITEM(walked, 3))
               : Py_NewRef(PyTuple_GET_ITEM(walked, 1));
    if (key == NULL)
        goto out;
    entry = Py_XNewRef(PyDict_GetItemWithError(entries, key));
    if (entry == NULL) {
        if (PyErr_Occurred())
            goto out;
        goto python; /* a miss: counted and recorded by the Python code */
    }
    PyObject *recs = Py_TYPE(entry) == variants_type ? slot_of(entry, variants_recs_offset) : NULL;
    PyObject *buffers = slot_of(ctx, context_offset[C_BUFFERS]);
    if (recs == NULL || buffers == NULL)
        goto python;
    rec = pick_usual(recs, ext, buffers);
    if (rec == NULL)
        goto out;
    if (rec == Py_None)
        goto python;
    PyObject *deferred = slot_of(rec, rec_offset[R_DEFERRED]);
    int due = deferred == NULL ? 1 : PyObject_IsTrue(deferred);
    if (due < 0)
        goto out;
    if (due) /* fused kernels it runs without: whether they are due is the Python code's question */
        goto python;
    submitted = submit_usual(ctx, rec, ext);
    if (submitted == Py_None)
        goto python;
    if (submitted == NULL) { /* the device refused it: the cache saw a hit all the same */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        if (count_hit(graphs, entries, key, entry) < 0)
            PyErr_Clear();
        PyErr_Restore(type, exc, tb);
        goto out;
    }
    if (count_hit(graphs, entries, key, entry) < 0)
        goto out;
    PyObject *fresh = slot_of(rec, rec_offset[R_FRESH]), *n_ext = slot_of(rec, rec_offset[R_N_EXT]);
    Py_ssize_t start = PyLong_AsSsize_t(n_ext);
    if (start == -1 && PyErr_Occurred())
        goto out;
    PyObject *attached = attach_fresh(ctx, fresh, start, order, PyTuple_GET_ITEM(submitted, 0),
                                      PyTuple_GET_ITEM(submitted, 1));
    if (attached == NULL)
        goto out;
    Py_DECREF(attached);
    result = Py_NewRef(Py_True);
    goto out;
python:
    if (!PyErr_Occurred())
        result = Py_NewRef(walked);
out:
    Py_XDECREF(submitted);
    Py_XDECREF(rec);
    Py_XDECREF(entry);
    Py_XDECREF(key);
    Py_XDECREF(ext);
    Py_XDECREF(graphs);
    Py_DECREF(ctx);
    Py_DECREF(walked);
    return result;
}

static int evaluate_ready(void) {
    if (variants_type == NULL || recording_type == NULL || storage_type == NULL || evaluate_walked == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup_evaluate was not called");
        return 0;
    }
    return 1;
}

static PyObject *evaluate(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "evaluate takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!evaluate_ready())
        return NULL;
    int live = PyObject_IsTrue(args[2]);
    if (live < 0)
        return NULL;
    return evaluate_targets(args[0], args[1], live);
}

/* The pending roots of `arrays` when each is an Array whose root is pending (not a traced
   placeholder) and all are of one context (*ctx, borrowed); else None. New reference. */
static PyObject *pending_roots(PyObject *arrays, PyObject **ctx) {
    Py_ssize_t n = PyTuple_GET_SIZE(arrays);
    PyObject *targets = PyList_New(n);
    if (targets == NULL)
        return NULL;
    *ctx = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(arrays, i);
        if (Py_TYPE(a) != array_type)
            goto other;
        PyObject *root = SLOT(a, S_BASE);
        if (root == NULL)
            goto other;
        if (root == Py_None)
            root = a;
        if (Py_TYPE(root) != array_type || SLOT(root, S_STORAGE) != Py_None || SLOT(root, S_OP) == NULL)
            goto other;
        int traced = PyObject_RichCompareBool(SLOT(root, S_OP), placeholder, Py_EQ);
        PyObject *of = *(PyObject **)((char *)root + ctx_offset);
        if (traced != 0 || of == NULL || (*ctx != NULL && of != *ctx)) {
            PyErr_Clear();
            goto other;
        }
        *ctx = of;
        PyList_SET_ITEM(targets, i, Py_NewRef(root));
    }
    if (n > 0)
        return targets;
other:
    Py_DECREF(targets);
    Py_RETURN_NONE;
}

/* eval_arrays(arrays) -> True: rt.eval of a tuple of Arrays whose roots are pending, of one
   context, with tracing off: lowering.evaluate's grouping and _evaluate_locked's lock, the eval
   made by `evaluate`, the Python code going on from its walk where it must. False: anything else
   (containers, computed arrays, several contexts), for lowering.evaluate. */
static PyObject *eval_arrays(PyObject *self, PyObject *arrays) {
    if (!evaluate_ready())
        return NULL;
    if (!PyTuple_CheckExact(arrays))
        Py_RETURN_FALSE;
    PyObject *enabled = PyDict_GetItemWithError(tracing_globals, enabled_name);
    if (enabled != Py_False) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_FALSE;
    }
    PyObject *ctx, *targets = pending_roots(arrays, &ctx);
    if (targets == NULL)
        return NULL;
    if (targets == Py_None) {
        Py_DECREF(targets);
        Py_RETURN_FALSE;
    }
    Py_INCREF(ctx);
    PyObject *result = NULL, *lock = NULL, *walked = NULL;
    PyObject *is_gpu = slot_of(ctx, context_offset[C_IS_GPU]), *fusion = PyDict_GetItemWithError(lowering_globals, fusion_name);
    if (Py_TYPE(ctx) != context_type || is_gpu == NULL || fusion == NULL) {
        if (!PyErr_Occurred())
            result = Py_NewRef(Py_False);
        goto out;
    }
    int live = is_gpu == Py_False ? 1 : PyObject_IsTrue(fusion);
    if (live < 0)
        goto out;
    lock = Py_NewRef(slot_of(ctx, context_offset[C_LOCK]));
    PyObject *r = PyObject_CallMethodNoArgs(lock, acquire_name);
    if (r == NULL)
        goto out;
    Py_DECREF(r);
    walked = evaluate_targets(ctx, targets, live);
    if (walked != NULL && walked != Py_True) { /* the Python code goes on from the walk (False: walks itself) */
        PyObject *call[4] = {ctx, targets, live ? Py_True : Py_False, walked};
        PyObject *done = PyObject_Vectorcall(evaluate_walked, call, 4, NULL);
        Py_XDECREF(done);
        Py_SETREF(walked, done ? Py_NewRef(Py_True) : NULL);
    }
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb); /* pending when the eval failed (walked is NULL) */
    PyObject *released = PyObject_CallMethodNoArgs(lock, release_lock_name);
    if (released == NULL) { /* the release's error travels on */
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    } else {
        Py_DECREF(released);
        if (type != NULL)
            PyErr_Restore(type, exc, tb);
        else
            result = Py_NewRef(Py_True);
    }
out:
    Py_XDECREF(walked);
    Py_XDECREF(lock);
    Py_DECREF(targets);
    Py_DECREF(ctx);
    return result;
}

/* ---- A storage's buffer back to its context's cache (Storage.__del__) ------------------------ */

/* Storage.__del__ in C: the buffer goes back to the cache with the context's latest submission as
   its fence (give_back). Anything unusual (fields of other types) calls the Python method; errors
   are dropped as that method drops them (interpreter shutdown, a closed device). */
static PyObject *python_storage_del = NULL;

static PyObject *storage_del(PyObject *st, PyObject *unused) {
    PyObject *ctx = slot_of(st, storage_offset[T_CTX]);
    if (ctx == NULL || ctx == Py_None)
        Py_RETURN_NONE;
    PyObject *cache = slot_of(ctx, context_offset[C_BUFFERS]), *submitted = slot_of(ctx, context_offset[C_SUBMITTED]);
    PyObject *buffer = slot_of(st, storage_offset[T_BUFFER]), *bucket = slot_of(st, storage_offset[T_BUCKET]);
    if (Py_TYPE(ctx) != context_type || cache == NULL || Py_TYPE(cache) != cache_type || submitted == NULL ||
        buffer == NULL || bucket == NULL || !PyLong_CheckExact(bucket)) {
        PyObject *r = PyObject_CallOneArg(python_storage_del, st);
        Py_XDECREF(r);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *free_map = slot_of(cache, cache_offset[B_FREE]);
    if (free_map == NULL || !PyDict_CheckExact(free_map)) {
        PyObject *r = PyObject_CallMethodObjArgs(cache, release_name, buffer, bucket, submitted, NULL);
        Py_XDECREF(r);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *held[] = {ctx, cache, free_map, buffer, bucket, submitted};
    for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
        Py_INCREF(held[i]);
    if (give_back(cache, free_map, buffer, bucket, submitted) < 0)
        PyErr_Clear();
    for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
        Py_DECREF(held[i]);
    Py_RETURN_NONE;
}

static PyMethodDef storage_del_def = {"__del__", storage_del, METH_NOARGS,
                                      "Give the storage's buffer back to its context's buffer cache."};

/* storage_del_method(python_del) -> a method descriptor of Storage: its __del__ in C. */
static PyObject *storage_del_method(PyObject *self, PyObject *python_del) {
    if (storage_type == NULL || cache_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup_storage and setup_submit come first");
        return NULL;
    }
    Py_XSETREF(python_storage_del, Py_NewRef(python_del));
    return PyDescr_NewMethod(storage_type, &storage_del_def);
}

/* ---- Waiting for the context's timeline (DeviceContext.wait) ------------------------------- */

/* DeviceContext.wait in C: the semaphore's wait (a C wait itself on GPUs) and the bookkeeping
   after it, with no Python frame. A value not an int, or a context of another type, calls the
   Python method; so does nothing else: a failed wait recovers as the Python method does. */
static PyObject *python_context_wait = NULL, *aborted_error = NULL;
static PyObject *flush_name = NULL, *wait_name = NULL, *recover_name = NULL, *clear_name = NULL;

/* An int slot set to `value` when below it. */
static int raise_slot(PyObject *o, Py_ssize_t offset, PyObject *value) {
    PyObject *now = slot_of(o, offset);
    int below = now == NULL ? 1 : PyObject_RichCompareBool(now, value, Py_LT);
    if (below > 0)
        set_slot(o, offset, value);
    return below < 0 ? -1 : 0;
}

static PyObject *context_wait(PyObject *ctx, PyObject *value) {
    if (Py_TYPE(ctx) != context_type || !PyLong_CheckExact(value))
        return PyObject_CallFunctionObjArgs(python_context_wait, ctx, value, NULL);
    PyObject *completed = slot_of(ctx, context_offset[C_COMPLETED]), *flushed = slot_of(ctx, context_offset[C_FLUSHED]);
    if (completed == NULL || flushed == NULL)
        return PyObject_CallFunctionObjArgs(python_context_wait, ctx, value, NULL);
    int ahead = PyObject_RichCompareBool(value, completed, Py_GT);
    if (ahead <= 0)
        return ahead < 0 ? NULL : Py_NewRef(Py_None);
    int unflushed = PyObject_RichCompareBool(value, flushed, Py_GT);
    if (unflushed < 0)
        return NULL;
    if (unflushed) {
        PyObject *r = PyObject_CallMethodNoArgs(ctx, flush_name);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    PyObject *sem = Py_NewRef(slot_of(ctx, context_offset[C_SEMAPHORE]));
    PyObject *r = PyObject_CallMethodOneArg(sem, wait_name, value);
    Py_DECREF(sem);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(aborted_error))
            return NULL;
        PyObject *type, *exc, *tb; /* the timeline failed: recover, and the error travels on */
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
        PyObject *recovered = PyObject_CallMethodOneArg(ctx, recover_name, exc);
        if (recovered == NULL) {
            Py_XDECREF(type);
            Py_XDECREF(exc);
            Py_XDECREF(tb);
            return NULL;
        }
        Py_DECREF(recovered);
        PyErr_Restore(type, exc, tb);
        return NULL;
    }
    Py_DECREF(r);
    completed = slot_of(ctx, context_offset[C_COMPLETED]);
    ahead = completed ? PyObject_RichCompareBool(value, completed, Py_GT) : 1;
    if (ahead < 0)
        return NULL;
    if (ahead) {
        set_slot(ctx, context_offset[C_COMPLETED], value);
        PyObject *buffers = slot_of(ctx, context_offset[C_BUFFERS]), *in_flight = slot_of(ctx, context_offset[C_IN_FLIGHT]);
        if (buffers != NULL && Py_TYPE(buffers) == cache_type && raise_slot(buffers, cache_offset[B_COMPLETED], value) < 0)
            return NULL;
        Py_ssize_t flying = in_flight != NULL ? PyObject_Size(in_flight) : 0; /* a deque */
        if (flying < 0)
            return NULL;
        if (flying > 0) { /* a synced loop: nothing is in flight any more */
            PyObject *latest = PySequence_GetItem(in_flight, flying - 1);
            int passed = latest ? PyObject_RichCompareBool(latest, value, Py_LE) : -1;
            Py_XDECREF(latest);
            if (passed < 0)
                return NULL;
            if (passed) {
                PyObject *cleared = PyObject_CallMethodNoArgs(in_flight, clear_name);
                if (cleared == NULL)
                    return NULL;
                Py_DECREF(cleared);
            }
        }
    }
    Py_RETURN_NONE;
}

static PyMethodDef context_wait_def = {"wait", context_wait, METH_O,
                                       "Wait until the current timeline reaches `value` (AbortedError if its work failed)."};

/* context_wait_method(python_wait, AbortedError) -> a method descriptor of DeviceContext: its wait in C. */
static PyObject *context_wait_method(PyObject *self, PyObject *args) {
    PyObject *python_wait, *aborted;
    if (!PyArg_ParseTuple(args, "OO!:context_wait_method", &python_wait, &PyType_Type, &aborted))
        return NULL;
    if (context_type == NULL || cache_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "runtime._native.setup_submit comes first");
        return NULL;
    }
    if (flush_name == NULL) {
        flush_name = PyUnicode_InternFromString("flush");
        wait_name = PyUnicode_InternFromString("wait");
        recover_name = PyUnicode_InternFromString("recover");
        clear_name = PyUnicode_InternFromString("clear");
        if (flush_name == NULL || wait_name == NULL || recover_name == NULL || clear_name == NULL)
            return NULL;
    }
    Py_XSETREF(python_context_wait, Py_NewRef(python_wait));
    Py_XSETREF(aborted_error, Py_NewRef(aborted));
    return PyDescr_NewMethod(context_type, &context_wait_def);
}

/* ---- DLPack: the destructor of the capsules runtime.interop hands out --------------------- */

static PyObject *dlpack_alive = NULL; /* interop._alive: a tensor's address -> what it points into */

/* An unconsumed capsule still owns its tensor (a consumer renames the capsule "used_dltensor" and
   calls the tensor's deleter itself). A consumer that refused the capsule (numpy, for a device it
   cannot read) releases it with its error still pending: that error is kept aside meanwhile. */
static void dlpack_capsule_destructor(PyObject *capsule) {
    if (!PyCapsule_IsValid(capsule, "dltensor"))
        return;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    void *tensor = PyCapsule_GetPointer(capsule, "dltensor");
    if (tensor != NULL && dlpack_alive != NULL) {
        PyObject *key = PyLong_FromVoidPtr(tensor);
        if (key != NULL) {
            if (PyDict_DelItem(dlpack_alive, key) < 0)
                PyErr_Clear(); /* already gone */
            Py_DECREF(key);
        }
    }
    PyErr_Clear();
    PyErr_Restore(type, value, traceback);
}

static PyObject *setup_dlpack(PyObject *self, PyObject *args) {
    PyObject *alive;
    if (!PyArg_ParseTuple(args, "O!:setup_dlpack", &PyDict_Type, &alive))
        return NULL;
    Py_INCREF(alive);
    Py_XSETREF(dlpack_alive, alive);
    return PyLong_FromVoidPtr((void *)dlpack_capsule_destructor);
}

static PyMethodDef methods[] = {
    {"setup_dlpack", setup_dlpack, METH_VARARGS,
     "setup_dlpack(alive) -> the address of the DLPack capsule destructor (see interop.make_capsule)."},
    {"setup_storage", setup_storage, METH_VARARGS, "setup_storage(Storage): its field offsets, for attach."},
    {"attach", (PyCFunction)(void (*)(void))attach, METH_FASTCALL,
     "attach(ctx, fresh, n_ext, order, table, value): lowering.attach in C."},
    {"setup_ops", setup_ops, METH_VARARGS,
     "setup_ops(promote, signatures, unary_signatures): ops' dtype tables, for binary and unary."},
    {"unary", (PyCFunction)(void (*)(void))unary, METH_FASTCALL,
     "unary(op, x): ops._unary's node for a known signature, or None."},
    {"binary", (PyCFunction)(void (*)(void))binary, METH_FASTCALL,
     "binary(op, a, b): ops._binary's usual case in C, or None (see the module comment)."},
    {"new_node", (PyCFunction)(void (*)(void))new_node, METH_FASTCALL,
     "new_node(op, inputs, params, shape, dtype, ctx, storage=None): array.new_node in C."},
    {"new_view", (PyCFunction)(void (*)(void))new_view, METH_FASTCALL,
     "new_view(op, src, params, shape, strides, offset): array.new_view in C."},
    {"setup", setup, METH_VARARGS, "setup(Array, placeholder_op): the node type's field offsets."},
    {"setup_submit", setup_submit, METH_VARARGS,
     "setup_submit(Recording, DeviceContext, BufferCache, max_in_flight): their field offsets, for submit."},
    {"pick", (PyCFunction)(void (*)(void))pick, METH_FASTCALL,
     "pick(recs, ext, buffers) -> the usual recording Variants.pick returns, or None: ask it."},
    {"submit", (PyCFunction)(void (*)(void))submit, METH_FASTCALL,
     "submit(ctx, rec, ext) -> (table, value), or None where lowering.submit's Python must run."},
    {"setup_evaluate", setup_evaluate, METH_VARARGS,
     "setup_evaluate(Variants, GraphCache, graph_cache_globals, autodiff_handed_out, autodiff_protect, "
     "tracing_globals, lowering_globals, evaluate_walked)."},
    {"eval_arrays", eval_arrays, METH_O,
     "eval_arrays(arrays) -> True (rt.eval of pending arrays of one context, made) or False: lowering.evaluate."},
    {"evaluate", (PyCFunction)(void (*)(void))evaluate, METH_FASTCALL,
     "evaluate(ctx, targets, live) -> True (done), False or the walk's tuple: the Python code goes on."},
    {"context_wait_method", context_wait_method, METH_VARARGS,
     "context_wait_method(python_wait, AbortedError) -> DeviceContext.wait in C."},
    {"storage_del_method", storage_del_method, METH_O,
     "storage_del_method(python_del) -> Storage.__del__ in C (python_del: for unusual fields)."},
    {"walk", walk, METH_VARARGS, "walk(targets, live) -> (order, key, externals, keep) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "runtime._native",
                                    "The runtime's per-op and per-eval Python in C (see runtime/native.py).", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    view_tag = PyUnicode_InternFromString("v");
    zero = PyLong_FromLong(0);
    constants_name = PyUnicode_InternFromString("constants");
    semaphore_name = PyUnicode_InternFromString("semaphore");
    zero_hex = PyUnicode_FromString("0x0.0p+0");
    negative_zero_hex = PyUnicode_FromString("-0x0.0p+0");
    if (zero_hex == NULL || negative_zero_hex == NULL)
        return NULL;
    if (view_tag == NULL || zero == NULL || constants_name == NULL || semaphore_name == NULL)
        return NULL;
    return PyModule_Create(&module);
}
