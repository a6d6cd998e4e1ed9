"""rt.compile: trace once per signature, then rebind and replay without building the graph."""

from __future__ import annotations

import numpy as np
import pytest

import hal
import runtime as rt
from runtime import ops


def loss_fn(w, X, y):
    p = rt.sigmoid(X @ w)
    return -(y * rt.log(p) + (1 - y) * rt.log(1 - p)).mean()


def sgd_step(w, X, y):
    loss, g = rt.value_and_grad(loss_fn)(w, X, y)
    return w - 0.5 * g, loss


def test_compiled_step_matches_eager_and_traces_once(dev, monkeypatch):
    rng = np.random.default_rng(0)
    X = rt.array(rng.standard_normal((64, 8)).astype(np.float32), device=dev)
    y = rt.array((rng.random(64) > 0.5).astype(np.float32), device=dev)
    step = rt.compile(sgd_step)
    w_eager = rt.zeros((8,), device=dev)
    eager = []
    for _ in range(5):
        w_eager, l_eager = sgd_step(w_eager, X, y)
        eager.append((w_eager.numpy().copy(), float(l_eager)))
    w_comp = rt.zeros((8,), device=dev)
    for i in range(5):
        w_comp, l_comp = step(w_comp, X, y)
        np.testing.assert_allclose(w_comp.numpy(), eager[i][0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(l_comp), eager[i][1], rtol=1e-5)
        if i == 0:
            # Later calls must not build any graph node in Python.
            def no_graph(*args, **kwargs):
                raise AssertionError("graph building after the first call")
            monkeypatch.setattr(ops, "new_node", no_graph)
    assert step.stats == {"traces": 1, "calls": 5}


def test_new_signature_retraces(dev):
    f = rt.compile(lambda a, b: (a * b).sum(axis=0))
    for shape in [(3, 2), (3, 2), (4, 5), (3, 2)]:
        a = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        out = f(rt.array(a, device=dev), rt.array(a + 1, device=dev))
        np.testing.assert_allclose(out.numpy(), (a * (a + 1)).sum(axis=0))
    assert f.stats["traces"] == 2
    out = f(rt.array(np.ones((3, 2), np.int32), device=dev), rt.array(np.ones((3, 2), np.int32), device=dev))
    assert out.dtype is rt.int64 and f.stats["traces"] == 3


def test_outputs_views_inputs_and_captured_arrays(dev):
    captured = rt.array(np.array([1.0, 2.0, 3.0], np.float32), device=dev)

    @rt.compile
    def f(a, scale):
        b = a * captured
        return {"t": b.reshape(3, 1).T, "a": a, "s": [b[::-1], (b * scale).sum()]}

    for k in range(3):
        a = np.arange(3, dtype=np.float32) + k
        out = f(rt.array(a, device=dev), rt.array(np.float32(k), device=dev))
        b = a * np.array([1, 2, 3], np.float32)
        np.testing.assert_allclose(out["t"].numpy(), b.reshape(3, 1).T)
        np.testing.assert_allclose(out["a"].numpy(), a)
        np.testing.assert_allclose(out["s"][0].numpy(), b[::-1])
        np.testing.assert_allclose(float(out["s"][1]), (b * k).sum())
    assert f.stats["traces"] == 1


def test_outputs_of_successive_calls_are_independent(dev):
    f = rt.compile(lambda a: a + 1)
    x = rt.array(np.zeros(4, np.float32), device=dev)
    outs = [f(x)]
    for _ in range(3):
        outs.append(f(outs[-1]))
    for k, o in enumerate(outs):
        np.testing.assert_allclose(o.numpy(), np.full(4, k + 1.0))


def test_lazy_and_view_arguments(dev):
    f = rt.compile(lambda a: a * 2)
    x = rt.array(np.arange(6, dtype=np.float32).reshape(2, 3), device=dev)
    np.testing.assert_allclose(f(x + 1).numpy(), (np.arange(6).reshape(2, 3) + 1) * 2)
    np.testing.assert_allclose(f(x.T).numpy(), np.arange(6).reshape(2, 3).T * 2)


def test_compile_needs_an_array(dev):
    with pytest.raises(hal.InvalidArgumentError):
        rt.compile(lambda: rt.zeros((2,)))()


def test_functions_returning_arguments_or_constants_only(dev):
    f = rt.compile(lambda a: (a, rt.full((2,), 3.0, device=dev)))
    x = rt.array(np.ones(2, np.float32), device=dev)
    for _ in range(2):
        a, c = f(x)
        assert a is x
        np.testing.assert_array_equal(c.numpy(), np.full(2, 3.0))
    g = rt.compile(lambda a: a)
    assert g(x) is x


def test_binding_table_holds_only_inputs_and_outputs(dev, monkeypatch):
    """Internal values live in buffers the recording owns: tables hold arguments and results only."""
    from runtime.device import context_for
    ctx = context_for(dev)
    tables = []
    real = ctx.device.prepare

    def spy(cbs, binding_tables=None, **kwargs):
        tables.append(binding_tables)
        return real(cbs, binding_tables, **kwargs)

    monkeypatch.setattr(ctx.device, "prepare", spy)
    f = rt.compile(lambda a, b: rt.tanh(a * b + 1.0).sum())
    x = rt.array(np.ones(4, np.float32), device=dev)
    for _ in range(2):
        out = f(x, x)
    np.testing.assert_allclose(float(out), 4 * np.tanh(2.0), rtol=1e-6)
    # the two arguments, the captured constant 1.0 and the result; none of the 3 intermediates
    assert len(tables[-1][0]) == 4


def _logistic_numpy(w, X, y):
    """Loss and analytic gradient of the mean logistic loss (float64 reference)."""
    z = X.astype(np.float64) @ w.astype(np.float64)
    p = 1 / (1 + np.exp(-z))
    loss = -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()
    return loss, X.T @ (p - y) / len(y)


def test_gradients_flow_through_a_compiled_function(dev):
    rng = np.random.default_rng(3)
    X_np = rng.standard_normal((32, 5)).astype(np.float32)
    y_np = (rng.random(32) > 0.5).astype(np.float32)
    w_np = rng.standard_normal(5).astype(np.float32)
    X, y = rt.array(X_np, device=dev), rt.array(y_np, device=dev)
    compiled_loss = rt.compile(loss_fn)
    w = rt.array(w_np, device=dev)
    ref_loss, ref_grad = _logistic_numpy(w_np, X_np, y_np)
    np.testing.assert_allclose(float(compiled_loss(w, X, y)), ref_loss, rtol=1e-5)
    for _ in range(2):  # also once the signature has a recording
        loss, g = rt.value_and_grad(compiled_loss)(w, X, y)
        np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
        np.testing.assert_allclose(g.numpy(), ref_grad, rtol=1e-4, atol=1e-6)
    # with respect to a later argument, and through an array computed from the differentiated one
    gy = rt.grad(compiled_loss, argnums=2)(w, X, y).numpy()
    z = X_np.astype(np.float64) @ w_np
    np.testing.assert_allclose(gy, -z / len(y_np), rtol=1e-4, atol=1e-6)
    g2 = rt.grad(lambda v: compiled_loss(v * 2.0, X, y))(w).numpy()
    np.testing.assert_allclose(g2, 2 * _logistic_numpy(2 * w_np, X_np, y_np)[1], rtol=1e-4, atol=1e-6)
    # a compiled training step whose gradient comes from a compiled loss
    step = rt.compile(lambda w, X, y: w - 0.5 * rt.grad(compiled_loss)(w, X, y))
    w_run, w_ref = w, w_np.astype(np.float64)
    for _ in range(3):
        w_run = step(w_run, X, y)
        w_ref = w_ref - 0.5 * _logistic_numpy(w_ref, X_np, y_np)[1]
    np.testing.assert_allclose(w_run.numpy(), w_ref, rtol=1e-4, atol=1e-5)
    assert step.stats["traces"] == 1


def test_compiled_function_called_inside_another_trace(dev):
    inner = rt.compile(lambda a, b: a * b + 1.0)
    outer = rt.compile(lambda a, b: inner(a, b).sum() * 2.0)
    a_np = np.arange(6, dtype=np.float32)
    a, b = rt.array(a_np, device=dev), rt.array(a_np[::-1].copy(), device=dev)
    for _ in range(2):
        np.testing.assert_allclose(float(outer(a, b)), float((a_np * a_np[::-1] + 1).sum() * 2), rtol=1e-6)
    assert outer.stats["traces"] == 1


def test_cpu_replay_reuses_its_views(dev, monkeypatch):
    """On CPU drivers a replay with an unchanged binding table makes no byte view and runs the
    kernels bound once (values still follow the buffers' contents)."""
    from runtime.device import context_for

    if context_for(dev).is_gpu:
        pytest.skip("CPU drivers only")
    from hal.drivers.local import command_buffer

    rng = np.random.default_rng(5)
    X_np = rng.standard_normal((40, 6)).astype(np.float32)
    y_np = (rng.random(40) > 0.5).astype(np.float32)
    X, y = rt.array(X_np, device=dev), rt.array(y_np, device=dev)
    step = rt.compile(sgd_step)
    w = rt.zeros((6,), device=dev)
    w_ref = np.zeros(6)
    made = []
    real = command_buffer._bytes
    for i in range(8):
        if i == 4:  # both recordings (one per buffer of w) have run twice with their tables
            monkeypatch.setattr(command_buffer, "_bytes", lambda *a: made.append(a) or real(*a))
        w, loss = step(w, X, y)
        ref_loss, g = _logistic_numpy(w_ref, X_np, y_np)
        w_ref = w_ref - 0.5 * g
        np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5)
        np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-4, atol=1e-6)
    assert made == []  # (w's contents changed every step under the same two buffers)
    X2 = rt.array(X_np * 2, device=dev)  # another buffer: a new table, views made afresh
    w2, _ = step(rt.zeros((6,), device=dev), X2, y)
    np.testing.assert_allclose(w2.numpy(), -0.5 * _logistic_numpy(np.zeros(6), X_np * 2, y_np)[1], rtol=1e-4, atol=1e-6)


def test_replayed_kernels_follow_changing_contents(dev):
    """Replays bound once to their buffers (CPU drivers) read what the buffers hold at each call:
    where with scalar and array branches, comparisons, reductions and products in a loop."""
    rng = np.random.default_rng(9)
    m_np = rng.standard_normal((7, 5)).astype(np.float32)
    M = rt.array(m_np, device=dev)

    def f(v, M):
        u = rt.where(v > 0, v * 0.5, -v) + rt.where(v < -0.5, 1.0, v)
        return rt.tanh(M @ (M.T @ u) * 0.1) + u.mean(), (u * u).sum()

    step = rt.compile(f)
    v = rt.array(rng.standard_normal(7).astype(np.float32), device=dev)
    v_np = v.numpy().astype(np.float64)
    for _ in range(6):
        v, s = step(v, M)
        u = np.where(v_np > 0, v_np * 0.5, -v_np) + np.where(v_np < -0.5, 1.0, v_np)
        v_np = np.tanh(m_np @ (m_np.T @ u) * 0.1) + u.mean()
        np.testing.assert_allclose(v.numpy(), v_np, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(float(s), (u * u).sum(), rtol=1e-4)
    assert step.stats["traces"] == 1


def test_unhashable_non_array_arguments_are_rejected(dev):
    f = rt.compile(lambda a, b: a * 2.0)
    x = rt.array(np.ones(3, np.float32), device=dev)
    with pytest.raises(hal.InvalidArgumentError, match="hashable"):
        f(x, np.ones(3, np.float32))
    with pytest.raises(hal.InvalidArgumentError, match="hashable"):
        f(x, [np.ones(2)])
    # hashable constants are part of the signature: one trace per value
    g = rt.compile(lambda a, k: a * k)
    for k in (2.0, 3.0, 2.0):
        np.testing.assert_allclose(g(x, k).numpy(), np.full(3, k))
    assert g.stats["traces"] == 2
    np.testing.assert_allclose(f(x, 1).numpy(), np.full(3, 2.0))  # the device stays usable


def test_a_view_of_a_gradient_inside_a_compiled_function(dev):
    """A gradient's reshape or slice made while tracing, before the trace builds the backward graph."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    W = rt.array(w, device=dev)
    flat = rt.compile(lambda w: rt.reshape(rt.grad(lambda v: (v * v).sum())(w), (-1,)) * 2)
    mixed = rt.compile(lambda w: rt.grad(lambda v: (v * v).sum())(w.T).T[0]
                       + rt.grad(lambda v: (v * v * v).sum())(w)[:, 1].sum())
    for _ in range(2):  # traced, then replayed
        np.testing.assert_array_equal(flat(W).numpy(), 4 * w.ravel())
        np.testing.assert_allclose(mixed(W).numpy(), 2 * w[0] + (3 * w ** 2)[:, 1].sum())


def test_namedtuples_in_and_out_and_results_that_would_leak_placeholders(dev):
    """A namedtuple argument reached the function as a plain tuple (its fields missing) and a
    namedtuple result came back as one; a result holding arrays in a set or an object, or a
    generator, handed out the trace's placeholders (unusable arrays) at every call."""
    import collections
    import dataclasses

    Pair = collections.namedtuple("Pair", "u v")
    x = rt.array(np.arange(6, dtype=np.float32), device=dev)
    swap = rt.compile(lambda p: Pair(p.v * 2, p.u + 1))
    for k in range(3):
        out = swap(Pair(x, x * k))
        assert type(out) is Pair
        np.testing.assert_allclose(out.u.numpy(), np.arange(6) * k * 2)
        np.testing.assert_allclose(out.v.numpy(), np.arange(6) + 1)
    assert swap.stats["traces"] == 1

    @dataclasses.dataclass
    class Box:
        value: object

    for result in (lambda a: {a}, lambda a: (a, frozenset([a * 2])), lambda a: (v for v in [a]),
                   lambda a: map(abs, [a]), lambda a: [Box(a)]):
        with pytest.raises(rt.InvalidTypeError, match="rt.compile"):
            rt.compile(result)(x)
    assert rt.compile(lambda a: (a * 1, {1, 2}))(x)[1] == {1, 2}  # no array in it: kept
    for not_a_function in (3, "f", None):
        with pytest.raises(rt.InvalidTypeError, match="takes a function"):
            rt.compile(not_a_function)
