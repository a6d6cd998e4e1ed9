"""Closing a GPU device while work is parked, in flight or being submitted (over the simulated GPU).

The simulated GPU records every call on a destroyed stream or event (a crash in
``cuEventRecord`` on a real GPU), so these tests catch the use-after-close
without hardware: parked work fails its semaphores at close, also when a host
``signal()`` reaches its wait afterwards; queue operations racing ``close()``
are rejected with ``FailedPreconditionError`` or their signals complete or fail.
"""

from __future__ import annotations

import gc
import random
import threading
import time
import weakref

import numpy as np
import pytest
from forking import in_forked_child, needs_fork

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


# -- a device dropped without close() ------------------------------------------------------------

def counting_streams_and_events(api) -> dict[str, int]:
    """Wrap the API's stream and event creation and destruction with counts (live = made - destroyed)."""
    counts = {"streams": 0, "events": 0}
    for kind, make, destroy in (("streams", "stream_create", "stream_destroy"),
                                ("events", "event_create", "event_destroy")):
        def made(*args, _make=getattr(api, make), _kind=kind):
            handle = _make(*args)
            counts[_kind] += 1
            return handle

        def destroyed(handle, _destroy=getattr(api, destroy), _kind=kind):
            _destroy(handle)
            counts[_kind] -= 1

        setattr(api, make, made)
        setattr(api, destroy, destroyed)
    return counts


def use_and_drop(driver, slow: bool = False) -> weakref.ref:
    """Make a device, use every part that holds driver objects, drop it (``slow``: with its last
    submission still running), and return a weak reference to it."""
    dev = driver.create_device()
    exe = kernels(dev) if not slow else dev.load_executable(hal.ExecutableSpec(
        "numpy", {"add_one": lambda w, b, c: (time.sleep(0.3), add_one(w, b, c))}, EXPORTS))
    gemm = dev.load_executable(hal.library_spec({"gemm": hal.Gemm("float32")}))
    buf = dev.allocator.allocate(256)
    dev.allocator.allocate(64, memory_type=hal.MemoryType.HOST_VISIBLE)  # never released by the program
    operands = [dev.allocator.allocate(4 * 4 * 4) for _ in range(3)]
    dev.write(buf, bytes(256))
    graph = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=3)
    with graph.record():
        graph.dispatch(exe, "add_one", 1, [16], [buf])
        graph.update_buffer(b"abcd", (buf, 128, 4))
        graph.dispatch(gemm, "gemm", constants=hal.Gemm.constants_for(4, 4, 4),
                       bindings=[hal.Slot(0), hal.Slot(1), hal.Slot(2)])
    stream = dev.create_command_buffer(hal.CommandBufferMode.ONE_SHOT)
    with stream.record():
        stream.update_buffer(b"efgh", (buf, 132, 4))
    sem = dev.create_semaphore(0)
    dev.queue_execute([stream], signal=[(sem, 1)])
    dev.queue_execute([graph], wait=[(sem, 1)], signal=[(sem, 2)], binding_tables=[operands])
    if not slow:
        sem.wait(2, timeout=30)
        assert np.frombuffer(dev.read(buf), np.uint32)[0] == 1
    return weakref.ref(dev)


def wait_for(condition, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.mark.parametrize("slow", [False, True], ids=["idle", "in-flight"])
def test_dropped_device_releases_its_threads_streams_events_memory_and_modules(fake_driver, slow):
    """A device dropped without close() is collected (its executables' finalizers do not keep it)
    and then released as close() would; in flight, its last submission keeps it until it retires."""
    api = fake_driver.api
    counts = counting_streams_and_events(api)
    threads = set(threading.enumerate())
    memory, modules = api.live_allocations, len(api.modules)
    for _ in range(3):
        ref = use_and_drop(fake_driver, slow)
        gc.collect()
        if slow:
            assert ref() is not None, "collected while its work ran"
        assert wait_for(lambda ref=ref: gc.collect() >= 0 and ref() is None), "a dropped device was never collected"
    assert wait_for(lambda: set(threading.enumerate()) <= threads), \
        f"threads left: {set(threading.enumerate()) - threads}"
    assert api.live_allocations == memory
    assert len(api.modules) == modules
    assert counts == {"streams": 0, "events": 0}
    assert api.use_after_destroy == []


def test_closed_device_is_not_released_again_when_dropped(fake_driver):
    api = fake_driver.api
    counts = counting_streams_and_events(api)
    threads = set(threading.enumerate())
    dev = fake_driver.create_device()
    kernels(dev)
    dev.close()
    assert counts == {"streams": 0, "events": 0}
    del dev
    gc.collect()
    assert wait_for(lambda: set(threading.enumerate()) <= threads)
    assert counts == {"streams": 0, "events": 0} and api.use_after_destroy == []


# -- a forked child ------------------------------------------------------------------------------

@needs_fork
def test_devices_of_the_parent_refuse_every_use_in_a_forked_child(fake_driver):
    """A GPU context does not survive fork(): in the child every use of a device made before the
    fork fails with a FailedPreconditionError that says so, before any driver call (a real
    driver fails inside, and the child has no completion thread); the parent goes on."""
    dev = fake_driver.create_device()
    exe = kernels(dev)
    buf = dev.allocator.allocate(64)
    dev.write(buf, bytes(64))
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.dispatch(exe, "add_one", 1, [16], [buf])
    sem = dev.create_semaphore(0)
    dev.queue_execute([cb], signal=[(sem, 1)])
    sem.wait(1, timeout=30)

    def child() -> list:
        calls = dict(dev.api.calls)
        outcomes = []
        for use in (lambda: dev.allocator.allocate(64), lambda: dev.read(buf), lambda: dev.write(buf, bytes(64))):
            try:
                use()
                outcomes.append("ran")
            except hal.FailedPreconditionError as exc:
                outcomes.append("fork()" in str(exc))
        dev.queue_execute([cb], signal=[(sem, 2)])  # its semaphore fails with the same reason
        try:
            sem.wait(2, timeout=10)
            outcomes.append("ran")
        except hal.AbortedError as exc:
            outcomes.append("fork()" in str(exc))
        dev.close()
        outcomes.append({k: v - calls.get(k, 0) for k, v in dev.api.calls.items() if v != calls.get(k, 0)})
        return outcomes

    try:
        assert in_forked_child(child) == [True, True, True, True, {}]
        dev.queue_execute([cb], signal=[(sem, 2)])
        sem.wait(2, timeout=30)
        assert np.frombuffer(dev.read(buf), np.uint32)[0] == 2
    finally:
        dev.close()
