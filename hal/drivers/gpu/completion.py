"""Completion: what happens when GPU work is done (IREE's completion thread and deferred releases).

``finish`` retires one submission: its signals advance (or fail), its one-shot
command buffers and held resources are released, and deferred frees whose
submissions all completed run. Host waiters retire their own work (``GpuQueue.wait``);
the completion thread retires what nobody waits for. It sleeps while nothing
needs it and is woken only when something does: a host listener on a semaphore
(``hal.wait_any``), a deferred free, or ``WAKE_INFLIGHT`` submissions in
flight on a queue. A thread that submits and waits in a loop therefore never wakes it:
measured on an H100 host, waking it each round trip (a system call and a GIL
hand-over) cost more than the rest of the round trip's bookkeeping. Asleep, it looks
on its own once every ``IDLE_RECHECK`` seconds, so work nothing ever waits for
retires all the same.

``outstanding`` holds every submission made and not yet retired (parked ones
too), for ``defer`` and ``wait_idle``.
"""

from __future__ import annotations

import collections
import itertools
import queue as queue_module
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hal.drivers.gpu.channel import broken
from hal.errors import DeadlineExceededError, HalError
from hal.semaphore import remaining, wait_slice

if TYPE_CHECKING:
    from hal.drivers.gpu.context import GpuContext
    from hal.drivers.gpu.queue import GpuQueue
    from hal.drivers.gpu.submission import Submission

#: Submissions in flight on one queue that wake the sleeping completion thread even when nothing
#: waits for them (their events, staging blocks and deferred frees go back once retired).
WAKE_INFLIGHT = 32
#: How long the completion thread leaves in-flight work to host waiters before retiring it itself:
#: waiters retire their own work at once; the thread mostly releases what nobody waits for.
RETIRE_DELAY = 1e-3
#: Seconds the sleeping thread lets pass before it looks for in-flight work nobody woke it for:
#: work never waited for (a device's last submission before the program dropped it) retires
#: within this time, and releases what it holds (the device itself, for one dropped).
IDLE_RECHECK = 1.0


class Completion:
    def __init__(self, context: GpuContext) -> None:
        self.context = context
        #: The device's queues (set by the device once it made them): the thread retires their work.
        self.queues: list[GpuQueue] = []
        #: Submissions made and not retired, by sequence number.
        self.outstanding: dict[int, Submission] = {}
        self.sequence = itertools.count(1)
        #: (sequence mark, release): run once every submission numbered below the mark retired.
        #: Read without the lock by the issue path: whether deferred releases wait.
        self.deferred: collections.deque[tuple[int, Callable[[], Any]]] = collections.deque()
        #: Guards the deferred releases and the idle condition. Re-entrant: ``defer`` is reached
        #: from finalizers (an array's storage collected as garbage gives its buffer back), which
        #: the cycle collector may run on a thread inside this lock; a plain lock would wait for
        #: itself forever.
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self.idle_waiters = 0
        self._inbox: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._wake_lock = threading.Lock()
        #: True while the completion thread sleeps (submitters read it to decide whether to wake it).
        self.idle = False
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"hal-{context.driver}-completion", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- retiring -----------------------------------------------------------------------------------
    def finish(self, sub: Submission, failure: BaseException | None) -> None:
        """Advance or fail the submission's signals, release what it held, retire it.

        Does nothing to a retired submission, and ``retired`` is set last: a retirement an
        interrupt (KeyboardInterrupt) cut short is completed by calling this again (advancing a
        reached value or failing a failed semaphore changes nothing; each release is taken
        before it runs, so none runs twice)."""
        if sub.retired:
            return
        if failure is None:
            execution = sub.execution
            if execution is not None and execution.channels is not None:
                failure = broken(execution.channels)
        if failure is None:
            for sem, value in sub.signals:
                sem.advance(value)
        else:
            for sem, _ in sub.signals:
                sem.fail_from_device(failure)  # type: ignore[attr-defined]
        if sub.resources is not None:
            self._release(sub)
        outstanding = self.outstanding
        outstanding.pop(sub.seq, None)
        # The retired work needs its command buffers no more; the submission may stay a semaphore's
        # timepoint for a while, and must not keep them (nor the graphs a communicator waits for).
        sub.execution = None
        sub.retired = True
        if self.deferred:
            self._run_deferred()
        if self.idle_waiters and not outstanding:
            self.notify_idle()

    def _release(self, sub: Submission) -> None:
        """What the retired work held (``Submission.resources``). A release that fails is reported
        and the others still run: one bad release must not stall every waiter."""
        resources, sub.resources = sub.resources, None  # (taken first: none runs twice)
        for release in resources or ():
            try:
                self.context.run_released(release)
            except Exception:
                traceback.print_exc()

    def notify_idle(self) -> None:
        with self._lock:
            self._idle.notify_all()

    # -- deferred releases ------------------------------------------------------------------------
    def defer_release(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once every submission made so far has completed (now if none is outstanding)."""
        if self.context.closed_for_good or not self.defer(fn):
            self.context.run_released(fn)

    def defer(self, fn: Callable[[], Any]) -> bool:
        """Run ``fn`` once every submission made so far has retired; False if none is outstanding
        (the caller runs it now)."""
        mark = next(self.sequence)
        if not self.outstanding:
            return False
        with self._lock:
            self.deferred.append((mark, fn))
        self.wake()  # released as soon as the work completes, even if nothing waits for it
        self._run_deferred()  # the work may have retired meanwhile
        return True

    def _run_deferred(self) -> None:
        run = []
        with self._lock:
            deferred = self.deferred
            oldest = min(self.outstanding, default=None) if deferred else None
            while deferred and (oldest is None or deferred[0][0] < oldest):
                run.append(deferred.popleft()[1])
        for fn in run:
            self.context.run_released(fn)

    def take_deferred(self) -> list[Callable[[], Any]]:
        """Every deferred release, removed (device close)."""
        with self._lock:
            run = [fn for _, fn in self.deferred]
            self.deferred.clear()
        return run

    # -- waiting for everything -----------------------------------------------------------------------
    def wait_idle(self, deadline: float | None, recheck: Callable[[], None] = lambda: None) -> None:
        """Wait on each queue's oldest in-flight event and retire, until nothing is outstanding.
        ``recheck`` releases parked work nothing released (``PendingQueue.recheck``); it runs
        after each slice of a wait for parked work that found nothing new."""
        queues = self.queues
        while self.outstanding:
            busy = [q for q in queues if q.inflight]
            if not busy:  # only parked work: wait for it to be issued or to fail
                with self._lock:
                    if not self.outstanding or any(q.inflight for q in queues):
                        continue
                    left = remaining(deadline)
                    if left == 0.0:
                        raise DeadlineExceededError(
                            f"timed out waiting for {len(self.outstanding)} outstanding submissions")
                    self.idle_waiters += 1
                    try:
                        # In slices: a notification an interrupt kept from being sent costs a slice.
                        woken = self._idle.wait(wait_slice(left))
                    finally:
                        self.idle_waiters -= 1
                if not woken:
                    recheck()
                continue
            for q in busy:
                try:
                    sub = q.inflight[0]
                except IndexError:
                    continue
                q.wait(sub, deadline)
                q.retire_completed()
            if deadline is not None and remaining(deadline) == 0.0 and self.outstanding:
                raise DeadlineExceededError(f"timed out waiting for {len(self.outstanding)} outstanding submissions")

    # -- the completion thread ----------------------------------------------------------------------
    def wake(self) -> None:
        """Wake the completion thread if it sleeps (something needs in-flight work retired)."""
        if self.idle:
            with self._wake_lock:
                if self.idle:
                    # The token first: an interrupt between the two leaves the flag set, which
                    # costs a spare wake-up later, never a thread asleep that others think awake.
                    self._inbox.put(True)
                    self.idle = False

    def stop(self) -> None:
        self._stopping = True
        self._inbox.put(False)
        if self._thread is not threading.current_thread() and self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        """Retire in-flight work while awake; sleep once nothing is in flight.

        Host waiters retire their own work first; the thread lets them for ``RETIRE_DELAY``
        before blocking on the oldest event of a queue.
        """
        context = self.context
        queues = self.queues
        api = context.api
        inbox = self._inbox
        while not self._stopping:
            if not any(q.inflight for q in queues):
                self.idle = True
                if any(q.inflight for q in queues):  # issued after the check: its submitter may have missed the flag
                    with self._wake_lock:
                        self.idle = False
                    continue
                try:
                    token = inbox.get(timeout=IDLE_RECHECK)
                except queue_module.Empty:
                    with self._wake_lock:  # (a token a waker put meanwhile costs a spare wake-up)
                        self.idle = False
                    continue
                if not token or self._stopping:
                    return
                continue
            time.sleep(RETIRE_DELAY)
            try:
                for q in queues:
                    if q.retire_completed():
                        continue
                    try:
                        sub = q.inflight[0]
                    except IndexError:
                        continue
                    try:
                        api.activate(context.context)
                        api.event_synchronize(sub.event)
                    except HalError:
                        pass  # retire_completed records the failure
                    q.retire_completed()
            except Exception:  # the thread must survive whatever a release raises
                traceback.print_exc()
