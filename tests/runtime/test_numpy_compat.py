"""The runtime as a numpy user meets it: dtypes kept exactly, numpy's promotion, numpy's exceptions,
and a regression test for every wrong result found trying it as such a user would."""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import ALL_DTYPES, rand

import hal
import runtime as rt


def same(got: rt.Array, want: np.ndarray, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Value, shape and dtype equal to numpy's result."""
    want = np.asarray(want)
    host = got.numpy()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert host.dtype == want.dtype
    if want.dtype.kind == "f":
        np.testing.assert_allclose(host, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(host, want)


# ---- nothing is narrowed ------------------------------------------------------------------------


def test_int64_and_float64_data_are_kept(dev):
    big = np.array([2**40, 3])
    same(rt.array(big, device=dev), big)
    same(rt.array(big, device=dev) * 3 + 1, big * 3 + 1)
    f64 = np.array([1 / 3, 1e300, 2.0**-1070])
    same(rt.array(f64, device=dev), f64)
    same(rt.array(f64, device=dev) * 2, f64 * 2)
    same(rt.array(np.float32([1.5]), device=dev).astype("float64") / 3, np.float32([1.5]).astype(np.float64) / 3)
    same(rt.zeros((2,), dtype=np.int64, device=dev) + 2**62, np.zeros(2, np.int64) + 2**62)
    same(rt.full((3,), 2**40 + 1, dtype=rt.int64, device=dev), np.full(3, 2**40 + 1, np.int64))
    same(rt.full((2,), 0.1, dtype=rt.float64, device=dev), np.full(2, 0.1))
    same(rt.array([2**40, 3], device=dev), np.array([2**40, 3]))


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_round_trips_and_computes(dev, dtype):
    rng = np.random.default_rng(0)
    a, b = rand((3, 4), dtype, rng), rand((4,), dtype, rng)
    A, B = rt.array(a, device=dev), rt.array(b, device=dev)
    assert A.dtype == np.dtype(dtype) and np.dtype(A.dtype) == np.dtype(dtype)
    same(A, a)
    with np.errstate(all="ignore"):
        same(A + B if dtype != "bool" else A | B, a + b if dtype != "bool" else a | b)
        same(A * B, a * b)
        same(A == B, a == b)
        same(A.sum(axis=0), a.sum(axis=0), rtol=1e-3 if dtype == "float16" else 1e-6)
        same(A.max(axis=1), a.max(axis=1))
        same(A.argmax(axis=0), a.argmax(axis=0))
        same(A[:, ::-1].T, a[:, ::-1].T)
        if dtype != "bool":
            same(A @ B, a @ b, rtol=1e-2 if dtype == "float16" else 1e-6)
            same(A - B, a - b)


def test_promotion_is_numpys(dev):
    rng = np.random.default_rng(1)
    for x in ALL_DTYPES:
        for y in ALL_DTYPES:
            a, b = rand((2,), x, rng), rand((2,), y, rng)
            got = rt.array(a, device=dev) * rt.array(b, device=dev)
            assert got.dtype == np.result_type(a, b), (x, y, got.dtype)
    x8 = rt.array(np.array([100, -100], np.int8), device=dev)
    same(x8 + x8, np.array([100, -100], np.int8) * 2)  # wraps in int8, as numpy
    same(x8 / 3, np.array([100, -100], np.int8) / 3)
    flags = np.array([True, False])  # a Python float with bool or integer arrays: float64 (NEP 50)
    same(rt.array(flags, device=dev) + 2.5, flags + 2.5)
    assert (rt.array(np.int32([1, 2]), device=dev) + 2.5).dtype == np.float64


def test_numpy_scalars_are_strongly_typed(dev):
    x = rt.array(np.ones(3, np.float32), device=dev)
    assert (x * np.float64(2)).dtype == np.float64
    assert (x * 2.0).dtype == np.float32
    i = rt.array(np.ones(3, np.int8), device=dev)
    assert (i + np.int64(1)).dtype == np.int64
    assert (i + 1).dtype == np.int8
    with pytest.raises(OverflowError):
        i + 300
    assert (np.float32(2) * rt.array(np.ones(2, np.float16), device=dev)).dtype == np.float32


def test_dtype_is_the_numpy_dtype(dev):
    a = rt.array(np.ones(3, np.float32), device=dev)
    assert a.dtype == np.float32 and a.dtype == np.dtype("float32") and a.dtype == "float32"
    assert a.dtype != np.float64 and a.dtype != rt.float16
    assert np.dtype(a.dtype) == np.float32
    assert np.zeros(2, dtype=a.dtype).dtype == np.float32
    assert a.dtype is rt.float32 and {rt.float32: 1}[a.dtype] == 1


def test_unsupported_dtypes_raise_type_errors(dev):
    with pytest.raises(TypeError):
        rt.array(np.ones(2, np.clongdouble), device=dev)
    with pytest.raises(TypeError):
        rt.array(np.array(["a", "b"]), device=dev)
    with pytest.raises(hal.InvalidArgumentError):
        rt.zeros((2,), dtype="complex256", device=dev)


# ---- conversions every driver makes the same way --------------------------------------------------


def test_float_to_int_saturates_and_nan_is_zero(dev):
    x = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 300.7, -300.7, 2.9, -2.9], np.float32)
    for dtype in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"):
        info = np.iinfo(dtype)
        want = np.clip(
            np.trunc(np.nan_to_num(x.astype(np.float64), nan=0, posinf=info.max, neginf=info.min)), info.min, info.max
        )
        want = np.array([int(v) if abs(v) < 2**63 else (info.max if v > 0 else info.min) for v in want], dtype=object)
        got = rt.array(x, device=dev).astype(dtype).numpy()
        assert [int(v) for v in got] == [min(max(int(v), info.min), info.max) for v in want], dtype
        host = rt.array(x, dtype=dtype, device=dev).numpy()
        np.testing.assert_array_equal(host, got)


# ---- the bugs found, one by one --------------------------------------------------------------------


def test_argmax_keepdims_without_axis(dev):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    X = rt.array(x, device=dev)
    for fn in ("argmax", "argmin"):
        same(getattr(X, fn)(keepdims=True), getattr(x, fn)(keepdims=True))
        same(getattr(X, fn)(), getattr(x, fn)())
        same(getattr(rt, fn)(X[0, 0, 0], keepdims=True), getattr(np, fn)(x[0, 0, 0], keepdims=True))


def test_int_power_with_negative_exponent_fails_when_built(dev):
    x = rt.array(np.array([1, 2, 3], np.int32), device=dev)
    with pytest.raises(ValueError, match="negative integer powers"):
        x**-1
    with pytest.raises(hal.InvalidArgumentError):
        rt.power(x, np.int64(-2))
    same(x**2, np.array([1, 4, 9], np.int32))
    same(rt.array(np.array([2.0]), device=dev) ** -1, np.array([0.5]))


def test_negative_zero_is_not_conflated_with_zero(dev):
    x = rt.array(np.array([1.0, -2.0], np.float32), device=dev)
    a = (x * 0.0).numpy().copy()
    b = (x * -0.0).numpy()
    np.testing.assert_array_equal(np.signbit(a), [False, True])
    np.testing.assert_array_equal(np.signbit(b), [True, False])
    neg = rt.full((3,), -0.0, device=dev).numpy().copy()
    pos = rt.zeros((3,), device=dev).numpy()
    assert np.signbit(neg).all() and not np.signbit(pos).any()


def test_float16_uniform_never_returns_one(dev):
    for dtype in (rt.float16, rt.bfloat16, rt.float32, rt.float64):
        u = rt.random.uniform((1 << 16,), key=rt.random.key(7, device=dev), dtype=dtype)
        host = np.asarray(u.astype(rt.float32).numpy())
        assert host.max() < 1.0 and host.min() >= 0.0, dtype


def test_uniform_bounds_stay_half_open_and_take_arrays(dev):
    """uniform(low=1, high=2) in bfloat16 returned 2.0 (the scaling rounded up to high); array
    bounds and an array loc/scale of normal raised the ambiguous truth value error."""
    key = rt.random.key(3, device=dev)
    for dtype in (rt.float16, rt.bfloat16, rt.float32, rt.float64):
        for low, high in ((1, 2), (2.0, 1.0), (-3.5, 100.0), (np.float32(0.25), np.int64(4))):
            host = rt.random.uniform((1 << 16,), key=key, dtype=dtype, low=low, high=high).astype(rt.float64).numpy()
            lo, hi = min(low, high), max(low, high)
            assert lo <= host.min() and host.max() <= hi, (dtype, low, high)
            assert (host < high).all() if high > low else (host > high).all(), (dtype, low, high)
    low = rt.array(np.array([0.0, 10.0, -5.0], np.float32), device=dev)
    high = rt.array(np.array([1.0, 20.0, -4.0], np.float32), device=dev)
    host = rt.random.uniform((1000, 3), key=key, low=low, high=high).numpy()
    assert ((host >= low.numpy()) & (host < high.numpy())).all()
    z = rt.random.normal((20000, 2), key=key, loc=np.array([100.0, -100.0]), scale=rt.array(
        np.array([1.0, 0.0], np.float32), device=dev)).numpy()
    assert abs(z[:, 0].mean() - 100) < 0.1 and (z[:, 1] == -100).all()
    with pytest.raises(rt.InvalidValueError, match="sample shape"):
        rt.random.uniform((3,), key=key, low=np.zeros((2, 3)))
    for bad in ("0", 1j, None):
        with pytest.raises(rt.InvalidTypeError):
            rt.random.uniform((3,), key=key, low=bad)


def test_control_flow_inside_compile_names_the_op(dev):
    f = rt.compile(lambda x: x * 2 if (x.sum() > 0) else x)
    with pytest.raises(rt.TracingError, match="gt"):
        f(rt.array(np.ones(3, np.float32), device=dev))
    with pytest.raises(TypeError):
        rt.compile(lambda x: float(x.max()))(rt.array(np.ones(3, np.float32), device=dev))
    # reading an argument itself while tracing, or after the trace through a leaked reference
    leaked = []
    with pytest.raises(rt.TracingError, match="argument of a function rt.compile traces"):
        rt.compile(lambda x: leaked.append(x) or x.numpy())(rt.array(np.ones(3, np.float32), device=dev))
    with pytest.raises(rt.TracingError):
        leaked[0].numpy()
    g = rt.compile(lambda x: x + 1)
    same(g(rt.array(np.ones(2, np.float32), device=dev)), np.full(2, 2, np.float32))


def test_device_given_by_name_is_the_default_device():
    rt.set_default_device("local-task")
    a = rt.array(np.ones(3, np.float32), device="local-task")
    b = rt.array(np.ones(3, np.float32))
    same(a + b, np.full(3, 2, np.float32))
    c = rt.array(np.ones(3, np.float32), device="local-sync")
    with pytest.raises(ValueError, match="local-sync"):
        a + c
