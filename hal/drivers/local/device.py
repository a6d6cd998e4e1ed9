"""The CPU device shared by ``local-sync`` and ``local-task``.

Submissions are parked on their waits (``FenceWaiter``) and handed to
``_schedule`` once ready; the two drivers differ only in where a ready
submission runs: inline, or on a worker thread of its queue.
"""

from __future__ import annotations

import abc
import os
import threading
from collections.abc import Callable

import numpy as np

from hal.buffer import Buffer
from hal.command_buffer import CommandBuffer
from hal.device import Device
from hal.drivers.local.allocator import LocalAllocator, span
from hal.drivers.local.command_buffer import LocalCommandBuffer
from hal.drivers.local.executable import NumpyExecutable
from hal.errors import DeadlineExceededError
from hal.executable import ExecutableSpec
from hal.semaphore import Fence, FenceWaiter, Semaphore, remaining
from hal.types import BufferUsage, CommandBufferMode


class LocalDevice(Device):
    executable_formats = ("numpy",)

    def __init__(self, driver, info, *, queue_count: int = 1) -> None:
        super().__init__(driver, info, queue_count=queue_count)
        self.allocator = LocalAllocator(self)
        self._idle = threading.Condition()
        self._outstanding = 0
        self._parked: set[FenceWaiter] = set()

    # -- objects -------------------------------------------------------------------
    def _create_semaphore(self, initial_value: int) -> Semaphore:
        return Semaphore(self, initial_value)

    def _create_command_buffer(self, mode: CommandBufferMode, binding_capacity: int) -> CommandBuffer:
        return LocalCommandBuffer(self, mode, binding_capacity)

    def _prepare_executable(self, spec: ExecutableSpec) -> NumpyExecutable:
        return NumpyExecutable(self, spec)

    def _write(self, buffer: Buffer, offset: int, data: memoryview) -> None:
        span(buffer, offset, len(data))[:] = np.frombuffer(data, dtype=np.uint8)

    def _read(self, buffer: Buffer, offset: int, length: int) -> bytes:
        return span(buffer, offset, length).tobytes()

    # -- submissions -------------------------------------------------------------------
    def _queue_execute(self, queue, command_buffers, binding_tables, waits, signals) -> None:
        if command_buffers:
            def work() -> None:
                for cb, table in zip(command_buffers, binding_tables):
                    cb.execute(table)  # type: ignore[attr-defined]
        else:
            work = None
        self._submit(queue, waits, signals, work)

    def _queue_alloca(self, queue, size, memory_type, usage: BufferUsage, waits, signals) -> Buffer:
        # Host memory needs no stream ordering: allocate now, signal once the waits are reached.
        buffer = self.allocator.allocate(size, memory_type, usage)
        self._submit(queue, waits, signals, None)
        return buffer

    def _queue_dealloca(self, queue, buffer: Buffer, waits, signals) -> None:
        self._submit(queue, waits, signals, buffer.release)

    def _submit(self, queue: int, waits: list[Fence], signals: list[Fence],
                work: Callable[[], None] | None) -> None:
        with self._idle:
            self._outstanding += 1

        def finish(failure: BaseException | None) -> None:
            for sem, value in signals:
                if failure is None:
                    sem._advance(value)
                else:
                    sem._fail(failure)
            with self._idle:
                self._outstanding -= 1
                if not self._outstanding:
                    self._idle.notify_all()

        def run() -> None:
            try:
                if work is not None:
                    work()
            except BaseException as exc:  # the failure travels to every semaphore we would signal
                finish(exc)
            else:
                finish(None)

        waiter = FenceWaiter(waits, lambda: self._schedule(queue, run), finish)
        if not waiter.done:
            with self._idle:
                self._parked.add(waiter)
                # Drop waiters that completed meanwhile so the set stays small.
                self._parked = {w for w in self._parked if not w.done}

    def _cancel_parked(self, cause: BaseException) -> None:
        with self._idle:
            parked, self._parked = self._parked, set()
        for waiter in parked:
            waiter.cancel(cause)

    @abc.abstractmethod
    def _schedule(self, queue: int, run: Callable[[], None]) -> None:
        """Run a submission whose waits are all reached."""

    def _wait_idle(self, deadline: float | None) -> None:
        with self._idle:
            while self._outstanding:
                left = remaining(deadline)
                if left == 0.0:
                    raise DeadlineExceededError(
                        f"timed out waiting for {self._outstanding} outstanding submissions")
                self._idle.wait(left)


def local_device_properties(worker_threads: int) -> dict:
    from hal.drivers.local.allocator import physical_memory_bytes

    return {
        "memory_total": physical_memory_bytes(),
        "cpu_count": os.cpu_count(),
        "worker_threads": worker_threads,
        "executable_formats": list(LocalDevice.executable_formats),
        "numpy_version": np.__version__,
    }
