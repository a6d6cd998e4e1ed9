"""Ordering through semaphores, barriers and several command buffers per submission."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import WAIT_TIMEOUT, allocate_with, read_u32, record, submit_and_wait


def add_one(kernels, buf, n):
    return lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=-(-n // 64), constants=[n], bindings=[buf])


@pytest.mark.parametrize("length", [1, 10, 100])
def test_chain_of_submissions_through_one_semaphore(device, kernels, length):
    buf = allocate_with(device, np.zeros(64, np.uint32))
    sem = device.create_semaphore(0)
    for i in range(length):
        device.queue_execute([record(device, add_one(kernels, buf, 64))], wait=[(sem, i)], signal=[(sem, i + 1)])
    sem.wait(length, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(64, length, np.uint32))


def test_chain_alternating_between_semaphores(device):
    buf = allocate_with(device, bytes(20))
    a, b = device.create_semaphore(0), device.create_semaphore(0)
    fences = [(a, 1), (b, 1), (a, 2), (b, 2), (a, 3)]
    previous = []
    for step, fence in enumerate(fences):
        cb = record(device, lambda cb, step=step: cb.update_buffer(bytes([step + 1]) * (step + 1), (buf, 0, step + 1)))
        device.queue_execute([cb], wait=previous, signal=[fence])
        previous = [fence]
    a.wait(3, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\x05" * 5 + bytes(15)


def test_write_then_transform_then_copy_in_one_buffer(device, kernels):
    n = 200
    a = allocate_with(device, np.zeros(n, np.uint32))
    b = allocate_with(device, np.zeros(n, np.uint32))

    def body(cb):
        cb.dispatch(kernels, "cts_iota", workgroups=4, constants=[n], bindings=[a])
        cb.execution_barrier()
        cb.dispatch(kernels, "cts_mix3", workgroups=4, constants=[n], bindings=[a, a, b])
        cb.execution_barrier()
        cb.copy_buffer(b, a)

    submit_and_wait(device, [record(device, body)])
    expected = np.arange(n, dtype=np.uint32) * 3
    np.testing.assert_array_equal(read_u32(device, a), expected)
    np.testing.assert_array_equal(read_u32(device, b), expected)


@pytest.mark.parametrize("count", [2, 3, 8])
def test_command_buffers_of_one_submission_run_in_order(device, kernels, count):
    buf = allocate_with(device, np.zeros(16, np.uint32))
    cbs = [record(device, lambda cb: cb.fill_buffer(buf, 100, 4))]
    cbs += [record(device, add_one(kernels, buf, 16)) for _ in range(count - 1)]
    submit_and_wait(device, cbs)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(16, 100 + count - 1, np.uint32))


def test_queue_barrier_links_two_submissions(device, kernels):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    s1, s2, s3 = (device.create_semaphore(0) for _ in range(3))
    device.queue_execute([record(device, lambda cb: cb.fill_buffer(buf, 41, 4))], signal=[(s1, 1)])
    device.queue_barrier(wait=[(s1, 1)], signal=[(s2, 1)])
    device.queue_execute([record(device, add_one(kernels, buf, 8))], wait=[(s2, 1)], signal=[(s3, 1)])
    s3.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(8, 42, np.uint32))


def test_empty_submission_orders_like_a_barrier(device, kernels):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    s1, s2, s3 = (device.create_semaphore(0) for _ in range(3))
    device.queue_execute([record(device, lambda cb: cb.fill_buffer(buf, 7, 4))], signal=[(s1, 1)])
    device.queue_execute([], wait=[(s1, 1)], signal=[(s2, 1)])
    device.queue_execute([record(device, add_one(kernels, buf, 8))], wait=[(s2, 1)], signal=[(s3, 1)])
    s3.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(8, 8, np.uint32))


def test_fan_out_and_fan_in(device, kernels):
    n = 128
    source = allocate_with(device, np.zeros(n, np.uint32))
    left = allocate_with(device, np.zeros(n, np.uint32))
    right = allocate_with(device, np.zeros(n, np.uint32))
    start, left_done, right_done, end = (device.create_semaphore(0) for _ in range(4))
    groups = -(-n // 64)
    device.queue_execute(
        [
            record(
                device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=groups, constants=[n], bindings=[source])
            )
        ],
        signal=[(start, 1)],
    )

    def branch(target, extra):
        def body(cb):
            cb.copy_buffer(source, target)
            cb.execution_barrier()
            for _ in range(extra):
                cb.dispatch(kernels, "cts_add_one", workgroups=groups, constants=[n], bindings=[target])
                cb.execution_barrier()

        return record(device, body)

    device.queue_execute([branch(left, 1)], wait=[(start, 1)], signal=[(left_done, 1)])
    device.queue_execute([branch(right, 5)], wait=[(start, 1)], signal=[(right_done, 1)])
    device.queue_execute(
        [
            record(
                device,
                lambda cb: cb.dispatch(
                    kernels, "cts_mix3", workgroups=groups, constants=[n], bindings=[left, right, source]
                ),
            )
        ],
        wait=[(left_done, 1), (right_done, 1)],
        signal=[(end, 1)],
    )
    end.wait(1, timeout=WAIT_TIMEOUT)
    iota = np.arange(n, dtype=np.uint32)
    np.testing.assert_array_equal(read_u32(device, source), (iota + 1) + 2 * (iota + 5) + 3 * iota)


def test_wait_on_several_fences(device):
    buf = allocate_with(device, bytes(8))
    a, b, done = (device.create_semaphore(0) for _ in range(3))
    device.queue_execute(
        [record(device, lambda cb: cb.fill_buffer(buf, 0x0F, 1))], wait=[(a, 1), (b, 2)], signal=[(done, 1)]
    )
    a.signal(1)
    b.signal(1)
    with pytest.raises(hal.DeadlineExceededError):
        done.wait(1, timeout=0.02)
    assert device.read(buf) == bytes(8)
    b.signal(2)
    done.wait(1, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\x0f" * 8


def test_wait_idle_covers_every_submission(device, kernels):
    buf = allocate_with(device, np.zeros(64, np.uint32))
    sem = device.create_semaphore(0)
    for i in range(20):
        device.queue_execute([record(device, add_one(kernels, buf, 64))], wait=[(sem, i)], signal=[(sem, i + 1)])
    device.wait_idle(timeout=WAIT_TIMEOUT)
    assert sem.value == 20
    np.testing.assert_array_equal(read_u32(device, buf), np.full(64, 20, np.uint32))


def test_wait_idle_times_out_on_blocked_work(make_device):
    dev = make_device()
    gate = dev.create_semaphore(0)
    dev.queue_barrier(wait=[(gate, 1)])
    with pytest.raises(hal.DeadlineExceededError):
        dev.wait_idle(timeout=0.02)
    gate.signal(1)
    dev.wait_idle(timeout=WAIT_TIMEOUT)


def test_results_visible_to_host_after_wait(device, kernels):
    n = 4096
    buf = allocate_with(device, np.zeros(n, np.uint32))
    for round_ in range(1, 6):
        submit_and_wait(device, [record(device, add_one(kernels, buf, n))])
        np.testing.assert_array_equal(read_u32(device, buf), np.full(n, round_, np.uint32))
