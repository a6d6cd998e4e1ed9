"""Failures travel along semaphores: kernel faults and sem.fail, through chains of dependent work."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import (
    WAIT_TIMEOUT,
    allocate_with,
    assert_not_reached,
    cause_chain,
    faults_recoverable,
    read_u32,
    record,
    submit_and_wait,
)
from .kernels import CtsKernelError, load_kernels


@pytest.fixture
def faulting_device(request, fault_tests_allowed, make_device):
    """(device, recoverable): where a kernel may fail. Drivers that survive kernel faults use their
    shared device (its usability afterwards is then checked by the `device` fixture); the others
    (GPUs) a fresh one, and the rest of the process may not be able to use the GPU any more."""
    if fault_tests_allowed:
        return request.getfixturevalue("device"), True
    return make_device(), False


def failing_command_buffer(dev, exe, buf):
    return record(dev, lambda cb: cb.dispatch(exe, "cts_fail", workgroups=1, constants=[4], bindings=[buf]))


def assert_aborted_by_kernel(err: hal.AbortedError, raised_in_python: bool) -> None:
    assert isinstance(err, hal.AbortedError)
    chain = cause_chain(err)
    assert len(chain) > 1, "an AbortedError carries its cause"
    if raised_in_python:  # else the cause is the driver's own fault report
        assert any(isinstance(e, CtsKernelError) for e in chain)
        assert "failed on purpose" in str(err)


@pytest.mark.gpu_fault
def test_kernel_failure_propagates(faulting_device):
    """One fault per process is all a GPU allows, so this single test covers the whole story."""
    dev, recoverable = faulting_device
    exe = load_kernels(dev)
    buf = allocate_with(dev, bytes(16))
    victim = allocate_with(dev, np.zeros(8, np.uint32))
    a, b, s2, s3 = dev.create_semaphore(0), dev.create_semaphore(2), dev.create_semaphore(0), dev.create_semaphore(0)
    dev.queue_execute([failing_command_buffer(dev, exe, buf)], signal=[(a, 1), (b, 3)])  # does not raise
    add = record(dev, lambda cb: cb.dispatch(exe, "cts_add_one", workgroups=1, constants=[8], bindings=[victim]))
    dev.queue_execute([add], wait=[(a, 1)], signal=[(s2, 1)])
    dev.queue_barrier(wait=[(s2, 1)], signal=[(s3, 1)])

    # Every semaphore the failed submission would signal fails, with the kernel's error as cause.
    for sem, value in ((a, 1), (b, 3)):
        with pytest.raises(hal.AbortedError) as info:
            sem.wait(value, timeout=WAIT_TIMEOUT)
        assert_aborted_by_kernel(info.value, recoverable)
        assert sem.failure is not None
        with pytest.raises(hal.AbortedError):
            _ = sem.value
    original = a.failure
    # Work waiting on them fails too, carrying the original cause, and does not run.
    for sem in (s2, s3):
        with pytest.raises(hal.AbortedError) as info:
            sem.wait(1, timeout=WAIT_TIMEOUT)
        assert original in cause_chain(info.value), "the chain's failures carry the original cause"
        assert_aborted_by_kernel(info.value, recoverable)
    # The device still hands out working semaphores.
    fresh = dev.create_semaphore(0)
    fresh.signal(1)
    assert fresh.value == 1
    if recoverable:
        np.testing.assert_array_equal(read_u32(dev, victim), np.zeros(8, np.uint32))


def test_device_runs_new_work_after_a_kernel_failure(device, kernels):
    if not faults_recoverable(device):
        pytest.skip("after a GPU kernel fault only new semaphores are promised, not new work")
    buf = allocate_with(device, bytes(16))
    sem = device.create_semaphore(0)
    device.queue_execute([failing_command_buffer(device, kernels, buf)], signal=[(sem, 1)])
    with pytest.raises(hal.AbortedError):
        sem.wait(1, timeout=WAIT_TIMEOUT)
    out = allocate_with(device, np.zeros(16, np.uint32))
    cb = record(device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=1, constants=[16], bindings=[out]))
    submit_and_wait(device, [cb])
    np.testing.assert_array_equal(read_u32(device, out), np.arange(16, dtype=np.uint32))
    again = device.create_semaphore(0)
    device.queue_execute([failing_command_buffer(device, kernels, buf)], signal=[(again, 1)])
    with pytest.raises(hal.AbortedError):
        again.wait(1, timeout=WAIT_TIMEOUT)
    submit_and_wait(device, [record(device, lambda cb: cb.fill_buffer(out, 0, 4))])
    np.testing.assert_array_equal(read_u32(device, out), np.zeros(16, np.uint32))


@pytest.mark.parametrize("cause", [ValueError("input was bad"), "plain message failure"], ids=["exception", "message"])
def test_host_failure_reaches_deferred_work(device, kernels, cause):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    gate, done, after = (device.create_semaphore(0) for _ in range(3))
    add = record(device, lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[8], bindings=[buf]))
    device.queue_execute([add], wait=[(gate, 1)], signal=[(done, 1)])
    device.queue_barrier(wait=[(done, 1)], signal=[(after, 1)])
    assert_not_reached(done, 1)
    gate.fail(cause)
    message = str(cause)
    for sem in (done, after):
        with pytest.raises(hal.AbortedError) as info:
            sem.wait(1, timeout=WAIT_TIMEOUT)
        assert message in str(info.value)
        if isinstance(cause, BaseException):
            assert cause in cause_chain(info.value)
            assert info.value.__cause__ is cause
    np.testing.assert_array_equal(read_u32(device, buf), np.zeros(8, np.uint32))


def test_waiting_on_an_already_failed_semaphore_fails_at_once(device):
    buf = allocate_with(device, bytes(8))
    failed, done = device.create_semaphore(0), device.create_semaphore(0)
    failed.fail(RuntimeError("failed before submission"))
    device.queue_execute([record(device, lambda cb: cb.fill_buffer(buf, 1, 1))], wait=[(failed, 1)], signal=[(done, 1)])
    with pytest.raises(hal.AbortedError) as info:
        done.wait(1, timeout=WAIT_TIMEOUT)
    assert "failed before submission" in str(info.value)
    assert device.read(buf) == bytes(8)


def test_one_failed_wait_among_several_fails_the_work(device):
    buf = allocate_with(device, bytes(8))
    good, bad, done = (device.create_semaphore(0) for _ in range(3))
    device.queue_execute(
        [record(device, lambda cb: cb.fill_buffer(buf, 1, 1))], wait=[(good, 1), (bad, 1)], signal=[(done, 1)]
    )
    good.signal(1)
    bad.fail("second wait failed")
    with pytest.raises(hal.AbortedError):
        done.wait(1, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == bytes(8)


def test_independent_work_is_unaffected_by_a_failure(device, kernels):
    failing_gate, failing_done = device.create_semaphore(0), device.create_semaphore(0)
    ok_done = device.create_semaphore(0)
    buf = allocate_with(device, np.zeros(8, np.uint32))
    device.queue_barrier(wait=[(failing_gate, 1)], signal=[(failing_done, 1)])
    failing_gate.fail("unrelated failure")
    add = record(device, lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[8], bindings=[buf]))
    device.queue_execute([add], signal=[(ok_done, 1)])
    ok_done.wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf), np.ones(8, np.uint32))
    with pytest.raises(hal.AbortedError):
        failing_done.wait(1, timeout=WAIT_TIMEOUT)


def test_failed_wait_fails_queue_alloca_signal(device):
    gate, ready = device.create_semaphore(0), device.create_semaphore(0)
    buf = device.queue_alloca(64, wait=[(gate, 1)], signal=[(ready, 1)])
    gate.fail("no memory for you")
    with pytest.raises(hal.AbortedError) as info:
        ready.wait(1, timeout=WAIT_TIMEOUT)
    assert "no memory for you" in str(info.value)
    buf.release()


def test_wait_any_reports_a_failure_of_dependent_work(device):
    gate, done, other = (device.create_semaphore(0) for _ in range(3))
    device.queue_barrier(wait=[(gate, 1)], signal=[(done, 1)])
    gate.fail("gate failed")
    with pytest.raises(hal.AbortedError):
        hal.wait_any([(other, 1), (done, 1)], timeout=WAIT_TIMEOUT)
