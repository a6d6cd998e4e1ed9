"""One device used from many threads at once."""

from __future__ import annotations

import threading

import numpy as np

import hal

from .helpers import WAIT_TIMEOUT, allocate_with, read_u32, record

THREADS = 8


def run_threads(target, count=THREADS):
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def wrapper(index):
        try:
            barrier.wait(WAIT_TIMEOUT)
            target(index)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=wrapper, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_TIMEOUT * 2)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    if errors:
        raise errors[0]


def test_threads_submit_and_check_their_own_work(device, kernels):
    n = 500

    def worker(index):
        buf = allocate_with(device, np.zeros(n, np.uint32))
        sem = device.create_semaphore(0)
        for step in range(10):

            def body(cb, step=step):
                cb.dispatch(kernels, "cts_iota", workgroups=8, constants=[n], bindings=[buf])
                cb.execution_barrier()
                for _ in range(index + step):
                    cb.dispatch(kernels, "cts_add_one", workgroups=8, constants=[n], bindings=[buf])
                    cb.execution_barrier()

            device.queue_execute([record(device, body)], wait=[(sem, step)], signal=[(sem, step + 1)])
            sem.wait(step + 1, timeout=WAIT_TIMEOUT)
            np.testing.assert_array_equal(read_u32(device, buf), np.arange(n, dtype=np.uint32) + index + step)
        buf.release()

    run_threads(worker)


def test_threads_chain_without_waiting_in_between(device):
    def worker(index):
        buf = allocate_with(device, bytes(64))
        sem = device.create_semaphore(0)
        for step in range(20):
            cb = record(device, lambda cb, step=step: cb.fill_buffer((buf, step, 1), index + 1, 1))
            device.queue_execute([cb], wait=[(sem, step)], signal=[(sem, step + 1)])
        sem.wait(20, timeout=WAIT_TIMEOUT)
        assert device.read(buf) == bytes([index + 1]) * 20 + bytes(44)
        buf.release()

    run_threads(worker)


def test_threads_share_a_reusable_command_buffer_with_their_own_tables(device, kernels):
    cb = record(
        device,
        lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[16], bindings=[hal.Slot(0)]),
        mode=hal.CommandBufferMode.REUSABLE,
        binding_capacity=1,
    )

    def worker(index):
        buf = allocate_with(device, np.full(16, index * 1000, np.uint32))
        sem = device.create_semaphore(0)
        for step in range(10):
            device.queue_execute([cb], wait=[(sem, step)], signal=[(sem, step + 1)], binding_tables=[[buf]])
        sem.wait(10, timeout=WAIT_TIMEOUT)
        np.testing.assert_array_equal(read_u32(device, buf), np.full(16, index * 1000 + 10, np.uint32))
        buf.release()

    run_threads(worker)


def test_many_threads_wait_on_one_semaphore(device):
    sem = device.create_semaphore(0)
    woke = []
    lock = threading.Lock()

    def waiter(index):
        sem.wait(index + 1, timeout=WAIT_TIMEOUT)
        with lock:
            woke.append(index)

    threads = [threading.Thread(target=waiter, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for value in range(1, THREADS + 1):
        device.queue_barrier(signal=[(sem, value)])
    for thread in threads:
        thread.join(WAIT_TIMEOUT)
    assert sorted(woke) == list(range(THREADS))


def test_threads_wait_for_work_submitted_by_another(device, kernels):
    buf = allocate_with(device, np.zeros(THREADS, np.uint32))
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    device.queue_execute(
        [
            record(
                device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=1, constants=[THREADS], bindings=[buf])
            )
        ],
        wait=[(gate, 1)],
        signal=[(done, 1)],
    )
    seen = []

    def waiter(index):
        if index == 0:
            gate.signal(1)
        done.wait(1, timeout=WAIT_TIMEOUT)
        seen.append(int(read_u32(device, buf)[index]))

    run_threads(waiter)
    assert sorted(seen) == list(range(THREADS))


def test_concurrent_allocation_statistics_balance(make_device):
    dev = make_device()
    base = dev.allocator.statistics()

    def worker(index):
        for size in range(1, 200):
            buf = dev.allocator.allocate(size)
            buf.release()

    run_threads(worker)
    stats = dev.allocator.statistics()
    assert stats.live_buffers == base.live_buffers
    assert stats.bytes_allocated == base.bytes_allocated


def test_host_signals_from_many_threads_release_deferred_work(device):
    gates = [device.create_semaphore(0) for _ in range(THREADS)]
    done = device.create_semaphore(0)
    buf = allocate_with(device, bytes(THREADS))
    cb = record(device, lambda cb: cb.fill_buffer(buf, 0xEE, 1))
    device.queue_execute([cb], wait=[(g, 1) for g in gates], signal=[(done, 1)])
    run_threads(lambda index: gates[index].signal(1))
    done.wait(1, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\xee" * THREADS
    hal.wait_all([(g, 1) for g in gates], timeout=0)
