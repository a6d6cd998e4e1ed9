"""Buffer cache: size buckets; host reuse after the last submission touching a buffer completed,
device reuse at once (submissions of a context run in order)."""

from __future__ import annotations

import gc

import numpy as np

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
