"""One queue operation on a GPU device, from submission to retirement.

A ``Submission`` is what ``queue_execute`` / ``queue_barrier`` / ``queue_alloca`` /
``queue_dealloca`` hand to the driver: the command buffers with their binding
tables, the waits, the signals and an optional action run on the stream. Once
issued it is also the *timepoint* of every semaphore it signals: ``event``
captures its work, so a later submission waits for it on the device
(``stream_wait_event``) and a host waiter blocks on the event itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hal.command_buffer import Binding, CommandBuffer
    from hal.drivers.gpu.queue import GpuQueue
    from hal.semaphore import Fence


class Submission:
    __slots__ = ("queue", "command_buffers", "tables", "waits", "signals", "action", "seq", "event", "resources",
                 "retired")

    def __init__(self, queue: GpuQueue, command_buffers: list[CommandBuffer], tables: list[list[Binding] | None],
                 waits: list[Fence], signals: list[Fence], action: Callable[[GpuQueue], None] | None,
                 seq: int) -> None:
        self.queue = queue
        self.command_buffers = command_buffers
        self.tables = tables
        self.waits = waits
        self.signals = signals
        #: Run on the stream after the commands (queue_dealloca's stream-ordered free).
        self.action = action
        #: Submission order on the device (deferred frees wait for every lower one).
        self.seq = seq
        #: The event recorded after the work once issued (None before).
        self.event: Any = None
        #: Released when the submission retires (staging memory of its commands), or None.
        self.resources: list[Callable[[], Any]] | None = None
        self.retired = False

    def hold(self, release: Callable[[], Any]) -> None:
        """Call ``release`` when the submission retires (the work no longer uses the resource)."""
        if self.resources is None:
            self.resources = [release]
        else:
            self.resources.append(release)

    def __del__(self) -> None:
        event = self.event
        if event is not None:  # nobody can wait on it any more: the event may be recorded again
            self.queue.events.release(event)
