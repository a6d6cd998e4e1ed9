"""Ctrl-C is never swallowed: not by work a CPU driver runs on the caller's thread, not by a finalizer.

A KeyboardInterrupt raised in inline work fails the submission's semaphores and reaches the caller;
one raised in ``__del__`` (which Python prints and drops) is delivered to the main thread again
(``hal.interrupts.redeliver``). A program interrupted in either place stops.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import hal
import runtime as rt
from runtime.device import context_for


def test_an_interrupt_in_inline_work_fails_the_work_and_reaches_the_caller():
    device = hal.create_device("local-sync")
    try:
        buf = device.allocator.allocate(16)
        cb = device.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buf, pattern=1, pattern_length=1)
        sem = device.create_semaphore(0)
        ops = cb.ops  # the local command buffer's recorded operations (a test of that driver)

        def interrupted(table):
            raise KeyboardInterrupt

        ops.insert(0, interrupted)
        with pytest.raises(KeyboardInterrupt):
            device.queue_execute([cb], signal=[(sem, 1)])
        assert sem.failure is not None  # nothing waits forever for the work
        fresh = device.create_semaphore(0)
        cb2 = device.create_command_buffer()
        with cb2.record():
            cb2.fill_buffer(buf, pattern=2, pattern_length=1)
        device.queue_execute([cb2], signal=[(fresh, 1)])
        fresh.wait(1)
        assert device.read(buf) == bytes([2] * 16)  # the device works on
    finally:
        device.close()


def test_an_interrupt_in_a_finalizer_is_delivered_again(monkeypatch):
    device = hal.create_device("local-sync")
    ctx = context_for(device)
    x = (rt.array(np.ones(8, np.float32), device=device) * 2).eval()

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(ctx.buffers), "release", interrupted)
    with pytest.raises(KeyboardInterrupt):
        del x  # Storage.__del__ returns its buffer: interrupted there
        for _ in range(1000):  # the interrupt comes back at the main thread's next check
            time.sleep(0.001)
    monkeypatch.undo()
    assert (rt.array(np.ones(2, np.float32), device=device) + 1).numpy().tolist() == [2.0, 2.0]
    device.close()


def test_an_interrupt_in_a_weakref_finalizer_is_delivered_again():
    """weakref.finalize callbacks (a GPU command buffer's release of its graph and workspaces) are
    dropped by Python as ``__del__``'s are: ``hal.interrupts.finalize`` delivers the interrupt again."""
    from hal import interrupts

    class Resource:
        pass

    calls = []

    def interrupted(*args):
        calls.append(args)
        raise KeyboardInterrupt

    resource = Resource()
    interrupts.finalize(resource, interrupted, 1, 2)
    with pytest.raises(KeyboardInterrupt):
        del resource
        for _ in range(1000):
            time.sleep(0.001)
    assert calls == [(1, 2)]


@pytest.mark.parametrize("mode", ["graph", "stream"])
def test_an_interrupt_while_a_gpu_command_buffer_is_collected_is_delivered_again(mode, monkeypatch):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from drivers.fake_gpu import FakeGpuDriver

    device = FakeGpuDriver().create_device(command_buffer=mode)
    try:
        buf = device.allocator.allocate(16)
        cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE)
        with cb.record():
            cb.update_buffer(b"\x07" * 16, buf)  # (a staging block to release)
        sem = device.create_semaphore(0)
        device.queue_execute([cb], signal=[(sem, 1)])
        sem.wait(1, timeout=10)

        def interrupted(*args):
            raise KeyboardInterrupt

        monkeypatch.setattr(type(device.gpu), "release_later", interrupted)  # (what the finalizer calls)
        with pytest.raises(KeyboardInterrupt):
            del cb
            for _ in range(1000):
                time.sleep(0.001)
        monkeypatch.undo()
        assert device.read(buf) == b"\x07" * 16  # the device works on
    finally:
        device.close()
