"""Prepared executions on every driver: ``device.prepare(...)`` validates command buffers and binding
tables once, ``execution.submit(wait, signal)`` issues them again and again with only the fences
checked, and the execution refuses once a buffer it uses is released or its device closes."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

import hal

from .helpers import WAIT_TIMEOUT, allocate_with, read_u32, record, safety_signal

Mode = hal.CommandBufferMode
Slot = hal.Slot


def _add_one(kernels, cb, ref, n=16):
    cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[n], bindings=[ref])


def _counts(device, buf, n=16):
    return read_u32(device, buf)[:n]


def _run(execution, sem, value):
    execution.submit(signal=[(sem, value)])
    sem.wait(value, timeout=WAIT_TIMEOUT)


@pytest.fixture
def adder(device, kernels):
    """A reusable command buffer adding one to 16 words of binding-table slot 0."""
    return record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=Mode.REUSABLE, binding_capacity=1)


def test_an_execution_runs_its_work_at_each_submit(device, kernels):
    buf = allocate_with(device, bytes(64))
    cb = record(device, lambda cb: _add_one(kernels, cb, buf), mode=Mode.REUSABLE)
    execution = device.prepare([cb])
    assert isinstance(execution, hal.Execution) and execution.valid
    assert execution.device is device and execution.queue == 0 and list(execution.command_buffers) == [cb]
    sem = device.create_semaphore(0)
    for value in range(1, 6):
        _run(execution, sem, value)
        np.testing.assert_array_equal(_counts(device, buf), np.full(16, value, np.uint32))


def test_executions_of_one_command_buffer_keep_their_own_tables(device, adder):
    a, b = allocate_with(device, bytes(64)), allocate_with(device, bytes(64))
    table = [a]
    on_a, on_b = device.prepare([adder], [table]), device.prepare([adder], [[b]])
    table[0] = b  # the caller's list changes after prepare: the execution holds what was checked
    sem = device.create_semaphore(0)
    value = 0
    for _ in range(3):  # double-buffered: alternate between two prepared tables
        for execution in (on_a, on_b, on_a):
            value += 1
            _run(execution, sem, value)
    np.testing.assert_array_equal(_counts(device, a), np.full(16, 6, np.uint32))
    np.testing.assert_array_equal(_counts(device, b), np.full(16, 3, np.uint32))
    assert execution.binding_tables[0][0][0] is a


def test_submit_waits_signals_and_orders_like_queue_execute(device, adder):
    buf = allocate_with(device, bytes(64))
    execution = device.prepare([adder], [[buf]])
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    execution.submit(wait=[(gate, 1)], signal=[(done, 1)])  # wait-before-signal: must not block
    execution.submit(wait=[(done, 1)], signal=[(done, 2)])
    with safety_signal(gate, 1):
        assert done.value == 0
        gate.signal(1)
        done.wait(2, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 2, np.uint32))


@pytest.mark.parametrize("fences", [{}, {"wait": [], "signal": []}, {"wait": (), "signal": ()}, {"signal": None}],
                         ids=["defaults", "empty lists", "empty tuples", "None"])
def test_submissions_without_fences_run_in_queue_order(device, adder, fences):
    """A submission that signals nothing still runs, in order with the ones around it: the next
    signalled one covers it."""
    buf = allocate_with(device, bytes(64))
    execution = device.prepare([adder], [[buf]])
    for _ in range(3):
        execution.submit(**fences)
    sem = device.create_semaphore(0)
    execution.submit(signal=[(sem, 1)])
    sem.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 4, np.uint32))


def test_queue_execute_is_prepare_and_one_submit(device, adder):
    buf = allocate_with(device, bytes(64))
    sem = device.create_semaphore(0)
    device.queue_execute([adder], signal=[(sem, 1)], binding_tables=[[buf]])
    device.prepare([adder], [[buf]]).submit(signal=[(sem, 2)])
    sem.wait(2, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 2, np.uint32))


@pytest.mark.parametrize("released", ["table entry", "direct", "root of a view"])
def test_a_released_buffer_invalidates_the_execution(device, kernels, adder, released):
    buf = allocate_with(device, bytes(64))
    if released == "direct":
        execution = device.prepare([record(device, lambda cb: _add_one(kernels, cb, buf), mode=Mode.REUSABLE)])
    elif released == "root of a view":
        execution = device.prepare([adder], [[buf.subspan(0, 64)]])
    else:
        execution = device.prepare([adder], [[buf]])
    sem = device.create_semaphore(0)
    _run(execution, sem, 1)
    device.allocator.allocate(16).release()  # an unrelated release leaves it valid
    assert execution.valid
    _run(execution, sem, 2)
    buf.release()
    assert not execution.valid
    with pytest.raises(hal.FailedPreconditionError, match="released"):
        execution.submit(signal=[(sem, 3)])
    with pytest.raises(hal.FailedPreconditionError, match="released"):  # and stays refused
        execution.submit(signal=[(sem, 3)])
    assert sem.value == 2 and sem.failure is None  # nothing was issued


def test_a_released_buffer_is_refused_at_prepare(device, adder):
    buf = allocate_with(device, bytes(64))
    buf.release()
    with pytest.raises(hal.FailedPreconditionError):
        device.prepare([adder], [[buf]])


def test_a_one_shot_execution_submits_once(device, kernels):
    buf = allocate_with(device, bytes(64))
    cb = record(device, lambda cb: _add_one(kernels, cb, buf))
    execution = device.prepare([cb])
    other = device.prepare([cb])  # preparing twice is allowed: only one of them can run
    sem = device.create_semaphore(0)
    _run(execution, sem, 1)
    assert not execution.valid and not other.valid
    for again in (execution, other):
        with pytest.raises(hal.FailedPreconditionError, match="already submitted"):
            again.submit(signal=[(sem, 2)])
    with pytest.raises(hal.FailedPreconditionError):
        device.prepare([cb])
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 1, np.uint32))


def test_a_one_shot_execution_runs_once_when_threads_race(device, kernels):
    for _ in range(10):
        _race_one_shot_execution(device, kernels)


def _race_one_shot_execution(device, kernels):
    buf = allocate_with(device, bytes(64))
    execution = device.prepare([record(device, lambda cb: _add_one(kernels, cb, buf))])
    start = threading.Barrier(4)
    outcomes: list[str] = []

    def submit(sem: hal.Semaphore) -> None:
        start.wait()
        try:
            execution.submit(signal=[(sem, 1)])
            sem.wait(1, timeout=WAIT_TIMEOUT)
            outcomes.append("ran")
        except hal.FailedPreconditionError:
            outcomes.append("refused")

    threads = [threading.Thread(target=submit, args=(device.create_semaphore(0),)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ran", "refused", "refused", "refused"]
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 1, np.uint32))


def test_threads_submitting_one_execution_all_run(device, adder):
    buf = allocate_with(device, bytes(64))
    execution = device.prepare([adder], [[buf]])
    per_thread, count = 25, 8
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def loop() -> None:
        sem = device.create_semaphore(0)
        try:
            start.wait()
            for value in range(1, per_thread + 1):
                execution.submit(signal=[(sem, value)])
            sem.wait(per_thread, timeout=WAIT_TIMEOUT)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=loop) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    device.wait_idle(timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, per_thread * count, np.uint32))


def test_a_failed_wait_fails_the_signals_and_the_execution_runs_again(device, adder):
    buf = allocate_with(device, bytes(64))
    execution = device.prepare([adder], [[buf]])
    broken, out = device.create_semaphore(0), device.create_semaphore(0)
    execution.submit(wait=[(broken, 1)], signal=[(out, 1)])
    broken.fail(RuntimeError("upstream failed"))
    with pytest.raises(hal.AbortedError):
        out.wait(1, timeout=WAIT_TIMEOUT)
    fresh = device.create_semaphore(0)
    _run(execution, fresh, 1)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 1, np.uint32))


def test_a_closed_device_refuses_prepare_and_submit(make_device):
    dev = make_device()
    buf = dev.allocator.allocate(64)
    cb = dev.create_command_buffer(Mode.REUSABLE)
    with cb.record():
        cb.fill_buffer(buf, 7, 4)
    execution = dev.prepare([cb])
    sem = dev.create_semaphore(0)
    _run(execution, sem, 1)
    dev.close()
    assert not execution.valid
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        execution.submit()
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        dev.prepare([cb])


@pytest.mark.parametrize("queue", [True, 1.0, "0", None, -1, 1 << 40])
def test_prepare_rejects_bad_queues(device, adder, queue):
    buf = allocate_with(device, bytes(64))
    with pytest.raises(hal.InvalidArgumentError, match="queue"):
        device.prepare([adder], [[buf]], queue=queue)


def test_prepare_takes_a_numpy_integer_queue(device, adder):
    buf = allocate_with(device, bytes(64))
    assert device.prepare([adder], [[buf]], queue=np.int64(0)).queue == 0


@pytest.mark.parametrize("case", ["not a command buffer", "missing table", "short table", "table of 2 for 1",
                                  "entry not a buffer", "command buffer recording"])
def test_prepare_rejects_bad_command_buffers_and_tables(device, kernels, adder, case):
    buf = allocate_with(device, bytes(64))
    if case == "not a command buffer":
        args = (["cb"], None)
    elif case == "missing table":
        args = ([adder], None)
    elif case == "short table":
        args = ([adder], [[]])
    elif case == "table of 2 for 1":
        args = ([adder], [[buf], [buf]])
    elif case == "entry not a buffer":
        args = ([adder], [[b"bytes"]])
    else:
        cb = device.create_command_buffer(Mode.REUSABLE)
        cb.begin()
        args = ([cb], None)
    with pytest.raises(hal.HalError) as info:
        device.prepare(*args)
    assert isinstance(info.value, (hal.InvalidArgumentError, hal.FailedPreconditionError))


@pytest.mark.parametrize("fences", [
    pytest.param({"signal": [(None, 1)]}, id="signal not a semaphore"),
    pytest.param({"signal": [("sem", 1.0)]}, id="float value"),
    pytest.param({"signal": [("sem", True)]}, id="bool value"),
    pytest.param({"signal": [("sem", -1)]}, id="negative value"),
    pytest.param({"signal": [("sem", 0)]}, id="signal not above the value"),
    pytest.param({"wait": ("sem", 1)}, id="wait not a list of pairs"),
    pytest.param({"signal": [("other", 1)]}, id="semaphore of another device"),
])
def test_submit_checks_its_fences_before_any_work(device, make_device, adder, fences):
    buf = allocate_with(device, bytes(64))
    execution = device.prepare([adder], [[buf]])
    sem = device.create_semaphore(0)
    other = make_device().create_semaphore(0)

    def resolve(value):
        return sem if value == "sem" else other if value == "other" else value

    args = {}
    for key, value in fences.items():
        if isinstance(value, list):
            args[key] = [(resolve(s), v) for s, v in value]
        else:
            args[key] = tuple(resolve(v) for v in value)
    with pytest.raises(hal.InvalidArgumentError):
        execution.submit(**args)
    _run(execution, sem, 1)  # nothing ran before; the execution still works
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 1, np.uint32))


def test_an_execution_is_not_picklable(device, adder):
    buf = allocate_with(device, bytes(64))
    with pytest.raises(TypeError, match="hal.Execution"):
        pickle.dumps(device.prepare([adder], [[buf]]))


# -- joined executions ------------------------------------------------------------------------------

def _filler(device, buf, word):
    """A reusable command buffer filling 16 words of ``buf`` with ``word``."""
    return record(device, lambda cb: cb.fill_buffer(buf, word, 4), mode=Mode.REUSABLE)


def test_joined_executions_run_in_order_as_one_submission(device, adder):
    buf = allocate_with(device, bytes(64))
    fill, add = device.prepare([_filler(device, buf, 5)]), device.prepare([adder], [[buf]])
    joined = device.join([fill, add, add])
    assert isinstance(joined, hal.Execution) and joined.valid and joined.queue == 0
    assert len(joined.command_buffers) == 3 and set(map(id, joined.buffers)) == {id(buf)}
    sem = device.create_semaphore(0)
    for value in (1, 2):  # the fill first, then two additions: 7 at every submit, not 5 or 6
        _run(joined, sem, value)
        np.testing.assert_array_equal(_counts(device, buf), np.full(16, 7, np.uint32))
    fill.submit(signal=[(sem, 3)])  # the parts stay executions of their own
    _run(add, sem, 4)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 6, np.uint32))


def test_a_joined_execution_waits_and_signals_once(device, adder):
    buf = allocate_with(device, bytes(64))
    joined = device.join([device.prepare([adder], [[buf]])] * 4)
    gate, done = device.create_semaphore(0), device.create_semaphore(0)
    joined.submit(wait=[(gate, 1)], signal=[(done, 1)])
    assert done.value == 0  # (held back by its wait)
    gate.signal(1)
    done.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 4, np.uint32))


def test_a_joined_execution_refuses_once_a_buffer_of_a_part_is_released(device, adder):
    a, b = allocate_with(device, bytes(64)), allocate_with(device, bytes(64))
    joined = device.join([device.prepare([adder], [[a]]), device.prepare([adder], [[b]])])
    sem = device.create_semaphore(0)
    _run(joined, sem, 1)
    b.release()
    assert not joined.valid
    with pytest.raises(hal.FailedPreconditionError, match="released"):
        joined.submit(signal=[(sem, 2)])
    assert sem.value == 1 and sem.failure is None
    np.testing.assert_array_equal(_counts(device, a), np.full(16, 1, np.uint32))


def test_join_refuses_an_execution_that_is_no_longer_valid(device, kernels, adder):
    buf = allocate_with(device, bytes(64))
    stale = device.prepare([adder], [[buf]])
    buf.release()
    with pytest.raises(hal.FailedPreconditionError, match=r"executions\[0\]"):
        device.join([stale])
    spent = device.prepare([record(device, lambda cb: _add_one(kernels, cb, allocate_with(device, bytes(64))))])
    spent.submit()
    with pytest.raises(hal.FailedPreconditionError, match=r"executions\[1\]"):
        device.join([device.prepare([adder], [[allocate_with(device, bytes(64))]]), spent])


def test_joined_one_shot_work_runs_once(device, kernels):
    buf = allocate_with(device, bytes(64))
    once = device.prepare([record(device, lambda cb: _add_one(kernels, cb, buf))])
    with pytest.raises(hal.FailedPreconditionError, match="ONE_SHOT command buffer appears twice"):
        device.join([once, once])
    joined = device.join([once])
    sem = device.create_semaphore(0)
    _run(joined, sem, 1)
    for again in (joined, once):  # the command buffer is spent, whichever execution ran it
        assert not again.valid
        with pytest.raises(hal.FailedPreconditionError, match="already submitted"):
            again.submit(signal=[(sem, 2)])
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 1, np.uint32))


@pytest.mark.parametrize("case", ["empty", "not a sequence", "a string", "not an execution", "a command buffer",
                                  "another device", "another queue"])
def test_join_rejects_bad_executions_before_any_work(device, make_device, adder, case):
    buf = allocate_with(device, bytes(64))
    good = device.prepare([adder], [[buf]])
    if case == "empty":
        executions = []
    elif case == "not a sequence":
        executions = good
    elif case == "a string":
        executions = "executions"
    elif case == "not an execution":
        executions = [good, None]
    elif case == "a command buffer":
        executions = [adder]
    elif case == "another device":
        other = make_device()
        executions = [good, other.prepare([_filler(other, other.allocator.allocate(64), 1)])]
    else:
        try:
            two = make_device(queue_count=2)
        except hal.InvalidArgumentError as exc:  # a driver of one queue (as the largest count's test)
            assert "queue_count" in str(exc)
            return
        target = two.allocator.allocate(64)
        executions = [two.prepare([_filler(two, target, 1)]), two.prepare([_filler(two, target, 2)], queue=1)]
    with pytest.raises(hal.InvalidArgumentError):
        (executions[0].device if case in ("another device", "another queue") else device).join(executions)
    sem = device.create_semaphore(0)  # the device stays usable
    _run(good, sem, 1)
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 1, np.uint32))


def test_a_closed_device_refuses_join_and_the_joined_execution(make_device):
    dev = make_device()
    execution = dev.prepare([_filler(dev, dev.allocator.allocate(64), 3)])
    joined = dev.join([execution, execution])
    sem = dev.create_semaphore(0)
    _run(joined, sem, 1)
    dev.close()
    assert not joined.valid
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        joined.submit()
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        dev.join([execution])


def test_threads_joining_and_submitting_all_run(device, adder):
    buf = allocate_with(device, bytes(64))
    part = device.prepare([adder], [[buf]])
    sems = [device.create_semaphore(0) for _ in range(4)]
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(sem) -> None:
        try:
            start.wait()
            for value in range(1, 6):
                device.join([part, part]).submit(signal=[(sem, value)])
            sem.wait(5, timeout=WAIT_TIMEOUT)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(sem,)) for sem in sems]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    np.testing.assert_array_equal(_counts(device, buf), np.full(16, 40, np.uint32))
