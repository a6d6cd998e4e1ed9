"""Reusable GPU events of one device (IREE's event pool).

Creating an event costs more than recording one, so each submission takes an
event from the pool when it is issued and the event goes back when nothing
refers to the submission any more (``Submission.__del__``): a host waiter
still blocked on the event keeps it out of the pool, so an event is never
re-recorded, nor destroyed at close, while someone waits on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from hal.drivers.gpu.api import GpuApi


class EventPool:
    def __init__(self, api: GpuApi) -> None:
        self.api = api
        #: Events ready to be recorded (the issue path pops one directly).
        self.free: list[Any] = []
        #: ``release(event)`` puts an event back: the free list's own ``append`` while the pool is
        #: open (every retired submission gives its event back: no Python frame for it), destroying
        #: it once the pool is closed. No lock: an append racing ``close()`` leaves one event to
        #: the context.
        self.release: Callable[[Any], None] = self.free.append
        self._lock = threading.RLock()  # re-entrant, as every lock a finalizer's release may take
        self.closed = False
        self.created = 0

    def acquire(self) -> Any:
        """A free event (a new one when none is free). Call only while the device is open."""
        try:
            return self.free.pop()
        except IndexError:
            self.created += 1
            return self.api.event_create()

    def _destroy(self, event: Any) -> None:
        """``release`` after close: nothing will record the event again."""
        try:
            self.api.event_destroy(event)
        except Exception:  # a lost context destroys its events itself
            pass

    def close(self) -> None:
        """Destroy the free events; events still referenced are destroyed when released."""
        with self._lock:
            self.closed = True
            self.release = self._destroy
            events, self.free = self.free, []
        for event in events:
            self._destroy(event)

    @property
    def available(self) -> int:
        return len(self.free)


#: A host wait with a timeout polls its event (event_query, ~1 µs): spinning this long first,
#: then sleeping between polls, from MIN_POLL_SLEEP doubling up to MAX_POLL_SLEEP.
SPIN_SECONDS = 100e-6
MIN_POLL_SLEEP = 20e-6
MAX_POLL_SLEEP = 1e-3


def poll_event(api, event: Any, deadline: float | None) -> bool:
    """Wait for an event by polling until ``deadline``: True once it completed, False at the deadline.

    Spins for ``SPIN_SECONDS`` (short work completes within a few microseconds), then
    sleeps between polls with a doubling back-off up to ``MAX_POLL_SLEEP``, so a long
    wait costs little CPU and a host wait with a timeout needs no other thread.
    """
    now = time.monotonic()
    spin_until = now + SPIN_SECONDS
    pause = MIN_POLL_SLEEP
    while True:
        if api.event_query(event):
            return True
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        if now >= spin_until:
            sleep = pause if deadline is None else min(pause, max(deadline - now, 0.0))
            time.sleep(sleep)
            pause = min(pause * 2, MAX_POLL_SLEEP)
