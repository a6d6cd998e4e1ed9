"""Timeline semaphores: values, signal, wait, timeouts, failure, wait_all / wait_any."""

from __future__ import annotations

import threading
import time

import pytest

import hal

from .helpers import WAIT_TIMEOUT


@pytest.mark.parametrize("initial", [0, 1, 7, 2**40])
def test_initial_value(device, initial):
    sem = device.create_semaphore(initial)
    assert sem.value == initial
    assert sem.failure is None


def test_default_initial_value_is_zero(device):
    assert device.create_semaphore().value == 0


def test_initial_value_by_keyword(device):
    assert device.create_semaphore(initial=4).value == 4


def test_signal_raises_the_value(device):
    sem = device.create_semaphore(0)
    for value in (1, 2, 5, 100, 2**33):
        sem.signal(value)
        assert sem.value == value


@pytest.mark.parametrize(("current", "value"), [(0, 0), (5, 5), (5, 4), (5, 0), (2**40, 2**39)])
def test_signal_not_above_current_is_invalid_argument(device, current, value):
    sem = device.create_semaphore(current)
    with pytest.raises(hal.InvalidArgumentError) as info:
        sem.signal(value)
    assert str(value) in str(info.value)
    assert sem.value == current


@pytest.mark.parametrize(("current", "target"), [(0, 0), (3, 1), (3, 3)])
def test_wait_on_reached_value_returns_at_once(device, current, target):
    sem = device.create_semaphore(current)
    start = time.monotonic()
    assert sem.wait(target) is None
    assert sem.wait(target, timeout=0) is None
    assert time.monotonic() - start < 1.0


def test_wait_with_zero_timeout_polls(device):
    sem = device.create_semaphore(0)
    with pytest.raises(hal.DeadlineExceededError):
        sem.wait(1, timeout=0)
    sem.signal(1)
    sem.wait(1, timeout=0)


@pytest.mark.parametrize("timeout", [0.01, 0.05])
def test_wait_times_out(device, timeout):
    sem = device.create_semaphore(0)
    start = time.monotonic()
    with pytest.raises(hal.DeadlineExceededError):
        sem.wait(1, timeout=timeout)
    assert time.monotonic() - start >= timeout * 0.9
    assert sem.value == 0 and sem.failure is None


def test_wait_wakes_on_signal_from_another_thread(device):
    sem = device.create_semaphore(0)
    timer = threading.Timer(0.05, sem.signal, args=(3,))
    timer.start()
    sem.wait(2, timeout=WAIT_TIMEOUT)
    assert sem.value == 3
    timer.join()


def test_value_is_monotonic_under_concurrent_signals(device):
    sem = device.create_semaphore(0)
    seen = []
    done = threading.Event()

    def reader():
        while not done.is_set():
            seen.append(sem.value)

    thread = threading.Thread(target=reader)
    thread.start()
    for value in range(1, 2001):
        sem.signal(value)
    done.set()
    thread.join()
    assert seen == sorted(seen)
    assert sem.value == 2000


def test_fail_with_message(device):
    sem = device.create_semaphore(0)
    sem.fail("the device caught fire")
    assert sem.failure is not None
    assert "the device caught fire" in str(sem.failure)
    with pytest.raises(hal.AbortedError) as info:
        sem.wait(1, timeout=WAIT_TIMEOUT)
    assert "the device caught fire" in str(info.value)
    with pytest.raises(hal.AbortedError):
        _ = sem.value


def test_fail_with_exception_is_the_cause(device):
    sem = device.create_semaphore(2)
    cause = ValueError("bad input tensor")
    sem.fail(cause)
    assert sem.failure is cause
    with pytest.raises(hal.AbortedError) as info:
        sem.wait(3, timeout=WAIT_TIMEOUT)
    assert info.value.__cause__ is cause
    assert "bad input tensor" in str(info.value)


@pytest.mark.parametrize("bad", [None, 1.5, "3", -1, 2**64, object()])
def test_driver_facing_calls_refuse_bad_arguments_and_leave_the_semaphore_usable(device, bad):
    """advance / notify_at / cancel_notify / fail_from_device are public names: a wrong argument
    is an InvalidArgumentError, and the semaphore neither fails nor changes."""
    sem = device.create_semaphore(1)
    with pytest.raises(hal.InvalidArgumentError):
        sem.advance(bad)
    with pytest.raises(hal.InvalidArgumentError):
        sem.notify_at(bad, lambda failure: None)
    with pytest.raises(hal.InvalidArgumentError):
        sem.notify_at(2, bad)
    if bad is not None and not isinstance(bad, int):
        with pytest.raises(hal.InvalidArgumentError):
            sem.cancel_notify(bad)
    if not isinstance(bad, str):
        with pytest.raises(hal.InvalidArgumentError):
            sem.fail_from_device(bad)
    assert sem.failure is None and sem.value == 1
    reached = []
    token = sem.notify_at(3, reached.append)
    sem.signal(3)
    sem.cancel_notify(token)
    assert reached == [None] and sem.value == 3


def test_fail_wakes_a_blocked_waiter(device):
    sem = device.create_semaphore(0)
    errors = []

    def waiter():
        try:
            sem.wait(1, timeout=WAIT_TIMEOUT)
        except hal.AbortedError as err:
            errors.append(err)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.02)
    sem.fail(RuntimeError("stop"))
    thread.join(WAIT_TIMEOUT)
    assert len(errors) == 1 and isinstance(errors[0].__cause__, RuntimeError)


def test_failed_semaphore_waits_even_for_reached_values_raise(device):
    sem = device.create_semaphore(5)
    sem.fail("late failure")
    with pytest.raises(hal.AbortedError):
        sem.wait(1, timeout=0)


def test_wait_all(device):
    a, b, c = (device.create_semaphore(0) for _ in range(3))
    a.signal(1)
    b.signal(2)
    with pytest.raises(hal.DeadlineExceededError):
        hal.wait_all([(a, 1), (b, 2), (c, 1)], timeout=0.01)
    threading.Timer(0.02, c.signal, args=(1,)).start()
    hal.wait_all([(a, 1), (b, 2), (c, 1)], timeout=WAIT_TIMEOUT)


def test_wait_all_of_nothing_returns(device):
    hal.wait_all([], timeout=0)


def test_wait_all_with_a_failed_semaphore_is_aborted(device):
    a, b = device.create_semaphore(1), device.create_semaphore(0)
    b.fail("b failed")
    with pytest.raises(hal.AbortedError) as info:
        hal.wait_all([(a, 1), (b, 1)], timeout=WAIT_TIMEOUT)
    assert "b failed" in str(info.value)


@pytest.mark.parametrize("reached", [0, 1, 2])
def test_wait_any_returns_index_of_the_reached_fence(device, reached):
    sems = [device.create_semaphore(0) for _ in range(3)]
    sems[reached].signal(4)
    assert hal.wait_any([(s, 4) for s in sems], timeout=WAIT_TIMEOUT) == reached


def test_wait_any_with_several_reached_returns_the_first(device):
    sems = [device.create_semaphore(v) for v in (0, 3, 3)]
    assert hal.wait_any([(s, 2) for s in sems], timeout=0) == 1


def test_wait_any_wakes_on_a_later_signal(device):
    a, b = device.create_semaphore(0), device.create_semaphore(0)
    threading.Timer(0.02, b.signal, args=(1,)).start()
    assert hal.wait_any([(a, 1), (b, 1)], timeout=WAIT_TIMEOUT) == 1


def test_wait_any_times_out(device):
    a, b = device.create_semaphore(0), device.create_semaphore(0)
    with pytest.raises(hal.DeadlineExceededError):
        hal.wait_any([(a, 1), (b, 1)], timeout=0.01)


def test_wait_any_with_only_a_failed_semaphore_is_aborted(device):
    a, b = device.create_semaphore(0), device.create_semaphore(0)
    b.fail("only failure")
    with pytest.raises(hal.AbortedError):
        hal.wait_any([(a, 1), (b, 1)], timeout=WAIT_TIMEOUT)


def test_queue_barrier_signals(device):
    sem = device.create_semaphore(0)
    device.queue_barrier(signal=[(sem, 1)])
    sem.wait(1, timeout=WAIT_TIMEOUT)
    device.queue_barrier(wait=[(sem, 1)], signal=[(sem, 10)])
    sem.wait(10, timeout=WAIT_TIMEOUT)
    assert sem.value == 10


def test_one_submission_signals_several_semaphores(device):
    a, b = device.create_semaphore(0), device.create_semaphore(5)
    device.queue_barrier(signal=[(a, 1), (b, 6)])
    hal.wait_all([(a, 1), (b, 6)], timeout=WAIT_TIMEOUT)
    assert (a.value, b.value) == (1, 6)


def test_queue_signal_not_above_current_is_invalid_argument(device):
    sem = device.create_semaphore(3)
    with pytest.raises(hal.InvalidArgumentError):
        device.queue_barrier(signal=[(sem, 3)])
    assert sem.value == 3
