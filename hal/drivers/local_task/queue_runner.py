"""One queue of ``local-task``: ready submissions run in order, on its worker thread or on a waiter's.

A host thread that blocks waiting for this queue's work donates itself to the
queue instead, the way IREE's task executor lets a waiting caller run tasks
and TBB's ``task_group::wait`` takes part in the work it waits for: it runs
the next ready submission itself while the worker is not running one. One
submission of a queue runs at a time, whichever thread runs it: the queue's
order is kept. The worker runs what nobody waits for, so ``queue_execute``
still returns before the work runs.

Waking the worker is what a synchronous step (submit, then wait) must not pay:
on a wake-up the worker needs the interpreter lock the submitting thread holds,
and takes it at the first numpy call that lets it go, only to find the work
already taken by the waiter; that cost as much as the step's whole host work.
So a worker whose queue was handed work in the last ``_PARK_AFTER_S`` looks
for work on its own instead of being woken for each submission, and only a
parked worker (idle for longer) is woken at once. Each look costs the
submitting thread too (the worker needs the interpreter lock to look): while
waiters take every submission themselves, the worker's looks find nothing, and
it doubles the time to its next look from ``_POLL_S`` up to ``_MAX_POLL_S``; a
look that finds work resets it. Work nobody waits for starts at most
``_POLL_S`` late while the worker is running the queue's work, at most
``_MAX_POLL_S`` late on a queue whose waiters ran everything before it.

A process forked from one with a ``local-task`` device has none of its threads: every live
runner starts a new worker in the child (``os.register_at_fork``), with new locks (the parent's
worker may have held one at the fork), so work queued in the child runs as in the parent.
"""

from __future__ import annotations

import os
import queue as queue_module
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

_POLL_S = 0.001
_MAX_POLL_S = 0.016
_PARK_AFTER_S = 0.02


class QueueRunner:
    """The ready submissions of one queue and the daemon thread that runs them."""

    def __init__(self, name: str) -> None:
        self._lock = threading.Lock()
        self._ready: deque[Callable[[], None]] = deque()
        self._running = False  # a submission runs now (on the worker or a donating waiter)
        self._parked = False  # the worker sleeps until a wake-up is posted (none is yet)
        self._last_put = 0.0
        self._stopping = False
        self._wake_up: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        _runners.add(self)

    def put(self, run: Callable[[], None]) -> None:
        """Queue a submission whose waits are reached."""
        with self._lock:
            self._ready.append(run)
            self._last_put = time.monotonic()
            wake = self._parked
            self._parked = False
        if wake:
            self._wake_up.put(True)

    def donate(self, done: Callable[[], bool]) -> None:
        """Run ready submissions on this thread until ``done()``, the queue is empty, or the
        worker is running one (then the caller blocks as usual: the worker goes on in order)."""
        lock, ready = self._lock, self._ready
        while not done():
            with lock:
                if self._running or not ready:
                    return
                run = ready.popleft()
                self._running = True
            try:
                run()  # never raises: a submission's failure goes to its semaphores
            finally:
                with lock:
                    self._running = False
                    # the worker carries on (or ends) if this thread stops helping
                    wake = self._parked and (ready or self._stopping)
                    if wake:
                        self._parked = False
                if wake:
                    self._wake_up.put(True)

    def idle(self) -> bool:
        """Whether nothing is ready or running."""
        return not self._ready and not self._running

    def stop(self, join: bool = True) -> None:
        """Let the worker finish what is ready, then end; joins it (``join``) unless called from it."""
        with self._lock:
            self._stopping = True
            self._parked = False
        self._wake_up.put(True)  # also cut a poll short
        if join and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def restart_in_child(self) -> None:
        """This process was forked: start a worker of its own, with new locks (one the parent's
        worker held at the fork would stay held here). A submission that was running on the
        parent's worker at the fork does not run here; what was ready runs."""
        self._lock = threading.Lock()
        self._wake_up = queue_module.SimpleQueue()
        self._running = False
        self._parked = False
        if self._stopping:
            return
        self._thread = threading.Thread(target=self._loop, name=self._thread.name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        lock, ready, wake_up = self._lock, self._ready, self._wake_up
        interval = _POLL_S  # until the next look for work (doubled while looks find nothing)
        while True:
            with lock:
                if ready and not self._running:
                    run = ready.popleft()
                    self._running = True
                else:
                    if self._stopping and not self._running:
                        return
                    run = None
                    poll = time.monotonic() - self._last_put < _PARK_AFTER_S
                    self._parked = not poll
            if run is None:
                try:
                    wake_up.get(timeout=interval if poll else None)
                    interval = _POLL_S  # woken: work was put on a parked worker, or the queue stops
                except queue_module.Empty:
                    interval = min(2 * interval, _MAX_POLL_S)
                continue
            interval = _POLL_S
            try:
                run()
            finally:
                with lock:
                    self._running = False


#: Every live runner: a forked child restarts their workers.
_runners: weakref.WeakSet[QueueRunner] = weakref.WeakSet()


def _restart_runners_in_child() -> None:
    for runner in list(_runners):
        runner.restart_in_child()


os.register_at_fork(after_in_child=_restart_runners_in_child)
