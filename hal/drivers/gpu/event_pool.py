"""Reusable GPU events of one device (IREE's event pool).

Creating an event costs more than recording one, so each submission takes an
event from the pool when it is issued and the event goes back when nothing
refers to the submission any more (``Submission.__del__``): a host waiter
still blocked on the event keeps it out of the pool, so an event is never
re-recorded, nor destroyed at close, while someone waits on it.
"""

from __future__ import annotations

import threading
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
