"""Size-bucketed cache of device buffers.

Buffers are handed out in bucket sizes (powers of two split in quarters) so
that a freed buffer fits the next request of a similar size. A freed buffer
only becomes reusable once the submission that last touched it has completed:
it waits in `_pending` with that submission's semaphore value.
"""

from __future__ import annotations

import os

import hal

_MIN_BUCKET = 256


def bucket_size(nbytes: int) -> int:
    """Round up to 2**k * {1, 1.25, 1.5, 1.75} (at least 256 bytes)."""
    if nbytes <= _MIN_BUCKET:
        return _MIN_BUCKET
    top = 1 << (nbytes - 1).bit_length()  # next power of two
    quarter = top >> 3  # quarters of the lower power of two
    for k in (4, 5, 6, 7):
        if k * quarter >= nbytes:
            return k * quarter
    return top


class BufferCache:
    __slots__ = ("_device", "_free", "_pending", "free_bytes", "limit_bytes", "allocated_bytes",
                 "hits", "misses", "_pending_min")

    def __init__(self, device: hal.Device, limit_bytes: int | None = None) -> None:
        self._device = device
        self._free: dict[int, dict] = {}  # bucket -> {id(buffer): buffer}, in release order
        self._pending: list = []  # (fence value, bucket, buffer)
        self._pending_min = None
        self.free_bytes = 0
        self.allocated_bytes = 0
        self.limit_bytes = limit_bytes if limit_bytes is not None else int(
            os.environ.get("RUNTIME_BUFFER_CACHE_BYTES", str(1 << 30)))
        self.hits = 0
        self.misses = 0

    def acquire(self, nbytes: int, prefer: hal.Buffer | None = None) -> tuple[hal.Buffer, int]:
        """A buffer of at least nbytes: `prefer` if it is free, else the most recently freed one.

        Handing a recording the buffers it had last time keeps its binding
        table unchanged, which GPU drivers replay without patching nodes.
        """
        bucket = bucket_size(nbytes)
        free = self._free.get(bucket)
        if free:
            self.hits += 1
            self.free_bytes -= bucket
            if prefer is not None:
                buf = free.pop(id(prefer), None)
                if buf is not None:
                    return buf, bucket
            return free.popitem()[1], bucket
        self.misses += 1
        try:
            buf = self._device.allocator.allocate(bucket)
        except hal.ResourceExhaustedError:
            self.trim(0)
            buf = self._device.allocator.allocate(bucket)
        self.allocated_bytes += bucket
        return buf, bucket

    def release(self, buffer: hal.Buffer, bucket: int, fence: int, completed: int) -> None:
        """Give a buffer back; it is reusable once the queue reached `fence`."""
        if fence <= completed:
            self._put_free(buffer, bucket)
        else:
            self._pending.append((fence, bucket, buffer))
            if self._pending_min is None or fence < self._pending_min:
                self._pending_min = fence

    def retire(self, completed: int) -> None:
        """Move buffers whose last submission has completed into the free lists."""
        if self._pending_min is None or self._pending_min > completed:
            return
        still = []
        low = None
        for entry in self._pending:
            if entry[0] <= completed:
                self._put_free(entry[2], entry[1])
            else:
                still.append(entry)
                if low is None or entry[0] < low:
                    low = entry[0]
        self._pending = still
        self._pending_min = low

    def _put_free(self, buffer: hal.Buffer, bucket: int) -> None:
        if self.free_bytes + bucket > self.limit_bytes:
            self.allocated_bytes -= bucket
            buffer.release()
            return
        self._free.setdefault(bucket, {})[id(buffer)] = buffer
        self.free_bytes += bucket

    def trim(self, keep_bytes: int = 0) -> None:
        """Release free buffers until at most `keep_bytes` stay cached."""
        for bucket in sorted(self._free, reverse=True):
            lst = self._free[bucket]
            while lst and self.free_bytes > keep_bytes:
                lst.popitem()[1].release()
                self.free_bytes -= bucket
                self.allocated_bytes -= bucket
