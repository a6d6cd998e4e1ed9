"""The backward graph is built simplified: constants folded on the host, double negations
cancelled, comparison masks shared. Values against numpy's analytic gradients."""

from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import autodiff
from runtime.lowering.key import collect


def backward_nodes(fn, *args):
    """(the gradient of fn at args[0], the pending nodes of its backward graph)."""
    _, g = rt.value_and_grad(fn)(*args)
    result = autodiff.expand([g])[id(g)]
    return result, [n for n in collect([result.root]) if n.storage is None]


def constant_only(node) -> bool:
    """Whether every input of a node is an evaluated scalar or a view of one (no input data)."""
    return all(x.root.storage is not None and x.root.shape == () for x in node.inputs)


def signature(node) -> tuple:
    return node.op, node.params, node.shape, tuple((id(x.root), x.shape, x.strides, x.offset) for x in node.inputs)


def logistic_loss(w, X, y):
    z = X @ w
    return (rt.maximum(z, 0.0) + rt.log(1.0 + rt.exp(-abs(z))) - y * z).mean()


def test_logistic_gradient_graph_has_no_constant_kernels_duplicates_or_double_negations(dev):
    rng = np.random.default_rng(0)
    X_np = rng.standard_normal((64, 5)).astype(np.float32)
    y_np = (rng.random(64) < 0.5).astype(np.float32)
    w_np = rng.standard_normal(5).astype(np.float32)
    X, y, w = (rt.array(a, device=dev) for a in (X_np, y_np, w_np))
    g, nodes = backward_nodes(logistic_loss, w, X, y)
    assert not [n.op for n in nodes if constant_only(n)]  # 1/n and -1/n are host constants
    signatures = [signature(n) for n in nodes]
    assert len(signatures) == len(set(signatures))  # maximum's and abs's masks: one `z >= 0`
    assert not [n for n in nodes if n.op == "neg" and n.inputs[0].op == "neg"]
    z = (X_np @ w_np).astype(np.float64)
    want = X_np.T.astype(np.float64) @ (1 / (1 + np.exp(-z)) - y_np) / len(y_np)
    np.testing.assert_allclose(g.numpy(), want, rtol=2e-5, atol=1e-6)


def test_double_negation_of_a_cotangent_cancels(dev):
    x_np = np.array([-2.0, -0.5, 0.0, 0.25, 3.0], np.float32)
    x = rt.array(x_np, device=dev)
    g, nodes = backward_nodes(lambda x: rt.log(1.0 + rt.exp(-abs(x))).sum(), x)
    negations = [n for n in nodes if n.op == "neg"]
    assert not [n for n in negations if n.inputs[0].op == "neg"]
    e = np.exp(-np.abs(x_np.astype(np.float64)))
    want = np.where(x_np >= 0, -e / (1 + e), e / (1 + e))
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-6)


def test_mean_gradient_is_the_float32_quotient_bit_for_bit(dev):
    x = rt.array(np.ones((3, 7), np.float32), device=dev)
    g, nodes = backward_nodes(lambda x: x.mean(), x)
    assert nodes == []  # a broadcast constant: nothing to compute
    want = np.full((3, 7), np.float32(1) / np.float32(21), np.float32)
    assert g.numpy().tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_gradients_of_other_float_dtypes(dev, dtype):
    """float16 constants are computed by kernels (they round from float32 compute); float64 folds."""
    x_np = np.array([-1.5, -0.25, 0.5, 2.0], dtype)
    x = rt.array(x_np, device=dev)
    g = rt.grad(lambda x: rt.negative(-abs(x)).mean())(x)
    want = np.where(x_np >= 0, 1.0, -1.0) / 4
    assert g.numpy().dtype == dtype
    np.testing.assert_allclose(g.numpy().astype(np.float64), want, rtol=1e-3)


def test_negated_constant_cotangent_reaches_every_input(dev):
    """sub's second operand gets the negated constant: the gradients of a - b are 1 and -1."""
    a = rt.array(np.arange(4, dtype=np.float32), device=dev)
    b = rt.array(np.ones(4, np.float32), device=dev)
    ga, gb = rt.grad(lambda a, b: (a - b).sum(), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(ga.numpy(), np.ones(4, np.float32))
    np.testing.assert_array_equal(gb.numpy(), -np.ones(4, np.float32))


SOFTPLUS_FORMS = {
    "max + log(1 + e)": lambda x: rt.maximum(x, 0.0) + rt.log(1.0 + rt.exp(-abs(x))),
    "log(e + 1) + max": lambda x: rt.log(rt.exp(-abs(x)) + 1.0) + rt.maximum(0.0, x),
    "max + log1p(e)": lambda x: rt.maximum(x, 0.0) + rt.log1p(rt.exp(-abs(x))),
}


@pytest.mark.parametrize("form", sorted(SOFTPLUS_FORMS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softplus_written_out_differentiates_as_the_sigmoid_without_masks(dev, form, dtype):
    x_np = np.array([-90.0, -20.0, -2.0, -0.5, 0.0, 0.25, 3.0, 20.0, 90.0], dtype)
    y_np = np.linspace(-1, 1, x_np.size).astype(dtype)
    x, y = rt.array(x_np, device=dev), rt.array(y_np, device=dev)
    softplus = SOFTPLUS_FORMS[form]
    g, nodes = backward_nodes(lambda x, y: (softplus(x) * y).sum(), x, y)
    assert not [n.op for n in nodes if n.op in ("where", "ge", "le", "div")]
    want = y_np / (1 + np.exp(-x_np.astype(np.float64)))
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-30)
    loss, g2 = rt.value_and_grad(lambda x, y: (softplus(x) * y).sum())(x, y)
    np.testing.assert_allclose(g2.numpy(), want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-30)
    np.testing.assert_allclose(loss.numpy(), (np.logaddexp(x_np.astype(np.float64), 0) * y_np).sum(), rtol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda x: rt.maximum(x, 1.0) + rt.log(1.0 + rt.exp(-abs(x))),  # not maximum(x, 0)
    lambda x: rt.maximum(x, 0.0) + rt.log(2.0 + rt.exp(-abs(x))),  # not 1 + ...
    lambda x: rt.maximum(x, 0.0) + rt.log(1.0 + rt.exp(-abs(x * 2.0))),  # another operand of abs
])
def test_near_softplus_forms_keep_the_node_by_node_rules(dev, fn):
    x_np = np.array([-2.0, -0.5, 0.25, 3.0], np.float32)
    x = rt.array(x_np, device=dev)
    _, g = rt.value_and_grad(lambda x: fn(x).sum())(x)
    h = 1e-3
    xs = x_np.astype(np.float64)
    num = np.array([(fn(rt.array((xs + h * (np.arange(4) == i)).astype(np.float32), device=dev)).numpy().sum()
                     - fn(rt.array((xs - h * (np.arange(4) == i)).astype(np.float32), device=dev)).numpy().sum())
                    / (2 * h) for i in range(4)])
    np.testing.assert_allclose(g.numpy(), num, rtol=2e-2, atol=2e-2)


def test_a_recorded_backward_graph_replays_only_with_the_constants_it_was_built_for(dev):
    """maximum's and abs's masks are one `x >= 0` only when maximum's constant is 0; the graph key
    describes constants by dtype and shape, so the recording is guarded by the constants it read."""
    x_np = np.array([-2.0, -0.5, 0.5, 2.0], np.float32)
    x = rt.array(x_np, device=dev)
    for k in (0.0, 1.0, 1.5, 0.0, 1.75, 0.0, 2.5, 1.0):
        loss, g = rt.value_and_grad(lambda z, k=k: (rt.maximum(z, k) + abs(z)).sum())(x)
        rt.eval(loss, g)
        want = (x_np >= k).astype(np.float32) + np.where(x_np >= 0, 1, -1)
        np.testing.assert_array_equal(g.numpy(), want, err_msg=f"maximum(x, {k})")


def test_contributions_scaled_by_one_constant_share_one_product(dev):
    """A mean's gradient reaches every term of the loss as the same constant (negated through a
    subtraction): ``c * e + (-c) * y`` is built as ``c * (e - y)`` (the hand-written form), and
    ``c * a + c * b`` as ``c * (a + b)``."""
    rng = np.random.default_rng(3)
    x_np = rng.standard_normal(50).astype(np.float32)
    y_np = rng.standard_normal(50).astype(np.float32)
    x, y = rt.array(x_np, device=dev), rt.array(y_np, device=dev)
    cases = {
        "e - y": (lambda x, y: (rt.exp(x) - y * x).mean(), np.exp(x_np) / 50 - y_np / 50),
        "e + y": (lambda x, y: (rt.exp(x) + y * x).mean(), np.exp(x_np) / 50 + y_np / 50),
    }
    for name, (fn, want) in cases.items():
        g, nodes = backward_nodes(fn, x, y)
        products = [n for n in nodes if n.op == "mul"]
        assert len(products) == 1, name
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-6, atol=1e-7, err_msg=name)
        _, g2 = rt.value_and_grad(fn)(x, y)
        np.testing.assert_allclose(g2.numpy(), want, rtol=1e-6, atol=1e-7, err_msg=name)


def test_contributions_scaled_by_other_constants_stay_a_sum(dev):
    x_np = np.array([-1.0, 0.5, 2.0], np.float32)
    y_np = np.array([3.0, -2.0, 0.25], np.float32)
    x, y = rt.array(x_np, device=dev), rt.array(y_np, device=dev)
    g, nodes = backward_nodes(lambda x, y: rt.exp(x).mean() + (y * x).sum(), x, y)  # 1/3 and 1
    assert [n.op for n in nodes].count("mul") == 2 and "add" in [n.op for n in nodes]
    np.testing.assert_allclose(g.numpy(), np.exp(x_np) / 3 + y_np, rtol=1e-6)
