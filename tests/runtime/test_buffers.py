"""Buffer cache: size buckets; host reuse after the last submission touching a buffer completed,
device reuse at once (submissions of a context run in order)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import hal
import runtime as rt
from runtime.buffer_cache import BufferCache, bucket_size
from runtime.device import context_for


def test_bucket_sizes_are_power_of_two_quarters():
    assert bucket_size(1) == 256 and bucket_size(256) == 256
    assert bucket_size(257) == 320  # 256 * 1.25
    assert bucket_size(1000) == 1024
    assert bucket_size(1025) == 1280
    for n in (3000, 10**6, 12345678):
        b = bucket_size(n)
        assert n <= b < n * 1.25 + 256


def test_host_reuse_waits_for_the_fence(dev):
    """A host write (upload) may only reuse a buffer once the submission last touching it completed."""
    ctx = context_for(dev)
    cache = BufferCache(ctx.device)
    a, bucket = cache.acquire(1000)
    cache.retire(3)
    cache.release(a, bucket, fence=5)
    b, _ = cache.acquire(1000, host=True)
    assert b is not a, "still in use by submission 5"
    cache.retire(4)
    c, _ = cache.acquire(1000, host=True)
    assert c is not a
    cache.retire(5)
    d, _ = cache.acquire(1000, host=True)
    assert d is a
    for buf in (b, c, d):
        cache.release(buf, bucket, 0)
    cache.trim(0)
    assert cache.free_bytes == 0


def test_device_reuse_is_stream_ordered(dev):
    """Work of a later submission runs after the work of earlier ones: it may take a buffer at once,
    and prefers the one it had last time."""
    ctx = context_for(dev)
    cache = BufferCache(ctx.device)
    a, bucket = cache.acquire(1000)
    b, _ = cache.acquire(1000)
    cache.release(a, bucket, fence=7)
    cache.release(b, bucket, fence=8)
    assert cache.take(bucket, a) is a
    assert cache.take(bucket, None) is b
    fresh = cache.take(bucket, a)
    assert fresh is not a and fresh is not b and cache.misses == 3
    for buf in (a, b, fresh):
        cache.release(buf, bucket, 0)
    cache.trim(0)


def test_arrays_recycle_their_buffers(dev):
    ctx = context_for(dev)
    x = rt.array(np.ones(1000, np.float32), device=dev)
    y = x * 2
    y.numpy()
    buf = y.root.storage.buffer
    del y
    gc.collect()
    rt.synchronize(dev)
    z = x * 3
    rt.eval(z)
    assert z.root.storage.buffer is buf
    np.testing.assert_allclose(z.numpy(), np.full(1000, 3.0))
    assert ctx.buffers.hits > 0


def test_numpy_view_keeps_storage_alive(dev):
    x = rt.array(np.arange(8, dtype=np.float32), device=dev)
    y = x + 1
    host = y.numpy()
    del y
    gc.collect()
    for _ in range(3):
        rt.eval(x * 7)
    np.testing.assert_allclose(host, np.arange(8) + 1)


def _device_for(driver: str):
    """A fresh device of `driver`: a CPU driver's, or ``fake-gpu``, the simulated GPU in graph mode."""
    if driver == "fake-gpu":
        fake_gpu = pytest.importorskip("drivers.fake_gpu")
        return fake_gpu.FakeGpuDriver().create_device(command_buffer="graph")
    return hal.create_device(driver)


@pytest.mark.parametrize("driver", ["local-task", "fake-gpu"])
def test_a_program_of_evals_computes_and_recycles_alike_each_time(driver: str) -> None:
    """Repeats of one graph (its table unchanged), results held across evals (their buffers busy: the
    graph's other recording serves), evals queued without a wait between them and reductions with
    scratch in the table give numpy's values; the same program on a fresh device takes and gives back
    the same buffers."""
    outcomes = []
    for _ in range(2):
        device = _device_for(driver)
        try:
            outcomes.append(_evals_program(device))
        finally:
            device.close()
    assert outcomes[0] == outcomes[1]
    results = outcomes[0][0]
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 33)).astype(np.float32)
    b = rng.standard_normal((64, 33)).astype(np.float32)
    for step in range(12):
        np.testing.assert_allclose(results[step], ((a + b) * np.float32(step % 3)).sum(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(results[12], (a - b).sum(), rtol=1e-4, atol=1e-4)


def _evals_program(device) -> tuple[list, dict]:
    rng = np.random.default_rng(7)
    a_np = rng.standard_normal((64, 33)).astype(np.float32)
    b_np = rng.standard_normal((64, 33)).astype(np.float32)
    ctx = context_for(device)  # a context of its own for this device object
    ctx.is_gpu = ctx.is_gpu or device.info.driver == "fake"
    a, b = rt.array(a_np, device=ctx), rt.array(b_np, device=ctx)
    results, held = [], []
    for step in range(12):
        c = (a + b) * float(step % 3)
        s = c.sum()
        if step % 4 == 1:
            held.append(c)  # kept: the next eval of the graph finds its buffer busy
        rt.eval(s)
        results.append(float(s))
    for _ in range(6):  # queued without a wait in between
        rt.eval(a * b)
    results.append(float((a - b).sum()))
    big = rt.array(rng.standard_normal((512, 4096)).astype(np.float32), device=ctx)
    for _ in range(3):  # scratch through the binding table (large reductions' partials on a CPU)
        results.append((rt.exp(big * 0.1).max(axis=0) + big.mean()).numpy().tolist())
    del c, s, held  # their storages give their buffers back
    gc.collect()
    cache = ctx.buffers
    counters = {"hits": cache.hits, "misses": cache.misses, "free_bytes": cache.free_bytes,
                "allocated_bytes": cache.allocated_bytes, "submitted": ctx.submitted,
                "graph_cache": ctx.graphs.stats()}
    return results, counters


@pytest.mark.parametrize("driver", ["local-task", "fake-gpu"])
def test_a_refused_submission_gives_its_buffers_back(driver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device refusing an eval's submission: the error comes out, and the buffers taken for the
    eval go back to the cache."""
    device = _device_for(driver)
    ctx = context_for(device)
    host = np.linspace(0, 1, 4096, dtype=np.float32)
    a = rt.array(host, device=ctx)
    try:
        for _ in range(2):
            rt.eval(rt.exp(a))
        cache = ctx.buffers
        before = cache.free_bytes

        def refuse(*args, **kwargs):
            raise hal.ResourceExhaustedError("refused")

        monkeypatch.setattr(device, "queue_execute", refuse, raising=False)
        monkeypatch.setattr(device, "prepare", refuse, raising=False)
        with pytest.raises(hal.ResourceExhaustedError):
            rt.eval(rt.exp(a) + 1.0)  # a graph not recorded before
        gc.collect()
        assert cache.free_bytes >= before
        monkeypatch.undo()
        np.testing.assert_allclose((rt.exp(a) + 1.0).numpy(), np.exp(host) + 1, rtol=1e-6)
    finally:
        device.close()


def test_a_failed_timeline_raises_for_its_work_and_the_context_goes_on() -> None:
    """Waits on a context whose work failed raise AbortedError; the context moves to a new timeline,
    what was computed before stays readable and new work computes."""
    device = hal.create_device("local-task")
    try:
        ctx = context_for(device)
        a = rt.array(np.arange(4, dtype=np.float32), device=ctx)
        x = a + 1.0
        rt.eval(x)
        ctx.wait(np.int64(x.root.storage.ready))  # a numpy value works as a timeline value
        ctx.wait(x.root.storage.ready)  # reached: nothing to do
        assert x.numpy().tolist() == [1, 2, 3, 4]
        y = a * 2.0
        rt.eval(y)
        value = y.root.storage.ready
        old = ctx.semaphore
        old.fail(hal.HalError(13, "the work failed"))  # as a failed kernel fails the timeline
        with pytest.raises(hal.AbortedError):
            ctx.wait(value)
        assert ctx.semaphore is not old and ctx.completed == ctx.submitted and old in ctx.failed
        assert x.numpy().tolist() == [1, 2, 3, 4]
        assert (a - 1.0).numpy().tolist() == [-1, 0, 1, 2]
    finally:
        device.close()


def test_a_long_lazy_chain_evaluates_in_memory_linear_in_its_length(dev):
    """Each dispatch of a CPU driver's reusable command buffer kept a copy of the whole binding table
    (one slot per array of the graph): a chain of n pending ops held n copies of n slots, 800 MB
    for 10,000 ops, and 100,000 ran out of memory."""
    import tracemalloc

    x = rt.ones(4, device=dev)
    for _ in range(6000):
        x = x + 1.0
    tracemalloc.start()
    try:
        x.eval()
        values = x.numpy()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(values, np.full(4, 6001.0))
    assert peak < 64 << 20, f"{peak / 1e6:.0f} MB traced while evaluating the chain"


def test_the_default_limit_is_half_a_gpus_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """On GPUs the cache keeps up to half the device's memory (freeing and allocating there wait for the
    device), on CPU drivers 1 GiB; RUNTIME_BUFFER_CACHE_BYTES decides where set."""
    from types import SimpleNamespace

    from runtime.buffer_cache import CPU_LIMIT_BYTES, default_limit

    gpu = SimpleNamespace(info=SimpleNamespace(properties={"memory_total": 80 << 30}))
    monkeypatch.delenv("RUNTIME_BUFFER_CACHE_BYTES", raising=False)
    assert default_limit(gpu, True) == 40 << 30
    assert default_limit(gpu, False) == CPU_LIMIT_BYTES == 1 << 30
    small = SimpleNamespace(info=SimpleNamespace(properties={"memory_total": 1 << 30}))
    assert default_limit(small, True) == CPU_LIMIT_BYTES
    unknown = SimpleNamespace(info=SimpleNamespace(properties={}))
    assert default_limit(unknown, True) == CPU_LIMIT_BYTES
    monkeypatch.setenv("RUNTIME_BUFFER_CACHE_BYTES", "12345")
    assert default_limit(gpu, True) == 12345 and default_limit(gpu, False) == 12345
    monkeypatch.setenv("RUNTIME_BUFFER_CACHE_BYTES", "-1")
    with pytest.raises(hal.InvalidArgumentError):
        default_limit(gpu, True)
    assert context_for("local-task").buffers.limit_bytes == CPU_LIMIT_BYTES


def test_an_allocation_the_device_refuses_trims_the_cache_then_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused allocation gives the cached buffers back and tries again; refused again, it waits for
    the device (a GPU frees memory once the work before the free is done) and tries a last time."""
    device = hal.create_device("local-task")
    try:
        cache = BufferCache(device)
        held, bucket = cache.acquire(4096)
        cache.release(held, bucket, 0)
        assert cache.free_bytes == bucket
        real = device.allocator.allocate
        refusals = []
        waits = []

        def allocate(size, *args, **kwargs):
            if len(refusals) < 2:
                refusals.append(size)
                raise hal.ResourceExhaustedError("out of memory")
            return real(size, *args, **kwargs)

        monkeypatch.setattr(device.allocator, "allocate", allocate)
        monkeypatch.setattr(device, "wait_idle", lambda *a, **k: waits.append(1))
        buf, got = cache.acquire(1 << 20)
        assert got == bucket_size(1 << 20) and buf.size >= 1 << 20
        assert refusals == [got, got] and waits == [1]
        assert cache.free_bytes == 0, "the cached buffer went back"
        cache.release(buf, got, 0)
        cache.trim(0)
    finally:
        device.close()
