"""Allocators: create buffers of a device and keep statistics."""

from __future__ import annotations

import abc
import dataclasses
import threading
from typing import TYPE_CHECKING, Any

from hal.buffer import Buffer
from hal.checks import check_int
from hal.errors import InvalidArgumentError, ResourceExhaustedError, UnimplementedError
from hal.pickling import not_picklable
from hal.types import BufferUsage, MemoryAccess, MemoryType

if TYPE_CHECKING:
    from hal.device import Device


@dataclasses.dataclass(frozen=True)
class AllocatorStatistics:
    bytes_allocated: int
    bytes_peak: int
    live_buffers: int


class Allocator(abc.ABC):
    __reduce_ex__ = not_picklable("a hal.Allocator", "pickle its device's URI (device.info.uri)")

    """Validates requests and keeps statistics; drivers implement ``_allocate``/``_free``."""

    #: Largest single allocation the driver accepts (drivers refine it).
    max_allocation_size: int = 1 << 40

    def __init__(self, device: Device) -> None:
        self.device = device
        self._stats_lock = threading.Lock()
        self._bytes_allocated = 0
        self._bytes_peak = 0
        self._live_buffers = 0

    def allocate(self, size: int, memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                 usage: BufferUsage = BufferUsage.DEFAULT) -> Buffer:
        """A new root buffer of ``size`` bytes (0 gives a valid empty buffer)."""
        self.device.check_open()
        size, memory_type, usage = self.check_request(size, memory_type, usage)
        # An empty buffer still gets a (1-byte) allocation: drivers never see size 0, and an empty
        # buffer has an address like any other.
        allocation, actual_type = self._allocate(size or 1, memory_type, usage)
        return self.wrap(allocation, size, actual_type, usage)

    def check_request(self, size: object, memory_type: object,
                      usage: object) -> tuple[int, MemoryType, BufferUsage]:
        size = check_int(size, "allocation size")
        if not isinstance(memory_type, MemoryType) or not memory_type:
            raise InvalidArgumentError(f"memory_type must be a non-empty hal.MemoryType, got {memory_type!r}")
        if not isinstance(usage, BufferUsage) or not usage:
            raise InvalidArgumentError(f"usage must be a non-empty hal.BufferUsage, got {usage!r}")
        if size > self.max_allocation_size:
            raise ResourceExhaustedError(
                f"allocation size {size} bytes exceeds the largest allocation of "
                f"{self.max_allocation_size} bytes this device supports")
        return size, memory_type, usage

    def wrap(self, allocation: Any, size: int, memory_type: MemoryType,
             usage: BufferUsage) -> Buffer:
        """Account for a driver allocation and return its root buffer."""
        with self._stats_lock:
            self._bytes_allocated += size
            self._live_buffers += 1
            self._bytes_peak = max(self._bytes_peak, self._bytes_allocated)
        return Buffer(self, allocation, size, memory_type, usage)

    def statistics(self) -> AllocatorStatistics:
        """Bytes and buffers live now, and the peak; nothing is live once the device is closed."""
        with self._stats_lock:  # (no object made inside: a finalizer run there may release a buffer)
            allocated, peak, live = self._bytes_allocated, self._bytes_peak, self._live_buffers
        if self.device.closed:
            return AllocatorStatistics(0, peak, 0)
        return AllocatorStatistics(allocated, peak, live)

    # -- what buffers ask of their allocator (Buffer.release, map, device_address) ----------
    def release_buffer(self, buffer: Buffer) -> None:
        """A root buffer was released: give its allocation back (nothing once the device closed)."""
        if self.device.closed:
            return  # closing the device released every allocation; the driver's objects are gone
        with self._stats_lock:
            self._bytes_allocated -= buffer.size
            self._live_buffers -= 1
        self._free(buffer.allocation)

    def device_address(self, allocation: Any) -> int:
        return self._device_address(allocation)

    def map_range(self, allocation: Any, offset: int, length: int, access: MemoryAccess) -> memoryview:
        return self._map(allocation, offset, length, access)

    def unmap_range(self, allocation: Any, offset: int, length: int, access: MemoryAccess) -> None:
        self._unmap(allocation, offset, length, access)

    # -- driver hooks --------------------------------------------------------
    @abc.abstractmethod
    def _allocate(self, size: int, memory_type: MemoryType,
                  usage: BufferUsage) -> tuple[Any, MemoryType]:
        """Return (driver allocation, the memory type actually provided)."""

    @abc.abstractmethod
    def _free(self, allocation: Any) -> None:
        """Release a driver allocation (may defer until pending work is done)."""

    def _device_address(self, allocation: Any) -> int:
        """The device address of an allocation's first byte."""
        raise UnimplementedError(f"{type(self).__name__} does not expose device addresses")

    def _map(self, allocation: Any, offset: int, length: int, access: MemoryAccess) -> memoryview:
        raise NotImplementedError

    def _unmap(self, allocation: Any, offset: int, length: int, access: MemoryAccess) -> None:
        """Flush/unmap if the memory needs it; host-coherent memory needs nothing."""
