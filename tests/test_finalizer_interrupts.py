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
