"""Gradients against central finite differences of a float64 numpy reference."""

from __future__ import annotations

import threading
import weakref

import numpy as np
import pytest

import hal
import runtime as rt


def numeric_grad(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    x = x.astype(np.float64)
    g = np.zeros_like(x)
    flat = g.reshape(-1)
    for i in range(x.size):
        e = np.zeros(x.size)
        e[i] = eps
        e = e.reshape(x.shape)
        flat[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return g


def sig(z):
    return 1 / (1 + np.exp(-z))


_W = np.arange(12.0).reshape(3, 4) / 4 + 1  # weights that tell each output position apart


def _w() -> rt.Array:
    return rt.asarray(_W.astype(np.float32))


def _evaluated_inside(x):
    """A function that evaluates an intermediate on its way (as one that logs it does)."""
    y = rt.exp(x) * 0.5
    rt.eval(y)
    y.numpy()
    scale = float(y.sum())  # read on the host: a constant to the gradient (PyTorch's .item())
    return (y * x).sum() + 0.0 * scale


# Cases whose graph depends on the data (a boolean mask's result has as many elements as it selects):
# each step records its own graph.
DATA_SHAPED = {"boolean_mask"}

# (runtime fn, numpy float64 fn, input shape, positive input)
CASES = {
    "evaluated_inside": (_evaluated_inside, lambda x: (0.5 * np.exp(x) * x).sum(), (3, 4), False),
    "take_repeated": (lambda x: (rt.take(x, rt.asarray([3, 0, 0, 2])) * rt.asarray([1.0, 2.0, 5.0, 7.0])).sum(),
                      lambda x: (np.take(x, [3, 0, 0, 2]) * np.array([1.0, 2.0, 5.0, 7.0])).sum(), (5,), False),
    "integer_array_index": (lambda x: (x[rt.asarray([2, 0, 2])] * _w()).sum(), lambda x: (x[[2, 0, 2]] * _W).sum(),
                            (3, 4), False),
    "boolean_mask": (lambda x: (x[x > 0] ** 2).sum(), lambda x: (x[x > 0] ** 2).sum(), (3, 4), False),
    "take_along_axis": (lambda x: (rt.take_along_axis(x, rt.asarray([[1, 1, 0, 3]] * 3), axis=1) * _w()).sum(),
                        lambda x: (np.take_along_axis(x, np.array([[1, 1, 0, 3]] * 3), axis=1) * _W).sum(),
                        (3, 4), False),
    "sort": (lambda x: (rt.sort(x, axis=0) * _w()).sum(), lambda x: (np.sort(x, axis=0) * _W).sum(), (3, 4), False),
    "sort_descending": (lambda x: (rt.sort(x, descending=True) * _w()).sum(),
                        lambda x: (np.flip(np.sort(x, axis=-1), -1) * _W).sum(), (3, 4), False),
    "cumulative_sum": (lambda x: (rt.cumulative_sum(x, axis=1) * _w()).sum(),
                       lambda x: (np.cumsum(x, axis=1) * _W).sum(), (3, 4), False),
    "cumulative_prod": (lambda x: (rt.cumulative_prod(x, axis=0, include_initial=True)[1:] * _w()).sum(),
                        lambda x: (np.cumprod(x, axis=0) * _W).sum(), (3, 4), False),
    "add_broadcast": (lambda x: (x + rt.ones((3, 1))).sum(), lambda x: (x + np.ones((3, 1))).sum(), (4,), False),
    "mul_sub_div": (lambda x: ((x * x - x) / (x * x + 1)).sum(), lambda x: ((x * x - x) / (x * x + 1)).sum(),
                    (2, 3), False),
    "pow": (lambda x: (x ** 3 + 2.0 ** x + x ** x).sum(), lambda x: (x ** 3 + 2.0 ** x + x ** x).sum(), (5,), True),
    "exp_log_sqrt": (lambda x: (rt.exp(x) * rt.log(x) + rt.sqrt(x)).mean(),
                     lambda x: (np.exp(x) * np.log(x) + np.sqrt(x)).mean(), (3, 2), True),
    "tanh_sigmoid": (lambda x: (rt.tanh(x) * rt.sigmoid(2 * x)).sum(), lambda x: (np.tanh(x) * sig(2 * x)).sum(),
                     (6,), False),
    "neg_abs": (lambda x: (abs(x) - x * 3).sum(), lambda x: (np.abs(x) - x * 3).sum(), (5,), False),
    "max_min": (lambda x: x.max(axis=1).sum() + x.min() * 2, lambda x: x.max(axis=1).sum() + x.min() * 2,
                (3, 4), False),
    "maximum_minimum": (lambda x: (rt.maximum(x, 0.1) + rt.minimum(x, x[::-1] * 0.5)).sum(),
                        lambda x: (np.maximum(x, 0.1) + np.minimum(x, x[::-1] * 0.5)).sum(), (7,), False),
    "where": (lambda x: rt.where(x > 0, x * x, -x).sum(), lambda x: np.where(x > 0, x * x, -x).sum(), (8,), False),
    "mean_axes": (lambda x: (x.mean(axis=(0, 2), keepdims=True) * x).sum(),
                  lambda x: (x.mean(axis=(0, 2), keepdims=True) * x).sum(), (2, 3, 2), False),
    "slicing": (lambda x: (x[1:, ::-2] * x[0, None, 1::2]).sum() + x[-1, 0],
                lambda x: (x[1:, ::-2] * x[0, None, 1::2]).sum() + x[-1, 0], (3, 4), False),
    "reshape_transpose": (lambda x: (x.reshape(6, 2).T @ x.reshape(6, 2)).sum(),
                          lambda x: (x.reshape(6, 2).T @ x.reshape(6, 2)).sum(), (3, 4), False),
    "broadcast_to": (lambda x: (rt.broadcast_to(x, (3, 2, 4)) * rt.arange(4).astype(rt.float32)).sum(),
                     lambda x: (np.broadcast_to(x, (3, 2, 4)) * np.arange(4)).sum(), (2, 1), False),
    "astype": (lambda x: (x.astype(rt.float16).astype(rt.float32) * 2).sum(), lambda x: (x * 2).sum(), (3,), False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_grad_matches_finite_differences(dev, case):
    fn, ref, shape, positive = CASES[case]
    rng = np.random.default_rng(sum(case.encode()))
    x = rng.standard_normal(shape)
    if positive:
        x = np.abs(x) + 0.5
    x32 = x.astype(np.float32)
    value, g = rt.value_and_grad(fn)(rt.array(x32, device=dev))
    tol = 2e-2 if case == "astype" else 2e-3  # the astype case rounds through float16
    np.testing.assert_allclose(float(value), ref(x32.astype(np.float64)), rtol=tol / 10, atol=tol / 10)
    np.testing.assert_allclose(g.numpy(), numeric_grad(ref, x32), rtol=tol, atol=tol)


def test_matmul_batched_grads(dev):
    rng = np.random.default_rng(11)
    a = rng.standard_normal((2, 1, 3, 4)).astype(np.float32)
    b = rng.standard_normal((5, 4, 2)).astype(np.float32)

    def f(a, b):
        return rt.tanh(a @ b).sum()

    ga, gb = rt.grad(f, argnums=(0, 1))(rt.array(a, device=dev), rt.array(b, device=dev))
    np.testing.assert_allclose(ga.numpy(), numeric_grad(lambda x: np.tanh(x @ b).sum(), a), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(gb.numpy(), numeric_grad(lambda x: np.tanh(a @ x).sum(), b), rtol=2e-3, atol=2e-3)


def test_matrix_vector_and_logistic_loss(dev):
    rng = np.random.default_rng(12)
    X = rng.standard_normal((20, 5)).astype(np.float32)
    y = (rng.random(20) > 0.5).astype(np.float32)
    w = rng.standard_normal(5).astype(np.float32)
    Xr, yr = rt.array(X, device=dev), rt.array(y, device=dev)

    def loss(w):
        p = rt.sigmoid(Xr @ w)
        return -(yr * rt.log(p) + (1 - yr) * rt.log(1 - p)).mean()

    def ref(w):
        p = sig(X.astype(np.float64) @ w)
        return -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()

    g = rt.grad(loss)(rt.array(w, device=dev))
    np.testing.assert_allclose(g.numpy(), numeric_grad(ref, w), rtol=1e-3, atol=1e-4)


def test_gradient_graph_is_lazy(dev):
    x = rt.array(np.ones(3, np.float32), device=dev)
    g = rt.grad(lambda x: (x * x).sum())(x)
    assert not g.is_evaluated
    np.testing.assert_allclose(g.numpy(), 2 * np.ones(3))


def test_unused_argument_gets_zeros_and_errors(dev):
    x = rt.array(np.ones(3, np.float32), device=dev)
    y = rt.array(np.ones(2, np.float32), device=dev)
    gx, gy = rt.grad(lambda x, y: (x * 2).sum(), argnums=(0, 1))(x, y)
    np.testing.assert_array_equal(gy.numpy(), np.zeros(2))
    np.testing.assert_array_equal(gx.numpy(), np.full(3, 2.0))
    with pytest.raises(hal.InvalidArgumentError):
        rt.grad(lambda x: x * 2)(x)


def test_grad_refuses_bad_functions_and_argnums_with_typed_errors(dev):
    x = rt.array(np.arange(3, dtype=np.float32), device=dev)
    f = lambda a, b=None: (a * a).sum()  # noqa: E731
    for fn in (5, None, "f"):
        with pytest.raises(rt.InvalidTypeError):
            rt.grad(fn)
    for argnums in (1.5, "a", None, [0, 1.5], object(), True, (False,), [0, np.bool_(True)]):
        with pytest.raises(rt.InvalidTypeError):
            rt.value_and_grad(f, argnums=argnums)
    for argnums in (1, -2, (0, 3)):
        with pytest.raises(rt.InvalidValueError):
            rt.grad(f, argnums=argnums)(x)
    # An argument named twice gave zeros for its first gradient (the second alias hid the first).
    g = lambda a, b: (a * 2).sum() + (b * 3).sum()  # noqa: E731
    for argnums in ((0, 0), (1, -1), [0, -2, 1]):
        with pytest.raises(rt.InvalidValueError, match="twice"):
            rt.grad(g, argnums=argnums)(x, x)
    np.testing.assert_allclose(rt.grad(f, argnums=np.int64(0))(x).numpy(), 2 * np.arange(3))
    np.testing.assert_allclose(rt.grad(f, argnums=-1)(x).numpy(), 2 * np.arange(3))


def test_random_seeds_are_integers(dev):
    for seed in (1.5, "3", None, object(), (1,)):
        with pytest.raises(rt.InvalidTypeError):
            rt.random.key(seed, device=dev)
        with pytest.raises(rt.InvalidTypeError):
            rt.random.seed(seed)
    a = rt.random.uniform((4,), key=rt.random.key(np.int64(7), device=dev)).numpy()
    b = rt.random.uniform((4,), key=rt.random.key(7, device=dev)).numpy()
    np.testing.assert_array_equal(a, b)


def test_grad_over_trees_of_parameters(dev):
    """A model's parameters as a dict, a namedtuple or a list of arrays: the gradient is the same
    tree (None where the tree held no array), eagerly and under rt.compile. A dict was refused, a
    namedtuple stacked into one array (its fields then missing), a list of arrays stacked."""
    import collections

    Layer = collections.namedtuple("Layer", "w b")
    rng = np.random.default_rng(0)
    hw, hb, hx = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4,), (5, 3)))
    w, b, x = (rt.array(a, device=dev) for a in (hw, hb, hx))

    def loss(params, inputs):
        layer = params["layer"]
        return ((inputs @ layer.w + layer.b) ** 2).sum() * params["scale"][0]

    def np_loss(hw_, hb_):
        return float(((hx.astype(np.float64) @ hw_ + hb_) ** 2).sum() * 0.5)

    params = {"layer": Layer(w, b), "scale": [rt.array(np.float32(0.5), device=dev), "a label"], "steps": 3}
    want_w = numeric_grad(lambda v: np_loss(v, hb), hw)
    want_b = numeric_grad(lambda v: np_loss(hw, v), hb)
    for grad_fn in (rt.grad(loss), rt.compile(rt.grad(loss))):
        for _ in range(2):  # (compiled: traced, then replayed)
            g = grad_fn(params, x)
            assert set(g) == {"layer", "scale", "steps"} and type(g["layer"]) is Layer
            np.testing.assert_allclose(g["layer"].w.numpy(), want_w, rtol=1e-3, atol=1e-3)
            np.testing.assert_allclose(g["layer"].b.numpy(), want_b, rtol=1e-3, atol=1e-3)
            assert g["scale"][1] is None and g["steps"] is None
            np.testing.assert_allclose(float(g["scale"][0]), np_loss(hw, hb) * 2, rtol=1e-4)
    value, (gp, gx) = rt.value_and_grad(loss, argnums=(0, 1))(params, x)
    assert float(value) == pytest.approx(np_loss(hw, hb), rel=1e-4)
    assert gx.shape == x.shape and type(gp["layer"]) is Layer
    grads = rt.grad(lambda ps: (ps[0] * ps[1]).sum())([w, w])  # a list of arrays: one gradient each
    assert isinstance(grads, list) and len(grads) == 2
    np.testing.assert_allclose(grads[0].numpy(), hw)
    np.testing.assert_allclose(rt.grad(lambda p: (p ** 2).sum())([1.0, 2.0]).numpy(), [2.0, 4.0])  # numbers: one array
    with pytest.raises(rt.InvalidTypeError, match="no runtime array"):
        rt.grad(lambda p: x.sum())({"lr": 0.1})
    with pytest.raises(rt.InvalidTypeError, match="int64"):
        rt.grad(lambda p: p["n"].sum())({"n": rt.array(np.arange(3), device=dev)})


def test_functions_computed_on_the_host_refuse_to_be_differentiated(dev):
    """The unique functions (selections found by comparing values) and x.at[array indices]'s
    multiply/min/max (computed on the host): inside a differentiated function they raise a typed
    error where they gave a zero gradient silently; outside, they work as before."""
    x = rt.array(np.array([1.0, 2.0, 2.0], np.float32), device=dev)
    for fn in (lambda a: rt.unique_values(a).sum(), lambda a: rt.unique_counts(a).values.sum(),
               lambda a: a.at[rt.asarray([0, 0])].multiply(2.0).sum()):
        with pytest.raises(hal.UnimplementedError, match="no gradient"):
            rt.grad(fn)(x)
    np.testing.assert_array_equal(rt.unique_values(x).numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(x.at[rt.asarray([0, 0])].multiply(2.0).numpy(), [4.0, 2.0, 2.0])
    np.testing.assert_array_equal(rt.grad(lambda a: (a * 2).sum())(x).numpy(), [2.0, 2.0, 2.0])  # (still usable)


def test_at_set_with_array_indices_runs_on_the_device_and_is_differentiable(dev):
    """x.at[indices].set(v): numpy's indexed assignment (where indices repeat, the last value stays)
    for every kind of key; the gradient reaches x where it was not overwritten and v where its value
    stayed; an index computed on the device that is out of range raises IndexError when read."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    X = rt.array(x, device=dev)
    keys = [(np.array([0, 2, 0]), rng.standard_normal((3, 3))), (np.array([[1, 1], [4, 0]]), 1.5),
            ((np.array([0, 0, 4]), np.array([2, 2, 1])), np.array([1.0, 2.0, 3.0])),
            ((slice(None), np.array([2, 2])), np.arange(10.0).reshape(5, 2)), (x > 0.5, -1.0),
            ((np.array([-1, -5]),), 4.0), ((1, np.array([0, 0, 2])), np.array([7.0, 8.0, 9.0]))]
    for key, value in keys:
        want = x.copy()
        want[key] = np.asarray(value, np.float32)
        for on_device in (False, True):
            k = tuple(rt.asarray(i, device=dev) if on_device and isinstance(i, np.ndarray) else i
                      for i in (key if isinstance(key, tuple) else (key,)))
            v = rt.asarray(value, device=dev) if isinstance(value, np.ndarray) else value
            np.testing.assert_array_equal(X.at[k].set(v).numpy(), want, err_msg=str(key))
    w = rng.standard_normal((5, 3)).astype(np.float32)
    W = rt.asarray(w, device=dev)
    ids = rt.asarray(np.array([0, 2, 0]), device=dev)  # row 0 set twice: the second value stays
    vals = rt.array(rng.standard_normal((3, 3)).astype(np.float32), device=dev)
    gx, gv = rt.grad(lambda a, v: (a.at[ids].set(v) * W).sum(), argnums=(0, 1))(X, vals)
    np.testing.assert_array_equal(gx.numpy(), w * np.array([0, 1, 0, 1, 1], np.float32)[:, None])
    np.testing.assert_array_equal(gv.numpy(), np.stack([np.zeros(3, np.float32), w[2], w[0]]))
    with pytest.raises(IndexError):
        X.at[rt.asarray(np.array([1, 7]), device=dev)].set(0.0).numpy()
    np.testing.assert_array_equal(X.at[rt.asarray(np.array([1]), device=dev)].set(0.0).numpy()[1], 0.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64", "complex64"])
def test_gather_gradients_add_up_repeated_indices(dev, dtype):
    """An embedding lookup's gradient: each row's cotangents summed over every time it was read."""
    rng = np.random.default_rng(3)
    table = rng.standard_normal((6, 3))
    ids = np.array([4, 1, 4, 4, 0])
    weights = rng.standard_normal((5, 3))
    want = np.zeros((6, 3))
    np.add.at(want, ids, weights)
    x = rt.astype(rt.array(table, device=dev), getattr(rt, dtype))
    w = rt.array(weights, device=dev)
    g = rt.grad(lambda t: (rt.real(t[rt.asarray(ids)]).astype(rt.float64) * w).sum())(x)
    assert g.dtype == getattr(rt, dtype)
    tol = {"float16": 1e-2, "bfloat16": 5e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(np.asarray(rt.real(g).astype(rt.float64).numpy()), want, rtol=tol, atol=tol)


def test_prod_gradient_with_zero_factors(dev):
    """prod's gradient is the product of the other factors: one zero among them gives its neighbours'
    product (the rule g * prod / x gave 0 / 0, NaN), two zeros give zeros; second derivatives too."""
    x = rt.array(np.array([[0.0, 2.0, 3.0], [1.0, 2.0, 4.0], [0.0, 0.0, 5.0]], np.float32), device=dev)
    np.testing.assert_array_equal(rt.grad(lambda a: rt.prod(a, axis=1).sum())(x).numpy(),
                                  [[6, 0, 0], [8, 4, 2], [0, 0, 0]])
    np.testing.assert_array_equal(rt.grad(lambda a: rt.prod(a, axis=0).sum())(x).numpy(),
                                  [[0, 0, 20], [0, 0, 15], [0, 4, 12]])
    y = rt.array(np.array([1.0, 2.0, 3.0], np.float32), device=dev)
    np.testing.assert_array_equal(rt.grad(lambda a: rt.grad(lambda b: rt.prod(b))(a).sum())(y).numpy(), [5, 4, 3])


def test_only_the_differentiating_thread_keeps_evaluated_graphs(dev):
    """While one thread runs a differentiated function, another thread's evals free their inputs as
    ever: its loops keep no chain of past values (and its gradient inside stays right)."""
    inside, release = threading.Event(), threading.Event()
    result = {}

    def differentiated(a):
        y = a * 3
        rt.eval(y)
        inside.set()
        release.wait(10)
        return (y * y).sum()

    def worker():
        result["grad"] = rt.grad(differentiated)(rt.array(np.array([1.0, 2.0], np.float32), device=dev)).numpy()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert inside.wait(10)
        x = rt.array(np.ones(4, np.float32), device=dev)
        middle = x * 2
        last = middle + 1
        rt.eval(last)
        gone = weakref.ref(middle)
        del middle
        assert gone() is None  # the evaluated array no longer holds what it was computed from
        np.testing.assert_array_equal(last.numpy(), 3.0)
    finally:
        release.set()
        thread.join(10)
    np.testing.assert_array_equal(result["grad"], [18.0, 36.0])


def test_at_add_with_array_indices_scatters_on_the_device_and_is_differentiable(dev):
    """x.at[indices].add(v): numpy's add.at (repeated indices add up) for every kind of key, its
    gradient (1 for x, the cotangent gathered back for v), and an index computed on the device that is
    out of range raises IndexError when the result is read (the device stays usable)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    X = rt.array(x, device=dev)
    keys = [(np.array([0, 2, 0]), 1.5), (np.array([[1, 1], [4, 0]]), rng.standard_normal((2, 2, 3))),
            ((np.array([0, 0, 4]), np.array([2, 2, 1])), np.array([1.0, 2.0, 3.0])),
            ((slice(None), np.array([2, 2])), 5.0), (x > 0.5, 10.0), ((Ellipsis, np.array([0, 0])), 2.0),
            ((np.array([-1, -5]),), 1.0), ((1, np.array([0, 0, 2])), 7.0), ((slice(1, 3), np.array([0, 0])), 3.0)]
    for key, value in keys:
        want = x.copy()
        np.add.at(want, key, np.asarray(value, np.float32))
        for on_device in (False, True):
            k = tuple(rt.asarray(i, device=dev) if on_device and isinstance(i, np.ndarray) else i
                      for i in (key if isinstance(key, tuple) else (key,)))
            v = rt.asarray(value, device=dev) if isinstance(value, np.ndarray) else value
            np.testing.assert_allclose(X.at[k].add(v).numpy(), want, rtol=1e-6, atol=1e-6, err_msg=str(key))
    ids = rt.asarray(np.array([0, 2, 0, 4]), device=dev)
    w = rng.standard_normal((5, 3)).astype(np.float32)
    vals = rt.array(rng.standard_normal((4, 3)).astype(np.float32), device=dev)
    gx, gv = rt.grad(lambda a, v: (a.at[ids].add(v) * rt.asarray(w, device=dev)).sum(), argnums=(0, 1))(X, vals)
    np.testing.assert_allclose(gx.numpy(), w)
    np.testing.assert_allclose(gv.numpy(), w[[0, 2, 0, 4]])
    histogram = rt.zeros(6, dtype=rt.float32, device=dev).at[rt.asarray(np.array([1, 1, 5, 1]), device=dev)].add(1.0)
    np.testing.assert_array_equal(histogram.numpy(), [0, 3, 0, 0, 0, 1])
    with pytest.raises(IndexError):
        X.at[rt.asarray(np.array([1, 7]), device=dev)].add(1.0).numpy()
    np.testing.assert_allclose(X.at[rt.asarray(np.array([1]), device=dev)].add(1.0).numpy()[1], x[1] + 1)
