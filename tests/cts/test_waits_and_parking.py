"""Multi-waits fail fast, waits leave nothing behind, parking stays cheap.

- wait_all raises AbortedError at once when one of its semaphores has failed or fails during
  the wait; it never waits for the others to time out nor hangs with timeout=None.
- wait_any and wait_all that time out leave no listener registered: many of them do not grow memory.
- Submissions made in reverse order (each waiting on a value a later one signals) all run
  (parking each costs O(1): benchmarks/soak.py measures it).
"""

from __future__ import annotations

import gc
import sys
import threading
import time

import numpy as np
import pytest

import hal

from .helpers import WAIT_TIMEOUT, allocate_with, read_u32, record

FAST = 10.0  # "at once": far below the waits' own timeouts, far above any scheduling delay


def _fail_later(sem: hal.Semaphore, after: float = 0.05) -> threading.Timer:
    timer = threading.Timer(after, lambda: sem.fail("failed during the wait"))
    timer.start()
    return timer


def test_wait_all_raises_at_once_for_a_semaphore_failed_before(device):
    reached, failed, never = (device.create_semaphore(0) for _ in range(3))
    reached.signal(1)
    failed.fail("failed before the wait")
    start = time.monotonic()
    with pytest.raises(hal.AbortedError) as info:
        hal.wait_all([(never, 1), (reached, 1), (failed, 1)], timeout=None)
    assert time.monotonic() - start < FAST
    assert "failed before the wait" in str(info.value)


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_wait_all_raises_at_once_for_a_semaphore_failing_during_the_wait(device, timeout):
    never, failing = device.create_semaphore(0), device.create_semaphore(0)
    _fail_later(failing)
    start = time.monotonic()
    with pytest.raises(hal.AbortedError) as info:
        hal.wait_all([(never, 1), (failing, 1)], timeout=timeout)
    assert time.monotonic() - start < FAST
    assert "failed during the wait" in str(info.value)
    assert failing.failure is not None


def test_wait_all_fails_fast_when_queued_work_fails(device):
    gate, never, done = (device.create_semaphore(0) for _ in range(3))
    device.queue_barrier(wait=[(gate, 1)], signal=[(done, 1)])
    threading.Timer(0.05, lambda: gate.fail("the upstream failure")).start()
    start = time.monotonic()
    with pytest.raises(hal.AbortedError) as info:
        hal.wait_all([(never, 1), (done, 1)], timeout=None)
    assert time.monotonic() - start < FAST
    assert "the upstream failure" in str(info.value)


def test_wait_all_waits_for_every_fence(device):
    sems = [device.create_semaphore(0) for _ in range(4)]
    for i, sem in enumerate(sems):
        threading.Timer(0.01 * (i + 1), lambda sem=sem: sem.signal(2)).start()
    hal.wait_all([(sem, 2) for sem in sems], timeout=WAIT_TIMEOUT)
    assert all(sem.value == 2 for sem in sems)


def test_wait_any_raises_for_a_semaphore_failing_during_the_wait(device):
    never, failing = device.create_semaphore(0), device.create_semaphore(0)
    _fail_later(failing)
    with pytest.raises(hal.AbortedError):
        hal.wait_any([(never, 1), (failing, 1)], timeout=WAIT_TIMEOUT)


def test_wait_all_times_out_with_deadline_exceeded(device):
    reached, never = device.create_semaphore(1), device.create_semaphore(0)
    with pytest.raises(hal.DeadlineExceededError):
        hal.wait_all([(reached, 1), (never, 1), (never, 2)], timeout=0.01)


def _growth(call, count: int) -> int:
    """Memory blocks still allocated after ``count`` calls (the interpreter's own count: cheap)."""
    for _ in range(100):
        call()  # warm up caches
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(count):
        call()
    gc.collect()
    return sys.getallocatedblocks() - before


def _timed_out(call):
    def run() -> None:
        try:
            call()
        except hal.DeadlineExceededError:
            pass
    return run


def test_timed_out_wait_any_calls_leave_nothing_behind(device):
    sem, other = device.create_semaphore(0), device.create_semaphore(0)
    growth = _growth(_timed_out(lambda: hal.wait_any([(sem, 1), (other, 5)], timeout=0)), 10_000)
    assert growth < 500, f"10,000 timed-out wait_any calls kept {growth} memory blocks"
    sem.signal(1)
    assert hal.wait_any([(sem, 1), (other, 5)], timeout=WAIT_TIMEOUT) == 0


def test_timed_out_wait_all_calls_leave_nothing_behind(device):
    sem, other = device.create_semaphore(0), device.create_semaphore(0)
    growth = _growth(_timed_out(lambda: hal.wait_all([(sem, 1), (other, 1)], timeout=0)), 10_000)
    assert growth < 500, f"10,000 timed-out wait_all calls kept {growth} memory blocks"


def test_cancelled_listeners_do_not_fire_later(device):
    sem = device.create_semaphore(0)
    fired = []
    tokens = [sem.notify_at(1, fired.append) for _ in range(100)]
    for token in tokens:
        sem.cancel_notify(token)
    kept = sem.notify_at(1, fired.append)
    sem.signal(1)
    assert fired == [None] and kept is not None


def _reverse_chain(device, count: int) -> float:
    """``count`` barriers, each waiting on the value the next one signals; the last is released by the host."""
    sem = device.create_semaphore(0)
    start = time.perf_counter()
    for i in range(count, 0, -1):
        device.queue_barrier(wait=[(sem, i)], signal=[(sem, i + 1)])
    sem.signal(1)
    sem.wait(count + 1, timeout=WAIT_TIMEOUT)
    return time.perf_counter() - start


def test_reverse_order_submissions_all_run(device, kernels):
    buf = allocate_with(device, bytes(64))
    sem = device.create_semaphore(0)
    count = 300
    for i in range(count, 0, -1):
        cb = record(device, lambda cb: cb.dispatch(kernels, "cts_add_one", 1, [16], [buf]))
        device.queue_execute([cb], wait=[(sem, i)], signal=[(sem, i + 1)])
    sem.signal(1)
    sem.wait(count + 1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf)[:16], np.full(16, count, np.uint32))


def test_six_thousand_reverse_order_submissions_complete(device):
    """The size at which rebuilding the parked set per new submission took seconds."""
    assert _reverse_chain(device, 6000) < WAIT_TIMEOUT
