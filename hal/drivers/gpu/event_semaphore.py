"""Timeline semaphores emulated with GPU events.

The host-side timeline (value, failure, host waiters, listeners) is the core's
``hal.Semaphore``. On top of it an ``EventSemaphore`` keeps device *timepoints*:
``(value, Submission)`` pairs added when a submission that signals the semaphore
is issued to a stream. The submission's event completes when its work does, so:

- a later submission waiting for a value a timepoint covers is issued at once
  with a device-side wait on the event (``stream_wait_event``; none at all on
  the same stream), without a host round trip;
- a wait that no timepoint covers yet (wait-before-signal) stays parked in the
  device's pending queue until a timepoint or a host ``signal()`` reaches it;
- a host ``wait()`` blocks on the event itself (``event_synchronize``) and
  retires the work on its own thread, instead of waiting for the completion thread.

The semaphore drops the timepoints its value passed.
"""

from __future__ import annotations

import bisect
import heapq
from typing import TYPE_CHECKING

from hal.errors import aborted_by
from hal.semaphore import Listener, Semaphore, remaining

if TYPE_CHECKING:
    from hal.drivers.gpu.device import GpuDevice
    from hal.drivers.gpu.submission import Submission

#: Timepoints a semaphore keeps before dropping those its value passed.
PRUNE_AT = 4


class EventSemaphore(Semaphore):
    """A ``hal.Semaphore`` with device timepoints (see the module docstring)."""

    device: GpuDevice

    def __init__(self, device: GpuDevice, initial_value: int = 0) -> None:
        super().__init__(device, initial_value)
        #: Sorted by value (submissions usually signal increasing values: appending keeps the order).
        self._timepoints: list[tuple[int, Submission]] = []
        #: Heap of (value, token, listener) of parked work; entries whose token left the set were cancelled.
        self._issuable: list[tuple[int, int, Listener]] = []
        self._issuable_tokens: set[int] = set()

    # -- device timepoints -----------------------------------------------------------
    def add_timepoint(self, value: int, timepoint: Submission) -> bool:
        """A submission signalling ``value`` was issued; wake work that may now be issued behind it.
        Returns whether a host listener (``hal.wait_any``, parked work) waits on this semaphore: then
        the completion thread must retire the work, as nobody waits on its event.

        Timepoints the value passed are dropped here, a few at a time (not at each advance:
        retiring stays cheap; a passed timepoint only keeps its submission's event out of the
        pool a little longer)."""
        with self._lock:
            current = self.current_value
            if value <= current or self.failure is not None:
                return False
            timepoints = self._timepoints
            if len(timepoints) >= PRUNE_AT and timepoints[0][0] <= current:
                if timepoints[-1][0] <= current:
                    timepoints.clear()  # the usual case: the value passed every timepoint
                else:
                    del timepoints[:bisect.bisect_right(timepoints, current, key=_value_of)]
            if not timepoints or timepoints[-1][0] <= value:
                timepoints.append((value, timepoint))
            else:
                timepoints.insert(bisect.bisect_right(timepoints, value, key=_value_of), (value, timepoint))
            if not (self._waiters or self._issuable):
                return bool(self._parked)
            if self._waiters:  # host waiters that found no timepoint: they can wait on its event now
                self._reached.notify_all()
            ready = self._pop_issuable(value)
            listened = bool(self._parked)
        for listener in ready:
            listener(None)
        return listened

    def device_wait(self, value: int) -> Submission | None:
        """None if ``value`` is reached on the host, else the submission whose event a device
        wait for ``value`` waits on (called at issue: one covers it). AbortedError if failed."""
        if self.current_value >= value and self.failure is None:
            return None
        with self._lock:
            if self.failure is not None:
                raise aborted_by(self.failure, f"semaphore failed before value {value} was reached")
            if self.current_value >= value:
                return None
            timepoint = self._covering(value)
        if timepoint is None:
            raise AssertionError(f"no timepoint covers value {value}")  # the pending queue prevents this
        return timepoint

    def ordered_on(self, value: int, queue: object) -> bool:
        """Whether work issued on ``queue`` now needs no wait at all for ``value``: the value is
        reached, or the latest timepoint, at or above it, was issued on that same queue (its
        stream runs that work first). False sends the wait down the general path (``issuable``,
        ``device_wait`` at issue), which also reports a failure. Read without the lock: timepoints
        are only added or dropped once passed, and a list emptied meanwhile only answers False."""
        if self.failure is not None:
            return False
        if self.current_value >= value:
            return True
        try:
            latest, timepoint = self._timepoints[-1]
        except IndexError:
            return False
        return latest >= value and timepoint.queue is queue

    def issuable(self, value: int) -> bool:
        """Whether work waiting for ``value`` can be issued now: the value is reached, a
        timepoint covers it, or the semaphore failed (then issuing fails the work)."""
        if self.current_value >= value or self.failure is not None:
            return True
        timepoints = self._timepoints
        return bool(timepoints) and timepoints[-1][0] >= value

    def _covering(self, value: int) -> Submission | None:
        """The timepoint of the smallest value >= ``value`` (call with the lock held)."""
        timepoints = self._timepoints
        if timepoints and timepoints[-1][0] >= value and (len(timepoints) == 1 or timepoints[-2][0] < value):
            return timepoints[-1][1]  # the usual case: waiting for the latest signal
        index = bisect.bisect_left(timepoints, value, key=_value_of)
        return timepoints[index][1] if index < len(timepoints) else None

    def _peek_timepoint(self, value: int) -> Submission | None:
        with self._lock:
            if self.failure is not None or self.current_value >= value:
                return None
            return self._covering(value)

    def notify_issuable(self, value: int, listener: Listener) -> int | None:
        """Call ``listener`` once work waiting for ``value`` can be issued: the value is reached,
        a timepoint covers it, or the semaphore failed (then with the failure). Returns a token
        for ``cancel_issuable`` when it had to wait (None when it ran at once)."""
        with self._lock:
            failure = self.failure
            timepoints = self._timepoints
            if failure is None and self.current_value < value and not (timepoints and timepoints[-1][0] >= value):
                token = next(self._tokens)
                heapq.heappush(self._issuable, (value, token, listener))
                self._issuable_tokens.add(token)
                return token
        listener(failure)
        return None

    def cancel_issuable(self, token: int | None) -> None:
        """Forget a listener of ``notify_issuable`` (parked work failed at close): nothing of it stays."""
        if token is not None:
            with self._lock:
                self._issuable_tokens.discard(token)
                if not self._issuable_tokens:
                    self._issuable = []

    def _pop_issuable(self, value: int) -> list[Listener]:
        ready = []
        issuable, live = self._issuable, self._issuable_tokens
        while issuable and issuable[0][0] <= value:
            _, token, listener = heapq.heappop(issuable)
            if token in live:
                live.discard(token)
                ready.append(listener)
        return ready

    # -- the host timeline, extended ------------------------------------------------------
    def _notify_at(self, value: int, listener: Listener) -> int | None:
        """A host listener (``hal.wait_any``): nobody may wait on the event itself, so the
        completion thread must retire the work that reaches the value."""
        token = super()._notify_at(value, listener)
        if token is not None:
            self.device.wake_completion()
        return token

    def _advance(self, value: int) -> None:
        Semaphore._advance(self, value)
        if self._issuable:  # parked work waiting for a value no timepoint covered
            with self._lock:
                ready = self._pop_issuable(self.current_value)
            for listener in ready:
                listener(None)

    advance = _advance  # the driver-facing name, without the core's extra frame (retiring calls it)

    def _fail(self, cause: BaseException) -> None:
        super()._fail(cause)
        with self._lock:
            live = self._issuable_tokens
            pending = [entry[2] for entry in sorted(self._issuable, key=_order) if entry[1] in live]
            self._issuable = []
            self._issuable_tokens = set()
            self._timepoints = []
        for listener in pending:
            listener(cause)

    @property
    def value(self) -> int:
        """The current value, counting device work that completed since the last retirement."""
        timepoints = self._timepoints
        if timepoints and timepoints[-1][0] > self.current_value:  # (else nothing issued can raise it further)
            self.device.retire_completed(blocking=False)
        return Semaphore.value.fget(self)  # type: ignore[attr-defined]

    def _wait(self, value: int, deadline: float | None) -> None:
        """Wait on the event of the timepoint covering ``value`` and retire the work this thread;
        before the work is issued (wait-before-signal), sleep until a timepoint or the value
        arrives. Host waiters never need the completion thread."""
        while self.current_value < value and self.failure is None:
            timepoints = self._timepoints
            try:  # the usual case, read without the lock: waiting for the latest signal
                latest, timepoint = timepoints[-1]
                if latest < value or (len(timepoints) > 1 and timepoints[-2][0] >= value):
                    timepoint = self._peek_timepoint(value)
            except IndexError:
                timepoint = self._peek_timepoint(value)
            if timepoint is not None:
                if self.device.closed_for_good:
                    break
                timepoint.queue.wait(timepoint, deadline)
                if self.current_value >= value and self.failure is None:
                    return  # retired by this thread: no need to look again under the lock
                break
            with self._lock:
                if self.current_value >= value or self.failure is not None or self._covering(value) is not None:
                    continue
                left = remaining(deadline)
                if left == 0.0:
                    break
                self._waiters += 1
                try:
                    self._reached.wait(left)  # woken by _advance or add_timepoint
                finally:
                    self._waiters -= 1
        super()._wait(value, deadline)


def _value_of(entry: tuple[int, Submission]) -> int:
    return entry[0]


def _order(entry: tuple[int, int, Listener]) -> tuple[int, int]:
    return entry[0], entry[1]


class Issuable:
    """Adapts an EventSemaphore so the core's FenceWaiter waits for *issuable* rather than *reached*.

    FenceWaiter registers with ``notify_at(value, listener)`` and cancels with
    ``cancel_notify(token)``; this view routes them to ``notify_issuable`` and
    ``cancel_issuable``, which also fire when a device timepoint covers the value.
    """

    __slots__ = ("sem",)

    def __init__(self, sem: EventSemaphore) -> None:
        self.sem = sem

    def notify_at(self, value: int, listener: Listener) -> int | None:
        return self.sem.notify_issuable(value, listener)

    def cancel_notify(self, token: int | None) -> None:
        self.sem.cancel_issuable(token)
