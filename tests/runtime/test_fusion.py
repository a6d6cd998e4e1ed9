"""Fused elementwise kernels on GPU lowering: fewer dispatches, the same values as numpy.

The GPU path runs on a local-sync device that claims to be a GPU, with every
kernel either the generated CUDA C compiled for the CPU (cuda_emu) or the
numpy implementation of the same fused kernel.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import runtime as rt
from runtime.device import context_for
from runtime.kernels import fused
from runtime.kernels.fused import FusedSpec, fused_source
from runtime.lowering import execute, fusion, key, record

cuda_emu = pytest.importorskip("cuda_emu")


@pytest.fixture(autouse=True)
def fuse_at_once(monkeypatch):
    """Fuse on a graph's first evaluation (by default fusion waits until a graph repeats)."""
    monkeypatch.setenv("RUNTIME_FUSE_AFTER", "1")




def test_chain_is_one_dispatch(gpu_like, recordings):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1001).astype(np.float32)
    b = rng.standard_normal(1001).astype(np.float32)
    A, B = rt.array(a, device=gpu_like), rt.array(b, device=gpu_like)
    y = rt.log(1.0 + rt.exp(-abs(A))) * B + rt.maximum(A, 0.0) - B * A
    np.testing.assert_allclose(y.numpy(), np.log1p(np.exp(-np.abs(a))) * b + np.maximum(a, 0) - b * a,
                               rtol=1e-5, atol=1e-6)
    rec = recordings[-1]
    assert rec.dispatches == 1 and rec.fused == 1
    assert len(rec.fresh) == 1, "only the result gets a buffer"


def test_a_long_chain_is_cut_into_kernels_of_at_most_max_ops(gpu_like, recordings, monkeypatch):
    """A fused kernel of every op of a long chain took NVRTC minutes (time superlinear in its ops:
    94 s for 400 `sin(x) + 1` steps): the chain is cut, and its alike segments share one kernel."""
    monkeypatch.setattr(fused, "MAX_OPS", 8)
    specs = []
    real = fused.fused_source

    def spy(spec):
        specs.append(spec)
        return real(spec)

    monkeypatch.setattr(fused, "fused_source", spy)
    a = np.linspace(-2, 2, 257, dtype=np.float32)
    x = rt.array(a, device=gpu_like)
    expected = a.copy()
    for _ in range(20):  # 40 ops
        x = rt.sin(x) + 1.0
        expected = (np.sin(expected) + np.float32(1.0)).astype(np.float32)
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-5, atol=1e-5)
    rec = recordings[-1]
    assert rec.fused == rec.dispatches == 5  # 40 ops, 8 a kernel
    assert specs and max(len(spec.members) for spec in specs) <= 8
    assert len({spec.key for spec in specs}) <= 3  # the first segment, the alike middle ones, the last


@pytest.mark.parametrize("n", [4096, 4099])  # vectors of 4 and, unaligned, 4 single elements a thread
def test_costly_chains_loop_over_a_capped_grid(gpu_like, monkeypatch, n):
    """A chain of two or more costly ops (roots, library math) runs at most LOOPING_GRID workgroups,
    each thread looping over several vectors; cheaper chains keep one vector a thread."""
    monkeypatch.setattr(fused, "LOOPING_GRID", 3)  # (16384 would need a larger array than a test's)
    groups = []

    def spy(*args):
        planned = fused.plan(*args)
        groups.append(planned[2][0])
        return planned

    monkeypatch.setattr(fusion, "plan_fused", spy)
    rt.clear_graph_cache()
    x = np.random.default_rng(n).uniform(-1, 1, n).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    cheap = (X * 1.5 + 0.5) * X - 0.25
    costly = rt.tanh(rt.sqrt(abs((X * 1.5 + 0.5) * X - 0.25)) + 1.0)  # (the workload benchmark's chain)
    want_cheap = (x * np.float32(1.5) + np.float32(0.5)) * x - np.float32(0.25)
    np.testing.assert_allclose(costly.numpy(), np.tanh(np.sqrt(np.abs(want_cheap)) + np.float32(1)), rtol=2e-6)
    np.testing.assert_allclose(cheap.numpy(), want_cheap, rtol=1e-6, atol=1e-7)
    threads = (n + 3) // 4
    assert groups == [3, (threads + 255) // 256]


def test_costly_ops_are_counted_per_member():
    f32 = rt.float32
    members = (("sqrt", f32, f32, (("i", 0),)), ("mul", f32, f32, (("m", 0), ("i", 1))),
               ("tanh", f32, f32, (("m", 1),)))
    spec = FusedSpec(((f32, "c"), (f32, "s")), members, (2,))
    assert spec.costly == 2
    assert fused.plan(spec, 1 << 26, [0, 0])[2] == (fused.LOOPING_GRID, 1, 1)
    cheap = FusedSpec(((f32, "c"),), (("mul", f32, f32, (("i", 0), ("i", 0))), ("exp", f32, f32, (("m", 0),))), (1,))
    assert cheap.costly == 1 and fused.plan(cheap, 1 << 26, [0])[2] == (1 << 16, 1, 1)


@pytest.mark.parametrize("n", [1, 7, 64])
def test_mixed_dtypes_where_compare_cast(gpu_like, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    i = rng.integers(-4, 5, n).astype(np.int32)
    A, K = rt.array(a, device=gpu_like), rt.array(i, device=gpu_like)
    mask = (A > 0) * (K != 0)  # bool * bool: logical and
    y = rt.where(mask, A * K, (K + 2).astype(rt.float32) / 3.0)
    want = np.where((a > 0) & (i != 0), a * i, (i + 2).astype(np.float32) / np.float32(3))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal((K * K - 3 > 0).numpy(), (i * i - 3) > 0)
    np.testing.assert_array_equal(((K * 2) ** 2 - K).numpy(), (i * 2) ** 2 - i)


def test_referenced_intermediates_are_materialized(gpu_like, recordings):
    x_np = np.arange(12, dtype=np.float32)
    x = rt.array(x_np, device=gpu_like)
    h = x * 3
    y = rt.exp(h * 0.1) + 1
    rt.eval(y)
    assert len(recordings[-1].fresh) == 2  # h is referenced: it leaves the fused kernel
    np.testing.assert_allclose(h.numpy(), x_np * 3)
    np.testing.assert_allclose(y.numpy(), np.exp(x_np * 0.3) + 1, rtol=1e-6)
    t = x * 5
    z = (t + 1) * 2
    del t
    gc.collect()
    rt.eval(z)
    assert len(recordings[-1].fresh) == 1  # nothing else holds t: it stays in registers
    np.testing.assert_allclose(z.numpy(), (x_np * 5 + 1) * 2)


def test_unevaluated_member_recomputes_when_read_later(gpu_like):
    """A member kept in registers keeps its inputs: evaluating it later computes it again."""
    x_np = np.linspace(-1, 1, 8, dtype=np.float32)
    x = rt.array(x_np, device=gpu_like)
    t = x * 2
    z = t + 1
    order = key.collect([z])
    direct = [0] * len(order)
    parts, externals, viewed = key.graph_key(order, direct)
    rec = record.record(context_for(gpu_like), order, externals, keep=1 << (len(order) - 1))
    ctx = context_for(gpu_like)
    table, value = execute.submit(ctx, rec, [r.storage.buffer for r in externals])
    execute.attach(ctx, rec, order, table, value)
    assert t.storage is None and t.op == "mul"
    np.testing.assert_allclose(z.numpy(), x_np * 2 + 1)
    np.testing.assert_allclose(t.numpy(), x_np * 2)


def test_training_step_fuses_to_few_dispatches(gpu_like, recordings):
    rng = np.random.default_rng(1)
    X_np = rng.standard_normal((64, 8)).astype(np.float32)
    y_np = (X_np @ rng.standard_normal(8) > 0).astype(np.float32)
    X, y = rt.array(X_np, device=gpu_like), rt.array(y_np, device=gpu_like)

    def loss_fn(w):
        z = X @ w
        return (rt.maximum(z, 0.0) + rt.log(1.0 + rt.exp(-abs(z))) - y * z).mean()

    vg = rt.value_and_grad(loss_fn)
    w = rt.array(np.zeros(8, np.float32), device=gpu_like)
    w_np = np.zeros(8, np.float64)
    for _ in range(3):
        loss, g = vg(w)
        w = w - 0.5 * g
        rt.eval(w, loss)
        p = 1 / (1 + np.exp(-(X_np @ w_np)))
        w_np = w_np - 0.5 * X_np.T @ (p - y_np) / len(y_np)
    np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-4, atol=1e-5)
    rec = recordings[-1]
    # matvec, the loss's elementwise terms and their mean with the backward's elementwise ops (one row
    # program), vecmat, fused update
    assert rec.dispatches <= 4 and rec.fused == 2 and rec.levels <= 4


def test_compiled_step_variants_replay_without_graph_building(gpu_like, monkeypatch):
    """On GPUs `w = step(w)` gets a recording per buffer of w; the second is recorded from the
    trace without running any op or gradient rule in Python."""
    from runtime import ops
    rng = np.random.default_rng(2)
    X_np = rng.standard_normal((16, 4)).astype(np.float32)
    X = rt.array(X_np, device=gpu_like)

    @rt.compile
    def step(w):
        loss, g = rt.value_and_grad(lambda v: (rt.tanh(X @ v) ** 2).mean())(w)
        return w - 0.5 * g, loss

    w = rt.array(np.full(4, 0.1, np.float32), device=gpu_like)
    w_np = np.full(4, 0.1)
    for i in range(4):
        w, _ = step(w)
        t = np.tanh(X_np @ w_np)
        w_np = w_np - 0.5 * X_np.T @ (2 * t * (1 - t * t)) / len(t)
        np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-4, atol=1e-6)
        if i == 0:
            def no_graph(*args, **kwargs):
                raise AssertionError("graph building after the first call")
            monkeypatch.setattr(ops, "new_node", no_graph)
    assert step.stats["traces"] == 1


def test_fused_spec_names_are_stable_and_distinct():
    f32 = rt.float32
    a = FusedSpec(((f32, "c"), (f32, "s")), (("add", f32, f32, (("i", 0), ("i", 1))),
                                            ("exp", f32, f32, (("m", 0),))), (1,))
    b = FusedSpec(((f32, "c"), (f32, "c")), (("add", f32, f32, (("i", 0), ("i", 1))),
                                            ("exp", f32, f32, (("m", 0),))), (1,))
    assert a.name != b.name and a.name == FusedSpec(a.inputs, a.members, a.outputs).name
    src = fused_source(a)
    assert src.exports[0].bindings == 3 and src.exports[0].constants == 3
    assert f"void {a.name}(" in src.cuda_source()


def test_fusion_switch(gpu_like, recordings, monkeypatch):
    monkeypatch.setattr(fusion, "ENABLED", False)
    x = rt.array(np.ones(5, np.float32), device=gpu_like)
    y = (x + 1) * 2 - 3
    np.testing.assert_allclose(y.numpy(), np.full(5, 1.0))
    assert recordings[-1].dispatches == 3 and recordings[-1].fused == 0


def _fused_loaded(ctx) -> int:
    return sum(1 for key in ctx.executables if isinstance(key, tuple) and key and key[0] == "fused")


def test_novel_graphs_run_on_library_kernels_and_repeated_ones_fuse(gpu_like, recordings, monkeypatch):
    """A graph seen once compiles no fused kernel; one evaluated again is recorded fused (once)."""
    monkeypatch.delenv("RUNTIME_FUSE_AFTER", raising=False)
    ctx = context_for(gpu_like)
    rng = np.random.default_rng(7)
    a_np = rng.standard_normal(257).astype(np.float32)
    a = rt.array(a_np, device=gpu_like)
    ops = [(lambda x, c: x * c, np.multiply), (lambda x, c: x + c, np.add), (lambda x, c: x - c, np.subtract),
           (lambda x, c: rt.maximum(x, c), np.maximum), (lambda x, c: x / (c + 3.0), lambda x, c: x / (c + 3))]
    before = _fused_loaded(ctx)
    for g in range(40):  # 40 distinct 12-op elementwise graphs
        pick = [(g + 1) // len(ops) ** k % len(ops) for k in range(12)]  # the digits of g + 1: all distinct
        y, want = a, a_np
        for k, p in enumerate(pick):
            c = float(k % 3 + 1)
            y, want = ops[p][0](y, c), ops[p][1](want, np.float32(c))
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    assert _fused_loaded(ctx) == before, "novel graphs must not compile fused kernels"
    assert all(r.fused == 0 for r in recordings)
    # The same graph again: the second evaluation records it fused, later ones replay that recording.
    recordings.clear()
    for _ in range(4):
        y = rt.exp(a * 0.5) * 2.0 - a + rt.maximum(a, 0.25)
        np.testing.assert_allclose(y.numpy(), np.exp(a_np * 0.5) * 2 - a_np + np.maximum(a_np, 0.25), rtol=1e-5)
    assert [r.fused for r in recordings] == [0, 1]
    assert recordings[0].deferred and not recordings[1].deferred
    assert _fused_loaded(ctx) == before + 1
