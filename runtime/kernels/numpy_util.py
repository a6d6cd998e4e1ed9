"""Helpers for the numpy executables: views of bound byte ranges, bfloat16 conversion."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import dtypes as _dt

ERRSTATE = dict(all="ignore")


def signed(v: int) -> int:
    return v - (1 << 32) if v >= (1 << 31) else v


def flat(mv, dtype) -> np.ndarray:
    return np.frombuffer(mv, dtype=dtype.storage)


def strided_view(mv, dtype, shape: tuple, strides: tuple, offset: int) -> np.ndarray:
    """View of a bound buffer with element strides (may be negative or zero) and element offset."""
    item = dtype.itemsize
    if 0 in shape:
        return np.empty(shape, dtype=dtype.storage)
    try:
        return np.ndarray(shape, dtype=dtype.storage, buffer=mv, offset=offset * item,
                          strides=tuple(s * item for s in strides))
    except (TypeError, ValueError):
        # a read-only exporter: fall back to a view through frombuffer
        base = np.frombuffer(mv, dtype=dtype.storage)
        return as_strided(base[offset:], shape, tuple(s * item for s in strides), writeable=False)


def to_compute(x: np.ndarray, dtype) -> np.ndarray:
    """Host values of stored data (bfloat16 bits become float32)."""
    if dtype is _dt.bfloat16:
        return _dt.from_bfloat16_bits(x)
    return x


def store(out: np.ndarray, value, dtype) -> None:
    """Write computed values into an output view of `dtype`'s storage."""
    if dtype is _dt.bfloat16:
        out[...] = _dt.to_bfloat16_bits(np.asarray(value, dtype=np.float32))
    else:
        np.copyto(out, value, casting="unsafe")


def compute_np(dtype) -> np.dtype:
    """numpy dtype computations on `dtype` run in."""
    return np.dtype(np.float32) if dtype is _dt.bfloat16 else dtype.storage
