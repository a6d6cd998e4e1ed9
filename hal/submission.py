"""Submissions that complete on the host: park on waits, run when ready, then signal or fail.

The CPU drivers (and any driver whose work finishes on a host thread) share
this bookkeeping: which submissions are parked on unreached waits (so
``close()`` can fail them), how many are outstanding (for ``wait_idle``), and
how a failure reaches every semaphore the work would have signalled.
"""

from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Callable

from hal import tracing
from hal.errors import DeadlineExceededError
from hal.semaphore import Fence, FenceWaiter, remaining

_inline = threading.local()


def run_inline(run: Callable[[], None]) -> None:
    """Run ``run`` now on this thread (a ``schedule`` for drivers that execute at submission).

    Work released while other work runs on this thread (a host ``signal()`` releasing a long chain
    of submissions, each waiting on the previous one) runs after it, in a loop, never as a
    recursion that a deep chain would overflow.
    """
    pending = getattr(_inline, "pending", None)
    if pending is not None:  # already draining on this thread: run after the current item
        pending.append(run)
        return
    _inline.pending = pending = collections.deque([run])
    try:
        while pending:
            pending.popleft()()
    finally:
        _inline.pending = None


class HostSubmissions:
    def __init__(self) -> None:
        # A plain lock on the per-submission paths (a Condition's own enter and exit are Python
        # calls); the condition over it only for wait_idle, notified only while someone waits.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._idle_waiters = 0
        self._outstanding = 0
        #: Submissions parked on unreached waits, by submission number (each leaves when released).
        self._parked: dict[int, FenceWaiter] = {}
        self._numbers = itertools.count()

    def submit(self, waits: list[Fence], signals: list[Fence], work: Callable[[], None] | None,
               schedule: Callable[[Callable[[], None]], None]) -> None:
        """Run ``work`` through ``schedule`` once ``waits`` are reached, then advance ``signals``.

        An exception from ``work``, or a failed wait, fails every signal semaphore with the cause.
        """
        with self._lock:
            self._outstanding += 1

        def finish(failure: BaseException | None) -> None:
            for sem, value in signals:
                if failure is None:
                    sem.advance(value)
                else:
                    sem.fail_from_device(failure)
            with self._lock:
                self._outstanding -= 1
                if not self._outstanding and self._idle_waiters:
                    self._idle.notify_all()

        def run() -> None:
            try:
                if work is not None:
                    if tracing.ENABLED:  # the work on the thread that runs it (local-task: the queue's worker)
                        tracing.call("execute", work, category="device")
                    else:
                        work()
            except BaseException as exc:  # the failure travels to every semaphore we would signal
                finish(exc)
            else:
                finish(None)

        if not waits:
            schedule(run)
            return
        number = next(self._numbers)

        def ready() -> None:
            with self._lock:
                self._parked.pop(number, None)
            schedule(run)

        def failed(failure: BaseException) -> None:
            with self._lock:
                self._parked.pop(number, None)
            finish(failure)

        waiter = FenceWaiter(waits, ready, failed)
        with self._lock:
            if not waiter.done:  # else it already left (its callbacks take this lock too)
                self._parked[number] = waiter

    def cancel_parked(self, cause: BaseException) -> None:
        with self._lock:
            parked, self._parked = list(self._parked.values()), {}
        for waiter in parked:
            waiter.cancel(cause)

    def wait_idle(self, deadline: float | None) -> None:
        with self._idle:
            while self._outstanding:
                left = remaining(deadline)
                if left == 0.0:
                    raise DeadlineExceededError(
                        f"timed out waiting for {self._outstanding} outstanding submissions")
                self._idle_waiters += 1
                try:
                    self._idle.wait(left)
                finally:
                    self._idle_waiters -= 1
