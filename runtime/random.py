"""Counter-based random numbers (Philox4x32-10): identical streams on every device for a key.

A key is an int32 array of shape (2,). `split` derives new keys from the
generator itself, so a training loop can draw fresh numbers without host work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import hal

from . import dtypes as _dt
from .device import context_for
from .graph import Node, new_node, upload
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
    dt = _dt.as_dtype(dtype)
    if not dt.is_float:
        raise hal.InvalidArgumentError("uniform needs a float dtype")
    k = _check_key(key if key is not None else _default_key())
    shape = check_shape(shape)
    k.ctx.check_fits(shape, dt)
    u = new_node("random", (k,), "uniform", shape, dt, k.ctx)
    if low != 0.0 or high != 1.0:
        u = u * (high - low) + low
    return u


def normal(shape=(), key: Array | None = None, dtype=_dt.float32, loc=0.0, scale=1.0) -> Array:
    dt = _dt.as_dtype(dtype)
    if not dt.is_float:
        raise hal.InvalidArgumentError("normal needs a float dtype")
    k = _check_key(key if key is not None else _default_key())
    shape = check_shape(shape)
    k.ctx.check_fits(shape, dt)
    z = new_node("random", (k,), "normal", shape, dt, k.ctx)
    if scale != 1.0:
        z = z * scale
    if loc != 0.0:
        z = z + loc
    return z
