"""The CPU device shared by ``local-sync`` and ``local-task``.

Submissions are parked on their waits (``FenceWaiter``) and handed to
``_schedule`` once ready; the two drivers differ only in where a ready
submission runs: inline, or on a worker thread of its queue.
"""

from __future__ import annotations

import abc
import functools
import os
from collections.abc import Callable

import numpy as np

from hal.buffer import Buffer
from hal.command_buffer import CommandBuffer
from hal.device import Device
from hal.drivers.local.allocator import LocalAllocator, span
from hal.drivers.local.command_buffer import LocalCommandBuffer
from hal.drivers.local.executable import NumpyExecutable
from hal.executable import ExecutableSpec
from hal.semaphore import Fence, Semaphore
from hal.submission import HostSubmissions
from hal.types import BufferUsage, CommandBufferMode


class LocalDevice(Device):
    executable_formats = ("numpy", "library")

    def __init__(self, driver, info, *, queue_count: int = 1) -> None:
        super().__init__(driver, info, queue_count=queue_count)
        self.allocator = LocalAllocator(self)
        self._submissions = HostSubmissions()
        #: Per queue: hands a ready submission to ``_schedule`` (made once: no closure per submission).
        self._schedulers = [functools.partial(self._schedule, queue) for queue in range(queue_count)]

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
        if len(command_buffers) == 1:
            work: Callable[[], None] | None = functools.partial(command_buffers[0].execute, binding_tables[0])
        elif command_buffers:
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
        self._submissions.submit(waits, signals, work, self._schedulers[queue])

    @abc.abstractmethod
    def _schedule(self, queue: int, run: Callable[[], None]) -> None:
        """Run a submission whose waits are all reached."""

    def _cancel_parked(self, cause: BaseException) -> None:
        self._submissions.cancel_parked(cause)

    def _wait_idle(self, deadline: float | None) -> None:
        self._submissions.wait_idle(deadline)


def local_device_properties(worker_threads: int) -> dict:
    from hal.drivers.local.allocator import physical_memory_bytes

    return {
        "memory_total": physical_memory_bytes(),
        "cpu_count": os.cpu_count(),
        "worker_threads": worker_threads,
        "executable_formats": list(LocalDevice.executable_formats),
        "numpy_version": np.__version__,
        # A failing numpy kernel raises a Python exception: the device runs new work afterwards.
        "recoverable_kernel_faults": True,
    }
