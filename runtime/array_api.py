"""The Python array API standard (2024.12) functions beyond the op builders: creation, manipulation,
statistics, searching, sorting, sets and data-type functions.

Everything that can stay lazy on the device is built from graph ops (concat is padded windows
selected by position, tile/repeat are broadcasts, std/var are means). What has a data-dependent
shape (boolean masks, nonzero, unique) or no device kernel yet (sort, argsort, cumulative sums,
searchsorted) evaluates its input and computes on the host, then uploads the result to the same
device: documented in docs/array-api.md.
"""

from __future__ import annotations

import builtins
import math
import operator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

import hal

from . import dtypes as _dt
from . import ops
from .device import context_for
from .errors import InvalidIndexError, InvalidTypeError, InvalidValueError, TracingError
from .graph import Node, differentiated, new_node, upload
from .kernels import compact, scan
from .kernels import sort as sort_kernels
from .kernels import take as take_kernel
from .shapes import broadcast_shapes, index_of, normalize_axes, normalize_axis, sequence_of

if TYPE_CHECKING:
    from .array import Array

__array_api_version__ = "2024.12"

e = math.e
pi = math.pi
inf = math.inf
nan = math.nan
newaxis = None


_arr = ops.as_array


def _on_host(x: Array, result: np.ndarray, dtype: _dt.DType | None = None) -> Array:
    """Upload a host result next to x (same device)."""
    dt = dtype or _dt.from_numpy(result.dtype)
    return upload(np.asarray(result), dt, x.ctx)


# ---- creation -----------------------------------------------------------------------------------

def empty(shape, *, dtype=None, device=None) -> Array:
    return ops.zeros(shape, dtype=dtype, device=device)


def empty_like(x, /, *, dtype=None, device=None) -> Array:
    return ops.zeros_like(x, dtype=dtype, device=device)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None) -> Array:
    dt = _dt.as_dtype(dtype) if dtype is not None else _dt.DEFAULT_FLOAT
    ctx = context_for(device)
    n_rows = index_of(n_rows, "eye's row count")
    n_cols = n_rows if n_cols is None else index_of(n_cols, "eye's column count")
    k = index_of(k, "eye's diagonal offset k")
    if n_rows < 0 or n_cols < 0:
        raise InvalidValueError(f"eye of a negative size ({n_rows} x {n_cols})")
    ctx.check_fits((n_rows, n_cols), dt)
    host = np.eye(n_rows, n_cols, k=k, dtype=np.float64 if dt is _dt.bfloat16 else dt.storage)
    return upload(host, dt, ctx)


def linspace(start, stop, /, num, *, dtype=None, device=None, endpoint=True) -> Array:
    is_complex = isinstance(start, complex) or isinstance(stop, complex)
    if dtype is not None:
        dt = _dt.as_dtype(dtype)
        if is_complex and not dt.is_complex:
            raise InvalidTypeError(f"linspace: complex bounds for {dt.name}")
    else:
        dt = _dt.DEFAULT_COMPLEX if is_complex else _dt.DEFAULT_FLOAT
    ctx = context_for(device)
    host_dt = np.complex128 if dt.is_complex else np.float64
    ctx.check_fits((operator.index(num),), _dt.as_dtype(host_dt))  # made in double precision on the host first
    host = np.linspace(start, stop, num, endpoint=endpoint, dtype=host_dt)
    return upload(host, dt, ctx)


def meshgrid(*arrays, indexing="xy") -> list:
    if indexing not in ("xy", "ij"):
        raise InvalidValueError(f"indexing must be 'xy' or 'ij', got {indexing!r}")
    arrays = [_arr(a) for a in arrays]
    n = len(arrays)
    shape = [a.size for a in arrays]
    if indexing == "xy" and n >= 2:
        shape[0], shape[1] = shape[1], shape[0]
    out = []
    for i, a in enumerate(arrays):
        axis = i
        if indexing == "xy" and n >= 2 and i < 2:
            axis = 1 - i
        view = [1] * n
        view[axis] = a.size
        out.append(ops.broadcast_to(ops.reshape(a, tuple(view)), tuple(shape)))
    return out


def _tri(x, k, upper: bool) -> Array:
    """x with the elements below (triu) or above (tril) diagonal k set to zero: one kernel
    (``kernels/tri.py``), differentiable (the gradient is the same triangle of the cotangent)."""
    x = _arr(x)
    if x.ndim < 2:
        raise InvalidValueError(f"{'triu' if upper else 'tril'} needs an array of at least 2 dimensions, got {x.ndim}")
    k = index_of(k, "the diagonal offset k")
    n, m = x.shape[-2:]
    k = builtins.max(-n, builtins.min(m, k))  # (past the matrix's corners every k keeps the same)
    return new_node("tri", (ops.dense(x),), (k, upper), x.shape, x.dtype, x.ctx)


def tril(x, /, *, k=0) -> Array:
    return _tri(x, k, False)


def triu(x, /, *, k=0) -> Array:
    return _tri(x, k, True)


# ---- data type functions ------------------------------------------------------------------------

class finfo:  # noqa: N801 - the standard's name
    """Machine limits of a float dtype (bits, eps, max, min, smallest_normal, dtype); of a complex
    dtype, those of its parts (as the standard says)."""

    def __init__(self, dtype) -> None:
        dt = _dt.as_dtype(dtype.dtype if isinstance(dtype, Node) else dtype)
        dt = _dt.REAL_OF.get(dt, dt)
        if not dt.is_float:
            raise InvalidTypeError(f"finfo needs a float dtype, got {dt.name}")
        if dt is _dt.bfloat16:
            self.bits, self.eps, self.max = 16, 2.0**-7, float(np.float32(3.3895314e38))
            self.smallest_normal = 2.0**-126
        else:
            info = np.finfo(dt.storage)
            self.bits, self.eps, self.max = info.bits, float(info.eps), float(info.max)
            self.smallest_normal = float(info.smallest_normal)
        self.min = -self.max
        self.dtype = dt


class iinfo:  # noqa: N801 - the standard's name
    """Limits of an integer dtype (bits, max, min, dtype)."""

    def __init__(self, dtype) -> None:
        dt = _dt.as_dtype(dtype.dtype if isinstance(dtype, Node) else dtype)
        if not dt.is_int:
            raise InvalidTypeError(f"iinfo needs an integer dtype, got {dt.name}")
        self.bits = dt.itemsize * 8
        self.min, self.max = _dt.int_range(dt)
        self.dtype = dt


def result_type(*arrays_and_dtypes) -> _dt.DType:
    dts = []
    scalars = []
    for a in arrays_and_dtypes:
        if isinstance(a, Node):
            dts.append(a.dtype)
        elif isinstance(a, (bool, int, float, complex)) and not isinstance(a, np.generic):
            scalars.append(a)
        else:
            dts.append(_dt.as_dtype(a))
    if not dts:
        raise InvalidValueError("result_type needs at least one array or dtype")
    out = _dt.result_type(*dts)
    for s in scalars:
        out = _dt.weak_scalar_dtype(out, s)
    return out


def can_cast(from_, to, /) -> bool:
    src = from_.dtype if isinstance(from_, Node) else _dt.as_dtype(from_)
    dst = _dt.as_dtype(to)
    if src is _dt.bfloat16 or dst is _dt.bfloat16:
        return src is dst or (dst is not _dt.bfloat16 and dst.is_float and dst.itemsize > 2) or src is _dt.bool_
    return bool(np.can_cast(src.storage, dst.storage, casting="safe"))


_KINDS = {
    "bool": lambda d: d is _dt.bool_,
    "signed integer": lambda d: d.kind == "i",
    "unsigned integer": lambda d: d.kind == "u",
    "integral": lambda d: d.is_int,
    "real floating": lambda d: d.is_float,
    "complex floating": lambda d: d.is_complex,
    "numeric": lambda d: d.is_int or d.is_float or d.is_complex,
}


def isdtype(dtype, kind) -> bool:
    dt = _dt.as_dtype(dtype)
    if isinstance(kind, tuple):
        return builtins.any(isdtype(dt, k) for k in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise InvalidValueError(f"unknown dtype kind {kind!r}")
        return _KINDS[kind](dt)
    return dt is _dt.as_dtype(kind)


def conj(x, /) -> Array:
    """The complex conjugate (x itself for real dtypes)."""
    return ops.conj(_arr(x))


def real(x, /) -> Array:
    """The real part: float32 of complex64, float64 of complex128 (x itself for real dtypes)."""
    return ops.real(_arr(x))


def imag(x, /) -> Array:
    """The imaginary part (zeros for real dtypes)."""
    return ops.imag(_arr(x))


# ---- manipulation -------------------------------------------------------------------------------

def permute_dims(x, /, axes) -> Array:
    return ops.transpose(_arr(x), tuple(index_of(a, "an axis") for a in sequence_of(axes, "permute_dims axes")))


def matrix_transpose(x, /) -> Array:
    x = _arr(x)
    if x.ndim < 2:
        raise InvalidValueError("matrix_transpose needs an array of at least 2 dimensions")
    return ops.swapaxes(x, -1, -2)


def moveaxis(x, source, destination, /) -> Array:
    x = _arr(x)
    src = [normalize_axis(a, x.ndim) for a in (source if isinstance(source, (tuple, list)) else (source,))]
    dst = [normalize_axis(a, x.ndim) for a in (destination if isinstance(destination, (tuple, list))
                                               else (destination,))]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst):
        raise InvalidValueError("moveaxis: source and destination must be distinct axes of the same length")
    order = [a for a in range(x.ndim) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return ops.transpose(x, tuple(order))


def flip(x, /, *, axis=None) -> Array:
    x = _arr(x)
    axes = normalize_axes(axis, x.ndim)
    return x[tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(x.ndim))]


def concat(arrays, /, *, axis=0) -> Array:
    """Join arrays along an axis (None: flattened): one lazy node, each input copied into its window
    of the result (``kernels/concat.py``)."""
    arrays = [_arr(a) for a in sequence_of(arrays, "concat's arrays")]
    if not arrays:
        raise InvalidValueError("concat needs at least one array")
    if axis is None:
        arrays = [ops.reshape(a, (-1,)) for a in arrays]
        axis = 0
    ops.ctx_of(*arrays)
    nd = arrays[0].ndim
    if nd == 0:
        raise InvalidValueError("zero-dimensional arrays cannot be concatenated")
    if builtins.any(a.ndim != nd for a in arrays):
        raise InvalidValueError("all the input arrays must have the same number of dimensions")
    axis = normalize_axis(axis, nd)
    for a in arrays:
        if builtins.any(a.shape[i] != arrays[0].shape[i] for i in range(nd) if i != axis):
            raise InvalidValueError(f"concat: shapes {[a.shape for a in arrays]} differ off axis {axis}")
    dt = _dt.result_type(*(a.dtype for a in arrays))
    arrays = [ops.astype(a, dt) for a in arrays]
    if len(arrays) == 1:
        return ops.copy_array(arrays[0])
    total = builtins.sum(a.shape[axis] for a in arrays)
    shape = arrays[0].shape[:axis] + (total,) + arrays[0].shape[axis + 1:]
    ctx = arrays[0].ctx
    ctx.check_fits(shape, dt)
    return new_node("concat", tuple(ops.dense(a) for a in arrays), (axis,), shape, dt, ctx)


def stack(arrays, /, *, axis=0) -> Array:
    arrays = [_arr(a) for a in sequence_of(arrays, "stack's arrays")]
    if not arrays:
        raise InvalidValueError("stack needs at least one array")
    shape = arrays[0].shape
    if builtins.any(a.shape != shape for a in arrays):
        raise InvalidValueError("all input arrays must have the same shape")
    axis = normalize_axis(axis, len(shape) + 1)
    return concat([ops.expand_dims(a, axis) for a in arrays], axis=axis)


def unstack(x, /, *, axis=0) -> tuple:
    x = _arr(x)
    axis = normalize_axis(axis, x.ndim)
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(x.shape[axis]))


def roll(x, /, shift, *, axis=None) -> Array:
    x = _arr(x)
    if axis is None:
        return ops.reshape(roll(ops.reshape(x, (-1,)), shift, axis=0), x.shape)
    shifts = shift if isinstance(shift, (tuple, list)) else (shift,)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    if len(shifts) != len(axes):
        if len(shifts) == 1:
            shifts = shifts * len(axes)
        else:
            raise InvalidValueError("roll: shift and axis must have the same length")
    out = x
    for s, a in zip(shifts, axes):
        a = normalize_axis(a, x.ndim)
        n = x.shape[a]
        if n == 0:
            continue
        s = index_of(s, "roll's shift") % n
        if s == 0:
            continue
        pre = (slice(None),) * a
        out = concat([out[pre + (slice(n - s, None),)], out[pre + (slice(0, n - s),)]], axis=a)
    return out


def tile(x, repetitions, /) -> Array:
    x = _arr(x)
    if isinstance(repetitions, (int, np.integer)):
        repetitions = (repetitions,)
    reps = tuple(index_of(r, "a repetition count") for r in sequence_of(repetitions, "tile's repetitions"))
    if builtins.any(r < 0 for r in reps):
        raise InvalidValueError(f"tile's repetitions must be non-negative, got {reps}")
    nd = builtins.max(len(reps), x.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    shape = (1,) * (nd - x.ndim) + x.shape
    out_shape = tuple(r * d for r, d in zip(reps, shape))
    x.ctx.check_fits(out_shape, x.dtype)
    expanded = ops.reshape(x, tuple(v for d in shape for v in (1, d)))
    target = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    return ops.reshape(ops.contiguous(ops.broadcast_to(expanded, target)), out_shape)


def _repeat_counts(repeats, n: int) -> int | np.ndarray:
    """``repeats`` as numpy's ``repeat`` takes them: one count for every element, or a 1-D integer
    array of one count (broadcast) or of ``n`` (one an element along the axis), none negative."""
    if isinstance(repeats, Node) or isinstance(repeats, (list, tuple, np.ndarray)):
        counts = np.asarray(repeats.numpy() if isinstance(repeats, Node) else repeats)
        if counts.dtype.kind not in "iub" and not (counts.size == 0 and counts.dtype.kind == "f"):
            raise InvalidTypeError(f"repeats must be integers, got {counts.dtype}")
        counts = counts.astype(np.int64)
        if counts.ndim > 1:
            raise InvalidValueError(f"repeats must be an integer or a 1-D array, got {counts.ndim} dimensions")
        if counts.ndim == 1 and counts.size not in (1, n):
            raise InvalidValueError(f"repeats has {counts.size} counts for an axis of {n} elements")
        if np.any(counts < 0):
            raise InvalidValueError("repeats must be non-negative")
        return int(counts.reshape(-1)[0]) if counts.size == 1 else counts  # (one count: as for an int)
    count = index_of(repeats, "repeats (an integer or an array of integers)")
    if count < 0:
        raise InvalidValueError("repeats must be non-negative")
    return count


def repeat(x, repeats, /, *, axis=None) -> Array:
    x = _arr(x)
    if axis is None:
        x = ops.reshape(x, (-1,))
        axis = 0
    axis = normalize_axis(axis, x.ndim)
    counts = _repeat_counts(repeats, x.shape[axis])
    if isinstance(counts, np.ndarray):  # (read on the host: checked, and the result's length)
        total = int(counts.sum())
        if total > sort_kernels.MAX_N:
            return take(x, _on_host(x, np.repeat(np.arange(x.shape[axis]), counts), _dt.int64), axis=axis)
        # Output j repeats the element whose running count first passes j: a search on the device, so
        # that only the n running counts, not the `total` indices, are uploaded.
        ends = _on_host(x, np.cumsum(counts), _dt.int64)
        index = searchsorted(ends, ops.arange(total, dtype=_dt.int64, device=x.ctx), side="right")
        return take(x, index, axis=axis, mode="clip")  # (in range by construction: nothing to check)
    shape = x.shape
    expanded = ops.expand_dims(x, axis + 1)
    target = shape[:axis + 1] + (counts,) + shape[axis + 1:]
    out_shape = shape[:axis] + (shape[axis] * counts,) + shape[axis + 1:]
    return ops.reshape(ops.contiguous(ops.broadcast_to(expanded, target)), out_shape)


def broadcast_arrays(*arrays) -> list:
    arrays = [_arr(a) for a in arrays]
    shape = broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
    return [ops.broadcast_to(a, shape) for a in arrays]


# ---- indexing -----------------------------------------------------------------------------------

TAKE_MODES = ("raise", "wrap", "clip")


def take(x, indices, /, *, axis=None, mode="raise") -> Array:
    """Elements of x at integer `indices` along `axis` (device gather), with numpy's `mode` for indices
    out of range: "raise" (negative indices count from the end; any other out of range raises
    IndexError: at once for indices given on the host, when the result is read for indices computed on
    the device), "wrap" (modulo the axis length) or "clip" (to the axis, negative indices to 0)."""
    if mode not in TAKE_MODES:
        raise InvalidValueError(f"take mode must be one of 'raise', 'wrap' or 'clip', not {mode!r}")
    x = _arr(x)
    if axis is None:
        if x.ndim > 1:
            raise InvalidValueError("take needs an axis for arrays of more than one dimension")
        axis = 0
    axis = normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    if isinstance(indices, Node):
        if not indices.dtype.is_int:
            raise InvalidTypeError(f"take indices must be integers, got {indices.dtype.name}")
        idx, checked = indices, mode == "raise"
    else:
        host = np.asarray(indices)
        if host.size == 0 and host.dtype.kind not in "iub":
            host = host.astype(np.int64)
        if host.dtype.kind not in "iu":
            raise InvalidTypeError(f"take indices must be integers, got {host.dtype}")
        host = host.astype(np.int64)
        if mode == "raise" and host.size and n and (host.min() < -n or host.max() >= n):
            i = host[(host < -n) | (host >= n)].flat[0]
            raise InvalidIndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
        idx, checked = ops.asarray(host, device=x.ctx), False  # (mapped by the mode in the kernel)
    if idx.size and n == 0:
        raise InvalidIndexError("cannot do a non-empty take from an empty axis")
    ops.ctx_of(x, idx)  # (indices on another device: the usual error, before any work)
    out_shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    return _take_node(x, idx, axis, mode, checked, out_shape, along=False)


def take_params(shape: tuple, axis: int, count: int, mode: str, checked: bool, along: bool = False) -> tuple:
    """A ``take`` node's params (``kernels/take.py``) along `axis` of an array of `shape`: `count`
    indices shared by every position around the axis, or (``along``) `count` along the axis of an
    index array of the output's shape."""
    inner = math.prod(shape[axis + 1:])
    return (mode, count, inner, shape[axis], (count * inner, inner, 1) if along else (0, 1, 0), checked)


def _take_node(x: Array, idx: Array, axis: int, mode: str, checked: bool, out_shape: tuple, along: bool) -> Array:
    """The ``take`` node (``kernels/take.py``) of `x` along `axis` at int indices `idx`: the same
    indices for every position around the axis, or (``along``) one index an output element, `idx`
    of `out_shape` and `x` of it but along the axis."""
    x.ctx.check_fits(out_shape, x.dtype)
    n = x.shape[axis]
    idx = ops.dense(ops.astype(idx, _dt.int64, copy=False))
    if checked and idx.size and 0 in out_shape:
        # Nothing to gather, yet an index computed on the device may be out of range: the indices
        # alone are taken from zeros of the axis' length, and the result is an empty view of that.
        probe = _take_node(ops.zeros((n,), dtype=x.dtype, device=x.ctx), ops.reshape(idx, (-1,)), 0, mode, True,
                           (idx.size,), False)
        return ops.reshape(probe[0:0], out_shape)
    params = take_params(x.shape, axis, out_shape[axis] if along else idx.size, mode, checked, along)
    # A view the kernel reads through its strides (columns of a table, every other row) is taken in
    # place; another is copied first.
    in_place = x.strides is not None and take_kernel.reads_in_place(x.shape, x.strides, x.offset, params[2], n,
                                                                     math.prod(out_shape))
    src = x if in_place else ops.dense(x)
    if checked:
        return ops.checked_node("take", (src, idx), params, out_shape, x.dtype, x.ctx)
    return new_node("take", (src, idx), params, out_shape, x.dtype, x.ctx)


def take_add(values: Array, idx: Array, params: tuple, shape: tuple) -> Array:
    """Zeros of `shape` with each of `values` (of the output shape of the ``take`` with `params` and
    int64 indices `idx`) added where that take read it, indices repeating or not: its transpose
    (``kernels/take.py``). Floats of 32 or 64 bits add in their type, narrower ones in float32,
    complex values part by part, integers in uint64 (wrapping as numpy's ``add.at`` in the
    integer's dtype once cast back)."""
    if values.dtype.is_complex:
        return ops.add(take_add(ops.real(values), idx, params, shape),
                       ops.multiply(take_add(ops.imag(values), idx, params, shape), 1j))
    dt = ops.added_dtype(values.dtype, "take_add")
    v = ops.dense(ops.astype(values, dt, copy=False))
    idx = ops.dense(ops.astype(idx, _dt.int64, copy=False))
    if params[5]:
        return ops.checked_node("take_add", (v, idx), params, shape, dt, values.ctx)
    return new_node("take_add", (v, idx), params, shape, dt, values.ctx)


def take_set(x: Array, values: Array, idx: Array, params: tuple) -> Array:
    """x with the elements the ``take`` with `params` (indices shared by every position around the
    axis) and int64 indices `idx` would read replaced by `values` (of that take's output shape, in
    x's dtype), the last value where indices repeat (``kernels/take.py``)."""
    v = ops.dense(values)
    idx = ops.dense(ops.astype(idx, _dt.int64, copy=False))
    if params[5]:
        return ops.checked_node("take_set", (x, v, idx), params, x.shape, x.dtype, x.ctx)
    return new_node("take_set", (x, v, idx), params, x.shape, x.dtype, x.ctx)


def take_set_gradients(node: Array, k: int, g: Array) -> Array | None:
    """The cotangents of a ``take_set`` node's x (g where no value replaced it) and values (g where
    the value stayed: the last of those naming the same element)."""
    x, values, idx = node.inputs[:3]
    mode, count, inner, n, strides, _ = node.params
    params = (mode, count, inner, n, strides, False)
    if k == 0:
        return take_set(g, ops.zeros(values.shape, dtype=g.dtype, device=g.ctx), idx, params)
    if k != 1:
        return None
    v = ops.reshape(idx, (-1,))
    if mode == "wrap":
        v = ops.remainder(v, n)
    else:
        v = ops.minimum(ops.maximum(ops.where(v < 0, v + n, v) if mode == "raise" else v, 0), n - 1)
    last = ops.astype(ops.scatter_last(v, n), _dt.int64)  # one plus each position's last writer
    won = ops.equal(gather_flat(last, v), ops.arange(1, count + 1, dtype=_dt.int64, device=g.ctx))
    outer = values.size // (count * inner) if count * inner else 0
    taken = ops.reshape(new_node("take", (ops.dense(g), idx), params, (outer, count, inner), g.dtype, g.ctx),
                        values.shape)
    keep = ops.reshape(ops.broadcast_to(ops.reshape(won, (1, count, 1)), (outer, count, inner)), values.shape)
    return ops.where(keep, taken, ops.zeros((), dtype=g.dtype, device=g.ctx))


def take_gradient(node: Array, g: Array) -> Array:
    """The cotangent of a ``take`` node's source: each output element's cotangent added where it
    was read (an index out of range under "raise" made reading the forward result raise; here it
    is clamped)."""
    src, idx = node.inputs[:2]
    mode, count, inner, n, strides, _ = node.params
    added = take_add(g, idx, (mode, count, inner, n, strides, False), src.shape)
    return added if added.dtype is src.dtype else ops.astype(added, src.dtype)


def take_along_axis(x, indices, /, *, axis=-1) -> Array:
    """Elements of x at `indices` along `axis` (numpy's take_along_axis; indices out of range raise
    IndexError: at once for indices given on the host, when the result is read for device arrays)."""
    x = _arr(x)
    host = None if isinstance(indices, Node) else np.asarray(indices)
    if host is not None and host.size == 0 and host.dtype.kind == "f":
        host = host.astype(np.int64)
    if (host.dtype.kind not in "iu") if host is not None else not indices.dtype.is_int:
        got = host.dtype if host is not None else indices.dtype.name
        raise InvalidTypeError(f"take_along_axis indices must be integers, got {got}")
    idx = indices if host is None else ops.asarray(host, device=x.ctx)  # (on x's device)
    if idx.ndim != x.ndim:
        raise InvalidValueError(f"take_along_axis needs indices of as many dimensions as x ({x.ndim}), got {idx.ndim}")
    axis = normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    if host is not None and host.size and host.dtype.kind in "iu" and (host.min() < -n or host.max() >= n):
        i = host[(host < -n) | (host >= n)].flat[0]
        raise InvalidIndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
    ops.ctx_of(x, idx)
    shape = broadcast_shapes(tuple(d if i != axis else 1 for i, d in enumerate(x.shape)),
                             tuple(d if i != axis else 1 for i, d in enumerate(idx.shape)))
    out_shape = shape[:axis] + (idx.shape[axis],) + shape[axis + 1:]
    if idx.size and n == 0:
        raise InvalidIndexError("cannot do a non-empty take_along_axis from an empty axis")
    if idx.shape != out_shape:
        idx = ops.broadcast_to(idx, out_shape)
    x_shape = out_shape[:axis] + (n,) + out_shape[axis + 1:]
    if x.shape != x_shape:
        x = ops.broadcast_to(x, x_shape)
    return _take_node(x, idx, axis, "raise", host is None, out_shape, along=True)


def gather_flat(x: Array, flat, bad=None) -> Array:
    """out[i] = x.flat[flat[i]] (x made contiguous; flat int64 of the output's shape).

    bad: None, or a boolean array broadcasting to the output, True where an index (of any axis) is out
    of range: the gather is then checked on the device, and reading the result (or any array made from
    it) raises IndexError if one was (see kernels/gather.py). Without it, indices are trusted (clamped).
    """
    if not isinstance(flat, Node):
        flat = ops.asarray(np.asarray(flat, np.int64), device=x.ctx)
    ops.ctx_of(x, flat, bad)  # (indices on another device: the usual error, before any work)
    if flat.size and x.size == 0:
        raise InvalidValueError("cannot take elements of an empty array")
    src = ops.contiguous(x)
    flat = ops.astype(flat, _dt.int64)
    if bad is None or flat.size == 0:
        idx = ops.contiguous(flat)
        return ops.new_node("gather", (src, idx), None, idx.shape, x.dtype, x.ctx)
    idx = ops.contiguous(ops.where(bad, -1, flat))
    return ops.checked_node("gather", (src, idx), "raise", idx.shape, x.dtype, x.ctx)


# ---- statistics ---------------------------------------------------------------------------------

def _out_dtype(x: Array, dtype, op: str) -> _dt.DType:
    if dtype is not None:
        return _dt.as_dtype(dtype)
    return _dt.reduction_result(op, x.dtype)


def sum(x, /, *, axis=None, dtype=None, keepdims=False) -> Array:  # noqa: A001
    x = _arr(x)
    dt = _out_dtype(x, dtype, "sum")
    if dtype is not None and dt is not x.dtype:
        x = ops.astype(x, dt)
    r = ops.sum(x, axis=axis, keepdims=keepdims)
    return r if r.dtype is dt else ops.astype(r, dt)


def prod(x, /, *, axis=None, dtype=None, keepdims=False) -> Array:
    x = _arr(x)
    dt = _out_dtype(x, dtype, "prod")
    if dtype is not None and dt is not x.dtype:
        x = ops.astype(x, dt)
    r = ops.reduction("prod", x, axis, keepdims)
    return r if r.dtype is dt else ops.astype(r, dt)


def var(x, /, *, axis=None, correction=0.0, keepdims=False) -> Array:
    x = _arr(x)
    if not isinstance(correction, (int, float, np.integer, np.floating)):
        raise InvalidTypeError(f"var and std take a real correction (degrees of freedom), got {correction!r}")
    correction = float(correction)  # (a Python number: a numpy scalar would promote the result, NEP 50)
    if not x.dtype.is_float:
        x = ops.astype(x, _dt.float_result(x.dtype))
    axes = normalize_axes(axis, x.ndim)
    n = 1
    for a in axes:
        n *= x.shape[a]
    centered = x - ops.mean(x, axis=axes, keepdims=True)
    # complex: numpy's real variance, the mean of |x - mean|^2
    squares = ops.real(centered * ops.conj(centered)) if x.dtype.is_complex else centered * centered
    total = ops.sum(squares, axis=axes, keepdims=keepdims)
    return total / builtins.max(n - correction, 0) if n - correction > 0 else total * nan


def std(x, /, *, axis=None, correction=0.0, keepdims=False) -> Array:
    return ops.sqrt(var(x, axis=axis, correction=correction, keepdims=keepdims))


def _cumulative(combine, x, axis, dtype, include_initial, identity) -> Array:
    """The inclusive scan of `combine` (add or multiply) along `axis`, on the device and differentiable
    (computed on the host, the result was a constant: a gradient through it came out zero, and each
    call sent the array through the host). A sum or product of real values is the scan kernel's
    (``kernels/scan.py``: one pass over the rows; few long rows in chunks, reduced then scanned); the
    rest (complex values, booleans) is Hillis and Steele's: after the step of shift s each element holds
    the combination of the 2s elements ending at it, so log2(n) steps of ops the gradient rules know
    (a slice, a concatenation, the combine). Integer results wrap as numpy's running sum does; float results
    round within a few ulp of numpy's loop."""
    x = _arr(x)
    if axis is None:
        if x.ndim > 1:
            raise InvalidValueError("cumulative functions need an axis for arrays of more than one dimension")
        axis = 0
    axis = normalize_axis(axis, builtins.max(x.ndim, 1))
    dt = _out_dtype(x, dtype, "sum")
    if x.dtype is not dt:
        x = ops.astype(x, dt)
    if x.ndim == 0:
        return ops.copy_array(x)
    n = x.shape[axis]

    def head(count: int) -> Array:  # `count` identities along the axis
        return ops.full(x.shape[:axis] + (count,) + x.shape[axis + 1:], identity, dtype=dt, device=x.ctx)

    if dt in scan.DTYPES:  # the scan kernel
        last = axis == x.ndim - 1  # (the common case, without two transposes' nodes)
        rows = ops.contiguous(x if last else moveaxis(x, axis, -1))
        y = new_node("cumsum" if combine is ops.add else "cumprod", (rows,), None, rows.shape, dt, rows.ctx)
        if not last:
            y = moveaxis(y, -1, axis)
        return concat([head(1), y], axis=axis) if include_initial else y
    y = x
    shift = 1
    while shift < n:
        kept = (slice(None),) * axis + (slice(0, n - shift),)
        y = combine(y, concat([head(shift), y[kept]], axis=axis))
        shift *= 2
    return concat([head(1), y], axis=axis) if include_initial else y


def cumprod_gradient(node: Array, g: Array) -> Array:
    """The cotangent of a ``cumprod`` node's rows (x along the last axis) from its output's, exact
    where x holds zeros (no division): element i's is P(i-1) R(i), P the running product before it
    (the scan kernel, shifted) and R(i) = g(i) + x(i+1) R(i+1), a backward linear recurrence taken
    by doubling (after the step of span s, b(i) sums the terms of g(i) .. g(i+s-1) and a(i) is the
    product of the s elements after i), log2(n) steps of ops the gradient rules know."""
    x = node.inputs[0]
    n = x.shape[-1]

    def shifted(v: Array, by: int, fill: float) -> Array:  # v(i + by), `fill` past the end
        pad = ops.full(v.shape[:-1] + (min(by, n),), fill, dtype=v.dtype, device=v.ctx)
        return concat([v[..., by:], pad], axis=-1) if by < n else pad

    before = concat([ops.full(x.shape[:-1] + (1,), 1, dtype=x.dtype, device=x.ctx),
                     new_node("cumprod", (x,), None, x.shape, x.dtype, x.ctx)[..., :-1]], axis=-1)
    a, b = shifted(x, 1, 0), g
    span = 1
    while span < n:
        b = b + a * shifted(b, span, 0)
        a = a * shifted(a, span, 0)
        span *= 2
    return before * b


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False) -> Array:
    return _cumulative(ops.add, x, axis, dtype, include_initial, 0)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False) -> Array:
    return _cumulative(ops.multiply, x, axis, dtype, include_initial, 1)


def all(x, /, *, axis=None, keepdims=False) -> Array:  # noqa: A001
    x = _arr(x)
    b = x if x.dtype is _dt.bool_ else ops.not_equal(x, 0)
    if b.size == 0:
        return ops.equal(ops.sum(ops.astype(b, _dt.int64), axis=axis, keepdims=keepdims), 0)
    return ops.min(b, axis=axis, keepdims=keepdims)


def any(x, /, *, axis=None, keepdims=False) -> Array:  # noqa: A001
    x = _arr(x)
    b = x if x.dtype is _dt.bool_ else ops.not_equal(x, 0)
    if b.size == 0:
        return ops.not_equal(ops.sum(ops.astype(b, _dt.int64), axis=axis, keepdims=keepdims), 0)
    return ops.max(b, axis=axis, keepdims=keepdims)


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None) -> Array:
    x = _arr(x)
    axis = normalize_axis(axis, x.ndim)
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = concat([_arr(p) for p in parts], axis=axis)
    n = index_of(n, "diff's order n")
    if n < 0:
        raise InvalidValueError(f"diff's order n must be non-negative, got {n}")
    pre = (slice(None),) * axis
    for _ in range(builtins.min(n, x.shape[axis])):  # (past the axis' length the result stays empty)
        a, b = x[pre + (slice(1, None),)], x[pre + (slice(None, -1),)]
        x = ops.not_equal(a, b) if x.dtype is _dt.bool_ else a - b
    return x


def clip(x, /, min=None, max=None) -> Array:  # noqa: A002
    x = _arr(x)
    out = x
    for bound, fn in ((min, ops.maximum), (max, ops.minimum)):
        if bound is None:
            continue
        if isinstance(bound, (list, tuple, np.ndarray)):
            bound = ops.asarray(bound, device=x.ctx)
        if isinstance(bound, Node):
            bound = ops.astype(bound, x.dtype)
        elif x.dtype.is_int and isinstance(bound, (float, np.floating)):
            raise InvalidTypeError("clip bounds of an integer array must be integers")
        elif x.dtype.is_int:
            lo, hi = _dt.int_range(x.dtype)
            bound = builtins.min(builtins.max(index_of(bound, "a clip bound of an integer array"), lo), hi)
        r = fn(out, bound)
        out = r if r.dtype is x.dtype else ops.astype(r, x.dtype)
    if out.shape != x.shape or out is x:
        out = ops.broadcast_to(out, broadcast_shapes(out.shape, x.shape)) if out is not x else ops.copy_array(x)
    return out


def count_nonzero(x, /, *, axis=None, keepdims=False) -> Array:
    x = _arr(x)
    return ops.sum(ops.not_equal(x, 0) if x.dtype is not _dt.bool_ else x, axis=axis, keepdims=keepdims)


def vecdot(x1, x2, /, *, axis=-1) -> Array:
    x1, x2 = _arr(x1), _arr(x2)
    if x1.ndim == 0 or x2.ndim == 0:
        raise InvalidValueError("vecdot needs arrays of at least one dimension")
    if x1.shape[axis] != x2.shape[axis]:
        raise InvalidValueError("vecdot: the contracted axes differ in size")
    dt = _dt.promote(x1.dtype, x2.dtype)
    if dt.is_complex:  # the standard's vecdot conjugates its first operand
        x1 = ops.conj(ops.astype(x1, dt))
    if dt.is_float or dt.is_complex:  # a batched (1 x K) @ (K x 1) product: the device's GEMM library where it has one
        shape = broadcast_shapes(x1.shape, x2.shape)
        axis = normalize_axis(axis, len(shape)) - len(shape)  # negative: the same axis of both operands
        a = ops.expand_dims(moveaxis(x1, axis, -1), -2)
        b = ops.expand_dims(moveaxis(x2, axis, -1), -1)
        product = ops.matmul(ops.astype(a, dt), ops.astype(b, dt))
        return ops.reshape(product, product.shape[:-2])
    return sum(x1 * x2, axis=axis, dtype=dt)


def tensordot(x1, x2, /, *, axes=2) -> Array:
    x1, x2 = _arr(x1), _arr(x2)
    if isinstance(axes, (int, np.integer)):
        axes = index_of(axes, "tensordot's axes")
        if not 0 <= axes <= builtins.min(x1.ndim, x2.ndim):
            raise InvalidValueError(f"tensordot cannot contract {axes} axes of arrays of {x1.ndim} and {x2.ndim} "
                                    "dimensions")
        a1 = tuple(range(x1.ndim - axes, x1.ndim))
        a2 = tuple(range(axes))
    else:
        pair = sequence_of(axes, "tensordot's axes")
        if len(pair) != 2:
            raise InvalidValueError(f"tensordot's axes must be an integer or two sequences of axes, got {axes!r}")
        # (each side a sequence of axes, or one axis, as numpy takes them)
        side1, side2 = ([side] if isinstance(side, (int, np.integer)) else side for side in pair)
        a1 = tuple(normalize_axis(a, x1.ndim) for a in sequence_of(side1, "tensordot's axes of x1"))
        a2 = tuple(normalize_axis(a, x2.ndim) for a in sequence_of(side2, "tensordot's axes of x2"))
        if len(a1) != len(a2):
            raise InvalidValueError(f"tensordot contracts as many axes of x1 as of x2, got {len(a1)} and {len(a2)}")
    free1 = [a for a in range(x1.ndim) if a not in a1]
    free2 = [a for a in range(x2.ndim) if a not in a2]
    k = int(np.prod([x1.shape[a] for a in a1], dtype=np.int64))
    if k != int(np.prod([x2.shape[a] for a in a2], dtype=np.int64)):
        raise InvalidValueError("tensordot: the contracted axes differ in size")
    m = int(np.prod([x1.shape[a] for a in free1], dtype=np.int64))
    n = int(np.prod([x2.shape[a] for a in free2], dtype=np.int64))
    a = ops.reshape(ops.transpose(x1, tuple(free1) + a1), (m, k))
    b = ops.reshape(ops.transpose(x2, a2 + tuple(free2)), (k, n))
    return ops.reshape(ops.matmul(a, b), tuple(x1.shape[i] for i in free1) + tuple(x2.shape[i] for i in free2))


# ---- searching, sorting, sets -----------------------------------------------------------------
# Sorts, searches, nonzero, boolean masks and unique of real dtypes run on the device (a selection reads
# its count back); complex values, and rows past the kernels' length limit, on the host, their results
# uploaded to the array's device.

def flat_nonzero(mask: Array) -> Array:
    """The int64 positions of the True elements of the boolean array `mask` (flattened, in order),
    compacted on the device (``kernels/compact.py``). The count is read on the host, as the result's
    shape depends on it."""
    m = ops.contiguous(ops.reshape(mask, (-1,)))
    n = m.size
    if n == 0:
        return ops.zeros((0,), dtype=_dt.int64, device=mask.ctx)
    if n > compact.MAX_N:
        return _on_host(mask, np.flatnonzero(np.asarray(m.numpy())).astype(np.int64), _dt.int64)
    counts = new_node("mask_count", (m,), None, (compact.tiles(n),), _dt.int64, mask.ctx)
    ends = cumulative_sum(counts)  # each tile's last output, plus one
    try:
        total = int(np.asarray(ends[-1].numpy()))
    except TracingError as exc:
        raise TracingError("nonzero, boolean-mask indexing and the unique functions give arrays whose shape "
                           "depends on the data, which rt.compile cannot trace: compute the mask in the compiled "
                           "function and select outside it (or use where)") from exc
    return new_node("compact", (m, ends), None, (total,), _dt.int64, mask.ctx)


def unravel(flat: Array, shape: tuple) -> tuple:
    """The per-axis indices of C-order positions `flat` in an array of `shape`."""
    if len(shape) == 1:
        return (flat,)
    out = []
    stride = 1
    for d in reversed(shape):
        out.append(ops.remainder(ops.floor_divide(flat, stride), d) if stride > 1 else ops.remainder(flat, d))
        stride *= d
    return tuple(reversed(out))


def nonzero(x, /) -> tuple:
    """The indices of x's nonzero elements, one int64 array an axis, found on the device."""
    x = _arr(x)
    if x.ndim == 0:
        raise InvalidValueError("nonzero is not defined for 0-d arrays")
    mask = x if x.dtype is _dt.bool_ else ops.not_equal(x, 0)
    return unravel(flat_nonzero(mask), x.shape)


def searchsorted(x1, x2, /, *, side="left", sorter=None) -> Array:
    """Insertion points of x2's values in the sorted 1-D x1 (numpy's, NaNs last), a binary search on the
    device for real dtypes (``kernels/sort.py``); complex values are searched on the host."""
    x1 = _arr(x1)
    x2 = x2 if isinstance(x2, Node) else ops.asarray(x2, device=x1.ctx)  # (values given on the host: x1's device)
    if x1.ndim != 1:
        raise InvalidValueError(f"searchsorted needs a 1-D x1, got {x1.ndim} dimensions")
    if side not in ("left", "right"):
        raise InvalidValueError(f"side must be 'left' or 'right', got {side!r}")
    dt = _dt.promote(x1.dtype, x2.dtype)
    if sorter is not None:
        sorter = sorter if isinstance(sorter, Node) else ops.asarray(sorter, device=x1.ctx)
        if not sorter.dtype.is_int or sorter.shape != x1.shape:
            raise InvalidValueError(f"searchsorted's sorter must be integer indices of x1's shape {x1.shape}, "
                                    f"got {sorter.dtype.name} of shape {sorter.shape}")
    ops.ctx_of(x1, x2, sorter)  # (arrays on several devices: the usual error, before any work)
    if not sort_kernels.takes(dt, builtins.max(x1.size, x2.size)):
        a = np.asarray(x1.astype(dt).numpy())
        v = np.asarray(x2.astype(dt).numpy())
        srt = None if sorter is None else np.asarray(sorter.numpy())
        return _on_host(x2, np.searchsorted(a, v, side=side, sorter=srt).astype(np.int64), _dt.int64)
    a = ops.astype(x1, dt)
    if sorter is not None:
        a = take(a, sorter)
    values = ops.contiguous(ops.astype(x2, dt))
    return new_node("searchsorted", (ops.contiguous(a), values), side == "right", x2.shape, _dt.int64, x1.ctx)


def _order(x: Array, axis: int, descending: bool) -> np.ndarray:
    """The stable order of x's elements along `axis` (numpy's, on the host), descending: equal
    elements keep their order. For complex values, and rows past the kernels' length limit."""
    host = np.asarray(x.numpy())
    if descending:
        n = host.shape[axis]
        return (n - 1 - np.flip(np.argsort(np.flip(host, axis), axis=axis, kind="stable"), axis)).astype(np.int64)
    return np.argsort(host, axis=axis, kind="stable").astype(np.int64)


def _sorted_rows(op: str, x: Array, axis: int, descending: bool) -> Array:
    """The "sort" or "argsort" node over x's rows along `axis` (``kernels/sort.py``), moved back."""
    last = axis == x.ndim - 1
    rows = ops.contiguous(x if last else moveaxis(x, axis, -1))
    dt = _dt.int64 if op == "argsort" else x.dtype
    y = new_node(op, (rows,), bool(descending), rows.shape, dt, x.ctx)
    return y if last else moveaxis(y, -1, axis)


def sort(x, /, *, axis=-1, descending=False, stable=True) -> Array:
    """x sorted along `axis` (stable; NaNs last, first when descending), on the device for real dtypes.
    Under a gradient, x gathered in argsort's order: the gradient goes back to where each came from."""
    x = _arr(x)
    if x.ndim == 0:
        return ops.copy_array(x)
    axis = normalize_axis(axis, x.ndim)
    if not sort_kernels.takes(x.dtype, x.shape[axis]):
        return take_along_axis(x, _order(x, axis, descending), axis=axis)
    if differentiated(x):
        return take_along_axis(x, _sorted_rows("argsort", x, axis, descending), axis=axis)
    return _sorted_rows("sort", x, axis, descending)


def argsort(x, /, *, axis=-1, descending=False, stable=True) -> Array:
    """The positions that sort x along `axis` (numpy's stable order), on the device for real dtypes."""
    x = _arr(x)
    if x.ndim == 0:
        return _on_host(x, np.zeros((), np.int64), _dt.int64)
    axis = normalize_axis(axis, x.ndim)
    if not sort_kernels.takes(x.dtype, x.shape[axis]):
        return _on_host(x, _order(x, axis, descending), _dt.int64)
    return _sorted_rows("argsort", x, axis, descending)


class _Unique(NamedTuple):
    """What the unique functions return, as device arrays: the distinct values in ascending order
    (every NaN distinct, as the standard asks), the first position of each in x (flattened), each
    element's value's place among them (x's shape), and how many times each occurs."""

    values: Array
    indices: Array
    inverse: Array
    counts: Array


def _unique(x) -> _Unique:
    """x's distinct values, on the device for real dtypes: a stable sort of the flattened x, the
    positions where the sorted value changes (compacted: their count is read on the host, as it sizes
    the results), the values, first positions and counts there, and each element's place (the running
    count of changes) put back in x's order by a scatter through the sort's order. Complex values
    (ordered lexicographically) on the host."""
    x = _arr(x)
    if differentiated(x):
        raise hal.UnimplementedError("the unique functions have no gradient (their results are selections found "
                                     "by comparing values): differentiate before them, or sort and compare")
    flat = ops.reshape(x, (-1,))
    n = flat.size
    if not (sort_kernels.takes(x.dtype, n) and n <= compact.MAX_N):
        values, index, inverse, counts = np.unique(np.asarray(flat.numpy()), return_index=True,
                                                   return_inverse=True, return_counts=True, equal_nan=False)
        return _Unique(_on_host(x, values, x.dtype), _on_host(x, index.astype(np.int64), _dt.int64),
                       _on_host(x, inverse.reshape(x.shape).astype(np.int64), _dt.int64),
                       _on_host(x, counts.astype(np.int64), _dt.int64))
    if n == 0:
        empty = ops.zeros((0,), dtype=_dt.int64, device=x.ctx)
        return _Unique(ops.zeros((0,), dtype=x.dtype, device=x.ctx), empty, ops.reshape(empty, x.shape), empty)
    order = argsort(flat)
    ordered = gather_flat(flat, order)
    changes = concat([ops.full((1,), True, dtype=_dt.bool_, device=x.ctx),
                      ops.not_equal(ordered[1:], ordered[:-1])])  # (NaN != NaN: each NaN its own value)
    starts = flat_nonzero(changes)
    ends = concat([starts[1:], ops.full((1,), n, dtype=_dt.int64, device=x.ctx)])
    place = ops.subtract(cumulative_sum(ops.astype(changes, _dt.int64)), 1)  # each sorted element's value's place
    # Put back in x's order by scattering to `order` (a permutation: each output written once), one pass
    # where a second sort (argsort(order)) made several.
    inverse = ops.reshape(ops.astype(ops.scatter_add(place, order, n), _dt.int64), x.shape)
    return _Unique(gather_flat(ordered, starts), gather_flat(order, starts), inverse, ops.subtract(ends, starts))


def unique_values(x, /) -> Array:
    return _unique(x).values


class UniqueCountsResult(NamedTuple):
    values: Array
    counts: Array


class UniqueInverseResult(NamedTuple):
    values: Array
    inverse_indices: Array


class UniqueAllResult(NamedTuple):
    values: Array
    indices: Array
    inverse_indices: Array
    counts: Array


def unique_counts(x, /) -> UniqueCountsResult:
    u = _unique(x)
    return UniqueCountsResult(u.values, u.counts)


def unique_inverse(x, /) -> UniqueInverseResult:
    u = _unique(x)
    return UniqueInverseResult(u.values, u.inverse)


def unique_all(x, /) -> UniqueAllResult:
    u = _unique(x)
    return UniqueAllResult(u.values, u.indices, u.inverse, u.counts)


# ---- inspection ---------------------------------------------------------------------------------

class _Info:
    """What `__array_namespace_info__()` returns: the namespace's capabilities, devices and dtypes."""

    def capabilities(self) -> dict:
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 8}

    def default_device(self):
        return context_for(None).device

    def default_dtypes(self, *, device=None) -> dict:
        return {"real floating": _dt.DEFAULT_FLOAT, "complex floating": _dt.DEFAULT_COMPLEX,
                "integral": _dt.DEFAULT_INT,
                "indexing": _dt.INDEX}

    def devices(self) -> list:
        return [context_for(None).device]

    def dtypes(self, *, device=None, kind=None) -> dict:
        names = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
                 "float64", "complex64", "complex128")
        out = {n: _dt.as_dtype(n) for n in names}
        if kind is None:
            return out
        return {n: d for n, d in out.items() if isdtype(d, kind)}


def __array_namespace_info__() -> _Info:
    return _Info()
