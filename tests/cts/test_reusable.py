"""Reusable command buffers and binding tables (hal.Slot)."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import WAIT_TIMEOUT, allocate_with, random_bytes, read_u32, record, submit_and_wait

Mode = hal.CommandBufferMode
Slot = hal.Slot


def reusable(device, body, binding_capacity=0):
    return record(device, body, mode=Mode.REUSABLE, binding_capacity=binding_capacity)


@pytest.mark.parametrize("times", [1, 2, 5, 25, 100])
def test_resubmit_chained_by_a_semaphore(device, kernels, times):
    buf = allocate_with(device, np.zeros(100, np.uint32))
    cb = reusable(device, lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=2, constants=[100], bindings=[buf]))
    sem = device.create_semaphore(0)
    for i in range(times):
        device.queue_execute([cb], wait=[(sem, i)], signal=[(sem, i + 1)])
    sem.wait(times, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(100, times, np.uint32))


def test_resubmit_after_waiting_each_time(device, kernels):
    buf = allocate_with(device, np.zeros(16, np.uint32))

    def body(cb):
        cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[16], bindings=[buf])
        cb.execution_barrier()
        cb.copy_buffer((buf, 0, 32), (buf, 32, 32))

    cb = reusable(device, body)
    for i in range(1, 6):
        submit_and_wait(device, [cb])
        # Words 8..15 are incremented, then overwritten by the copy of words 0..7.
        np.testing.assert_array_equal(read_u32(device, buf), np.full(16, i, np.uint32))


def test_slot_binds_each_submission_to_its_table(device, kernels):
    a = allocate_with(device, np.zeros(32, np.uint32))
    b = allocate_with(device, np.full(32, 100, np.uint32))
    cb = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[32], bindings=[Slot(0)]),
        binding_capacity=1,
    )
    for table in ([a], [b], [a], [a]):
        submit_and_wait(device, [cb], binding_tables=[table])
    np.testing.assert_array_equal(read_u32(device, a), np.full(32, 3, np.uint32))
    np.testing.assert_array_equal(read_u32(device, b), np.full(32, 101, np.uint32))


def test_many_tables_through_one_recording(device, kernels):
    buffers = [allocate_with(device, np.zeros(50, np.uint32)) for _ in range(10)]
    cb = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_fill_constant", workgroups=1, constants=[50, 0], bindings=[Slot(0)]),
        binding_capacity=1,
    )
    sem = device.create_semaphore(0)
    for i, buf in enumerate(buffers):
        device.queue_execute([cb], wait=[(sem, i)], signal=[(sem, i + 1)], binding_tables=[[buf]])
    sem.wait(len(buffers), timeout=WAIT_TIMEOUT)
    for buf in buffers:
        np.testing.assert_array_equal(read_u32(device, buf), np.zeros(50, np.uint32))
    # Same recording, different constant-free kernel: prove each table really was used.
    cb2 = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=1, constants=[50], bindings=[Slot(0)]),
        binding_capacity=1,
    )
    for i, buf in enumerate(buffers):
        device.queue_execute(
            [cb2], wait=[(sem, len(buffers) + i)], signal=[(sem, len(buffers) + i + 1)], binding_tables=[[buf]]
        )
    sem.wait(2 * len(buffers), timeout=WAIT_TIMEOUT)
    for buf in buffers:
        np.testing.assert_array_equal(read_u32(device, buf), np.arange(50, dtype=np.uint32))


@pytest.mark.parametrize(("slot_offset", "slot_length"), [(0, None), (16, None), (16, 64), (0, 4), (252, 4)])
def test_slot_subrange(device, kernels, slot_offset, slot_length):
    base = np.arange(64, dtype=np.uint32)
    buf = allocate_with(device, base)
    length = 256 - slot_offset if slot_length is None else slot_length
    n = length // 4
    cb = reusable(
        device,
        lambda cb: cb.dispatch(
            kernels, "cts_add_one", workgroups=2, constants=[n], bindings=[Slot(0, slot_offset, slot_length)]
        ),
        binding_capacity=1,
    )
    submit_and_wait(device, [cb], binding_tables=[[buf]])
    expected = base.copy()
    expected[slot_offset // 4 : slot_offset // 4 + n] += 1
    np.testing.assert_array_equal(read_u32(device, buf), expected)


@pytest.mark.parametrize(
    ("entry", "slot", "first_word", "words"),
    [((64, 128), (0, None), 16, 32), ((64, 128), (16, 32), 20, 8), ((64, None), (8, None), 18, 46)],
)
def test_slot_inside_a_table_range(device, kernels, entry, slot, first_word, words):
    base = np.arange(64, dtype=np.uint32)
    buf = allocate_with(device, base)
    cb = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[words], bindings=[Slot(0, *slot)]),
        binding_capacity=1,
    )
    submit_and_wait(device, [cb], binding_tables=[[(buf, *entry)]])
    expected = base.copy()
    expected[first_word : first_word + words] += 1
    np.testing.assert_array_equal(read_u32(device, buf), expected)


def test_slots_in_transfer_commands(device):
    src_bytes = random_bytes(64, seed=1)
    src = allocate_with(device, src_bytes)
    dst = allocate_with(device, bytes(128))

    def body(cb):
        cb.fill_buffer(Slot(1), 0xAA, 1)
        cb.execution_barrier()
        cb.copy_buffer(Slot(0, 0, 32), Slot(1, 8, 32))
        cb.execution_barrier()
        cb.update_buffer(b"\x01\x02\x03\x04", Slot(1, 60, 4))

    cb = reusable(device, body, binding_capacity=2)
    submit_and_wait(device, [cb], binding_tables=[[src, (dst, 32, 64)]])
    expected = bytearray(128)
    expected[32:96] = b"\xaa" * 64
    expected[40:72] = src_bytes[:32]
    expected[92:96] = b"\x01\x02\x03\x04"
    assert device.read(dst) == bytes(expected)
    assert device.read(src) == src_bytes


def test_slots_and_fixed_buffers_mixed(device, kernels):
    fixed = allocate_with(device, np.arange(40, dtype=np.uint32))
    out_a = allocate_with(device, np.zeros(40, np.uint32))
    out_b = allocate_with(device, np.zeros(40, np.uint32))
    cb = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_mix3", workgroups=1, constants=[40], bindings=[fixed, Slot(1), Slot(0)]),
        binding_capacity=2,
    )
    twos = allocate_with(device, np.full(40, 2, np.uint32))
    submit_and_wait(device, [cb], binding_tables=[[out_a, twos]])
    submit_and_wait(device, [cb], binding_tables=[[out_b, out_a]])
    a_expected = np.arange(40, dtype=np.uint32) + 4
    np.testing.assert_array_equal(read_u32(device, out_a), a_expected)
    np.testing.assert_array_equal(read_u32(device, out_b), np.arange(40, dtype=np.uint32) + 2 * a_expected)


def test_table_may_be_longer_than_capacity(device, kernels):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    other = allocate_with(device, np.zeros(8, np.uint32))
    cb = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[8], bindings=[Slot(0)]),
        binding_capacity=1,
    )
    submit_and_wait(device, [cb], binding_tables=[[buf, other]])
    np.testing.assert_array_equal(read_u32(device, buf), np.ones(8, np.uint32))
    np.testing.assert_array_equal(read_u32(device, other), np.zeros(8, np.uint32))


def test_tables_for_several_command_buffers(device, kernels):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    plain = record(device, lambda cb: cb.fill_buffer(buf, 10, 4))
    slotted = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[8], bindings=[Slot(0)]),
        binding_capacity=1,
    )
    submit_and_wait(device, [plain, slotted, slotted], binding_tables=[None, [buf], [buf]])
    np.testing.assert_array_equal(read_u32(device, buf), np.full(8, 12, np.uint32))


@pytest.mark.parametrize(
    ("entry", "slot"), [((0, None), (60, 8)), ((32, 32), (0, 36)), ((32, 32), (32, 4)), ((0, None), (64, 4))]
)
def test_slot_range_outside_table_entry_is_out_of_range_at_submit(device, kernels, entry, slot):
    buf = allocate_with(device, np.zeros(16, np.uint32))
    cb = reusable(
        device,
        lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[1], bindings=[Slot(0, *slot)]),
        binding_capacity=1,
    )
    sem = device.create_semaphore(0)
    with pytest.raises(hal.OutOfRangeError):
        device.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[(buf, *entry)]])
    assert sem.value == 0 and sem.failure is None
    np.testing.assert_array_equal(read_u32(device, buf), np.zeros(16, np.uint32))


@pytest.mark.parametrize("tables", [None, [None], [[]], "missing-entry"])
def test_missing_or_short_binding_table_is_invalid_argument(device, kernels, tables):
    a = allocate_with(device, np.zeros(4, np.uint32))
    cb = reusable(
        device,
        lambda cb: cb.dispatch(
            kernels, "cts_copy_offset", workgroups=1, constants=[4, 0, 0], bindings=[Slot(0), Slot(1)]
        ),
        binding_capacity=2,
    )
    if tables == "missing-entry":
        tables = [[a]]
    with pytest.raises(hal.InvalidArgumentError):
        device.queue_execute([cb], binding_tables=tables)


def test_binding_tables_count_must_match_command_buffers(device):
    buf = allocate_with(device, bytes(4))
    cb = reusable(device, lambda cb: cb.fill_buffer(Slot(0), 1, 1), binding_capacity=1)
    with pytest.raises(hal.InvalidArgumentError):
        device.queue_execute([cb, cb], binding_tables=[[buf]])
    assert device.read(buf) == bytes(4)


@pytest.mark.parametrize(("capacity", "index"), [(1, 1), (2, 2), (2, 5)])
def test_slot_index_beyond_capacity_is_invalid_argument(device, capacity, index):
    cb = device.create_command_buffer(mode=Mode.REUSABLE, binding_capacity=capacity)
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.fill_buffer(Slot(index), 0, 1)


def test_slot_without_binding_capacity_is_invalid_argument(device, kernels):
    cb = device.create_command_buffer(mode=Mode.REUSABLE)
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[1], bindings=[Slot(0)])
