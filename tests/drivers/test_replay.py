"""The repeat of a validated submission made from C (``hal/drivers/gpu/_replay.c``), on the simulated GPU.

Each test runs the same submissions on a device with the C replay and on one without it
(``HAL_NATIVE=0``, the Python path that defines every rule) and compares what they do: buffer
contents against counts computed here, semaphore values, the error each bad call raises. The
Python method's frames are counted to show which path a call took.
"""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import hal
from hal.device import Device
from hal.drivers import native_calls
from hal.drivers.gpu import event_semaphore, replay
from hal.drivers.gpu.device import GpuDevice
from hal.drivers.gpu.status import DeviceLostError

from .conftest import replay_device as device
from .test_gpu_generic import boom, kernels, words, zeroed

pytest.importorskip("hal.drivers.gpu._replay", reason="the C replay is not built here (no C compiler at install)")
if native_calls.mode() == "off":
    pytest.skip("HAL_NATIVE=0: the C replay is off", allow_module_level=True)

MODES = ["graph", "stream"]


def python_calls(fn, function=Device.queue_execute) -> int:
    """How many times ``fn`` entered the Python ``function`` (``Device.queue_execute``) on this thread."""
    code = function.__code__
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code is code:
            count += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def counting_cb(dev, exe):
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
    with cb.record():
        cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
    return cb


def validated(dev):
    """A counting command buffer submitted once (so validated) with a one-buffer table and
    completed: (the buffer, the command buffer, the semaphore at 1)."""
    exe = kernels(dev)
    (buf,) = zeroed(dev, 1)
    cb = counting_cb(dev, exe)
    sem = dev.create_semaphore(0)
    dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[buf]])
    sem.wait(1, timeout=30)
    return buf, cb, sem


def test_install_follows_hal_native_and_close_removes_it(fake_driver, monkeypatch):
    dev = fake_driver.create_device()
    assert dev.native_replay and "queue_execute" in vars(dev)
    dev.close()
    assert "queue_execute" not in vars(dev)  # the replay refers to the device: close breaks the cycle
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        dev.queue_execute([], signal=[])
    monkeypatch.setenv("HAL_NATIVE", "0")
    with fake_driver.create_device() as dev:
        assert not dev.native_replay and "queue_execute" not in vars(dev)


def test_a_device_class_that_changes_a_step_keeps_the_python_path(fake_driver):
    class Changed(GpuDevice):
        def _queue_execute(self, *args):
            return super()._queue_execute(*args)

    with fake_driver.create_device() as dev:
        replay.uninstall(dev)
        dev.__class__ = Changed
        assert not replay.install(dev)
        dev.__class__ = GpuDevice


def run_sequence(dev, order: list[int]) -> tuple[list[int], int, int]:
    """Submit one counting command buffer with table ``order[i]`` signalling i + 1 (each waiting
    for the one before): (each table's buffer's count, the final value, Python path entries)."""
    exe = kernels(dev)
    bufs = zeroed(dev, 3)
    cb = counting_cb(dev, exe)
    sem = dev.create_semaphore(0)
    tables = [[bufs[0]], [bufs[1]], [bufs[2]]]

    def submit_all():
        for value, which in enumerate(order, 1):
            table = tables[which] if value % 7 else list(tables[which])  # an equal list: still a repeat
            dev.queue_execute([cb], wait=[(sem, value - 1)], signal=[(sem, value)], binding_tables=[table])

    entered = python_calls(submit_all)
    sem.wait(len(order), timeout=30)
    return [words(dev, b)[0] for b in bufs], sem.value, entered


@pytest.mark.parametrize("mode", MODES)
def test_repeats_run_in_c_with_the_python_paths_results(fake_driver, monkeypatch, mode):
    # Two tables alternating (the second one recalled from validated_before), then one used once.
    order = [0, 1] * 20 + [2] + [0] * 5
    results = {}
    for native in (True, False):
        with device(fake_driver, monkeypatch, native, command_buffer=mode) as dev:
            results[native] = run_sequence(dev, order)
    expected = [order.count(i) for i in range(3)]
    assert results[True][:2] == results[False][:2] == (expected, len(order))
    assert results[False][2] == len(order)
    assert results[True][2] == 3  # only each table's first submission is validated (in Python)


def test_waits_not_ordered_on_the_queue_take_the_python_path(pair):
    def check(dev):
        exe = kernels(dev)
        (buf,) = zeroed(dev, 1)
        cb = counting_cb(dev, exe)
        sem, gate = dev.create_semaphore(0), dev.create_semaphore(0)
        dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[buf]])
        sem.wait(1, timeout=30)
        # Waiting for a value nothing has signalled: the submission parks until the host signals it.
        assert python_calls(lambda: dev.queue_execute([cb], wait=[(gate, 1)], signal=[(sem, 2)],
                                                      binding_tables=[[buf]])) == 1
        assert sem.value == 1
        gate.signal(1)
        sem.wait(2, timeout=30)
        # A wait already reached costs nothing on either path.
        dev.queue_execute([cb], wait=[(gate, 1)], signal=[(sem, 3)], binding_tables=[[buf]])
        sem.wait(3, timeout=30)
        assert words(dev, buf)[0] == 3

    for dev in pair:
        check(dev)


def outcome(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - compared between the two paths
        return type(exc), str(exc)
    return None


def test_bad_repeats_fail_as_on_the_python_path_and_leave_the_device_usable(pair):
    outcomes = []
    stranger = object()
    def check(dev):
        exe = kernels(dev)
        (buf, spare) = zeroed(dev, 2)
        cb = counting_cb(dev, exe)
        sem = dev.create_semaphore(0)
        dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[buf]])
        sem.wait(1, timeout=30)
        with pair[1 if dev is pair[0] else 0].allocator.allocate(64) as foreign_buffer:
            foreign_sem = (pair[1] if dev is pair[0] else pair[0]).create_semaphore(0)
            bad = {
                "value not above": lambda: dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[buf]]),
                "float value": lambda: dev.queue_execute([cb], signal=[(sem, 2.0)], binding_tables=[[buf]]),
                "bool value": lambda: dev.queue_execute([cb], signal=[(sem, True)], binding_tables=[[buf]]),
                "negative value": lambda: dev.queue_execute([cb], signal=[(sem, -1)], binding_tables=[[buf]]),
                "too large": lambda: dev.queue_execute([cb], signal=[(sem, 1 << 64)], binding_tables=[[buf]]),
                "not a pair": lambda: dev.queue_execute([cb], signal=[(sem, 2, 3)], binding_tables=[[buf]]),
                "foreign semaphore": lambda: dev.queue_execute([cb], signal=[(foreign_sem, 1)],
                                                               binding_tables=[[buf]]),
                "foreign wait": lambda: dev.queue_execute([cb], wait=[(foreign_sem, 0)], signal=[(sem, 2)],
                                                          binding_tables=[[buf]]),
                "negative wait": lambda: dev.queue_execute([cb], wait=[(sem, -1)], signal=[(sem, 2)],
                                                           binding_tables=[[buf]]),
                "foreign buffer": lambda: dev.queue_execute([cb], signal=[(sem, 2)],
                                                            binding_tables=[[foreign_buffer]]),
                "missing table": lambda: dev.queue_execute([cb], signal=[(sem, 2)]),
                "queue 1": lambda: dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]], queue=1),
                "float queue": lambda: dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]], queue=0.0),
                "unknown keyword": lambda: dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]],
                                                             tables=None),
                "repeated argument": lambda: dev.queue_execute([cb], [], [(sem, 2)], [[buf]], signal=[]),
                "too many arguments": lambda: dev.queue_execute([cb], [], [(sem, 2)], [[buf]], 0),
                "no arguments": lambda: dev.queue_execute(),
                "not a command buffer": lambda: dev.queue_execute([stranger], signal=[(sem, 2)]),
            }
            results = {name: outcome(call) for name, call in bad.items()}
        spare.release()  # a release invalidates the remembered validations: the table is checked again
        dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]])
        # numpy integers are accepted as values on both paths (the full check converts them)
        dev.queue_execute([cb], signal=[(sem, np.uint64(3))], binding_tables=[[buf]], queue=np.int64(0))
        sem.wait(3, timeout=30)
        buf.release()
        results["released buffer"] = outcome(
            lambda: dev.queue_execute([cb], signal=[(sem, 4)], binding_tables=[[buf]]))
        outcomes.append((results, sem.value))

    for dev in pair:
        check(dev)
    native, python = outcomes
    assert {k: v for k, v in native[0].items() if native[0][k] != python[0][k]} == {}
    assert native == python
    for name, result in native[0].items():
        assert result is not None, name
        assert issubclass(result[0], (hal.HalError, TypeError)), (name, result)
    assert native[1] == 3


def raising_once(error):
    state = {"armed": True}

    def wrap(call):
        def replacement(*args):
            if state["armed"]:
                state["armed"] = False
                raise error
            return call(*args)
        return replacement
    return wrap


@pytest.mark.parametrize("call", ["graph_launch", "event_record"])
def test_a_failing_driver_call_fails_the_signal_not_the_call(pair, call):
    def check(dev):
        buf, cb, sem = validated(dev)
        api = dev.api
        error = api.conventions.status.error(api.conventions.invalid_value, call)
        free_events = dev.events.available
        original = getattr(api, call)
        setattr(api, call, raising_once(error)(original))
        try:
            dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]])  # the failure travels on sem
        finally:
            setattr(api, call, original)
        with pytest.raises(hal.HalError) as info:
            sem.wait(2, timeout=30)
        assert "INVALID_VALUE" in str(info.value) or "InvalidValue" in str(info.value)
        assert dev.events.available >= free_events  # the event went back to the pool
        fresh = dev.create_semaphore(0)  # not a sticky fault: the device still works
        dev.queue_execute([cb], signal=[(fresh, 1)], binding_tables=[[buf]])
        fresh.wait(1, timeout=30)
        # A failed launch ran nothing; a failed event record follows a launch that ran.
        assert words(dev, buf)[0] == (3 if call == "event_record" else 2)

    for dev in pair:
        check(dev)


def test_host_waiters_listeners_and_out_of_order_values_take_the_python_steps(pair):
    def check(dev):
        buf, cb, sem = validated(dev)
        # A host thread blocked on a value before any work signals it.
        woke = []
        waiter = threading.Thread(target=lambda: woke.append(sem.wait(3, timeout=30)))
        waiter.start()
        while not sem._waiters:  # the waiter is inside wait() with no timepoint to wait on
            threading.Event().wait(0.001)
        dev.queue_execute([cb], signal=[(sem, 3)], binding_tables=[[buf]])
        waiter.join(30)
        assert not waiter.is_alive() and sem.value >= 3
        # A later value first, then a lower one above the current value: inserted in order.
        dev.queue_execute([cb], signal=[(sem, 10)], binding_tables=[[buf]])
        dev.queue_execute([cb], signal=[(sem, 5)], binding_tables=[[buf]])
        assert hal.wait_any([(sem, 10)], timeout=30) == 0
        # Many timepoints the value passed: the list is pruned, not grown.
        for value in range(11, 11 + 8 * event_semaphore.PRUNE_AT):
            dev.queue_execute([cb], signal=[(sem, value)], binding_tables=[[buf]])
            sem.wait(value, timeout=30)
        assert len(sem._timepoints) <= event_semaphore.PRUNE_AT
        assert words(dev, buf)[0] == 4 + 8 * event_semaphore.PRUNE_AT

    for dev in pair:
        check(dev)


@pytest.mark.parametrize("mode", MODES)
def test_threads_racing_on_one_device(fake_driver, mode):
    with fake_driver.create_device(command_buffer=mode) as dev:
        exe = kernels(dev)
        threads, rounds = 6, 150
        bufs = zeroed(dev, threads)
        shared = dev.create_semaphore(0)
        counter = iter(range(1, threads * rounds + 1))
        lock = threading.Lock()
        failures = []

        def loop(i):
            cb = counting_cb(dev, exe)
            sem = dev.create_semaphore(0)
            try:
                for value in range(1, rounds + 1):
                    with lock:  # values on the shared semaphore rise in submission order
                        shared_value = next(counter)
                        dev.queue_execute([cb], signal=[(sem, value)], binding_tables=[[bufs[i]]])
                        dev.queue_execute([cb], signal=[(shared, shared_value)], binding_tables=[[bufs[i]]])
                    if value % 50 == 0:
                        sem.wait(value, timeout=30)
                sem.wait(rounds, timeout=30)
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60)
        assert not failures
        shared.wait(threads * rounds, timeout=30)
        assert [words(dev, b)[0] for b in bufs] == [2 * rounds] * threads


def faulting(dev):
    """(a buffer, a reusable command buffer whose kernel raises: a sticky fault that loses the device)."""
    exe = dev.load_executable(hal.ExecutableSpec("numpy", {"boom": boom}, [hal.Export("boom", bindings=1)]))
    (buf,) = zeroed(dev, 1)
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
    with cb.record():
        cb.dispatch(exe, "boom", 1, [], [hal.Slot(0)])
    return buf, cb


def test_a_lost_device_fails_the_repeat(fake_driver):
    with fake_driver.create_device(command_buffer="graph") as dev:
        buf, cb = faulting(dev)
        sem = dev.create_semaphore(0)
        dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[buf]])
        with pytest.raises(hal.HalError):
            sem.wait(1, timeout=30)
        assert dev.lost is not None
        fresh = dev.create_semaphore(0)
        assert python_calls(lambda: dev.queue_execute([cb], signal=[(fresh, 1)], binding_tables=[[buf]])) == 0
        with pytest.raises(hal.AbortedError, match="lost") as info:
            fresh.wait(1, timeout=30)
        assert isinstance(info.value.__cause__, DeviceLostError)


def test_tracing_takes_the_python_path(pair, tmp_path):
    from hal import tracing

    dev = pair[0]
    exe = kernels(dev)
    (buf,) = zeroed(dev, 1)
    cb = counting_cb(dev, exe)
    sem = dev.create_semaphore(0)
    dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[buf]])
    tracing.start(tmp_path / "trace.json")
    try:
        assert python_calls(lambda: dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]])) == 1
    finally:
        path = tracing.stop()
    sem.wait(2, timeout=30)
    assert "queue_execute" in path.read_text()


def test_the_submission_made_in_c_is_the_one_python_makes(pair):
    subs = []
    for dev in pair:
        exe = kernels(dev)
        (buf,) = zeroed(dev, 1)
        cb = counting_cb(dev, exe)
        sem = dev.create_semaphore(0)
        table = [buf]
        dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[table])
        dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[table])
        sub = sem._timepoints[-1][1]
        fields = {name: getattr(sub, name) for name in type(sub).__slots__}
        sem.wait(2, timeout=30)
        assert fields.pop("queue") is dev.queues[0] and fields.pop("event") is not None
        assert type(fields.pop("seq")) is int
        assert fields.pop("command_buffers") == [cb]
        assert [[entry[0] for entry in t] for t in fields.pop("tables")] == [table]  # the checked table
        assert fields.pop("signals") == [(sem, 2)]
        subs.append(fields)
    assert subs[0] == subs[1] == {"waits": [], "action": None, "resources": None, "retired": False}


@pytest.mark.parametrize("mode", MODES)
def test_repeats_racing_a_close_complete_or_are_refused(fake_driver, mode):
    dev = fake_driver.create_device(command_buffer=mode)
    exe = kernels(dev)
    bufs = zeroed(dev, 4)
    started = threading.Barrier(len(bufs) + 1)
    outcomes = [[] for _ in bufs]

    def loop(i):
        cb = counting_cb(dev, exe)
        sem = dev.create_semaphore(0)
        started.wait()
        for value in range(1, 100_000):
            try:
                dev.queue_execute([cb], signal=[(sem, value)], binding_tables=[[bufs[i]]])
            except hal.FailedPreconditionError as exc:
                outcomes[i].append(("refused", value, str(exc)))
                return
            outcomes[i].append(("submitted", value, sem))

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(len(bufs))]
    for w in workers:
        w.start()
    started.wait()
    threading.Event().wait(0.05)
    dev.close()
    for w in workers:
        w.join(30)
    assert not any(w.is_alive() for w in workers)
    for runs in outcomes:
        kind, value, detail = runs[-1]
        assert kind == "refused" and "closed" in detail
        submitted = [r for r in runs if r[0] == "submitted"]
        assert len(submitted) == value - 1
        if submitted:  # everything accepted before the close ran (close waits for it) or failed
            sem = submitted[-1][2]
            assert sem.current_value == value - 1 or sem.failure is not None
