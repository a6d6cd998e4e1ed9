"""The pending-action queue: submissions whose waits are not issuable yet (IREE's pending_queue_actions).

A wait is *issuable* once its value is reached on the host or a submission
already issued signals it (the device waits for that one's event). A submission
with a wait that is neither (wait-before-signal: only a later submission or a
host ``signal()`` will reach it) is parked here and ``queue_execute`` returns
at once. Whichever thread makes its last wait issuable (a host ``signal()``, an
issue, a retirement) issues it; issuing may release more parked work, which a
per-thread trampoline turns into a loop rather than a recursion. A wait that
fails instead fails the parked submission's signals with the same cause.

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
        self._parked: dict[int, FenceWaiter] = {}
        self._closed: BaseException | None = None

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, sub: Submission) -> None:
        """Issue ``sub`` once every wait is issuable (at once if they already are)."""
        waiter = FenceWaiter([(Issuable(sem), value) for sem, value in sub.waits],  # type: ignore[misc]
                             lambda: self._released(sub, None), lambda exc: self._released(sub, exc))
        with self._lock:
            if waiter.done:
                return
            closed = self._closed
            if closed is None:
                self._parked[sub.seq] = waiter
                return
        waiter.cancel(closed)

    def _released(self, sub: Submission, failure: BaseException | None) -> None:
        with self._lock:
            self._parked.pop(sub.seq, None)
        if failure is None:
            issue_released(sub)
        else:  # the original failure travels on, as the core's drivers do
            self.completion.finish(sub, failure)

    def close(self, cause: BaseException) -> None:
        """Fail every parked submission with ``cause``, and every one parked from now on."""
        with self._lock:
            self._closed = cause
            parked, self._parked = self._parked, {}
        for waiter in parked.values():
            waiter.cancel(cause)


def issue_released(sub: Submission) -> None:
    """Issue ``sub`` now, or after the submission this thread is issuing (no recursion)."""
    pending = getattr(_thread, "pending", None)
    if pending is not None:
        pending.append(sub)
        return
    _thread.pending = pending = collections.deque()
    try:
        sub.queue.issue(sub)
        while pending:
            item = pending.popleft()
            item.queue.issue(item)
    finally:
        _thread.pending = None
