"""complex64 and complex128 against numpy on every runtime device: the CPU drivers (numpy kernels) and
the simulated GPU (the generated CUDA C compiled for the CPU by cuda_emu), plus cuda where there is one.

Promotion follows the array API standard, special values (NaN, infinities, signed zeros in either
part) the standard's special cases (C99 Annex G) where numpy follows them too, and everything a
complex operand cannot do raises a typed error when the op is built.
"""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import DEVICES, simulated_gpu

import hal
import runtime as rt
from runtime import dtypes as _dt
from runtime.device import context_for

COMPLEX = ("complex64", "complex128")
TOL = {"complex64": dict(rtol=2e-5, atol=2e-6), "complex128": dict(rtol=1e-12, atol=1e-13)}
NP_NAME = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh", "acosh": "arccosh",
           "atanh": "arctanh", "conj": "conjugate", "negative": "negative", "positive": "positive"}
UNARY = ("exp", "log", "sqrt", "expm1", "log1p", "log2", "log10", "sin", "cos", "tan", "sinh", "cosh", "tanh",
         "asin", "acos", "atan", "asinh", "acosh", "atanh", "square", "sign", "conj", "real", "imag", "abs",
         "negative", "positive", "reciprocal", "round", "isnan", "isinf", "isfinite")
#: The functions with special cases in the standard (C99 Annex G), checked over every pair of special parts.
SPECIAL = ("exp", "log", "sqrt", "expm1", "log1p", "sinh", "cosh", "tanh", "sin", "cos", "tan", "asinh", "asin",
           "acos", "acosh", "atanh", "atan", "abs", "sign", "isnan", "isinf", "isfinite", "square", "conj",
           "real", "imag", "reciprocal")
PARTS = (0.0, -0.0, 1.0, -1.0, 0.5, -2.5, np.inf, -np.inf, np.nan)


@pytest.fixture(scope="module", params=[*DEVICES, "simulated-cuda"])
def dev(request):
    """A device URI of a runtime device, or the simulated GPU running the generated CUDA C."""
    if request.param != "simulated-cuda":
        yield request.param
        return
    # (without GEMM libraries: products run on the generated matmul kernels; the library's
    # complex GEMMs: test_library_matmul.py)
    device, emulated = simulated_gpu(libraries=False)
    try:
        with emulated:
            yield device
    finally:
        device.close()


def np_fn(name: str):
    if name == "sign":
        return _np_sign
    if name == "expm1":
        return _np_expm1
    if name == "log1p":
        return _np_log1p
    return getattr(np, NP_NAME.get(name, name))


def _np_log1p(z):
    """log(1 + z), near 0 from log1p of |1 + z|^2 - 1 = x (2 + x) + y^2 in extended precision (numpy's
    complex log1p is log(1 + z): it loses a small z, log1p(1e-20 + 0j) is 0 there)."""
    z = np.asarray(z)
    with np.errstate(all="ignore"):
        r = np.log1p(z)
        x, y = z.real.astype(np.longdouble), z.imag.astype(np.longdouble)
        small = np.isfinite(z) & (np.abs(z) < 0.5)
        r.real = np.where(small, (0.5 * np.log1p(x * (2 + x) + y * y)).astype(z.real.dtype), r.real)
    return r


def _np_expm1(z):
    """numpy's expm1 for finite z, exp(z) - 1 otherwise (numpy's complex expm1 has none of the standard's
    special cases: it makes expm1(inf + 0j) inf + nanj, the standard inf + 0j)."""
    z = np.asarray(z)
    with np.errstate(all="ignore"):
        r = np.array(np.where(np.isfinite(z), np.expm1(z), np.exp(z) - 1).astype(z.dtype))
        r.real = np.where(z == 0, 0, r.real)  # expm1(-0 + 0j) is +0 + 0j (the standard's "0 + 0j")
        return r


def _np_sign(z):
    """The standard's sign of complex z: z / |z| (0 at 0, NaN parts for NaN or two infinite parts)."""
    z = np.asarray(z)
    with np.errstate(all="ignore"):
        a = np.abs(z)
        out = np.where(a == 0, 0, z / np.where(a == 0, 1, a)).astype(z.dtype)
        re_inf, im_inf = np.isinf(z.real), np.isinf(z.imag)
        out = np.where(re_inf & ~im_inf & ~np.isnan(z.imag), np.sign(z.real) + 0j, out)
        out = np.where(im_inf & ~re_inf & ~np.isnan(z.real), 1j * np.sign(z.imag), out)
    return out.astype(z.dtype)


def call(name: str, x):
    return getattr(rt, name)(x)


def rand_complex(shape, dtype, rng) -> np.ndarray:
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def special_grid(dtype) -> np.ndarray:
    re, im = np.meshgrid(np.array(PARTS), np.array(PARTS), indexing="ij")
    z = np.empty(re.shape, np.complex128)
    z.real, z.imag = re, im  # (re + 1j * im would turn infinite parts' partners into NaN)
    return z.reshape(-1).astype(dtype)


def check(got, want, dtype, *, rtol=None, atol=None):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    if want.dtype.kind in "fc":
        tol = TOL[dtype] if dtype in TOL else {}
        rtol = rtol if rtol is not None else tol.get("rtol", 0)
        atol = atol if atol is not None else tol.get("atol", 0)
        # part by part: NaN and infinite parts where the reference has them, finite ones close
        for part in ((np.real, np.imag) if want.dtype.kind == "c" else (np.asarray,)):
            np.testing.assert_allclose(part(got), part(want), rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


# ---- dtypes, promotion, creation --------------------------------------------------------------------------


def test_namespace_has_the_complex_dtypes():
    assert rt.complex64 == np.complex64 and rt.complex128 == np.dtype("complex128")
    assert rt.complex64.itemsize == 8 and rt.complex128.itemsize == 16
    info = rt.__array_namespace_info__()
    assert info.default_dtypes()["complex floating"] is rt.complex64
    assert set(info.dtypes(kind="complex floating")) == {"complex64", "complex128"}
    assert rt.isdtype(rt.complex64, "complex floating") and rt.isdtype(rt.complex128, "numeric")
    assert not rt.isdtype(rt.complex64, "real floating") and not rt.isdtype(rt.float32, "complex floating")
    assert rt.finfo(rt.complex64).dtype is rt.float32 and rt.finfo(rt.complex128).eps == np.finfo(np.float64).eps
    assert rt.can_cast(rt.float32, rt.complex64) and not rt.can_cast(rt.complex64, rt.float32)
    assert rt.can_cast(rt.complex64, rt.complex128) and not rt.can_cast(rt.complex128, rt.complex64)


# The array API's table: complex with real floats gives the complex dtype of the larger precision.
STANDARD_PROMOTION = [
    ("complex64", "complex64", "complex64"), ("complex64", "complex128", "complex128"),
    ("complex128", "complex128", "complex128"), ("complex64", "float32", "complex64"),
    ("complex64", "float64", "complex128"), ("complex128", "float32", "complex128"),
    ("complex128", "float64", "complex128"), ("complex64", "float16", "complex64"),
    ("complex128", "float16", "complex128"),
    # mixed kinds the standard leaves to the library: numpy's answers
    ("complex64", "bool", "complex64"), ("complex64", "int8", "complex64"), ("complex64", "uint8", "complex64"),
    ("complex64", "int16", "complex64"), ("complex64", "int32", "complex128"), ("complex64", "int64", "complex128"),
    ("complex64", "uint64", "complex128"), ("complex128", "int64", "complex128"),
    ("complex64", "bfloat16", "complex64"),
]


@pytest.mark.parametrize("a, b, want", STANDARD_PROMOTION)
def test_promotion_table(a, b, want):
    assert rt.result_type(a, b) is _dt.as_dtype(want)
    assert rt.result_type(b, a) is _dt.as_dtype(want)


@pytest.mark.parametrize("array_dtype, scalar, want", [
    ("float32", 1j, "complex64"), ("float64", 1j, "complex128"), ("float16", 1j, "complex64"),
    ("complex64", 1j, "complex64"), ("complex64", 2.5, "complex64"), ("complex64", 3, "complex64"),
    ("complex64", True, "complex64"), ("complex128", 1j, "complex128"), ("int32", 1j, "complex128"),
    ("bool", 1j, "complex128"),
])
def test_python_scalars_are_weak(array_dtype, scalar, want):
    assert rt.result_type(array_dtype, scalar) is _dt.as_dtype(want)
    x = rt.ones((2,), dtype=array_dtype)
    assert (x + scalar).dtype is _dt.as_dtype(want)
    assert (scalar * x).dtype is _dt.as_dtype(want)


def test_creation(dev):
    assert rt.asarray(1 + 2j, device=dev).dtype is rt.complex64
    assert rt.asarray([1j, 2, 3.5], device=dev).dtype is rt.complex64  # Python complex: the default complex dtype
    assert rt.asarray(np.complex128(1j), device=dev).dtype is rt.complex128
    z = rand_complex((3, 4), np.complex128, np.random.default_rng(0))
    check(rt.asarray(z, device=dev).numpy(), z, "complex128")
    check(rt.asarray(z, dtype="complex64", device=dev).numpy(), z.astype(np.complex64), "complex64")
    for dtype in COMPLEX:
        np_dt = np.dtype(dtype)
        check(rt.zeros((2, 3), dtype=dtype, device=dev).numpy(), np.zeros((2, 3), np_dt), dtype)
        check(rt.ones((2, 3), dtype=dtype, device=dev).numpy(), np.ones((2, 3), np_dt), dtype)
        check(rt.empty((0, 3), dtype=dtype, device=dev).numpy(), np.empty((0, 3), np_dt), dtype)
        check(rt.full((5,), 1.5 - 2j, dtype=dtype, device=dev).numpy(), np.full((5,), 1.5 - 2j, np_dt), dtype)
        check(rt.full((2,), 3, dtype=dtype, device=dev).numpy(), np.full((2,), 3, np_dt), dtype)
        check(rt.eye(3, 4, k=1, dtype=dtype, device=dev).numpy(), np.eye(3, 4, k=1, dtype=np_dt), dtype)
        check(rt.linspace(0, 1 + 2j, 5, dtype=dtype, device=dev).numpy(),
              np.linspace(0, 1 + 2j, 5).astype(np_dt), dtype)
        check(rt.full_like(rt.zeros((2,), dtype=dtype, device=dev), 1j).numpy(), np.full((2,), 1j, np_dt), dtype)
    with pytest.raises(TypeError):  # as astype: no imaginary part dropped
        rt.asarray([1 + 2j], dtype="float32", device=dev)
    check(rt.asarray([0j, 2j], dtype="bool", device=dev).numpy(), np.array([False, True]), "bool")
    assert rt.full((2,), 1j, device=dev).dtype is rt.complex64
    assert rt.linspace(0, 1j, 3, device=dev).dtype is rt.complex64
    with pytest.raises(TypeError):
        rt.linspace(0, 1j, 3, dtype="float32", device=dev)


def test_signed_zero_parts_are_kept(dev):
    """-0.0 parts are values of their own: fills, constants and scalar operands keep them."""
    for dtype in COMPLEX:
        got = rt.full((3,), complex(-0.0, -0.0), dtype=dtype, device=dev).numpy()
        assert np.all(np.signbit(got.real)) and np.all(np.signbit(got.imag))
        got = rt.full((3,), complex(0.0, -0.0), dtype=dtype, device=dev).numpy()
        assert not np.any(np.signbit(got.real)) and np.all(np.signbit(got.imag))
        x = rt.full((2,), complex(-0.0, -0.0), dtype=dtype, device=dev)
        a = (x + complex(-0.0, -0.0)).numpy()  # constants of 0j and -0j are not one cached constant
        b = (x + complex(0.0, 0.0)).numpy()
        assert np.all(np.signbit(a.real)) and np.all(np.signbit(a.imag))
        assert not np.any(np.signbit(b.real)) and not np.any(np.signbit(b.imag))


# ---- elementwise ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", COMPLEX)
def test_unary_functions_against_numpy(dev, dtype):
    rng = np.random.default_rng(1)
    z = rand_complex((4, 6), dtype, rng)
    z[0, :3] = [0, 1, -1]  # (some exact values: branch points, zeros)
    x = rt.asarray(z, device=dev)
    for name in UNARY:
        with np.errstate(all="ignore"):
            want = np_fn(name)(z)
        check(call(name, x).numpy(), want, dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
@pytest.mark.parametrize("name", SPECIAL)
def test_special_values_against_numpy(dev, dtype, name):
    """Every pair of parts from 0, -0, finite, +-inf and NaN: the values numpy (C99 Annex G) gives."""
    z = special_grid(dtype)
    with np.errstate(all="ignore"):
        want = np_fn(name)(z)
    got = call(name, rt.asarray(z, device=dev)).numpy()
    check(_unsigned_infinities(got), _unsigned_infinities(want), dtype, rtol=1e-5 if dtype == "complex64" else 1e-12,
          atol=1e-6)


def _unsigned_infinities(w: np.ndarray) -> np.ndarray:
    """An infinite part beside a NaN part made +inf: the standard leaves its sign unspecified there
    (sinh(+inf + NaN j) is +-inf + NaN j, acos(+inf + NaN j) NaN +- inf j, ...)."""
    if w.dtype.kind != "c":
        return w
    w = w.copy()
    re, im = w.real.copy(), w.imag.copy()
    re[np.isinf(re) & np.isnan(im)] = np.inf
    im[np.isinf(im) & np.isnan(re)] = np.inf
    w.real, w.imag = re, im
    return w


@pytest.mark.parametrize("dtype", COMPLEX)
def test_accuracy_over_magnitudes_and_near_branch_points(dev, dtype):
    """Hostile finite inputs: parts from 1e-30 to 1e30 (complex64: 1e-15 to 1e15) of either sign, and
    points near the branch points +-1 and +-i, where 1 - z^2 or |z|^2 - 1 would cancel: within a
    few units in the last place of numpy's (glibc's) results, relative to |result|."""
    rng = np.random.default_rng(11)
    lim = 30 if dtype == "complex128" else 15
    mag = 10.0 ** rng.uniform(-lim, lim, (2, 300))
    sign = rng.choice([-1.0, 1.0], (2, 300))
    wide = sign[0] * mag[0] + 1j * sign[1] * mag[1]
    eps = (rng.standard_normal(40) + 1j * rng.standard_normal(40)) * (1e-4 if dtype == "complex64" else 1e-7)
    near = np.concatenate([1 + eps, -1 + eps, 1j + eps, -1j + eps])
    z = np.concatenate([wide, near]).astype(dtype)
    x = rt.asarray(z, device=dev)
    rtol = 2e-6 if dtype == "complex64" else 1e-14
    for name in ("exp", "log", "sqrt", "log1p", "sin", "tanh", "asin", "acos", "atan", "asinh", "acosh", "atanh",
                 "reciprocal", "sign"):
        with np.errstate(all="ignore"):
            want = np_fn(name)(z).astype(np.complex128)
        got = call(name, x).numpy().astype(np.complex128)
        finite = np.isfinite(want) & (np.abs(want) < np.finfo(dtype).max / 4)
        np.testing.assert_array_equal(np.isfinite(got[finite]), True, err_msg=name)
        g, w = got[finite], want[finite]
        err = np.abs(g - w) / np.where(w == 0, 1, np.abs(w))  # (an exact 0 must be 0)
        assert err.max() <= rtol, (name, z[finite][np.argmax(err)], g[np.argmax(err)], w[np.argmax(err)])
    big = 100.0 if dtype == "complex64" else 750.0  # exp(x) overflows, exp(x) sin(y) does not
    huge = np.array([complex(big, 1e-30), complex(big, np.pi / 2), complex(-big, 1e-30)], dtype)
    for name in ("exp", "sinh", "cosh"):
        got = call(name, rt.asarray(huge, device=dev)).numpy()
        with np.errstate(all="ignore"):
            want = np_fn(name)(huge)
        check(got, want, dtype, rtol=1e-5 if dtype == "complex64" else 1e-13, atol=0)
    for name in ("log1p", "expm1", "sign"):  # 0-d arrays (the CPU drivers' own forms of these)
        for value in (complex(-1.0, 0.0), complex(np.inf, np.nan), complex(1e-20, 2e-20)):
            with np.errstate(all="ignore"):
                want = np_fn(name)(np.array([value], dtype))[0]
            got = call(name, rt.asarray(np.array(value, dtype), device=dev)).numpy()
            assert got.shape == () and got.dtype == np.dtype(dtype)
            check(_unsigned_infinities(got.reshape(1)), _unsigned_infinities(np.array([want])), dtype)
    tiny = np.array([1e-20 + 2e-20j, -3e-25 + 0j], dtype)  # log1p(z) = z - z^2/2 + ...: z itself
    np.testing.assert_allclose(rt.log1p(rt.asarray(tiny, device=dev)).numpy(), tiny, rtol=rtol)


# The standard's special cases that fix a sign or a part numpy may leave to the platform.
STANDARD_CASES = [
    ("exp", complex(0.0, 0.0), complex(1.0, 0.0)), ("exp", complex(-0.0, 0.0), complex(1.0, 0.0)),
    ("exp", complex(np.inf, 0.0), complex(np.inf, 0.0)), ("exp", complex(-np.inf, 1.0), complex(0.0, 0.0)),
    ("exp", complex(np.inf, np.inf), complex(np.inf, np.nan)), ("exp", complex(np.nan, 0.0), complex(np.nan, 0.0)),
    ("exp", complex(-np.inf, np.nan), complex(0.0, 0.0)),
    ("log", complex(-0.0, 0.0), complex(-np.inf, np.pi)), ("log", complex(0.0, 0.0), complex(-np.inf, 0.0)),
    ("log", complex(1.0, np.inf), complex(np.inf, np.pi / 2)), ("log", complex(-np.inf, np.inf),
                                                                 complex(np.inf, 3 * np.pi / 4)),
    ("log", complex(np.nan, np.inf), complex(np.inf, np.nan)),
    ("sqrt", complex(0.0, 0.0), complex(0.0, 0.0)), ("sqrt", complex(-0.0, -0.0), complex(0.0, -0.0)),
    ("sqrt", complex(1.0, np.inf), complex(np.inf, np.inf)), ("sqrt", complex(np.nan, np.inf), complex(np.inf, np.inf)),
    ("sqrt", complex(-np.inf, 1.0), complex(0.0, np.inf)), ("sqrt", complex(np.inf, 1.0), complex(np.inf, 0.0)),
    ("sqrt", complex(-4.0, 0.0), complex(0.0, 2.0)), ("sqrt", complex(-4.0, -0.0), complex(0.0, -2.0)),
    ("tanh", complex(0.0, np.inf), complex(0.0, np.nan)), ("tanh", complex(np.inf, 1.0), complex(1.0, 0.0)),
    ("tanh", complex(np.inf, np.inf), complex(1.0, 0.0)), ("tanh", complex(np.nan, 0.0), complex(np.nan, 0.0)),
    ("tanh", complex(800.0, 1.0), complex(1.0, 0.0)),
    ("cosh", complex(0.0, 0.0), complex(1.0, 0.0)), ("cosh", complex(np.inf, 0.0), complex(np.inf, 0.0)),
    ("sinh", complex(0.0, 0.0), complex(0.0, 0.0)), ("sinh", complex(np.inf, 0.0), complex(np.inf, 0.0)),
    ("asinh", complex(0.0, 0.0), complex(0.0, 0.0)), ("asinh", complex(1.0, np.inf), complex(np.inf, np.pi / 2)),
    ("asinh", complex(np.inf, np.inf), complex(np.inf, np.pi / 4)), ("asinh", complex(np.nan, 0.0),
                                                                     complex(np.nan, 0.0)),
    ("acos", complex(0.0, 0.0), complex(np.pi / 2, -0.0)), ("acos", complex(-np.inf, np.inf),
                                                            complex(3 * np.pi / 4, -np.inf)),
    ("acosh", complex(0.0, 0.0), complex(0.0, np.pi / 2)), ("acosh", complex(np.inf, np.inf),
                                                            complex(np.inf, np.pi / 4)),
    ("atanh", complex(0.0, 0.0), complex(0.0, 0.0)), ("atanh", complex(1.0, 0.0), complex(np.inf, 0.0)),
    ("atanh", complex(1.0, np.inf), complex(0.0, np.pi / 2)), ("atanh", complex(np.inf, np.nan),
                                                               complex(0.0, np.nan)),
    ("atanh", complex(0.0, np.nan), complex(0.0, np.nan)),
    ("expm1", complex(0.0, 0.0), complex(0.0, 0.0)), ("expm1", complex(-0.0, 0.0), complex(0.0, 0.0)),
    ("expm1", complex(-np.inf, 1.0), complex(-1.0, 0.0)),
    ("log1p", complex(-1.0, 0.0), complex(-np.inf, 0.0)), ("log1p", complex(np.inf, np.nan), complex(np.inf, np.nan)),
    ("sign", complex(0.0, 0.0), complex(0.0, 0.0)), ("sign", complex(3.0, -4.0), complex(0.6, -0.8)),
    ("sign", complex(np.nan, 1.0), complex(np.nan, np.nan)),
    # tanh(+-inf + yj), finite y: the zero takes y's sign (C99's, numpy's, takes sin(2y)'s: -0 here)
    ("tanh", complex(np.inf, 2.0), complex(1.0, 0.0)), ("tanh", complex(-np.inf, -2.0), complex(-1.0, -0.0)),
    ("tanh", complex(np.inf, 2e30), complex(1.0, 0.0)),
]


@pytest.mark.parametrize("dtype", COMPLEX)
def test_standard_special_cases(dev, dtype):
    z = np.array([case[1] for case in STANDARD_CASES], dtype)
    x = rt.asarray(z, device=dev)
    results = {name: call(name, x).numpy() for name in {case[0] for case in STANDARD_CASES}}
    for i, (name, arg, want) in enumerate(STANDARD_CASES):
        got = complex(results[name][i])
        for g, w, part in ((got.real, want.real, "real"), (got.imag, want.imag, "imag")):
            where = f"{name}({arg}) {part} part: {got} != {want}"
            if np.isnan(w):
                assert np.isnan(g), where
            else:
                assert g == pytest.approx(w, rel=1e-6, abs=1e-7), where
                if w == 0 or np.isinf(w):
                    assert np.signbit(g) == np.signbit(w), where


@pytest.mark.parametrize("dtype", COMPLEX)
def test_binary_ops_against_numpy(dev, dtype):
    rng = np.random.default_rng(2)
    a, b = rand_complex((3, 5), dtype, rng), rand_complex((5,), dtype, rng)
    b[0] = 0
    A, B = rt.asarray(a, device=dev), rt.asarray(b, device=dev)
    with np.errstate(all="ignore"):
        check((A + B).numpy(), a + b, dtype)
        check((A - B).numpy(), a - b, dtype)
        check((A * B).numpy(), a * b, dtype)
        check((A / B).numpy(), a / b, dtype)
        check(rt.divide(A, B).numpy(), np.divide(a, b), dtype)
        check((A ** B).numpy(), a ** b, dtype, rtol=1e-4 if dtype == "complex64" else 1e-11)
        check(rt.pow(A, 2).numpy(), a ** 2, dtype)
        check(rt.pow(A, -3).numpy(), a ** -3, dtype, rtol=1e-4 if dtype == "complex64" else 1e-11)
        check(rt.pow(A, 0.5).numpy(), a ** 0.5, dtype, rtol=1e-4 if dtype == "complex64" else 1e-11)
        check((A == B).numpy(), a == b, dtype)
        check((A != A[0]).numpy(), a != a[0], dtype)
        check((A.T * 2j - 1).numpy(), a.T * 2j - 1, dtype)  # strided and scalar operands
        check((A[:, 1:] + B[1:]).numpy(), a[:, 1:] + b[1:], dtype)  # unaligned offsets
        check(rt.where(rt.abs(A) > 1, A, B).numpy(), np.where(np.abs(a) > 1, a, b), dtype)


@pytest.mark.parametrize("dtype", COMPLEX)
def test_binary_special_values_against_numpy(dev, dtype):
    z = special_grid(dtype)
    a, b = np.repeat(z, z.size), np.tile(z, z.size)
    A, B = rt.asarray(a, device=dev), rt.asarray(b, device=dev)
    with np.errstate(all="ignore"):
        for op in ("add", "subtract", "multiply", "divide", "equal", "not_equal"):
            check(getattr(rt, op)(A, B).numpy(), getattr(np, op)(a, b), dtype)
        for scalar in (complex(0.0, -0.0), complex(np.inf, 0.0), complex(np.nan, 1.0), 2.0, -0.0):
            check((A * scalar).numpy(), a * np.asarray(scalar, dtype), dtype)
            check((A / scalar).numpy(), a / np.asarray(scalar, dtype), dtype)
        small = np.array([0, 1, -1, 2.5 - 1j, 1j, 1e-3 + 1e-3j], dtype)
        pa, pb = np.repeat(small, small.size), np.tile(small, small.size)
        check((rt.asarray(pa, device=dev) ** rt.asarray(pb, device=dev)).numpy(), pa ** pb, dtype,
              rtol=1e-4 if dtype == "complex64" else 1e-11, atol=1e-6)


def test_mixed_real_and_complex_operands(dev):
    rng = np.random.default_rng(3)
    z = rand_complex((4,), np.complex64, rng)
    for real in ("float32", "float64", "int32", "int8", "bool"):
        r = (rng.standard_normal(4) > 0) if real == "bool" else (rng.standard_normal(4) * 3).astype(real)
        Z, R = rt.asarray(z, device=dev), rt.asarray(r, device=dev)
        want = z * r
        got = (Z * R).numpy()
        assert got.dtype == want.dtype, real
        check(got, want, str(want.dtype), rtol=2e-5, atol=1e-5)
        check((R - Z).numpy(), r - z, str(want.dtype), rtol=2e-5, atol=1e-5)


def test_abs_real_imag_dtypes_and_huge_parts(dev):
    z = np.array([3e38 + 3e38j, 1e-40 + 1e-40j, -0.0 - 0.0j, complex(np.inf, np.nan), 4 - 3j], np.complex64)
    x = rt.asarray(z, device=dev)
    got = rt.abs(x).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, np.abs(z), rtol=1e-6)  # no overflow of the squares, no underflow
    assert got[3] == np.inf  # |inf + nan i| is inf
    assert rt.real(x).dtype is rt.float32
    assert rt.imag(rt.asarray(z.astype(np.complex128), device=dev)).dtype is rt.float64
    check(rt.real(x).numpy(), z.real, "float32")
    check(rt.imag(x).numpy(), z.imag, "float32")
    r = rt.asarray(np.array([1.5, -2.0], np.float32), device=dev)  # real inputs: x, zeros and x
    check(rt.real(r).numpy(), np.array([1.5, -2.0], np.float32), "float32")
    check(rt.imag(r).numpy(), np.zeros(2, np.float32), "float32")
    check(rt.conj(r).numpy(), np.array([1.5, -2.0], np.float32), "float32")


# ---- casts ------------------------------------------------------------------------------------------------


def test_astype(dev):
    rng = np.random.default_rng(4)
    r = rng.standard_normal(6).astype(np.float32)
    R = rt.asarray(r, device=dev)
    check(R.astype(rt.complex64).numpy(), r.astype(np.complex64), "complex64")
    check(R.astype(rt.complex128).numpy(), r.astype(np.complex128), "complex128")
    i = rt.asarray(np.array([-3, 0, 7], np.int64), device=dev)
    check(i.astype("complex64").numpy(), np.array([-3, 0, 7], np.complex64), "complex64")
    b = rt.asarray(np.array([True, False]), device=dev)
    check(b.astype(rt.complex128).numpy(), np.array([1 + 0j, 0j]), "complex128")
    z = rand_complex((6,), np.complex128, rng)
    Z = rt.asarray(z, device=dev)
    check(Z.astype(rt.complex64).numpy(), z.astype(np.complex64), "complex64")
    check(Z.astype(rt.complex64).astype(rt.complex128).numpy(), z.astype(np.complex64).astype(np.complex128),
          "complex128")
    zb = np.array([0j, complex(-0.0, 0.0), 1j, complex(np.nan, 0), 2], np.complex64)
    check(rt.asarray(zb, device=dev).astype(rt.bool).numpy(), zb.astype(bool), "bool")
    for target in ("float32", "float64", "int32", "uint8", "float16"):
        with pytest.raises(rt.InvalidTypeError, match="real\\(x\\) or imag\\(x\\)"):
            Z.astype(target)


# ---- reductions, products ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", COMPLEX)
def test_reductions(dev, dtype):
    rng = np.random.default_rng(5)
    z = rand_complex((3, 7, 5), dtype, rng)
    x = rt.asarray(z, device=dev)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == "complex64" else {}
    for axis in (None, 0, 1, 2, (0, 2), (1, 2)):
        check(rt.sum(x, axis=axis).numpy(), np.sum(z, axis=axis), dtype, **tol)
        check(rt.mean(x, axis=axis).numpy(), np.mean(z, axis=axis), dtype, **tol)
        check(rt.prod(x * 0.5, axis=axis).numpy(), np.prod(z * 0.5, axis=axis), dtype, **tol)
    check(rt.sum(x[:, ::-2].T, axis=0, keepdims=True).numpy(), np.sum(z[:, ::-2].T, axis=0, keepdims=True),
          dtype, **tol)
    check(rt.sum(x, axis=1, dtype=rt.complex128).numpy(), np.sum(z, axis=1, dtype=np.complex128), "complex128",
          rtol=1e-5, atol=1e-5)
    long = rand_complex((2, 9001), dtype, rng)  # long rows, few outputs: the GPU's two-pass split
    check(rt.sum(rt.asarray(long, device=dev), axis=1).numpy(), long.sum(axis=1), dtype, rtol=1e-4, atol=1e-3)
    check(rt.sum(rt.asarray(long[:, 3:], device=dev)).numpy(), long[:, 3:].sum(), dtype, rtol=1e-4, atol=1e-3)
    cols = rand_complex((300, 64), dtype, rng)  # a column sum (the real dtypes' column kernel)
    check(rt.sum(rt.asarray(cols, device=dev), axis=0).numpy(), cols.sum(axis=0), dtype, rtol=1e-4, atol=1e-4)
    empty = rt.zeros((0, 3), dtype=dtype, device=dev)
    check(rt.sum(empty, axis=0).numpy(), np.zeros(3, dtype), dtype)
    check(rt.prod(empty, axis=0).numpy(), np.ones(3, dtype), dtype)
    specials = special_grid(dtype).reshape(9, 9)
    with np.errstate(all="ignore"):
        check(rt.sum(rt.asarray(specials, device=dev), axis=1).numpy(), specials.sum(axis=1), dtype)


def test_variance_is_real_and_compiled_steps_replay(dev):
    z = rand_complex((4, 6), np.complex64, np.random.default_rng(12))
    x = rt.asarray(z, device=dev)
    v = rt.var(x, axis=1)
    assert v.dtype is rt.float32
    check(v.numpy(), np.var(z, axis=1), "float32", rtol=1e-5, atol=1e-6)
    check(rt.std(x, correction=1).numpy(), np.std(z, ddof=1).astype(np.float32), "float32", rtol=1e-5, atol=1e-6)

    @rt.compile
    def step(a, b):
        return rt.sum(rt.abs(rt.exp(a * 1j) + b) ** 2, axis=0), rt.conj(a) * b

    for seed in range(3):  # traced once, then replayed with new inputs
        rng = np.random.default_rng(seed)
        a, b = rand_complex((4, 6), np.complex64, rng), rand_complex((6,), np.complex64, rng)
        s, p = step(rt.asarray(a, device=dev), rt.asarray(b, device=dev))
        check(s.numpy(), np.sum(np.abs(np.exp(a * 1j) + b) ** 2, axis=0), "float32", rtol=1e-5, atol=1e-5)
        check(p.numpy(), np.conj(a) * b, "complex64")
    assert step.stats["traces"] == 1 and step.stats["calls"] == 3


@pytest.mark.parametrize("dtype", COMPLEX)
def test_matmul_and_vecdot(dev, dtype):
    rng = np.random.default_rng(6)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "complex64" else {}
    a, b = rand_complex((2, 19, 23), dtype, rng), rand_complex((23, 17), dtype, rng)
    A, B = rt.asarray(a, device=dev), rt.asarray(b, device=dev)
    check((A @ B).numpy(), a @ b, dtype, **tol)
    check((A[0] @ B[:, 3]).numpy(), a[0] @ b[:, 3], dtype, **tol)  # matrix-vector: the GEMV kernels
    check((B.T @ A[1, 4]).numpy(), b.T @ a[1, 4], dtype, **tol)
    check(rt.matmul(A, rt.asarray(b.real.copy(), device=dev)).numpy(), a @ b.real, dtype, **tol)  # promoted
    check(rt.vecdot(A, A).numpy(), np.vecdot(a, a), dtype, **tol)  # conjugates its first operand
    check(rt.vecdot(A[0], A[1] * 1j, axis=-1).numpy(), np.vecdot(a[0], a[1] * 1j), dtype, **tol)
    real = rng.standard_normal((4, 3)).astype(np.float32)
    check(rt.vecdot(rt.asarray(real, device=dev), A[0, :4, :3]).numpy(), np.vecdot(real, a[0, :4, :3]),
          str(np.result_type(real, a)), **tol)
    check(rt.tensordot(A[0], B, axes=1).numpy(), np.tensordot(a[0], b, axes=1), dtype, **tol)


# ---- interop ----------------------------------------------------------------------------------------------


def test_numpy_and_dlpack(dev):
    z = rand_complex((3, 4), np.complex128, np.random.default_rng(7))
    x = rt.asarray(z, device=dev)
    check(np.asarray(x), z, "complex128")
    check(np.asarray(x[:, ::2].T), z[:, ::2].T, "complex128")
    y = rt.from_dlpack(z.astype(np.complex64), device=dev)
    assert y.dtype is rt.complex64
    check(y.numpy(), z.astype(np.complex64), "complex64")
    if not context_for(dev).is_gpu:  # CPU memory: numpy reads the capsule itself
        check(np.from_dlpack(x), z, "complex128")
        check(np.from_dlpack(x.T), z.T, "complex128")
    check(np.exp(x).numpy(), np.exp(z), "complex128")  # numpy's protocols stay on the device
    assert isinstance(np.conjugate(x), rt.Array)
    check(np.conjugate(x).numpy(), np.conjugate(z), "complex128")
    assert complex(rt.asarray(2 - 1j, device=dev)) == 2 - 1j
    assert complex(rt.asarray(np.float32(2.5), device=dev)) == 2.5
    for convert in (float, int):  # the standard: no silent loss of the imaginary part
        with pytest.raises(TypeError, match="real\\(x\\) or imag\\(x\\)"):
            convert(rt.asarray(2 - 1j, device=dev))


# ---- what complex operands cannot do -----------------------------------------------------------------------


def test_unsupported_operations_raise_typed_errors_when_built(dev):
    z = rt.asarray(np.array([1 + 1j, 2], np.complex64), device=dev)
    calls = {
        "less": lambda: z < z, "less_equal": lambda: z <= 1, "greater": lambda: rt.greater(z, 0),
        "greater_equal": lambda: z >= z, "maximum": lambda: rt.maximum(z, z), "minimum": lambda: rt.minimum(z, 1),
        "floor": lambda: rt.floor(z), "ceil": lambda: rt.ceil(z), "trunc": lambda: rt.trunc(z),
        "floor_divide": lambda: z // z, "remainder": lambda: z % 2, "atan2": lambda: rt.atan2(z, z),
        "hypot": lambda: rt.hypot(z, z), "copysign": lambda: rt.copysign(z, z), "logaddexp": lambda: rt.logaddexp(z, z),
        "signbit": lambda: rt.signbit(z), "bitwise_and": lambda: rt.bitwise_and(z, z),
        "max": lambda: rt.max(z), "min": lambda: rt.min(z, axis=0), "argmax": lambda: rt.argmax(z),
        "argmin": lambda: rt.argmin(z),
    }
    ctx = context_for(dev)
    evals = ctx.graphs.hits, ctx.graphs.misses
    for name, fn in calls.items():
        with pytest.raises(rt.InvalidTypeError) as info:
            fn()
        assert isinstance(info.value, hal.InvalidArgumentError) and isinstance(info.value, TypeError), name
        assert "complex" in str(info.value), name
    assert (ctx.graphs.hits, ctx.graphs.misses) == evals  # nothing ran
    with pytest.raises(rt.InvalidTypeError):
        rt.full((2,), 1j, dtype="float32", device=dev)
    with pytest.raises(TypeError):
        rt.asarray(np.ones(2, np.clongdouble), device=dev)


# ---- autodiff ---------------------------------------------------------------------------------------------


def _finite_difference(f, z: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """df/dx - i df/dy of a real f of complex z, by central differences (JAX's convention)."""
    g = np.zeros(z.shape, np.complex128)
    for i in range(z.size):
        for unit, weight in ((1.0, 1.0), (1j, -1j)):
            zp, zm = z.copy(), z.copy()
            zp.flat[i] += eps * unit
            zm.flat[i] -= eps * unit
            g.flat[i] += weight * (f(zp) - f(zm)) / (2 * eps)
    return g


GRAD_CASES = {
    "abs_squared": (lambda z, w: rt.sum(rt.abs(z) ** 2), lambda z, w: np.sum(np.abs(z) ** 2)),
    "add_mul_real": (lambda z, w: rt.sum(rt.real(z * z + z * w + (2 - 1j))),
                     lambda z, w: np.sum(np.real(z * z + z * w + (2 - 1j)))),
    "conj_imag": (lambda z, w: rt.sum(rt.imag(rt.conj(z) * z * w)), lambda z, w: np.sum(np.imag(np.conj(z) * z * w))),
    "exp": (lambda z, w: rt.sum(rt.real(rt.exp(z)) - 2 * rt.imag(rt.exp(z))),
            lambda z, w: np.sum(np.real(np.exp(z)) - 2 * np.imag(np.exp(z)))),
    "matmul": (lambda z, w: rt.sum(rt.abs(rt.reshape(z, (2, 2)) @ rt.reshape(w, (2, 2)))),
               lambda z, w: np.sum(np.abs(z.reshape(2, 2) @ w.reshape(2, 2)))),
    "mean_div_sqrt": (lambda z, w: rt.abs(rt.mean(rt.sqrt(z) / w)), lambda z, w: np.abs(np.mean(np.sqrt(z) / w))),
    "sum_prod": (lambda z, w: rt.real(rt.prod(z) + rt.sum(z * w)), lambda z, w: np.real(np.prod(z) + np.sum(z * w))),
}


@pytest.mark.parametrize("case", sorted(GRAD_CASES))
def test_gradients_against_finite_differences(case):
    rng = np.random.default_rng(8)
    z = rand_complex((4,), np.complex128, rng) + 0.5
    w = rand_complex((4,), np.complex128, rng)
    fn, ref = GRAD_CASES[case]
    W = rt.asarray(w, device="local-sync")
    g = rt.grad(lambda x: fn(x, W))(rt.asarray(z, device="local-sync")).numpy()
    assert g.dtype == np.complex128
    np.testing.assert_allclose(g, _finite_difference(lambda v: ref(v, w), z), rtol=1e-6, atol=1e-7)


def test_gradient_convention_is_jax_s():
    """grad of |z|^2 at 3 + 4i is 6 - 8i (JAX's df/dx - i df/dy; PyTorch reports its conjugate)."""
    g = rt.grad(lambda z: rt.sum(rt.abs(z) ** 2))(rt.asarray(np.array([3 + 4j]), device="local-sync"))
    np.testing.assert_allclose(g.numpy(), [6 - 8j])


def test_gradients_through_real_operands_and_on_the_gpu_path(dev):
    rng = np.random.default_rng(9)
    r = rng.standard_normal(5)
    w = rand_complex((5,), np.complex128, rng)
    W = rt.asarray(w, device=dev)
    g = rt.grad(lambda x: rt.sum(rt.abs(x * W + 1j) ** 2))(rt.asarray(r, device=dev)).numpy()
    assert g.dtype == np.float64  # a real input's gradient is real
    want = _finite_difference(lambda v: np.sum(np.abs(v * w + 1j) ** 2), r.astype(np.complex128)).real
    np.testing.assert_allclose(g, want, rtol=1e-6, atol=1e-7)
    z = rand_complex((5,), np.complex64, rng)
    g = rt.grad(lambda x: rt.sum(rt.abs(x) ** 2))(rt.asarray(z, device=dev)).numpy()
    assert g.dtype == np.complex64
    np.testing.assert_allclose(g, 2 * np.conj(z), rtol=1e-5)
    g = rt.grad(lambda x: rt.sum(rt.abs(x)))(rt.asarray(np.zeros(2, np.complex64), device=dev)).numpy()
    np.testing.assert_array_equal(g, np.zeros(2, np.complex64))  # |z| at 0: a zero gradient, not NaN


def test_grad_of_a_complex_value_is_refused():
    with pytest.raises(rt.InvalidTypeError, match="real value"):
        rt.grad(lambda z: rt.sum(z * z))(rt.asarray(np.ones(2, np.complex64), device="local-sync")).numpy()
