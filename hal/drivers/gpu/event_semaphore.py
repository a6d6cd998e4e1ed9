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

The semaphore drops the timepoints its value passed. Work parked on a value (the pending
queue) is an ordinary listener of the host timeline that a covering timepoint fires early.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from typing import TYPE_CHECKING

from hal.errors import aborted_by
from hal.semaphore import Listener, Semaphore, remaining, wait_slice

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
        #: Heap of (value, token, listener) of parked work. Each is also an ordinary listener of
        #: the base (fired when the value is reached or the semaphore fails); this index fires it
        #: earlier, once a timepoint covers its value. Whichever comes first takes it (``_unpark``).
        self._issuable: list[tuple[int, int, Listener]] = []

    # -- device timepoints -----------------------------------------------------------
    def add_timepoint(self, value: int, timepoint: Submission) -> None:
        """A submission signalling ``value`` was issued; wake work that may now be issued behind it.
        While a listener (``hal.wait_any``, parked work) waits on this semaphore, the completion
        thread is woken to retire the work: nobody may wait on its event.

        Timepoints the value passed are dropped here, a few at a time (not at each advance:
        retiring stays cheap; a passed timepoint only keeps its submission's event out of the
        pool a little longer)."""
        with self._lock:
            current = self.current_value
            if value <= current or self.failure is not None:
                return
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
            if self._waiters:  # host waiters that found no timepoint: they can wait on its event now
                self._reached.notify_all()
            if not self._parked:  # the usual case: no listener
                return
            ready = self._pop_issuable(value) if self._issuable else ()
            listened = bool(self._parked)
        for listener in ready:
            listener(None)
        if listened:
            self.device.wake_completion()

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
        """The timepoint of the smallest value >= ``value`` (of the latest to signal it, if several
        do: it completes no sooner, and reaches the value as well), or None.

        Exact with the lock held. A host waiter reads it without the lock: a list changed
        meanwhile may answer None (the waiter then looks again under the lock) or a timepoint
        of a lower value (the waiter retires through it and looks again)."""
        timepoints = self._timepoints
        try:
            latest, timepoint = timepoints[-1]
            if latest == value:
                return timepoint  # the usual case: waiting for the latest signal
            return timepoints[bisect.bisect_left(timepoints, value, key=_value_of)][1]
        except IndexError:
            return None

    def notify_issuable(self, value: int, listener: Listener) -> int | None:
        """Call ``listener`` once work waiting for ``value`` can be issued: the value is reached,
        a timepoint covers it, or the semaphore failed (then with the failure). Returns a token
        for ``cancel_issuable`` when it had to wait (None when it ran at once)."""
        with self._lock:
            failure = self.failure
            timepoints = self._timepoints
            if failure is None and self.current_value < value and not (timepoints and timepoints[-1][0] >= value):
                token = self._park(value, listener)
                issuable = self._issuable
                if len(issuable) > 2 * len(self._parked) + 8:  # mostly entries the base fired or cancelled
                    parked = self._parked
                    issuable = self._issuable = [entry for entry in issuable if entry[1] in parked]
                    heapq.heapify(issuable)
                heapq.heappush(issuable, (value, token, listener))
                return token
        listener(failure)
        return None

    def cancel_issuable(self, token: int | None) -> None:
        """Forget a listener of ``notify_issuable`` (parked work failed at close): nothing of it stays."""
        self.cancel_notify(token)  # (its entry here is dropped when next popped or compacted)

    def _pop_issuable(self, value: int) -> list[Listener]:
        """The parked work a timepoint of ``value`` makes issuable, taken from the base's listeners."""
        ready = []
        issuable = self._issuable
        while issuable and issuable[0][0] <= value:
            _, token, listener = heapq.heappop(issuable)
            if self._unpark(token):
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

    #: The driver-facing name of the base's advance, without the core's extra frame (retiring
    #: calls it): parked work is an ordinary listener of the base, so nothing is added to it here.
    advance = Semaphore._advance

    def _fail(self, cause: BaseException) -> None:
        super()._fail(cause)  # (fires every listener, parked work included, with the cause)
        with self._lock:
            self._issuable = []
            self._timepoints = []

    @property
    def value(self) -> int:
        """The current value, counting device work that completed since the last retirement."""
        timepoints = self._timepoints
        if timepoints and timepoints[-1][0] > self.current_value:  # (else nothing issued can raise it further)
            self.device.retire_completed(blocking=False)
        return Semaphore.value.fget(self)  # type: ignore[attr-defined]

    def _wait(self, value: int, deadline: float | None) -> None:
        """Wait on the event of the timepoint covering ``value`` and retire the work on this thread;
        before the work is issued (wait-before-signal), sleep until a timepoint or the value
        arrives. Host waiters never need the completion thread."""
        while self.current_value < value and self.failure is None:
            timepoint = self._covering(value)
            if timepoint is not None:
                timepoint.queue.wait(timepoint, deadline)
                if not timepoint.retired:
                    break  # the deadline passed: the base reports it
                continue  # retired through it: the value is reached (unless it failed)
            with self._lock:
                if self.current_value >= value or self.failure is not None or self._covering(value) is not None:
                    continue
                left = remaining(deadline)
                if left == 0.0:
                    break
                self._waiters += 1
                try:
                    woken = self._reached.wait(wait_slice(left))  # by _advance or add_timepoint
                finally:
                    self._waiters -= 1
            if not woken:
                # Work whose timepoint an interrupted issue never added, or parked work an
                # interrupted release never issued, still reaches the value.
                self.device.catch_up()
        else:  # (the loop's condition is false: reached, or failed)
            if self.failure is None:
                return
        super()._wait(value, deadline)  # reports the failure or the timeout


#: A timepoint's value, the key its bisections sort by (a C-level call: an eager eval's bisections
#: made six Python calls of a function doing the same).
_value_of = operator.itemgetter(0)


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
