"""One device queue: a stream, the submissions issued on it, and their retirement.

Issue (``issue``), once a submission's waits are issuable: under the queue's lock,
the device-side waits (``stream_wait_event`` on the covering submission's event;
none for work issued earlier on this same stream, which the stream already
orders), the execution's commands (and action), and one pooled event recorded
after them; the submission then becomes the timepoint of each semaphore it signals.

Retirement: a stream runs its work in order, so once a submission's event
completed every submission issued before it on this queue did too. A host
waiter (``wait``) blocks on its submission's event and retires up to it without
asking the driver anything more; ``retire_completed`` finds the completed prefix
by querying events (the completion thread, ``sem.value``). Each retired
submission costs O(1): ``Completion.finish`` advances its semaphores and frees
what it held.

Once the queue is drained at close, a submission issued later (released by a
host ``signal()`` racing the close, say) fails its semaphores instead of
touching the stream, which is then destroyed.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

from hal import tracing
from hal.drivers.gpu import device_timing
from hal.drivers.gpu.channel import check_channels, copy_of, meet
from hal.drivers.gpu.completion import WAKE_INFLIGHT
from hal.drivers.gpu.event_pool import poll_event
from hal.drivers.gpu.status import DeviceLostError
from hal.errors import AbortedError, FailedPreconditionError, HalError

if TYPE_CHECKING:
    from hal.drivers.gpu.completion import Completion
    from hal.drivers.gpu.context import GpuContext
    from hal.drivers.gpu.event_pool import EventPool
    from hal.drivers.gpu.submission import Submission


class GpuQueue:
    def __init__(self, context: GpuContext, completion: Completion, events: EventPool, index: int) -> None:
        self.context = context
        self.index = index
        self.api = context.api
        self.events = events
        self.stream: Any = context.api.stream_create()
        #: Set under ``lock`` at close: nothing is issued on the stream afterwards.
        self.closed = False
        #: Serialises the calls on the stream (issue order is stream order).
        self.lock = threading.Lock()
        #: The submission whose commands are being issued (under ``lock``): what they hold until
        #: it retires goes on it (``Submission.hold``).
        self.issuing: Submission | None = None
        #: Issued submissions not yet retired, in issue order.
        self.inflight: collections.deque[Submission] = collections.deque()
        self.retire_lock = threading.Lock()
        self.completion = completion

    # -- issue ------------------------------------------------------------------------------
    def issue(self, sub: Submission) -> None:
        """Issue ``sub`` on the stream now (its waits are issuable); a failure fails its signals.

        The submission is committed once it is in ``inflight``. An API error before that fails
        its signals (``issue_failed``: nothing of it runs) and is reported through them only.
        A KeyboardInterrupt (or any non-``Exception``) propagates; once the commands may be on
        the stream, the submission is kept in flight behind an event recorded after whatever they
        enqueued (what they hold is released only once the stream passed it) and its signals
        fail (the work may be incomplete). An interrupt after the commit leaves the work to
        complete and retire; a timepoint it kept from being added only makes host waiters find
        the work later (``GpuDevice.catch_up``)."""
        if sub.retired:  # failed while parked (see GpuExecution.issue) and released later
            return
        context = self.context
        cut_short = False
        channels = None
        mismatched = None
        try:
            if context.lost is not None:
                raise context.lost
            api = self.api
            api.activate(context.context)
            with self.lock:
                if self.closed:
                    raise FailedPreconditionError(f"device {context.uri} was closed before the work was issued")
                if sub.event is not None:  # issued already (a parked submission released twice)
                    return
                try:
                    stream = self.stream
                    for sem, value in sub.waits:
                        timepoint = sem.device_wait(value)  # type: ignore[attr-defined]
                        if timepoint is not None and timepoint.queue is not self:
                            api.stream_wait_event(stream, timepoint.event)
                    execution = sub.execution
                    commands = execution.commands  # type: ignore[union-attr]  # (not retired: checked above)
                    channels = execution.channels  # type: ignore[union-attr]
                    if channels is not None:  # a broken channel's communicator is gone (a graph would replay it)
                        check_channels(channels)
                        if execution.meetings is not None:  # type: ignore[union-attr]
                            mismatched = meet(execution.meetings, api, stream)  # type: ignore[union-attr]
                            if mismatched is not None:
                                raise copy_of(mismatched[1])
                    timed = device_timing.begin(self) if tracing.ENABLED else None
                    if commands is not None:
                        self.issuing = sub
                        try:
                            commands()
                        finally:  # (holding it on would keep its command buffers, and their graphs, alive)
                            self.issuing = None
                    if timed is not None:
                        device_timing.end(self, sub, timed)
                    free = self.events.free
                    event = free.pop() if free else self.events.acquire()
                    try:
                        api.event_record(event, stream)
                    except BaseException:
                        self.events.release(event)
                        raise
                    sub.event = event
                    self.inflight.append(sub)
                except Exception:
                    raise
                except BaseException:
                    cut_short = self._track_cut_short(sub)
                    raise
        except BaseException as exc:
            if cut_short:
                for sem, _ in sub.signals:
                    sem.fail_from_device(exc)  # type: ignore[attr-defined]
            elif sub.event is None:
                self.issue_failed(sub, exc)
            if mismatched is not None:  # (no queue lock held: a break takes them)
                mismatched[0].ranks.break_with(mismatched[1])
            if isinstance(exc, Exception):
                return  # reported through the semaphores
            raise
        for sem, value in sub.signals:
            sem.add_timepoint(value, sub)  # type: ignore[attr-defined]
        if channels is not None:
            for channel in channels:
                if channel.timeout is not None:
                    channel.watch(sub)
        completion = self.completion
        # The sleeping completion thread is woken only if this work needs it (completion.py):
        # WAKE_INFLIGHT submissions are in flight, or deferred releases wait (``add_timepoint``
        # wakes it for a listener on a semaphore it signals). ``idle`` is read after the append:
        # a thread going to sleep meanwhile sees the work.
        if completion.idle and (len(self.inflight) >= WAKE_INFLIGHT or completion.deferred):
            completion.wake()
        if completion.idle_waiters:
            completion.notify_idle()

    def _track_cut_short(self, sub: Submission) -> bool:
        """An interrupt cut the issue of ``sub`` short, with the lock held: keep it in flight behind
        an event recorded after whatever it enqueued. False if that fails (it fails at once then)."""
        inflight = self.inflight
        if inflight and inflight[-1] is sub:
            return False  # committed already: the interrupt landed after the append
        try:
            event = self.events.acquire()
            self.api.event_record(event, self.stream)
        except Exception:
            return False
        sub.event = event
        inflight.append(sub)
        return True

    def issue_failed(self, sub: Submission, exc: BaseException) -> None:
        """Issuing ``sub`` raised ``exc``: nothing of it runs, its signals carry the failure."""
        if isinstance(exc, AbortedError) and exc.__cause__ is not None:
            exc = exc.__cause__  # a failed wait: the original failure travels on
        self.completion.finish(sub, self.context.fault(exc))

    # -- retirement ----------------------------------------------------------------------------
    # Both loops below finish the oldest submission before they pop it, and ``finish`` does
    # nothing to a retired submission: a retirement an interrupt (KeyboardInterrupt) cut short
    # leaves the submission at the head, and whoever retires next completes it. Nothing is
    # lost and nothing is popped twice.

    def wait(self, sub: Submission, deadline: float | None) -> None:
        """A host wait for ``sub``: block on (or poll) its event, then retire every submission
        through it (the stream ran the earlier ones first). Returns at the deadline without
        retiring (the caller reports the timeout)."""
        if sub.retired:
            return
        api = self.api
        try:
            api.activate(self.context.context)
            if deadline is None:
                try:
                    api.event_synchronize(sub.event)
                except HalError:  # a fault, or the call failing on its own: the event's queries tell
                    if not poll_event(api, sub.event, deadline):
                        return
            elif not poll_event(api, sub.event, deadline):
                return
        except HalError:
            self.retire_completed()  # records the device's error on the semaphores
            return
        with self.retire_lock:
            inflight = self.inflight
            finish = self.completion.finish
            while not sub.retired:  # (retired meanwhile by another thread: nothing left to do)
                finish(inflight[0], None)
                inflight.popleft()

    def retire_completed(self, blocking: bool = True) -> bool:
        """Retire the completed prefix of the in-flight submissions, querying their events; a
        failing query fails that submission's signals. True when nothing is left in flight.
        ``blocking=False`` returns at once when another thread is retiring."""
        inflight = self.inflight
        if not inflight:
            return True
        lock = self.retire_lock
        if not blocking and lock.locked():
            return False
        with lock:  # (a with statement: an interrupt cannot leave the lock held)
            api = self.api
            finish = self.completion.finish
            done_through = None  # a submission known complete, and everything before it
            if len(inflight) > 1:
                newest = inflight[-1]
                try:
                    if api.event_query(newest.event):
                        done_through = newest
                except HalError:
                    pass  # the queries below find and record the failure
            while inflight:
                sub = inflight[0]
                failure = None
                if done_through is None:
                    if not sub.retired:  # (else only the pop of an interrupted retirement is left)
                        try:
                            if not api.event_query(sub.event):
                                return False
                        except HalError as exc:
                            failure = self.context.fault(exc)
                elif sub is done_through:
                    done_through = None
                finish(sub, failure)
                inflight.popleft()
            return True

    # -- close ----------------------------------------------------------------------------------
    def drain(self) -> None:
        """Stop issuing, wait for the stream and retire everything issued on it (device close)."""
        with self.lock:
            self.closed = True
        try:
            self.api.stream_synchronize(self.stream)
        except Exception:  # a lost context: the queries below fail the work
            pass
        self.retire_completed()
        # Anything the queries could not retire (a lost context) fails rather than waits forever.
        with self.retire_lock:
            inflight = self.inflight
            while inflight:
                self.completion.finish(inflight[0], self.context.lost or DeviceLostError(
                    f"device {self.context.uri} was closed before the work completed"))
                inflight.popleft()

    def destroy(self) -> None:
        """Destroy the stream (after ``drain`` and the stream-ordered frees of the close)."""
        stream, self.stream = self.stream, None
        if stream is not None:
            try:
                self.api.stream_destroy(stream)
            except Exception:  # close releases what it can; a lost context frees the rest itself
                pass
