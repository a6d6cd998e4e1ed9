"""A GPU device's side of a prepared execution: what issuing it needs, looked up once.

``GpuDevice._prepare_execution`` makes one per ``device.prepare`` (and per ``queue_execute``,
which is prepare and one submit). ``issue`` numbers the submission, drops the waits the queue's
own stream order already satisfies, and issues it on the queue at once, or parks it in the
pending queue until its waits are issuable (wait-before-signal).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hal.drivers.gpu.submission import Submission

if TYPE_CHECKING:
    from hal.command_buffer import Binding, CommandBuffer
    from hal.drivers.gpu.completion import Completion
    from hal.drivers.gpu.pending_queue import PendingQueue
    from hal.drivers.gpu.queue import GpuQueue
    from hal.semaphore import Fence


class GpuExecution:
    __slots__ = ("queue", "completion", "pending", "command_buffers", "tables", "action")

    def __init__(self, queue: GpuQueue, completion: Completion, pending: PendingQueue,
                 command_buffers: list[CommandBuffer], tables: list[list[Binding] | None],
                 action: Callable[[GpuQueue], None] | None = None) -> None:
        self.queue = queue
        self.completion = completion
        self.pending = pending
        self.command_buffers = command_buffers
        self.tables = tables
        #: Run on the stream after the commands (queue_dealloca's stream-ordered free), or None.
        self.action = action

    def issue(self, waits: list[Fence], signals: list[Fence]) -> None:
        completion = self.completion
        seq = next(completion.sequence)
        q = self.queue
        if waits:
            # Waits the queue's own stream order already satisfies (a timeline whose latest signal
            # was issued on this queue: every submission of a runtime context) cost nothing further.
            for sem, value in waits:
                if not sem.ordered_on(value, q):  # type: ignore[attr-defined]
                    break
            else:
                waits = []
        sub = Submission(q, self.command_buffers, self.tables, waits, signals, self.action, seq)
        completion.outstanding[seq] = sub
        for sem, value in waits:
            if not sem.issuable(value):  # type: ignore[attr-defined]
                self.pending.park(sub)
                return
        q.issue(sub)
