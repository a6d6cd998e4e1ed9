"""local-task: a host thread waiting for a queue's work runs it; the worker runs what nobody waits for."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from forking import in_forked_child, needs_fork

import hal
from hal.drivers.local_task import queue_runner


def recording_kernel(threads: list, fail: bool = False):
    def kernel(workgroups, bindings, constants):
        threads.append(threading.current_thread())
        if fail:
            raise RuntimeError("kernel fault")
        np.frombuffer(bindings[0], np.uint32)[:] += 1
    return kernel


class Queue:
    """A device with one kernel that counts its runs in a buffer and notes the thread that ran it."""

    def __init__(self, device: hal.Device, fail: bool = False) -> None:
        self.device = device
        self.threads: list = []
        self.exe = device.load_executable(hal.ExecutableSpec(
            "numpy", recording_kernel(self.threads, fail), [hal.Export("count", (1, 1, 1), 1, 0)]))
        self.buf = device.allocator.allocate(4)
        device.write(self.buf, bytes(4))
        self.sem = device.create_semaphore(0)
        self.value = 0

    def submit(self) -> int:
        cb = self.device.create_command_buffer()
        with cb.record():
            cb.dispatch(self.exe, 0, 1, [], [self.buf])
        self.value += 1
        self.device.queue_execute([cb], signal=[(self.sem, self.value)])
        return self.value

    def count(self) -> int:
        return int(np.frombuffer(self.device.read(self.buf), np.uint32)[0])


@pytest.fixture
def lazy_worker(monkeypatch):
    """A worker that is never woken for new work and looks for it once a minute: only a waiter runs it."""
    monkeypatch.setattr(queue_runner, "_PARK_AFTER_S", float("inf"))
    monkeypatch.setattr(queue_runner, "_POLL_S", 60.0)


def test_a_waiting_thread_runs_the_work_it_waits_for(lazy_worker):
    with hal.create_device("local-task") as device:
        q = Queue(device)
        for _ in range(3):
            q.sem.wait(q.submit())
        assert q.threads == [threading.current_thread()] * 3
        assert q.count() == 3


def test_wait_idle_runs_the_queued_work(lazy_worker):
    with hal.create_device("local-task") as device:
        q = Queue(device)
        for _ in range(5):
            q.submit()
        assert q.sem.current_value == 0  # nobody ran it yet
        device.wait_idle()
        assert q.sem.value == 5 and q.count() == 5
        assert set(q.threads) == {threading.current_thread()}


def test_close_runs_ready_work_before_the_worker_ends(lazy_worker):
    device = hal.create_device("local-task")
    q = Queue(device)
    q.submit()
    q.submit()
    device.close()
    assert q.sem.current_value == 2 and len(q.threads) == 2


def test_work_nobody_waits_for_runs_on_the_worker():
    with hal.create_device("local-task") as device:
        q = Queue(device)
        for _ in range(3):  # a busy queue: the worker polls instead of being woken
            q.sem.wait(q.submit())
        value = q.submit()
        deadline = time.monotonic() + 10
        while q.sem.current_value < value and time.monotonic() < deadline:
            time.sleep(0.0005)
        assert q.sem.value == value and q.count() == value
        assert q.threads[-1].name == "hal-local-task-q0"


def test_a_timed_wait_leaves_the_work_to_the_worker():
    with hal.create_device("local-task") as device:
        q = Queue(device)
        q.sem.wait(q.submit(), timeout=10)  # a deadline: the waiter must not start work that may outlast it
        assert q.threads == [device._runners[0]._thread]


def test_a_failure_in_work_run_by_the_waiter_reaches_it_and_the_device_goes_on(lazy_worker):
    with hal.create_device("local-task") as device:
        bad = Queue(device, fail=True)
        with pytest.raises(hal.AbortedError, match="kernel fault"):
            bad.sem.wait(bad.submit())
        good = Queue(device)
        good.sem.wait(good.submit())
        assert good.count() == 1 and good.threads == [threading.current_thread()]


@pytest.mark.parametrize("waiters", [1, 4])
def test_queue_order_holds_when_waiters_and_the_worker_race(waiters):
    with hal.create_device("local-task") as device:
        order: list[int] = []

        def append_index(workgroups, bindings, constants):
            order.append(constants[0])

        exe = device.load_executable(hal.ExecutableSpec(
            "numpy", append_index, [hal.Export("append", (1, 1, 1), 1, 1)]))
        buf = device.allocator.allocate(4)
        sem = device.create_semaphore(0)
        submit_lock = threading.Lock()
        counter = [0]
        errors: list[BaseException] = []

        def waiter() -> None:
            try:
                for _ in range(100):
                    with submit_lock:  # numbers follow submission order
                        counter[0] += 1
                        index = counter[0]
                        cb = device.create_command_buffer()
                        with cb.record():
                            cb.dispatch(exe, 0, 1, [index], [buf])
                        device.queue_execute([cb], signal=[(sem, index)])
                    if index % 3:
                        sem.wait(index)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=waiter) for _ in range(waiters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        device.wait_idle()
        assert not errors
        assert order == list(range(1, 100 * waiters + 1))


def test_a_device_dropped_without_close_ends_its_workers():
    """Each local-task device dropped unclosed left its worker thread running for good (300 devices
    made and dropped in a loop: 300 threads)."""
    import gc

    def workers() -> int:
        return sum(t.name.startswith("hal-local-task-q") for t in threading.enumerate())

    gc.collect()
    before = workers()
    for _ in range(20):
        device = hal.create_device("local-task", queue_count=2)
        sem = device.create_semaphore(0)
        buffer = device.allocator.allocate(64)
        cb = device.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buffer, 0x5A, 1)
        device.queue_execute([cb], signal=[(sem, 1)])  # work nobody waits for
        del device, sem, buffer, cb
    deadline = time.monotonic() + 10
    while workers() > before and time.monotonic() < deadline:
        gc.collect()  # (a device whose work is still queued is collected once its worker ran it)
        time.sleep(0.01)
    assert workers() <= before


@needs_fork
def test_a_forked_child_runs_the_work_nobody_waits_for_and_timed_waits():
    """A process forked from one with a local-task device has none of its worker threads: work
    queued in the child never ran unless an untimed wait ran it itself (a timed wait timed out)."""
    device = hal.create_device("local-task", queue_count=2)
    buffer = device.allocator.allocate(64)
    sem = device.create_semaphore(0)
    cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.fill_buffer(buffer, 0x5A, 1)
    device.queue_execute([cb], signal=[(sem, 1)])
    sem.wait(1, timeout=30)

    def child() -> tuple:
        device.queue_execute([cb], signal=[(sem, 2)])
        sem.wait(2, timeout=10)  # a timed wait leaves the work to the worker
        device.queue_execute([cb], signal=[(sem, 3)], queue=1)
        deadline = time.monotonic() + 10
        while sem.value < 3 and time.monotonic() < deadline:  # nobody waits: the worker runs it
            time.sleep(0.01)
        value = sem.value
        data = device.read(buffer)
        device.close()
        return value, data

    try:
        assert in_forked_child(child) == (3, b"\x5a" * 64)
        device.queue_execute([cb], signal=[(sem, 2)])  # the parent's device goes on as before
        sem.wait(2, timeout=30)
    finally:
        device.close()
