"""numpy's dispatch protocols: `np.exp(a)`, `np.sum(a)`, `np.concatenate([a, b])` on runtime arrays
build runtime ops on the arrays' device (lazy) instead of pulling the data to the host.

numpy functions without a runtime counterpart raise numpy's TypeError naming the function; an
`out=` argument (arrays are immutable) too.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import numpy as np

from . import array_api, ops
from . import dtypes as _dt
from . import fft as _fft
from .errors import InvalidTypeError, InvalidValueError
from .graph import Node

if TYPE_CHECKING:
    from .array import Array

_UFUNCS = {
    "add": ops.add, "subtract": ops.subtract, "multiply": ops.multiply, "divide": ops.divide,
    "true_divide": ops.divide, "power": ops.power, "maximum": ops.maximum, "minimum": ops.minimum,
    "floor_divide": ops.floor_divide, "remainder": ops.remainder, "mod": ops.remainder,
    "equal": ops.equal, "not_equal": ops.not_equal, "less": ops.less, "less_equal": ops.less_equal,
    "greater": ops.greater, "greater_equal": ops.greater_equal, "negative": ops.negative,
    "positive": ops.positive, "absolute": ops.absolute, "fabs": ops.absolute, "matmul": ops.matmul,
    "arctan2": "atan2", "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh",
    "arccosh": "acosh", "arctanh": "atanh", "invert": "bitwise_invert", "rint": "round", "conjugate": "conj",
}
for _name in ("exp", "log", "sqrt", "tanh", "sin", "cos", "tan", "sinh", "cosh", "expm1", "log1p", "log2", "log10",
              "floor", "ceil", "trunc", "square", "sign", "reciprocal", "isnan", "isinf", "isfinite", "signbit",
              "logical_not", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
              "bitwise_xor", "left_shift", "right_shift", "hypot", "copysign", "nextafter", "logaddexp"):
    _UFUNCS[_name] = getattr(ops, _name)
for _alias, _name in list(_UFUNCS.items()):
    if isinstance(_name, str):
        _UFUNCS[_alias] = getattr(ops, _name)

_REDUCE = {"add": ops.sum, "multiply": lambda x, axis, keepdims: array_api.prod(x, axis=axis, keepdims=keepdims),
           "maximum": ops.max, "minimum": ops.min,
           "logical_or": lambda x, axis, keepdims: array_api.any(x, axis=axis, keepdims=keepdims),
           "logical_and": lambda x, axis, keepdims: array_api.all(x, axis=axis, keepdims=keepdims)}


#: Ufuncs whose result is bool (numpy's ``dtype=`` names the result's dtype there, which is bool).
_BOOL_RESULTS = frozenset(("equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "isnan",
                           "isinf", "isfinite", "signbit", "logical_and", "logical_or", "logical_xor",
                           "logical_not"))


def array_ufunc(self: Array, ufunc, method: str, *inputs, **kwargs):
    if kwargs.get("out") is not None:
        raise InvalidTypeError(f"np.{ufunc.__name__}(..., out=...) is not supported: runtime arrays are immutable")
    kwargs.pop("out", None)
    if method == "__call__":
        fn = _UFUNCS.get(ufunc.__name__)
        if fn is None:
            return NotImplemented
        dtype = kwargs.pop("dtype", None)
        if kwargs:  # (where=, casting=, order=, signature=: ignoring one would change the result)
            raise InvalidTypeError(f"np.{ufunc.__name__}(..., {', '.join(f'{k}=...' for k in kwargs)}) is not "
                                   "supported on runtime arrays")
        if dtype is not None:  # numpy's loop dtype: the operands cast to it first
            if ufunc.__name__ in _BOOL_RESULTS:
                raise InvalidTypeError(f"np.{ufunc.__name__}(..., dtype=...) is not supported: its result is bool")
            inputs = tuple(ops.astype(ops.asarray(x), dtype) for x in inputs)
        return fn(*inputs)
    if method == "reduce" and len(inputs) == 1:
        fn = _REDUCE.get(ufunc.__name__)
        if fn is None or set(kwargs) - {"axis", "keepdims"}:
            return NotImplemented
        return fn(inputs[0], axis=kwargs.get("axis", 0), keepdims=kwargs.get("keepdims", False))
    return NotImplemented


def _reduction(fn):
    def call(a, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        # ``initial=`` and a ``where=`` mask have no runtime counterpart: numpy's TypeError naming
        # the function, not a result that ignored them.
        if out is not None or kwargs.get("where", True) is not True or set(kwargs) - {"where"}:
            return NotImplemented
        x = a if isinstance(a, Node) else ops.asarray(a)
        if dtype is not None:
            x = ops.astype(x, dtype)
        return fn(x, axis=axis, keepdims=keepdims)
    return call


def _std(fn):
    def call(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kwargs):
        if out is not None or kwargs.get("where", True) is not True or kwargs.get("mean") is not None \
                or set(kwargs) - {"where", "mean", "correction"}:
            return NotImplemented
        if kwargs.get("correction") is not None:
            ddof = kwargs["correction"]
        x = a if dtype is None else ops.astype(a, dtype)
        return fn(x, axis=axis, correction=ddof, keepdims=keepdims)
    return call


_FUNCTIONS = {
    np.sum: _reduction(lambda x, axis, keepdims: array_api.sum(x, axis=axis, keepdims=keepdims)),
    np.prod: _reduction(lambda x, axis, keepdims: array_api.prod(x, axis=axis, keepdims=keepdims)),
    np.mean: _reduction(ops.mean), np.max: _reduction(ops.max), np.min: _reduction(ops.min),
    np.amax: _reduction(ops.max), np.amin: _reduction(ops.min),
    np.any: _reduction(lambda x, axis, keepdims: array_api.any(x, axis=axis, keepdims=keepdims)),
    np.all: _reduction(lambda x, axis, keepdims: array_api.all(x, axis=axis, keepdims=keepdims)),
    np.std: _std(array_api.std), np.var: _std(array_api.var),
    np.argmax: lambda a, axis=None, out=None, keepdims=False: ops.argmax(a, axis, keepdims),
    np.argmin: lambda a, axis=None, out=None, keepdims=False: ops.argmin(a, axis, keepdims),
    np.concatenate: lambda arrays, axis=0, out=None, dtype=None, casting="same_kind": array_api.concat(
        _cast_to_join(arrays, dtype, casting, "concatenate"), axis=axis),
    np.stack: lambda arrays, axis=0, out=None, *, dtype=None, casting="same_kind": array_api.stack(
        _cast_to_join(arrays, dtype, casting, "stack"), axis=axis),
    np.where: lambda cond, x=None, y=None: ops.where(cond, x, y) if x is not None else array_api.nonzero(cond),
    np.reshape: lambda a, shape=None, order="C", **kw: ops.reshape_in_order(
        a, shape if shape is not None else kw.get("newshape"), order),
    np.transpose: lambda a, axes=None: ops.transpose(a, axes),
    np.squeeze: lambda a, axis=None: ops.squeeze(a, axis),
    np.expand_dims: lambda a, axis: ops.expand_dims(a, axis),
    np.broadcast_to: lambda array, shape, subok=False: ops.broadcast_to(array, shape),
    np.swapaxes: lambda a, axis1, axis2: ops.swapaxes(a, axis1, axis2),
    np.moveaxis: lambda a, source, destination: array_api.moveaxis(a, source, destination),
    np.clip: lambda a, a_min=None, a_max=None, out=None, **kw: _clip(a, kw.pop("min", a_min), kw.pop("max", a_max), kw),
    np.flip: lambda m, axis=None: array_api.flip(m, axis=axis),
    np.roll: lambda a, shift, axis=None: array_api.roll(a, shift, axis=axis),
    np.tile: lambda A, reps: array_api.tile(A, reps if isinstance(reps, (tuple, list)) else (reps,)),
    np.repeat: lambda a, repeats, axis=None: array_api.repeat(a, repeats, axis=axis),
    np.take: lambda a, indices, axis=None, out=None, mode="raise": array_api.take(
        a if axis is not None else ops.reshape(a, (-1,)), indices, axis=axis if axis is not None else 0, mode=mode),
    np.sort: lambda a, axis=-1, kind=None, order=None, stable=None: array_api.sort(a, axis=axis),
    np.argsort: lambda a, axis=-1, kind=None, order=None, stable=None: array_api.argsort(a, axis=axis),
    np.cumsum: lambda a, axis=None, dtype=None, out=None: array_api.cumulative_sum(
        a if axis is not None else ops.reshape(a, (-1,)), axis=axis if axis is not None else 0, dtype=dtype),
    np.matmul: lambda a, b, out=None, **kw: ops.matmul(a, b),
    np.dot: lambda a, b, out=None: ops.matmul(a, b) if a.ndim and b.ndim else ops.multiply(a, b),
    np.zeros_like: lambda a, dtype=None, order="K", subok=True, shape=None, **kw: _filled_like(a, 0, dtype, shape),
    np.ones_like: lambda a, dtype=None, order="K", subok=True, shape=None, **kw: _filled_like(a, 1, dtype, shape),
    np.full_like: lambda a, fill_value, dtype=None, order="K", subok=True, shape=None, **kw: _filled_like(
        a, fill_value, dtype, shape),
    np.round: lambda a, decimals=0, out=None: ops.round_to(a, decimals),
    np.around: lambda a, decimals=0, out=None: ops.round_to(a, decimals),
    np.nonzero: lambda a: array_api.nonzero(a),
    np.count_nonzero: lambda a, axis=None, keepdims=False: array_api.count_nonzero(a, axis=axis,
                                                                                    keepdims=keepdims),
    np.diff: lambda a, n=1, axis=-1, prepend=None, append=None: array_api.diff(a, n=n, axis=axis,
                                                                                 prepend=_diff_edge(a, prepend, axis),
                                                                                 append=_diff_edge(a, append, axis)),
    np.unique: lambda ar, **kw: array_api.unique_values(ar) if not kw else NotImplemented,
    np.tensordot: lambda a, b, axes=2: array_api.tensordot(a, b, axes=axes),
    np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim, np.size: lambda a, axis=None: a.size if axis is None
    else a.shape[axis],
    np.copy: lambda a, order="K", subok=False: ops.copy_array(a),
    np.astype: lambda x, dtype, copy=True, **kw: ops.astype(x, dtype),
    np.isclose: lambda a, b, rtol=1e-05, atol=1e-08, equal_nan=False: _isclose(a, b, rtol, atol, equal_nan),
    np.allclose: lambda a, b, rtol=1e-05, atol=1e-08, equal_nan=False: bool(
        array_api.all(_isclose(a, b, rtol, atol, equal_nan))),
    np.array_equal: lambda a1, a2, equal_nan=False: ops.asarray(a1).shape == ops.asarray(a2).shape and bool(
        array_api.all(ops.equal(a1, a2))),
}


def _fft1(fn):
    """numpy's one-axis transform (``norm=None`` is "backward"; no ``out=``) as rt.fft's ``fn``."""
    def run(a, n=None, axis=-1, norm=None, out=None):
        return NotImplemented if out is not None else fn(a, n=n, axis=axis, norm=norm or "backward")
    return run


def _fftn(fn, default_axes=None):
    """numpy's n-axis transform (``fft2`` and the like: ``default_axes`` (-2, -1)) as rt.fft's ``fn``."""
    def run(a, s=None, axes=default_axes, norm=None, out=None):
        return NotImplemented if out is not None else fn(a, s=s, axes=axes, norm=norm or "backward")
    return run


_FUNCTIONS.update({getattr(np.fft, name): _fft1(getattr(_fft, name))
                   for name in ("fft", "ifft", "rfft", "irfft", "hfft", "ihfft")})
_FUNCTIONS.update({getattr(np.fft, name): _fftn(getattr(_fft, name)) for name in ("fftn", "ifftn", "rfftn", "irfftn")})
_FUNCTIONS.update({getattr(np.fft, name + "2"): _fftn(getattr(_fft, name + "n"), (-2, -1))
                   for name in ("fft", "ifft", "rfft", "irfft")})
_FUNCTIONS.update({np.fft.fftshift: lambda x, axes=None: _fft.fftshift(x, axes=axes),
                   np.fft.ifftshift: lambda x, axes=None: _fft.ifftshift(x, axes=axes)})


def _cast_to_join(arrays, dtype, casting: str, name: str) -> list:
    """np.concatenate's and np.stack's arrays cast to ``dtype`` (else their result type), each cast
    allowed by numpy's ``casting`` rule (numpy's TypeError where it refuses one)."""
    arrays = [a if isinstance(a, Node) else ops.asarray(a) for a in arrays]
    if not arrays:
        return arrays  # (the standard's error for no arrays)
    target = _dt.as_dtype(dtype) if dtype is not None else array_api.result_type(*arrays)
    for a in arrays:
        if not _castable(a.dtype, target, casting):
            raise InvalidTypeError(f"np.{name}: cannot cast {a.dtype.name} to {target.name} with casting={casting!r}")
    return arrays if dtype is None else [ops.astype(a, target) for a in arrays]


def _castable(source, target, casting: str) -> bool:
    """numpy's casting rules over runtime dtypes (bfloat16 taking float32's kind, the array API's
    ``can_cast`` as "safe")."""
    if casting == "unsafe":
        return True
    if casting in ("no", "equiv"):
        return source is target
    if casting not in ("safe", "same_kind"):
        raise InvalidValueError(f"casting must be 'no', 'equiv', 'safe', 'same_kind' or 'unsafe', got {casting!r}")
    if array_api.can_cast(source, target):
        return True
    if casting == "safe":
        return False
    stand_in = {_dt.bfloat16: np.dtype(np.float32)}
    return bool(np.can_cast(stand_in.get(source, source.storage), stand_in.get(target, target.storage), "same_kind"))


def _clip(a, low, high, kwargs: dict):
    """np.clip: ``dtype=`` computes in that dtype; other ufunc arguments (``where=``) have no
    counterpart (numpy's TypeError, not a result that ignored them)."""
    dtype = kwargs.pop("dtype", None)
    kwargs.pop("casting", None)
    if kwargs:
        return NotImplemented
    return array_api.clip(a if dtype is None else ops.astype(ops.asarray(a), dtype), low, high)


def _filled_like(a, fill_value, dtype, shape) -> Array:
    """numpy's ``*_like(a, dtype=, shape=)``: ``a``'s dtype and device, its shape unless ``shape``."""
    a = ops.asarray(a)
    if shape is None:
        return ops.full_like(a, fill_value, dtype=dtype)
    return ops.full(shape, fill_value, dtype or a.dtype, a.ctx)


def _diff_edge(a, edge, axis: int):
    """np.diff's ``prepend``/``append``: a scalar is broadcast to ``a``'s shape with one element
    along ``axis``, as numpy does (the standard's ``diff`` takes arrays of that shape only)."""
    if edge is None or (isinstance(edge, (Node, np.ndarray)) and edge.ndim):
        return edge
    a = ops.asarray(a)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -a.ndim <= axis < a.ndim:
        return edge  # (a 0-d array or a bad axis: the standard's error, from diff)
    shape = list(a.shape)
    shape[axis] = 1
    return ops.broadcast_to(ops.asarray(edge), tuple(shape))


def _isclose(a, b, rtol, atol, equal_nan) -> Array:
    a, b, _ = ops.operands(a, b)
    close = ops.less_equal(ops.absolute(a - b), atol + rtol * ops.absolute(b))
    if equal_nan:
        close = ops.logical_or(close, ops.logical_and(ops.isnan(a), ops.isnan(b)))
    return close


def _out_positions(functions: dict) -> dict:
    """Per numpy function whose implementation takes numpy's ``out``, the position of ``out``."""
    positions = {}
    for func, fn in functions.items():
        params = list(inspect.signature(fn).parameters)
        if "out" in params:
            positions[func] = params.index("out")
    return positions


#: Where each function takes ``out``: given (by name or by position), it is refused, as by the
#: ufuncs (arrays are immutable; ignoring it would leave the caller's array unwritten).
_OUT_AT = _out_positions(_FUNCTIONS)


def array_function(self: Array, func, types, args, kwargs):
    fn = _FUNCTIONS.get(func)
    if fn is None:
        return NotImplemented
    if not all(issubclass(t, (Node, np.ndarray)) for t in types):
        return NotImplemented
    at = _OUT_AT.get(func)
    if at is not None and (kwargs.get("out") is not None or (len(args) > at and args[at] is not None)):
        name = f"{func.__module__.replace('numpy', 'np', 1)}.{func.__name__}"
        raise InvalidTypeError(f"{name}(..., out=...) is not supported: runtime arrays are immutable")
    return fn(*args, **kwargs)
