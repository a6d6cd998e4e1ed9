"""A GPU device's side of a prepared execution: what issuing it needs, resolved once.

``GpuDevice._prepare_execution`` makes one per ``device.prepare`` (and per ``queue_execute``,
which is prepare and one submit; barriers, allocas and deallocas make one too). Everything that
does not change from one submission to the next is looked up here once: the queue, the one-shot
command buffers' releases, and ``commands``, what issues the work on the queue's stream
(in the usual case of one command buffer, that buffer's issuer for the queue and the binding table:
for a stream command buffer one ``run_prepared`` of its packed calls, for a graph without binding
slots one ``graph_launch``, the shim's own functions with their arguments bound).

``issue`` numbers a submission, drops the waits the queue's own stream order already satisfies,
and issues it on the queue at once, or parks it in the pending queue until its waits are
issuable (wait-before-signal). A submission interrupted before the queue or the pending queue
took it (a KeyboardInterrupt) fails its signals, as any failure to issue does, so nothing stays
outstanding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from hal.drivers.gpu.channel import meeting_parts
from hal.drivers.gpu.submission import Submission

if TYPE_CHECKING:
    from hal.command_buffer import Binding, CommandBuffer
    from hal.drivers.gpu.completion import Completion
    from hal.drivers.gpu.pending_queue import PendingQueue
    from hal.drivers.gpu.queue import GpuQueue
    from hal.semaphore import Fence


class GpuExecution:
    __slots__ = ("queue", "completion", "pending", "command_buffers", "tables", "action", "releases", "commands",
                 "channels", "meetings", "_issuers")

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
        issuers = []
        releases = []
        channels: list = []
        for cb, table in zip(command_buffers, tables):
            issuers.append(cb.issuer(queue, table))  # type: ignore[attr-defined]
            if cb.one_shot:  # type: ignore[attr-defined]
                releases.append(cb.retired)  # type: ignore[attr-defined]
            channels.extend(c for c in cb.channels if not any(c is d for d in channels))  # type: ignore[attr-defined]
        #: The channels its collectives run on, or None: a broken one fails its issue and its
        #: retirement, and each issue is watched for their timeouts (hal/drivers/gpu/channel.py).
        self.channels: tuple | None = tuple(channels) or None
        #: Its collectives in issue order, each with its channel, where channels compare them with
        #: their peers' before issuing (``hal.drivers.gpu.channel.meet``; a rank alone has none to
        #: compare with), or None.
        self.meetings = meeting_parts([part for cb in command_buffers for part in cb.collectives])  # type: ignore[attr-defined]
        #: Each command buffer's issuer for this queue and table (``RecordingCommandBuffer.issuer``).
        self._issuers = issuers
        #: What the submission releases when it retires: the one-shot command buffers' resources (a
        #: reusable command buffer keeps what it holds for its next submission), or None. An
        #: execution of one-shot command buffers is submitted once: its submission takes the list.
        self.releases: list[Callable[[], None]] | None = releases or None
        #: ``commands()`` issues the work on the queue's stream, with the queue's lock held: the one
        #: command buffer's issuer in the usual case; None when there is nothing to issue.
        self.commands: Callable[[], None] | None
        if action is None and len(issuers) <= 1:
            self.commands = issuers[0] if issuers else None
        else:
            self.commands = self._issue_each

    def _issue_each(self) -> None:
        for issue in self._issuers:
            if issue is not None:
                issue()
        if self.action is not None:
            self.action(self.queue)

    def issue(self, waits: list[Fence], signals: list[Fence]) -> None:
        queue = self.queue
        if waits:
            # Waits the queue's own stream order already satisfies (a timeline whose latest signal
            # was issued on this queue: every submission of a runtime context) cost nothing further.
            for sem, value in waits:
                if not sem.ordered_on(value, queue):  # type: ignore[attr-defined]
                    break
            else:
                waits = []
        completion = self.completion
        seq = next(completion.sequence)
        sub = Submission(self, queue, waits, signals, seq)
        completion.outstanding[seq] = sub
        try:
            for sem, value in waits:
                if not sem.issuable(value):  # type: ignore[attr-defined]
                    self.pending.park(sub)
                    return
            queue.issue(sub)
        except BaseException as exc:
            # Interrupted before the queue or the pending queue took it (queue.issue fails what it
            # could not issue itself): nothing may stay outstanding. (A waiter parking it that
            # fires later finds it retired.)
            if sub.event is None and not sub.retired and not self.pending.holds(sub):
                queue.issue_failed(sub, exc)
            raise
