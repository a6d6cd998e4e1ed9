"""Op builders: shape/dtype inference and validation when the op is built, no device work."""

from __future__ import annotations

import builtins
import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from . import dtypes as _dt
from .device import context_for
from .errors import InvalidTypeError, InvalidValueError, ScalarOverflowError
from .graph import Node, constant, keep_constant, merge_checks, new_node, new_view, upload
from .interop import from_dlpack
from .kernels.matmul import matmul_precision
from .shapes import (
    MAX_DIMS,
    broadcast_shapes,
    check_shape,
    contiguous_strides,
    index_of,
    normalize_axes,
    parse_index,
    reshape_strides,
    reshape_target,
    sequence_of,
    size_of,
)

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TypeAlias

    from .array import Array

    #: What an op takes as an array: an Array, or host data it copies to the device.
    ArrayLike: TypeAlias = Array | np.ndarray | np.generic | bool | int | float | Sequence[Any]

UNARY_FLOAT = ("exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
               "cosh", "asinh", "acosh", "atanh", "expm1", "log1p", "log2", "log10", "reciprocal")
UNARY_SAME = ("neg", "abs", "floor", "ceil", "trunc", "round", "square", "sign", "bitwise_invert")
#: Ops of complex operands only (on real ones, conj and real are the identity and imag is zeros).
UNARY_COMPLEX = ("conj", "real", "imag")
UNARY_PREDICATE = ("isnan", "isinf", "isfinite", "signbit", "logical_not")
ARITH = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "floor_divide", "remainder")
BINARY_FLOAT = ("atan2", "hypot", "copysign", "nextafter", "logaddexp", "gelu_grad")
BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")
LOGICAL = ("logical_and", "logical_or", "logical_xor")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
ELEMENTWISE = frozenset(UNARY_FLOAT + UNARY_SAME + UNARY_COMPLEX + UNARY_PREDICATE + ARITH + BINARY_FLOAT + BITWISE
                        + LOGICAL + COMPARE + ("cast", "copy", "where"))
#: What complex operands do not have: an order (comparisons, maximum, ...), rounding down or up, the
#: real functions of two operands, bits, and the functions of real numbers only.
_NOT_COMPLEX = frozenset(("lt", "le", "gt", "ge", "maximum", "minimum", "floor_divide", "remainder", "floor", "ceil",
                          "trunc", "signbit", "sigmoid", "gelu", "bitwise_invert") + BINARY_FLOAT + BITWISE)
REDUCTIONS = frozenset(("sum", "mean", "max", "min", "argmax", "argmin", "prod"))
VIEWS = frozenset(("reshape", "transpose", "broadcast_to", "slice", "alias"))

_Scalar = (bool, int, float, complex)


def ctx_of(*xs):
    ctx = None
    for x in xs:
        if isinstance(x, Node):
            if ctx is None:
                ctx = x.ctx
            elif x.ctx is not ctx:
                raise InvalidValueError(
                    f"arrays are on different devices ({ctx.device!r} and {x.ctx.device!r}); "
                    "move one with rt.asarray(x, device=...)")
    return ctx


def as_array(x) -> Array:
    """``x`` itself if it is an array, else ``asarray(x)`` (typed errors for what is not numeric data)."""
    return x if isinstance(x, Node) else asarray(x)


def asarray(x, dtype=None, device=None, copy=None) -> Array:
    """An Array from an Array, numpy array, Python or numpy scalar, nested sequence or DLPack object.

    numpy data keeps its dtype; Python floats become the default float dtype (float32), Python
    ints the default integer dtype (int64). `device` moves an Array to another device (through
    host memory); `copy=True` always copies, `copy=False` refuses to.
    """
    if isinstance(x, Node):
        if device is not None and context_for(device) is not x.ctx:
            if copy is False:
                raise InvalidValueError("asarray(copy=False) cannot move an array to another device")
            moved = upload(np.asarray(x.numpy()), x.dtype, context_for(device))
            return asarray(moved, dtype=dtype)
        if dtype is not None and _dt.as_dtype(dtype) is not x.dtype:
            if copy is False:
                raise InvalidValueError("asarray(copy=False) cannot change the dtype without a copy")
            return astype(x, dtype)
        return copy_array(x) if copy else x
    ctx = context_for(device)
    if hasattr(x, "__dlpack__") and not isinstance(x, (np.ndarray, np.generic)):
        return asarray(from_dlpack(x, device=ctx), dtype=dtype)
    if dtype is None:
        host, dt = host_data(x)
    else:
        dt = _dt.as_dtype(dtype)
        host = _exact_integers(x, dt)
        if host is None:
            host = host_data(x)[0]
        if host.dtype.kind == "c" and not dt.is_complex and dt is not _dt.bool_:
            raise InvalidTypeError(f"asarray: complex data does not cast to {dt.name} (take its real or imaginary "
                                   "part first)")
    if len(host.shape) > MAX_DIMS:
        raise InvalidValueError(f"at most {MAX_DIMS} dimensions are supported")
    return upload(host, dt, ctx)


def _exact_integers(x, dt: _dt.DType) -> np.ndarray | None:
    """Python data for an integer dtype converted by numpy straight to it, so that integers past
    float64's precision stay exact (``asarray([0, 2**63 + 1], dtype=uint64)``: numpy infers float64
    for that list on its own); None where numpy refuses a float (NaN, infinity, out of range), which
    then converts as ``astype`` does. A Python integer the dtype cannot hold raises ScalarOverflowError,
    as numpy, PyTorch and JAX refuse it (wrapped, ``asarray([300], dtype=int8)`` was 44)."""
    if not dt.is_int or isinstance(x, (np.ndarray, np.generic, Node)):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            host = np.asarray(x, dtype=dt.storage)
    except OverflowError:
        value = _int_outside(x, *_dt.int_range(dt))
        if value is not None:
            raise ScalarOverflowError(f"asarray: Python integer {value} out of bounds for {dt.name}") from None
        return None
    except (ValueError, TypeError, Warning):
        return None
    return host


def _int_outside(x, low: int, high: int) -> int | None:
    """The first Python integer (not bool) in nested sequences `x` outside [low, high], or None."""
    stack = [x]
    while stack:
        item = stack.pop()
        if type(item) is int:
            if not low <= item <= high:
                return item
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
    return None


def host_data(x) -> tuple:
    """(numpy data, runtime dtype) of host data: numpy's dtype, or the defaults for Python values."""
    tx = type(x)
    if tx is bool or tx is int or tx is float or tx is complex:
        return np.asarray(x), _python_scalar_dtype(x)
    try:
        host = np.asarray(x)
    except OverflowError as exc:
        raise ScalarOverflowError(f"{x!r} does not fit in int64") from exc
    except ValueError as exc:  # nested sequences of unequal lengths
        raise InvalidValueError(f"cannot make an array from {type(x).__name__}: {exc}") from None
    if host.dtype == object:
        raise InvalidTypeError(f"cannot make an array from {type(x).__name__} (not numeric data)")
    if host.dtype.kind == "f" and host.dtype.itemsize == 8 and isinstance(x, (list, tuple)) and _python_floats(x):
        return host, _dt.DEFAULT_FLOAT
    if host.dtype.kind == "c" and host.dtype.itemsize == 16 and isinstance(x, (list, tuple)) and _python_floats(x):
        return host, _dt.DEFAULT_COMPLEX
    return host, _dt.from_numpy(host.dtype)


def _python_scalar_dtype(value) -> _dt.DType:
    if isinstance(value, bool):
        return _dt.bool_
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ScalarOverflowError(f"Python integer {value} out of bounds for int64")
        return _dt.DEFAULT_INT
    if isinstance(value, complex):
        return _dt.DEFAULT_COMPLEX
    return _dt.DEFAULT_FLOAT


def _python_floats(seq) -> bool:
    """Whether a nested list's float64 (complex128) came from Python floats and complex numbers (not
    from numpy float64 or complex128 data)."""
    for item in seq:
        if isinstance(item, (list, tuple)):
            if not _python_floats(item):
                return False
        elif isinstance(item, (np.ndarray, np.generic, Node)) and np.dtype(item.dtype) in (np.float64, np.complex128):
            return False
    return True


_WEAK = (bool, int, float, complex)


def _scalar_operand(value, other: Array):
    """(constant array, result dtype) for a scalar operand of `other`: Python scalars are weak
    (NEP 50), numpy scalars strongly typed."""
    tv = type(value)
    if tv is complex:
        dt = _dt.weak_scalar_dtype(other.dtype, value)
        return constant(value, dt, other.ctx), dt
    if tv is float or tv is int or tv is bool:
        ctx = other.ctx
        # A NaN never finds its entry: it is not memoized. ±0.0 are equal keys but different
        # constants: a float zero is keyed by its hex form. The memo shares the context's constant
        # cache (its keys have four items, the constants' two or three), so one bound holds both.
        if tv is not float or value == value:
            cache = ctx.constants
            key = (tv, value, other.dtype, None) if value or tv is not float else (tv, value.hex(), other.dtype, None)
            hit = cache.get(key)
            if hit is None:
                dt = _dt.weak_scalar_dtype(other.dtype, value)
                hit = (constant(value, dt, ctx), dt)
                keep_constant(cache, key, hit)
            return hit
        dt = _dt.weak_scalar_dtype(other.dtype, value)
        return constant(value, dt, ctx), dt
    sdt = _dt.from_numpy(value.dtype)
    return constant(value.item(), sdt, other.ctx), _dt.promote(other.dtype, sdt)


def operands(a, b):
    """Turn (a, b) with at least one Array into two Arrays and the promoted dtype."""
    ta, tb = isinstance(a, Node), isinstance(b, Node)
    if ta and tb:
        if a.ctx is not b.ctx:
            ctx_of(a, b)
        return a, b, _dt.promote(a.dtype, b.dtype)
    if ta:
        if type(b) in _WEAK or isinstance(b, np.generic):
            b, dt = _scalar_operand(b, a)
            return a, b, dt
        b = asarray(b, device=a.ctx)
        return a, b, _dt.promote(a.dtype, b.dtype)
    if tb:
        if type(a) in _WEAK or isinstance(a, np.generic):
            a, dt = _scalar_operand(a, b)
            return a, b, dt
        a = asarray(a, device=b.ctx)
        return a, b, _dt.promote(a.dtype, b.dtype)
    a = asarray(a)
    return operands(a, b)


_PROMOTE = _dt.PROMOTE


def binary_signature(op: str, dt: _dt.DType) -> tuple:
    """(result dtype, compute dtype) of binary `op` on operands promoted to `dt` (numpy's rules)."""
    sig = _SIGNATURES.get((op, dt))
    if sig is not None:
        return sig
    kind = dt.kind
    if kind == "c" and op in _NOT_COMPLEX:
        raise InvalidTypeError(f"{_op_name(op)} is not defined for complex dtypes ({dt.name})")
    if op == "div":
        out = cdt = _dt.true_divide_result(dt)
    elif op in COMPARE:
        out, cdt = _dt.bool_, dt
    elif op in LOGICAL:
        out = cdt = _dt.bool_
    elif op in BINARY_FLOAT:
        out = cdt = _dt.float_result(dt)
    elif op in BITWISE:
        if kind == "f" or (kind == "b" and op.endswith("shift")):
            raise InvalidTypeError(f"{op} is not supported for {dt.name} (integer or bool operands only)")
        out = cdt = dt
    elif op == "sub" and kind == "b":
        raise InvalidTypeError("numpy boolean subtract is not supported, use logical_xor")
    elif op in ("pow", "floor_divide", "remainder") and kind == "b":
        out = cdt = _dt.int8
    else:
        out = cdt = dt
    _SIGNATURES[op, dt] = (out, cdt)
    return out, cdt


_COMPARE_OPS = frozenset(COMPARE)
_MIRRORED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}  # (v op x) is (x mirrored v)


def _compared_past_range(op: str, a, b) -> Array | None:
    """An integer array compared with a Python integer its dtype cannot hold: every element is on the
    same side of it, so the answer is known (numpy 2's: ``uint8_image < -1`` is all False, where
    converting -1 to uint8 would raise); None for any other comparison."""
    if type(b) is int and isinstance(a, Node):
        array, value = a, b
    elif type(a) is int and isinstance(b, Node):
        array, value, op = b, a, _MIRRORED[op]
    else:
        return None
    if array.dtype.kind not in "iu":
        return None
    low, high = _dt.int_range(array.dtype)
    if low <= value <= high:
        return None
    above = value > high  # the value is above every element (else below every one)
    answer = {"eq": False, "ne": True, "lt": above, "le": above, "gt": not above, "ge": not above}[op]
    return full(array.shape, answer, dtype=_dt.bool_, device=array.ctx)


_SIGNATURES: dict = {}  # (op, promoted dtype) -> binary_signature's answer
_BINARY: dict = {}  # (op, dtype, dtype) -> (result dtype, compute dtype)
_UNARY_SIGNATURES: dict = {}


def binary(op: str, a: ArrayLike, b: ArrayLike) -> Array:
    """The node of elementwise `op` on `a` and `b`: numpy's broadcasting and promotion (Python scalars
    weak, numpy scalars strongly typed, other host data copied to the array's device)."""
    if not (isinstance(a, Node) and isinstance(b, Node) and a.ctx is b.ctx):
        if op == "pow" and isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b < 0 \
                and isinstance(a, Node) and a.dtype.kind in "iub":
            raise InvalidValueError("Integers to negative integer powers are not allowed.")
        if op in _COMPARE_OPS and (type(a) is int or type(b) is int):
            decided = _compared_past_range(op, a, b)
            if decided is not None:
                return decided
        a, b, _ = operands(a, b)
    da, db = a.dtype, b.dtype
    sig = _BINARY.get((op, da, db))
    if sig is None:  # validated once per (op, dtypes): a rejected pair raises each time
        sig = _BINARY[op, da, db] = binary_signature(op, _PROMOTE[da, db])
    out, cdt = sig
    sa, sb = a.shape, b.shape
    if sa == sb or not sb:
        shape = sa
    elif not sa:
        shape = sb
    else:
        shape = broadcast_shapes(sa, sb)
        if shape != sa and shape != sb:  # broadcasting made it larger than both operands
            a.ctx.check_fits(shape, out)
    return new_node(op, (a, b), cdt, shape, out, a.ctx)


# The elementwise functions of two operands: numpy broadcasting and promotion (Python scalars weak).
def add(a: ArrayLike, b: ArrayLike) -> Array: return binary("add", a, b)
def subtract(a: ArrayLike, b: ArrayLike) -> Array: return binary("sub", a, b)
def multiply(a: ArrayLike, b: ArrayLike) -> Array: return binary("mul", a, b)
def divide(a: ArrayLike, b: ArrayLike) -> Array: return binary("div", a, b)
def power(a: ArrayLike, b: ArrayLike) -> Array: return binary("pow", a, b)
def maximum(a: ArrayLike, b: ArrayLike) -> Array: return binary("maximum", a, b)
def minimum(a: ArrayLike, b: ArrayLike) -> Array: return binary("minimum", a, b)
def floor_divide(a: ArrayLike, b: ArrayLike) -> Array: return binary("floor_divide", a, b)
def remainder(a: ArrayLike, b: ArrayLike) -> Array: return binary("remainder", a, b)
def equal(a: ArrayLike, b: ArrayLike) -> Array: return binary("eq", a, b)
def not_equal(a: ArrayLike, b: ArrayLike) -> Array: return binary("ne", a, b)
def less(a: ArrayLike, b: ArrayLike) -> Array: return binary("lt", a, b)
def less_equal(a: ArrayLike, b: ArrayLike) -> Array: return binary("le", a, b)
def greater(a: ArrayLike, b: ArrayLike) -> Array: return binary("gt", a, b)
def greater_equal(a: ArrayLike, b: ArrayLike) -> Array: return binary("ge", a, b)
def atan2(a: ArrayLike, b: ArrayLike) -> Array: return binary("atan2", a, b)
def hypot(a: ArrayLike, b: ArrayLike) -> Array: return binary("hypot", a, b)
def copysign(a: ArrayLike, b: ArrayLike) -> Array: return binary("copysign", a, b)
def nextafter(a: ArrayLike, b: ArrayLike) -> Array: return binary("nextafter", a, b)
def logaddexp(a: ArrayLike, b: ArrayLike) -> Array: return binary("logaddexp", a, b)
def bitwise_and(a: ArrayLike, b: ArrayLike) -> Array: return binary("bitwise_and", a, b)
def bitwise_or(a: ArrayLike, b: ArrayLike) -> Array: return binary("bitwise_or", a, b)
def bitwise_xor(a: ArrayLike, b: ArrayLike) -> Array: return binary("bitwise_xor", a, b)
def left_shift(a: ArrayLike, b: ArrayLike) -> Array: return binary("left_shift", a, b)
def right_shift(a: ArrayLike, b: ArrayLike) -> Array: return binary("right_shift", a, b)
def logical_and(a: ArrayLike, b: ArrayLike) -> Array: return binary("logical_and", a, b)
def logical_or(a: ArrayLike, b: ArrayLike) -> Array: return binary("logical_or", a, b)
def logical_xor(a: ArrayLike, b: ArrayLike) -> Array: return binary("logical_xor", a, b)


sub = subtract
mul = multiply
div = true_divide = divide
pow = power  # noqa: A001

def _op_name(op: str) -> str:
    """The array API's name of an op."""
    return {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal", "sub": "subtract",
            "mul": "multiply", "div": "divide", "pow": "pow", "neg": "negative"}.get(op, op)


def unary_signature(op: str, d: _dt.DType) -> tuple:
    """(result dtype, compute dtype) of unary `op` on `d` (numpy's rules)."""
    if d.is_complex:
        if op in _NOT_COMPLEX:
            raise InvalidTypeError(f"{_op_name(op)} is not defined for complex dtypes ({d.name})")
        if op in ("abs", "real", "imag"):
            return _dt.REAL_OF[d], d
        if op in UNARY_PREDICATE:
            return _dt.bool_, (_dt.bool_ if op == "logical_not" else d)
        return d, d
    if op in UNARY_COMPLEX:
        raise InvalidTypeError(f"{op} of {d.name}: complex operands only")
    if op in UNARY_FLOAT:
        out = _dt.float_result(d)
        return out, out
    if op == "logical_not":
        return _dt.bool_, _dt.bool_
    if op in UNARY_PREDICATE:
        if op == "signbit" and not d.is_float:
            raise InvalidTypeError(f"signbit is not supported for {d.name} (float operands only)")
        return _dt.bool_, d
    if d is _dt.bool_ and op in ("neg", "sign", "square"):
        raise InvalidTypeError(f"the numpy boolean {op} is not supported, use logical_not or astype")
    if op == "bitwise_invert" and d.is_float:
        raise InvalidTypeError(f"bitwise_invert is not supported for {d.name} (integer or bool operands only)")
    return d, d


def unary(op: str, x, out: _dt.DType | None = None) -> Array:
    if not isinstance(x, Node):
        x = asarray(x)
    if out is None:
        sig = _UNARY_SIGNATURES.get((op, x.dtype))
        if sig is None:  # validated once per (op, dtype): a rejected pair raises each time
            sig = _UNARY_SIGNATURES[op, x.dtype] = unary_signature(op, x.dtype)
        out, cdt = sig
    else:
        cdt = out
    return new_node(op, (x,), cdt, x.shape, out, x.ctx)


#: Rounding ops: the identity on integers and bools (numpy returns them unchanged, not as floats).
ROUNDING = frozenset(("floor", "ceil", "trunc", "round"))



def rounding(op: str, x: ArrayLike) -> Array:
    """A rounding op: the identity on integers and bools."""
    if not isinstance(x, Node):
        x = asarray(x)
    return unary(op, x) if x.dtype.is_float or x.dtype.is_complex else x


# The elementwise functions of one operand (integers and bools give numpy's float result where the op is
# a float function).
def negative(x: ArrayLike) -> Array: return unary("neg", x)
def absolute(x: ArrayLike) -> Array: return unary("abs", x)
def exp(x: ArrayLike) -> Array: return unary("exp", x)
def log(x: ArrayLike) -> Array: return unary("log", x)
def sqrt(x: ArrayLike) -> Array: return unary("sqrt", x)
def tanh(x: ArrayLike) -> Array: return unary("tanh", x)
def sigmoid(x: ArrayLike) -> Array: return unary("sigmoid", x)
def sin(x: ArrayLike) -> Array: return unary("sin", x)
def cos(x: ArrayLike) -> Array: return unary("cos", x)
def tan(x: ArrayLike) -> Array: return unary("tan", x)
def asin(x: ArrayLike) -> Array: return unary("asin", x)
def acos(x: ArrayLike) -> Array: return unary("acos", x)
def atan(x: ArrayLike) -> Array: return unary("atan", x)
def sinh(x: ArrayLike) -> Array: return unary("sinh", x)
def cosh(x: ArrayLike) -> Array: return unary("cosh", x)
def asinh(x: ArrayLike) -> Array: return unary("asinh", x)
def acosh(x: ArrayLike) -> Array: return unary("acosh", x)
def atanh(x: ArrayLike) -> Array: return unary("atanh", x)
def expm1(x: ArrayLike) -> Array: return unary("expm1", x)
def log1p(x: ArrayLike) -> Array: return unary("log1p", x)
def log2(x: ArrayLike) -> Array: return unary("log2", x)
def log10(x: ArrayLike) -> Array: return unary("log10", x)
def reciprocal(x: ArrayLike) -> Array: return unary("reciprocal", x)
def square(x: ArrayLike) -> Array: return unary("square", x)
def sign(x: ArrayLike) -> Array: return unary("sign", x)
def bitwise_invert(x: ArrayLike) -> Array: return unary("bitwise_invert", x)


def conj(x: ArrayLike) -> Array:
    """The complex conjugate (x itself for real dtypes)."""
    if not isinstance(x, Node):
        x = asarray(x)
    return unary("conj", x) if x.dtype.is_complex else x


def real(x: ArrayLike) -> Array:
    """The real part (x itself for real dtypes)."""
    if not isinstance(x, Node):
        x = asarray(x)
    return unary("real", x) if x.dtype.is_complex else x


def imag(x: ArrayLike) -> Array:
    """The imaginary part (zeros for real dtypes)."""
    if not isinstance(x, Node):
        x = asarray(x)
    return unary("imag", x) if x.dtype.is_complex else zeros_like(x)
def isnan(x: ArrayLike) -> Array: return unary("isnan", x)
def isinf(x: ArrayLike) -> Array: return unary("isinf", x)
def isfinite(x: ArrayLike) -> Array: return unary("isfinite", x)
def signbit(x: ArrayLike) -> Array: return unary("signbit", x)
def logical_not(x: ArrayLike) -> Array: return unary("logical_not", x)
def floor(x: ArrayLike) -> Array: return rounding("floor", x)
def ceil(x: ArrayLike) -> Array: return rounding("ceil", x)
def trunc(x: ArrayLike) -> Array: return rounding("trunc", x)
def round(x: ArrayLike) -> Array: return rounding("round", x)  # noqa: A001


def round_to(x: ArrayLike, decimals: int) -> Array:
    """``x`` rounded half to even to ``decimals`` decimals (negative: tens, hundreds, ...), as numpy's
    ``round(x, decimals)`` computes it (scale, round, scale back; integers keep their dtype)."""
    if isinstance(decimals, bool) or not isinstance(decimals, (int, np.integer)):
        raise InvalidTypeError(f"round() takes an int number of decimals (digits), got {type(decimals).__name__}")
    if not isinstance(x, Node):
        x = asarray(x)
    inexact = x.dtype.is_float or x.dtype.is_complex
    if decimals == 0 or (decimals > 0 and not inexact):
        return round(x)
    if x.dtype.kind == "b":  # (numpy refuses it too: a bool holds no tens)
        raise InvalidTypeError(f"round() of a bool array to {decimals} digits")
    scale = 10.0 ** builtins.abs(int(decimals))
    if decimals > 0:
        return round(x * scale) / scale
    rounded = round(x / scale) * scale
    return rounded if inexact else astype(rounded, x.dtype)


neg = negative
abs = absolute  # noqa: A001

def positive(x) -> Array:
    x = x if isinstance(x, Node) else asarray(x)
    if x.dtype is _dt.bool_:
        raise InvalidTypeError("positive is not supported for bool")
    return x


def astype(x, dtype, /, *, copy=True, device=None) -> Array:
    dt = _dt.as_dtype(dtype)
    if device is not None:
        x = asarray(x, device=device)
    if not isinstance(x, Node):
        x = asarray(x)
    if dt is x.dtype:
        return x
    if x.dtype.is_complex and not dt.is_complex and dt is not _dt.bool_:
        raise InvalidTypeError(f"astype: a {x.dtype.name} array does not cast to {dt.name} (the array API leaves "
                               "no imaginary part behind: take real(x) or imag(x) first)")
    return new_node("cast", (x,), dt, x.shape, dt, x.ctx)


def copy_array(x: Array) -> Array:
    """A new array with x's values in its own contiguous buffer (x.copy())."""
    x = as_array(x)
    return new_node("copy", (x,), x.dtype, x.shape, x.dtype, x.ctx)


def contiguous(x: Array) -> Array:
    """x itself when it is a dense root, else a contiguous copy."""
    if not isinstance(x, Node):
        x = asarray(x)
    if x.root is x:
        return x
    return new_node("copy", (x,), x.dtype, x.shape, x.dtype, x.ctx)


def dense(x: Array) -> Array:
    """x itself when its elements lie in order one after another (a root, or a view of one such as
    a leading slice, a row or an added axis, at any offset), else a contiguous copy: the input of a
    kernel that reads it from its offset (concat, take, tri), which would otherwise copy it first."""
    if not isinstance(x, Node):
        x = asarray(x)
    strides = x.strides
    if x.base is None or all(s == c or d == 1 for s, c, d in zip(strides, contiguous_strides(x.shape), x.shape)):
        return x
    return new_node("copy", (x,), x.dtype, x.shape, x.dtype, x.ctx)


def added_dtype(dt: _dt.DType, what: str) -> _dt.DType:
    """The dtype a scattered add of real `dt` values accumulates in (atomically): float32 and
    float64 their own, narrower floats float32, integers uint64 (whose wrap-around, cast back, is
    numpy's ``add.at`` in the integer's dtype)."""
    if dt.is_int:
        return _dt.uint64
    if dt.is_float:
        return dt if dt in (_dt.float32, _dt.float64) else _dt.float32
    raise InvalidTypeError(f"{what} adds numbers, got {dt.name}")


def scatter_add(values: Array, flat: Array, size: int, bad: Array | None = None) -> Array:
    """A 1-D array of `size` zeros with each of `values` added at its flat index in `flat` (int64, of
    `values`' shape; indices may repeat): the transpose of a gather (``kernels/scatter.py``). float32
    and float64 values add in their type, narrower floats in float32, complex values part by part,
    integers in uint64 (the result: its wrap-around cast to the integer's dtype is numpy's ``add.at``
    there). `bad`: None (indices trusted, clamped), or True where an index is out of range: those
    values are dropped and reading the result raises IndexError, as a checked gather's does."""
    if values.dtype.is_complex:
        return add(scatter_add(real(values), flat, size, bad),
                   multiply(scatter_add(imag(values), flat, size, bad), 1j))
    dt = added_dtype(values.dtype, "scatter_add")
    v = contiguous(reshape(astype(values, dt, copy=False), (-1,)))
    flat = astype(flat, _dt.int64, copy=False)
    if bad is None or v.size == 0:
        idx = contiguous(reshape(flat, (-1,)))
        return new_node("scatter_add", (v, idx), (size, None), (size,), dt, values.ctx)
    idx = contiguous(reshape(where(bad, -1, flat), (-1,)))
    return checked_node("scatter_add", (v, idx), (size, "raise"), (size,), dt, values.ctx)


def scatter_last(flat: Array, size: int, bad: Array | None = None) -> Array:
    """uint32 of `size` elements: for each, one plus the last position of `flat` (int64 flat indices,
    in C order) that names it, 0 where none does (``kernels/scatter.py``). `bad` as scatter_add's."""
    flat = astype(flat, _dt.int64, copy=False)
    if bad is None or flat.size == 0:
        idx = contiguous(reshape(flat, (-1,)))
        return new_node("scatter_last", (idx,), (size, None), (size,), _dt.uint32, flat.ctx)
    idx = contiguous(reshape(where(bad, -1, flat), (-1,)))
    return checked_node("scatter_last", (idx,), (size, "raise"), (size,), _dt.uint32, flat.ctx)


def checked_node(op: str, inputs: tuple, params, shape: tuple, dtype: _dt.DType, ctx) -> Array:
    """A node whose kernel reads indices computed on the device (a checked gather or scatter-add): a
    zero-filled status word follows `inputs`, the kernel sets it for an index out of range, and reading
    the result (or any array made from it) raises IndexError then (``graph.Node.checks``)."""
    status = new_node("full", (), (0, 4), (1,), _dt.uint32, ctx)
    out = new_node(op, (*inputs, status), params, shape, dtype, ctx)
    out.checks = (status,) if out.checks is None else merge_checks(out.checks, (status,))
    return out


def where(cond, x, y) -> Array:
    ctx = ctx_of(cond, x, y)
    if ctx is None:
        cond = asarray(cond)
        ctx = cond.ctx
    if not isinstance(cond, Node):
        cond = asarray(cond, device=ctx)
    if cond.dtype is not _dt.bool_:
        cond = not_equal(cond, False if cond.dtype is _dt.bool_ else 0)
    if not isinstance(x, Node) and not isinstance(y, Node):
        x = asarray(x, device=ctx)
    x, y, dt = operands(x, y)
    shape = broadcast_shapes(cond.shape, x.shape, y.shape)
    ctx.check_fits(shape, dt)
    return new_node("where", (cond, x, y), dt, shape, dt, ctx)


# ---- reductions -------------------------------------------------------------------------------

def reduction(op: str, x, axis, keepdims: bool) -> Array:
    if not isinstance(x, Node):
        x = asarray(x)
    if keepdims.__class__ is not bool:  # (numpy takes any truth value; the memo's key needs a bool)
        keepdims = builtins.bool(keepdims)
    # Memoized for None and int axes only: a tuple may hold anything (an array, kept alive here).
    key = (op, x.shape, x.dtype, axis, keepdims) if axis is None or type(axis) is int else None
    sig = _reductions.get(key) if key is not None else None
    if sig is None:
        sig = _reduction_of(op, x.shape, x.dtype, axis, keepdims)
        if key is not None and len(_reductions) < 4096:
            _reductions[key] = sig
    params, shape, out = sig
    return new_node(op, (x,), params, shape, out, x.ctx)


#: (op, shape, dtype, axis, keepdims) -> _reduction_of's answer, for int and None axes (the
#: axis normalization and shape logic cost ~150 bytecodes a reduction, the same at every call).
_reductions: dict = {}


def _reduction_of(op: str, xshape: tuple, dtype: _dt.DType, axis, keepdims) -> tuple:
    """(params, result shape, result dtype) of reduction `op` of an array of `xshape` and `dtype`."""
    if dtype.is_complex and op not in ("sum", "mean", "prod"):
        raise InvalidTypeError(f"{op} is not defined for complex dtypes ({dtype.name}): complex numbers have no order")
    axes = normalize_axes(axis, len(xshape))
    if op in ("argmax", "argmin"):
        if axis is not None and len(axes) != 1:
            raise InvalidValueError(f"{op} takes a single axis or None")
    kept = tuple(d for i, d in enumerate(xshape) if i not in axes)
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(xshape))
    else:
        shape = kept
    reduced = size_of(tuple(xshape[i] for i in axes))
    if reduced == 0 and op not in ("sum", "mean", "prod") and size_of(kept) != 0:
        raise InvalidValueError(f"zero-size array to reduction operation {op} which has no identity")
    return (axes, bool(keepdims)), shape, _dt.reduction_result(op, dtype)


def sum(x, axis=None, keepdims=False) -> Array:  # noqa: A001
    return reduction("sum", x, axis, keepdims)


def mean(x, axis=None, keepdims=False) -> Array:
    return reduction("mean", x, axis, keepdims)


def max(x, axis=None, keepdims=False) -> Array:  # noqa: A001
    return reduction("max", x, axis, keepdims)


def min(x, axis=None, keepdims=False) -> Array:  # noqa: A001
    return reduction("min", x, axis, keepdims)


def _arg_reduce(op: str, x, axis, keepdims: bool) -> Array:
    if not isinstance(x, Node):
        x = asarray(x)
    if axis is None and x.ndim != 1:  # over the flattened array; keepdims keeps every axis as 1
        r = reduction(op, reshape(x, (-1,)), None, False)
        return reshape(r, (1,) * x.ndim) if keepdims else r
    return reduction(op, x, axis, keepdims)


def argmax(x, axis=None, keepdims=False) -> Array:
    return _arg_reduce("argmax", x, axis, keepdims)


def argmin(x, axis=None, keepdims=False) -> Array:
    return _arg_reduce("argmin", x, axis, keepdims)


# ---- matmul -----------------------------------------------------------------------------------

def matmul(a, b) -> Array:
    a, b, dt = operands(a, b)
    shapes = _matmul_shapes.get((a.shape, b.shape))
    if shapes is None:
        shapes = _matmul_shapes_of(a.shape, b.shape)
    a_as, b_as, out_shape, result = shapes
    a.ctx.check_fits(out_shape, dt)
    a2 = a if a_as is None else reshape(a, a_as)
    b2 = b if b_as is None else reshape(b, b_as)
    if a2.dtype is not dt:
        a2 = astype(a2, dt)
    if b2.dtype is not dt:
        b2 = astype(b2, dt)
    out = new_node("matmul", (a2, b2), matmul_precision(dt), out_shape, dt, a.ctx)
    return out if result is None else reshape(out, result)


#: (a's shape, b's shape) -> _matmul_shapes_of's answer: the shape logic costs ~200 bytecodes (and
#: nine property calls) a matmul, the same for every call with the same shapes.
_matmul_shapes: dict = {}


def _matmul_shapes_of(sa: tuple, sb: tuple) -> tuple:
    """(a's 2-d shape or None, b's 2-d shape or None, the kernel's output shape, the result's shape
    or None) of a matmul of shapes `sa` and `sb` (None: as it is); raises for shapes that do not fit."""
    if not sa or not sb:
        raise InvalidValueError("matmul: input operand does not have enough dimensions")
    a_as = (1,) + sa if len(sa) == 1 else None
    b_as = sb + (1,) if len(sb) == 1 else None
    sa2, sb2 = a_as or sa, b_as or sb
    m, k = sa2[-2:]
    k2, n = sb2[-2:]
    if k != k2:
        raise InvalidValueError(f"matmul: mismatch in core dimension: {sa} @ {sb} ({k} != {k2})")
    batch = broadcast_shapes(sa2[:-2], sb2[:-2])
    result = None
    if a_as is not None or b_as is not None:
        result = batch + ((m,) if a_as is None else ()) + ((n,) if b_as is None else ())
    shapes = (a_as, b_as, batch + (m, n), result)
    if len(_matmul_shapes) < 4096:
        _matmul_shapes[sa, sb] = shapes
    return shapes


# ---- views ------------------------------------------------------------------------------------

_reshape_targets: dict = {}  # (shape, requested shape) -> validated target shape
_view_strides: dict = {}  # (shape, strides, target shape) -> reshape_strides' answer (None: not a view)
_UNKNOWN = object()


def reshape_in_order(x, shape, order: str = "C") -> Array:
    """numpy's reshape with ``order``: "F" reads and fills in column-major order (the reversed axes'
    row-major order); "A" is "C" (a runtime array has no memory order of its own to follow)."""
    if shape is None:
        raise InvalidTypeError("reshape() needs a shape")
    if order in ("C", "A"):
        return reshape(x, shape)
    if order != "F":
        raise InvalidValueError(f"reshape() order must be 'C', 'F' or 'A', got {order!r}")
    reversed_shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)[::-1]
    return transpose(reshape(transpose(x if isinstance(x, Node) else asarray(x)), reversed_shape))


def reshape(x, /, shape, *, copy=None) -> Array:
    if copy is False and isinstance(x, Node) and x.strides is not None and x.size and reshape_strides(
            x.shape, x.layout()[0], reshape_target(x.shape, shape, x.size)) is None:
        raise InvalidValueError("reshape(copy=False): this view cannot be reshaped without a copy")
    if not isinstance(x, Node):
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
        return new_view("reshape", x, newshape, newshape, row_major(newshape), x.offset)
    strides, offset = x.layout()
    key = (x.shape, strides, newshape)
    new_strides = _view_strides.get(key, _UNKNOWN)
    if new_strides is _UNKNOWN:  # the group walk costs ~80 bytecodes; a step reshapes the same views again
        new_strides = reshape_strides(x.shape, strides, newshape)
        if len(_view_strides) < 4096:
            _view_strides[key] = new_strides
    if new_strides is None:
        x = new_node("copy", (x,), x.dtype, x.shape, x.dtype, x.ctx)
        new_strides, offset = contiguous_strides(newshape), 0
    return new_view("reshape", x, newshape, newshape, new_strides, offset)


def row_major(shape: tuple) -> tuple:
    strides = _strides_cache.get(shape)
    if strides is None:
        strides = contiguous_strides(shape)
        if len(_strides_cache) < 4096:
            _strides_cache[shape] = strides
    return strides


_strides_cache: dict = {}


def transpose(x, axes=None) -> Array:
    if not isinstance(x, Node):
        x = asarray(x)
    nd = x.ndim
    if axes is None:
        if nd < 2:
            return x
        axes = tuple(range(nd - 1, -1, -1))
        strides = x.strides if x.strides is not None else row_major(x.shape)
        return new_view("transpose", x, axes, x.shape[::-1], strides[::-1], x.offset)
    else:
        axes = sequence_of(axes, "transpose's axes")
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = axes[0]
        axes = [index_of(a, "an axis") for a in axes]
        axes = tuple(a % nd if -nd <= a < nd else -1 for a in axes)
        if sorted(axes) != list(range(nd)):
            raise InvalidValueError(f"axes don't match array: {axes}")
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
    if not isinstance(x, Node):
        x = asarray(x)
    shape = check_shape(shape)
    if shape == x.shape:
        return x
    if len(shape) < x.ndim or broadcast_shapes(x.shape, shape) != shape:
        raise InvalidValueError(f"cannot broadcast shape {x.shape} to {shape}")
    x.ctx.check_fits(shape, x.dtype)
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
    x = as_array(x)
    if axis is None:
        return reshape(x, tuple(d for d in x.shape if d != 1))
    axes = normalize_axes(axis, x.ndim)
    if any(x.shape[a] != 1 for a in axes):
        raise InvalidValueError("cannot select an axis to squeeze out which has size not equal to one")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def getitem(x: Array, key) -> Array:
    if isinstance(key, Node) or isinstance(key, (list, np.ndarray)):
        raise InvalidValueError("advanced (array) indexing is not supported; use basic slicing")
    strides, offset = x.layout()
    shape, new_strides, new_offset, info = parse_index(key, x.shape, strides, offset)
    if len(shape) > MAX_DIMS:
        raise InvalidValueError(f"at most {MAX_DIMS} dimensions are supported")
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
    shape = check_shape(shape)
    ctx = context_for(device)
    if isinstance(fill_value, Node):
        fill_value = fill_value.item()
    elif isinstance(fill_value, np.ndarray) and fill_value.ndim == 0:
        fill_value = fill_value[()]
    if not (isinstance(fill_value, (bool, int, float, complex))
            or isinstance(fill_value, np.generic) and fill_value.dtype.kind in "biufc"):
        raise InvalidTypeError(f"a fill value must be one number, got {type(fill_value).__name__}")
    if dtype is not None:
        dt = _dt.as_dtype(dtype)
    elif isinstance(fill_value, np.generic):
        dt = _dt.from_numpy(fill_value.dtype)
    else:
        dt = _python_scalar_dtype(fill_value)
    if isinstance(fill_value, np.generic):
        fill_value = fill_value.item()
    if isinstance(fill_value, complex) and not (dt.is_complex or dt is _dt.bool_):
        raise InvalidTypeError(f"a complex fill value for {dt.name}")
    if dt is _dt.bool_:
        value = builtins.bool(fill_value)
    elif dt.is_int:
        if isinstance(fill_value, float):
            value = int(_dt.float_to_int(np.array(fill_value), dt))
        else:
            value = int(fill_value)
            lo, hi = _dt.int_range(dt)
            if not lo <= value <= hi:
                raise ScalarOverflowError(f"fill value {value} out of bounds for {dt.name}")
    elif dt.is_complex:
        value = complex(fill_value)
        ctx.check_fits(shape, dt)
        if value == 0 and not any(math.copysign(1.0, p) < 0 for p in (value.real, value.imag)):
            return new_node("full", (), (0, 4), shape, dt, ctx)
        src = broadcast_to(constant(value, dt, ctx), shape)
        return new_node("copy", (src,), dt, shape, dt, ctx)
    else:
        value = float(fill_value)
    ctx.check_fits(shape, dt)
    bits = fill_bits(value, dt)
    if dt.itemsize == 8:
        if bits >> 32 != bits & 0xFFFFFFFF:  # no 4-byte fill pattern: copy a broadcast constant
            src = broadcast_to(constant(value, dt, ctx), shape)
            return new_node("copy", (src,), dt, shape, dt, ctx)
        return new_node("full", (), (bits & 0xFFFFFFFF, 4), shape, dt, ctx)
    # The bit pattern is the node's parameter: -0.0 and 0.0 (or NaN payloads) make different graphs.
    return new_node("full", (), (bits, dt.itemsize), shape, dt, ctx)


def fill_bits(value, dt: _dt.DType) -> int:
    """The stored bit pattern of one element of `dt` holding `value`."""
    if dt is _dt.bfloat16:
        return int(_dt.to_bfloat16_bits(np.array([value], np.float32))[0])
    with np.errstate(over="ignore"):
        host = np.array([value], dtype=dt.storage)
    return int(host.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dt.itemsize])[0])


def zeros(shape, dtype=None, device=None) -> Array:
    return full(shape, 0, dtype or _dt.DEFAULT_FLOAT, device)


def ones(shape, dtype=None, device=None) -> Array:
    return full(shape, 1, dtype or _dt.DEFAULT_FLOAT, device)


def zeros_like(x: Array, dtype=None, device=None) -> Array:
    x = as_array(x)
    return full(x.shape, 0, dtype or x.dtype, device or x.ctx)


def ones_like(x: Array, dtype=None, device=None) -> Array:
    x = as_array(x)
    return full(x.shape, 1, dtype or x.dtype, device or x.ctx)


def full_like(x: Array, fill_value, dtype=None, device=None) -> Array:
    x = as_array(x)
    return full(x.shape, fill_value, dtype or x.dtype, device or x.ctx)


def arange(start, stop=None, step=1, dtype=None, device=None) -> Array:
    if stop is None:
        start, stop = 0, start
    ctx = context_for(device)
    # The length first: the values are made on the host (8 bytes an element before any conversion),
    # which must not try to allocate an array no device could hold.
    try:
        length = builtins.max(0, math.ceil((stop - start) / step))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError) as exc:
        raise InvalidValueError(f"arange({start!r}, {stop!r}, {step!r}): {exc}") from None
    ctx.check_fits((length,), _dt.as_dtype(dtype) if dtype is not None else _dt.int64)
    try:
        host = np.arange(start, stop, step)
    except (TypeError, ValueError, OverflowError) as exc:  # (numpy's own limits: integers past int64)
        raise InvalidValueError(f"arange({start!r}, {stop!r}, {step!r}): {exc}") from None
    if dtype is not None:
        dt = _dt.as_dtype(dtype)
    elif any(isinstance(v, np.generic) for v in (start, stop, step)):
        dt = _dt.from_numpy(host.dtype)
    else:
        dt = _dt.DEFAULT_FLOAT if host.dtype.kind == "f" else _dt.DEFAULT_INT
    return upload(host, dt, ctx)
