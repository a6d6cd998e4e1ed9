"""Allocation, statistics, release and memory types."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import MAPPABLE, allocate_with, execute, random_bytes

MT = hal.MemoryType
CPU_MEMORY = MT.DEVICE_LOCAL | MT.DEVICE_VISIBLE | MT.HOST_LOCAL | MT.HOST_VISIBLE | MT.HOST_COHERENT


@pytest.mark.parametrize("size", [1, 3, 4, 64, 1000, 4096, 1 << 20])
def test_allocate_size_and_owner(device, size):
    buf = device.allocator.allocate(size)
    try:
        assert buf.size == size
        assert buf.device is device
        assert not buf.released
    finally:
        buf.release()
    assert buf.released


@pytest.mark.parametrize("size", [1, 100, 4096, 123457])
def test_write_then_read_whole_buffer(device, size):
    data = random_bytes(size, seed=size)
    buf = allocate_with(device, data)
    assert device.read(buf) == data
    buf.release()


@pytest.mark.parametrize(("offset", "length"), [(0, 1), (1, 1), (5, 100), (255, 1), (128, 128), (17, None)])
def test_write_and_read_at_offsets(device, offset, length):
    original = random_bytes(256, seed=1)
    buf = allocate_with(device, original)
    patch = random_bytes((256 - offset) if length is None else length, seed=2)
    device.write(buf, patch, offset)
    expected = original[:offset] + patch + original[offset + len(patch) :]
    assert device.read(buf) == expected
    assert device.read(buf, offset, length) == patch


def test_write_accepts_arrays(device):
    values = np.arange(16, dtype=np.float32)
    buf = device.allocator.allocate(64)
    device.write(buf, values)
    np.testing.assert_array_equal(np.frombuffer(device.read(buf), np.float32), values)


def test_statistics_count_bytes_and_buffers(make_device):
    dev = make_device()
    before = dev.allocator.statistics()
    assert isinstance(before, hal.AllocatorStatistics)
    a = dev.allocator.allocate(1000)
    b = dev.allocator.allocate(24)
    mid = dev.allocator.statistics()
    assert mid.live_buffers == before.live_buffers + 2
    assert mid.bytes_allocated >= before.bytes_allocated + 1024
    a.release()
    after_a = dev.allocator.statistics()
    assert after_a.live_buffers == before.live_buffers + 1
    assert after_a.bytes_allocated < mid.bytes_allocated
    b.release()
    end = dev.allocator.statistics()
    assert end.live_buffers == before.live_buffers
    assert end.bytes_allocated == before.bytes_allocated


def test_statistics_peak(make_device):
    dev = make_device()
    base = dev.allocator.statistics().bytes_allocated
    a = dev.allocator.allocate(4096)
    b = dev.allocator.allocate(8192)
    a.release()
    b.release()
    peak = dev.allocator.statistics().bytes_peak
    assert peak >= base + 4096 + 8192
    c = dev.allocator.allocate(16)
    stats = dev.allocator.statistics()
    assert stats.bytes_peak == peak
    assert stats.bytes_allocated < peak
    c.release()


def test_subspans_are_not_allocations(make_device):
    dev = make_device()
    buf = dev.allocator.allocate(256)
    stats = dev.allocator.statistics()
    view = buf.subspan(0, 128)
    view.release()
    assert dev.allocator.statistics() == stats
    buf.release()


def test_release_is_idempotent(make_device):
    dev = make_device()
    base = dev.allocator.statistics()
    buf = dev.allocator.allocate(128)
    buf.release()
    buf.release()
    buf.release()
    stats = dev.allocator.statistics()
    assert stats.live_buffers == base.live_buffers
    assert stats.bytes_allocated == base.bytes_allocated


def test_buffer_context_manager_releases(make_device):
    dev = make_device()
    base = dev.allocator.statistics().live_buffers
    with dev.allocator.allocate(64) as buf:
        assert dev.allocator.statistics().live_buffers == base + 1
        assert not buf.released
    assert buf.released
    assert dev.allocator.statistics().live_buffers == base


def _use_as_fill_target(device, buf, other, kernels):
    cb = device.create_command_buffer()
    cb.begin()
    cb.fill_buffer(buf, 0, 1)


def _use_as_copy_source(device, buf, other, kernels):
    cb = device.create_command_buffer()
    cb.begin()
    cb.copy_buffer(buf, other)


def _use_as_copy_target(device, buf, other, kernels):
    cb = device.create_command_buffer()
    cb.begin()
    cb.copy_buffer(other, buf)


def _use_as_update_target(device, buf, other, kernels):
    cb = device.create_command_buffer()
    cb.begin()
    cb.update_buffer(bytes(64), buf)


def _use_as_binding(device, buf, other, kernels):
    cb = device.create_command_buffer()
    cb.begin()
    cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[16], bindings=[buf])


def _use_in_binding_table(device, buf, other, kernels):
    cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE, binding_capacity=1)
    with cb.record():
        cb.fill_buffer(hal.Slot(0), 0, 1)
    device.queue_execute([cb], binding_tables=[[buf]])


def _map(device, buf, other, kernels):
    with buf.map(hal.MemoryAccess.READ):
        pass


USES_AFTER_RELEASE = {
    "read": lambda device, buf, other, kernels: device.read(buf),
    "write": lambda device, buf, other, kernels: device.write(buf, bytes(4)),
    "subspan": lambda device, buf, other, kernels: buf.subspan(0, 4),
    "map": _map,
    "fill-target": _use_as_fill_target,
    "copy-source": _use_as_copy_source,
    "copy-target": _use_as_copy_target,
    "update-target": _use_as_update_target,
    "dispatch-binding": _use_as_binding,
    "binding-table-entry": _use_in_binding_table,
    "queue-dealloca": lambda device, buf, other, kernels: device.queue_dealloca(buf),
}


@pytest.mark.parametrize("use", list(USES_AFTER_RELEASE))
def test_use_after_release_is_failed_precondition(device, kernels, use):
    buf = device.allocator.allocate(64, memory_type=MAPPABLE)
    other = device.allocator.allocate(64)
    buf.release()
    with pytest.raises(hal.FailedPreconditionError):
        USES_AFTER_RELEASE[use](device, buf, other, kernels)
    other.release()


def test_subspan_of_released_buffer_is_released(device):
    buf = device.allocator.allocate(64)
    view = buf.subspan(16, 16)
    buf.release()
    assert view.released
    with pytest.raises(hal.FailedPreconditionError):
        device.read(view)


@pytest.mark.parametrize("size", [1 << 50, 1 << 62])
def test_huge_allocation_is_resource_exhausted(make_device, size):
    dev = make_device()
    before = dev.allocator.statistics()
    with pytest.raises(hal.ResourceExhaustedError):
        dev.allocator.allocate(size)
    assert dev.allocator.statistics() == before
    buf = allocate_with(dev, b"\x07" * 16)
    execute(dev, lambda cb: cb.fill_buffer(buf, 0x08, 1))
    assert dev.read(buf) == b"\x08" * 16


@pytest.mark.parametrize(
    "requested",
    [MT.DEVICE_LOCAL, MAPPABLE, MAPPABLE | MT.HOST_COHERENT],
    ids=["device-local", "host-visible", "host-coherent"],
)
def test_memory_type_provides_what_was_asked(device, driver_name, requested):
    buf = device.allocator.allocate(256, memory_type=requested)
    try:
        assert requested & buf.memory_type == requested
        if driver_name in ("local-sync", "local-task"):
            assert buf.memory_type == CPU_MEMORY
        data = random_bytes(256, seed=3)
        device.write(buf, data)
        execute(device, lambda cb: cb.fill_buffer((buf, 0, 4), 0x01020304, 4))
        assert device.read(buf) == b"\x04\x03\x02\x01" + data[4:]
    finally:
        buf.release()


def test_default_usage_is_transfer_dispatch_and_mapping(device):
    buf = device.allocator.allocate(16)
    assert buf.usage == hal.BufferUsage.DEFAULT
    assert hal.BufferUsage.DEFAULT == (
        hal.BufferUsage.TRANSFER | hal.BufferUsage.DISPATCH_STORAGE | hal.BufferUsage.MAPPING
    )
    buf.release()


def test_allocations_do_not_alias(device):
    buffers = [allocate_with(device, bytes([i]) * 100) for i in range(10)]
    for i, buf in enumerate(buffers):
        assert device.read(buf) == bytes([i]) * 100
    for buf in buffers:
        buf.release()
