"""The array API's ``fft`` extension (2024.12): ``rt.fft.fft(x)``, or ``xp.fft`` of ``x.__array_namespace__()``.

Transforms are lazy ``fft`` nodes that lower to ``hal.Fft`` library dispatches (``kernels/fft.py``):
cuFFT on CUDA, hipFFT on HIP, numpy's pocketfft (the routine's reference) on the CPU drivers. A GPU
whose FFT library did not load has no FFTs: building one raises ``hal.UnimplementedError`` naming
the library, never a wrong answer.

- dtypes: complex64 and complex128 transforms, float32 and float64 real data; real input of the
  complex transforms (fft, ifft, fftn, ifftn, irfft, irfftn, hfft) is promoted to the matching
  complex dtype, float16/bfloat16 to complex64/float32; integer and bool input, and complex input
  of the real transforms (rfft, rfftn, ihfft), raise ``InvalidTypeError``.
- ``n``/``s`` pad the input with zeros or trim it along each transformed axis (for irfft the
  complex input to ``n // 2 + 1``); ``s[i] == -1`` keeps axis i's length (``2 * (m - 1)`` for the
  output of the last axis of irfftn). ``axes`` default to all axes, or the last ``len(s)``.
- ``norm``: "backward" (no scaling forward, ``1/n`` inverse), "ortho" (``1/sqrt(n)`` both ways),
  "forward" (``1/n`` forward, none inverse); the scaling is one multiply the GPU fuses with what
  reads it.
- Up to three axes go to one dispatch when they are the trailing axes or one leading block; other
  axes are moved to the end first (a transposing copy), more than three take a dispatch per group
  of three.
- Gradients (``rt.grad``): the transforms are linear, their vector-Jacobian products the transposed
  transforms in JAX's convention for complex cotangents (``runtime/autodiff.py``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

import hal
from hal.library_fft import FFT_MAX_RANK

from . import array_api, ops
from . import dtypes as _dt
from .device import context_for
from .errors import InvalidTypeError, InvalidValueError
from .graph import Node, new_node, upload
from .kernels import fft as _kernels
from .kernels.source import executable
from .shapes import normalize_axis

__all__ = ["fft", "fftfreq", "fftn", "fftshift", "hfft", "ifft", "ifftn", "ifftshift", "ihfft", "irfft", "irfftn",
           "rfft", "rfftfreq", "rfftn"]

NORMS = ("backward", "ortho", "forward")
_SWAPPED = {"backward": "forward", "ortho": "ortho", "forward": "backward"}
#: The library each GPU vendor's FFTs need, for the message of a device without it.
_LIBRARIES = {"cuda": "cuFFT (nvmath-python and nvidia-cufft: pip install 'hal-gpu[cuda]')",
              "hip": "hipFFT (hip-python's hipfft and ROCm's libhipfft)"}


# ---- argument checks --------------------------------------------------------------------------------

def _array(x, what: str) -> Node:
    if not isinstance(x, Node):
        x = ops.asarray(x)
    return x


def _complex_input(x: Node, name: str) -> Node:
    """x as the complex dtype a complex transform takes (real floats promoted)."""
    dt = x.dtype
    if dt.is_complex:
        return x
    if not dt.is_float:
        raise InvalidTypeError(f"fft.{name} takes a floating-point or complex array, not {dt.name}")
    return ops.astype(x, _dt.COMPLEX_OF[dt])


def _real_input(x: Node, name: str) -> Node:
    """x as the real dtype a real-input transform takes (float32 or float64)."""
    dt = x.dtype
    if not dt.is_float:
        raise InvalidTypeError(f"fft.{name} takes a real floating-point array, not {dt.name}")
    if dt is _dt.float16 or dt is _dt.bfloat16:
        return ops.astype(x, _dt.float32)
    return x


def _norm(norm) -> str:
    if norm not in NORMS:
        raise InvalidValueError(f"norm must be one of {NORMS}, got {norm!r}")
    return norm


def _length(n, what: str) -> int:
    try:
        n = operator.index(n)
    except TypeError:
        raise InvalidTypeError(f"{what} must be an int, got {n!r}") from None
    if n < 1:
        raise InvalidValueError(f"invalid number of data points ({n}) for {what}: it must be >= 1")
    return n


def _axes_and_lengths(x: Node, s, axes, name: str) -> tuple[tuple[int, ...], list[int | None]]:
    """(normalized axes in the given order, the requested length of each: None to keep it)."""
    if axes is None:
        if s is None:
            axes = tuple(range(x.ndim))
        else:
            if not isinstance(s, Sequence):
                raise InvalidTypeError(f"fft.{name}: s must be a sequence of ints, got {s!r}")
            if len(s) > x.ndim:
                raise InvalidValueError(f"fft.{name}: s has {len(s)} entries, the array {x.ndim} dims")
            axes = tuple(range(x.ndim - len(s), x.ndim))
    elif not isinstance(axes, Sequence):
        raise InvalidTypeError(f"fft.{name}: axes must be a sequence of ints, got {axes!r}")
    axes = tuple(normalize_axis(a, x.ndim) for a in axes)
    if len(set(axes)) != len(axes):
        raise InvalidValueError(f"fft.{name}: repeated axis in {axes}")
    if s is None:
        return axes, [None] * len(axes)
    if not isinstance(s, Sequence):
        raise InvalidTypeError(f"fft.{name}: s must be a sequence of ints, got {s!r}")
    if len(s) != len(axes):
        raise InvalidValueError(f"fft.{name}: s has {len(s)} entries for {len(axes)} axes")
    lengths: list[int | None] = []
    for v in s:
        try:
            v = operator.index(v)
        except TypeError:
            raise InvalidTypeError(f"fft.{name}: s must be a sequence of ints, got {s!r}") from None
        lengths.append(None if v == -1 else _length(v, f"fft.{name}'s s"))
    return axes, lengths


def _resized(x: Node, axis: int, length: int) -> Node:
    """x trimmed or zero-padded (at the end) to ``length`` along ``axis``."""
    m = x.shape[axis]
    if length == m:
        return x
    if length < m:
        return x[(slice(None),) * axis + (slice(0, length),)]
    shape = x.shape[:axis] + (length,) + x.shape[axis + 1:]
    info = tuple((0, 1, d, True) for d in x.shape)
    if x.size == 0:
        return ops.zeros(shape, dtype=x.dtype, device=x.ctx)
    return ops.pad_slice(ops.contiguous(x), shape, info)


def _scaled(y: Node, points: int, norm: str, inverse: bool) -> Node:
    if norm == "ortho":
        factor = 1 / math.sqrt(points)
    elif (norm == "forward") != inverse:
        factor = 1 / points
    else:
        return y
    return y * factor


# ---- the unnormalized transforms as nodes ----------------------------------------------------------

def _require_library(ctx, src) -> None:
    """Raise UnimplementedError, naming the library, when the device cannot run the routine."""
    if not ctx.is_gpu:
        return  # (the CPU drivers run the reference)
    try:
        executable(ctx, src)
    except (hal.UnimplementedError, hal.IncompatibleError) as exc:
        vendor = ctx.device.info.driver
        library = _LIBRARIES.get(vendor, "an FFT library")
        raise hal.UnimplementedError(
            f"FFTs on {ctx.device.info.uri} need {library}, which this device does not run: {exc}") from exc


def _node(x: Node, transform: str, direction: str, axes: tuple, out_len: int | None) -> Node:
    """One fft node over ``axes`` (at most three) of x, arranged so one dispatch does it."""
    if _kernels.layout(x.shape, axes) is None:  # move the axes to the end, in their order
        rest = tuple(a for a in range(x.ndim) if a not in axes)
        perm = rest + axes
        moved = _node(ops.transpose(x, perm), transform, direction, tuple(range(len(rest), x.ndim)), out_len)
        inverse = [0] * x.ndim
        for i, p in enumerate(perm):
            inverse[p] = i
        return ops.transpose(moved, tuple(inverse))
    shape = list(x.shape)
    if transform == "r2c":
        shape[axes[-1]] = x.shape[axes[-1]] // 2 + 1
        dt = _dt.COMPLEX_OF[x.dtype]
    elif transform == "c2r":
        shape[axes[-1]] = out_len
        dt = _dt.REAL_OF[x.dtype]
    else:
        dt = x.dtype
    shape = tuple(shape)
    x.ctx.check_fits(shape, dt)
    consts = _kernels.constants(transform, x.shape, shape, axes)
    if consts is not None and any(c > 0xFFFFFFFF for c in consts):
        raise hal.UnimplementedError(f"an FFT of {x.shape} over axes {axes} is too large for one dispatch")
    src = _kernels.fft_source(transform, direction, (dt if dt.is_complex else x.dtype).name)
    _require_library(x.ctx, src)
    return new_node("fft", (ops.contiguous(x),), (transform, direction, axes), shape, dt, x.ctx)


def _groups(axes: tuple) -> list[tuple]:
    """axes in groups of at most FFT_MAX_RANK, the last group holding the last axis."""
    first = len(axes) % FFT_MAX_RANK or FFT_MAX_RANK
    groups = [axes[:first]] if len(axes) > FFT_MAX_RANK else []
    rest = axes[first:] if groups else axes
    groups += [rest[i:i + FFT_MAX_RANK] for i in range(0, len(rest), FFT_MAX_RANK)]
    return groups


def transform(x: Node, kind: str, direction: str, axes: tuple, out_len: int | None = None) -> Node:
    """The unnormalized transform ``kind`` ("c2c", "r2c", "c2r") of x over ``axes`` (the halved axis
    of r2c/c2r last; ``out_len``: c2r's output length along it), x already of the transform's input
    dtype and lengths. Empty arrays give empty results of the output's shape."""
    if not axes:
        return ops.copy_array(x)
    groups = _groups(axes)
    if kind == "r2c":  # the real axes first, then the others as complex transforms
        y = _node(x, "r2c", "forward", groups[-1], None)
        for group in groups[:-1]:
            y = _node(y, "c2c", "forward", group, None)
        return y
    if kind == "c2r":
        y = x
        for group in groups[:-1]:
            y = _node(y, "c2c", "inverse", group, None)
        return _node(y, "c2r", "inverse", groups[-1], out_len)
    for group in reversed(groups):
        x = _node(x, "c2c", direction, group, None)
    return x


# ---- the standard's functions ----------------------------------------------------------------------

def _c2c(x, s, axes, norm: str, inverse: bool, name: str) -> Node:
    x = _complex_input(_array(x, name), name)
    norm = _norm(norm)
    axes, lengths = _axes_and_lengths(x, s, axes, name)
    for axis, length in zip(axes, lengths):
        length = length if length is not None else _length(x.shape[axis], f"fft.{name} along axis {axis}")
        x = _resized(x, axis, length)
    points = math.prod(x.shape[a] for a in axes)
    y = transform(x, "c2c", "inverse" if inverse else "forward", tuple(sorted(axes)))
    return _scaled(y, points, norm, inverse)


def _r2c(x, s, axes, norm: str, name: str) -> Node:
    x = _real_input(_array(x, name), name)
    norm = _norm(norm)
    axes, lengths = _axes_and_lengths(x, s, axes, name)
    if not axes:
        return ops.astype(x, _dt.COMPLEX_OF[x.dtype])
    for axis, length in zip(axes, lengths):
        length = length if length is not None else _length(x.shape[axis], f"fft.{name} along axis {axis}")
        x = _resized(x, axis, length)
    points = math.prod(x.shape[a] for a in axes)
    return _scaled(transform(x, "r2c", "forward", axes), points, norm, False)


def _c2r(x, s, axes, norm: str, name: str) -> Node:
    x = _complex_input(_array(x, name), name)
    norm = _norm(norm)
    axes, lengths = _axes_and_lengths(x, s, axes, name)
    if not axes:
        return ops.real(x)
    last = axes[-1]
    out_len = lengths[-1]
    if out_len is None:
        out_len = _length(2 * (x.shape[last] - 1), f"fft.{name}'s output along axis {last}")
    for axis, length in zip(axes[:-1], lengths[:-1]):
        length = length if length is not None else _length(x.shape[axis], f"fft.{name} along axis {axis}")
        x = _resized(x, axis, length)
    x = _resized(x, last, out_len // 2 + 1)
    points = math.prod(x.shape[a] for a in axes[:-1]) * out_len
    return _scaled(transform(x, "c2r", "inverse", axes, out_len), points, norm, True)


def _single(n, axis) -> tuple:
    if n is not None:
        _length(n, "n")
    try:
        axis = operator.index(axis)
    except TypeError:
        raise InvalidTypeError(f"axis must be an int, got {axis!r}") from None
    return (None if n is None else [n]), [axis]


def fft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional discrete Fourier transform along ``axis``."""
    s, axes = _single(n, axis)
    return _c2c(x, s, axes, norm, False, "fft")


def ifft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional inverse discrete Fourier transform along ``axis``."""
    s, axes = _single(n, axis)
    return _c2c(x, s, axes, norm, True, "ifft")


def fftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional discrete Fourier transform over ``axes``."""
    return _c2c(x, s, axes, norm, False, "fftn")


def ifftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional inverse discrete Fourier transform over ``axes``."""
    return _c2c(x, s, axes, norm, True, "ifftn")


def rfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional transform of real input: the ``n // 2 + 1`` non-negative frequencies."""
    s, axes = _single(n, axis)
    return _r2c(x, s, axes, norm, "rfft")


def irfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of ``rfft``: ``n`` real points (default ``2 * (m - 1)``) from ``m`` frequencies."""
    s, axes = _single(n, axis)
    return _c2r(x, s, axes, norm, "irfft")


def rfftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional transform of real input (the last of ``axes`` halved)."""
    return _r2c(x, s, axes, norm, "rfftn")


def irfftn(x, /, *, s=None, axes=None, norm="backward"):
    """The inverse of ``rfftn``."""
    return _c2r(x, s, axes, norm, "irfftn")


def hfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The transform of a Hermitian-symmetric signal given by its first half: a real spectrum."""
    s, axes = _single(n, axis)
    x = _complex_input(_array(x, "hfft"), "hfft")
    return _c2r(ops.conj(x), s, axes, _SWAPPED[_norm(norm)], "hfft")


def ihfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of ``hfft``: the first half of the Hermitian spectrum of real input."""
    s, axes = _single(n, axis)
    return ops.conj(_r2c(x, s, axes, _SWAPPED[_norm(norm)], "ihfft"))


def _freq_dtype(dtype) -> _dt.DType:
    dt = _dt.as_dtype(dtype) if dtype is not None else _dt.DEFAULT_FLOAT
    if not dt.is_float:
        raise InvalidTypeError(f"sample frequencies are real floating-point values, not {dt.name}")
    return dt


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of an ``n``-point transform with sample spacing ``d``."""
    n = _length(n, "fftfreq's n")
    dt = _freq_dtype(dtype)
    ctx = context_for(device)
    ctx.check_fits((n,), dt)
    return upload(np.fft.fftfreq(n, d), dt, ctx)


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The non-negative sample frequencies of an ``n``-point ``rfft``."""
    n = _length(n, "rfftfreq's n")
    dt = _freq_dtype(dtype)
    ctx = context_for(device)
    ctx.check_fits((n // 2 + 1,), dt)
    return upload(np.fft.rfftfreq(n, d), dt, ctx)


def _shift(x, axes, sign: int, name: str) -> Node:
    x = _array(x, name)
    if axes is None:
        axes = tuple(range(x.ndim))
    elif not isinstance(axes, Sequence):
        axes = (axes,)
    axes = tuple(normalize_axis(a, x.ndim) for a in axes)
    if not axes:
        return ops.copy_array(x)
    return array_api.roll(x, tuple(sign * (x.shape[a] // 2) for a in axes), axis=axes)


def fftshift(x, /, *, axes=None):
    """x with the zero frequency moved to the middle of each of ``axes`` (default: all)."""
    return _shift(x, axes, 1, "fftshift")


def ifftshift(x, /, *, axes=None):
    """The inverse of ``fftshift``."""
    return _shift(x, axes, -1, "ifftshift")


# ---- gradients (runtime/autodiff.py) ----------------------------------------------------------------

def _hermitian_weights(n: int, m: int, dt: _dt.DType, ctx) -> np.ndarray:
    """How often each of c2r's m input frequencies counts in its n outputs: 1 at zero and (n even)
    at the Nyquist frequency, 2 elsewhere."""
    w = np.full(m, 2.0)
    w[0] = 1.0
    if n % 2 == 0:
        w[-1] = 1.0
    return upload(w, dt, ctx)


def vjp(node: Node, g: Node) -> Node:
    """The cotangent of an fft node's input from its output's (JAX's convention: the transposed
    linear map; the DFT matrix is symmetric, so a c2c node's is the same transform)."""
    kind, direction, axes = node.params
    x = node.inputs[0]
    if kind == "c2c":
        return transform(ops.astype(g, node.dtype), "c2c", direction, axes)
    last = axes[-1]
    if kind == "r2c":  # the real part of the forward transform of the half spectrum, zero-padded
        g = _resized(ops.astype(g, node.dtype), last, x.shape[last])
        return ops.real(transform(g, "c2c", "forward", axes))
    n = node.shape[last]
    spectrum = transform(ops.astype(g, node.dtype), "r2c", "forward", axes)
    weights = _hermitian_weights(n, spectrum.shape[last], node.dtype, g.ctx)
    weights = ops.reshape(weights, (-1,) + (1,) * (x.ndim - 1 - last))
    return ops.conj(spectrum * weights)
