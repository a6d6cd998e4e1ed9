"""LRU cache of recorded command buffers keyed by graph topology (ops, shapes, dtypes, baked constants)."""

from __future__ import annotations

import logging
from collections import OrderedDict

from hal import env

_log = logging.getLogger(__name__)


#: RUNTIME_GRAPH_CACHE=0: every eval records afresh. Read once, at import, as RUNTIME_FUSION is (reading
#: the environment at each eval was ~60 bytecodes, a fortieth of a one-op eval's).
ENABLED = env.switch("RUNTIME_GRAPH_CACHE", True)


def enabled() -> bool:
    return ENABLED


class GraphCache:
    """Maps a graph key to a Recording; evicts least recently used beyond entry/byte limits."""

    __slots__ = ("_entries", "_newest", "max_entries", "max_bytes", "bytes", "hits", "misses", "evictions")

    def __init__(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        self._entries: OrderedDict = OrderedDict()
        #: The most recently used entry: a hit on it again (a loop evaluating one graph) leaves the
        #: order as it is, sparing move_to_end's second hashing of the key (a nested tuple).
        self._newest = None
        self.max_entries = max_entries if max_entries is not None else env.integer(
            "RUNTIME_GRAPH_CACHE_ENTRIES", 256)
        self.max_bytes = max_bytes if max_bytes is not None else env.integer(
            "RUNTIME_GRAPH_CACHE_BYTES", 256 << 20)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def get(self, key):
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return None
        if entry is not self._newest:
            self._entries.move_to_end(key)
            self._newest = entry
        self.hits += 1
        return entry

    def put(self, key, entry) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.footprint
        self._entries[key] = entry
        self._newest = entry
        self.bytes += entry.footprint
        self._evict()

    def grow(self, nbytes: int) -> None:
        """An entry grew (another recording of the same graph)."""
        self.bytes += nbytes
        self._evict()

    def _evict(self) -> None:
        while self._entries and (len(self._entries) > self.max_entries or self.bytes > self.max_bytes):
            if len(self._entries) == 1:
                break  # the newest entry always stays, alone beyond either limit: its evaluation runs it
            _, victim = self._entries.popitem(last=False)
            if victim is self._newest:
                self._newest = None
            self.bytes -= victim.footprint
            self.evictions += 1
            _log.debug("graph cache evicts an entry of %d bytes (%d entries, %d bytes left)",
                       victim.footprint, len(self._entries), self.bytes)
            victim.drop()

    def clear(self) -> None:
        for entry in self._entries.values():
            entry.drop()
        self._entries.clear()
        self._newest = None
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._entries),
                "bytes": self.bytes, "evictions": self.evictions}
