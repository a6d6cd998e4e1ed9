"""Buffer cache: size buckets, reuse only after the last submission touching a buffer completed."""

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


def test_reuse_waits_for_the_fence(dev):
    ctx = context_for(dev)
    cache = BufferCache(ctx.device)
    a, bucket = cache.acquire(1000)
    cache.release(a, bucket, fence=5, completed=3)
    b, _ = cache.acquire(1000)
    assert b is not a, "still in use by submission 5"
    cache.retire(4)
    c, _ = cache.acquire(1000)
    assert c is not a
    cache.retire(5)
    d, _ = cache.acquire(1000)
    assert d is a
    for buf in (b, c, d):
        cache.release(buf, bucket, 0, 0)
    cache.trim(0)
    assert cache.free_bytes == 0


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
