"""Submissions waiting on values that only a later host signal (or later submission) reaches."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import hal

from .helpers import WAIT_TIMEOUT, allocate_with, assert_not_reached, read_u32, record, safety_signal

SETTLE = 0.05  # long enough for an asynchronous driver to run work it must not run


def add_one(kernels, buf, n):
    return lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=-(-n // 64), constants=[n], bindings=[buf])


def test_submission_waits_for_a_host_signal(device, kernels):
    buf = allocate_with(device, np.zeros(32, np.uint32))
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    with safety_signal(gate, 1):
        start = time.monotonic()
        device.queue_execute([record(device, add_one(kernels, buf, 32))], wait=[(gate, 1)], signal=[(done, 1)])
        assert time.monotonic() - start < 2.0, "queue_execute blocked on an unreached wait"
        time.sleep(SETTLE)
        assert_not_reached(done, 1)
        np.testing.assert_array_equal(read_u32(device, buf), np.zeros(32, np.uint32))
        gate.signal(1)
        done.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.ones(32, np.uint32))


@pytest.mark.parametrize("length", [2, 5, 30])
def test_deferred_chain_runs_in_order_after_the_signal(device, kernels, length):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    gate, chain = device.create_semaphore(0), device.create_semaphore(0)
    with safety_signal(gate, 1):
        device.queue_execute(
            [record(device, lambda cb: cb.fill_buffer(buf, 1000, 4))], wait=[(gate, 1)], signal=[(chain, 1)]
        )
        for i in range(1, length):
            device.queue_execute([record(device, add_one(kernels, buf, 8))], wait=[(chain, i)], signal=[(chain, i + 1)])
        time.sleep(SETTLE)
        assert_not_reached(chain, 1)
        np.testing.assert_array_equal(read_u32(device, buf), np.zeros(8, np.uint32))
        gate.signal(1)
        chain.wait(length, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(8, 1000 + length - 1, np.uint32))


def test_later_submission_unblocks_an_earlier_one(device, kernels):
    buf = allocate_with(device, np.zeros(16, np.uint32))
    link, done = device.create_semaphore(0), device.create_semaphore(0)
    with safety_signal(link, 1):
        # A waits for what B signals; B is submitted after A.
        device.queue_execute([record(device, add_one(kernels, buf, 16))], wait=[(link, 1)], signal=[(done, 1)])
        device.queue_execute([record(device, lambda cb: cb.fill_buffer(buf, 50, 4))], signal=[(link, 1)])
        done.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(16, 51, np.uint32))


@pytest.mark.parametrize("length", [3, 10])
def test_chain_submitted_in_reverse_order(device, kernels, length):
    buf = allocate_with(device, np.zeros(4, np.uint32))
    chain = device.create_semaphore(0)
    with safety_signal(chain, 1):
        for i in reversed(range(1, length)):
            device.queue_execute([record(device, add_one(kernels, buf, 4))], wait=[(chain, i)], signal=[(chain, i + 1)])
        device.queue_execute([record(device, lambda cb: cb.fill_buffer(buf, 7, 4))], signal=[(chain, 1)])
        chain.wait(length, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(4, 7 + length - 1, np.uint32))


def test_ready_work_is_not_held_back_by_deferred_work(device):
    deferred_buf = allocate_with(device, bytes(8))
    ready_buf = allocate_with(device, bytes(8))
    gate, deferred_done, ready_done = (device.create_semaphore(0) for _ in range(3))
    with safety_signal(gate, 1):
        device.queue_execute(
            [record(device, lambda cb: cb.fill_buffer(deferred_buf, 1, 1))],
            wait=[(gate, 1)],
            signal=[(deferred_done, 1)],
        )
        device.queue_execute([record(device, lambda cb: cb.fill_buffer(ready_buf, 2, 1))], signal=[(ready_done, 1)])
        ready_done.wait(1, timeout=WAIT_TIMEOUT)
        assert device.read(ready_buf) == b"\x02" * 8
        assert_not_reached(deferred_done, 1)
        assert device.read(deferred_buf) == bytes(8)
        gate.signal(1)
        deferred_done.wait(1, timeout=WAIT_TIMEOUT)
    assert device.read(deferred_buf) == b"\x01" * 8


def test_signal_from_another_thread_releases_work(device, kernels):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    device.queue_execute([record(device, add_one(kernels, buf, 8))], wait=[(gate, 1)], signal=[(done, 1)])
    threading.Timer(0.02, gate.signal, args=(1,)).start()
    done.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.ones(8, np.uint32))


def test_partially_reached_waits_stay_deferred(device):
    buf = allocate_with(device, bytes(8))
    a, b, done = (device.create_semaphore(0) for _ in range(3))
    with safety_signal(b, 1):
        device.queue_execute(
            [record(device, lambda cb: cb.fill_buffer(buf, 3, 1))], wait=[(a, 1), (b, 1)], signal=[(done, 1)]
        )
        a.signal(1)
        time.sleep(SETTLE)
        assert_not_reached(done, 1)
        assert device.read(buf) == bytes(8)
        b.signal(1)
        done.wait(1, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\x03" * 8


def test_signal_jumping_past_the_waited_value(device):
    buf = allocate_with(device, bytes(4))
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    device.queue_execute([record(device, lambda cb: cb.fill_buffer(buf, 9, 1))], wait=[(gate, 3)], signal=[(done, 1)])
    gate.signal(100)
    done.wait(1, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\x09" * 4


def test_deferred_queue_barrier(device):
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    with safety_signal(gate, 1):
        device.queue_barrier(wait=[(gate, 1)], signal=[(done, 1)])
        time.sleep(SETTLE)
        assert_not_reached(done, 1)
        gate.signal(1)
        done.wait(1, timeout=WAIT_TIMEOUT)


def test_deferred_reusable_submissions(device, kernels):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    cb = record(device, add_one(kernels, buf, 8), mode=hal.CommandBufferMode.REUSABLE)
    gate, chain = device.create_semaphore(0), device.create_semaphore(0)
    with safety_signal(gate, 1):
        for i in range(5):
            device.queue_execute([cb], wait=[(gate, 1), (chain, i)], signal=[(chain, i + 1)])
        time.sleep(SETTLE)
        assert_not_reached(chain, 1)
        np.testing.assert_array_equal(read_u32(device, buf), np.zeros(8, np.uint32))
        gate.signal(1)
        chain.wait(5, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(8, 5, np.uint32))
