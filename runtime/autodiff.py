"""Reverse-mode autodiff over the op graph: the backward pass is built from the same lazy ops.

Building the backward graph op by op (gradient rules, shape and dtype inference,
broadcast bookkeeping) costs more Python than the forward pass. The graph it
builds depends only on the structure of the forward graph, so value_and_grad
keeps a template per forward structure (`_Template`): the arrays the backward
pass created, each with its op, attributes and inputs as references to forward
arrays, constants or earlier created arrays. A later call with the same
structure replays the template, creating the same nodes without running the
rules.
"""

from __future__ import annotations

from collections import OrderedDict

import hal

from . import ops
from .array import Array, constant
from .ops import COMPARE

_NO_GRAD = frozenset(COMPARE) | {"argmax", "argmin", "random", "full", "placeholder"}


def _unbroadcast(g: Array, shape: tuple) -> Array:
    """Sum g over the axes along which `shape` was broadcast to g.shape."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    if axes:
        g = ops.sum(g, axis=axes, keepdims=True)
    return ops.reshape(g, shape)


def _keepdims_shape(x_shape: tuple, axes: tuple) -> tuple:
    return tuple(1 if i in axes else d for i, d in enumerate(x_shape))


def _vjp(node: Array, k: int, g: Array) -> Array | None:
    """Cotangent contribution of `node`'s output cotangent g to its input k."""
    op = node.op
    x = node.inputs[k]
    if op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
        a, b = node.inputs
        if op == "add":
            r = g
        elif op == "sub":
            r = g if k == 0 else -g
        elif op == "mul":
            r = g * (b if k == 0 else a)
        elif op == "div":
            r = g / b if k == 0 else -g * node / b
        elif op == "pow":
            if k == 0:
                r = g * b * a ** (b - 1)
            else:
                r = g * node * ops.log(ops.where(a > 0, a, 1))
        elif op == "maximum":
            r = ops.where(a >= b, g, 0) if k == 0 else ops.where(a >= b, 0, g)
        else:
            r = ops.where(a <= b, g, 0) if k == 0 else ops.where(a <= b, 0, g)
        return _unbroadcast(r, x.shape)
    if op == "neg":
        return -g
    if op == "abs":
        return ops.where(x >= 0, g, -g)
    if op == "exp":
        return g * node
    if op == "log":
        return g / x
    if op == "sqrt":
        return g * 0.5 / node
    if op == "tanh":
        return g * (1 - node * node)
    if op == "sigmoid":
        return g * node * (1 - node)
    if op == "cast":
        return ops.astype(g, x.dtype) if x.dtype.is_float else None
    if op in ("copy", "alias"):
        return g
    if op == "where":
        if k == 0:
            return None
        c = node.inputs[0]
        r = ops.where(c, g, 0) if k == 1 else ops.where(c, 0, g)
        return _unbroadcast(r, x.shape)
    if op in ("sum", "mean", "max", "min"):
        axes, keepdims = node.params
        kshape = _keepdims_shape(x.shape, axes)
        gk = ops.reshape(g, kshape)
        if op == "sum":
            return ops.broadcast_to(gk, x.shape)
        if op == "mean":
            count = 1
            for a in axes:
                count *= x.shape[a]
            return ops.broadcast_to(gk / max(count, 1), x.shape)
        mask = ops.equal(x, ops.reshape(node, kshape))
        maskf = ops.astype(mask, g.dtype)
        count = ops.sum(maskf, axis=axes, keepdims=True)
        return gk * maskf / count
    if op == "matmul":
        a, b = node.inputs
        if k == 0:
            return _unbroadcast(ops.matmul(g, ops.swapaxes(b, -1, -2)), a.shape)
        return _unbroadcast(ops.matmul(ops.swapaxes(a, -1, -2), g), b.shape)
    if op == "reshape":
        return ops.reshape(g, x.shape)
    if op == "transpose":
        perm = node.params
        inv = [0] * len(perm)
        for i, p in enumerate(perm):
            inv[p] = i
        return ops.transpose(g, tuple(inv))
    if op == "broadcast_to":
        return _unbroadcast(g, x.shape)
    if op == "slice":
        info, _ = node.params
        kept = tuple(count for (_, _, count, keep) in info if keep)
        return ops.pad_slice(ops.reshape(g, kept), x.shape, info)
    if op == "pad":
        in_shape, info = node.params
        index = []
        for start, step, count, keep in info:
            if not keep:
                index.append(start)
            else:
                stop = start + step * count
                index.append(slice(start, stop if stop >= 0 else None, step))
        return g[tuple(index)]
    raise hal.UnimplementedError(f"no gradient rule for op {op!r}")


def _backward(out: Array, wrt: list) -> list:
    targets = {id(w) for w in wrt}
    # Post-order DFS marking the nodes that lead to a differentiated input.
    order = []
    relevant: dict = {}
    get = relevant.get
    stack = [(out, False)]
    push, pop = stack.append, stack.pop
    while stack:
        node, expanded = pop()
        nid = id(node)
        if nid in relevant:
            continue
        if expanded:
            if nid in targets:
                hit = True
            elif node.op is None or node.op in _NO_GRAD:
                hit = False
            else:
                hit = False
                for inp in node.inputs:
                    if get(id(inp)):
                        hit = True
                        break
            relevant[nid] = hit
            order.append(node)
            continue
        push((node, True))
        if nid in targets or node.op is None:
            continue
        for inp in node.inputs:
            if id(inp) not in relevant:
                push((inp, False))
    cot: dict = {id(out): constant(1.0, out.dtype, out.ctx) if out.dtype.is_float
                 else constant(1.0, ops._dt.float32, out.ctx)}
    for node in reversed(order):
        nid = id(node)
        g = cot.get(nid)
        if g is None or nid in targets or not relevant.get(nid):
            continue
        for k, inp in enumerate(node.inputs):
            if not relevant.get(id(inp)):
                continue
            if not inp.dtype.is_float:
                continue
            contrib = _vjp(node, k, g)
            if contrib is None:
                continue
            if contrib.dtype is not inp.dtype:
                contrib = ops.astype(contrib, inp.dtype)
            prev = cot.get(id(inp))
            cot[id(inp)] = contrib if prev is None else prev + contrib
    result = []
    for w in wrt:
        g = cot.get(id(w))
        if g is None:
            g = ops.zeros(w.shape, w.dtype, w.ctx)
        elif g.shape != w.shape:
            g = ops.broadcast_to(g, w.shape)
        result.append(g)
    return result


def _forward_key(out: Array, wrt: list) -> tuple[tuple, list]:
    """(key, arrays): the structure of the graph the backward pass reads, and its arrays in key order.

    Arrays are visited through their inputs as _backward does (differentiated inputs and
    evaluated arrays are leaves); every view's base is indexed too, since created views
    point at it.
    """
    targets = {id(w): i for i, w in enumerate(wrt)}
    index: dict = {}
    arrays: list = []
    parts: list = []
    stack = [(out, False)]
    push, pop = stack.append, stack.pop
    while stack:
        a, expanded = pop()
        aid = id(a)
        if aid in index:
            continue
        t = targets.get(aid)
        leaf = t is not None or a.op is None
        if not expanded and not leaf:
            push((a, True))
            for inp in reversed(a.inputs):
                if id(inp) not in index:
                    push((inp, False))
            continue
        index[aid] = len(arrays)
        arrays.append(a)
        if leaf:
            parts.append((t, a.shape, a.dtype, a.strides, a.offset, a.base is None))
        else:
            parts.append((a.op, a.params, a.shape, a.dtype, a.strides, a.offset,
                          tuple(index[id(inp)] for inp in a.inputs)))
    for a in list(arrays):  # bases not reached through inputs (those of the differentiated inputs)
        base = a.base
        if base is not None and id(base) not in index:
            index[id(base)] = len(arrays)
            arrays.append(base)
            parts.append(("base", base.shape, base.dtype))
    bases = tuple(-1 if a.base is None else index[id(a.base)] for a in arrays)
    return (tuple(parts), bases, len(wrt), id(out.ctx)), arrays


class _Template:
    """The arrays a backward pass created, as attributes and references into a pool.

    The pool is the forward arrays (in key order), then the constants the rules used,
    then the created arrays in creation order; `grads` are pool references.
    """

    __slots__ = ("constants", "entries", "grads")

    def __init__(self, constants: list, entries: list, grads: list) -> None:
        self.constants = constants
        self.entries = entries  # (op, input refs, params, shape, dtype, base ref or -1, strides, offset)
        self.grads = grads

    @staticmethod
    def extract(arrays: list, grads: list, ctx) -> _Template | None:
        """The template of `grads` over the forward `arrays`; None if it refers to anything else."""
        pool_index = {id(a): i for i, a in enumerate(arrays)}
        known_constants = {id(c): c for c in ctx.constants.values()}
        constants: list = []
        created: list = []  # (array, entry without resolved refs)
        order: list = []
        state: dict = {}
        stack = [(g, False) for g in reversed(grads)]
        while stack:
            a, expanded = stack.pop()
            aid = id(a)
            if aid in pool_index or state.get(aid) == "done":
                continue
            if a.storage is not None or a.op is None:
                if aid not in known_constants:
                    return None  # an evaluated array that is neither forward data nor a constant
                pool_index[aid] = -1 - len(constants)  # constants: numbered after the forward arrays
                constants.append(a)
                continue
            if expanded:
                state[aid] = "done"
                order.append(a)
                continue
            stack.append((a, True))
            for dep in ([a.base] if a.base is not None else []) + list(a.inputs):
                if id(dep) not in pool_index and state.get(id(dep)) != "done":
                    stack.append((dep, False))
        n_fwd = len(arrays)

        def ref(x) -> int:
            i = pool_index[id(x)]
            return n_fwd - 1 - i if i < 0 else i

        for a in order:
            entry = (a.op, tuple(ref(x) for x in a.inputs), a.params, a.shape, a.dtype,
                     -1 if a.base is None else ref(a.base), a.strides, a.offset)
            pool_index[id(a)] = n_fwd + len(constants) + len(created)
            created.append(entry)
        return _Template(constants, created, [ref(g) for g in grads])

    def replay(self, arrays: list, ctx) -> list:
        pool = arrays + self.constants
        append = pool.append
        new = Array.__new__
        for op, ins, params, shape, dtype, base, strides, offset in self.entries:
            a = new(Array)
            a.op = op
            a.inputs = tuple([pool[i] for i in ins])
            a.params = params
            a.shape = shape
            a.dtype = dtype
            a.ctx = ctx
            a.base = None if base < 0 else pool[base]
            a.strides = strides
            a.offset = offset
            a.storage = None
            append(a)
        return [pool[i] for i in self.grads]


_TEMPLATES_PER_FUNCTION = 32
_UNCACHEABLE = object()


def _backward_cached(out: Array, wrt: list, templates: OrderedDict) -> list:
    key, arrays = _forward_key(out, wrt)
    template = templates.get(key)
    if template is not None and template is not _UNCACHEABLE:
        templates.move_to_end(key)
        return template.replay(arrays, out.ctx)
    grads = _backward(out, wrt)
    if template is None:
        templates[key] = _Template.extract(arrays, grads, out.ctx) or _UNCACHEABLE
        if len(templates) > _TEMPLATES_PER_FUNCTION:
            templates.popitem(last=False)
    return grads


def value_and_grad(fn, argnums=0):
    """fn(*args) -> (fn's scalar value, gradient(s) with respect to args[argnums])."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)
    templates: OrderedDict = OrderedDict()  # forward structure -> _Template of its backward pass

    def wrapped(*args, **kwargs):
        args = list(args)
        wrt = []
        for i in nums:
            a = args[i]
            if type(a) is not Array:
                a = ops.asarray(a)
            m = ops.alias(a)
            args[i] = m
            wrt.append(m)
        out = fn(*args, **kwargs)
        if type(out) is not Array:
            raise hal.InvalidArgumentError("the differentiated function must return an Array")
        if out.shape != () and out.size != 1:
            raise hal.InvalidArgumentError(
                f"grad needs a function with a scalar output, got shape {out.shape}")
        grads = _backward_cached(out, wrt, templates)
        return out, (grads[0] if single else tuple(grads))

    wrapped.__name__ = f"value_and_grad({getattr(fn, '__name__', 'fn')})"
    return wrapped


def grad(fn, argnums=0):
    """The gradient of a scalar-valued fn with respect to args[argnums] (lazy arrays)."""
    vg = value_and_grad(fn, argnums)

    def wrapped(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    wrapped.__name__ = f"grad({getattr(fn, '__name__', 'fn')})"
    return wrapped
