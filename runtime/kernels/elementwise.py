"""Elementwise kernels (unary, binary, where, cast, copy) with contiguous, scalar and strided variants.

An op of one or two inputs of which one is a transpose of its output's layout (rows of the output
read down the input's columns: ``x.T.copy()``, ``x.T.astype(float16)``, ``exp(x.T)``, ``x.T + y``,
a batch of them) has a tiled variant ("t", ``tiled_source``, compiled where it is used): each
workgroup moves a tile of each transposed input through shared memory, reading it along the input's
contiguous dim and writing the output along its own, so both sides are coalesced (the other input
is read along the output's rows, or is one element); 64x64 tiles in vectors of up to 16 bytes
where the layout is aligned to them, else 32x32 tiles one element an access. The strided variant
("g") has neighbouring threads read a whole input row apart: a transposed copy of 8192x8192 floats
ran at 28% of the copy bandwidth that way, at 62% in 32x32 tiles and at 97% in vectors, on an H200
(docs/performance.md).
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np

import hal

from .. import dtypes as _dt
from ..errors import InvalidTypeError
from ..shapes import MAX_DIMS, broadcast_strides, collapse, contiguous_strides, size_of
from .complex import SOURCE as COMPLEX_SOURCE
from .complex import needs_source as needs_complex
from .cuda_common import (
    convert,
    float_to_int_expr,
    load_expr,
    store_expr,
    strided_positions,
    unrolled_elements,
    vector_width,
)
from .numpy_util import ERRSTATE, compute_np, signed, store, strided_view, to_compute
from .source import WORKGROUP, KernelSource, grid_1d, source, u32

# C expression of each op over compute-typed operands a, b (c = condition for where), written for
# float; double kernels use the same expressions without the f suffixes (see _for_double).
_C_FLOAT = {
    "add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b", "pow": "powf(a, b)",
    "maximum": "rt_fmax(a, b)", "minimum": "rt_fmin(a, b)",
    "neg": "-a", "abs": "fabsf(a)", "exp": "expf(a)", "log": "logf(a)", "sqrt": "sqrtf(a)",
    "tanh": "tanhf(a)", "sigmoid": "1.0f / (1.0f + expf(-a))", "gelu": "rt_gelu(a)",
    "gelu_grad": "rt_gelu_grad(a, b)",
    "sin": "sinf(a)", "cos": "cosf(a)", "tan": "tanf(a)", "asin": "asinf(a)", "acos": "acosf(a)",
    "atan": "atanf(a)", "sinh": "sinhf(a)", "cosh": "coshf(a)", "asinh": "asinhf(a)", "acosh": "acoshf(a)",
    "atanh": "atanhf(a)", "expm1": "expm1f(a)", "log1p": "log1pf(a)", "log2": "log2f(a)",
    "log10": "log10f(a)", "floor": "floorf(a)", "ceil": "ceilf(a)", "trunc": "truncf(a)", "round": "rintf(a)",
    "square": "a * a", "sign": "(a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : (a == a ? 0.0f : a)))",
    "atan2": "atan2f(a, b)", "hypot": "hypotf(a, b)", "copysign": "copysignf(a, b)",
    "nextafter": "nextafterf(a, b)", "floor_divide": "rt_floordiv(a, b)", "remainder": "rt_remainder(a, b)",
    "logaddexp": "rt_logaddexp(a, b)", "reciprocal": "1.0f / a",
    "isnan": "(a != a)", "isinf": "(fabsf(a) == __int_as_float(0x7f800000))",
    "isfinite": "(fabsf(a) < __int_as_float(0x7f800000))", "signbit": "(copysignf(1.0f, a) < 0.0f)",
}
_C_INT = {
    "add": "a + b", "sub": "a - b", "mul": "a * b", "pow": "rt_ipow(a, b)",
    "maximum": "(a > b ? a : b)", "minimum": "(a < b ? a : b)", "neg": "-a", "abs": "(a < 0 ? -a : a)",
    "floor": "a", "ceil": "a", "trunc": "a", "round": "a", "square": "a * a", "sign": "((a > 0) - (a < 0))",
    "floor_divide": "rt_ifloordiv(a, b)", "remainder": "rt_iremainder(a, b)",
    "bitwise_and": "(a & b)", "bitwise_or": "(a | b)", "bitwise_xor": "(a ^ b)", "bitwise_invert": "(~a)",
    "left_shift": "rt_shl(a, b)", "right_shift": "rt_shr(a, b)",
    "isnan": "false", "isinf": "false", "isfinite": "true",
}
_C_BOOL = {"add": "(a || b)", "mul": "(a && b)", "maximum": "(a || b)", "minimum": "(a && b)", "abs": "a",
           "bitwise_and": "(a && b)", "bitwise_or": "(a || b)", "bitwise_xor": "(a != b)",
           "bitwise_invert": "(!a)", "floor": "a", "ceil": "a", "trunc": "a", "round": "a",
           "isnan": "false", "isinf": "false", "isfinite": "true"}
# Complex operands (complex.py's structs and functions, overloaded for both precisions).
_C_COMPLEX = {
    "add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b", "pow": "rt_cpow(a, b)", "neg": "-a",
    "abs": "rt_cabs(a)", "conj": "rt_conj(a)", "real": "rt_creal(a)", "imag": "rt_cimag(a)", "exp": "rt_cexp(a)",
    "expm1": "rt_cexpm1(a)", "log": "rt_clog(a)", "log1p": "rt_clog1p(a)", "log2": "rt_clog2(a)",
    "log10": "rt_clog10(a)", "sqrt": "rt_csqrt(a)", "sin": "rt_csin(a)", "cos": "rt_ccos(a)", "tan": "rt_ctan(a)",
    "sinh": "rt_csinh(a)", "cosh": "rt_ccosh(a)", "tanh": "rt_ctanh(a)", "asin": "rt_casin(a)",
    "acos": "rt_cacos(a)", "atan": "rt_catan(a)", "asinh": "rt_casinh(a)", "acosh": "rt_cacosh(a)",
    "atanh": "rt_catanh(a)", "square": "a * a", "sign": "rt_csign(a)", "reciprocal": "rt_crecip(a)",
    "round": "rt_cround(a)", "isnan": "rt_cisnan(a)", "isinf": "rt_cisinf(a)", "isfinite": "rt_cisfinite(a)",
}
_C_ANY = {"eq": "a == b", "ne": "a != b", "lt": "a < b", "le": "a <= b", "gt": "a > b", "ge": "a >= b",
          "where": "(c ? a : b)", "cast": "a", "copy": "a", "logical_and": "(a && b)", "logical_or": "(a || b)",
          "logical_xor": "(a != b)", "logical_not": "(!a)"}

# Ops whose result is bool whatever they compute in.
PREDICATES = frozenset(("eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "isfinite", "signbit",
                        "logical_and", "logical_or", "logical_xor", "logical_not"))
UNARY = frozenset(("conj", "real", "imag", "neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "gelu", "cast",
                   "copy", "sin", "cos", "tan",
                   "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "expm1", "log1p", "log2",
                   "log10", "floor", "ceil", "trunc", "round", "square", "sign", "reciprocal", "isnan",
                   "isinf", "isfinite", "signbit", "bitwise_invert", "logical_not"))

_np_shift = {"left_shift": np.left_shift, "right_shift": np.right_shift}


def _np_sigmoid(a):
    return 1 / (1 + np.exp(-a))


def np_gelu(x):
    """GELU in its tanh form (``runtime.nn.gelu``), in x's precision."""
    c, k = x.dtype.type(0.79788456080286535588), x.dtype.type(0.044715)
    return x.dtype.type(0.5) * x * (1 + np.tanh(c * (x + k * x * x * x)))


def np_gelu_grad(g, x):
    """g times the derivative of ``np_gelu`` at x."""
    c, k, half = x.dtype.type(0.79788456080286535588), x.dtype.type(0.044715), x.dtype.type(0.5)
    t = np.tanh(c * (x + k * x * x * x))
    return g * (half * (1 + t) + half * x * (1 - t * t) * c * (1 + 3 * k * x * x))


def _np_ipow(a, b):
    return np.power(a, np.maximum(b, 0) if np.asarray(b).dtype.kind == "i" else b)


def _np_shift_op(op):
    ufunc = _np_shift[op]

    def fn(a, b):
        # Shifts past the width: 0 (or -1 for negative values shifted right), never C's undefined result.
        a, b = np.asarray(a), np.asarray(b)
        bits = a.dtype.itemsize * 8
        big = (b < 0) | (b >= bits)
        r = ufunc(a, np.where(big, 0, b).astype(a.dtype, copy=False))
        if np.any(big):
            fill = np.where(a < 0, -1, 0) if op == "right_shift" else 0
            r = np.where(big, np.asarray(fill).astype(a.dtype), r)
        return r
    return fn


def _np_floor_divide(a, b):
    """numpy's floor division with the array API's special cases: a non-finite operand gives a / b
    (inf // finite is inf and finite // inf a signed zero, where numpy gives nan and -1)."""
    r = np.floor_divide(a, b)
    if r.dtype.kind == "f":
        special = ~(np.isfinite(a) & np.isfinite(b))
        if special.any():
            r = np.where(special, np.true_divide(a, b), r).astype(r.dtype, copy=False)
    return r


_NP_UFUNC = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "neg": np.negative, "abs": np.absolute,
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "expm1": np.expm1, "log1p": np.log1p, "log2": np.log2, "log10": np.log10, "floor": np.floor,
    "ceil": np.ceil, "trunc": np.trunc, "round": np.rint, "square": np.square, "sign": np.sign,
    "atan2": np.arctan2, "hypot": np.hypot, "copysign": np.copysign, "nextafter": np.nextafter,
    "floor_divide": _np_floor_divide, "remainder": np.remainder, "logaddexp": np.logaddexp,
    "reciprocal": np.reciprocal, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
    "signbit": np.signbit, "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor, "bitwise_invert": np.invert, "logical_and": np.logical_and,
    "logical_or": np.logical_or, "logical_xor": np.logical_xor, "logical_not": np.logical_not,
    "conj": np.conjugate, "real": np.real, "imag": np.imag, "gelu": np_gelu, "gelu_grad": np_gelu_grad,
}
#: Per 16-bit float dtype computed in float: (mantissa bits, least normal exponent, largest finite
#: value), for nextafter's steps in that format (rt_nextafter16 in cuda_common, np_nextafter16 here).
NEXTAFTER16 = {_dt.float16: (10, -14, 65504.0), _dt.bfloat16: (7, -126, 3.3895313892515355e38)}


def np_nextafter16(a, b, dtype=_dt.bfloat16) -> np.ndarray:
    """numpy's form of rt_nextafter16: the neighbour of ``a`` toward ``b`` in ``dtype``'s 16-bit
    format, over float32 values (numpy has no bfloat16: its values are computed in float32, where
    np.nextafter would step a float32's bit)."""
    mant, emin, max_finite = NEXTAFTER16[dtype]
    one = np.float32(1)
    a, b = np.broadcast_arrays(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with np.errstate(all="ignore"):
        _, e = np.frexp(np.abs(a))
        ea = np.maximum(e - 1, emin)
        ulp = np.ldexp(one, ea - mant).astype(np.float32)
        away = (b > a) == (a > 0)
        ulp = np.where(~away & (np.abs(a) == np.ldexp(one, ea)) & (ea > emin), ulp / 2, ulp)
        r = np.copysign(np.where(away, np.abs(a) + ulp, np.abs(a) - ulp), a).astype(np.float32)
    r = np.where(np.isinf(a), np.copysign(np.float32(max_finite), a), r)
    r = np.where(a == 0, np.copysign(np.ldexp(one, emin - mant), b), r)
    r = np.where(a == b, b, r)
    return np.where(np.isnan(a) | np.isnan(b), a + b, r).astype(np.float32)


def _np_csign(z):
    """The array API's sign of complex z (numpy's sign gives finite results for NaN parts)."""
    z = np.asarray(z)
    a = np.abs(z)
    out = np.where(a == 0, 0, z / np.where(a == 0, 1, a)).astype(z.dtype, copy=False)
    re_inf, im_inf = np.isinf(z.real), np.isinf(z.imag)
    one = np.ones((), z.real.dtype)
    out = np.where(re_inf & ~im_inf, np.copysign(one, z.real) + 0j, out)
    out = np.where(im_inf & ~re_inf, 1j * np.copysign(one, z.imag), out)
    return np.where(np.isnan(z.real) | np.isnan(z.imag), np.asarray(np.nan + 0j) * (1 + 1j), out).astype(z.dtype)


def _np_cexpm1(z):
    """exp(z) - 1 of complex z with the array API's special cases (numpy's has none: expm1(inf + 0j)
    is inf + nanj there, inf + 0j in the standard)."""
    z = np.asarray(z)
    x, y = z.real, z.imag
    s = np.sin(y * 0.5)
    r = np.empty_like(z)
    r.real = np.expm1(x) * np.cos(y) - 2 * s * s
    r.imag = np.exp(x) * np.sin(y)
    zero_y = y == 0
    r.real = np.where(zero_y, np.where(x == 0, 0, np.expm1(x)), r.real)  # expm1(-0 + 0j) is +0 + 0j
    r.imag = np.where(zero_y, y, r.imag)
    ninf, pinf, finite_y = np.isneginf(x), np.isposinf(x), np.isfinite(y)
    r.real = np.where(ninf & ~zero_y, -1, r.real)
    r.imag = np.where(ninf & ~zero_y, np.where(finite_y, np.copysign(0, np.sin(y)), 0), r.imag)
    r.real = np.where(pinf & ~finite_y, np.inf, r.real)
    r.imag = np.where(pinf & ~finite_y, np.nan, r.imag)
    return r


def _np_clog1p(z):
    """log(1 + z) of complex z, its real part from log1p near 0 (numpy's is log(1 + z): it makes
    log1p(1e-20 + 0j) 0)."""
    z = np.asarray(z)
    x, y = z.real, z.imag
    r = np.array(np.log1p(z))  # (an array also for 0-d z: its parts are assigned below)
    small = (np.abs(x) < 0.5) & (np.abs(y) < 0.5)
    r.real = np.where(small, 0.5 * np.log1p(x * (2 + x) + y * y), r.real)
    return r


def _np_ctanh(z):
    """tanh of complex z with the array API's zeros: tanh(+-inf + yj) of finite y is +-1 + 0j with
    the sign of y on the zero (C99's, numpy's, takes the sign of sin(2y))."""
    z = np.asarray(z)
    r = np.array(np.tanh(z))
    edge = np.isinf(z.real) & np.isfinite(z.imag)
    r.imag = np.where(edge, np.copysign(np.zeros((), z.real.dtype), z.imag), r.imag)
    return r


_NP_COMPLEX = {"sign": _np_csign, "expm1": _np_cexpm1, "log1p": _np_clog1p, "tanh": _np_ctanh}
_NP_INT = {"pow": _np_ipow, "left_shift": _np_shift_op("left_shift"),
           "right_shift": _np_shift_op("right_shift")}
_BOOL_UFUNC = {"add": np.logical_or, "mul": np.logical_and, "maximum": np.logical_or,
               "minimum": np.logical_and}


# Ops whose numpy evaluation here can raise floating-point warnings numpy itself would not
# (sigmoid's exp overflow, power's and cast's intermediate values), or whose numpy form differs
# from the C one: evaluated under errstate, through the general path.
_FAST = frozenset(("add", "sub", "mul", "div", "maximum", "minimum", "neg", "abs", "exp", "log", "sqrt", "tanh",
                   "eq", "ne", "lt", "le", "gt", "ge"))

_DOUBLE_NAMES = re.compile(r"\b(powf|fabsf|expf|logf|sqrtf|tanhf|sinf|cosf|tanf|asinf|acosf|atanf|sinhf|coshf|"
                           r"asinhf|acoshf|atanhf|expm1f|log1pf|log2f|log10f|floorf|ceilf|truncf|rintf|atan2f|"
                           r"hypotf|copysignf|nextafterf)\(")


def _for_double(expr: str) -> str:
    expr = _DOUBLE_NAMES.sub(lambda m: m.group(1)[:-1] + "(", expr)
    expr = re.sub(r"(\d\.\d+)f\b", r"\1", expr)
    return expr.replace("__int_as_float(0x7f800000)", "(double)__int_as_float(0x7f800000)")


def c_expr(op: str, cdt) -> str:
    if op in _C_ANY:
        return _C_ANY[op]
    table = {"f": _C_FLOAT, "i": _C_INT, "u": _C_INT, "b": _C_BOOL, "c": _C_COMPLEX}[cdt.kind]
    try:
        expr = table[op]
    except KeyError:
        raise InvalidTypeError(f"{op} is not supported for {cdt.name}") from None
    if cdt.kind == "u":
        expr = {"abs": "a", "sign": "(a > 0)"}.get(op, expr)
    if op == "nextafter" and cdt in NEXTAFTER16:
        expr = "rt_nextafter16(a, b, {}, {}, {!r}f)".format(*NEXTAFTER16[cdt])
    return _for_double(expr) if cdt is _dt.float64 else expr


def arity(op: str) -> int:
    if op == "where":
        return 3
    return 1 if op in UNARY else 2


def _variants(k: int) -> list:
    return ["".join(v) for v in itertools.product("cs", repeat=k)] + ["g"]


def export_name(op, in_dts, out_dt, variant) -> str:
    return f"{op}_{'_'.join(d.code for d in in_dts)}_{out_dt.code}_{variant}"


def ew_source(op: str, in_dts: tuple, out_dt, cdt) -> KernelSource:
    key = ("ew", op, tuple(d.name for d in in_dts), out_dt.name, cdt.name)
    return source(key, lambda: _build(op, in_dts, out_dt, cdt, key))


def _build(op, in_dts, out_dt, cdt, key) -> KernelSource:
    k = len(in_dts)
    c_expr(op, cdt)  # validates op/dtype support before any code is generated
    exports = []
    for v in _variants(k):
        nconst = 1 + k if v != "g" else 2 + MAX_DIMS + k * (1 + MAX_DIMS)
        exports.append(hal.Export(export_name(op, in_dts, out_dt, v), workgroup_size=(WORKGROUP, 1, 1),
                                  bindings=1 + k, constants=nconst))
    return KernelSource(key, exports, lambda: _cuda(op, in_dts, out_dt, cdt),
                        lambda: _numpy(op, in_dts, out_dt, cdt))


def tiled_source(op: str, in_dts: tuple, kinds: str, out_dt, cdt) -> KernelSource:
    """The tiled variant (``_tiled_cuda``) of the family ``ew_source(op, in_dts, out_dt, cdt)`` for
    inputs read as `kinds` (``_tiled``): a source of its own, so that it is compiled only where a
    transposed view is read (a tiled kernel in each of the 717 one-input families made compiling them
    all about 40% longer)."""
    key = ("ew_t", op, tuple(d.name for d in in_dts), kinds, out_dt.name, cdt.name)
    return source(key, lambda: _build_tiled(op, in_dts, kinds, out_dt, cdt, key))


def tiled_variant(kinds: str) -> str:
    """The export suffix of the tiled variant for inputs read as `kinds` (``_tiled``): "t" for one
    transposed input, else "t" and the kinds ("ttd": two inputs, the first transposed, the second
    direct)."""
    return "t" if kinds == "t" else "t" + kinds


def _build_tiled(op, in_dts, kinds, out_dt, cdt, key) -> KernelSource:
    expr = c_expr(op, cdt)  # validates op/dtype support before any code is generated
    k = len(in_dts)
    name = export_name(op, in_dts, out_dt, tiled_variant(kinds))
    export = hal.Export(name, workgroup_size=(TILE, TILE_ROWS, 1), bindings=1 + k, constants=4 + 3 * k)

    def cuda() -> str:
        parts = [COMPLEX_SOURCE] if needs_complex(cdt, out_dt, *in_dts) else []
        parts.append(_tiled_cuda(op, in_dts, kinds, out_dt, cdt, expr, result_compute(op, cdt, out_dt)))
        return "\n".join(parts)

    def numpy_code() -> dict:
        strided = ew_source(op, in_dts, out_dt, cdt).numpy_code()[export_name(op, in_dts, out_dt, "g")]

        def tiled_fn(workgroups, bindings, c):  # the family's strided code over the same layout
            batch, rows, cols = c[:3]
            consts = [batch * rows * cols, 3, batch, rows, cols] + [0] * (MAX_DIMS - 3)
            for i, kind in enumerate(kinds):
                offset, stride, batch_stride = c[3 + 3 * i:6 + 3 * i]
                inner = [1, stride] if kind == "t" else [stride, 1] if kind == "d" else [0, 0]  # (row, column)
                consts += [offset, batch_stride, *inner] + [0] * (MAX_DIMS - 3)
            strided(None, bindings, consts)

        return {name: tiled_fn}

    return KernelSource(key, [export], cuda, numpy_code)


# ---- CUDA C -----------------------------------------------------------------------------------

def _cuda(op, in_dts, out_dt, cdt) -> str:
    k = len(in_dts)
    names = ["a", "b"] if k == 2 else (["a"] if k == 1 else ["c", "a", "b"])
    expr = c_expr(op, cdt)
    res_compute = result_compute(op, cdt, out_dt)
    parts = [COMPLEX_SOURCE] if needs_complex(cdt, out_dt, *in_dts) else []
    for v in _variants(k):
        name = export_name(op, in_dts, out_dt, v)
        params = [f"{out_dt.c_storage}* __restrict__ out"]
        params += [f"const {d.c_storage}* __restrict__ in{i}" for i, d in enumerate(in_dts)]
        params.append("u32 n")
        body = []
        if v == "g":
            params.append("u32 ndim")
            params += [f"u32 s{d}" for d in range(MAX_DIMS)]
            for i in range(k):
                params.append(f"u32 o{i}")
                params += [f"u32 t{i}_{d}" for d in range(MAX_DIMS)]
        else:
            params += [f"u32 o{i}" for i in range(k)]
            body += _vector_loop(v, names, in_dts, out_dt, cdt, expr, res_compute)
        if v == "g":
            body += _strided_loops(names, in_dts, out_dt, cdt, expr, res_compute)
        else:
            refs = [f"in{i}[o{i} + i]" if v[i] == "c" else f"in{i}[o{i}]" for i in range(k)]
            body += _unrolled_loop(names, in_dts, out_dt, cdt, expr, res_compute, lambda indent: [], refs)
        parts.append(f'extern "C" __global__ void {name}({", ".join(params)}) {{\n' + "\n".join(body) + "\n}\n")
    return "\n".join(parts)


def _strided_loops(names, in_dts, out_dt, cdt, expr, res_compute) -> list:
    """The strided variant's body: output element i at its coordinates in the collapsed shape
    (constants ``s0``.., ``ndim`` of them), input k's element at ``o<k>`` plus each coordinate times
    its stride (``cuda_common.strided_positions``: u32 divisions, no local memory).

    Where the last dim's length is a multiple of 4 and every input's stride there is 0 or 1, a
    thread computes 4 neighbours along it from one set of coordinates and stores them as one
    vector; an input of unit stride whose position is a multiple of 4 is loaded as one vector too,
    any other element by element (a broadcast one reads one element four times, from the L1).
    Otherwise 4 elements a thread, a workgroup's width apart (``_unrolled_loop``): a strided input
    read 4 neighbours a thread would spread a warp's access over more lines. With u64 divisions and
    the constants in local memory, one element a thread, a broadcast add of 4096x4096 took 2.2x
    PyTorch's time on an H200 (docs/performance.md)."""
    k = len(in_dts)

    def position(index: str, indent: str) -> list:
        return strided_positions(index, [(f"p{i}", f"o{i}", f"t{i}_") for i in range(k)], MAX_DIMS, indent)

    def compute(refs: list, indent: str) -> list:
        lines = []
        for nm, d, ref in zip(names, in_dts, refs):
            target = "bool" if nm == "c" else cdt.c_compute
            lines.append(f"{indent}const {target} {nm} = {_load(d, ref, nm, cdt)};")
        return lines + [f"{indent}const {res_compute} r = {expr};"]

    lines = ["  u32 last = 1;"] + [f"  int ls{i} = 0;" for i in range(k)]
    for d in range(MAX_DIMS):
        picks = " ".join(f"ls{i} = (int)t{i}_{d};" for i in range(k))
        lines.append(f"  if (ndim == {d + 1}u) {{ last = s{d}; {picks} }}")
    unit = " && ".join(f"(ls{i} == 0 || ls{i} == 1)" for i in range(k))
    lines += [f"  if (ndim > 0 && (last & 3u) == 0 && {unit}) {{",
              "    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < (n >> 2);"
              " j += (u64)blockDim.x * gridDim.x) {"]
    lines += position("(u32)j << 2", "      ")
    for i, d in enumerate(in_dts):
        vec = f"rt_vec4<{d.c_storage}>"
        lines += [f"      {vec} w{i};",
                  f"      if (ls{i} == 1 && (p{i} & 3) == 0) w{i} = *reinterpret_cast<const {vec}*>(in{i} + p{i});",
                  f"      else {{ for (int e = 0; e < 4; ++e) w{i}.v[e] = in{i}[p{i} + (i64)e * ls{i}]; }}"]
    lines += [f"      rt_vec4<{out_dt.c_storage}> ov;", "      #pragma unroll", "      for (int e = 0; e < 4; ++e) {"]
    lines += compute([f"w{i}.v[e]" for i in range(k)], "        ")
    lines += [f"        ov.v[e] = {store_expr(out_dt, 'r')};", "      }",
              f"      reinterpret_cast<rt_vec4<{out_dt.c_storage}>*>(out)[j] = ov;", "    }", "    return;", "  }"]
    return lines + _unrolled_loop(names, in_dts, out_dt, cdt, expr, res_compute,
                                  lambda indent: position("(u32)i", indent), [f"in{i}[p{i}]" for i in range(k)])


def _unrolled_loop(names, in_dts, out_dt, cdt, expr, res_compute, position, refs: list) -> list:
    """One element at a time (the contiguous variants' unaligned case, the strided one's where its
    vectors do not apply), 4 a thread (``cuda_common.unrolled_elements``). ``position(indent)``: the
    statements placing element i before ``refs``, each input's element, are read."""
    def body(indent: str) -> list:
        lines = []
        for i, (nm, d) in enumerate(zip(names, in_dts)):
            target = "bool" if nm == "c" else cdt.c_compute
            lines.append(f"{indent}const {target} {nm} = {_load(d, f'r{i}[e]', nm, cdt)};")
        return lines + [f"{indent}const {res_compute} r = {expr};", f"{indent}out[i] = {store_expr(out_dt, 'r')};"]

    return unrolled_elements([d.c_storage for d in in_dts], refs, position, body)


#: The tiled variant's workgroup, TILE x TILE_ROWS threads (a warp a row of it), and the edge of the
#: tiles it moves one element an access.
TILE, TILE_ROWS = 32, 8
#: The edge of the tiles it moves in vectors (``wide_tiles``): a 64x64 tile of elements of at most 4
#: bytes, 16.6 KB of shared memory at 4 bytes (64x65 tiles of complex128 would exceed a workgroup's
#: 48 KB of static shared memory).
WIDE_TILE = 64
#: The bytes of the widest vector a thread moves, and the most elements in one.
VECTOR_BYTES, VECTOR_ELEMENTS = 16, 8
#: Inputs a tiled op reads at most (two 64x65 tiles of 4 bytes take 33 KB of the 48 KB of static
#: shared memory a workgroup may have). The tiled variant's constants: the output's batch count,
#: rows and columns (contiguous); per input, its offset, stride (a transposed input's column
#: stride, a direct one's row stride) and batch stride; then 1 for wide tiles (``_tiled``).
MAX_TILED_INPUTS = 2


def wide_tiles(dtypes: tuple, layout: tuple) -> bool:
    """Whether the tiled variant over ``layout`` (its constants but the last) of an op whose inputs
    and output have `dtypes` moves WIDE_TILE tiles in vectors (``tile_vector``): elements of at most
    4 bytes, and rows, columns, offsets and strides that are multiples of the vector (every vector
    aligned and whole). Measured on an H200, 8192² float32: 134 us so, 206 us in 32x32 tiles one
    element an access; an unaligned 8190² one: 226 us in 64x64 tiles one element an access, 220 us
    in 32x32."""
    vector = tile_vector(*dtypes)
    return vector > 1 and all(value % vector == 0 for value in layout[1:])


def tile_vector(*dtypes) -> int:
    """The elements a thread moves an access in WIDE_TILE tiles of `dtypes` (inputs and output): as
    many as VECTOR_BYTES of the widest hold (at most VECTOR_ELEMENTS); 1 (no wide tiles) for
    elements of more than 4 bytes."""
    width = max(d.itemsize for d in dtypes)
    return min(VECTOR_ELEMENTS, VECTOR_BYTES // width) if width <= 4 else 1


def _tiled_cuda(op, in_dts, kinds, out_dt, cdt, expr, res_compute) -> str:
    """The tiled variant: a workgroup of TILE x TILE_ROWS threads computes one tile of the output's
    batch blockIdx.z. Each transposed input ("t") is loaded down its contiguous rows into a tile of
    shared memory (as stored; one padding column keeps the transposed reads of shared memory to at
    most two accesses a bank); each direct input ("d", unit stride along the output's rows) is read
    where the output is written, along its rows, and a one-element input ("s") there too. A
    WIDE_TILE tile in vectors (``tile_vector``) where ``wide`` is set (``wide_tiles``), else a
    TILE x TILE tile one element an access."""
    name = export_name(op, in_dts, out_dt, tiled_variant(kinds))
    names = ["a", "b"][:len(in_dts)]
    n = tile_vector(*in_dts, out_dt)
    can_be_wide = n > 1
    edge = WIDE_TILE if can_be_wide else TILE
    tiled = [i for i, kind in enumerate(kinds) if kind == "t"]

    def value(refs: list) -> str:
        """The output element from each input's element (C lvalues `refs`), as ``v``."""
        loads = " ".join(f"const {cdt.c_compute} {nm} = {_load(d, ref, nm, cdt)};"
                         for nm, d, ref in zip(names, in_dts, refs))
        return f"{loads} const {res_compute} v = {expr};"

    def vec(d) -> str:
        return f"rt_vec<{d.c_storage}, {n}>"

    vector = ""
    if can_be_wide:
        lanes = WIDE_TILE // n  # threads along a tile row
        passes = TILE * TILE_ROWS // lanes  # tile rows a pass of the workgroup covers
        loads = "\n".join(
            f"        {{ const {vec(in_dts[i])} w = *reinterpret_cast<const {vec(in_dts[i])}*>"
            f"(in{i} + base{i} + (u64)c * st{i} + r); "
            + " ".join(f"tile{i}[j][x + {e}] = w.v[{e}];" for e in range(n)) + " }" for i in tiled)
        direct = "\n".join(
            f"        const {vec(in_dts[i])} w{i} = *reinterpret_cast<const {vec(in_dts[i])}*>"
            f"(in{i} + base{i} + (u64)rr * st{i} + c);" for i, kind in enumerate(kinds) if kind == "d")
        values = "\n".join(
            "        { " + value([f"tile{i}[x + {e}][j]" if kind == "t" else f"w{i}.v[{e}]" if kind == "d"
                                else f"in{i}[base{i}]" for i, kind in enumerate(kinds)])
            + f" ov.v[{e}] = {store_expr(out_dt, 'v')}; }}" for e in range(n))
        vector = f"""  if (wide) {{
    const u32 r0 = blockIdx.y * {WIDE_TILE}, c0 = blockIdx.x * {WIDE_TILE};
    const u32 t = threadIdx.y * {TILE} + threadIdx.x;
    const u32 x = (t % {lanes}) * {n}, y = t / {lanes};
    const u32 r = r0 + x;
    #pragma unroll
    for (u32 j = y; j < {WIDE_TILE}; j += {passes}) {{
      const u32 c = c0 + j;
      if (r < rows && c < cols) {{
{loads}
      }}
    }}
    __syncthreads();
    const u32 c = c0 + x;
    #pragma unroll
    for (u32 j = y; j < {WIDE_TILE}; j += {passes}) {{
      const u32 rr = r0 + j;
      if (rr < rows && c < cols) {{
{direct}
        {vec(out_dt)} ov;
{values}
        *reinterpret_cast<{vec(out_dt)}*>(out + (bz * rows + rr) * (u64)cols + c) = ov;
      }}
    }}
    return;
  }}
"""
    params = [f"{out_dt.c_storage}* __restrict__ out"]
    params += [f"const {d.c_storage}* __restrict__ in{i}" for i, d in enumerate(in_dts)]
    params += ["u32 batch", "u32 rows", "u32 cols"]
    for i in range(len(in_dts)):
        params += [f"u32 off{i}", f"u32 st{i}", f"u32 bs{i}"]
    params.append("u32 wide")
    shared = "\n".join(f"  __shared__ {in_dts[i].c_storage} tile{i}[{edge}][{edge + 1}];" for i in tiled)
    bases = "\n".join(f"  const u64 base{i} = (u64)off{i} + bz * bs{i};" for i in range(len(in_dts)))
    scalar_loads = " ".join(f"tile{i}[j][threadIdx.x] = in{i}[base{i} + (u64)c * st{i} + r];" for i in tiled)
    scalar_refs = [f"tile{i}[threadIdx.x][j]" if kind == "t" else f"in{i}[base{i} + (u64)rr * st{i} + c]"
                   if kind == "d" else f"in{i}[base{i}]" for i, kind in enumerate(kinds)]
    return f"""extern "C" __global__ void {name}({", ".join(params)}) {{
{shared}
  const u64 bz = blockIdx.z;
{bases}
{vector}  const u32 r0 = blockIdx.y * {TILE}, c0 = blockIdx.x * {TILE};
  const u32 r = r0 + threadIdx.x;
  #pragma unroll
  for (u32 j = threadIdx.y; j < {TILE}; j += {TILE_ROWS}) {{
    const u32 c = c0 + j;
    if (r < rows && c < cols) {{ {scalar_loads} }}
  }}
  __syncthreads();
  const u32 c = c0 + threadIdx.x;
  #pragma unroll
  for (u32 j = threadIdx.y; j < {TILE}; j += {TILE_ROWS}) {{
    const u32 rr = r0 + j;
    if (rr < rows && c < cols) {{
      {value(scalar_refs)}
      out[(bz * rows + rr) * (u64)cols + c] = {store_expr(out_dt, "v")};
    }}
  }}
}}
"""


def result_compute(op: str, cdt, out_dt) -> str:
    """C type of an op's value before it is stored: bool for predicates, the real part type of complex
    abs, real and imag, else the compute type."""
    if op in PREDICATES:
        return "bool"
    if cdt.is_complex and not out_dt.is_complex and op != "cast":
        return out_dt.c_compute
    return cdt.c_compute


def _load(d, ref: str, name: str, cdt) -> str:
    """C expression of input element `ref` of dtype d as the kernel's compute type (bool for a condition)."""
    value = load_expr(d, ref)
    if name == "c":
        return convert(value, d.c_compute, "bool")
    if d.is_float and cdt.is_int:
        return float_to_int_expr(cdt, value)
    return convert(value, d.c_compute, cdt.c_compute)


def contiguous_width(variant, in_dts, out_dt) -> int:
    """Elements a thread moves as one vector in a contiguous variant (``cuda_common.vector_width``)."""
    return vector_width([d for d, v in zip(in_dts, variant) if v == "c"] + [out_dt])


def _vector_loop(variant, names, in_dts, out_dt, cdt, expr, res_compute) -> list:
    """Contiguous variants: when n and the offsets are multiples of the vector width W (4, or 8 for
    2-byte elements), move W elements per vector access."""
    contiguous = [i for i, v in enumerate(variant) if v == "c"]
    W = contiguous_width(variant, in_dts, out_dt)
    check = " | ".join(["n"] + [f"o{i}" for i in contiguous])
    lines = [f"  if ((({check}) & {W - 1}u) == 0) {{",
             f"    const u64 nv = n / {W}u;",
             "    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < nv;"
             " j += (u64)blockDim.x * gridDim.x) {"]
    for i in contiguous:
        d = in_dts[i]
        lines.append(f"      const rt_vec<{d.c_storage}, {W}> v{i} = "
                     f"reinterpret_cast<const rt_vec<{d.c_storage}, {W}>*>(in{i} + o{i})[j];")
    lines.append(f"      rt_vec<{out_dt.c_storage}, {W}> ov;")
    lines.append("      #pragma unroll")
    lines.append(f"      for (int e = 0; e < {W}; ++e) {{")
    for i, (nm, d) in enumerate(zip(names, in_dts)):
        target = "bool" if nm == "c" else cdt.c_compute
        ref = f"v{i}.v[e]" if variant[i] == "c" else f"in{i}[o{i}]"
        lines.append(f"        const {target} {nm} = {_load(d, ref, nm, cdt)};")
    lines.append(f"        const {res_compute} r = {expr};")
    lines.append(f"        ov.v[e] = {store_expr(out_dt, 'r')};")
    lines.append("      }")
    lines.append(f"      reinterpret_cast<rt_vec<{out_dt.c_storage}, {W}>*>(out)[j] = ov;")
    lines.append("    }")
    lines.append("    return;")
    lines.append("  }")
    return lines


# ---- numpy ------------------------------------------------------------------------------------

def _numpy(op, in_dts, out_dt, cdt) -> dict:
    k = len(in_dts)
    compute = compute_np(cdt)
    native_out = out_dt is not _dt.bfloat16

    quiet = op not in _FAST
    int_fn = _NP_INT.get(op) if cdt.is_int else _NP_COMPLEX.get(op) if cdt.is_complex else None
    to_int = op == "cast" and out_dt.is_int

    def apply(out, ins):
        if not quiet:
            _apply(out, ins)
            return
        with np.errstate(**ERRSTATE):
            _apply(out, ins)

    def _apply(out, ins):
        if True:
            vals = [to_compute(x, d) for x, d in zip(ins, in_dts)]
            if op == "where":
                c, a, b = vals
                a = a if a.dtype == compute else a.astype(compute)
                b = b if b.dtype == compute else b.astype(compute)
                if native_out:
                    np.copyto(out, b, casting="unsafe")
                    np.copyto(out, a, casting="unsafe", where=c.astype(bool, copy=False))
                else:
                    store(out, np.where(c, a, b), out_dt)
                return
            if op in ("cast", "copy"):
                v = vals[0]
                store(out, _dt.float_to_int(v, out_dt) if to_int and v.dtype.kind == "f" else v, out_dt)
                return
            vals = [v if v.dtype == compute else v.astype(compute) for v in vals]
            if op == "sigmoid":
                tmp = out if out.dtype in (np.float32, np.float64) else np.empty(out.shape, np.float32)
                np.negative(vals[0], out=tmp, casting="unsafe")
                np.exp(tmp, out=tmp)
                tmp += 1.0
                np.reciprocal(tmp, out=tmp)
                if tmp is not out:
                    store(out, tmp, out_dt)
                return
            fn = _BOOL_UFUNC.get(op) if cdt is _dt.bool_ else int_fn
            if op == "nextafter" and cdt is _dt.bfloat16:
                fn = np_nextafter16
            fn = fn or _NP_UFUNC[op]
            if native_out and (out.dtype == compute or op in PREDICATES) and isinstance(fn, np.ufunc):
                fn(*vals, out=out)
            else:
                store(out, fn(*vals), out_dt)

    def contiguous_fn(variant):
        def views(bindings, c):
            n = c[0]
            out = np.frombuffer(bindings[0], dtype=out_dt.storage, count=n)
            ins = []
            for i in range(k):
                base = np.frombuffer(bindings[1 + i], dtype=in_dts[i].storage)
                o = c[1 + i]
                ins.append(base[o:o + n] if variant[i] == "c" else base[o:o + 1].reshape(()))
            return out, ins

        def run(workgroups, bindings, c):
            apply(*views(bindings, c))

        def prepare(workgroups, bindings, c):
            """The views made once (the caller runs it under errstate(all="ignore")): see cpu_program."""
            out, ins = views(bindings, c)
            if op == "where" and native_out and ins[0].dtype == np.bool_ and all(
                    x.dtype == compute for x in ins[1:]):
                return functools.partial(_where_into, out, *ins)
            return functools.partial(_apply, out, ins)

        run.prepare = prepare
        return run

    def strided_fn(workgroups, bindings, c):
        n, ndim = c[0], c[1]
        shape = tuple(c[2:2 + ndim])
        out = np.frombuffer(bindings[0], dtype=out_dt.storage, count=n).reshape(shape)
        ins = []
        for i in range(k):
            base = 2 + MAX_DIMS + i * (1 + MAX_DIMS)
            strides = tuple(signed(s) for s in c[base + 1:base + 1 + ndim])
            ins.append(strided_view(bindings[1 + i], in_dts[i], shape, strides, c[base]))
        apply(out, ins)

    ufunc = _BOOL_UFUNC.get(op) if cdt is _dt.bool_ else None
    ufunc = ufunc or _NP_UFUNC.get(op)
    fast = (ufunc is not None and int_fn is None and not quiet and cdt is not _dt.bfloat16
            and all(d is cdt for d in in_dts)
            and (out_dt is cdt or op in PREDICATES))
    fns = {}
    for v in _variants(k):
        if v == "g":
            fn = strided_fn
        elif fast:
            fn = _fast_contiguous(ufunc, v, cdt, out_dt)
        else:
            fn = contiguous_fn(v)
        fns[export_name(op, in_dts, out_dt, v)] = fn
    return fns


def _where_into(out, cond, a, b) -> None:
    np.copyto(out, b, casting="unsafe")
    np.copyto(out, a, casting="unsafe", where=cond)


#: numpy deprecates a positional output for these (it reads like a third operand).
_OUT_KEYWORD_ONLY = frozenset((np.maximum, np.minimum))


def _fast_contiguous(ufunc, variant: str, cdt, out_dt):
    """The common case as one ufunc call on views of the bound bytes (no conversions needed)."""
    frombuffer = np.frombuffer
    dt, item, odt = cdt.storage, cdt.itemsize, out_dt.storage
    if variant == "cc":
        def run(workgroups, b, c):
            n = c[0]
            ufunc(frombuffer(b[1], dt, n, c[1] * item), frombuffer(b[2], dt, n, c[2] * item),
                  out=frombuffer(b[0], odt, n))
    elif variant == "cs":
        def run(workgroups, b, c):
            n = c[0]
            ufunc(frombuffer(b[1], dt, n, c[1] * item), frombuffer(b[2], dt, 1, c[2] * item)[0],
                  out=frombuffer(b[0], odt, n))
    elif variant == "sc":
        def run(workgroups, b, c):
            n = c[0]
            ufunc(frombuffer(b[1], dt, 1, c[1] * item)[0], frombuffer(b[2], dt, n, c[2] * item),
                  out=frombuffer(b[0], odt, n))
    elif variant == "c":
        def run(workgroups, b, c):
            n = c[0]
            ufunc(frombuffer(b[1], dt, n, c[1] * item), out=frombuffer(b[0], odt, n))
    else:
        def run(workgroups, b, c):
            n = c[0]
            ins = [frombuffer(b[1 + i], dt, n if v == "c" else 1, c[1 + i] * item) for i, v in enumerate(variant)]
            ufunc(*ins, out=frombuffer(b[0], odt, n))

    def prepare(workgroups, b, c):
        """The same ufunc call bound once to views of the bytes (broadcast inputs as 0-d views, read
        at each call): a C-level callable, for callers that run it again on the same bindings."""
        n = c[0]
        ins = [frombuffer(b[1 + i], dt, n, c[1 + i] * item) if v == "c"
               else frombuffer(b[1 + i], dt, 1, c[1 + i] * item).reshape(()) for i, v in enumerate(variant)]
        out = frombuffer(b[0], odt, n)
        if ufunc in _OUT_KEYWORD_ONLY:
            return functools.partial(ufunc, *ins, out=out)
        # The output positionally: a keyword made the partial merge a dict at every call (~0.2 us of
        # a ~0.6 us call on 1,000 floats).
        return functools.partial(ufunc, *ins, out)

    run.prepare = prepare
    return run


# ---- planning ---------------------------------------------------------------------------------

def input_variants(out_shape: tuple, layouts: list) -> tuple:
    """Per input, how it is read over the output's elements: "s" (one broadcast element), "c"
    (contiguous from its offset) or "g" (strided); and the inputs' strides broadcast to out_shape."""
    cstr = contiguous_strides(out_shape)
    bstrides = [broadcast_strides(shp, st, out_shape) for shp, st, _ in layouts]
    variant = []
    for bs in bstrides:
        if all(s == 0 or d == 1 for s, d in zip(bs, out_shape)):
            variant.append("s")
        elif all(s == cs or d == 1 for s, cs, d in zip(bs, cstr, out_shape)):
            variant.append("c")
        else:
            variant.append("g")
    return variant, bstrides, cstr


class _CopyOf:
    """A node seen as the "copy" of its first input that computes it (``plan_copy``)."""

    op = "copy"

    def __init__(self, node) -> None:
        self.params = self.dtype = node.dtype
        self.shape, self.inputs = node.shape, node.inputs[:1]


def plan_copy(node, layout: tuple, ctx) -> list:
    """The dispatch computing ``node`` as a copy of its first input, read through ``layout`` (a
    strided view's (shape, strides, offset)): a node whose value is another array's, made whole."""
    return plan(_CopyOf(node), [layout], ctx)


def plan(node, layouts: list, ctx) -> list:
    """Dispatch for one elementwise node. layouts: per input (shape, strides, offset)."""
    out_shape = node.shape
    n = size_of(out_shape)
    in_dts = tuple(inp.dtype for inp in node.inputs)
    src = ew_source(node.op, in_dts, node.dtype, node.params)
    if n == 0:
        return []
    variant, bstrides, cstr = input_variants(out_shape, layouts)
    bindings = [("out",)] + [("in", i) for i in range(len(layouts))]
    if "g" not in variant:
        v = "".join(variant)
        consts = [n] + [lay[2] for lay in layouts]
        name = export_name(node.op, in_dts, node.dtype, v)
        # (a vector a thread where aligned, else 4 elements a thread: _unrolled_loop)
        groups = grid_1d(-(-n // contiguous_width(v, in_dts, node.dtype)))
        return [("dispatch", src, name, (groups, 1, 1), consts, bindings)]
    else:
        v = "g"
        shape, strides_list = collapse(out_shape, [cstr] + bstrides)
        strides_list = strides_list[1:]
        if ctx.is_gpu and len(in_dts) <= MAX_TILED_INPUTS:
            tiled = _tiled(shape, strides_list, layouts, ctx.device.limits["max_workgroup_count"], in_dts,
                           node.dtype)
            if tiled is not None:
                kinds, constants, grid = tiled
                return [("dispatch", tiled_source(node.op, in_dts, kinds, node.dtype, node.params),
                         export_name(node.op, in_dts, node.dtype, tiled_variant(kinds)), grid, constants, bindings)]
        consts = [n, len(shape)] + list(shape) + [0] * (MAX_DIMS - len(shape))
        for lay, st in zip(layouts, strides_list):
            consts.append(lay[2])
            consts += [u32(s) for s in st] + [0] * (MAX_DIMS - len(st))
    name = export_name(node.op, in_dts, node.dtype, v)
    return [("dispatch", src, name, (grid_1d(-(-n // 4)), 1, 1), consts, bindings)]  # (4 a thread: _strided_loops)


def _tiled(shape: tuple, strides_list: list, layouts: list, max_grid: tuple, in_dts: tuple, out_dt) -> tuple | None:
    """(the inputs' kinds, the tiled variant's constants (see ``wide_tiles``), its grid of tiles) for
    an op over the collapsed ``shape`` (a batch of rows and columns) whose inputs' strides
    (``strides_list``) make at least one a transpose of the output ("t": the output's rows run down
    its unit-stride dim, its columns across a larger stride) and every other one direct ("d": unit
    stride along the output's rows, any row and batch stride) or one element ("s"); None for any
    other layout, or a grid beyond the device's ``max_grid``, which the strided variant reads."""
    if len(shape) not in (2, 3):
        return None
    *batch_dims, rows, cols = shape
    if rows < 2 or cols < 2:
        return None
    kinds = ""
    per_input: list = []
    for (_, _, offset), strides in zip(layouts, strides_list):
        *batch_strides, row_stride, column_stride = strides
        batch_stride = batch_strides[0] if batch_strides else 0
        if batch_stride < 0 or row_stride < 0:
            return None
        if row_stride == 1 and column_stride > 1:
            kinds += "t"
            per_input += [offset, column_stride, batch_stride]
        elif column_stride == 1:
            kinds += "d"
            per_input += [offset, row_stride, batch_stride]
        elif column_stride == row_stride == batch_stride == 0:
            kinds += "s"
            per_input += [offset, 0, 0]
        else:
            return None
    if "t" not in kinds:
        return None
    batch = batch_dims[0] if batch_dims else 1
    layout = (batch, rows, cols, *per_input)
    wide = wide_tiles((*in_dts, out_dt), layout)
    edge = WIDE_TILE if wide else TILE
    grid = ((cols + edge - 1) // edge, (rows + edge - 1) // edge, batch)
    if any(count > most for count, most in zip(grid, max_grid)) or max(layout) > 0xFFFFFFFF:
        return None
    return kinds, [*layout, int(wide)], grid
