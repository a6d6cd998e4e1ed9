"""numpy's protocols and the array API namespace against numpy, on every driver."""

from __future__ import annotations

import copy
import operator
import pickle

import numpy as np
import pytest

import hal
import runtime as rt


def same(got, want, rtol=1e-6, atol=1e-6) -> None:
    want = np.asarray(want)
    assert isinstance(got, rt.Array), type(got)
    host = got.numpy()
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if want.dtype.kind == "f":
        np.testing.assert_allclose(host, want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(host, want)


@pytest.fixture
def data(dev):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.5
    return x, rt.array(x, device=dev)


def test_numpy_ufuncs_and_functions_stay_lazy_on_the_device(data):
    x, X = data
    for fn in (np.exp, np.sin, np.abs, np.floor, np.isnan, np.negative, np.sqrt):
        with np.errstate(all="ignore"):
            same(fn(X), fn(x))
    same(np.add(X, 1), x + 1)
    same(np.maximum(X, x), np.maximum(x, x))
    same(np.sum(X), np.sum(x))
    same(np.sum(X, axis=(0, 2), keepdims=True), np.sum(x, axis=(0, 2), keepdims=True))
    same(np.mean(X, axis=1), np.mean(x, axis=1))
    same(np.std(X), np.std(x), rtol=1e-5)
    same(np.var(X, axis=0, ddof=1), np.var(x, axis=0, ddof=1), rtol=1e-5)
    same(np.where(X > 0, X, 0.0), np.where(x > 0, x, np.float32(0)))
    same(np.concatenate([X, X], axis=1), np.concatenate([x, x], axis=1))
    same(np.stack([X, X], axis=-1), np.stack([x, x], axis=-1))
    same(np.add.reduce(X, axis=2), np.add.reduce(x, axis=2))
    same(np.transpose(X), np.transpose(x))
    same(np.clip(X, -2, 3), np.clip(x, -2, 3))
    with pytest.raises(TypeError):
        np.exp(X, out=np.empty_like(x))
    with pytest.raises(TypeError):
        np.linalg.svd(X)


def test_format_copy_pickle_repr(data, dev):
    x, X = data
    loss = X.sum()
    assert f"{loss:.4f}" == f"{x.sum():.4f}"
    assert f"{X}" == str(x)
    with pytest.raises(TypeError):
        f"{X:.2f}"
    same(X.copy(), x)
    assert copy.deepcopy(X) is X
    back = pickle.loads(pickle.dumps(X * 2))
    same(back, x * 2)
    assert back.device is X.device
    r = repr(X[0, 0])
    assert r.startswith("rt.Array(") and "float32" in r and dev in r


def test_floor_divide_remainder_std_any_all(dev):
    a = np.array([7, -7, 7, -7, 0, 5], np.int32)
    b = np.array([2, 2, -2, -2, 3, 5], np.int32)
    A, B = rt.array(a, device=dev), rt.array(b, device=dev)
    same(A // B, a // b)
    same(A % B, a % b)
    same(A % 3, a % 3)
    f = np.array([5.5, -5.5, 5.5, -5.5, -0.0], np.float32)
    g = np.array([2, 2, -2, -2, 3], np.float32)
    same(rt.array(f, device=dev) // rt.array(g, device=dev), f // g)
    same(rt.array(f, device=dev) % rt.array(g, device=dev), f % g)
    same(A.any(), a.any())
    same((A > -10).all(), (a > -10).all())
    same(rt.any(A > 6, axis=0), np.any(a > 6, axis=0))
    same(A.std(), a.std(), rtol=1e-5)
    same(A & 3, a & 3)
    same(A | B, a | b)
    same(~A, ~a)
    same(A << 2, a << 2)
    same(A >> 1, a >> 1)


def test_indexing_boolean_integer_and_bool_scalars(data):
    x, X = data
    same(X[X > 0], x[x > 0])
    same(X[x[..., 0] > 0], x[x[..., 0] > 0])
    same(X[[1, 0]], x[[1, 0]])
    same(X[:, [2, 0, 2], 1:3], x[:, [2, 0, 2], 1:3])
    same(X[rt.array(np.array([1, 0, 1])), 2], x[np.array([1, 0, 1]), 2])
    same(X[0, :, [1, 3]], x[0, :, [1, 3]])
    same(X[np.array([[0], [1]]), np.array([0, 2])], x[np.array([[0], [1]]), np.array([0, 2])])
    same(X[True], x[True])
    same(X[False], x[False])
    same(X[..., True], x[..., True])
    idx = np.array([1])
    same(X[idx, :], x[idx, :])  # a size-1 integer array keeps its axis
    same(X[:, idx, idx], x[:, idx, idx])
    with pytest.raises(IndexError):
        X[[5]]
    with pytest.raises(IndexError):
        X[0, 0, 0, 0]
    with pytest.raises(IndexError):
        X[3]
    with pytest.raises(IndexError):
        X[np.ones((3,), bool)]


def test_functional_updates(data):
    x, X = data
    want = x.copy()
    want[0, 1:, ::2] = -1
    same(X.at[0, 1:, ::2].set(-1), want)
    want = x.copy()
    want[:, 2] += 10
    same(X.at[:, 2].add(10), want)
    want = x.copy()
    np.add.at(want, ([0, 0, 1], [1, 1, 2]), 1)
    same(X.at[[0, 0, 1], [1, 1, 2]].add(1), want)
    want = x.copy()
    want[x > 3] = 0
    same(X.at[X > 3].set(0), want)
    with pytest.raises(TypeError, match="at"):
        X[0] = 1
    # values that do not broadcast to what array indices select, or are not numbers: typed errors
    for value, error in ((np.ones(5), rt.InvalidValueError), ("s", rt.InvalidTypeError)):
        for update in ("set", "add", "max"):
            with pytest.raises(error):
                getattr(X.at[[0, 1]], update)(value)
    same(X.at[[0, 1]].set(np.zeros(4, np.float32)), np.zeros_like(x))  # (and the device stays usable)


def test_integer_at_add_on_every_driver(dev):
    """x.at[indices].add of int8 values: repeated indices add up and wrap in the dtype, as numpy's add.at."""
    x = np.array([[100, -100, 7], [1, 2, 3]], np.int8)
    want = x.copy()
    np.add.at(want, ([0, 0, 0, 1], [0, 0, 1, 2]), np.array([100, 27, -100, 5], np.int8))
    got = rt.array(x, device=dev).at[rt.asarray([0, 0, 0, 1], device=dev), rt.asarray([0, 0, 1, 2], device=dev)]
    np.testing.assert_array_equal(got.add(rt.asarray(np.array([100, 27, -100, 5], np.int8), device=dev)).numpy(),
                                  want)


def test_manipulation(data):
    x, X = data
    same(rt.concat([X, X[:, :1]], axis=1), np.concatenate([x, x[:, :1]], axis=1))
    same(rt.concat([X, X], axis=None), np.concatenate([x, x], axis=None))
    same(rt.concat([X[0], rt.array(np.array([[1, 2, 3, 4]], np.int64), device=X.ctx)]),
         np.concatenate([x[0], np.array([[1, 2, 3, 4]], np.int64)]))
    same(rt.stack([X[0], X[1]], axis=1), np.stack([x[0], x[1]], axis=1))
    same(rt.flip(X, axis=(0, 2)), np.flip(x, axis=(0, 2)))
    same(rt.roll(X, 2, axis=2), np.roll(x, 2, axis=2))
    same(rt.roll(X, -5), np.roll(x, -5))
    same(rt.moveaxis(X, 0, -1), np.moveaxis(x, 0, -1))
    same(rt.tile(X[0], (2, 1, 3)), np.tile(x[0], (2, 1, 3)))
    same(rt.repeat(X, 2, axis=1), np.repeat(x, 2, axis=1))
    same(rt.repeat(X[0, 0], rt.array(np.array([0, 1, 2, 3]), device=X.ctx)), np.repeat(x[0, 0], [0, 1, 2, 3]))
    same(rt.squeeze(X[:, :1], axis=1), np.squeeze(x[:, :1], axis=1))
    same(rt.take(X, rt.array(np.array([3, -1, 0]), device=X.ctx), axis=2), np.take(x, [3, -1, 0], axis=2))
    same(rt.take_along_axis(X, rt.array(np.argsort(x, axis=1), device=X.ctx), axis=1),
         np.take_along_axis(x, np.argsort(x, axis=1), axis=1))
    same(rt.cumulative_sum(X, axis=1), np.cumsum(x, axis=1))
    same(rt.sort(-X, axis=1), np.sort(-x, axis=1))
    same(rt.argsort(X[0, 0], descending=True), np.argsort(-x[0, 0], kind="stable"))
    same(rt.clip(X, -1, 1), np.clip(x, -1, 1))
    same(rt.prod(X[:, :, :2] / 4, axis=0), np.prod(x[:, :, :2] / 4, axis=0))
    same(rt.unique_values(rt.array(np.array([3, 1, 3, 2]), device=X.ctx)), np.array([1, 2, 3]))
    same(rt.nonzero(X > 10)[2], np.nonzero(x > 10)[2])
    same(rt.tril(X[0]), np.tril(x[0]))
    same(rt.eye(3, 4, k=1, device=X.ctx), np.eye(3, 4, k=1, dtype=np.float32))


def test_namespace_and_info(data, dev):
    _, X = data
    xp = X.__array_namespace__()
    assert xp is rt and xp.__array_api_version__ == "2024.12"
    info = xp.__array_namespace_info__()
    assert info.default_dtypes()["real floating"] == rt.float32 and info.default_dtypes()["integral"] == rt.int64
    assert xp.finfo(xp.float32).eps == np.finfo(np.float32).eps and xp.iinfo(xp.int8).min == -128
    assert xp.isdtype(xp.uint8, "unsigned integer") and not xp.isdtype(xp.float32, "integral")
    assert xp.result_type(xp.int8, xp.uint8) == xp.int16 and xp.can_cast(xp.int8, xp.float32)
    assert xp.e == np.e and xp.newaxis is None
    with pytest.raises(hal.InvalidArgumentError):
        X.__array_namespace__(api_version="1999.01")


def test_grad_rules_of_new_elementwise_functions(dev):
    x = np.array([0.3, 0.7, -0.2], np.float32)
    X = rt.array(x, device=dev)
    rules = {"sin": np.cos(x), "cos": -np.sin(x), "atan": 1 / (1 + x * x), "expm1": np.exp(x),
             "log1p": 1 / (1 + x), "square": 2 * x, "sinh": np.cosh(x), "asin": 1 / np.sqrt(1 - x * x)}
    for name, want in rules.items():
        g = rt.grad(lambda v, name=name: getattr(rt, name)(v).sum())(X)
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_grad_with_respect_to_integers_raises(dev):
    with pytest.raises(TypeError, match="float"):
        rt.grad(lambda v: (v * v).sum())(rt.array(np.array([1, 2], np.int32), device=dev))


def test_rounding_integers_and_bools_is_the_identity(dev):
    for dtype in (np.uint8, np.int8, np.int32, np.int64, np.bool_):
        a = np.array([0, 1, 3, 1], dtype)
        A = rt.array(a, device=dev)
        for name in ("round", "floor", "ceil", "trunc"):
            same(getattr(rt, name)(A), a if dtype is np.bool_ else getattr(np, name)(a))
        same(np.round(A) if dtype is not np.bool_ else A, a)
    f = np.array([0.5, 1.5, 2.5, -0.5, -1.7], np.float32)
    same(rt.round(rt.array(f, device=dev)), np.round(f))


def test_builtin_round_and_in_as_numpy(dev):
    """round(x), round(x, n) and ``v in x`` raised TypeError (no __round__) and the ambiguous truth
    value error (``in`` fell back to iterating rows); iterating a 0-d array raised a plain TypeError."""
    f = np.array([[1.25, -2.5, 3.5], [0.5, 1.5, 1234.5678]], np.float32)
    F = rt.array(f, device=dev)
    same(round(F), np.round(f))
    for digits in (0, 1, 2, -1, -2, np.int64(1)):
        same(round(F, digits), np.round(f, digits), rtol=1e-6, atol=1e-4)
    for dtype in (np.int64, np.int32, np.uint8):
        i = np.array([15, 25, 35, 124], dtype)
        for digits in (None, 1, -1, -2):
            same(round(rt.array(i, device=dev), digits), np.round(i, digits or 0))
    c = np.array([1.25 + 2.55j, -2.5 - 0.15j], np.complex64)
    np.testing.assert_allclose(round(rt.array(c, device=dev), 1).numpy(), np.round(c, 1), atol=1e-6)
    for bad in (1.5, True, "2", None.__class__):
        with pytest.raises(rt.InvalidTypeError, match="digits"):
            round(F, bad)
    with pytest.raises(rt.InvalidTypeError, match="bool"):
        round(rt.array(np.array([True, False]), device=dev), -1)  # numpy refuses it too
    assert 1.5 in F and -2.5 in F and 7.0 not in F and [0.5, 1.5, 1234.5678] in F
    assert 3 in rt.array(np.arange(5), device=dev) and 9 not in rt.array(np.arange(5), device=dev)
    with pytest.raises(rt.InvalidTypeError, match="0-d"):
        iter(rt.array(1.0, device=dev))
    same(F + 1, f + 1)  # the device goes on


def test_numpy_functions_given_out_refuse_it_instead_of_ignoring_it(dev):
    """np.dot, np.clip, np.stack, np.concatenate, np.cumsum, np.take, np.round and np.fft.fft returned
    a new array and left the caller's ``out`` unwritten (a silent wrong result); by name or by
    position, ``out`` is refused as the ufuncs refuse it."""
    a = rt.array(np.ones((2, 2), np.float32), device=dev)
    out = np.zeros((2, 2), np.float32)
    calls = {
        "np.dot": lambda: np.dot(a, a, out=out), "np.dot ": lambda: np.dot(a, a, out),
        "np.clip": lambda: np.clip(a, 0, 1, out=out), "np.clip ": lambda: np.clip(a, 0, 1, out),
        "np.stack": lambda: np.stack([a, a], out=np.zeros((2, 2, 2), np.float32)),
        "np.concatenate": lambda: np.concatenate([a, a], out=np.zeros((4, 2), np.float32)),
        "np.cumsum": lambda: np.cumsum(a, axis=0, out=out), "np.take": lambda: np.take(a, [0], out=out[0, :1]),
        "np.round": lambda: np.round(a, 1, out), "np.sum": lambda: np.sum(a, out=out[0, 0]),
        "np.fft.fft": lambda: np.fft.fft(a, out=np.zeros((2, 2), np.complex64)),
        "np.matmul": lambda: np.matmul(a, a, out=out),
    }
    for name, call in calls.items():
        with pytest.raises(rt.InvalidTypeError, match=rf"{name.strip()}\(\.\.\., out=\.\.\.\)"):
            call()
    assert not out.any()
    same(np.dot(a, a, out=None), np.full((2, 2), 2, np.float32))  # (out=None is no out)
    f = np.array([1.2345, -2.5, 1234.5678], np.float32)
    F = rt.array(f, device=dev)
    for decimals in (0, 2, -1):
        same(np.round(F, decimals), np.round(f, decimals), atol=1e-4)
        same(np.around(F, decimals), np.around(f, decimals), atol=1e-4)
        same(F.round(decimals), f.round(decimals), atol=1e-4)


def test_numpy_function_arguments_that_were_ignored_take_effect(dev):
    """np.reshape(order="F") gave the row-major result, np.stack(dtype=) and np.*_like(shape=) were
    ignored (wrong dtype, wrong shape), np.diff refused numpy's scalar prepend/append."""
    h = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    a = rt.array(h, device=dev)
    for shape in ((4, 6), (-1,), 24, (2, 2, 6), (3, -1, 2)):
        for order in ("C", "F", "A"):
            same(np.reshape(a, shape, order=order), np.reshape(h, shape, order=order))
    with pytest.raises(rt.InvalidValueError, match="order"):
        np.reshape(a, (4, 6), order="K")
    same(np.stack([a, a], dtype=np.float64), np.stack([h, h], dtype=np.float64))
    same(np.zeros_like(a, shape=(5,)), np.zeros_like(h, shape=(5,)))
    same(np.ones_like(a, shape=(2, 2), dtype=np.int32), np.ones_like(h, shape=(2, 2), dtype=np.int32))
    same(np.full_like(a, 7, shape=(3,)), np.full_like(h, 7, shape=(3,)))
    same(np.zeros_like(a), np.zeros_like(h))
    same(np.diff(a, prepend=0), np.diff(h, prepend=0))
    same(np.diff(a, axis=0, append=np.float32(2.5)), np.diff(h, axis=0, append=np.float32(2.5)))
    same(np.diff(a, n=2, axis=1, prepend=1, append=np.array(2.0)), np.diff(h, n=2, axis=1, prepend=1,
                                                                           append=np.array(2.0)))
    with pytest.raises(hal.InvalidArgumentError, match="axis 5"):
        np.diff(a, axis=5, prepend=0)


def test_numpy_reduction_arguments_without_a_counterpart_are_refused_not_ignored(dev):
    """np.sum(initial=), np.max(initial=) gave the result without the initial value, np.clip(dtype=)
    the input's dtype: each is now numpy's TypeError naming the function, or takes effect."""
    h = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = rt.array(h, device=dev)
    for call in (lambda x: np.sum(x, initial=5), lambda x: np.max(x, axis=0, initial=4),
                 lambda x: np.prod(x, where=np.array([True, False, True])),
                 lambda x: np.std(x, mean=np.zeros((1, 1), np.float32)),
                 lambda x: np.clip(x, 1, 3, where=np.array([True, False, True]))):
        call(h)  # numpy takes it
        with pytest.raises(TypeError, match="no implementation found"):
            call(a)
    same(np.clip(a, 1, 3, dtype=np.float64), np.clip(h, 1, 3, dtype=np.float64))
    same(np.clip(a, min=1, max=3), np.clip(h, min=1, max=3))
    same(np.std(a, correction=1), np.std(h, correction=1), rtol=1e-5)
    same(np.sum(a, axis=1, dtype=np.float64), np.sum(h, axis=1, dtype=np.float64))


def test_ufunc_dtype_takes_effect_and_other_ufunc_keywords_are_refused(dev):
    """np.add(x, 1, dtype=) and the like raised numpy's dispatch TypeError, as did where=/casting=
    (a HalError now, naming them); x.reshape(..., order="F") had no order."""
    h = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = rt.array(h, device=dev)
    same(np.add(a, 1, dtype=np.float64), np.add(h, 1, dtype=np.float64))
    same(np.matmul(a, a.T, dtype=np.float64), np.matmul(h, h.T, dtype=np.float64))
    for call, word in ((lambda: np.add(a, 1, where=h > 2), "where"), (lambda: np.exp(a, casting="unsafe"), "casting"),
                       (lambda: np.less(a, 3, dtype=np.float64), "bool")):  # (numpy refuses the last too)
        with pytest.raises(rt.InvalidTypeError, match=word):
            call()
    for order in ("C", "F", "A"):
        same(a.reshape(4, 3, order=order), h.reshape(4, 3, order=order))
        same(a.reshape((2, 6), order=order), h.reshape((2, 6), order=order))
    with pytest.raises(rt.InvalidValueError, match="order"):
        a.reshape(12, order="K")


def test_concatenate_and_stack_follow_numpys_casting_rules(dev):
    """np.concatenate/np.stack cast whatever dtype= and casting= said (float32 to int32 under
    "same_kind", float32 with float64 under "no"), where numpy refuses."""
    f, d = np.ones((2, 2), np.float32), np.ones((2, 2))
    F, D = rt.array(f, device=dev), rt.array(d, device=dev)
    for join in (np.concatenate, np.stack):
        refused = [dict(casting="no"), dict(casting="equiv"), dict(dtype=np.int32),
                   dict(dtype=np.float32, casting="safe")]
        for kwargs in refused:
            with pytest.raises(TypeError):
                join([f, d], **kwargs)  # numpy refuses
            with pytest.raises(rt.InvalidTypeError, match="cannot cast"):
                join([F, D], **kwargs)
        for kwargs in (dict(), dict(dtype=np.float32), dict(dtype=np.int32, casting="unsafe"), dict(casting="safe")):
            same(join([F, D], **kwargs), join([f, d], **kwargs))
        same(join([F, F], casting="no"), join([f, f], casting="no"))
        with pytest.raises(rt.InvalidValueError, match="casting"):
            join([F, F], casting="bogus")
    bf = rt.astype(F, rt.bfloat16)
    same(np.concatenate([bf, bf], dtype=np.float32), np.concatenate([f, f]))
    with pytest.raises(rt.InvalidTypeError, match="cannot cast"):
        np.concatenate([F, F], dtype=rt.bfloat16, casting="safe")


def test_zero_d_boolean_arrays_index_as_masks(data):
    x, X = data
    for mask in (True, False):
        same(X[rt.asarray(mask, device=X.device)], x[np.asarray(mask)])
        same(X[np.asarray(mask)], x[np.asarray(mask)])
        same(X[..., rt.asarray(mask, device=X.device)], x[..., np.asarray(mask)])
    s = rt.asarray(False, device=X.device)
    same(s[rt.asarray(False, device=X.device)], np.asarray(False)[np.asarray(False)])


def test_floor_divide_of_infinities_follows_the_standard(dev):
    a = np.array([np.inf, -np.inf, 1.0, -1.0, 5.0, np.nan], np.float32)
    b = np.array([1.0, 2.0, np.inf, np.inf, -np.inf, 1.0], np.float32)
    got = (rt.array(a, device=dev) // rt.array(b, device=dev)).numpy()
    want = np.array([np.inf, -np.inf, 0.0, -0.0, -0.0, np.nan], np.float32)  # a / b where an operand is not finite
    np.testing.assert_array_equal(got, want)
    assert list(np.signbit(got[:5])) == [False, True, False, True, True]


@pytest.mark.parametrize("shape", [(1, 0), (0, 0), (0, 3), (2, 0, 3), (0, 3, 2)])
def test_repeat_and_take_over_empty_axes_give_numpy_shapes(dev, shape):
    """Empty arrays along any axis, with counts or indices from the host and from the device (the
    gather once reshaped one element into an empty shape)."""
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    X = rt.array(x, device=dev)
    for axis, n in enumerate(shape):
        for counts in (np.zeros(n, np.int64), np.full(n, 2, np.int64), np.array([3], np.int64)):
            same(rt.repeat(X, counts, axis=axis), np.repeat(x, counts, axis=axis))
            same(rt.repeat(X, rt.array(counts, device=dev), axis=axis), np.repeat(x, counts, axis=axis))
        same(rt.repeat(X, 2, axis=axis), np.repeat(x, 2, axis=axis))
        for indices in ([], [0, 0] if n else []):
            host = np.array(indices, np.int64)
            same(rt.take(X, host, axis=axis), np.take(x, host, axis=axis))
            same(rt.take(X, rt.array(host, device=dev), axis=axis), np.take(x, host, axis=axis))


def test_take_of_an_empty_result_still_checks_device_indices(dev):
    """numpy raises for an index out of range even where the result is empty (no row to take from)."""
    X = rt.array(np.zeros((0, 3), np.float32), device=dev)
    for indices in ([5], [-4], [0, 3]):
        with pytest.raises(IndexError):
            rt.take(X, rt.array(np.array(indices), device=dev), axis=1).numpy()
    same(rt.take(X, rt.array(np.array([2, -1]), device=dev), axis=1), np.take(np.zeros((0, 3), np.float32), [2, -1],
                                                                             axis=1))


def test_repeat_refuses_counts_numpy_refuses_with_typed_errors(dev):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    X = rt.array(x, device=dev)
    same(rt.repeat(X, [True, False, True], axis=1), np.repeat(x, [True, False, True], axis=1))
    same(rt.repeat(X, np.int32(2), axis=0), np.repeat(x, np.int32(2), axis=0))
    same(rt.repeat(X, np.array(2), axis=1), np.repeat(x, np.array(2), axis=1))
    for counts, error in (([1.5, 2, 1], rt.InvalidTypeError), (2.0, rt.InvalidTypeError),
                          (np.float64(2), rt.InvalidTypeError), ("2", rt.InvalidTypeError),
                          (None, rt.InvalidTypeError), ([[1, 1, 1]], rt.InvalidValueError),
                          ([1, 2], rt.InvalidValueError), ([1, -1, 1], rt.InvalidValueError),
                          (-1, rt.InvalidValueError),
                          (rt.array(np.array([1.0, 2.0, 1.0], np.float32), device=dev), rt.InvalidTypeError)):
        with pytest.raises(error):
            rt.repeat(X, counts, axis=1)
    same(rt.repeat(X, 1, axis=1), x)  # the device stays usable


def test_functions_taking_arrays_refuse_what_is_not_numeric_data_with_typed_errors(dev):
    """Non-arrays where an array goes: InvalidTypeError (a TypeError), before any device work."""
    X = rt.array(np.arange(12, dtype=np.float32).reshape(3, 4), device=dev)
    functions = [rt.zeros_like, rt.ones_like, rt.empty_like, lambda v: rt.full_like(v, 1), rt.squeeze,
                 rt.contiguous, rt.copy_array, lambda v: rt.stack([X, v]), lambda v: rt.concat([X, v])]
    for fn in functions:
        for value in (None, "a", object(), slice(None), rt.float32):
            with pytest.raises(rt.InvalidTypeError):
                fn(value)
    # what numpy takes as array data still works, as in numpy
    same(rt.ones_like([1.0, 2.0]), np.ones_like([1.0, 2.0], dtype=np.float32))
    same(rt.squeeze([[3]]), np.squeeze(np.array([[3]])))
    same(X + 1, np.arange(12, dtype=np.float32).reshape(3, 4) + 1)


def test_shapes_axes_counts_and_sequences_must_be_integers_and_sequences(dev):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    X = rt.array(x, device=dev)
    calls = [lambda v: rt.broadcast_to(X, v), lambda v: rt.permute_dims(X, v), lambda v: rt.transpose(X, v),
             lambda v: rt.tile(X, v), lambda v: rt.stack(v), lambda v: rt.concat(v), lambda v: rt.roll(X, v),
             lambda v: rt.eye(v), lambda v: rt.eye(3, v), lambda v: rt.eye(3, k=v), lambda v: rt.tril(X, k=v),
             lambda v: rt.tensordot(X, X, axes=v)]
    for call in calls:
        for value in (1.5, np.float32(1.0), "a", object(), rt.float32, None):
            if value is None and call in (calls[2], calls[8]):
                continue  # transpose(x, None) reverses the axes and eye(3, None) is square, as in numpy
            with pytest.raises((rt.InvalidTypeError, rt.InvalidValueError)):
                call(value)
    for call, value in ((lambda v: rt.tile(X, v), -1), (lambda v: rt.eye(v), -1), (lambda v: rt.tril(v), X[0]),
                        (lambda v: rt.tensordot(X, X, axes=v), 3), (lambda v: rt.tensordot(X, X, axes=v), -1),
                        (lambda v: rt.tensordot(X, X, axes=v), ([0], [0, 1])), (lambda v: rt.vecdot(X, v), 1.5),
                        (lambda v: rt.searchsorted(X, v), 1.5), (lambda v: rt.take_along_axis(X, v, axis=1), 1),
                        (lambda v: rt.take_along_axis(X, v, axis=1), np.zeros((3, 1), np.float32))):
        with pytest.raises((rt.InvalidTypeError, rt.InvalidValueError)):
            call(value)
    # the same calls with what numpy takes
    same(rt.broadcast_to(X[:1], (2, 3, 4)), np.broadcast_to(x[:1], (2, 3, 4)))
    same(rt.permute_dims(X, [np.int64(1), 0]), x.T)
    same(rt.permute_dims(X, np.array([1, 0])), x.T)
    same(rt.permute_dims(X, rt.array(np.array([1, 0]), device=dev)), x.T)
    same(rt.tile(X, np.array([2, 1])), np.tile(x, (2, 1)))
    same(rt.stack(X), np.stack(x))
    same(rt.tile(X, 2), np.tile(x, 2))
    same(rt.tile(X, (np.int32(2), 1)), np.tile(x, (2, 1)))
    same(rt.roll(X, np.int64(5), axis=1), np.roll(x, 5, axis=1))
    same(rt.eye(3, np.int64(4), k=np.int8(1)), np.eye(3, 4, k=1, dtype=np.float32))
    same(rt.tensordot(X, X, axes=np.int64(2)), np.tensordot(x, x, axes=2))
    same(rt.tensordot(X, X, axes=([0], [0])), np.tensordot(x, x, axes=([0], [0])))


def test_fill_values_and_scalars_out_of_range_give_typed_errors(dev):
    for value in ("a", None, [1, 2], (1,), object(), np.array([1.0, 2.0]), np.str_("1")):
        with pytest.raises(rt.InvalidTypeError):
            rt.full((2,), value, device=dev)
    with pytest.raises(rt.InvalidTypeError):
        rt.full((2,), 1 + 2j, dtype=rt.int32, device=dev)
    same(rt.full((2,), np.array(2.5), device=dev), np.full((2,), 2.5))
    same(rt.full((2,), 1j, dtype=rt.bool, device=dev), np.full((2,), 1j, dtype=bool))
    flags = rt.array(np.array([True, False]), device=dev)
    for value in (2**63, -(2**63) - 1, 2**70):
        with pytest.raises(rt.ScalarOverflowError):
            flags + value
    same(flags + (2**63 - 1), np.array([True, False]) + (2**63 - 1))
    with pytest.raises(rt.InvalidValueError):
        rt.arange(-(2**70), device=dev)
    with pytest.raises(rt.ArrayTooLargeError):
        rt.tile(flags, 2**70)
    with pytest.raises(rt.ArrayTooLargeError):
        rt.fft.fftfreq(2**62, device=dev)
    with pytest.raises(rt.InvalidTypeError):
        operator.index(rt.array(np.array(1.0), device=dev))
    assert operator.index(rt.array(np.array(3), device=dev)) == 3
    with pytest.raises(rt.InvalidTypeError):
        len(rt.array(np.array(1.0), device=dev))


def test_slices_of_odd_bounds_and_ragged_data_give_typed_errors_or_numpy_results(dev):
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    X = rt.array(x, device=dev)
    for key, error in (((slice(0, 1.5),), rt.InvalidTypeError), (slice("a"), rt.InvalidTypeError),
                       (slice(None, None, 0), rt.InvalidValueError), ((0, slice(None, None, 0)), rt.InvalidValueError)):
        with pytest.raises(error):
            X[key]
    # steps and bounds past int64 select what numpy selects (one element or none: no stride overflows)
    for key in ((slice(None, None, 2**70),), (slice(-(2**70), 2**70, 2**70),), (Ellipsis, slice(3, 4, 99)),
                (slice(None, None, -(2**70)),), (0, slice(1, 2, 5))):
        same(X[key], x[key])
    for ragged in ([1, [2]], [[1, 2], [3]]):
        with pytest.raises(rt.InvalidValueError):
            rt.asarray(ragged, device=dev)


def test_keys_of_slices_and_ints_index_as_numpy(dev):
    """Keys of only slices and Python ints (the usual basic index, taken without expanding it) give
    numpy's results on strided views, as the same keys with an Ellipsis appended (the general path)
    do; numpy integers, booleans and too many indices go the general way and keep their meaning."""
    rng = np.random.default_rng(3)
    x = np.arange(6 * 5 * 4, dtype=np.int32).reshape(6, 5, 4)
    X = rt.array(x, device=dev)

    def entry(n: int):
        if rng.random() < 0.4:
            return int(rng.integers(-n, n))
        a, b = (int(v) for v in rng.integers(-n - 2, n + 2, 2))
        return slice(a if rng.random() < 0.7 else None, b if rng.random() < 0.7 else None,
                     int(rng.choice([1, 2, -1, -3])))

    for view, host in ((X, x), (X[::-1, 1:, ::2], x[::-1, 1:, ::2]), (X.T, x.T)):
        for _ in range(40):
            key = tuple(entry(host.shape[i]) for i in range(int(rng.integers(1, host.ndim + 1))))
            same(view[key], host[key])
            same(view[key + (Ellipsis,)], host[key + (Ellipsis,)])
    same(X[np.int64(1), 2], x[np.int64(1), 2])
    same(X[True], x[True])
    same(X[1, False], x[1, False])
    for key in ((0, 0, 0, 0), (6, 0), (0, -6)):
        with pytest.raises(rt.InvalidIndexError):
            X[key]


def test_python_integers_past_float64_precision_stay_exact_in_uint64_and_int64(dev):
    """numpy infers float64 for [0, 2**63 + 1] on its own; with the dtype given the values are exact.
    A Python integer the dtype cannot hold is refused, as numpy, PyTorch and JAX refuse it (it wrapped:
    300 as uint8 was 44); floats convert as astype does."""
    big = 2**63 + 1
    same(rt.asarray(big, dtype=rt.uint64, device=dev), np.asarray(big, dtype=np.uint64))
    same(rt.asarray([0, big, 2**64 - 1], dtype=rt.uint64, device=dev), np.array([0, big, 2**64 - 1], np.uint64))
    same(rt.asarray([[-(2**63), 2**63 - 1]], dtype=rt.int64, device=dev), np.array([[-(2**63), 2**63 - 1]], np.int64))
    same(rt.asarray([1.5, -2.7], dtype=rt.int32, device=dev), np.array([1, -2], np.int32))
    same(rt.asarray([np.inf, -1e300], dtype=rt.int8, device=dev), np.array([127, -128], np.int8))  # (saturated)
    for value, dtype in ((big, rt.int64), ([-1, 300], rt.uint8), ([np.int8(1), 300], rt.int8), (-1, rt.uint64),
                         ([[1], [2**70]], rt.int64)):
        with pytest.raises(rt.ScalarOverflowError, match="out of bounds"):
            rt.asarray(value, dtype=dtype, device=dev)


def test_diff_orders_corrections_and_keepdims_as_numpy_takes_them(dev):
    x = np.arange(8.0, dtype=np.float32).reshape(2, 4) ** 2
    X = rt.array(x, device=dev)
    for n in (0, 1, 3, 4, 9, 2**70):  # (an order past the axis' length: empty, without building 2**70 nodes)
        same(rt.diff(X, n=n), np.diff(x, n=min(n, 9)))
    for n, error in ((-1, rt.InvalidValueError), (1.5, rt.InvalidTypeError), ("2", rt.InvalidTypeError)):
        with pytest.raises(error):
            rt.diff(X, n=n)
    same(rt.var(X, correction=np.int64(1)), np.var(x, ddof=1))
    same(rt.std(X, axis=1, correction=0.5), np.std(x, axis=1, ddof=0.5))
    for correction in ("a", None, [1]):
        with pytest.raises(rt.InvalidTypeError):
            rt.var(X, correction=correction)
    same(rt.sum(X, axis=1, keepdims=[0, 1]), np.sum(x, axis=1, keepdims=True))  # any truth value, as numpy
    same(rt.max(X, axis=0, keepdims=np.bool_(False)), np.max(x, axis=0))


def test_vecdot_keeps_small_integer_dtypes_and_reshape_takes_shape_by_name(dev):
    xp = rt.array(np.zeros(1), device=dev).__array_namespace__()
    a = np.array([[1, 2, 3], [4, 5, 6]], np.uint8)
    same(xp.vecdot(rt.array(a, device=dev), rt.array(a, device=dev)), np.sum(a * a, axis=-1, dtype=np.uint8))
    same(xp.reshape(rt.array(a, device=dev), shape=(3, 2)), a.reshape(3, 2))


def test_dlpack_of_unsigned_arrays(dev):
    if not dev.startswith("local"):
        pytest.skip("numpy imports host (CPU) DLPack capsules only")
    a = np.array([1, 200, 255], np.uint8)
    np.testing.assert_array_equal(np.from_dlpack(rt.array(a, device=dev)), a)


def test_comparisons_with_python_integers_past_the_dtype_answer_as_numpy(dev):
    """An integer array compared with a Python integer its dtype cannot hold: every element lies on one
    side of it, and the answer is numpy 2's (it raised ScalarOverflowError: ``uint8_image < -1``)."""
    ops = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
           ">=": np.greater_equal}
    for dtype in ("int8", "uint8", "uint32", "int64", "uint64"):
        info = np.iinfo(dtype)
        x = np.array([info.min, 0, 1, info.max], dtype)
        X = rt.asarray(x, device=dev)
        for value in (int(info.max) + 1, int(info.min) - 1, 2**70, -(2**70)):
            for symbol, ufunc in ops.items():
                same(eval(f"X {symbol} value"), eval(f"x {symbol} value"))
                same(eval(f"value {symbol} X"), eval(f"value {symbol} x"))
                same(getattr(rt, ufunc.__name__)(X, value), ufunc(x, value))
    with pytest.raises(rt.ScalarOverflowError):  # (arithmetic still refuses the value)
        rt.asarray(np.ones(2, np.uint8), device=dev) + 300
