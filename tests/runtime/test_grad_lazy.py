"""Lazy gradient nodes: the backward graph is built only when an eval records a new graph."""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import failures_in_threads
from test_grad import CASES, DATA_SHAPED

import runtime as rt
from runtime import autodiff


@pytest.fixture
def rules(monkeypatch):
    """Counts the backward passes run by the gradient rules."""
    calls = []
    real = autodiff._backward
    monkeypatch.setattr(autodiff, "_backward", lambda out, wrt: calls.append(1) or real(out, wrt))
    return calls


@pytest.mark.parametrize("case", sorted(set(CASES) - DATA_SHAPED))
def test_repeated_steps_replay_without_running_the_rules(dev, case, rules):
    fn, _, shape, positive = CASES[case]
    rng = np.random.default_rng(len(case))
    counts = []
    for _ in range(6):
        x_np = rng.standard_normal(shape)
        if positive:
            x_np = np.abs(x_np) + 0.5
        x = rt.array(x_np.astype(np.float32), device=dev)
        got = rt.grad(fn)(x).numpy()
        want = rt.grad(fn)(x)
        autodiff.materialize([want])  # the same gradient as ordinary nodes the rules build now
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-7)
        counts.append(len(rules))
    # The first steps record (one recording per binding-table variant, up to CPU_VARIANTS: which
    # steps find a variant whose buffers they have depends on how the buffer cache hands out x's);
    # then the lazy gradients hit the graph cache and only the materialized reference runs the rules.
    assert counts[-1] - counts[-2] == 1


def test_steps_chained_without_evaluation(dev):
    """Several unevaluated steps: each gradient's backward graph reads the previous step's update."""
    X_np = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    X = rt.array(X_np, device=dev)
    vg = rt.value_and_grad(lambda w: rt.tanh(X @ w).sum())
    w = rt.array(np.ones(3, np.float32), device=dev)
    w_np = np.ones(3)
    for _ in range(3):
        _, g = vg(w)
        w = w - 0.1 * g
        t = np.tanh(X_np @ w_np)
        w_np = w_np - 0.1 * X_np.T @ (1 - t * t)
    np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-5, atol=1e-6)


def test_compiled_unrolled_steps(dev):
    X_np = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
    X = rt.array(X_np, device=dev)
    vg = rt.value_and_grad(lambda w: rt.tanh(X @ w).sum())

    @rt.compile
    def three_steps(w):
        for _ in range(3):
            _, g = vg(w)
            w = w - 0.1 * g
        return w

    w = rt.array(np.ones(3, np.float32), device=dev)
    w_np = np.ones(3)
    for _ in range(2):
        w = three_steps(w)
        for _ in range(3):
            t = np.tanh(X_np @ w_np)
            w_np = w_np - 0.1 * X_np.T @ (1 - t * t)
        np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-5, atol=1e-6)


def test_loss_evaluated_before_the_gradient(dev):
    rng = np.random.default_rng(3)
    x_np = rng.standard_normal(6).astype(np.float32)
    x = rt.array(x_np, device=dev)
    value, g = rt.value_and_grad(lambda v: (rt.tanh(v) * v).sum())(x)
    np.testing.assert_allclose(float(value), (np.tanh(x_np) * x_np).sum(), rtol=1e-5)
    t = np.tanh(x_np)
    np.testing.assert_allclose(g.numpy(), (1 - t * t) * x_np + t, rtol=1e-5, atol=1e-6)


def test_intermediate_evaluated_before_the_gradient(dev):
    x_np = np.linspace(-1, 1, 5, dtype=np.float32)
    x = rt.array(x_np, device=dev)
    keep = {}

    def f(v):
        keep["h"] = v * v
        return (keep["h"] * v).sum()

    _, g = rt.value_and_grad(f)(x)
    np.testing.assert_allclose(keep["h"].numpy(), x_np ** 2)  # evaluates part of the forward graph
    np.testing.assert_allclose(g.numpy(), 3 * x_np ** 2, rtol=1e-5, atol=1e-6)


def test_gradients_evaluated_one_at_a_time(dev):
    a_np, b_np = np.arange(1, 4, dtype=np.float32), np.arange(4, 7, dtype=np.float32)
    a, b = rt.array(a_np, device=dev), rt.array(b_np, device=dev)
    ga, gb = rt.grad(lambda a, b: (a * b * b).sum(), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(ga.numpy(), b_np ** 2)
    np.testing.assert_allclose(gb.numpy(), 2 * a_np * b_np)


def test_reads_around_the_argument_are_part_of_the_key(dev):
    """A closure reading the differentiated array itself is not differentiated through: two functions
    that compute the same value over the same buffers have different gradients and graphs."""
    w_np = np.array([1.0, 2.0, 3.0], np.float32)
    w = rt.array(w_np, device=dev)
    through_argument = rt.grad(lambda v: (v * v).sum())
    half_closure = rt.grad(lambda v: (v * w).sum())
    for _ in range(2):
        np.testing.assert_allclose(through_argument(w).numpy(), 2 * w_np)
        np.testing.assert_allclose(half_closure(w).numpy(), w_np)


def test_second_derivative(dev):
    x_np = np.array([0.5, -1.0, 2.0], np.float32)
    x = rt.array(x_np, device=dev)

    def f(v):
        return (v * v * v).sum()

    def df_sum(v):
        return rt.grad(f)(v).sum()

    np.testing.assert_allclose(rt.grad(df_sum)(x).numpy(), 6 * x_np, rtol=1e-6)


def test_structure_changes_get_their_own_graphs(dev):
    def loss(w, X):
        return rt.tanh(X @ w).sum()

    vg = rt.value_and_grad(loss)
    rng = np.random.default_rng(0)
    for rows in (3, 5, 3, 5, 7):
        X_np = rng.standard_normal((rows, 4)).astype(np.float32)
        w_np = rng.standard_normal(4).astype(np.float32)
        value, g = vg(rt.array(w_np, device=dev), rt.array(X_np, device=dev))
        t = np.tanh(X_np @ w_np)
        np.testing.assert_allclose(float(value), t.sum(), rtol=1e-5)
        np.testing.assert_allclose(g.numpy(), X_np.T @ (1 - t * t), rtol=1e-4, atol=1e-5)


def test_evaluating_the_loss_first_keeps_the_gradient_right(dev):
    """The loss's eval clears part of the forward graph its pending gradient differentiates: the
    gradient's backward graph is built first, and it still reads the right values."""
    X_np = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32)
    w_np = np.linspace(-1, 1, 4).astype(np.float32)
    loss, g = rt.value_and_grad(lambda w: (rt.array(X_np, device=dev) @ w).sum() ** 2)(rt.array(w_np, device=dev))
    s = float((X_np @ w_np).sum())
    np.testing.assert_allclose(loss.numpy(), s * s, rtol=1e-5)
    assert g.op != autodiff.GRAD  # (materialized by the loss's eval)
    np.testing.assert_allclose(g.numpy(), 2 * s * X_np.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_an_eval_leaves_the_pending_gradients_of_unrelated_graphs_alone(dev):
    """Only a gradient whose forward graph the eval touches is materialized: an eval of one graph
    (another device's, another thread's) never changes the graph of an unrelated one, so equal
    programs record equal graphs whatever runs beside them."""
    vg = rt.value_and_grad(lambda w: (w * w).sum())
    _, g_a = vg(rt.array(np.ones(3, np.float32), device=dev))
    loss_b, g_b = vg(rt.array(np.full(3, 2.0, np.float32), device=dev))
    np.testing.assert_allclose(g_a.numpy(), [2.0, 2.0, 2.0])
    assert g_b.op == autodiff.GRAD  # untouched by g_a's eval
    np.testing.assert_allclose(loss_b.numpy(), 12.0)
    assert g_b.op != autodiff.GRAD  # its own loss's eval built its backward graph
    np.testing.assert_allclose(g_b.numpy(), [4.0, 4.0, 4.0])


def test_threads_building_and_evaluating_gradients_at_once(dev):
    """Gradients handed out and evaluated from several threads at once: every result is right."""

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            w_np = rng.standard_normal(5).astype(np.float32)
            loss, g = rt.value_and_grad(lambda w: (rt.tanh(w) * w).sum())(rt.array(w_np, device=dev))
            if rng.random() < 0.5:
                loss.numpy()  # sometimes the loss first
            t = np.tanh(w_np)
            np.testing.assert_allclose(g.numpy(), t + w_np * (1 - t * t), rtol=1e-5, atol=1e-6)

    assert failures_in_threads(worker, 4, timeout=120) == []
