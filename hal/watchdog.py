"""Deadlines of channels: one daemon thread calls ``target.check_deadlines()`` when a deadline passes.

The CPU reference channel (a meeting of ranks waiting too long) and the GPU channels (a submission
with collectives still in flight past the channel's timeout) use it. The thread holds weak
references: a target that is gone is skipped. A target watches one deadline at a time and, from
``check_deadlines``, the next one.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref
from typing import Protocol


class Watched(Protocol):
    def check_deadlines(self) -> None:
        """Called from the watchdog's thread at (or after) the deadline it was watched for."""


class Watchdog:
    """One daemon thread calling ``check_deadlines`` of each watched target at its deadline."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, weakref.ref]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, deadline: float, target: Watched) -> None:
        """Call ``target.check_deadlines()`` once ``time.monotonic()`` reaches ``deadline``."""
        with self._lock:
            heapq.heappush(self._heap, (deadline, next(self._order), weakref.ref(target)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._wake.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, ref = heapq.heappop(self._heap)
            target = ref()
            if target is not None:
                try:
                    target.check_deadlines()
                except Exception:  # one target's failure must not stop the others' deadlines
                    import traceback

                    traceback.print_exc()


#: The process's channel watchdog.
WATCHDOG = Watchdog("hal-channel-watchdog")
