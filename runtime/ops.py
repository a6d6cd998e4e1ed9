"""Op builders: shape/dtype inference and validation when the op is built, no device work."""

from __future__ import annotations

import builtins
import numbers
import operator

import numpy as np

import hal

from . import dtypes as _dt
from .array import Array, constant, new_node, new_view, upload
from .device import context_for
from .shapes import (
    MAX_DIMS,
    broadcast_shapes,
    contiguous_strides,
    normalize_axes,
    parse_index,
    reshape_strides,
    reshape_target,
    size_of,
)

UNARY_FLOAT = ("exp", "log", "sqrt", "tanh", "sigmoid")
ARITH = ("add", "sub", "mul", "div", "pow", "maximum", "minimum")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
ELEMENTWISE = frozenset(UNARY_FLOAT + ARITH + COMPARE + ("neg", "abs", "cast", "copy", "where"))
REDUCTIONS = frozenset(("sum", "mean", "max", "min", "argmax", "argmin"))
VIEWS = frozenset(("reshape", "transpose", "broadcast_to", "slice", "alias"))

_Scalar = (bool, int, float)


def _ctx_of(*xs):
    ctx = None
    for x in xs:
        if type(x) is Array:
            if ctx is None:
                ctx = x.ctx
            elif x.ctx is not ctx:
                raise hal.InvalidArgumentError(
                    f"arrays are on different devices ({ctx.name} and {x.ctx.name})")
    return ctx


def asarray(x, dtype=None, device=None) -> Array:
    """An Array from an Array, numpy array, Python scalar or nested sequence (copied to the device)."""
    if type(x) is Array:
        if dtype is not None and _dt.as_dtype(dtype) is not x.dtype:
            return astype(x, dtype)
        return x
    ctx = context_for(device)
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        from .interop import from_dlpack
        return asarray(from_dlpack(x, device=ctx), dtype=dtype)
    host = np.asarray(x)
    if dtype is not None:
        dt = _dt.as_dtype(dtype)
    elif isinstance(x, _Scalar) or (isinstance(x, (list, tuple)) and host.dtype in (np.float64, np.int64)):
        dt = _dt.from_numpy(host.dtype)
    else:
        dt = _dt.from_numpy(host.dtype)
    if len(host.shape) > MAX_DIMS:
        raise hal.InvalidArgumentError(f"at most {MAX_DIMS} dimensions are supported")
    return upload(host, dt, ctx)


def _operands(a, b):
    """Turn (a, b) with at least one Array into two Arrays and the promoted dtype."""
    ta, tb = type(a) is Array, type(b) is Array
    if ta and tb:
        if a.ctx is not b.ctx:
            _ctx_of(a, b)
        return a, b, _dt.promote(a.dtype, b.dtype)
    if ta:
        if isinstance(b, _Scalar):
            dt = _dt.weak_scalar_dtype(a.dtype, b)
            return a, constant(b, dt, a.ctx), dt
        b = asarray(b, device=a.ctx)
        return a, b, _dt.promote(a.dtype, b.dtype)
    if tb:
        if isinstance(a, _Scalar):
            dt = _dt.weak_scalar_dtype(b.dtype, a)
            return constant(a, dt, b.ctx), b, dt
        a = asarray(a, device=b.ctx)
        return a, b, _dt.promote(a.dtype, b.dtype)
    a = asarray(a)
    return _operands(a, b)


def _bshape(a: Array, b: Array) -> tuple:
    sa, sb = a.shape, b.shape
    if sa == sb or not sb:
        return sa
    if not sa:
        return sb
    return broadcast_shapes(sa, sb)


_PROMOTE = _dt._PROMOTE


def _binary(op: str, a, b) -> Array:
    if type(a) is Array and type(b) is Array and a.ctx is b.ctx:
        dt = _PROMOTE[a.dtype, b.dtype]
    else:
        a, b, dt = _operands(a, b)
    shape = _bshape(a, b)
    if op == "div":
        out = dt if dt.is_float else _dt.float32
        cdt = out
    elif op in COMPARE:
        out, cdt = _dt.bool_, dt
    elif op == "sub" and dt is _dt.bool_:
        raise hal.InvalidArgumentError("numpy boolean subtract is not supported, use logical ops")
    elif op == "pow" and dt is _dt.bool_:
        out = cdt = _dt.int32
    else:
        out = cdt = dt
    return new_node(op, (a, b), cdt, shape, out, a.ctx)


def add(a, b): return _binary("add", a, b)
def subtract(a, b): return _binary("sub", a, b)
def multiply(a, b): return _binary("mul", a, b)
def divide(a, b): return _binary("div", a, b)
def power(a, b): return _binary("pow", a, b)
def maximum(a, b): return _binary("maximum", a, b)
def minimum(a, b): return _binary("minimum", a, b)
def equal(a, b): return _binary("eq", a, b)
def not_equal(a, b): return _binary("ne", a, b)
def less(a, b): return _binary("lt", a, b)
def less_equal(a, b): return _binary("le", a, b)
def greater(a, b): return _binary("gt", a, b)
def greater_equal(a, b): return _binary("ge", a, b)


sub = subtract
mul = multiply
div = true_divide = divide
pow = power  # noqa: A001


def _unary(op: str, x, out: _dt.DType | None = None) -> Array:
    if type(x) is not Array:
        x = asarray(x)
    dt = out or x.dtype
    return new_node(op, (x,), dt, x.shape, dt, x.ctx)


def negative(x) -> Array:
    if type(x) is Array and x.dtype is _dt.bool_:
        raise hal.InvalidArgumentError("the numpy boolean negative is not supported, use logical_not")
    return _unary("neg", x)


neg = negative


def absolute(x) -> Array:
    return _unary("abs", x)


abs = absolute  # noqa: A001


def _transcendental(op):
    def fn(x) -> Array:
        if type(x) is not Array:
            x = asarray(x)
        return _unary(op, x, _dt.float_result(x.dtype))
    fn.__name__ = op
    fn.__doc__ = f"Elementwise {op} (integers and bools are promoted to floats as numpy does)."
    return fn


exp = _transcendental("exp")
log = _transcendental("log")
sqrt = _transcendental("sqrt")
tanh = _transcendental("tanh")
sigmoid = _transcendental("sigmoid")


def astype(x, dtype) -> Array:
    dt = _dt.as_dtype(dtype)
    if type(x) is not Array:
        x = asarray(x)
    if dt is x.dtype:
        return x
    return new_node("cast", (x,), dt, x.shape, dt, x.ctx)


def contiguous(x: Array) -> Array:
    """x itself when it is a dense root, else a contiguous copy."""
    if x.root is x:
        return x
    return new_node("copy", (x,), x.dtype, x.shape, x.dtype, x.ctx)


def where(cond, x, y) -> Array:
    ctx = _ctx_of(cond, x, y)
    if ctx is None:
        cond = asarray(cond)
        ctx = cond.ctx
    if type(cond) is not Array:
        cond = asarray(cond, device=ctx)
    if cond.dtype is not _dt.bool_:
        cond = not_equal(cond, False if cond.dtype is _dt.bool_ else 0)
    if type(x) is not Array and type(y) is not Array:
        x = asarray(x, device=ctx)
    x, y, dt = _operands(x, y)
    shape = broadcast_shapes(cond.shape, x.shape, y.shape)
    return new_node("where", (cond, x, y), dt, shape, dt, ctx)


# ---- reductions -------------------------------------------------------------------------------

def _reduce(op: str, x, axis, keepdims: bool) -> Array:
    if type(x) is not Array:
        x = asarray(x)
    axes = normalize_axes(axis, x.ndim)
    if op in ("argmax", "argmin"):
        if axis is not None and len(axes) != 1:
            raise hal.InvalidArgumentError(f"{op} takes a single axis or None")
    kept = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = kept
    reduced = size_of(tuple(x.shape[i] for i in axes))
    if reduced == 0 and op not in ("sum", "mean") and size_of(kept) != 0:
        raise hal.InvalidArgumentError(f"zero-size array to reduction operation {op} which has no identity")
    out = _dt.reduction_result(op, x.dtype)
    return new_node(op, (x,), (axes, bool(keepdims)), shape, out, x.ctx)


def sum(x, axis=None, keepdims=False) -> Array:  # noqa: A001
    return _reduce("sum", x, axis, keepdims)


def mean(x, axis=None, keepdims=False) -> Array:
    return _reduce("mean", x, axis, keepdims)


def max(x, axis=None, keepdims=False) -> Array:  # noqa: A001
    return _reduce("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False) -> Array:  # noqa: A001
    return _reduce("min", x, axis, keepdims)


def argmax(x, axis=None, keepdims=False) -> Array:
    if axis is None and type(x) is Array and x.ndim > 1:
        x = reshape(x, (-1,))
        return _reduce("argmax", x, None, False) if not keepdims else reshape(
            _reduce("argmax", x, None, False), (1,) * len(x.shape))
    return _reduce("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False) -> Array:
    if axis is None and type(x) is Array and x.ndim > 1:
        return _reduce("argmin", reshape(x, (-1,)), None, False)
    return _reduce("argmin", x, axis, keepdims)


# ---- matmul -----------------------------------------------------------------------------------

def matmul(a, b) -> Array:
    a, b, dt = _operands(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise hal.InvalidArgumentError("matmul: input operand does not have enough dimensions")
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise hal.InvalidArgumentError(
            f"matmul: mismatch in core dimension: {a.shape} @ {b.shape} ({k} != {k2})")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    if a2.dtype is not dt:
        a2 = astype(a2, dt)
    if b2.dtype is not dt:
        b2 = astype(b2, dt)
    out = new_node("matmul", (a2, b2), None, batch + (m, n), dt, a.ctx)
    if a.ndim == 1 or b.ndim == 1:
        shape = batch + ((m,) if a.ndim != 1 else ()) + ((n,) if b.ndim != 1 else ())
        out = reshape(out, shape)
    return out


# ---- views ------------------------------------------------------------------------------------

_reshape_targets: dict = {}  # (shape, requested shape) -> validated target shape

def reshape(x, shape) -> Array:
    if type(x) is not Array:
        x = asarray(x)
    key = (x.shape, shape)
    newshape = _reshape_targets.get(key) if type(shape) is tuple else None
    if newshape is None:
        newshape = reshape_target(x.shape, shape, x.size)
        if type(shape) is tuple and len(_reshape_targets) < 4096:
            _reshape_targets[key] = newshape
    if newshape == x.shape:
        return x
    if x.strides is None:  # a dense root: the new shape's row-major strides
        return new_view("reshape", x, newshape, newshape, _row_major(newshape), x.offset)
    strides, offset = x.layout()
    new_strides = reshape_strides(x.shape, strides, newshape)
    if new_strides is None:
        x = new_node("copy", (x,), x.dtype, x.shape, x.dtype, x.ctx)
        new_strides, offset = contiguous_strides(newshape), 0
    return new_view("reshape", x, newshape, newshape, new_strides, offset)


def _row_major(shape: tuple) -> tuple:
    strides = _strides_cache.get(shape)
    if strides is None:
        strides = contiguous_strides(shape)
        if len(_strides_cache) < 4096:
            _strides_cache[shape] = strides
    return strides


_strides_cache: dict = {}


def transpose(x, axes=None) -> Array:
    if type(x) is not Array:
        x = asarray(x)
    nd = x.ndim
    if axes is None:
        if nd < 2:
            return x
        axes = tuple(range(nd - 1, -1, -1))
        strides = x.strides if x.strides is not None else _row_major(x.shape)
        return new_view("transpose", x, axes, x.shape[::-1], strides[::-1], x.offset)
    else:
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = axes[0]
        axes = tuple(operator.index(a) % nd if -nd <= a < nd else -1 for a in axes)
        if sorted(axes) != list(range(nd)):
            raise hal.InvalidArgumentError(f"axes don't match array: {axes}")
    if axes == tuple(range(nd)):
        return x
    strides, offset = x.layout()
    return new_view("transpose", x, axes, tuple(x.shape[a] for a in axes),
                    tuple(strides[a] for a in axes), offset)


def swapaxes(x, a: int, b: int) -> Array:
    axes = list(range(x.ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return transpose(x, axes)


def broadcast_to(x, shape) -> Array:
    if type(x) is not Array:
        x = asarray(x)
    shape = tuple(shape)
    if shape == x.shape:
        return x
    if len(shape) < x.ndim or broadcast_shapes(x.shape, shape) != shape:
        raise hal.InvalidArgumentError(f"cannot broadcast shape {x.shape} to {shape}")
    strides, offset = x.layout()
    lead = len(shape) - x.ndim
    new_strides = (0,) * lead + tuple(0 if d == 1 and o != 1 else s
                                      for d, s, o in zip(x.shape, strides, shape[lead:]))
    return new_view("broadcast_to", x, shape, shape, new_strides, offset)


def expand_dims(x, axis) -> Array:
    axes = normalize_axes(axis, x.ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1))
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(x, tuple(shape))


def squeeze(x, axis=None) -> Array:
    if axis is None:
        return reshape(x, tuple(d for d in x.shape if d != 1))
    axes = normalize_axes(axis, x.ndim)
    if any(x.shape[a] != 1 for a in axes):
        raise hal.InvalidArgumentError("cannot select an axis to squeeze out which has size not equal to one")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def getitem(x: Array, key) -> Array:
    if isinstance(key, Array) or isinstance(key, (list, np.ndarray)):
        raise hal.InvalidArgumentError("advanced (array) indexing is not supported; use basic slicing")
    strides, offset = x.layout()
    shape, new_strides, new_offset, info = parse_index(key, x.shape, strides, offset)
    if len(shape) > MAX_DIMS:
        raise hal.InvalidArgumentError(f"at most {MAX_DIMS} dimensions are supported")
    params = (tuple(info), tuple(shape))
    return new_view("slice", x, params, shape, new_strides, new_offset)


def alias(x: Array) -> Array:
    """A new Array object viewing the same data (marks a differentiation input)."""
    strides, offset = x.layout()
    return new_view("alias", x, None, x.shape, strides, offset)


def pad_slice(g: Array, in_shape: tuple, info: tuple) -> Array:
    """Zeros of `in_shape` with `g` placed where the basic index described by `info` selected."""
    return new_node("pad", (g,), (tuple(in_shape), tuple(info)), tuple(in_shape), g.dtype, g.ctx)


# ---- creation ---------------------------------------------------------------------------------

def full(shape, fill_value, dtype=None, device=None) -> Array:
    from .shapes import check_shape
    shape = check_shape(shape)
    ctx = context_for(device)
    if dtype is None:
        if isinstance(fill_value, bool):
            dt = _dt.bool_
        elif isinstance(fill_value, numbers.Integral):
            dt = _dt.int32
        else:
            dt = _dt.float32
    else:
        dt = _dt.as_dtype(dtype)
    if dt is _dt.bool_:
        value = builtins.bool(fill_value)
    elif dt.kind == "i":
        value = int(fill_value)
    else:
        value = float(fill_value)
    return new_node("full", (), value, shape, dt, ctx)


def zeros(shape, dtype=_dt.float32, device=None) -> Array:
    return full(shape, 0, dtype, device)


def ones(shape, dtype=_dt.float32, device=None) -> Array:
    return full(shape, 1, dtype, device)


def zeros_like(x: Array, dtype=None) -> Array:
    return full(x.shape, 0, dtype or x.dtype, x.ctx)


def ones_like(x: Array, dtype=None) -> Array:
    return full(x.shape, 1, dtype or x.dtype, x.ctx)


def arange(start, stop=None, step=1, dtype=None, device=None) -> Array:
    if stop is None:
        start, stop = 0, start
    host = np.arange(start, stop, step)
    dt = _dt.as_dtype(dtype) if dtype is not None else _dt.from_numpy(host.dtype)
    return upload(host, dt, context_for(device))


# ---- Python operators -------------------------------------------------------------------------

def _install_operators() -> None:
    A = Array
    A.__add__ = lambda s, o: _binary("add", s, o)
    A.__radd__ = lambda s, o: _binary("add", o, s)
    A.__sub__ = lambda s, o: _binary("sub", s, o)
    A.__rsub__ = lambda s, o: _binary("sub", o, s)
    A.__mul__ = lambda s, o: _binary("mul", s, o)
    A.__rmul__ = lambda s, o: _binary("mul", o, s)
    A.__truediv__ = lambda s, o: _binary("div", s, o)
    A.__rtruediv__ = lambda s, o: _binary("div", o, s)
    A.__pow__ = lambda s, o: _binary("pow", s, o)
    A.__rpow__ = lambda s, o: _binary("pow", o, s)
    A.__matmul__ = lambda s, o: matmul(s, o)
    A.__rmatmul__ = lambda s, o: matmul(o, s)
    A.__neg__ = negative
    A.__pos__ = lambda s: s
    A.__abs__ = absolute
    A.__eq__ = lambda s, o: _binary("eq", s, o)
    A.__ne__ = lambda s, o: _binary("ne", s, o)
    A.__lt__ = lambda s, o: _binary("lt", s, o)
    A.__le__ = lambda s, o: _binary("le", s, o)
    A.__gt__ = lambda s, o: _binary("gt", s, o)
    A.__ge__ = lambda s, o: _binary("ge", s, o)
    A.__hash__ = object.__hash__
    A.__getitem__ = getitem
    A.T = property(lambda s: transpose(s))
    A.reshape = lambda s, *shape: reshape(s, shape[0] if len(shape) == 1 else shape)
    A.transpose = lambda s, *axes: transpose(s, axes or None)
    A.astype = astype
    A.sum = lambda s, axis=None, keepdims=False: sum(s, axis, keepdims)
    A.mean = lambda s, axis=None, keepdims=False: mean(s, axis, keepdims)
    A.max = lambda s, axis=None, keepdims=False: max(s, axis, keepdims)
    A.min = lambda s, axis=None, keepdims=False: min(s, axis, keepdims)
    A.argmax = lambda s, axis=None, keepdims=False: argmax(s, axis, keepdims)
    A.argmin = lambda s, axis=None, keepdims=False: argmin(s, axis, keepdims)
    A.exp = exp
    A.log = log
    A.sqrt = sqrt
    A.tanh = tanh
    A.sigmoid = sigmoid
    A.abs = absolute
    A.broadcast_to = broadcast_to
    A.squeeze = squeeze
    A.flatten = lambda s: reshape(s, (-1,))


_install_operators()
