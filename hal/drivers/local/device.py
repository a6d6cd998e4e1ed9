"""The CPU device shared by ``local-sync`` and ``local-task``.

Submissions are parked on their waits (``FenceWaiter``) and handed to
``_schedule`` once ready; the two drivers differ only in where a ready
submission runs: inline, or on a worker thread of its queue.

Collectives (``hal.drivers.local.channel``): once a channel is made on the device,
its queues keep their order through a ``QueueGate`` (a submission stopped at a
collective until the other ranks arrive holds back the later ones), and a
submission with collectives runs as an ``Execution`` that carries on, on its
queue, when its collectives complete.
"""

from __future__ import annotations

import abc
import functools
import os
import weakref
from collections.abc import Callable

import numpy as np

from hal.buffer import Buffer
from hal.command_buffer import CommandBuffer
from hal.device import Device
from hal.drivers.local.allocator import LocalAllocator, span
from hal.drivers.local.channel import LocalChannel, LocalCollectives
from hal.drivers.local.command_buffer import Execution, LocalCommandBuffer
from hal.drivers.local.executable import NumpyExecutable
from hal.errors import FailedPreconditionError, InvalidArgumentError
from hal.executable import ExecutableSpec
from hal.semaphore import Fence, Semaphore
from hal.submission import HostSubmissions, QueueGate
from hal.types import BufferUsage, CommandBufferMode

#: The channel groups of every CPU device of this process (local-sync and local-task ranks can meet).
COLLECTIVES = LocalCollectives()


class LocalDevice(Device):
    executable_formats = ("numpy", "library")
    #: Channels of this device are ranks of the in-process reference channel (``hal.create_channel``).
    collectives = COLLECTIVES

    def __init__(self, driver, info, *, queue_count: int = 1) -> None:
        super().__init__(driver, info, queue_count=queue_count)
        self.allocator = LocalAllocator(self)
        self._submissions = HostSubmissions()
        #: Per queue: hands a ready submission to ``_schedule`` (made once: no closure per submission).
        self._schedulers = [functools.partial(self._schedule, queue) for queue in range(queue_count)]
        #: Per queue, once the device has a channel: what keeps the queue's order (see the module).
        self._gates: list[QueueGate] | None = None
        self._channels: weakref.WeakSet[LocalChannel] = weakref.WeakSet()

    def adopt_channel(self, channel: LocalChannel) -> None:
        """A channel was made on this device: order its queues (once) and fail the channel at close."""
        if not isinstance(channel, LocalChannel):
            raise InvalidArgumentError(f"adopt_channel() takes a channel of the CPU drivers, got {channel!r}")
        if self._gates is None:
            self._gates = [QueueGate() for _ in range(self.queue_count)]
        self._channels.add(channel)

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
        if any(cb.has_collectives for cb in command_buffers):
            steps = [(op, table) for cb, table in zip(command_buffers, binding_tables) for op in cb.ops]
            resume = self._schedulers[queue]
            work: Callable[[], object] | None = lambda: Execution(steps, resume).run()  # noqa: E731
        elif len(command_buffers) == 1:
            work = functools.partial(command_buffers[0].execute, binding_tables[0])
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
                work: Callable[[], object] | None) -> None:
        gates = self._gates
        self._submissions.submit(waits, signals, work, self._schedulers[queue], None if gates is None else gates[queue])

    @abc.abstractmethod
    def _schedule(self, queue: int, run: Callable[[], None]) -> None:
        """Run a submission whose waits are all reached."""

    def _cancel_parked(self, cause: BaseException) -> None:
        self._submissions.cancel_parked(cause)
        closed = FailedPreconditionError(f"device {self.info.uri} of a channel rank was closed")
        for channel in list(self._channels):  # a rank gone: its groups' collectives in flight fail
            channel.fail(closed)
            channel.group.fail(closed)

    def _wait_idle(self, deadline: float | None) -> None:
        self._before_idle_wait(deadline)
        self._submissions.wait_idle(deadline)

    def _before_idle_wait(self, deadline: float | None) -> None:
        """Called before ``wait_idle`` blocks (local-task runs ready work on the waiting thread)."""


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
