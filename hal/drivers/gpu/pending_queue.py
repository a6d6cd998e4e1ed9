"""The pending-action queue: submissions whose waits are not issuable yet (IREE's pending_queue_actions).

A wait is *issuable* once its value is reached on the host or a submission
already issued signals it (the device waits for that one's event). A submission
with a wait that is neither (wait-before-signal: only a later submission or a
host ``signal()`` will reach it) is parked here and ``queue_execute`` returns
at once. Whichever thread makes its last wait issuable (a host ``signal()``, an
issue, a retirement) issues it; issuing may release more parked work, which a
per-thread trampoline turns into a loop rather than a recursion. A wait that
fails instead fails the parked submission's signals with the same cause. A
parked submission leaves the queue only once it was issued or failed, so one
whose release a KeyboardInterrupt cut short is found again (``recheck``).

At close, parked work fails its semaphores, and a submission parked after the
close started is failed at once: nothing is issued on the destroyed streams.
"""

from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING

from hal.drivers.gpu.event_semaphore import Issuable
from hal.semaphore import FenceWaiter

if TYPE_CHECKING:
    from hal.drivers.gpu.completion import Completion
    from hal.drivers.gpu.submission import Submission

#: Per thread: the submissions released while this thread issues one (the trampoline), or None.
_thread = threading.local()


class PendingQueue:
    def __init__(self, completion: Completion) -> None:
        self.completion = completion
        self._lock = threading.Lock()
        #: Parked submissions by number, with what waits for their waits. Each leaves once it was
        #: issued or failed, not before: one that an interrupt kept from being issued is still here.
        self._parked: dict[int, tuple[Submission, FenceWaiter]] = {}
        self._closed: BaseException | None = None

    def __len__(self) -> int:
        """Parked submissions neither issued nor failed yet."""
        return sum(1 for sub, _ in list(self._parked.values()) if sub.event is None and not sub.retired)

    def holds(self, sub: Submission) -> bool:
        """Whether ``sub`` is parked here (taken: issued or failed from here on)."""
        return sub.seq in self._parked

    def park(self, sub: Submission) -> None:
        """Issue ``sub`` once every wait is issuable (at once if they already are)."""
        waiter = FenceWaiter([(Issuable(sem), value) for sem, value in sub.waits],  # type: ignore[misc]
                             lambda: self._released(sub, None), lambda exc: self._released(sub, exc))
        with self._lock:
            if waiter.done:
                return
            closed = self._closed
            if closed is None:
                self._parked[sub.seq] = (sub, waiter)
                return
        waiter.cancel(closed)

    def _released(self, sub: Submission, failure: BaseException | None) -> None:
        if failure is None:
            self._issue(sub)
        else:  # the original failure travels on, as the core's drivers do
            self.completion.finish(sub, failure)
            self._forget(sub)

    def _forget(self, sub: Submission) -> None:
        with self._lock:
            self._parked.pop(sub.seq, None)

    def _issue(self, sub: Submission) -> None:
        """Issue ``sub`` now, or after the submission this thread is issuing (no recursion); it
        leaves the parked ones once issued."""
        pending = getattr(_thread, "pending", None)
        if pending is not None:
            pending.append(sub)
            return
        _thread.pending = pending = collections.deque([sub])
        try:
            while pending:
                item = pending[0]
                item.queue.issue(item)  # (does nothing to one issued or failed already)
                self._forget(item)
                pending.popleft()
        finally:
            _thread.pending = None

    def recheck(self) -> None:
        """Release the parked submissions whose waits are all issuable (or failed) although nothing
        released them: a KeyboardInterrupt cut short the listener call or the issue that would have.
        Whoever waits for work that does not come calls this now and then; issuing or failing a
        submission a second time does nothing, so a release racing this one is harmless."""
        with self._lock:
            parked = list(self._parked.values())
        for sub, waiter in parked:
            if sub.event is not None or sub.retired:  # issued or failed: only its leaving was cut short
                self._forget(sub)
                continue
            failure = None
            for sem, value in sub.waits:
                if not sem.issuable(value):  # type: ignore[attr-defined]
                    break
                failure = failure or sem.failure
            else:
                waiter.abandon()
                self._released(sub, failure)

    def close(self, cause: BaseException) -> None:
        """Fail every parked submission with ``cause``, and every one parked from now on."""
        with self._lock:
            self._closed = cause
            parked = list(self._parked.values())
        for _, waiter in parked:
            waiter.cancel(cause)
