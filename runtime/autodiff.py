"""Reverse-mode autodiff over the op graph: the backward pass is built from the same lazy ops.

value_and_grad returns each gradient as one lazy "grad" node (inputs: the value
and the differentiated inputs) instead of building the backward graph at once.
The backward graph depends only on the forward graph, which the eval's graph
key already describes, so it is built by the gradient rules only when an eval
records a new graph (`expand`, called by the lowering); an eval that hits the
graph cache replays the recorded backward kernels without creating a single
backward node in Python. Whatever needs the gradient as ordinary nodes (a
second derivative) turns the grad node into a view of its expansion first
(`materialize`).

Complex inputs follow JAX's convention: the gradient of a real-valued function f
of z = x + iy is df/dx - i df/dy (twice the Wirtinger derivative df/dz; descend
along its conjugate). The cotangents of complex values are kept in that form, so
the rules of holomorphic functions are their real rules without conjugation
(g * f'(z)), conj conjugates the cotangent, real and imag turn a real
cotangent g into g and -ig, |z| into g * conj(z) / |z|, and a real operand of a
complex op takes the real part of its contribution.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec

import numpy as np

import hal

from . import array_api as _api
from . import dtypes as _dt
from . import fft as _fft
from . import linalg, ops
from .errors import InvalidTypeError, InvalidValueError
from .graph import DIFFERENTIATING, Node, constant, new_node
from .ops import COMPARE
from .shapes import index_of, sequence_of
from .trees import flatten, unflatten

if TYPE_CHECKING:
    from .array import Array

GRAD = "grad"
P = ParamSpec("P")
# Grad nodes handed out and maybe still pending: an eval that would clear part of their forward
# graph (evaluating the loss alone, say) builds their backward graphs first (`protect`).
# (id -> weak reference: arrays compare elementwise, so they cannot sit in a WeakSet.) Shared by
# every thread (a grad may be evaluated on another), changed under _handed_lock.
_handed_out: dict = {}
_handed_lock = threading.Lock()
_NO_GRAD = (frozenset(COMPARE) | frozenset(ops.UNARY_PREDICATE) | frozenset(ops.BITWISE) | frozenset(ops.LOGICAL)
            | {"argmax", "argmin", "argsort", "searchsorted", "mask_count", "compact", "scatter_last", "random", "full",
               "placeholder", "floor", "ceil", "trunc", "round", "sign", "floor_divide", "bitwise_invert"})
_LN2, _LN10 = 0.6931471805599453, 2.302585092994046
#: Dtypes whose constants are folded on the host: numpy computes them as the kernels do (no
#: wider compute type to round from).
_FOLDED = (_dt.float32, _dt.float64)


# -- simplification while the backward graph is built ----------------------------------------------
# Cotangents start as the constant 1 and stay constant through means, negations and sums until they
# meet a forward value; the rules below compute such constants on the host instead of as kernels,
# cancel double negations and share the comparison masks that several rules build from one operand
# (maximum's and abs's `x >= 0`). Every backward node is internal to the gradient, so returning an
# existing array for a new one changes no array a caller holds.

class _Noting(threading.local):
    """While a recording expands grad nodes (`expand_noting`), on its thread: the constants whose
    values shaped the backward graph. The graph key describes constants by dtype and shape only, so
    the recording keeps these as guards: a later eval of the same key with other constants there
    must not replay it. (Per thread: recordings of other devices run at the same time.)"""

    noted: list | None = None


_noting = _Noting()


def _host_value(a: Array) -> np.ndarray | None:
    """The value of the constant scalar `a` is, or views (all its elements), on the host; else None."""
    r = a.base
    if r is None:
        r = a
    value = r.params  # constant() keeps its value there; other evaluated arrays hold None
    if r.op is None and type(value) is np.ndarray and a.dtype in _FOLDED:
        noted = _noting.noted
        if noted is not None:
            noted.append(r)
        return value
    return None


def _is_value(a: Array, v: float) -> bool:
    value = _host_value(a)
    return value is not None and value == v


def _pending(a: Array, op: str) -> bool:
    return a.op == op and a.base is None and a.storage is None


def _softplus_input(node: Array) -> Array | None:
    """x when `node` is the stable softplus written out, ``maximum(x, 0) + log(1 + exp(-abs(x)))``
    (either order of the sums and of maximum's operands, or with log1p), all of one shape and float
    dtype; else None. Its gradient is then ``g * exp(x - node)`` (the sigmoid of x) in three kernels,
    where the rules node by node give the two masked selections of maximum and abs and five more."""
    if node.op != "add" or node.base is not None or node.dtype not in _FOLDED:
        return None
    for m, lg in (node.inputs, node.inputs[::-1]):
        if not (_pending(m, "maximum") and (_pending(lg, "log") or _pending(lg, "log1p"))):
            continue
        a, b = m.inputs
        x = a if _is_value(b, 0.0) else b if _is_value(a, 0.0) else None
        if x is None or x.shape != node.shape or x.dtype is not node.dtype:
            continue
        e = lg.inputs[0]
        if lg.op == "log":  # log(1 + e) or log(e + 1)
            if not _pending(e, "add"):
                continue
            one, e = e.inputs if _pending(e.inputs[1], "exp") else e.inputs[::-1]
            if not _is_value(one, 1.0):
                continue
        if not (_pending(e, "exp") and e.shape == node.shape):
            continue
        n = e.inputs[0]
        if _pending(n, "neg") and _pending(n.inputs[0], "abs") and n.inputs[0].inputs[0] is x:
            return x
    return None


def _scaled(a: Array):
    """(c, its value, t) when `a` is the pending product of a constant scalar c the host knows and t
    (either order); else None."""
    if a.op != "mul" or a.base is not None or a.storage is not None:
        return None
    x, t = a.inputs
    value = _host_value(x)
    if value is None:
        t, x = x, t
        value = _host_value(x)
    return None if value is None or value.shape != () else (x, value, t)


def _summed(a: Array, b: Array) -> Array:
    """The sum of two cotangent contributions: ``c * (t + u)`` when they are ``c * t`` and ``c * u``,
    and ``c * (t - u)`` when ``c * t`` and ``(-c) * u`` (one product instead of two: a mean's
    gradient meets every term of the loss as the same constant, its negation through subtractions);
    else ``a + b``. The factored form rounds as the hand-written gradient does ((p - y) / n)."""
    sa = _scaled(a)
    if sa is not None:
        sb = _scaled(b)
        if sb is not None:
            c, v, t = sa
            _, w, u = sb
            dt = a.dtype
            if (t.shape == u.shape == a.shape == b.shape and t.dtype is dt and u.dtype is dt
                    and b.dtype is dt and c.dtype is dt):
                if v == w:
                    return c * (t + u)
                if v == -w:
                    return c * (t - u)
    return a + b


def _constant_like(value: np.ndarray, like: Array, shape: tuple) -> Array:
    c = constant(value.item(), like.dtype, like.ctx)
    return ops.broadcast_to(c, shape) if shape else c


def _negated(g: Array) -> Array:
    value = _host_value(g)
    if value is not None:
        return _constant_like(np.negative(value), g, g.shape)
    if g.op == "neg" and g.base is None and g.storage is None:
        return g.inputs[0]  # -(-t) is t, bit for bit (also for NaN and the integers' minimum)
    return -g


def _operand_key(x: Array) -> object:
    value = _host_value(x)
    return id(x) if value is None else (x.dtype, value.item())


def _shared(memo: dict, node: Array) -> Array:
    """`node`, or the equal node (op, params, shape, operands) built before in this backward pass."""
    key = (node.op, node.params, node.shape, tuple(map(_operand_key, node.inputs)))
    return memo.setdefault(key, node)


def _elementwise_vjp(op: str, node: Array, k: int, g: Array) -> Array | None:
    """The gradient rules of the elementwise functions beyond the basic arithmetic (None: not one)."""
    x = node.inputs[0]
    unary = {
        "sin": lambda: g * ops.cos(x), "cos": lambda: -g * ops.sin(x), "tan": lambda: g * (1 + node * node),
        "asin": lambda: g / ops.sqrt(1 - x * x), "acos": lambda: -g / ops.sqrt(1 - x * x),
        "atan": lambda: g / (1 + x * x), "sinh": lambda: g * ops.cosh(x), "cosh": lambda: g * ops.sinh(x),
        "asinh": lambda: g / ops.sqrt(x * x + 1), "acosh": lambda: g / ops.sqrt(x * x - 1),
        "atanh": lambda: g / (1 - x * x), "expm1": lambda: g * (node + 1), "log1p": lambda: g / (1 + x),
        "log2": lambda: g / (x * _LN2), "log10": lambda: g / (x * _LN10), "square": lambda: 2 * g * x,
        "reciprocal": lambda: -g * node * node,
    }
    if op in unary:
        return unary[op]()
    if op not in ("remainder", "atan2", "hypot", "copysign", "logaddexp"):
        return None
    a, b = node.inputs
    if op == "remainder":
        r = g if k == 0 else -g * ops.floor_divide(a, b)
    elif op == "atan2":
        d = a * a + b * b
        r = g * b / d if k == 0 else -g * a / d
    elif op == "hypot":
        r = g * (a if k == 0 else b) / node
    elif op == "copysign":
        r = ops.where(ops.signbit(a) == ops.signbit(node), g, -g) if k == 0 else ops.zeros_like(g)
    else:
        r = g * ops.exp((a if k == 0 else b) - node)
    return _unbroadcast(r, node.inputs[k].shape)


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


def _product_of_others(x: Array, axes: tuple) -> Array:
    """Per element of x, the product of the others over `axes` (prod's derivative): the running
    products from either end, exclusive, multiplied. No division by the element, so a zero factor
    gets the product of the rest, where prod / x gave 0 / 0 (NaN)."""
    kept = [a for a in range(x.ndim) if a not in axes]
    moved = ops.transpose(x, tuple(kept) + tuple(axes))
    rows = ops.reshape(moved, tuple(x.shape[a] for a in kept) + (-1,))
    before = _api.cumulative_prod(rows, axis=-1, include_initial=True)[..., :-1]
    after = _api.cumulative_prod(rows[..., ::-1], axis=-1, include_initial=True)[..., -2::-1]
    others = ops.reshape(before * after, moved.shape)
    inverse = [0] * x.ndim
    for i, a in enumerate(tuple(kept) + tuple(axes)):
        inverse[a] = i
    return ops.transpose(others, tuple(inverse))


def _vjp(node: Array, k: int, g: Array, memo: dict) -> Array | None:
    """Cotangent contribution of `node`'s output cotangent g to its input k (`memo`: nodes shared
    within one backward pass)."""
    op = node.op
    x = node.inputs[k]
    if op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
        a, b = node.inputs
        if op == "add":
            r = g
        elif op == "sub":
            r = g if k == 0 else _negated(g)
        elif op == "mul":
            r = g * (b if k == 0 else a)
        elif op == "div":
            r = g / b if k == 0 else -g * node / b
        elif op == "pow":
            if k == 0:
                r = g * b * a ** (b - 1)
            elif node.params.is_complex:
                r = g * node * ops.log(a)
            else:
                r = g * node * ops.log(ops.where(a > 0, a, 1))
        elif op == "maximum":
            mask = _shared(memo, a >= b)
            r = ops.where(mask, g, 0) if k == 0 else ops.where(mask, 0, g)
        else:
            mask = _shared(memo, a <= b)
            r = ops.where(mask, g, 0) if k == 0 else ops.where(mask, 0, g)
        return _unbroadcast(r, x.shape)
    if op == "neg":
        return _negated(g)
    if op == "abs":
        if x.dtype.is_complex:  # g conj(z) / |z|, and 0 at z = 0
            return ops.where(node == 0, 0, g * ops.conj(x) / ops.where(node == 0, 1, node))
        return ops.where(_shared(memo, x >= 0), g, _negated(g))
    if op == "conj":
        return ops.conj(g)
    if op == "real":
        return ops.astype(g, x.dtype)
    if op == "imag":
        return ops.astype(g, x.dtype) * -1j
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
    if op == "gelu":  # one node, which a GEMM's dgelu epilogue can compute (lowering/epilogues.py)
        return ops.binary("gelu_grad", g, x)
    if op == "cast":
        if not (x.dtype.is_float or x.dtype.is_complex):
            return None
        if g.dtype.is_complex and not x.dtype.is_complex:  # a real value made complex: the real part
            g = ops.real(g)
        return ops.astype(g, x.dtype)
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
            value = _host_value(gk)
            if value is not None:
                return _constant_like(np.divide(value, value.dtype.type(max(count, 1))), gk, x.shape)
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
    if op == "prod":
        axes, keepdims = node.params
        kshape = _keepdims_shape(x.shape, axes)
        return ops.broadcast_to(ops.reshape(g, kshape), x.shape) * _product_of_others(x, axes)
    if op == "concat":  # the input's window of the cotangent
        (axis,) = node.params
        start = sum(inp.shape[axis] for inp in node.inputs[:k])
        window = [slice(None)] * len(node.shape)
        window[axis] = slice(start, start + node.inputs[k].shape[axis])
        return g[tuple(window)]
    if op == "collective" and node.params[:2] in (("all_reduce", "sum"), ("all_reduce", "avg")):
        if k:  # an array it only waits for (runtime/distributed.py's buckets): not read
            return None
        # every rank's output reads every rank's input: the cotangents summed (averaged) the same way
        return new_node("collective", (ops.contiguous(g),), node.params, g.shape, g.dtype, g.ctx)
    if op == "take":  # each value read goes back where it was read from (indices may repeat)
        return None if k else _api.take_gradient(node, g)
    if op == "take_set":
        return _api.take_set_gradients(node, k, g)
    if op == "take_add":  # the transpose of a take is the take of the same indices
        if k:
            return None
        mode, count, inner, n, strides, _ = node.params
        values = node.inputs[0]
        return new_node("take", (ops.dense(g), node.inputs[1]), (mode, count, inner, n, strides, False), values.shape,
                        g.dtype, g.ctx)
    if op == "tri":  # the kept triangle passes its gradient through, the zeroed one none
        return new_node("tri", (ops.dense(g),), node.params, g.shape, g.dtype, g.ctx)
    if op == "cumprod":
        return _api.cumprod_gradient(node, g)
    if op == "cumsum":  # (along the last axis) each element feeds every later one: the running sum from the end
        return _api.cumulative_sum(g[..., ::-1], axis=-1)[..., ::-1]
    if op == "gather":  # each value read goes back where it was read from (indices may repeat)
        if k:
            return None  # (the indices and a checked gather's status word)
        src = node.inputs[0]
        return ops.reshape(ops.scatter_add(g, node.inputs[1], src.size), src.shape)
    if op == "scatter_add":  # the transpose of a scatter is the gather of the same indices
        if k:
            return None
        return new_node("gather", (ops.contiguous(g), node.inputs[1]), None, node.inputs[1].shape, g.dtype, g.ctx)
    if op == "fft":  # the transposed transform (runtime/fft.py)
        return _fft.vjp(node, g)
    if op == "linalg_result":
        return linalg.vjp(node, k, g)
    r = _elementwise_vjp(op, node, k, g)
    if r is not None:
        return r
    raise hal.UnimplementedError(f"no gradient rule for op {op!r}")


def _backward(out: Array, wrt: list) -> list:
    targets = {id(w) for w in wrt}
    # A pending grad node met on the way (a second derivative) stands for its backward graph:
    # differentiated as that graph's result, without changing the node itself.
    through: dict = {}

    def inputs_of(node) -> tuple:
        if node.op != GRAD or node.storage is not None:
            return node.inputs
        result = through.get(id(node))
        if result is None:
            result = through[id(node)] = expand([node])[id(node)]
        return (result,)

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
                for inp in inputs_of(node):
                    if get(id(inp)):
                        hit = True
                        break
            relevant[nid] = hit
            order.append(node)
            continue
        push((node, True))
        if nid in targets or node.op is None:
            continue
        for inp in inputs_of(node):
            if id(inp) not in relevant:
                push((inp, False))
    if out.dtype.is_complex:
        raise InvalidTypeError(f"grad of a function of {out.dtype.name} value: the differentiated function must "
                               "return a real value (take abs, real or imag of a complex result)")
    cot: dict = {id(out): constant(1.0, out.dtype, out.ctx) if out.dtype.is_float
                 else constant(1.0, _dt.float32, out.ctx)}
    memo: dict = {}
    for node in reversed(order):
        nid = id(node)
        g = cot.get(nid)
        if g is None or nid in targets or not relevant.get(nid):
            continue
        x = _softplus_input(node) if node.op == "add" else None
        if x is not None:
            if relevant.get(id(x)):
                contrib = g * ops.exp(x - node)
                prev = cot.get(id(x))
                cot[id(x)] = contrib if prev is None else _summed(prev, contrib)
            continue
        for k, inp in enumerate(inputs_of(node)):
            if not relevant.get(id(inp)):
                continue
            if not (inp.dtype.is_float or inp.dtype.is_complex):
                continue
            contrib = g if node.op == GRAD else _vjp(node, k, g, memo)
            if contrib is None:
                continue
            if contrib.dtype.is_complex and not inp.dtype.is_complex:  # a real operand of a complex op
                contrib = ops.real(contrib)
            if contrib.dtype is not inp.dtype:
                contrib = ops.astype(contrib, inp.dtype)
            prev = cot.get(id(inp))
            cot[id(inp)] = contrib if prev is None else _summed(prev, contrib)
    result = []
    for w in wrt:
        g = cot.get(id(w))
        if g is None:
            g = ops.zeros(w.shape, w.dtype, w.ctx)
        elif g.shape != w.shape:
            g = ops.broadcast_to(g, w.shape)
        result.append(g)
    return result


def expand(grad_nodes: list) -> dict:
    """The backward graph of grad nodes: {id(grad node): the gradient as ordinary lazy arrays}.

    Grad nodes of one value_and_grad call (same value, same differentiated inputs) share
    one backward pass.
    """
    groups: dict = {}
    for g in grad_nodes:
        groups.setdefault(tuple(id(x) for x in g.inputs), []).append(g)
    out = {}
    for members in groups.values():
        first = members[0]
        grads = _backward(first.inputs[0], list(first.inputs[1:]))
        for g in members:
            out[id(g)] = grads[g.params[0]]
    return out


def expand_noting(grad_nodes: list) -> tuple[dict, list]:
    """expand(), and the constants whose values the backward graphs were built for (see _Noting)."""
    _noting.noted = noted = []
    try:
        return expand(grad_nodes), noted
    finally:
        _noting.noted = None


def materialize(nodes: list) -> None:
    """Turn pending grad nodes into alias views of their backward graphs (same values, ordinary ops)."""
    results = expand(nodes)
    for node in nodes:
        result = results[id(node)]
        strides, offset = result.layout()
        node.op = "alias"
        node.inputs = (result,)
        node.params = None
        node.base = result.root
        node.strides = strides
        node.offset = offset


def protect(order: list) -> None:
    """Before an eval of `order` clears its nodes' inputs: pending grad nodes it does not evaluate
    whose forward graph it evaluates part of get their backward graphs now, while that graph is
    intact. Grad nodes of graphs the eval does not touch (another device's, another thread's) are
    left as they are: an eval never changes the graph of an unrelated one."""
    if not _handed_out:
        return
    with _handed_lock:
        entries = list(_handed_out.items())
    done = []  # entries to drop: dead, evaluated now, or materialized
    pending = []
    for key, ref in entries:
        g = ref()
        if g is None or g.op != GRAD or g.storage is not None:
            done.append(key)
        else:
            pending.append((key, g))
    if pending:
        in_eval = set(map(id, order))
        outside = []
        for key, g in pending:
            if id(g) in in_eval:
                done.append(key)
            elif _forward_meets(g, in_eval):
                done.append(key)
                outside.append(g)
        if outside:
            materialize(outside)
    if done:
        with _handed_lock:
            for key in done:
                _handed_out.pop(key, None)


def _forward_meets(g: Node, in_eval: set) -> bool:
    """Whether the pending forward graph grad node `g` differentiates has a node in `in_eval` (ids)."""
    seen: set = set()
    stack = [g.inputs[0]]
    while stack:
        node = stack.pop()
        root = node if node.base is None else node.base
        if id(root) in seen:
            continue
        seen.add(id(root))
        if id(root) in in_eval:
            return True
        if root.storage is None:  # (an evaluated node's inputs are gone already)
            stack.extend(root.inputs)
    return False


def resolved(grads: list) -> None:
    """These grad nodes are expanded by a recording (rt.compile's traces keep them as they are)."""
    with _handed_lock:
        for g in grads:
            _handed_out.pop(id(g), None)


def value_and_grad(fn: Callable[P, Array], argnums: int | Sequence[int] = 0) -> Callable[P, tuple[Array, Any]]:
    """fn(*args) -> (fn's scalar value, gradient(s) with respect to args[argnums])."""
    if not callable(fn):
        raise InvalidTypeError(f"value_and_grad and grad take a function, got {type(fn).__name__}")
    single = isinstance(argnums, (int, np.integer, np.bool_))
    items = [argnums] if single else sequence_of(argnums, "argnums")
    if any(isinstance(i, (bool, np.bool_)) for i in items):
        raise InvalidTypeError("argnums are argument positions (integers), not booleans")
    nums = tuple(index_of(i, "argnums" if single else "each of argnums") for i in items)

    def wrapped(*args, **kwargs):
        args = list(args)
        wrt: list = []
        #: Per argnum: the structure of its tree of arrays (trees.flatten), or None for one array.
        specs: list = []
        for i in nums:
            if not -len(args) <= i < len(args):
                raise InvalidValueError(f"argnums names argument {i}, but the function was called with {len(args)} "
                                        "positional arguments")
        if len({i % len(args) for i in nums}) != len(nums):  # (the second alias would hide the first: zeros)
            raise InvalidValueError(f"argnums {nums} names an argument twice")
        for i in nums:
            a = args[i]
            leaves: list = []
            # A tree of arrays (a dict, namedtuple, list or tuple holding runtime arrays: a model's
            # parameters) is differentiated leaf by leaf and its gradient is the same tree; other
            # data (numpy arrays, numbers, nested lists of numbers) is one array, as before.
            spec = flatten(a, leaves) if isinstance(a, (dict, list, tuple)) else None
            if spec is not None and not leaves:
                if isinstance(a, dict):
                    raise InvalidTypeError(f"grad with respect to argument {i}: a dict holding no runtime array")
                spec = None
            if spec is None:
                leaves = [a if isinstance(a, Node) else ops.asarray(a)]
            aliases = []
            for leaf in leaves:
                if not (leaf.dtype.is_float or leaf.dtype.is_complex):
                    raise InvalidTypeError(
                        f"grad with respect to argument {i} of dtype {leaf.dtype.name}: only float and complex "
                        "arrays are differentiable (cast with .astype(rt.float32) first)")
                aliases.append(ops.alias(leaf))
            args[i] = aliases[0] if spec is None else unflatten(spec, aliases)
            specs.append((spec, len(wrt), len(aliases)))
            wrt.extend(aliases)
        token = object()
        DIFFERENTIATING[id(token)] = (threading.get_ident(), frozenset(map(id, wrt)))
        try:
            out = fn(*args, **kwargs)
        finally:
            del DIFFERENTIATING[id(token)]
        if not isinstance(out, Node):
            raise hal.InvalidArgumentError("the differentiated function must return an Array")
        if out.shape != () and out.size != 1:
            raise hal.InvalidArgumentError(
                f"grad needs a function with a scalar output, got shape {out.shape}")
        inputs = (out, *wrt)
        grads = [new_node(GRAD, inputs, (k, len(wrt)), w.shape, w.dtype, out.ctx) for k, w in enumerate(wrt)]
        with _handed_lock:
            for g in grads:
                _handed_out[id(g)] = weakref.ref(g)
        per_arg = tuple(grads[start] if spec is None else unflatten(spec, grads[start:start + n], constants=False)
                        for spec, start, n in specs)
        return out, (per_arg[0] if single else per_arg)

    wrapped.__name__ = f"value_and_grad({getattr(fn, '__name__', 'fn')})"
    return wrapped


def grad(fn: Callable[P, Array], argnums: int | Sequence[int] = 0) -> Callable[P, Any]:
    """The gradient of a scalar-valued fn with respect to args[argnums] (lazy arrays)."""
    vg = value_and_grad(fn, argnums)

    def wrapped(*args, **kwargs):
        return vg(*args, **kwargs)[1]

    wrapped.__name__ = f"grad({getattr(fn, '__name__', 'fn')})"
    return wrapped
