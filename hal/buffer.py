"""Buffers: ranges of memory owned by an allocator, and views (subspans) of them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hal.errors import FailedPreconditionError, InvalidArgumentError, OutOfRangeError
from hal.types import BufferUsage, MemoryAccess, MemoryType

if TYPE_CHECKING:
    from hal.allocator import Allocator
    from hal.device import Device


def check_int(value: object, what: str, *, minimum: int = 0) -> int:
    """An int (numpy integers included, bools excluded) >= minimum, else InvalidArgumentError."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    value = value.__index__()
    if value < minimum:
        raise InvalidArgumentError(f"{what} must be >= {minimum}, got {value}")
    return value


class Buffer:
    """A byte range of device memory.

    A root buffer owns its allocation (a driver-defined object in ``_allocation``);
    a subspan aliases part of its root. ``offset`` is the byte offset of this
    buffer inside the root allocation, so drivers address ``root + offset``.
    """

    __slots__ = ("allocator", "device", "_allocation", "_root", "offset", "size",
                 "memory_type", "usage", "_released", "__weakref__")

    def __init__(self, allocator: Allocator, allocation: Any, size: int,
                 memory_type: MemoryType, usage: BufferUsage,
                 *, root: Buffer | None = None, offset: int = 0) -> None:
        self.allocator = allocator
        self.device: Device = allocator.device
        self._allocation = allocation
        self._root = root if root is not None else self
        self.offset = offset
        self.size = size
        self.memory_type = memory_type
        self.usage = usage
        self._released = False

    # -- state -------------------------------------------------------------
    @property
    def released(self) -> bool:
        return self._released or self._root._released

    @property
    def root(self) -> Buffer:
        return self._root

    def check_live(self, what: str = "buffer") -> None:
        if self._released or self._root._released:
            raise FailedPreconditionError(f"{what} has been released and can no longer be used")

    def release(self) -> None:
        """Give the memory back (root) or drop the view (subspan). Idempotent."""
        if self._released:
            return
        self._released = True
        if self._root is self:
            self.allocator._release_buffer(self)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- views -------------------------------------------------------------
    def check_range(self, offset: object, length: object, what: str = "range") -> tuple[int, int]:
        """Validate ``[offset, offset+length)`` inside this buffer; ``length=None`` means to the end."""
        offset = check_int(offset, f"{what} offset")
        if offset > self.size:
            raise OutOfRangeError(f"{what} offset {offset} is past the end of a buffer of {self.size} bytes")
        if length is None:
            length = self.size - offset
        else:
            length = check_int(length, f"{what} length")
        if offset + length > self.size:
            raise OutOfRangeError(
                f"{what} [{offset}, {offset + length}) exceeds the buffer size of {self.size} bytes")
        return offset, length

    def subspan(self, offset: int, length: int | None = None) -> Buffer:
        """A buffer aliasing ``[offset, offset+length)`` of this one."""
        self.check_live()
        offset, length = self.check_range(offset, length, "subspan")
        if length == 0:
            raise InvalidArgumentError("subspan length must be > 0")
        return Buffer(self.allocator, self._allocation, length, self.memory_type, self.usage,
                      root=self._root, offset=self.offset + offset)

    @property
    def device_address(self) -> int:
        """The address kernels see for this buffer's first byte (for interop: DLPack,
        ``__cuda_array_interface__``). Valid until the buffer is released."""
        self.check_live()
        return self.allocator._device_address(self._allocation) + self.offset

    # -- host access ---------------------------------------------------------
    @contextlib.contextmanager
    def map(self, access: MemoryAccess = MemoryAccess.READ | MemoryAccess.WRITE,
            offset: int = 0, length: int | None = None) -> Iterator[memoryview]:
        """Map a host-visible range; yields a byte memoryview (read-only for READ access)."""
        self.check_live()
        if not isinstance(access, MemoryAccess) or not access:
            raise InvalidArgumentError(f"access must be a non-empty hal.MemoryAccess, got {access!r}")
        if MemoryType.HOST_VISIBLE not in self.memory_type:
            raise FailedPreconditionError(
                f"buffer memory {self.memory_type} is not HOST_VISIBLE and cannot be mapped; "
                "allocate it with MemoryType.HOST_VISIBLE")
        if BufferUsage.MAPPING not in self.usage:
            raise FailedPreconditionError(f"buffer usage {self.usage} lacks BufferUsage.MAPPING")
        offset, length = self.check_range(offset, length, "map")
        view = self.allocator._map(self._allocation, self.offset + offset, length, access)
        if not (access & (MemoryAccess.WRITE | MemoryAccess.DISCARD)):
            view = view.toreadonly()
        try:
            yield view
        finally:
            view.release()
            self.allocator._unmap(self._allocation, self.offset + offset, length, access)

    def __repr__(self) -> str:
        state = " released" if self.released else ""
        return f"<hal.Buffer {self.size} bytes @{self.offset} {self.memory_type}{state}>"
