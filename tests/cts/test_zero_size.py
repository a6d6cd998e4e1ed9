"""Empty buffers and zero-length commands: valid, and no-ops that touch nothing around them."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import MAPPABLE, WAIT_TIMEOUT, allocate_with, execute, random_bytes, read_u32, record, submit_and_wait

ORIGINAL = random_bytes(64, seed=10)


@pytest.mark.parametrize("memory_type", [hal.MemoryType.DEVICE_LOCAL, MAPPABLE], ids=["device", "host"])
def test_allocate_empty_buffer(make_device, memory_type):
    dev = make_device()
    before = dev.allocator.statistics()
    buf = dev.allocator.allocate(0, memory_type=memory_type)
    assert buf.size == 0 and not buf.released
    stats = dev.allocator.statistics()
    assert stats.live_buffers == before.live_buffers + 1
    assert stats.bytes_allocated == before.bytes_allocated
    assert dev.read(buf) == b""
    dev.write(buf, b"")
    buf.release()
    assert dev.allocator.statistics() == hal.AllocatorStatistics(before.bytes_allocated, stats.bytes_peak,
                                                                 before.live_buffers)


def test_empty_buffer_maps_to_an_empty_view(device):
    buf = device.allocator.allocate(0, memory_type=MAPPABLE)
    with buf.map(hal.MemoryAccess.WRITE) as view:
        assert len(view) == 0
    buf.release()


def test_empty_buffers_do_not_alias_each_other_or_others(device):
    empties = [device.allocator.allocate(0) for _ in range(4)]
    full = allocate_with(device, ORIGINAL)
    execute(device, lambda cb: [cb.fill_buffer(e, 0xFF, 1) for e in empties])
    assert device.read(full) == ORIGINAL
    for e in empties:
        e.release()


@pytest.mark.parametrize("pattern_length", [1, 2, 4])
def test_zero_length_fill_is_a_no_op(device, pattern_length):
    buf = allocate_with(device, ORIGINAL)
    execute(device, lambda cb: cb.fill_buffer((buf, 8, 0), 0xAB, pattern_length))
    assert device.read(buf) == ORIGINAL


def test_zero_length_copy_is_a_no_op(device):
    src, dst = allocate_with(device, ORIGINAL), allocate_with(device, bytes(64))
    execute(device, lambda cb: cb.copy_buffer((src, 8, 0), (dst, 16, 0)))
    assert device.read(dst) == bytes(64)


def test_zero_length_copy_at_the_end_of_a_buffer(device):
    src, dst = allocate_with(device, ORIGINAL), allocate_with(device, bytes(64))
    execute(device, lambda cb: cb.copy_buffer((src, 64, 0), (dst, 64, 0)))
    assert device.read(dst) == bytes(64) and device.read(src) == ORIGINAL


def test_empty_update_is_a_no_op(device):
    buf = allocate_with(device, ORIGINAL)
    execute(device, lambda cb: cb.update_buffer(b"", (buf, 32)))
    execute(device, lambda cb: cb.update_buffer(np.zeros(0, np.uint32), buf))
    assert device.read(buf) == ORIGINAL


def test_zero_length_commands_between_real_ones(device, kernels):
    buf = allocate_with(device, bytes(64))
    empty = device.allocator.allocate(0)

    def body(cb):
        cb.fill_buffer((buf, 0, 0), 0xEE, 1)
        cb.dispatch(kernels, "cts_add_one", 1, [16], [buf])
        cb.copy_buffer(empty, (buf, 4, 0))
        cb.update_buffer(b"", empty)
        cb.execution_barrier()
        cb.dispatch(kernels, "cts_add_one", 1, [16], [buf])

    execute(device, body)
    np.testing.assert_array_equal(read_u32(device, buf)[:16], np.full(16, 2, np.uint32))
    empty.release()


def test_zero_length_table_entry_through_a_slot(device):
    buf = allocate_with(device, ORIGINAL)
    cb = record(device, lambda cb: cb.fill_buffer(hal.Slot(0), 0x11, 1), mode=hal.CommandBufferMode.REUSABLE,
                binding_capacity=1)
    submit_and_wait(device, [cb], binding_tables=[[(buf, 16, 0)]])
    assert device.read(buf) == ORIGINAL


def test_queue_alloca_of_zero_bytes(device):
    sem = device.create_semaphore(0)
    buf = device.queue_alloca(0, signal=[(sem, 1)])
    sem.wait(1, timeout=WAIT_TIMEOUT)
    assert buf.size == 0
    device.queue_dealloca(buf, wait=[(sem, 1)], signal=[(sem, 2)])
    sem.wait(2, timeout=WAIT_TIMEOUT)
    assert buf.released


def test_read_and_write_of_zero_bytes_inside_a_buffer(device):
    buf = allocate_with(device, ORIGINAL)
    device.write(buf, b"", 64)
    assert device.read(buf, 64, 0) == b"" and device.read(buf, 10, 0) == b""
    assert device.read(buf) == ORIGINAL
