"""Pinned host staging blocks for ``update_buffer`` payloads, reused across command buffers.

Pinned host allocation costs tens of microseconds, so blocks are kept in power-of-two
size classes and handed back when the command buffer that used them retires.
"""

from __future__ import annotations

import threading
from typing import Any

MIN_BLOCK = 4096


class StagingPool:
    def __init__(self, api: Any, keep_per_class: int = 64) -> None:
        self.api = api
        self.keep_per_class = keep_per_class
        self._free: dict[int, list[int]] = {}
        # Re-entrant: blocks come back from finalizers (a command buffer collected as garbage),
        # which the cycle collector may run on a thread inside this lock (at any allocation):
        # with a plain lock that thread would wait for itself forever.
        self._lock = threading.RLock()
        self._closed = False

    @staticmethod
    def size_class(size: int) -> int:
        return max(MIN_BLOCK, 1 << (size - 1).bit_length())

    def acquire(self, size: int) -> tuple[int, int]:
        """(host address, capacity) of a pinned block of at least ``size`` bytes."""
        capacity = self.size_class(size)
        with self._lock:
            blocks = self._free.get(capacity)
            if blocks:
                return blocks.pop(), capacity
        return self.api.host_alloc(capacity), capacity

    def release(self, host: int, capacity: int) -> None:
        with self._lock:
            if not self._closed:
                blocks = self._free.get(capacity)
                if blocks is None:
                    blocks = self._free[capacity] = []
                if len(blocks) < self.keep_per_class:
                    blocks.append(host)
                    return
        if not self._closed:
            self.api.host_free(host)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            blocks = [host for hosts in self._free.values() for host in hosts]
            self._free.clear()
        for host in blocks:
            try:
                self.api.host_free(host)
            except Exception:  # a lost context frees its memory itself
                pass
