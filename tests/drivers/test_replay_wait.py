"""The host wait made from C (``hal/drivers/gpu/_replay_wait.c``), on the simulated GPU.

As in test_replay.py, each test runs the same calls on a device with the C code and on one
without it (``HAL_NATIVE=0``) and compares what they do; the Python wait's frames are counted to
show which path a wait took.
"""

from __future__ import annotations

import threading
from functools import partial

import numpy as np
import pytest

import hal
from hal.semaphore import Semaphore

from .conftest import replay_device as device
from .test_gpu_generic import kernels, words, zeroed
from .test_replay import counting_cb, faulting, outcome, python_calls, raising_once, validated

pytest.importorskip("hal.drivers.gpu._replay", reason="the C replay is not built here (no C compiler at install)")

MODES = ["graph", "stream"]


#: How many times a call entered the Python ``Semaphore.wait`` on this thread.
python_waits = partial(python_calls, function=Semaphore.wait)


def test_semaphores_get_the_c_wait_where_the_replay_serves(pair):
    native, python = pair
    assert "wait" in vars(native.create_semaphore(0))
    assert "wait" not in vars(python.create_semaphore(0))


@pytest.mark.parametrize("mode", MODES)
def test_usual_waits_run_in_c_with_the_python_paths_results(fake_driver, monkeypatch, mode):
    results = {}
    for native in (True, False):
        with device(fake_driver, monkeypatch, native, command_buffer=mode) as dev:
            buf, cb, sem = validated(dev)
            entered = 0
            for value in range(2, 40):
                dev.queue_execute([cb], signal=[(sem, value)], binding_tables=[[buf]])
                entered += python_waits(partial(sem.wait, value))
                if value % 5 == 0:  # a value reached already, and the keyword form
                    entered += python_waits(partial(sem.wait, value - 1, timeout=None))
            results[native] = (words(dev, buf)[0], sem.value, len(dev.completion.outstanding), entered,
                               list(dev.queues[0].inflight))
    assert results[True][:3] == results[False][:3] == (39, 39, 0)
    assert results[True][4] == results[False][4] == []
    assert results[True][3] == 0 and results[False][3] == 38 + 7


def test_other_waits_take_the_python_wait_and_fail_alike(pair):
    outcomes = []

    def check(dev):
        buf, cb, sem = validated(dev)
        dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]])
        dev.queue_execute([cb], signal=[(sem, 3)], binding_tables=[[buf]])
        # An older value than the latest timepoint, a timeout, numpy values: the Python wait serves.
        assert python_waits(lambda: sem.wait(2)) == 1
        assert python_waits(lambda: sem.wait(3, 30.0)) == 1
        dev.queue_execute([cb], signal=[(sem, 4)], binding_tables=[[buf]])
        assert python_waits(lambda: sem.wait(np.uint64(4))) == 1
        bad = {name: outcome(call) for name, call in {
            "float value": lambda: sem.wait(2.5),
            "bool value": lambda: sem.wait(True),
            "negative value": lambda: sem.wait(-1),
            "too large": lambda: sem.wait(1 << 64),
            "string": lambda: sem.wait("4"),
            "negative timeout": lambda: sem.wait(5, timeout=-1),
            "unknown keyword": lambda: sem.wait(4, deadline=None),
            "no value": lambda: sem.wait(),
            "too many arguments": lambda: sem.wait(4, None, None),
            "not reached in time": lambda: sem.wait(5, timeout=0.01),
        }.items()}
        outcomes.append((bad, sem.value, words(dev, buf)[0]))

    for dev in pair:
        check(dev)
    native, python = outcomes
    assert native == python
    for name, result in native[0].items():
        if name != "bool value":  # True is 1, reached: both paths return
            assert result is not None and issubclass(result[0], (hal.HalError, TypeError)), (name, result)
    assert native[1:] == (4, 4)


def test_a_synchronize_failing_on_its_own_waits_as_on_the_python_path(pair):
    """The work completes all the same: both paths find it by querying the event, and return."""
    outcomes = []

    def check(dev):
        buf, cb, sem = validated(dev)
        api = dev.api
        error = api.conventions.status.error(api.conventions.invalid_value, "event_synchronize")
        original = api.event_synchronize
        api.event_synchronize = raising_once(error)(original)
        try:
            dev.queue_execute([cb], signal=[(sem, 2)], binding_tables=[[buf]])
            result = outcome(lambda: sem.wait(2))
        finally:
            api.event_synchronize = original
        fresh = dev.create_semaphore(0)  # not a sticky fault: the device still works
        dev.queue_execute([cb], signal=[(fresh, 1)], binding_tables=[[buf]])
        fresh.wait(1)
        outcomes.append((result, words(dev, buf)[0]))

    for dev in pair:
        check(dev)
    assert outcomes[0] == outcomes[1] == (None, 3)


def test_failed_work_lost_devices_and_closed_devices_wait_alike(fake_driver, monkeypatch):
    from .fake_gpu import VENDORS, FakeGpuDriver

    outcomes = []
    for native in (True, False):
        vendor = next(name for name, c in VENDORS.items() if c is fake_driver.api.conventions)
        driver = FakeGpuDriver(vendor)  # the fault is sticky: a driver of its own each
        dev = device(driver, monkeypatch, native, command_buffer="graph")
        buf, cb = faulting(dev)
        sem = dev.create_semaphore(0)
        dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[buf]])
        failed = outcome(partial(sem.wait, 1))
        fresh = dev.create_semaphore(0)
        dev.queue_execute([cb], signal=[(fresh, 1)], binding_tables=[[buf]])
        lost = outcome(partial(fresh.wait, 1))
        dev.close()
        closed = (outcome(partial(sem.wait, 1)), outcome(partial(fresh.wait, 2)), outcome(partial(sem.wait, 0)))
        outcomes.append((failed[0], lost[0], closed))
    assert outcomes[0] == outcomes[1]
    assert issubclass(outcomes[0][0], hal.HalError) and issubclass(outcomes[0][1], hal.AbortedError)


def test_one_shot_work_and_listeners_retire_through_the_python_steps(pair):
    def check(dev):
        exe = kernels(dev)
        (buf,) = zeroed(dev, 1)
        sem, other = dev.create_semaphore(0), dev.create_semaphore(0)
        once = dev.create_command_buffer(hal.CommandBufferMode.ONE_SHOT, binding_capacity=1)
        with once.record():
            once.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
        dev.queue_execute([once], signal=[(sem, 1), (other, 5)], binding_tables=[[buf]])
        heard = []
        other.notify_at(5, heard.append)  # a host listener: its semaphore advances in Python
        sem.wait(1)
        assert heard == [None] and other.value == 5 and sem.value == 1
        assert not dev.completion.outstanding and words(dev, buf)[0] == 1
        return once.state

    native, python = (check(dev) for dev in pair)
    assert native == python


@pytest.mark.parametrize("mode", MODES)
def test_threads_waiting_while_others_submit(fake_driver, mode):
    with fake_driver.create_device(command_buffer=mode) as dev:
        exe = kernels(dev)
        (buf,) = zeroed(dev, 1)
        cb = counting_cb(dev, exe)
        sem = dev.create_semaphore(0)
        rounds, waiters = 200, 4
        seen: list = []
        failures: list = []
        submitted = threading.Event()
        lock = threading.Lock()

        def submit():
            for value in range(1, rounds + 1):
                with lock:
                    dev.queue_execute([cb], signal=[(sem, value)], binding_tables=[[buf]])
                if value % 3 == 0:
                    sem.wait(value)
            submitted.set()

        def wait(k):
            try:
                value = 1
                while value <= rounds:
                    sem.wait(value) if sem._timepoints else sem.wait(value, timeout=30)
                    assert sem.value >= value
                    value += 1 + k
                seen.append(k)
            except Exception as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=submit)] + [threading.Thread(target=wait, args=(k,)) for k in range(waiters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures and sorted(seen) == list(range(waiters)) and submitted.is_set()
        sem.wait(rounds)
        assert words(dev, buf)[0] == rounds and not dev.completion.outstanding and not dev.queues[0].inflight
