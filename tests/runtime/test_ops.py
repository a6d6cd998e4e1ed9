"""Every op against numpy: random shapes with broadcasting, empty and size-1 dims, all dtypes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rt_helpers import TOL, rand

import hal
import runtime as rt

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = ["float32", "float16", "int32", "bool"]


def canonical(x: np.ndarray) -> np.ndarray:
    """numpy's result: the runtime's dtypes are numpy's (nothing is narrowed)."""
    return x


def check(actual: rt.Array, expected: np.ndarray, dtype_name: str | None = None) -> None:
    expected = canonical(np.asarray(expected))
    got = actual.numpy()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
    rtol, atol = TOL[dtype_name or actual.dtype.name]
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(got, expected)


@st.composite
def broadcast_pair(draw, max_dims=4):
    nd = draw(st.integers(0, max_dims))
    base = [draw(st.integers(0, 4)) for _ in range(nd)]
    def variant():
        shape = [d if draw(st.booleans()) else 1 for d in base]
        drop = draw(st.integers(0, nd))
        return tuple(shape[drop:])
    return variant(), variant()


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
          "maximum": np.maximum, "minimum": np.minimum, "eq": np.equal, "ne": np.not_equal,
          "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal}
RT_BINARY = {"add": rt.add, "sub": rt.subtract, "mul": rt.multiply, "div": rt.divide, "maximum": rt.maximum,
             "minimum": rt.minimum, "eq": rt.equal, "ne": rt.not_equal, "lt": rt.less, "le": rt.less_equal,
             "gt": rt.greater, "ge": rt.greater_equal}


@pytest.mark.parametrize(("op", "dtype"), [(op, d) for op in sorted(BINARY) for d in DTYPES
                                           if not (op == "sub" and d == "bool")])
def test_binary_broadcasting(dev, op, dtype):

    @SETTINGS
    @given(shapes=broadcast_pair(), seed=st.integers(0, 2**16))
    def run(shapes, seed):
        rng = np.random.default_rng(seed)
        a, b = rand(shapes[0], dtype, rng), rand(shapes[1], dtype, rng)
        if op == "div" and dtype in ("int32", "bool"):
            b = np.where(b == 0, 1, b).astype(b.dtype)
        with np.errstate(all="ignore"):
            expected = BINARY[op](a, b)
        check(RT_BINARY[op](rt.array(a, device=dev), rt.array(b, device=dev)), expected,
              "float16" if expected.dtype == np.float16 else None)

    run()


def test_bool_subtract_rejected(dev):
    a = rt.array(np.array([True, False]), device=dev)
    with pytest.raises(hal.InvalidArgumentError):
        a - a


@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_dtype_promotion(dev, dtype):
    rng = np.random.default_rng(1)
    for other in DTYPES:
        a, b = rand((3, 4), dtype, rng), rand((4,), other, rng)
        expected = canonical(np.add(a, b)) if not (dtype == other == "bool") else np.logical_or(a, b)
        got = rt.array(a, device=dev) + rt.array(b, device=dev)
        assert got.numpy().dtype == expected.dtype
        check(got, expected, "float16" if expected.dtype == np.float16 else "float32"
              if expected.dtype.kind == "f" else None)


UNARY = {"neg": (rt.negative, np.negative), "abs": (rt.absolute, np.absolute), "exp": (rt.exp, np.exp),
         "log": (rt.log, np.log), "sqrt": (rt.sqrt, np.sqrt), "tanh": (rt.tanh, np.tanh),
         "sigmoid": (rt.sigmoid, lambda x: 1 / (1 + np.exp(-x.astype(np.float64)))
                     if x.dtype.kind != "f" or x.dtype == np.float32 else (1 / (1 + np.exp(-x))))}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("dtype", DTYPES)
def test_unary(dev, op, dtype):
    if op == "neg" and dtype == "bool":
        return
    rng = np.random.default_rng(2)
    for shape in [(), (0,), (1,), (5, 3), (2, 1, 3)]:
        x = rand(shape, dtype, rng)
        if op in ("log", "sqrt"):
            x = np.abs(x) + (1 if x.dtype != np.bool_ else True)
            if x.dtype == np.bool_:
                x = x.astype(np.bool_)
        rt_fn, np_fn = UNARY[op]
        with np.errstate(all="ignore"):
            expected = np_fn(x)
        if op == "sigmoid":
            expected = expected.astype({np.bool_: np.float16, np.int32: np.float64}.get(x.dtype.type, x.dtype))
        got = rt_fn(rt.array(x, device=dev))
        check(got, expected, "float16" if canonical(np.asarray(expected)).dtype == np.float16 else None)


def test_pow(dev):
    rng = np.random.default_rng(3)
    a = np.abs(rand((4, 5), "float32", rng)) + 0.5
    b = rand((5,), "float32", rng)
    check(rt.array(a, device=dev) ** rt.array(b, device=dev), a ** b)
    ia = rng.integers(0, 5, (3, 3)).astype(np.int32)
    check(rt.array(ia, device=dev) ** 3, ia ** 3)
    check(2.0 ** rt.array(b, device=dev), (2.0 ** b).astype(np.float32))


def test_python_scalars_weak_typing(dev):
    rng = np.random.default_rng(4)
    f16 = rand((3,), "float16", rng)
    i32 = rand((3,), "int32", rng)
    b = rand((3,), "bool", rng)
    x16 = rt.array(f16, device=dev)
    xi = rt.array(i32, device=dev)
    xb = rt.array(b, device=dev)
    assert (x16 + 1).dtype is rt.float16 and (x16 * 2.5).dtype is rt.float16
    check(x16 * 2.5, f16 * np.float16(2.5), "float16")
    assert (xi + 1).dtype is rt.int32
    check(xi + 7, i32 + 7)
    check(xi * 1.5, i32 * 1.5)
    assert (xb + True).dtype is rt.bool_
    check(xb * 3, b * 3)
    # bool and integer arrays with a Python float compute in float64, as numpy does
    assert (xb + 2.5).dtype is rt.float64 and (xi + 2.5).dtype is rt.float64
    check(xb + 2.5, b + 2.5)
    check(2.5 * xb, 2.5 * b)
    assert rt.result_type(xb, 2.5) is rt.float64
    check(3 - xi, 3 - i32)
    check(1 / (xi + 10), 1 / (i32 + 10))
    check(-xi, -i32)
    check(abs(xi), np.abs(i32))
    check(xi > 0, i32 > 0)
    check(2 <= xi, 2 <= i32)
    with pytest.raises(hal.InvalidArgumentError):
        xi + 2**40


def test_numpy_operand_on_the_left(dev):
    a = np.arange(4, dtype=np.float32)
    x = rt.array(np.ones(4, np.float32), device=dev)
    got = a + x
    assert isinstance(got, rt.Array)
    check(got, a + 1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_where(dev, dtype):
    rng = np.random.default_rng(5)
    c = rng.random((3, 1, 4)) > 0.5
    x, y = rand((5, 4), dtype, rng), rand((1, 4), dtype, rng)
    check(rt.where(rt.array(c, device=dev), rt.array(x, device=dev), rt.array(y, device=dev)), np.where(c, x, y))
    xr = rt.array(x, device=dev)
    if dtype == "float32":
        check(rt.where(xr > 0, xr, 0.0), np.where(x > 0, x, np.float32(0)))


REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "argmax", "argmin"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions(dev, op, dtype):
    @SETTINGS
    @given(shape=st.lists(st.integers(1, 5), min_size=0, max_size=4), data=st.data(), seed=st.integers(0, 999))
    def run(shape, data, seed):
        shape = tuple(shape)
        rng = np.random.default_rng(seed)
        x = rand(shape, dtype, rng)
        nd = len(shape)
        if op in ("argmax", "argmin"):
            axis = data.draw(st.sampled_from([None] + list(range(-nd, nd))))
            keep = data.draw(st.booleans()) if axis is not None else False
            expected = getattr(np, op)(x, axis=axis, keepdims=keep) if axis is not None else getattr(np, op)(x)
            got = getattr(rt, op)(rt.array(x, device=dev), axis=axis, keepdims=keep)
            check(got, np.asarray(expected))
            return
        axes = data.draw(st.sampled_from([None] + [tuple(a for a in range(nd) if (m >> a) & 1)
                                                   for m in range(1 << nd)]))
        keep = data.draw(st.booleans())
        xf = x.astype(np.float64) if dtype == "float16" else x
        expected = REDUCE[op](xf, axis=axes, keepdims=keep)
        if dtype == "float16":
            expected = np.asarray(expected).astype(np.float16)
        got = getattr(rt, op)(rt.array(x, device=dev), axis=axes, keepdims=keep)
        check(got, np.asarray(expected), None if dtype != "float16" else "float16")

    run()


def test_reduction_of_views_and_big_rows(dev):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((37, 3000)).astype(np.float32)
    xr = rt.array(x, device=dev)
    check(xr.T.sum(axis=1), x.T.sum(axis=1).astype(np.float32), "float16")
    check(xr[::2, ::-3].max(axis=0), x[::2, ::-3].max(axis=0))
    check(xr.reshape(-1).sum(), np.float32(x.astype(np.float64).sum()), "float16")
    check(xr.reshape(-1).argmax(), np.argmax(x))
    big = rng.standard_normal(300_000).astype(np.float32)
    check(rt.array(big, device=dev).mean(), np.float32(big.astype(np.float64).mean()), "float16")
    check(rt.array(big, device=dev).argmin(), np.argmin(big))


def test_reduction_errors_at_build(dev):
    x = rt.array(np.zeros((0, 3), np.float32), device=dev)
    with pytest.raises(hal.InvalidArgumentError):
        x.max(axis=0)
    check(x.sum(axis=0), np.zeros(3, np.float32))
    with pytest.raises(hal.InvalidArgumentError):
        x.sum(axis=2)
    with pytest.raises(hal.InvalidArgumentError):
        x.sum(axis=(0, 0))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_matmul(dev, dtype):
    rng = np.random.default_rng(7)
    cases = [((3, 4), (4, 5)), ((17, 33), (33, 18)), ((4,), (4, 3)), ((3, 4), (4,)), ((4,), (4,)),
             ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((0, 3), (3, 2)), ((3, 0), (0, 2))]
    for sa, sb in cases:
        a, b = rand(sa, dtype, rng), rand(sb, dtype, rng)
        expected = np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype) if dtype == "float16" \
            else np.matmul(a, b)
        check(rt.array(a, device=dev) @ rt.array(b, device=dev), expected, "bfloat16" if dtype == "float16" else None)
    a = rand((6, 5), dtype, rng)
    check(rt.array(a, device=dev).T @ rt.array(a, device=dev)[:, ::-1],
          (a.T.astype(np.float32) @ a[:, ::-1].astype(np.float32)).astype(a.dtype),
          "bfloat16" if dtype == "float16" else None)
    with pytest.raises(hal.InvalidArgumentError):
        rt.array(a, device=dev) @ rt.array(a, device=dev)


def test_views(dev):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    xr = rt.array(x, device=dev)
    check(xr.reshape(20, -1), x.reshape(20, -1))
    check(xr.transpose(2, 0, 1), x.transpose(2, 0, 1))
    check(xr.T.reshape(-1), x.T.reshape(-1))
    check(rt.broadcast_to(xr[:, :1], (3, 4, 5, 6)), np.broadcast_to(x[:, :1], (3, 4, 5, 6)))
    for key in [1, -1, (slice(None), 2), (Ellipsis, 3), (None, 1, Ellipsis, None), (slice(None, None, -1),),
                (slice(1, None, 2), slice(None, None, -2), slice(4, 0, -3)), (2, None, slice(3, 1, -1), 0),
                (slice(10, 20),), (Ellipsis,)]:
        check(xr[key], x[key])
    check((xr[:, ::-2] * 2).T, (x[:, ::-2] * 2).T)
    check(xr[1:3, ::2].reshape(-1), x[1:3, ::2].reshape(-1))
    with pytest.raises(hal.InvalidArgumentError):
        xr.reshape(7, -1)
    with pytest.raises(hal.InvalidArgumentError):
        xr[4]
    with pytest.raises(hal.InvalidArgumentError):
        xr[0, 0, 0, 0]
    with pytest.raises(hal.InvalidArgumentError):
        rt.broadcast_to(xr, (5, 6))
    with pytest.raises(hal.InvalidArgumentError):
        xr + rt.array(np.ones((3,), np.float32), device=dev)


def test_views_share_storage_without_copies(dev):
    xr = rt.array(np.arange(24, dtype=np.float32).reshape(4, 6), device=dev)
    for view in (xr.T, xr[::2, 1:], xr.reshape(6, 4), rt.broadcast_to(xr[0], (3, 6)), xr[None]):
        assert view.root is xr
    before = rt.graph_cache_stats()["misses"] + rt.graph_cache_stats()["hits"]
    _ = xr.T.numpy(), xr[::-1, ::2].numpy()
    after = rt.graph_cache_stats()["misses"] + rt.graph_cache_stats()["hits"]
    assert after == before, "reading views runs no kernels"


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_astype(dev, src, dst):
    rng = np.random.default_rng(9)
    x = rand((3, 4), src, rng)
    if src == "float32" and dst == "float16":
        x = x * 3
    got = rt.array(x, device=dev)[:, ::-1].astype(dst)
    check(got, x[:, ::-1].astype(dst))


def test_creation(dev):
    check(rt.zeros((2, 3), device=dev), np.zeros((2, 3), np.float32))
    check(rt.ones((4,), rt.int32, device=dev), np.ones(4, np.int32))
    check(rt.full((2, 2), 2.5, rt.float16, device=dev), np.full((2, 2), 2.5, np.float16))
    check(rt.full((3,), True, device=dev), np.full(3, True))
    check(rt.arange(5, device=dev), np.arange(5, dtype=np.int64))
    check(rt.arange(0.0, 1.0, 0.25, device=dev), np.arange(0.0, 1.0, 0.25).astype(np.float32))
    check(rt.zeros((0, 4), device=dev), np.zeros((0, 4), np.float32))
    with pytest.raises(hal.InvalidArgumentError):
        rt.zeros((-1, 2), device=dev)


def test_scalar_conversions_and_repr(dev):
    x = rt.array(np.array([[1.5]], np.float32), device=dev)
    assert float(x) == 1.5 and int(x) == 1
    assert "1.5" in repr(x) and "float32" in repr(x)
    assert str(rt.array(np.array([1, 2], np.int32), device=dev)) == "[1 2]"
    assert np.asarray(x).shape == (1, 1)
    assert x.device is rt.default_device() or isinstance(x.device, hal.Device)
    with pytest.raises(TypeError):
        float(rt.zeros((2,), device=dev))


def test_random_streams_match_numpy_philox(dev):
    from runtime.kernels.random import philox
    key = rt.random.key(1234, device=dev)
    u = rt.random.uniform((1000,), key=key).numpy()
    w0, w1 = philox(np.arange(1000, dtype=np.uint64), 1234, 0)
    np.testing.assert_array_equal(u, (w0 >> 8).astype(np.float32) * np.float32(2**-24))
    assert 0.0 <= u.min() and u.max() < 1.0
    z = rt.random.normal((200_000,), key=key).numpy()
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02
    z16 = rt.random.normal((100,), key=key, dtype=rt.float16).numpy()
    np.testing.assert_allclose(z16, z[:100].astype(np.float16), rtol=1e-3, atol=1e-3)
    k1, k2 = rt.random.split(key)
    assert not np.array_equal(rt.random.uniform((8,), key=k1).numpy(), rt.random.uniform((8,), key=k2).numpy())
    np.testing.assert_array_equal(rt.random.uniform((8,), key=k1).numpy(), rt.random.uniform((8,), key=k1).numpy())
    with pytest.raises(hal.InvalidArgumentError):
        rt.random.uniform((2,), key=rt.zeros((3,), device=dev))


def test_device_mismatch_is_rejected():
    a = rt.array(np.ones(2, np.float32), device="local-sync")
    b = rt.array(np.ones(2, np.float32), device="local-task")
    with pytest.raises(hal.InvalidArgumentError):
        a + b


def test_bfloat16(dev):
    rng = np.random.default_rng(10)
    a = rng.standard_normal((4, 6)).astype(np.float32)
    b = rng.standard_normal((6,)).astype(np.float32)
    A = rt.array(a, device=dev).astype(rt.bfloat16)
    B = rt.array(b, device=dev, dtype=rt.bfloat16)
    assert A.dtype is rt.bfloat16 and (A + 1.0).dtype is rt.bfloat16
    assert (A + rt.array(b, device=dev)).dtype is rt.float32
    assert (A + rt.array(b.astype(np.float16), device=dev)).dtype is rt.float32
    assert (A * rt.array(np.array([True]), device=dev)).dtype is rt.bfloat16

    def f32(x):
        return np.asarray(x.astype(rt.float32).numpy(), dtype=np.float32)

    tol = dict(rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(f32(A), a, **tol)
    np.testing.assert_allclose(f32(A * B + 1.0), a * b + 1, **tol)
    np.testing.assert_allclose(f32(rt.exp(A)), np.exp(a), **tol)
    np.testing.assert_allclose(f32(A.sum(axis=1)), a.sum(axis=1), rtol=5e-2, atol=5e-2)
    np.testing.assert_allclose(f32(A.max(axis=0)), a.max(axis=0), **tol)
    np.testing.assert_allclose(f32(A @ B), a @ b, rtol=5e-2, atol=5e-2)
    np.testing.assert_allclose(f32(rt.where(A > 0, A, 0.0)), np.where(a > 0, a, 0), **tol)
    np.testing.assert_allclose(f32(A.T[::-1]), a.T[::-1], **tol)
    host = A.numpy()
    np.testing.assert_allclose(np.asarray(host, dtype=np.float32), a, **tol)
    g = rt.grad(lambda x: (x * x).sum())(A)
    assert g.dtype is rt.bfloat16
    np.testing.assert_allclose(f32(g), 2 * a, **tol)


@st.composite
def basic_index(draw, shape):
    key = []
    for d in shape:
        kind = draw(st.sampled_from(["slice", "slice", "int", "none", "all"]))
        if kind == "int" and d > 0:
            key.append(draw(st.integers(-d, d - 1)))
        elif kind == "none":
            key.append(None)
            key.append(slice(None))
        elif kind == "slice":
            start = draw(st.one_of(st.none(), st.integers(-d - 1, d + 1)))
            stop = draw(st.one_of(st.none(), st.integers(-d - 1, d + 1)))
            step = draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
            key.append(slice(start, stop, step))
        else:
            key.append(slice(None))
    if draw(st.booleans()) and key:
        key = key[:-1] + [Ellipsis]
    return tuple(key)


def test_strided_views_through_kernels(dev):
    @SETTINGS
    @given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=4), data=st.data(), seed=st.integers(0, 999))
    def run(shape, data, seed):
        x = np.random.default_rng(seed).standard_normal(tuple(shape)).astype(np.float32)
        key = data.draw(basic_index(tuple(shape)))
        xr = rt.array(x, device=dev)
        view, ref = xr[key], x[key]
        check(view, ref)
        check(view * 2 + 1, ref * 2 + 1)
        check(rt.exp(view.T), np.exp(ref.T))
        check(view + view.T.T, ref + ref)
        if ref.ndim:
            check(view.sum(axis=-1), ref.sum(axis=-1), "float16")
            check(view.reshape(-1), ref.reshape(-1))
        if ref.ndim >= 2:
            check(view @ view.swapaxes(-1, -2) if hasattr(view, "swapaxes") else rt.matmul(
                view, rt.swapaxes(view, -1, -2)), ref @ np.swapaxes(ref, -1, -2), "float16")

    run()


@pytest.mark.parametrize("repeat", [0, 1, 2])
def test_reshape_of_views_gives_numpy_values_each_time_the_layout_repeats(dev, repeat):
    """Views' strides are remembered per layout: a reshape that needs a copy (a transpose flattened)
    and one that stays a view give numpy's values however often the same layout comes back."""
    base = np.arange(24, dtype=np.float32).reshape(4, 6) + repeat
    x = rt.array(base, device=dev)
    for _ in range(3):
        np.testing.assert_array_equal(x.T.reshape(24).numpy(), base.T.reshape(24))  # not a view: copied
        np.testing.assert_array_equal(x[:, 2:].reshape(16).numpy(), base[:, 2:].reshape(16))
        np.testing.assert_array_equal(x[1:3].reshape(3, 4).numpy(), base[1:3].reshape(3, 4))  # a view
        np.testing.assert_array_equal(x.T.reshape(2, 3, 4).numpy(), base.T.reshape(2, 3, 4))
