"""GPU memory: device-local allocations, pinned host memory, stream-ordered pool allocations.

A buffer's driver allocation is an ``Allocation`` record holding the device
address commands use. Frees never race queued work: a released buffer's memory
is freed once every submission made before the release has completed
(``Completion.defer_release``); ``queue_dealloca`` frees stream-ordered instead
(``mem_free_async`` after the work on its stream).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hal.allocator import Allocator
from hal.errors import FailedPreconditionError
from hal.types import BufferUsage, MemoryAccess, MemoryType

if TYPE_CHECKING:
    from hal.buffer import Buffer
    from hal.device import Device
    from hal.drivers.gpu.completion import Completion
    from hal.drivers.gpu.context import GpuContext

DEVICE_MEMORY = MemoryType.DEVICE_LOCAL | MemoryType.DEVICE_VISIBLE
#: Pinned host memory mapped into the device's address space.
HOST_MEMORY = (MemoryType.HOST_LOCAL | MemoryType.HOST_VISIBLE | MemoryType.HOST_COHERENT
               | MemoryType.HOST_CACHED | MemoryType.DEVICE_VISIBLE)
_HOST_BITS = MemoryType.HOST_LOCAL | MemoryType.HOST_VISIBLE | MemoryType.HOST_COHERENT | MemoryType.HOST_CACHED


class Allocation:
    """One driver allocation: ``ptr`` is the device address (for pinned memory too), ``host`` the host address."""

    __slots__ = ("ptr", "size", "kind", "host", "stream", "freed", "free_stream", "release")

    DEVICE = "device"  #: mem_alloc
    POOL = "pool"  #: mem_alloc_async from the device's memory pool, on ``stream``
    HOST = "host"  #: host_alloc (pinned)
    ADOPTED = "adopted"  #: device memory another library allocated; ``release()`` gives it back

    def __init__(self, ptr: int, size: int, kind: str, host: int = 0, stream: Any = None,
                 release: Callable[[], None] | None = None) -> None:
        self.ptr = ptr
        self.size = size
        self.kind = kind
        self.host = host
        #: The queue's stream a pool allocation was made on (its free follows that stream's work).
        self.stream = stream
        self.freed = False
        #: Set by queue_dealloca: free stream-ordered on this stream instead of after pending work.
        self.free_stream: Any = None
        self.release = release

    def __repr__(self) -> str:
        return f"<Allocation {self.kind} {self.size} bytes @0x{self.ptr:x}>"


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 36


def wants_host_memory(memory_type: MemoryType) -> bool:
    return bool(memory_type & _HOST_BITS)


class LiveMemory:
    """The driver allocations of one device not freed yet, and their freeing: one at a time
    (``free_now``) or all at once when the device closes (``free_all``). Kept apart from the
    allocator, which holds the device, so that a dropped device's finalizer can free them."""

    def __init__(self, context: GpuContext) -> None:
        self.context = context
        self._live: set[Allocation] = set()
        # Re-entrant: finalizers free memory (free_now) and may run on a thread inside this lock
        # (the cycle collector runs at allocations); a plain lock would wait for itself.
        self.lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._live)

    def track(self, allocation: Allocation) -> None:
        with self.lock:
            self._live.add(allocation)

    def free_now(self, allocation: Allocation, stream: Any = None) -> None:
        """Give the memory back to the driver (``stream``: stream-ordered, for pool memory)."""
        with self.lock:
            if allocation.freed:
                return
            allocation.freed = True
            self._live.discard(allocation)
        context = self.context
        if context.closed_for_good:
            return  # released with the context (the streams too: none is used after that)
        context.make_current()
        api = context.api
        try:
            if allocation.kind == Allocation.HOST:
                api.host_free(allocation.host)
            elif allocation.kind == Allocation.POOL:
                api.mem_free_async(allocation.ptr, stream if stream is not None else allocation.stream)
            elif allocation.kind == Allocation.ADOPTED:
                allocation.release()  # type: ignore[misc]
            else:
                api.mem_free(allocation.ptr)
        except Exception:  # a lost device frees everything with its context
            if not context.lost:
                raise

    def free_all(self) -> None:
        """Free every allocation still live (device close)."""
        with self.lock:
            live = list(self._live)
        for allocation in live:
            try:
                self.free_now(allocation)
            except Exception:
                pass


class GpuAllocator(Allocator):
    """Device-local memory unless the request asks for host-visible memory (then pinned host memory)."""

    def __init__(self, device: Device, memory: LiveMemory, completion: Completion,
                 device_memory_bytes: int) -> None:
        super().__init__(device)
        self.context = memory.context
        self.memory = memory
        self.completion = completion
        self.max_allocation_size = max(device_memory_bytes, physical_memory_bytes())
        #: Tracks a driver allocation until it is freed (``LiveMemory.track``).
        self.track = memory.track
        #: Frees a driver allocation now (``LiveMemory.free_now``).
        self.free_now = memory.free_now

    def _allocate(self, size: int, memory_type: MemoryType, usage: BufferUsage) -> tuple[Allocation, MemoryType]:
        context = self.context
        context.check_usable()
        context.make_current()
        api = context.api
        if wants_host_memory(memory_type):
            host = api.host_alloc(size)
            allocation = Allocation(api.host_device_pointer(host), size, Allocation.HOST, host=host)
            actual = HOST_MEMORY
        else:
            allocation = Allocation(api.mem_alloc(size), size, Allocation.DEVICE)
            actual = DEVICE_MEMORY
        self.track(allocation)
        return allocation, actual

    def adopt(self, ptr: int, size: int, release: Callable[[], None]) -> Buffer:
        """A device-local buffer over ``size`` bytes at ``ptr`` that another library allocated (a
        collective library's symmetric memory); its release calls ``release()`` once the work
        submitted before it is done, with the context current."""
        allocation = Allocation(ptr, size, Allocation.ADOPTED, release=release)
        self.track(allocation)
        return self.wrap(allocation, size, DEVICE_MEMORY, BufferUsage.DEFAULT)

    def _free(self, allocation: Allocation) -> None:
        if allocation.free_stream is not None:
            self.free_now(allocation, allocation.free_stream)
            return
        # Work submitted before the release may still read or write the memory. (The release holds
        # the live memory, not the allocator: a deferred release does not keep the device alive.)
        free_now = self.free_now
        self.completion.defer_release(lambda: free_now(allocation))

    def _device_address(self, allocation: Allocation) -> int:
        return allocation.ptr

    def _map(self, allocation: Allocation, offset: int, length: int, access: MemoryAccess) -> memoryview:
        if self.device.closed:
            raise FailedPreconditionError("cannot map a buffer of a closed device")
        if allocation.kind != Allocation.HOST:
            raise FailedPreconditionError("only host-visible (pinned) buffers can be mapped")
        if length == 0:
            return memoryview(bytearray(0))
        array = (ctypes.c_ubyte * length).from_address(allocation.host + offset)
        return memoryview(array).cast("B")
