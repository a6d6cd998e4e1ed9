"""Host memory for the CPU drivers: every buffer is a numpy byte array."""

from __future__ import annotations

import os

import numpy as np

from hal.allocator import Allocator
from hal.errors import ResourceExhaustedError
from hal.types import BufferUsage, MemoryAccess, MemoryType

#: On a CPU device, device-local and host-visible memory coincide.
HOST_MEMORY = (MemoryType.DEVICE_LOCAL | MemoryType.DEVICE_VISIBLE | MemoryType.HOST_LOCAL
               | MemoryType.HOST_VISIBLE | MemoryType.HOST_COHERENT)


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34


class LocalAllocator(Allocator):
    def __init__(self, device) -> None:
        super().__init__(device)
        self.max_allocation_size = physical_memory_bytes()

    def _allocate(self, size: int, memory_type: MemoryType, usage: BufferUsage) -> tuple[np.ndarray, MemoryType]:
        try:
            return np.empty(size, dtype=np.uint8), HOST_MEMORY
        except MemoryError:
            raise ResourceExhaustedError(f"out of host memory allocating {size} bytes") from None

    def _free(self, allocation: np.ndarray) -> None:
        pass  # numpy frees the memory once queued work holding it has dropped its references

    def _device_address(self, allocation: np.ndarray) -> int:
        return allocation.ctypes.data  # the CPU is the device: a host address

    def _map(self, allocation: np.ndarray, offset: int, length: int, access: MemoryAccess) -> memoryview:
        return memoryview(allocation[offset:offset + length])


def span(buffer, offset: int, length: int) -> np.ndarray:
    """The bytes ``[offset, offset+length)`` of ``buffer`` as a uint8 array view."""
    start = buffer.offset + offset
    return buffer.allocation[start:start + length]
