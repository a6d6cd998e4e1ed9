"""What the reduction kernels share (reduce.py, reduce_columns.py, rows.py): the accumulator type, the
identity and combining step in C, and the numpy reduction of rows."""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .numpy_util import ERRSTATE


def acc_dtype(op: str, dt):
    """The type partial results are kept in (float32 for the narrow floats, 64 bits for integer sums;
    a mean of 64-bit integers in float64, as numpy's: an integer sum of nanosecond timestamps wraps
    past 2**63 after six of them)."""
    if dt is _dt.float64 or dt.is_complex:
        return dt
    if dt.is_float:
        return _dt.float32
    if op == "mean" and dt.kind in "iu" and dt.itemsize == 8:
        return _dt.float64
    if op in ("sum", "mean", "prod"):
        return _dt.uint64 if dt.kind == "u" else _dt.int64
    if dt.kind == "b":
        return _dt.int32
    return dt


# Identities of max / min in each integer compute type.
_C_INT_LIMITS = {"int": ("(-2147483647 - 1)", "2147483647"),
                 "unsigned int": ("0u", "4294967295u"),
                 "long long": ("(-9223372036854775807LL - 1)", "9223372036854775807LL"),
                 "unsigned long long": ("0ull", "18446744073709551615ull")}


def c_identity(op, acc) -> str:
    """The identity of `op` in accumulator type `acc`, as C."""
    if op in ("sum", "mean"):
        return "0"
    if op == "prod":
        return "1"
    if acc.is_float:
        inf = "(double)__int_as_float(0x7f800000)" if acc is _dt.float64 else "__int_as_float(0x7f800000)"
        return f"(-{inf})" if op in ("max", "argmax") else inf
    lo, hi = _C_INT_LIMITS[acc.c_compute]
    return lo if op in ("max", "argmax") else hi


def c_combine(op, acc) -> str:
    """`op` combining partials x and y, as a C expression."""
    if op in ("sum", "mean"):
        return "(x + y)"
    if op == "prod":
        return "(x * y)"
    if acc.is_float:
        return "rt_fmax(x, y)" if op == "max" else "rt_fmin(x, y)"
    return "(x > y ? x : y)" if op == "max" else "(x < y ? x : y)"


def np_reduce(op, x: np.ndarray, dt, out_dt) -> np.ndarray:
    """Reduce the last axis of a 2-D (O, R) array of dtype dt's compute values."""
    with np.errstate(**ERRSTATE):
        if op in ("sum", "mean"):
            acc = acc_dtype(op, dt).storage
            r = np.add.reduce(x, axis=1, dtype=acc)
            if op == "mean":
                f = out_dt.storage if out_dt.is_float and out_dt is not _dt.bfloat16 else np.dtype(np.float32)
                r = r / f.type(x.shape[1]) if x.shape[1] else np.full(r.shape, np.nan, f)
            return r
        if op == "prod":
            return np.multiply.reduce(x, axis=1, dtype=acc_dtype(op, dt).storage)
        if op == "max":
            return np.maximum.reduce(x, axis=1)
        if op == "min":
            return np.minimum.reduce(x, axis=1)
        if op == "argmax":
            return np.argmax(x, axis=1)
        return np.argmin(x, axis=1)
