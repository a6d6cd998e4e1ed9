"""Submissions that complete on the host: park on waits, run when ready, then signal or fail.

The CPU drivers (and any driver whose work finishes on a host thread) share
this bookkeeping: which submissions are parked on unreached waits (so
``close()`` can fail them), how many are outstanding (for ``wait_idle``), and
how a failure reaches every semaphore the work would have signalled.

Work may finish after it returns: work that stops to wait for other ranks of a
collective returns a ``Deferred``, which whoever finishes the work completes
(its signals advance then). A queue whose submissions may do so passes a
``QueueGate``: its submissions run one at a time in order, each from its start
to its completion, so later work never overtakes one that waits.
"""

from __future__ import annotations

import collections
import functools
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


class Deferred:
    """The completion of work that returned before it finished (see the module)."""

    __slots__ = ("_lock", "_done", "_failure", "_callback")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        self._failure: BaseException | None = None
        self._callback: Callable[[BaseException | None], None] | None = None

    def when_done(self, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(failure)`` once completed (now, if it already is)."""
        with self._lock:
            if not self._done:
                self._callback = callback
                return
        callback(self._failure)

    def complete(self, failure: BaseException | None = None) -> None:
        """The work finished (``failure``: how it failed); at most once."""
        with self._lock:
            if self._done:
                return
            self._done = True
            self._failure = failure
            callback, self._callback = self._callback, None
        if callback is not None:
            callback(failure)


class QueueGate:
    """One queue's submissions in order, each from its start to its completion (see the module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = False
        self._backlog: collections.deque[tuple[Callable[[], None], Callable[[Callable[[], None]], None]]] = \
            collections.deque()

    def enter(self, run: Callable[[], None], schedule: Callable[[Callable[[], None]], None]) -> None:
        """Schedule ``run`` now if no submission of the queue is unfinished, else after those."""
        with self._lock:
            if self._busy:
                self._backlog.append((run, schedule))
                return
            self._busy = True
        schedule(run)

    def leave(self) -> None:
        """The submission that entered last completed: schedule the next one."""
        with self._lock:
            if not self._backlog:
                self._busy = False
                return
            run, schedule = self._backlog.popleft()
        schedule(run)


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

    def submit(self, waits: list[Fence], signals: list[Fence], work: Callable[[], object] | None,
               schedule: Callable[[Callable[[], None]], None], gate: QueueGate | None = None) -> None:
        """Run ``work`` through ``schedule`` once ``waits`` are reached, then advance ``signals``.

        An exception from ``work``, or a failed wait, fails every signal semaphore with the cause.
        Work returning a ``Deferred`` completes when that does. With a ``gate``, the work runs after
        every earlier submission through the gate completed.
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

        def completed(failure: BaseException | None) -> None:
            finish(failure)
            if gate is not None:
                gate.leave()

        def run() -> None:
            result = None
            try:
                if work is not None:
                    if tracing.ENABLED:  # the work on the thread that runs it (local-task: the queue's worker)
                        result = tracing.call("execute", work, category="device")
                    else:
                        result = work()
            except BaseException as exc:  # the failure travels to every semaphore we would signal
                completed(exc)
                if not isinstance(exc, Exception):  # a KeyboardInterrupt in work run inline: the caller's too
                    raise
                return
            if type(result) is Deferred:
                result.when_done(completed)
            else:
                completed(None)

        if gate is not None:
            schedule = functools.partial(gate.enter, schedule=schedule)
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
