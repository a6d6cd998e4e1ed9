"""Stream-ordered allocation: queue_alloca / queue_dealloca."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import WAIT_TIMEOUT, assert_not_reached, read_u32, record, safety_signal


@pytest.mark.parametrize("size", [4, 256, 1 << 16])
def test_alloca_buffer_usable_after_its_signal(device, kernels, size):
    ready, done = device.create_semaphore(0), device.create_semaphore(0)
    buf = device.queue_alloca(size, signal=[(ready, 1)])
    assert buf.size == size and buf.device is device
    n = size // 4
    cb = record(
        device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=-(-n // 64), constants=[n], bindings=[buf])
    )
    device.queue_execute([cb], wait=[(ready, 1)], signal=[(done, 1)])
    done.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.arange(n, dtype=np.uint32))
    device.queue_dealloca(buf, wait=[(done, 1)], signal=[(done, 2)])
    done.wait(2, timeout=WAIT_TIMEOUT)


def test_alloca_waits_for_its_fences(device):
    gate, ready = device.create_semaphore(0), device.create_semaphore(0)
    with safety_signal(gate, 1):
        buf = device.queue_alloca(64, wait=[(gate, 1)], signal=[(ready, 1)])
        assert_not_reached(ready, 1)
        gate.signal(1)
        ready.wait(1, timeout=WAIT_TIMEOUT)
    cb = record(device, lambda cb: cb.fill_buffer(buf, 0x66, 1))
    device.queue_execute([cb], wait=[(ready, 1)], signal=[(ready, 2)])
    ready.wait(2, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\x66" * 64
    device.queue_dealloca(buf, wait=[(ready, 2)], signal=[(ready, 3)])
    ready.wait(3, timeout=WAIT_TIMEOUT)


def test_dealloca_releases_the_buffer(make_device):
    dev = make_device()
    base = dev.allocator.statistics()
    sem = dev.create_semaphore(0)
    buf = dev.queue_alloca(1024, signal=[(sem, 1)])
    sem.wait(1, timeout=WAIT_TIMEOUT)
    assert dev.allocator.statistics().live_buffers == base.live_buffers + 1
    dev.queue_dealloca(buf, wait=[(sem, 1)], signal=[(sem, 2)])
    sem.wait(2, timeout=WAIT_TIMEOUT)
    assert buf.released
    stats = dev.allocator.statistics()
    assert stats.live_buffers == base.live_buffers
    assert stats.bytes_allocated == base.bytes_allocated
    with pytest.raises(hal.FailedPreconditionError):
        dev.read(buf)


def test_dealloca_waits_for_its_fences(device):
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    buf = device.allocator.allocate(64)
    with safety_signal(gate, 1):
        device.queue_dealloca(buf, wait=[(gate, 1)], signal=[(done, 1)])
        assert not buf.released
        assert_not_reached(done, 1)
        gate.signal(1)
        done.wait(1, timeout=WAIT_TIMEOUT)
    assert buf.released


def test_many_alloca_dealloca_rounds(make_device):
    dev = make_device()
    base = dev.allocator.statistics().live_buffers
    sem = dev.create_semaphore(0)
    value = 0
    for i in range(50):
        buf = dev.queue_alloca(256 + i * 4, wait=[(sem, value)], signal=[(sem, value + 1)])
        cb = record(dev, lambda cb, buf=buf, i=i: cb.fill_buffer(buf, i, 1))
        dev.queue_execute([cb], wait=[(sem, value + 1)], signal=[(sem, value + 2)])
        dev.queue_dealloca(buf, wait=[(sem, value + 2)], signal=[(sem, value + 3)])
        value += 3
    sem.wait(value, timeout=WAIT_TIMEOUT)
    assert dev.allocator.statistics().live_buffers == base


def test_alloca_memory_type_and_usage(device):
    sem = device.create_semaphore(0)
    wanted = hal.MemoryType.HOST_LOCAL | hal.MemoryType.HOST_VISIBLE
    usage = hal.BufferUsage.TRANSFER | hal.BufferUsage.MAPPING
    buf = device.queue_alloca(32, signal=[(sem, 1)], memory_type=wanted, usage=usage)
    sem.wait(1, timeout=WAIT_TIMEOUT)
    assert wanted & buf.memory_type == wanted
    assert usage in buf.usage
    device.write(buf, b"\x05" * 32)
    with buf.map(hal.MemoryAccess.READ) as view:
        assert view.tobytes() == b"\x05" * 32
    device.queue_dealloca(buf, signal=[(sem, 2)])
    sem.wait(2, timeout=WAIT_TIMEOUT)


@pytest.mark.parametrize("size", [-4, 2.5, "64", None, True])
def test_alloca_bad_size_is_invalid_argument(device, size):
    with pytest.raises(hal.InvalidArgumentError):
        device.queue_alloca(size)


def test_alloca_too_large_is_resource_exhausted(device):
    with pytest.raises(hal.ResourceExhaustedError):
        device.queue_alloca(1 << 62)


def test_dealloca_of_a_subspan_is_invalid_argument(device):
    buf = device.allocator.allocate(64)
    with pytest.raises(hal.InvalidArgumentError):
        device.queue_dealloca(buf.subspan(0, 32))
    assert not buf.released
    buf.release()
