"""Releases that finalizers make may run on a thread holding the lock they take.

The cycle collector runs at any allocation, on whichever thread allocates: a command buffer or
an array storage left in a reference cycle is finalized there, also while that thread is inside
the staging pool's, the allocator's or the completion's lock, and its release takes the same
lock again. Each of those locks must let the thread that holds it in (a plain lock would make
the thread wait for itself forever: a silent hang). Each test holds the lock, lets the
collector finalize such garbage, and must finish; it runs on a helper thread, so that a
regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import gc
import threading

import pytest

import hal

HANG_S = 5.0


def finishes(device, body) -> None:
    """Run ``body`` on a daemon thread; fail if it has not returned within HANG_S (the device is
    then left open: closing it would wait for the lock the stuck thread holds)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # No automatic collection: the garbage must be collected inside the lock, by the body.
    was_enabled = gc.isenabled()
    gc.disable()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if was_enabled:
        gc.enable()
    if thread.is_alive():
        device.abandoned = True
        pytest.fail("the release waited for a lock its own thread holds")
    if errors:
        raise errors[0]


class Cycle:
    """Garbage only the cycle collector frees: it refers to itself."""

    def __init__(self, payload) -> None:
        self.payload = payload
        self.me = self


@pytest.fixture(params=["stream", "graph"])
def device(request):
    from drivers.fake_gpu import FakeGpuDriver

    dev = FakeGpuDriver().create_device(command_buffer=request.param)
    dev.abandoned = False
    dev.test_mode = request.param
    yield dev
    if not dev.abandoned:
        dev.close()


def garbage_command_buffer(device) -> None:
    """A reusable command buffer holding update payloads (a staging block of the pool on stream
    command buffers, device memory on graph ones), left in a cycle."""
    buf = device.allocator.allocate(64)
    cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.update_buffer(bytes(range(16)), (buf, 0, 16))
    Cycle(cb)


def test_update_payload_released_inside_its_lock(device):
    """A command buffer's finalizer gives back its update payloads: a staging block of the pool
    (stream command buffers, under the pool's lock) or device memory (graph command buffers,
    under the allocator's lock)."""
    def body() -> None:
        garbage_command_buffer(device)
        if device.test_mode == "stream":
            lock, held = device.staging._lock, lambda: sum(map(len, device.staging._free.values()))
            gained = 1  # the block is back in the pool
        else:
            lock, held = device.allocator.memory.lock, lambda: len(device.allocator.memory)
            gained = -1  # the payload memory is freed
        before = held()
        with lock:
            gc.collect()  # as at an allocation inside the lock
        assert held() == before + gained

    finishes(device, body)


def test_deferred_free_inside_the_completion_lock(device):
    """A buffer released by a finalizer while work is in flight is a deferred free (Completion.defer)."""
    def body() -> None:
        sem = device.create_semaphore(0)
        hold = device.allocator.allocate(64)
        gate = device.create_semaphore(0)
        device.queue_barrier(wait=[(gate, 1)], signal=[(sem, 1)])  # outstanding until the gate opens

        class Owner:
            def __init__(self, buffer) -> None:
                self.buffer = buffer
                self.me = self

            def __del__(self) -> None:
                self.buffer.release()
                released.append(True)

        released: list = []
        Owner(hold)
        with device.completion._lock:
            gc.collect()
        assert released and hold.released  # finalized inside the lock; its memory is a deferred free
        gate.signal(1)
        sem.wait(1, timeout=10)

    finishes(device, body)
