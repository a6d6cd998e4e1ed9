"""Behaviour specific to the two CPU drivers (the CTS covers what every driver shares)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hal


def blocking_kernel(gate: threading.Event, started: threading.Event):
    def kernel(workgroups, bindings, constants):
        started.set()
        if not gate.wait(10):
            raise TimeoutError("gate never opened")
        np.frombuffer(bindings[0], np.uint32)[:] = constants[0]
    return kernel


def submit_blocking(device, gate, started, value=7):
    exe = device.load_executable(hal.ExecutableSpec(
        "numpy", blocking_kernel(gate, started), [hal.Export("block", (1, 1, 1), 1, 1)]))
    buf = device.allocator.allocate(16)
    device.write(buf, bytes(16))
    done = device.create_semaphore(0)
    cb = device.create_command_buffer()
    with cb.record():
        cb.dispatch(exe, 0, 1, [value], [buf])
    device.queue_execute([cb], signal=[(done, 1)])
    return buf, done


def test_local_task_queue_execute_returns_before_the_work_runs():
    gate, started = threading.Event(), threading.Event()
    with hal.create_device("local-task") as device:
        buf, done = submit_blocking(device, gate, started)
        assert started.wait(10), "the worker thread never started the kernel"
        assert done.value == 0  # the kernel is blocked on the gate, yet we are back here
        assert device.read(buf) == bytes(16)
        gate.set()
        done.wait(1, timeout=10)
        assert np.all(np.frombuffer(device.read(buf), np.uint32) == 7)


def test_local_sync_runs_ready_work_before_queue_execute_returns():
    with hal.create_device("local-sync") as device:
        buf = device.allocator.allocate(64)
        done = device.create_semaphore(0)
        cb = device.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buf, 0xAB, 1)
        device.queue_execute([cb], signal=[(done, 1)])
        assert done.value == 1
        assert device.read(buf) == b"\xab" * 64


def test_local_sync_runs_deferred_work_inside_the_host_signal():
    with hal.create_device("local-sync") as device:
        buf = device.allocator.allocate(8)
        device.write(buf, bytes(8))
        gate, done = device.create_semaphore(0), device.create_semaphore(0)
        cb = device.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buf, 0x01020304, 4)
        device.queue_execute([cb], wait=[(gate, 1)], signal=[(done, 1)])
        assert done.value == 0 and device.read(buf) == bytes(8)
        gate.signal(1)
        assert done.value == 1
        assert device.read(buf) == bytes.fromhex("0403020104030201")


@pytest.mark.parametrize("uri", ["local-sync", "local-task"])
def test_long_chain_of_deferred_submissions_has_no_recursion_limit(uri):
    """5000 submissions each waiting on the previous one, all released by one host signal."""
    with hal.create_device(uri) as device:
        sem = device.create_semaphore(0)
        counter = device.allocator.allocate(4)
        device.write(counter, bytes(4))
        exe = device.load_executable(hal.ExecutableSpec(
            "numpy", lambda w, b, c: np.add(np.frombuffer(b[0], np.uint32), 1, out=np.frombuffer(b[0], np.uint32)),
            [hal.Export("inc", (1, 1, 1), 1, 0)]))
        cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
        with cb.record():
            cb.dispatch(exe, 0, 1, [], [counter])
        links = 5000
        for i in range(1, links + 1):
            device.queue_execute([cb], wait=[(sem, i)], signal=[(sem, i + 1)])
        sem.signal(1)
        sem.wait(links + 1, timeout=60)
        assert np.frombuffer(device.read(counter), np.uint32)[0] == links


@pytest.mark.parametrize("uri", ["local-sync", "local-task"])
def test_close_fails_work_parked_on_unreached_waits(uri):
    device = hal.create_device(uri)
    never, after = device.create_semaphore(0), device.create_semaphore(0)
    device.queue_barrier(wait=[(never, 1)], signal=[(after, 1)])
    device.close()
    with pytest.raises(hal.AbortedError, match="closed"):
        after.wait(1, timeout=5)
    with pytest.raises(hal.FailedPreconditionError):
        device.allocator.allocate(16)


def test_local_task_queues_run_independently():
    """Work blocked on one queue does not hold back another queue."""
    gate, started = threading.Event(), threading.Event()
    with hal.create_device("local-task", queue_count=2) as device:
        _, blocked = submit_blocking(device, gate, started)
        assert started.wait(10)
        other = device.create_semaphore(0)
        buf = device.allocator.allocate(4)
        cb = device.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buf, 0x11, 1)
        device.queue_execute([cb], signal=[(other, 1)], queue=1)
        other.wait(1, timeout=10)
        assert blocked.value == 0
        gate.set()
        blocked.wait(1, timeout=10)


@pytest.mark.parametrize("uri", ["local-sync", "local-task"])
def test_device_address_of_buffers_and_subspans(uri):
    import ctypes

    with hal.create_device(uri) as device:
        buf = device.allocator.allocate(64)
        device.write(buf, bytes(range(64)))
        part = buf.subspan(16, 8)
        assert part.device_address == buf.device_address + 16
        assert ctypes.string_at(part.device_address, 8) == bytes(range(16, 24))
        buf.release()
        with pytest.raises(hal.FailedPreconditionError):
            _ = buf.device_address
