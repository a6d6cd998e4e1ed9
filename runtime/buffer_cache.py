"""Size-bucketed cache of device buffers.

Buffers are handed out in bucket sizes (powers of two split in quarters) so
that a freed buffer fits the next request of a similar size. A freed buffer
remembers the fence of the last submission that touched it:

- device use (`acquire(..., host=False)`, the buffers a submission binds): any
  freed buffer is fit at once. Every submission of a device context waits for
  the previous one on the context's timeline, so work writing the buffer again
  runs after the work that last read it; the host never waits for that.
- host use (`host=True`: a synchronous upload writes the buffer from the host):
  only buffers whose fence the timeline has reached.

How much stays cached (``default_limit``): on GPUs, half of the device's memory. There a buffer that
goes back is freed only once the work queued before it has completed, and allocating and freeing
device memory costs about a millisecond of host time and waits for the device, so an evaluation
whose intermediate arrays outgrow the cache would pay both at every call (an eager gradient of
128 MB rows: 1.6 ms of host time a call, against 0.17 ms once cached). Like PyTorch's caching
allocator, the cache then gives memory back when an allocation fails (``acquire`` trims it all and
tries again). CPU drivers keep 1 GiB: their buffers are the process's own memory.

A buffer goes back to the device (beyond the cache's limit, or trimmed) only once the submission
its fence names was handed to the device (``handed_over``): rt.compile's replays queue in the
runtime before they are submitted (``DeviceContext.submit``), and a queued replay still binds the
buffers it was recorded with.
"""

from __future__ import annotations

from itertools import repeat
from operator import contains

import hal
from hal import env

_MIN_BUCKET = 256
#: Free bytes CPU drivers' caches keep (and GPUs' at least).
CPU_LIMIT_BYTES = 1 << 30
_NO_ENTRIES = repeat({})  # the default of each bucket's look-up in all_free (never filled)


def default_limit(device: hal.Device, is_gpu: bool) -> int:
    """Free bytes a device's cache keeps: RUNTIME_BUFFER_CACHE_BYTES where set, else half of a GPU's
    memory, or CPU_LIMIT_BYTES (see the module)."""
    total = device.info.properties.get("memory_total") if is_gpu else None
    fallback = max(CPU_LIMIT_BYTES, total // 2) if isinstance(total, int) else CPU_LIMIT_BYTES
    return env.integer("RUNTIME_BUFFER_CACHE_BYTES", fallback, minimum=0)


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
    __slots__ = ("_device", "_free", "free_bytes", "limit_bytes", "allocated_bytes", "hits", "misses", "completed",
                 "handed_over")

    def __init__(self, device: hal.Device, limit_bytes: int = CPU_LIMIT_BYTES) -> None:
        self._device = device
        # bucket -> {id(buffer): (buffer, fence)}, in release order (dicts keep insertion order)
        self._free: dict[int, dict] = {}
        self.free_bytes = 0
        self.allocated_bytes = 0
        self.limit_bytes = limit_bytes
        self.hits = 0
        self.misses = 0
        self.completed = 0  # the timeline value known reached (host use needs fence <= completed)
        self.handed_over = 0  # the timeline value through which submissions reached the device

    def acquire(self, nbytes: int, prefer: hal.Buffer | None = None, host: bool = True) -> tuple[hal.Buffer, int]:
        """A buffer of at least nbytes (see the module doc for `host`); returns (buffer, bucket)."""
        return self.acquire_bucket(bucket_size(nbytes), prefer, host)

    def acquire_bucket(self, bucket: int, prefer: hal.Buffer | None = None,
                       host: bool = False) -> tuple[hal.Buffer, int]:
        """A buffer of exactly `bucket` bytes: `prefer` if it is free, else the most recently freed fit one.

        Handing a recording the buffers it had last time keeps its binding
        table unchanged, which GPU drivers replay without patching anything.
        """
        free = self._free.get(bucket)
        if free:
            if prefer is not None:
                entry = free.get(id(prefer))
                if entry is not None and (not host or entry[1] <= self.completed):
                    del free[id(prefer)]
                    self.hits += 1
                    self.free_bytes -= bucket
                    return entry[0], bucket
            if not host:
                self.hits += 1
                self.free_bytes -= bucket
                return free.popitem()[1][0], bucket
            for key, (buf, fence) in free.items():
                if fence <= self.completed:
                    del free[key]
                    self.hits += 1
                    self.free_bytes -= bucket
                    return buf, bucket
        self.misses += 1
        allocate = self._device.allocator.allocate
        try:
            buf = allocate(bucket)
        except hal.ResourceExhaustedError:
            self.trim(0)
            try:
                buf = allocate(bucket)
            except hal.ResourceExhaustedError:
                # A GPU frees what was trimmed once the work submitted before it has completed.
                self._device.wait_idle()
                buf = allocate(bucket)
        self.allocated_bytes += bucket
        return buf, bucket

    def take(self, bucket: int, prefer: hal.Buffer | None) -> hal.Buffer:
        """A buffer of `bucket` bytes for device use: `prefer` if free, else any free one, else a new one."""
        free = self._free.get(bucket)
        if free:
            self.hits += 1
            self.free_bytes -= bucket
            if prefer is not None:
                entry = free.pop(id(prefer), None)
                if entry is not None:
                    return entry[0]
            return free.popitem()[1][0]
        return self.acquire_bucket(bucket, None, False)[0]

    def all_free(self, table: list, start: int, buckets: list) -> bool:
        """Whether the buffers of ``table`` from ``start`` on, one per bucket of ``buckets``, are all free."""
        # In C: each bucket's free entries (or none), asked for the id of the table's buffer there.
        return all(map(contains, map(self._free.get, buckets, _NO_ENTRIES), map(id, table[start:])))

    def release(self, buffer: hal.Buffer, bucket: int, fence: int = 0) -> None:
        """Give a buffer back; `fence` is the last submission that touches it."""
        if self.free_bytes + bucket > self.limit_bytes:
            self.trim(max(0, self.limit_bytes - bucket))
            if self.free_bytes + bucket > self.limit_bytes and fence <= self.handed_over:
                self.allocated_bytes -= bucket
                buffer.release()  # drivers free memory only once the work queued before has completed
                return
            # (else a replay queued in the runtime binds it: cached beyond the limit until a trim
            # after the hand-over)
        self._free.setdefault(bucket, {})[id(buffer)] = (buffer, fence)
        self.free_bytes += bucket

    def retire(self, completed: int) -> None:
        """Record that the timeline reached `completed` (buffers with older fences are host-usable)."""
        if completed > self.completed:
            self.completed = completed

    def trim(self, keep_bytes: int = 0) -> None:
        """Release free buffers until at most `keep_bytes` stay cached (largest first), but none that a
        replay still queued in the runtime binds (its fence not handed over)."""
        handed_over = self.handed_over
        for bucket in sorted(self._free, reverse=True):
            lst = self._free[bucket]
            for key, (buf, fence) in list(lst.items()):
                if self.free_bytes <= keep_bytes:
                    return
                if fence > handed_over:
                    continue
                del lst[key]
                buf.release()
                self.free_bytes -= bucket
                self.allocated_bytes -= bucket
