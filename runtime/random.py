"""Counter-based random numbers (Philox4x32-10): identical streams on every device for a key.

A key is an int32 array of shape (2,). `split` derives new keys from the
generator itself, so a training loop can draw fresh numbers without host work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import hal

from . import dtypes as _dt
from . import ops
from .device import context_for
from .errors import InvalidTypeError, InvalidValueError
from .graph import Node, new_node, upload
from .kernels.elementwise import np_nextafter16
from .shapes import check_shape, index_of

if TYPE_CHECKING:
    from .array import Array


def key(seed: int, device=None) -> Array:
    """A key from an integer seed (the seed's low and high 32-bit words)."""
    seed = index_of(seed, "a random seed") & 0xFFFFFFFFFFFFFFFF
    words = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32).view(np.int32)
    return upload(words, _dt.int32, context_for(device))


def _check_key(k) -> Array:
    if not isinstance(k, Node) or k.shape != (2,) or k.dtype is not _dt.int32:
        raise hal.InvalidArgumentError("a random key is an int32 array of shape (2,), from rt.random.key(seed)")
    return k


def _default_key() -> Array:
    _state[0] += 1
    return key(_state[0] * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF)


_state = [0]


def seed(value: int) -> None:
    """Reset the implicit key sequence used when no key is given."""
    _state[0] = index_of(value, "a random seed")


def bits(shape, key: Array | None = None) -> Array:
    k = _check_key(key if key is not None else _default_key())
    shape = check_shape(shape)
    k.ctx.check_fits(shape, _dt.int32)
    return new_node("random", (k,), "bits", shape, _dt.int32, k.ctx)


def split(key: Array, num: int = 2) -> Array:
    """`num` new keys (shape (num, 2)); index the result to get each key."""
    return bits((num, 2), key)


def uniform(shape=(), key: Array | None = None, dtype=_dt.float32, low=0.0, high=1.0) -> Array:
    """Uniform values in [low, high) of ``shape`` (``low`` and ``high`` numbers or arrays that
    broadcast to it). The half-open bound holds in ``dtype`` too: a value that the scaling rounds
    up to ``high`` (bfloat16 in [1, 2) does) is the largest one below it instead."""
    dt = _dt.as_dtype(dtype)
    if not dt.is_float:
        raise hal.InvalidArgumentError("uniform needs a float dtype")
    k = _check_key(key if key is not None else _default_key())
    shape = check_shape(shape)
    k.ctx.check_fits(shape, dt)
    u = new_node("random", (k,), "uniform", shape, dt, k.ctx)
    if not (_given(low, 0.0) or _given(high, 1.0)):
        return u  # (the kernel's values are below 1 in every dtype)
    if isinstance(low, (Node, np.ndarray)) or isinstance(high, (Node, np.ndarray)):
        low, high = (ops.astype(ops.asarray(v, device=k.ctx.device), dt) for v in (low, high))
        bound = ops.nextafter(high, low)
        scaled = u * (high - low) + low
        return _shaped(ops.where(high >= low, ops.minimum(scaled, bound), ops.maximum(scaled, bound)), shape,
                       "low and high")
    for name, value in (("low", low), ("high", high)):
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidTypeError(f"uniform: {name} must be a real number or an array, got {type(value).__name__}")
    low, high = float(low), float(high)
    bound = _next_toward(high, low, dt)
    scaled = u * (high - low) + low
    return ops.minimum(scaled, bound) if high >= low else ops.maximum(scaled, bound)


def normal(shape=(), key: Array | None = None, dtype=_dt.float32, loc=0.0, scale=1.0) -> Array:
    """Normal values of mean ``loc`` and standard deviation ``scale`` (numbers or arrays that
    broadcast to ``shape``)."""
    dt = _dt.as_dtype(dtype)
    if not dt.is_float:
        raise hal.InvalidArgumentError("normal needs a float dtype")
    k = _check_key(key if key is not None else _default_key())
    shape = check_shape(shape)
    k.ctx.check_fits(shape, dt)
    z = new_node("random", (k,), "normal", shape, dt, k.ctx)
    if _given(scale, 1.0):
        z = _shaped(z * ops.astype(ops.asarray(scale, device=k.ctx.device), dt), shape, "scale")
    if _given(loc, 0.0):
        z = _shaped(z + ops.astype(ops.asarray(loc, device=k.ctx.device), dt), shape, "loc")
    return z


def _next_toward(value: float, toward: float, dt) -> float:
    """The value of ``dt`` next to ``value`` (rounded to ``dt``) in the direction of ``toward``: the
    bound that keeps ``uniform``'s interval half-open after the scaling rounds."""
    if dt is _dt.bfloat16:  # (numpy has no bfloat16: its values in float32, stepped in its format)
        rounded = _dt.from_bfloat16_bits(_dt.to_bfloat16_bits(np.array([value], np.float32)))
        return float(np_nextafter16(rounded, np.float32(toward))[0])
    host = np.dtype(dt.storage).type
    return float(np.nextafter(host(value), host(toward)))


def _given(value, default: float) -> bool:
    """Whether a parameter differs from its default (an array always does: no truth value asked)."""
    return isinstance(value, (Node, np.ndarray)) or value != default


def _shaped(values: Array, shape: tuple, what: str) -> Array:
    if values.shape != shape:
        raise InvalidValueError(f"{what} of shape broadcasting to {values.shape} do not fit the sample shape {shape}")
    return values
