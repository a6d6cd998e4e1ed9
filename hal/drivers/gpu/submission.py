"""One queue operation on a GPU device, from submission to retirement.

A ``Submission`` is one issue of a ``GpuExecution`` (what ``queue_execute`` /
``queue_barrier`` / ``queue_alloca`` / ``queue_dealloca`` and a prepared
``Execution.submit`` hand to the driver): the execution holds what never changes
(queue, command buffers with their binding tables, an optional action run on the
stream), the submission what each issue brings (waits, signals, its number, its
event). Once issued it is also the *timepoint* of every semaphore it signals:
``event`` captures its work, so a later submission waits for it on the device
(``stream_wait_event``) and a host waiter blocks on the event itself.

``retired`` is set last, once every effect of the retirement happened: a retirement
cut short (a KeyboardInterrupt) leaves it False and the next retirer does it again
(``Completion.finish`` is idempotent).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hal import interrupts

if TYPE_CHECKING:
    from hal.command_buffer import CommandBuffer
    from hal.drivers.gpu.execution import GpuExecution
    from hal.drivers.gpu.queue import GpuQueue
    from hal.semaphore import Fence


class Submission:
    __slots__ = ("execution", "queue", "waits", "signals", "seq", "event", "resources", "retired")

    def __init__(self, execution: GpuExecution, queue: GpuQueue, waits: list[Fence], signals: list[Fence],
                 seq: int) -> None:
        #: What it runs (None once retired: see ``Completion.finish``).
        self.execution: GpuExecution | None = execution
        #: The execution's queue (read wherever the submission is a timepoint: whose stream runs it).
        self.queue = queue
        self.waits = waits
        self.signals = signals
        #: Submission order on the device (deferred frees wait for every lower one).
        self.seq = seq
        #: The event recorded after the work once issued (None before).
        self.event: Any = None
        #: Released when the submission retires (its one-shot command buffers' resources, staging
        #: memory of its commands), or None.
        self.resources: list[Callable[[], Any]] | None = execution.releases
        self.retired = False

    @property
    def command_buffers(self) -> Sequence[CommandBuffer]:
        """Its command buffers (none once it retired: it lets go of them)."""
        execution = self.execution
        return execution.command_buffers if execution is not None else ()

    def hold(self, release: Callable[[], Any]) -> None:
        """Call ``release`` when the submission retires (the work no longer uses the resource)."""
        if self.resources is None:
            self.resources = [release]
        else:
            self.resources.append(release)

    def __del__(self) -> None:
        try:
            event = self.event
        except AttributeError:  # its construction was interrupted (a KeyboardInterrupt)
            return
        if event is not None:  # nobody can wait on it any more: the event may be recorded again
            try:
                self.queue.events.release(event)
            except KeyboardInterrupt:
                interrupts.redeliver()
