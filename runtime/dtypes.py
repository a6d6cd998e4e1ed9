"""Runtime dtypes and numpy-style type promotion.

The device dtypes are float32, float16, bfloat16, int32 and bool. Where numpy
would widen to float64 or int64 (int32 + float32, int32 / int32, sum of
int32) the runtime keeps the widest device type of the same kind instead:
float32 and int32.
"""

from __future__ import annotations

import numpy as np

import hal


class DType:
    """One element type: how it is stored, named in C and computed with."""

    # Hashing and equality are by identity: there is one object per dtype (pickling returns it),
    # and graph keys full of dtypes hash at C speed.
    __slots__ = ("name", "itemsize", "kind", "storage", "code", "c_storage", "c_compute", "is_float")

    def __init__(self, name: str, itemsize: int, kind: str, storage: np.dtype, code: str,
                 c_storage: str, c_compute: str) -> None:
        self.name = name
        self.itemsize = itemsize
        self.kind = kind  # 'f' float, 'i' signed int, 'b' bool
        self.storage = storage  # numpy dtype of the stored bits (uint16 for bfloat16)
        self.code = code  # short tag used in kernel names
        self.c_storage = c_storage
        self.c_compute = c_compute
        self.is_float = kind == "f"

    def __repr__(self) -> str:
        return f"runtime.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype host copies use (float32 for bfloat16 unless ml_dtypes is present)."""
        if self is bfloat16:
            return _numpy_bfloat16() or np.dtype(np.float32)
        return self.storage


float32 = DType("float32", 4, "f", np.dtype(np.float32), "f32", "float", "float")
float16 = DType("float16", 2, "f", np.dtype(np.float16), "f16", "unsigned short", "float")
bfloat16 = DType("bfloat16", 2, "f", np.dtype(np.uint16), "bf16", "unsigned short", "float")
int32 = DType("int32", 4, "i", np.dtype(np.int32), "i32", "int", "int")
bool_ = DType("bool", 1, "b", np.dtype(np.bool_), "b8", "unsigned char", "bool")

ALL = (float32, float16, bfloat16, int32, bool_)
FLOATS = (float32, float16, bfloat16)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME["bool_"] = bool_


def _by_name(name: str) -> DType:
    return _BY_NAME[name]


def _numpy_bfloat16():
    try:
        import ml_dtypes  # optional
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


_FROM_NUMPY = {
    np.dtype(np.float32): float32, np.dtype(np.float16): float16, np.dtype(np.int32): int32,
    np.dtype(np.bool_): bool_, np.dtype(np.float64): float32, np.dtype(np.int64): int32,
    np.dtype(np.int16): int32, np.dtype(np.int8): int32, np.dtype(np.uint8): int32,
    np.dtype(np.uint16): int32,
}


def as_dtype(dtype) -> DType:
    """Accept a DType, a name, a numpy dtype or a Python type and return the runtime DType."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype in _BY_NAME:
        return _BY_NAME[dtype]
    if dtype is float:
        return float32
    if dtype is int:
        return int32
    if dtype is bool:
        return bool_
    try:
        npd = np.dtype(dtype)
    except TypeError as exc:
        raise hal.InvalidArgumentError(f"unsupported dtype {dtype!r}") from exc
    bf = _numpy_bfloat16()
    if bf is not None and npd == bf:
        return bfloat16
    try:
        return _FROM_NUMPY[npd]
    except KeyError:
        raise hal.InvalidArgumentError(f"unsupported dtype {dtype!r}") from None


def from_numpy(npd: np.dtype) -> DType:
    """Runtime dtype for data of numpy dtype `npd` (float64 -> float32, int64 -> int32)."""
    return as_dtype(npd)


def _canonical(npd: np.dtype) -> DType:
    return _FROM_NUMPY[np.dtype(npd)]


def _build_promotion() -> dict:
    table = {}
    native = (float32, float16, int32, bool_)
    for a in native:
        for b in native:
            table[a, b] = _canonical(np.promote_types(a.storage, b.storage))
    for other in ALL:
        if other is bool_ or other is bfloat16:
            res = bfloat16
        else:
            res = float32
        table[bfloat16, other] = res
        table[other, bfloat16] = res
    return table


_PROMOTE = _build_promotion()


def promote(a: DType, b: DType) -> DType:
    return _PROMOTE[a, b]


def weak_scalar_dtype(array_dtype: DType, value) -> DType:
    """The result dtype of `array op value` for a Python scalar (NEP 50 weak typing)."""
    if isinstance(value, bool):
        return array_dtype
    if isinstance(value, int):
        if array_dtype is bool_:
            return int32
        if array_dtype is int32 and not (-(2**31) <= value < 2**31):
            raise hal.InvalidArgumentError(f"Python integer {value} out of bounds for int32")
        return array_dtype
    if isinstance(value, float):
        return array_dtype if array_dtype.is_float else float32
    raise hal.InvalidArgumentError(f"unsupported scalar type {type(value).__name__}")


def float_result(d: DType) -> DType:
    """dtype of a transcendental (exp, log, ...) applied to `d`, as numpy's inexact result."""
    if d.is_float:
        return d
    return float16 if d is bool_ else float32


def reduction_result(op: str, d: DType) -> DType:
    """The dtype a reduction ``op`` over ``d`` produces (sum of ints/bools is int32, mean is float)."""
    if op == "sum":
        return int32 if d.kind in "ib" else d
    if op == "mean":
        return d if d.is_float else float32
    if op in ("argmax", "argmin"):
        return int32
    return d


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, NaN kept quiet."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def from_bfloat16_bits(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
