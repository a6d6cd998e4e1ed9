"""Buffers: ranges of memory owned by an allocator, and views (subspans) of them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from hal.checks import check_int, check_live, check_range  # noqa: F401  (check_int: re-exported)
from hal.errors import FailedPreconditionError, InvalidArgumentError
from hal.pickling import not_picklable
from hal.types import BufferUsage, MemoryAccess, MemoryType

if TYPE_CHECKING:
    from hal.allocator import Allocator
    from hal.device import Device


class Buffer:
    """A byte range of device memory.

    A root buffer owns its allocation; a subspan aliases part of its root.

    Driver-facing attributes (read-only by convention):

    - ``allocation``: the driver's object for the root's memory (what ``Allocator._allocate``
      returned), shared by every subspan of that root;
    - ``offset``: the byte offset of this buffer inside that allocation (drivers address
      ``allocation + offset``);
    - ``root``: the buffer owning the allocation (itself for a root);
    - ``released``: whether this buffer or its root was released.
    """

    __slots__ = ("allocator", "device", "allocation", "root", "offset", "size",
                 "memory_type", "usage", "_released", "__weakref__")

    __reduce_ex__ = not_picklable("a hal.Buffer", "pickle its contents (device.read(buffer)) or a runtime array")

    def __init__(self, allocator: Allocator, allocation: Any, size: int,
                 memory_type: MemoryType, usage: BufferUsage,
                 *, root: Buffer | None = None, offset: int = 0) -> None:
        self.allocator = allocator
        self.device: Device = allocator.device
        self.allocation = allocation
        self.root = root if root is not None else self
        self.offset = offset
        self.size = size
        self.memory_type = memory_type
        self.usage = usage
        self._released = False

    # -- state -------------------------------------------------------------
    @property
    def released(self) -> bool:
        root = self.root
        return self._released or (root is not self and root.released)

    # Transitional aliases of ``allocation`` and ``root`` for drivers not yet using the names above.
    @property
    def _allocation(self) -> Any:
        return self.allocation

    @property
    def _root(self) -> Buffer:
        return self.root

    def check_live(self, what: str = "buffer") -> None:
        """FailedPreconditionError if this buffer (or its root) was released or its device closed."""
        check_live(self, what)

    def release(self) -> None:
        """Give the memory back (root) or drop the view (subspan). Idempotent, also after close()."""
        if self._released:
            return
        self._released = True
        # After the flag: submissions validated before this release look again (see Device).
        self.device.note_release()
        if self.root is self:
            self.allocator.release_buffer(self)

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- views -------------------------------------------------------------
    def check_range(self, offset: object, length: object, what: str = "range") -> tuple[int, int]:
        """Validate ``[offset, offset+length)`` inside this buffer; ``length=None`` means to the end."""
        return check_range(self, offset, length, what)

    def subspan(self, offset: int, length: int | None = None) -> Buffer:
        """A buffer aliasing ``[offset, offset+length)`` of this one."""
        self.check_live()
        offset, length = self.check_range(offset, length, "subspan")
        if length == 0:
            raise InvalidArgumentError("subspan length must be > 0")
        return Buffer(self.allocator, self.allocation, length, self.memory_type, self.usage,
                      root=self.root, offset=self.offset + offset)

    @property
    def device_address(self) -> int:
        """The address kernels see for this buffer's first byte (for interop: DLPack,
        ``__cuda_array_interface__``). Valid until the buffer is released."""
        self.check_live()
        return self.allocator.device_address(self.allocation) + self.offset

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
        view = self.allocator.map_range(self.allocation, self.offset + offset, length, access)
        if not (access & (MemoryAccess.WRITE | MemoryAccess.DISCARD)):
            view = view.toreadonly()
        try:
            yield view
        finally:
            view.release()
            self.allocator.unmap_range(self.allocation, self.offset + offset, length, access)

    def __repr__(self) -> str:
        state = " released" if self.released else ""
        return f"<hal.Buffer {self.size} bytes @{self.offset} {self.memory_type}{state}>"


# -- checks of buffer arguments (the core's hot paths call these) ----------------------------------
def is_live_buffer_of(buffer: object, device: Device) -> bool:
    """Whether ``buffer`` is a whole hal.Buffer of ``device`` that is not released (the fast path)."""
    return type(buffer) is Buffer and buffer.device is device and not buffer.released  # type: ignore[union-attr]


def check_buffer(buffer: object, device: Device, what: str) -> Buffer:
    """A live hal.Buffer of ``device``."""
    if not isinstance(buffer, Buffer):
        raise InvalidArgumentError(f"{what} must be a hal.Buffer, got {type(buffer).__name__} {buffer!r}")
    check_live(buffer, what)
    if buffer.device is not device:
        raise InvalidArgumentError(f"{what} belongs to another device ({buffer.device!r})")
    return buffer


def split_buffer_range(ref: object, what: str) -> tuple[Buffer, object, object]:
    """(buffer, offset, length) of ``Buffer`` or ``(Buffer, offset[, length])``, unchecked."""
    if isinstance(ref, Buffer):
        return ref, 0, None
    if isinstance(ref, tuple) and len(ref) in (2, 3) and isinstance(ref[0], Buffer):
        return ref[0], ref[1], (ref[2] if len(ref) == 3 else None)
    raise InvalidArgumentError(f"{what} must be a Buffer or a (Buffer, offset, length) tuple, got {ref!r}")


def check_binding(entry: object, device: Device, what: str) -> tuple[Buffer, int, int]:
    """A binding-table entry resolved to (buffer, offset, length)."""
    if is_live_buffer_of(entry, device):
        return entry, 0, entry.size  # type: ignore[return-value,union-attr]
    buffer, offset, length = split_buffer_range(entry, what)
    check_buffer(buffer, device, what)
    offset, length = check_range(buffer, offset, length, what)
    return buffer, offset, length

