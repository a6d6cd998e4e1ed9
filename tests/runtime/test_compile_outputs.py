"""rt.compile's recordings keep their outputs for the next replay: a replay whose previous outputs
nothing references any more hands the same arrays out again with the new values. Every way an output
can stay observable (the array, a view, a host view, a pending node reading it, a weak reference, an
argument of the call) must keep it from being written again; results match numpy for every dtype."""

from __future__ import annotations

import gc
import importlib
import weakref

import numpy as np
import pytest
from rt_helpers import failures_in_threads, rand

import hal
import runtime as rt
from runtime.device import context_for

DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "int8", "bool"]


def _recs(f):
    """The recordings of the compiled function's only signature."""
    (entry,) = f.cache_clear.__self__.values()  # (cache_clear: the signature table's clear)
    return entry.variants.recs


def _cache_traffic(dev) -> int:
    b = context_for(dev).buffers
    return b.hits + b.misses


@pytest.mark.parametrize("dtype", DTYPES)
def test_dropped_outputs_are_reused_and_values_match_numpy(dev, dtype):
    rng = np.random.default_rng(1)
    a_np, b_np = rand((37,), dtype, rng), rand((37,), dtype, rng)
    boolean = dtype == "bool"

    def fn(a, b):
        return (a ^ b, a & b) if boolean else (a + b, a * b)

    def ref(a, b):
        return (a ^ b, a & b) if boolean else ((a + b).astype(dtype), (a * b).astype(dtype))

    f = rt.compile(fn)
    a, b = rt.array(a_np, device=dev), rt.array(b_np, device=dev)
    for _ in range(2):
        s, p = f(a, b)
        del s, p
    traffic = _cache_traffic(dev)
    for _ in range(5):
        s, p = f(a, b)
        rs, rp = ref(a_np, b_np)
        np.testing.assert_array_equal(s.numpy(), rs)
        np.testing.assert_array_equal(p.numpy(), rp)
        a_np, a = rs, s  # the next call reads this call's output
        b_np, b = rp, p
        del s, p
    assert f.stats["traces"] == 1
    # Alternating between two recordings, each found its previous outputs dropped after the first
    # rounds: no buffer went through the cache.
    assert _cache_traffic(dev) - traffic <= 4


def test_kept_outputs_are_not_written_again(dev):
    f = rt.compile(lambda a: (a + 1, a * 2))
    x = rt.array(np.arange(8, dtype=np.float32), device=dev)
    kept = []
    for k in range(6):
        s, p = f(x)
        if k % 2 == 0:
            kept.append((k, s, p))
        x = rt.array(np.arange(8, dtype=np.float32) + k + 1, device=dev)
    for k, s, p in kept:
        base = np.arange(8, dtype=np.float32) + k
        np.testing.assert_array_equal(s.numpy(), base + 1)
        np.testing.assert_array_equal(p.numpy(), base * 2)


@pytest.mark.parametrize("how", ["view", "host", "dlpack", "pending", "tuple", "storage"])
def test_an_output_observable_otherwise_is_not_reused(dev, how):
    f = rt.compile(lambda a: a * 3)
    data = np.arange(10, dtype=np.float32)
    x = rt.array(data, device=dev)
    for _ in range(3):  # both recordings made, each holding its outputs
        f(x)
    out = f(x)
    if how == "view":
        keep = out[2:5]
        expect = data[2:5] * 3
    elif how == "host":
        if context_for(dev).is_gpu:
            pytest.skip("a GPU array's host copy does not share its storage")
        keep = out.numpy()  # zero-copy on CPU devices: it holds the storage
        expect = data * 3
    elif how == "dlpack":
        if context_for(dev).is_gpu:  # numpy imports host (CPU) capsules only: a GPU consumer
            torch = pytest.importorskip("torch", reason="a GPU DLPack consumer (torch) is not installed")
            keep = torch.from_dlpack(out)  # the capsule's consumer holds the storage
        else:
            keep = np.from_dlpack(out)
        expect = data * 3
    elif how == "pending":
        keep = out + 1  # not evaluated: reads `out` when it is
        expect = data * 3 + 1
    elif how == "tuple":
        keep = (out,)
        expect = data * 3
    else:
        keep = out.root.storage
        expect = None
    out_buffer = out.root.storage.buffer
    del out
    for _ in range(4):  # the same input: the recording that made `out` is found by its buffers
        y = f(x)
        assert y.root.storage.buffer is not out_buffer
        np.testing.assert_array_equal(y.numpy(), data * 3)
        del y
    # Inputs in buffers of their own: each call binds a new table, so the recordings take turns
    # and the one holding `out` replays again.
    xs = [rt.array(data + 100 + k, device=dev) for k in range(4)]
    written = []
    for k in range(4):
        y = f(xs[k])
        np.testing.assert_array_equal(y.numpy(), (data + 100 + k) * 3)
        written.append(y.root.storage.buffer)
        del y
    assert all(buf is not out_buffer for buf in written)
    if how == "storage":
        return
    if how == "tuple":
        got = keep[0].numpy()
    elif how in ("host", "dlpack"):
        got = keep.cpu().numpy() if hasattr(keep, "cpu") else keep  # (a torch tensor on GPUs)
    else:
        got = keep.numpy()
    np.testing.assert_array_equal(np.asarray(got), expect)


def test_a_weakly_referenced_output_dies(dev):
    f = rt.compile(lambda a: a - 1)
    x = rt.array(np.ones(5, np.float32), device=dev)
    for _ in range(3):
        f(x)
    out = f(x)
    ref = weakref.ref(out)
    del out
    gc.collect()
    for _ in range(4):
        y = f(x)
        assert y is not ref()
        np.testing.assert_array_equal(y.numpy(), np.zeros(5, np.float32))
        del y
    assert ref() is None


def test_an_output_that_is_an_argument_again_is_not_overwritten(dev):
    # f(out) with out the recording's own previous output: the argument references it.
    f = rt.compile(lambda a: a * 2 + 1)
    x = rt.array(np.ones(6, np.float32), device=dev)
    y = f(x)
    expect = np.ones(6, np.float32) * 2 + 1
    for _ in range(6):
        y = f(y)
        expect = expect * 2 + 1
        np.testing.assert_array_equal(y.numpy(), expect)
    z = f(y)
    np.testing.assert_array_equal(y.numpy(), expect)  # the argument kept its value
    np.testing.assert_array_equal(z.numpy(), expect * 2 + 1)


def test_outputs_held_across_a_timeline_failure_take_the_new_timeline(dev):
    f = rt.compile(lambda a: a + 2)
    x = rt.array(np.zeros(4, np.float32), device=dev)
    for _ in range(3):
        f(x)
    rt.synchronize(dev)
    ctx = context_for(dev)
    ctx.recover(hal.AbortedError("an unrelated submission failed"))
    for _ in range(3):  # the held arrays serve again, on the new semaphore
        y = f(x)
        np.testing.assert_array_equal(y.numpy(), np.full(4, 2.0, np.float32))
        assert y.root.storage.sem is ctx.semaphore
        del y


def test_threads_calling_one_compiled_function(dev):
    f = rt.compile(lambda a, b: (a * b + 1, a - b))
    rng = np.random.default_rng(3)
    seeds = [int(rng.integers(1 << 30)) for _ in range(4)]

    def worker(k: int) -> None:
        r = np.random.default_rng(seeds[k])
        for _ in range(40):
            a_np = r.standard_normal(64).astype(np.float32)
            b_np = r.standard_normal(64).astype(np.float32)
            s, d = f(rt.array(a_np, device=dev), rt.array(b_np, device=dev))
            # (a GPU fuses a * b + 1 into one rounding: results near 0 differ by more than rtol)
            np.testing.assert_allclose(s.numpy(), a_np * b_np + 1, rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(d.numpy(), a_np - b_np, rtol=1e-6)

    problems = failures_in_threads(worker, 4, timeout=120)
    assert not problems, problems[:3]


def test_large_outputs_are_not_held(dev, monkeypatch):
    monkeypatch.setattr(importlib.import_module("runtime.compile"), "HOLD_BYTES", 16)
    f = rt.compile(lambda a: a + 1)
    x = rt.array(np.zeros(8, np.float32), device=dev)
    for _ in range(4):
        y = f(x)
        np.testing.assert_array_equal(y.numpy(), np.ones(8, np.float32))
        del y
    assert all(rec.held is None for rec in _recs(f))


def test_clearing_the_cache_gives_held_buffers_back(dev):
    f = rt.compile(lambda a: a + 1)
    x = rt.array(np.zeros(1000, np.float32), device=dev)
    for _ in range(3):
        f(x)
    assert any(rec.held is not None for rec in _recs(f))
    free = context_for(dev).buffers.free_bytes
    f.cache_clear()
    gc.collect()
    assert context_for(dev).buffers.free_bytes > free
