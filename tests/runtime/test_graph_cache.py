"""Graph cache: hits replay the recorded command buffer with new buffers; LRU eviction; the off switch."""

from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest
from rt_helpers import counting_prepares

import hal
import runtime as rt
from runtime import graph_cache
from runtime.device import MAX_IN_FLIGHT, SUBMIT_BATCH, context_for
from runtime.lowering import fusion, key


def model(x, w):
    return rt.tanh(x @ w + 1.0).sum(axis=0)


def test_second_eval_is_a_hit_with_new_data(dev):
    rng = np.random.default_rng(0)
    ctx = context_for(dev)
    ctx.graphs.clear()
    results = []
    for step in range(3):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        w = rng.standard_normal((4, 3)).astype(np.float32)
        before = ctx.graphs.stats()
        y = model(rt.array(x, device=dev), rt.array(w, device=dev))
        rt.eval(y)
        after = ctx.graphs.stats()
        if step == 0:
            assert after["misses"] == before["misses"] + 1
        else:
            assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"]
        np.testing.assert_allclose(y.numpy(), np.tanh(x @ w + 1.0).sum(axis=0), rtol=1e-5, atol=1e-5)
        results.append(y.numpy().copy())
    assert not np.allclose(results[0], results[1])
    stats = rt.graph_cache_stats()
    assert {"hits", "misses", "entries"} <= set(stats)


@pytest.mark.parametrize("cpu_program", ["0", "1"])
def test_recording_binds_only_slots(dev, monkeypatch, cpu_program):
    """The recorded command buffer refers to buffers only through hal.Slot, never directly."""
    monkeypatch.setenv("RUNTIME_CPU_PROGRAM", cpu_program)
    ctx = context_for(dev)
    ctx.graphs.clear()
    refs = []
    real = ctx.device.create_command_buffer

    def spy(*args, **kwargs):
        cb = real(*args, **kwargs)
        assert kwargs.get("mode") == hal.CommandBufferMode.REUSABLE
        orig_dispatch, orig_fill = cb.dispatch, cb.fill_buffer

        def dispatch(exe, name, workgroups=(1, 1, 1), constants=(), bindings=()):
            refs.extend(bindings)
            return orig_dispatch(exe, name, workgroups=workgroups, constants=constants, bindings=bindings)

        def fill_buffer(target, pattern, pattern_length):
            refs.append(target)
            return orig_fill(target, pattern=pattern, pattern_length=pattern_length)

        cb.dispatch, cb.fill_buffer = dispatch, fill_buffer
        return cb

    monkeypatch.setattr(ctx.device, "create_command_buffer", spy)
    x = rt.array(np.ones((4, 4), np.float32), device=dev)
    y = (x @ x.T + rt.zeros((4, 4), device=dev)).max(axis=1)
    np.testing.assert_allclose(y.numpy(), np.full(4, 4.0))
    assert refs and all(isinstance(r, hal.Slot) for r in refs)


def test_barriers_only_between_dependent_levels(dev, monkeypatch):
    monkeypatch.setenv("RUNTIME_CPU_PROGRAM", "0")  # one dispatch per kernel, as on GPUs
    monkeypatch.setattr(fusion, "ENABLED", False)  # on GPUs these ops would be one fused kernel
    ctx = context_for(dev)
    ctx.graphs.clear()
    barriers = []
    real = ctx.device.create_command_buffer

    def spy(*args, **kwargs):
        cb = real(*args, **kwargs)
        orig = cb.execution_barrier

        def barrier():
            barriers.append(1)
            return orig()

        cb.execution_barrier = barrier
        return cb

    monkeypatch.setattr(ctx.device, "create_command_buffer", spy)
    x = rt.array(np.arange(6, dtype=np.float32), device=dev)
    # Level 0: four independent ops on x. Level 1: two adds. Level 2: one add.
    a, b, c, d = x * 2, x + 1, rt.exp(x), -x
    out = (a + b) + (c + d)
    np.testing.assert_allclose(out.numpy(), np.arange(6) * 2 + np.arange(6) + 1 + np.exp(np.arange(6)) - np.arange(6),
                               rtol=1e-5)
    assert len(barriers) == 2


def test_eviction_by_entries_and_bytes(dev):
    ctx = context_for(dev)
    cache = ctx.graphs
    cache.clear()
    old_entries, old_bytes = cache.max_entries, cache.max_bytes
    try:
        cache.max_entries = 2
        x = rt.array(np.ones(5, np.float32), device=dev)
        for k in range(4):
            rt.eval(x + rt.full((5,), float(k + 10), device=dev))  # a fill value is baked in: distinct graphs
        assert len(cache) == 2 and cache.evictions >= 2
        # The most recent graph is still cached: a hit.
        hits = cache.hits
        y = x + rt.full((5,), 13.0, device=dev)
        np.testing.assert_allclose(y.numpy(), np.full(5, 14.0))
        assert cache.hits == hits + 1
        cache.max_entries = 100
        cache.max_bytes = 1
        rt.eval(x + rt.full((5,), 99.0, device=dev))
        assert len(cache) == 1
        # No room at all (RUNTIME_GRAPH_CACHE_ENTRIES=0): each evaluation still runs the recording it
        # made, which stays alone (it was dropped on insertion, and the evaluation failed).
        cache.max_entries = 0
        for k in range(3):
            np.testing.assert_allclose((x * float(k + 2) + rt.full((5,), float(k), device=dev)).numpy(),
                                       np.full(5, 2.0 + 2 * k))
            assert len(cache) == 1
    finally:
        cache.max_entries, cache.max_bytes = old_entries, old_bytes


def test_python_scalars_are_bound_not_baked(dev):
    """A scalar operand is a cached device constant bound through a slot: changing it still hits."""
    ctx = context_for(dev)
    ctx.graphs.clear()
    x = rt.array(np.ones(4, np.float32), device=dev)
    misses, hits = ctx.graphs.misses, ctx.graphs.hits
    for k, lr in enumerate((0.5, 0.25, 0.125)):
        y = x - lr * x
        np.testing.assert_allclose(y.numpy(), np.full(4, 1 - lr))
        assert ctx.graphs.misses == misses + 1 and ctx.graphs.hits == hits + k


def test_disable_switch(dev, monkeypatch):
    ctx = context_for(dev)
    ctx.graphs.clear()
    monkeypatch.setattr(graph_cache, "ENABLED", False)
    x = rt.array(np.ones(3, np.float32), device=dev)
    hits = ctx.graphs.hits
    for _ in range(2):
        y = x + 1
        np.testing.assert_allclose(y.numpy(), np.full(3, 2.0))
    assert len(ctx.graphs) == 0 and ctx.graphs.hits == hits
    monkeypatch.setattr(graph_cache, "ENABLED", True)
    for _ in range(2):
        rt.eval(x + 1)
    assert ctx.graphs.hits == hits + 1


def test_disable_switch_is_read_from_the_environment_at_import():
    import subprocess
    import sys

    code = "from runtime import graph_cache; print(graph_cache.enabled())"
    for value, expected in (("0", "False"), ("no", "False"), ("1", "True"), ("On", "True"), ("", "True")):
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RUNTIME_GRAPH_CACHE": value},
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == expected
    bad = subprocess.run([sys.executable, "-c", code], env={**os.environ, "RUNTIME_GRAPH_CACHE": "nah"},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "InvalidArgumentError" in bad.stderr and "RUNTIME_GRAPH_CACHE" in bad.stderr


def test_intermediates_kept_when_referenced(dev):
    x = rt.array(np.arange(4, dtype=np.float32), device=dev)
    h = x * 3
    y = (h + 1).sum()
    rt.eval(y)
    np.testing.assert_allclose(h.numpy(), np.arange(4) * 3)
    assert float(y) == pytest.approx(22.0)


def _evaluate_failing(dev):
    """A negation evaluated with a kernel that fails on a CPU driver (an out-of-range element
    count): the array, its work submitted."""
    ctx = context_for(dev)
    real = fusion.PLANNERS["neg"]

    def broken(node, layouts, ctx):
        cmds = real(node, layouts, ctx)
        _, src, name, wg, consts, roles = cmds[0]
        return [("dispatch", src, name, wg, [2**31] + consts[1:], roles)]

    fusion.PLANNERS["neg"] = broken
    try:
        bad = -rt.array(np.ones(7, np.float32), device=dev)
        rt.eval(bad)
    finally:
        fusion.PLANNERS["neg"] = real
        ctx.graphs.clear()
    return bad


def test_failed_submission_is_reported_and_device_recovers(dev):
    if dev == "cuda":
        pytest.skip("a failing numpy kernel is a CPU-driver behaviour")
    x = rt.array(np.ones(3, np.float32), device=dev)
    ok = x + 1
    rt.eval(ok)
    ok.numpy()
    bad = _evaluate_failing(dev)
    with pytest.raises(hal.AbortedError):
        bad.numpy()
    np.testing.assert_allclose(ok.numpy(), np.full(3, 2.0))
    np.testing.assert_allclose((x * 5).numpy(), np.full(3, 5.0))


def test_a_failure_the_throttle_finds_is_raised_where_its_array_is_read(dev):
    """Evals do not poll the timeline; the throttle, waiting for the oldest submission once
    MAX_IN_FLIGHT are out (each up to SUBMIT_BATCH evals queued while earlier work ran), finds the
    failure, moves the context to a fresh timeline, and raises nothing itself. Work queued behind
    the failure before it was known fails with it (it waited for the failed timeline), as on a GPU;
    the evals after the recovery compute, and the arrays raise only when read."""
    if dev == "cuda":
        pytest.skip("a failing numpy kernel is a CPU-driver behaviour")
    ctx = context_for(dev)
    x = rt.array(np.arange(3, dtype=np.float32), device=dev)
    rt.eval(x)
    failed = ctx.semaphore
    bad = _evaluate_failing(dev)
    later = []
    behind = MAX_IN_FLIGHT * SUBMIT_BATCH  # evals that may have been queued behind the failure
    for k in range(3 * behind):
        y = x * float(k)
        rt.eval(y)  # (throttled: the waits meet the failure on the way)
        later.append(y)
    assert ctx.semaphore is not failed and failed in ctx.failed
    for k, y in enumerate(later):
        want = np.arange(3, dtype=np.float32) * k
        if k < len(later) - behind:
            try:  # queued before the failure was known: failed with it, or computed after the recovery
                np.testing.assert_array_equal(y.numpy(), want)
            except hal.AbortedError:
                pass
        else:
            np.testing.assert_array_equal(y.numpy(), want)
    with pytest.raises(hal.AbortedError):
        bad.numpy()


def test_an_eval_after_a_recorded_failure_starts_a_fresh_timeline(dev):
    """An eval that finds its context's timeline failed already (the failure recorded, as a CPU
    driver records it once the work ran) moves to a fresh timeline before it submits: it computes."""
    ctx = context_for(dev)
    x = rt.array(np.arange(3, dtype=np.float32), device=dev)
    rt.eval(x)
    y = x + 1.0
    rt.eval(y)
    y.numpy()
    old = ctx.semaphore
    old.fail(hal.HalError(13, "the work failed"))  # as a failed kernel fails the timeline
    z = x * 3.0
    rt.eval(z)
    assert ctx.semaphore is not old and old in ctx.failed
    np.testing.assert_array_equal(z.numpy(), np.arange(3, dtype=np.float32) * 3)
    np.testing.assert_array_equal(y.numpy(), np.arange(3, dtype=np.float32) + 1)


def test_programs_of_dropped_recordings_go_once_a_wait_reaches_them(dev):
    """A dropped recording's CPU program is forgotten once the timeline reaches its last submission:
    a read's wait is enough (a synced loop never fills the throttle, nor polls)."""
    ctx = context_for(dev)
    if ctx.is_gpu:
        pytest.skip("CPU programs are a CPU driver's")
    x = rt.array(np.arange(3, dtype=np.float32), device=dev)
    earlier = set(ctx.programs)  # (the context is shared: other tests' programs may stay)
    ((x * 2.0) + 1.0).numpy()
    mine = set(ctx.programs) - earlier
    assert mine
    ctx.graphs.clear()
    gc.collect()
    assert ctx.retired_programs
    np.testing.assert_array_equal((x - 3.0).numpy(), np.arange(3, dtype=np.float32) - 3)
    assert not ctx.retired_programs and not mine & set(ctx.programs)


def test_cpu_program_is_one_dispatch(dev, monkeypatch):
    """On CPU drivers a recording runs all its kernels inside one dispatch; results are the same."""
    ctx = context_for(dev)
    if ctx.is_gpu:
        pytest.skip("GPU devices record one dispatch per kernel")
    ctx.graphs.clear()
    dispatches = []
    real = ctx.device.create_command_buffer

    def spy(*args, **kwargs):
        cb = real(*args, **kwargs)
        orig = cb.dispatch

        def dispatch(*a, **k):
            dispatches.append(a[1])
            return orig(*a, **k)

        cb.dispatch = dispatch
        return cb

    monkeypatch.setattr(ctx.device, "create_command_buffer", spy)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    xr = rt.array(x, device=dev)
    y = (rt.exp(xr * 0.1) @ xr.T).sum(axis=0) + rt.zeros((3,), device=dev)
    np.testing.assert_allclose(y.numpy(), (np.exp(x * 0.1) @ x.T).sum(axis=0), rtol=1e-5)
    assert len(dispatches) == 1 and dispatches[0].startswith("program_")


def test_eager_training_step_replays_unchanged_tables_on_cpu(dev, monkeypatch):
    """An eager `w = w - lr * g` loop rotates w, its successor and the gradient through three buffers
    of one size (the loss is smaller); on CPU drivers each of three recordings then sees its own
    table again, so replays make no byte view (and run bound kernels), and values follow the data."""
    if context_for(dev).is_gpu:
        pytest.skip("CPU drivers only")
    from hal.drivers.local import command_buffer

    rng = np.random.default_rng(4)
    X_np = rng.standard_normal((30, 100)).astype(np.float32) * 0.1
    y_np = rng.standard_normal(30).astype(np.float32)
    X, y = rt.array(X_np, device=dev), rt.array(y_np, device=dev)
    vg = rt.value_and_grad(lambda w: ((X @ w - y) ** 2).mean())
    w, w_ref = rt.zeros((100,), device=dev), np.zeros(100)
    made = []
    real = command_buffer._bytes
    for i in range(12):
        if i == 6:
            monkeypatch.setattr(command_buffer, "_bytes", lambda *a: made.append(a) or real(*a))
        loss, g = vg(w)
        w = w - 0.1 * g
        rt.eval(w, loss)
        r = X_np @ w_ref - y_np
        np.testing.assert_allclose(float(loss), (r * r).mean(), rtol=1e-5)
        w_ref = w_ref - 0.1 * 2 * X_np.T @ r / len(r)
        np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-5, atol=1e-6)
    assert made == []


def test_graph_deeper_than_the_recursive_key_walk_is_keyed_iteratively_and_replayed(dev):
    """A chain deeper than the interpreter's recursion allows is walked with an explicit stack: right
    values, and the same structure evaluated again is a cache hit."""
    depth = sys.getrecursionlimit() // 2 + 10  # two nodes a step
    ctx = context_for(dev)
    ctx.graphs.clear()
    for step in range(2):
        start = np.arange(6, dtype=np.float32) + step
        x = rt.array(start, device=dev)
        y = x
        for k in range(depth):
            y = y * 1.0 + float(k % 3)  # scalars are data: one structure for every k
        before = ctx.graphs.stats()
        rt.eval(y)
        after = ctx.graphs.stats()
        expected = start.copy()
        for k in range(depth):
            expected = expected * np.float32(1.0) + np.float32(k % 3)
        np.testing.assert_allclose(y.numpy(), expected, rtol=1e-6)
        if step:
            assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"]


@pytest.mark.parametrize("scan", [True, False])
def test_recursive_and_iterative_key_walks_order_and_count_alike(dev, monkeypatch, scan):
    """Both walks number the nodes alike, and their reads counted (by a scan of the references for
    small walks, by a Counter above COUNT_BY_SCAN) are each node's consumers' direct inputs."""
    monkeypatch.setattr(key, "COUNT_BY_SCAN", 64 if scan else 1)
    rng = np.random.default_rng(3)
    x = rt.array(rng.standard_normal((4, 3)).astype(np.float32), device=dev)
    w = rt.array(rng.standard_normal(3).astype(np.float32), device=dev)
    z = x @ w
    a = rt.exp(-abs(z))
    b = a + z.reshape((2, 2)).reshape((4,)) * a
    targets = [b, (a * b).sum(), a * a]  # (a * a: one consumer reading a node twice)
    walk_r = key._walk_recursive(targets)
    walk_i = key._walk_iterative(targets)
    direct_r: list = []
    direct_i: list = []
    key.direct_reads(walk_r.parts, direct_r)
    key.direct_reads(walk_i.parts, direct_i)
    assert [id(n) for n in walk_r.order] == [id(n) for n in walk_i.order]
    assert direct_r == direct_i and walk_r.viewed == walk_i.viewed and len(walk_r.views) == len(walk_i.views)
    assert sorted(map(id, walk_r.externals)) == sorted(map(id, walk_i.externals))
    assert len(walk_r.parts) == len(walk_i.parts) == len(walk_r.order)
    assert direct_r == [sum(inp is n for m in walk_r.order for inp in m.inputs) for n in walk_r.order]
    assert max(direct_r) >= 2
    del walk_r, walk_i
    assert key.collect_key(targets)[1] == key.collect_key(targets)[1]  # a walk is deterministic
    single: list = []
    key.direct_reads(key._walk_recursive([rt.exp(x)]).parts, single)
    assert single == [0]


def test_a_single_op_is_keyed_as_the_walk_keys_it(dev):
    """An eager single op (one pending node, every input evaluated or a placeholder, none read through
    a view) is keyed without the walk (``one_node_key``), to the walk's own order, key, externals and
    live mask; any other graph is left to the walk."""
    from runtime.graph import PLACEHOLDER, new_node

    rng = np.random.default_rng(5)
    x = rt.array(rng.standard_normal((4, 3)).astype(np.float32), device=dev)
    w = rt.array(rng.standard_normal((3, 2)).astype(np.float32), device=dev)
    v = rt.array(rng.standard_normal(3).astype(np.float32), device=dev)
    positive = x > 0
    rt.eval(x, w, v, positive)
    traced = new_node(PLACEHOLDER, (), 0, (4, 3), x.dtype, x.ctx)
    singles = {"product": x @ w, "sum": x.sum(axis=0), "a + a": x + x, "unary": rt.exp(v),
               "broadcast": x * v, "placeholder": traced * x, "no inputs": rt.zeros((2, 2), device=dev),
               "concat": rt.concat([v, v, v, v, v, v, v, v, v, v]), "same twice of three": rt.where(positive, x, x),
               "a pending input": rt.where(x < 0, x, w[:, 0])}
    for name, node in singles.items():
        root = node.root
        fast = key.one_node_key(root)
        if name == "a pending input":  # (x < 0 is pending, and w is read through a view: the walk's)
            assert fast is None
            continue
        assert fast is not None, name
        order, walk_key, externals, _ = key.collect_key([root])
        assert [id(n) for n in fast[0]] == [id(n) for n in order], name
        assert fast[1] == walk_key, name
        assert [id(e) for e in fast[2]] == [id(e) for e in externals], name
        direct: list = []
        order, _, _, viewed = key.collect_key([root], direct)
        assert key.eval_key([root], True)[3] == key.live_mask(order, direct, viewed) == 1, name
        assert key.eval_key([root], False)[3] is None
    pending = rt.exp(x) + 1.0  # an input pending
    through_view = x.T @ x  # an input read through a view
    assert key.one_node_key(pending.root) is None
    assert key.one_node_key(through_view.root) is None
    for node in (pending, through_view):
        assert key.eval_key([node.root], True)[1] == key.collect_key([node.root])[1]


def test_key_walk_leaves_no_references_to_the_nodes(dev):
    """The walk's closures must not outlive it: a leftover reference to a node reads as a consumer
    holding it (live_mask), and the node's buffer would be kept."""
    import sys

    x = rt.array(np.ones(5, dtype=np.float32), device=dev)
    y = rt.exp(x) + 1.0
    before = sys.getrefcount(y)
    key.collect_key([y])
    assert sys.getrefcount(y) == before


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("shape,axis", [((1000,), None), ((7, 33), 1), ((7, 33), None)])
def test_replayed_float32_reductions_give_numpys_values(dev, op, shape, axis):
    """The CPU program's prepared float32 reductions (bound to their views from the second replay
    of one table on: a full reduction on the flat view, a mean as a sum and then a division) give
    numpy's values bit for bit, each replay reading the argument's current values. (A GPU sums in
    another order: there the values agree to float32 rounding.)"""
    rng = np.random.default_rng(len(op) + len(shape))
    f = rt.compile(lambda x: getattr(x, op)(axis=axis))
    exact = not context_for(dev).is_gpu or op in ("max", "min")
    for _ in range(5):
        x_np = rng.standard_normal(shape).astype(np.float32)
        got = f(rt.array(x_np, device=dev)).numpy()
        want = getattr(np, op)(x_np, axis=axis)
        if exact:
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cpu_kernels_ignore_floating_point_errors_and_keep_the_callers_state(dev):
    """Kernels run with floating-point warnings ignored (overflow is inf, as on GPUs) whatever the
    caller's numpy error state, which is the caller's again afterwards."""
    f = rt.compile(lambda x: rt.exp(x) * 2.0 - rt.log(x - x))
    x = rt.array(np.array([1.0, 1000.0, 0.0], np.float32), device=dev)
    with np.errstate(all="raise"):
        for _ in range(4):
            np.testing.assert_array_equal(f(x).numpy(), [np.inf, np.inf, np.inf])
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "raise", "invalid": "raise"}
        with pytest.raises(FloatingPointError):
            np.exp(np.float32(1000.0))


def _random_program(rng: np.random.Generator, device, steps: int) -> list[tuple]:
    """Pending arrays built by random ops over a few externals (views, broadcasts, reductions, one
    operand twice, Python scalars), each with the numpy value it must have; returns (array, value)
    pairs of four of them."""
    hosts = [rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6,)).astype(np.float32),
             rng.standard_normal((4, 1)).astype(np.float32)]
    pool = [(rt.array(h, device=device), h) for h in hosts]
    for _ in range(steps):
        (a, na), (b, nb) = pool[rng.integers(len(pool))], pool[rng.integers(len(pool))]
        kind = rng.integers(9)
        try:
            np.broadcast_shapes(na.shape, nb.shape)
        except ValueError:
            kind = 0 if kind in (1, 8) else kind
        if kind == 0:
            made = rt.exp(a), np.exp(na)
        elif kind == 1:
            made = a + b, na + nb
        elif kind == 2:
            made = a * a, na * na
        elif kind == 3:
            made = (a.T, na.T) if a.ndim == 2 else (a.reshape((-1, 1)), na.reshape((-1, 1)))
        elif kind == 4:
            made = (a[1:], na[1:]) if a.shape and a.shape[0] > 1 else (-a, -na)
        elif kind == 5:
            made = (a.sum(axis=0), na.sum(axis=0)) if a.ndim else (a + 1.5, na + np.float32(1.5))
        elif kind == 6:
            made = rt.maximum(a, 0.0), np.maximum(na, np.float32(0))
        elif kind == 7:
            made = a.reshape((-1,)), na.reshape((-1,))
        else:
            made = a - b * 2.0, na - nb * np.float32(2)
        pool.append(made)
    picked = rng.choice(len(pool), size=4, replace=False)
    return [pool[i] for i in picked]


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_give_numpys_values_and_replay_from_the_cache(seed: int) -> None:
    """Graphs with views, shared nodes, repeated externals and intermediates still referenced: the eval
    gives numpy's values, and the same program built again is a graph-cache hit with the same values."""
    device = "local-sync"
    ctx = context_for(device)
    values = []
    for attempt in range(2):
        picked = _random_program(np.random.default_rng(seed), device, 12)
        misses = ctx.graphs.misses
        rt.eval(*[a for a, _ in picked])
        if attempt:
            assert ctx.graphs.misses == misses, "the same graph again is a hit"
        for a, want in picked:
            np.testing.assert_allclose(a.numpy(), want, rtol=1e-5, atol=1e-5)
        values.append([a.numpy().tolist() for a, _ in picked])
    assert values[0] == values[1]


def test_a_cache_hit_with_an_unchanged_table_submits_its_prepared_execution(dev, monkeypatch):
    """The recording holds the execution of its table: evals that bind the same buffers prepare nothing,
    and one whose buffers were released meanwhile prepares its new table."""
    ctx = context_for(dev)
    rt.synchronize(dev)
    prepared = counting_prepares(monkeypatch, ctx.device)
    a = rt.array(np.arange(64, dtype=np.float32), device=dev)
    want = float((np.arange(64, dtype=np.float32) * 3 + 1).sum())

    def once() -> float:
        return float((a * 3.0 + 1.0).sum())

    for _ in range(6):
        assert once() == want
    first = len(prepared)
    assert first <= 3  # the recordings' first tables
    for _ in range(6):
        assert once() == want
    assert len(prepared) == first
    rt.synchronize(dev)
    ctx.buffers.trim(0)  # the recordings' cached buffers are released: their executions are stale
    assert once() == want
    assert len(prepared) == first + 1


def test_compiled_replays_submit_prepared_executions(dev, monkeypatch):
    ctx = context_for(dev)
    step = rt.compile(lambda w: w * 0.5 + 1.0)
    w = rt.array(np.ones(16, np.float32), device=dev)
    for _ in range(4):
        w = step(w)
    rt.synchronize(dev)
    prepared = counting_prepares(monkeypatch, ctx.device)
    expected = w.numpy().copy()
    for _ in range(20):
        w = step(w)
        expected = expected * np.float32(0.5) + np.float32(1.0)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)
    assert all(n > 1 for n in prepared), prepared  # only batches of queued replays, each prepared once
    assert len(prepared) <= 3, prepared


@pytest.mark.parametrize("compiled", [True, False], ids=["rt.compile", "eager"])
def test_a_loop_back_on_earlier_inputs_settles_on_unchanged_tables(dev, monkeypatch, compiled):
    """``y = f(x)`` with the last result held, over one input, then another, then the first again,
    then with one more result kept alive throughout: once the recordings are made, none is rebound
    at every call; they take turns and each settles on a table of its own. (In the last two loops
    every call prepared a new table before: 64 MB lookups, 40 -> 100 us a call.)"""
    ctx = context_for(dev)
    xs = [rt.array(np.arange(64, dtype=np.float32) + k, device=dev) for k in range(2)]
    idx = rt.array(np.arange(16) % 7, device=dev)

    def f(x):
        return rt.take(x[8:], idx, axis=0) * 2.0 + 1.0

    step = rt.compile(f) if compiled else f
    held: list = []
    kept = []
    prepared = counting_prepares(monkeypatch, ctx.device)
    for x, keep in ((xs[0], False), (xs[1], False), (xs[0], False), (xs[0], True)):
        if keep:
            kept.append(step(x))
            rt.eval(*kept)
        for _ in range(6):  # (the recordings made or rebound)
            held[:] = [step(x)]
            rt.eval(*held)
        before = len(prepared)
        for _ in range(8):
            held[:] = [step(x)]
            rt.eval(*held)
        assert len(prepared) == before, prepared
        np.testing.assert_array_equal(held[0].numpy(), np.take(x.numpy()[8:], np.arange(16) % 7) * 2.0 + 1.0)
    np.testing.assert_array_equal(kept[0].numpy(), held[0].numpy())


def test_clearing_from_another_thread_waits_for_an_evaluation_in_progress(dev, monkeypatch):
    """rt.clear_graph_cache() landing between an evaluation's cache pick and its submission used to
    drop the recording under it: the evaluation raised that its recording was released."""
    import threading
    import time

    from runtime.graph_cache import GraphCache

    x = rt.array(np.arange(6, dtype=np.float32), device=dev)
    rt.eval(model(x.reshape(2, 3), rt.ones((3, 2), device=dev)))  # the graph is cached
    picked, cleared = threading.Event(), threading.Event()
    real_get = GraphCache.get

    def get_then_pause(self, graph_key):
        entry = real_get(self, graph_key)
        if entry is not None and threading.current_thread() is threading.main_thread() and not picked.is_set():
            picked.set()
            time.sleep(0.1)  # the clearing thread runs meanwhile
        return entry

    def clear():
        picked.wait(10)
        rt.clear_graph_cache(dev)
        cleared.set()

    monkeypatch.setattr(GraphCache, "get", get_then_pause)
    clearer = threading.Thread(target=clear)
    clearer.start()
    y = model(x.reshape(2, 3), rt.ones((3, 2), device=dev))
    rt.eval(y)
    clearer.join(10)
    assert picked.is_set() and cleared.is_set()
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(y.numpy(), np.tanh(host @ np.ones((3, 2)) + 1.0).sum(axis=0), rtol=1e-5)
    assert len(context_for(dev).graphs) == 0
    # and the next evaluation records the graph again
    np.testing.assert_allclose(model(x.reshape(2, 3), rt.ones((3, 2), device=dev)).numpy(), y.numpy())
