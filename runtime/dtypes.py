"""Runtime dtypes and numpy's type promotion.

Every numpy integer and float dtype up to 64 bits has a runtime dtype, plus
bfloat16 and the complex dtypes complex64 and complex128 (pairs of float32 and
float64; in kernels the C structs of runtime/kernels/complex.py). Results
follow numpy: array-array promotion is `np.promote_types`,
Python scalars are weak (NEP 50) and numpy scalars strongly typed; nothing is
narrowed silently. New data made from Python floats (lists, scalars, `full`)
takes the default float dtype, float32, and from Python ints the default
integer dtype, int64, as in PyTorch, and from Python complex numbers the default
complex dtype, complex64. bfloat16 promotes as float16 does, except that
bfloat16 with float16 gives float32. Complex dtypes promote as the array API
standard says: a real float with a complex dtype gives the complex dtype of the
larger precision (float64 with complex64 is complex128), and integers and bools
with a complex dtype give that dtype.
"""

from __future__ import annotations

import functools

import numpy as np

from .errors import InvalidTypeError, ScalarOverflowError


class DType:
    """One element type: how it is stored, named in C and computed with.

    Compares equal to its numpy dtype (and to names and numpy scalar types), so numpy idioms
    such as ``a.dtype == np.float32`` and ``np.dtype(a.dtype)`` work. Hashing is by identity:
    there is one object per dtype (pickling returns it), and graph keys hash at C speed.
    """

    __slots__ = ("name", "itemsize", "kind", "storage", "code", "c_storage", "c_compute", "is_float",
                 "is_int", "is_complex", "__weakref__")

    def __init__(self, name: str, itemsize: int, kind: str, storage: np.dtype, code: str,
                 c_storage: str, c_compute: str) -> None:
        self.name = name
        self.itemsize = itemsize
        self.kind = kind  # 'f' real float, 'c' complex float, 'i' signed int, 'u' unsigned int, 'b' bool
        self.storage = storage  # numpy dtype of the stored bits (uint16 for bfloat16)
        self.code = code  # short tag used in kernel names
        self.c_storage = c_storage
        self.c_compute = c_compute
        self.is_float = kind == "f"
        self.is_int = kind in "iu"
        self.is_complex = kind == "c"

    def __repr__(self) -> str:
        return f"runtime.{self.name}"

    def __str__(self) -> str:
        return self.name

    def __reduce__(self):
        return (_by_name, (self.name,))

    def __eq__(self, other) -> bool:
        if other is self:
            return True
        if isinstance(other, DType) or other is None:
            return False
        try:
            return as_dtype(other) is self
        except Exception:  # noqa: BLE001 - anything that is not a dtype is not equal
            return False

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    __hash__ = object.__hash__

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype host copies use (float32 for bfloat16 unless ml_dtypes is present)."""
        if self is bfloat16:
            return numpy_bfloat16() or np.dtype(np.float32)
        return self.storage

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype (what `np.dtype(runtime_dtype)` returns)."""
        return self.numpy

    @property
    def type(self) -> type:
        return self.numpy.type

    @property
    def char(self) -> str:
        return self.numpy.char

    @property
    def str(self) -> str:
        return self.numpy.str


def _d(name, itemsize, kind, storage, code, c_storage, c_compute) -> DType:
    return DType(name, itemsize, kind, np.dtype(storage), code, c_storage, c_compute)


bool_ = _d("bool", 1, "b", np.bool_, "b8", "unsigned char", "bool")
int8 = _d("int8", 1, "i", np.int8, "i8", "signed char", "int")
int16 = _d("int16", 2, "i", np.int16, "i16", "short", "int")
int32 = _d("int32", 4, "i", np.int32, "i32", "int", "int")
int64 = _d("int64", 8, "i", np.int64, "i64", "long long", "long long")
uint8 = _d("uint8", 1, "u", np.uint8, "u8", "unsigned char", "int")
uint16 = _d("uint16", 2, "u", np.uint16, "u16", "unsigned short", "int")
uint32 = _d("uint32", 4, "u", np.uint32, "u32", "unsigned int", "unsigned int")
uint64 = _d("uint64", 8, "u", np.uint64, "u64", "unsigned long long", "unsigned long long")
float16 = _d("float16", 2, "f", np.float16, "f16", "unsigned short", "float")
bfloat16 = _d("bfloat16", 2, "f", np.uint16, "bf16", "unsigned short", "float")
float32 = _d("float32", 4, "f", np.float32, "f32", "float", "float")
float64 = _d("float64", 8, "f", np.float64, "f64", "double", "double")
complex64 = _d("complex64", 8, "c", np.complex64, "c64", "rt_c64", "rt_c64")
complex128 = _d("complex128", 16, "c", np.complex128, "c128", "rt_c128", "rt_c128")

ALL = (float32, float16, bfloat16, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64, bool_,
       complex64, complex128)
FLOATS = (float32, float16, bfloat16, float64)
COMPLEX = (complex64, complex128)
INTS = (int8, int16, int32, int64, uint8, uint16, uint32, uint64)
NUMERIC = FLOATS + INTS + COMPLEX
DEFAULT_FLOAT = float32
DEFAULT_INT = int64
DEFAULT_COMPLEX = complex64
INDEX = int64  # argmax/argmin, nonzero, argsort results (numpy's intp)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME["bool_"] = bool_


def _by_name(name: str) -> DType:
    return _BY_NAME[name]


@functools.cache
def numpy_bfloat16() -> np.dtype | None:
    """ml_dtypes' bfloat16 where it is installed (optional), else None."""
    try:
        import ml_dtypes  # optional
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


_FROM_NUMPY = {d.storage: d for d in ALL if d is not bfloat16}


def as_dtype(dtype) -> DType:
    """Accept a DType, a name, a numpy dtype or scalar type, or a Python type; return the runtime DType."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str) and dtype in _BY_NAME:
        return _BY_NAME[dtype]
    if dtype is float:
        return DEFAULT_FLOAT
    if dtype is int:
        return DEFAULT_INT
    if dtype is bool:
        return bool_
    if dtype is complex:
        return DEFAULT_COMPLEX
    try:
        npd = np.dtype(dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidTypeError(f"unsupported dtype {dtype!r}") from exc
    if not npd.isnative:  # big-endian data (files, network formats): the same values, converted on upload
        npd = npd.newbyteorder("=")
    bf = numpy_bfloat16()
    if bf is not None and npd == bf:
        return bfloat16
    try:
        return _FROM_NUMPY[npd]
    except KeyError:
        raise InvalidTypeError(f"unsupported dtype {dtype!r} (only bool, integer, float and complex64/complex128 "
                               "dtypes are supported)") from None


def from_numpy(npd: np.dtype) -> DType:
    """Runtime dtype for data of numpy dtype `npd` (the same dtype: nothing is narrowed)."""
    return as_dtype(npd)


def _build_promotion() -> dict:
    table = {}
    native = [d for d in ALL if d is not bfloat16]
    for a in native:
        for b in native:
            table[a, b] = _FROM_NUMPY[np.promote_types(a.storage, b.storage)]
    for other in ALL:
        if other is bfloat16:
            res = bfloat16
        elif other is float16:
            res = float32
        else:
            res = table[float16, other]
            if res is float16:
                res = bfloat16
        table[bfloat16, other] = res
        table[other, bfloat16] = res
    return table


#: The complex dtype of a real float's precision (the real and imaginary parts' dtype: complex_of[d]).
COMPLEX_OF = {float16: complex64, bfloat16: complex64, float32: complex64, float64: complex128,
              complex64: complex64, complex128: complex128}
#: The real dtype of a complex dtype's parts (abs, real, imag), and real dtypes as they are.
REAL_OF = {complex64: float32, complex128: float64}


PROMOTE = _build_promotion()


def promote(a: DType, b: DType) -> DType:
    return PROMOTE[a, b]


def result_type(*dts: DType) -> DType:
    out = dts[0]
    for d in dts[1:]:
        out = PROMOTE[out, d]
    return out


def int_range(d: DType) -> tuple:
    if d is bool_:
        return 0, 1
    info = np.iinfo(d.storage)
    return int(info.min), int(info.max)


def weak_scalar_dtype(array_dtype: DType, value) -> DType:
    """The result dtype of `array op value` for a Python scalar (NEP 50 weak typing)."""
    if isinstance(value, bool):
        return array_dtype
    if isinstance(value, int):
        result = DEFAULT_INT if array_dtype is bool_ else array_dtype
        if result.is_int:
            lo, hi = int_range(result)
            if not lo <= value <= hi:
                raise ScalarOverflowError(f"Python integer {value} out of bounds for {result.name}")
        return result
    if isinstance(value, float):
        # numpy (NEP 50): an integer or bool array with a Python float computes in float64; only new data
        # made from Python floats alone takes the default float dtype.
        return array_dtype if array_dtype.is_float or array_dtype.is_complex else float64
    if isinstance(value, complex):
        # The array API: a Python complex with a real float array gives the complex dtype of its precision;
        # with integers and bools, as numpy does, complex128.
        if array_dtype.is_complex:
            return array_dtype
        return COMPLEX_OF[array_dtype] if array_dtype.is_float else complex128
    raise InvalidTypeError(f"unsupported scalar type {type(value).__name__}")


def _numpy_float_result(d: DType) -> DType:
    if d is bfloat16:
        return bfloat16
    return _FROM_NUMPY[np.result_type(d.storage, np.float16)] if not (d.is_float or d.is_complex) else d


_FLOAT_RESULT = {d: _numpy_float_result(d) for d in ALL}
_FLOAT_RESULT[bool_] = float16


def float_result(d: DType) -> DType:
    """dtype of a transcendental (exp, log, ...) applied to `d`: numpy's inexact result
    (int8/uint8/bool -> float16, int16/uint16 -> float32, wider integers -> float64)."""
    return _FLOAT_RESULT[d]


def true_divide_result(d: DType) -> DType:
    """dtype of `a / b` computed in `d` (numpy: integers divide to float64)."""
    return d if d.is_float or d.is_complex else float64


def reduction_result(op: str, d: DType) -> DType:
    """The dtype a reduction ``op`` over ``d`` produces (numpy's: sums of signed ints and bools are int64,
    of unsigned ints uint64, means of integers float64, argmax int64)."""
    if op in ("sum", "prod", "cumsum"):
        if d.kind in "ib":
            return int64
        if d.kind == "u":
            return uint64
        return d
    if op == "mean":
        return d if d.is_float or d.is_complex else float64
    if op in ("argmax", "argmin"):
        return INDEX
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


def float_to_int(values: np.ndarray, d: DType) -> np.ndarray:
    """Float -> integer conversion as every driver does it: toward zero, saturating at the dtype's
    range, NaN -> 0 (what CUDA's conversion instructions do; numpy's own is platform-defined)."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = int_range(d)
    out = np.zeros(v.shape, d.storage)
    with np.errstate(invalid="ignore"):
        inside = (v > lo) & (v < hi)
        out[inside] = v[inside].astype(d.storage)
        out[v >= hi] = hi
        out[v <= lo] = lo
    return out


def convert_host(values: np.ndarray, d: DType) -> np.ndarray:
    """Host data converted to `d`'s storage as the device kernels convert (see float_to_int)."""
    values = np.asarray(values)
    if d is bfloat16:
        return to_bfloat16_bits(np.asarray(values, dtype=np.float32))
    if d.is_int and values.dtype.kind == "f":
        return float_to_int(values, d)
    if values.dtype == np.dtype(np.bool_) or d is bool_ or values.dtype == d.storage:
        return np.asarray(values, dtype=d.storage)
    with np.errstate(over="ignore", invalid="ignore"):
        return values.astype(d.storage)
