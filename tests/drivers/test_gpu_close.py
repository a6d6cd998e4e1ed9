"""Closing a GPU device while work is parked, in flight or being submitted (over the simulated GPU).

The simulated GPU records every call on a destroyed stream or event (a crash in
``cuEventRecord`` on a real GPU), so these tests catch the use-after-close
without hardware: parked work fails its semaphores at close, also when a host
``signal()`` reaches its wait afterwards; queue operations racing ``close()``
are rejected with ``FailedPreconditionError`` or their signals complete or fail.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest

import hal

EXPORTS = [hal.Export("add_one", (64, 1, 1), bindings=1, constants=1)]


def add_one(workgroups, bindings, constants):
    np.frombuffer(bindings[0], np.uint32, count=constants[0])[:] += 1


def kernels(dev):
    return dev.load_executable(hal.ExecutableSpec("numpy", {"add_one": add_one}, EXPORTS))


def settled(sem: hal.Semaphore, value: int) -> bool:
    """Reached or failed within the time limit (never left hanging)."""
    try:
        sem.wait(value, timeout=30)
    except hal.AbortedError:
        return True
    except hal.FailedPreconditionError:  # a semaphore of a closed device may refuse the wait
        return sem.failure is not None or sem.current_value >= value
    return True


@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_parked_work_fails_at_close_and_a_later_signal_touches_nothing(fake_driver, mode):
    dev = fake_driver.create_device(command_buffer=mode)
    exe = kernels(dev)
    buf = dev.allocator.allocate(64)
    gate, done = dev.create_semaphore(0), dev.create_semaphore(0)
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.dispatch(exe, "add_one", 1, [16], [buf])
    dev.queue_execute([cb], wait=[(gate, 1)], signal=[(done, 1)])
    dev.queue_barrier(wait=[(done, 1)], signal=[(done, 2)])
    dev.close()
    with pytest.raises(hal.AbortedError) as info:
        done.wait(1, timeout=10)
    assert isinstance(info.value.__cause__, hal.FailedPreconditionError)
    try:
        gate.signal(1)  # releases nothing: the parked work already failed
    except hal.FailedPreconditionError:
        pass
    assert done.failure is not None
    assert fake_driver.api.use_after_destroy == []


def test_work_in_flight_at_close_completes(fake_driver):
    dev = fake_driver.create_device()
    exe = kernels(dev)
    buf = dev.allocator.allocate(64)
    sem = dev.create_semaphore(0)
    cb = dev.create_command_buffer()
    with cb.record():
        cb.dispatch(exe, "add_one", 1, [16], [buf])
    dev.queue_execute([cb], signal=[(sem, 1)])
    dev.close()
    assert sem.current_value == 1 and sem.failure is None
    assert fake_driver.api.use_after_destroy == []


def test_release_after_close_is_rejected_or_fails_cleanly(fake_driver):
    """A waiter parked when close starts, released by a signal from another thread during the close."""
    for _ in range(20):
        dev = fake_driver.create_device()
        gate, done = dev.create_semaphore(0), dev.create_semaphore(0)
        dev.queue_barrier(wait=[(gate, 1)], signal=[(done, 1)])
        signaller = threading.Thread(target=_quietly, args=(gate.signal, 1))
        closer = threading.Thread(target=dev.close)
        closer.start()
        signaller.start()
        closer.join(30)
        signaller.join(30)
        assert not closer.is_alive() and settled(done, 1)
    assert fake_driver.api.use_after_destroy == []


def _quietly(fn, *args):
    try:
        fn(*args)
    except hal.FailedPreconditionError:
        pass


@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_queue_operations_racing_close(fake_driver, mode):
    """Randomised interleavings of submissions (direct, parked, alloca, barriers), host signals and close:
    every operation is rejected with FailedPreconditionError or its signals settle; no destroyed
    stream or event is ever used."""
    for iteration in range(40):
        race_close_once(fake_driver, mode, random.Random(iteration))
    assert fake_driver.api.use_after_destroy == []


def race_close_once(driver, mode: str, rng: random.Random) -> None:
    dev = driver.create_device(command_buffer=mode)
    exe = kernels(dev)
    buf = dev.allocator.allocate(64)
    gate = dev.create_semaphore(0)
    signals: list[tuple[hal.Semaphore, int]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def submit_one(kind: int, waits: list) -> None:
        sem = dev.create_semaphore(0)
        if kind == 0:
            cb = dev.create_command_buffer()
            with cb.record():
                cb.dispatch(exe, "add_one", 1, [16], [buf])
            dev.queue_execute([cb], wait=waits, signal=[(sem, 1)])
        elif kind == 1:
            dev.queue_barrier(wait=waits, signal=[(sem, 1)])
        elif kind == 2:
            dev.queue_alloca(256, wait=waits, signal=[(sem, 1)])
        else:
            dev.queue_execute([], wait=waits, signal=[(sem, 1)])
        signals.append((sem, 1))

    def submitter(seed: int) -> None:
        local = random.Random(seed)
        start.wait()
        for _ in range(15):
            try:
                submit_one(local.randrange(4), [(gate, 1)] if local.random() < 0.5 else [])
            except hal.FailedPreconditionError:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    def after_a_while(fn, *args) -> None:
        start.wait()
        threading.Event().wait(rng.random() * 0.01)
        _quietly(fn, *args)

    threads = [threading.Thread(target=submitter, args=(rng.random(),)),
               threading.Thread(target=after_a_while, args=(dev.close,)),
               threading.Thread(target=after_a_while, args=(gate.signal, 1)),
               threading.Thread(target=submitter, args=(rng.random(),))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a thread hung"
    dev.close()
    _quietly(gate.signal, 2)
    assert errors == []
    for sem, value in signals:
        assert settled(sem, value), "a signal neither completed nor failed"
