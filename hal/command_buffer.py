"""Command buffers: validated recording of transfers, dispatches and barriers.

The public methods check every argument and the recording state once, here;
drivers implement the protected hooks (``_fill``, ``_update``, ``_copy``,
``_dispatch``, ``_barrier``, ``_begin``, ``_end``) and never re-validate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from hal.buffer import Buffer, check_int
from hal.errors import FailedPreconditionError, InvalidArgumentError, OutOfRangeError
from hal.executable import Executable, Export
from hal.types import BufferUsage, CommandBufferMode, CommandBufferState

if TYPE_CHECKING:
    from hal.device import Device

#: Largest inline payload of update_buffer (IREE's limit too).
MAX_UPDATE_SIZE = 64 * 1024
UINT32_MAX = (1 << 32) - 1
_DISPATCH_BIT = BufferUsage.DISPATCH_STORAGE.value
_RECORDING = CommandBufferState.RECORDING
_REUSABLE_BIT = CommandBufferMode.REUSABLE.value


class Slot(NamedTuple):
    """A reference to entry ``index`` of the binding table given at submission."""

    index: int
    offset: int = 0
    length: int | None = None


#: One resolved binding-table entry: (buffer, offset within that buffer, length).
Binding = tuple[Buffer, int, int]


class BufferRef:
    """A validated buffer range: direct (``buffer`` set) or indirect through a binding-table ``slot``.

    For direct refs ``offset`` is relative to ``buffer`` (absolute in the root
    allocation: ``buffer.offset + offset``) and ``length`` is resolved. For slot
    refs they are relative to the table entry, and ``length`` may be None (to the end).
    """

    __slots__ = ("buffer", "slot", "offset", "length")

    def __init__(self, buffer: Buffer | None, slot: int | None, offset: int, length: int | None) -> None:
        self.buffer = buffer
        self.slot = slot
        self.offset = offset
        self.length = length

    def resolve(self, table: Sequence[Binding] | None) -> Binding:
        """(buffer, offset within buffer, length) against a binding table."""
        if self.buffer is not None:
            return self.buffer, self.offset, self.length  # type: ignore[return-value]
        buffer, base, size = table[self.slot]  # type: ignore[index]
        length = size - self.offset if self.length is None else self.length
        return buffer, base + self.offset, length

    def __repr__(self) -> str:
        where = f"slot {self.slot}" if self.buffer is None else repr(self.buffer)
        return f"<BufferRef {where} +{self.offset} len={self.length}>"


class _SlotUse(NamedTuple):
    ref: BufferRef
    what: str
    usage: BufferUsage
    alignment: int


class CommandBuffer:
    """A recorded sequence of commands for one device."""

    def __init__(self, device: Device, mode: CommandBufferMode, binding_capacity: int) -> None:
        self.device = device
        self.mode = mode
        self.binding_capacity = binding_capacity
        self.state = CommandBufferState.INITIAL
        self._slot_uses: list[_SlotUse] = []
        # Identical slot uses are checked once per submission: the check costs O(distinct uses), not O(commands).
        self._slot_use_keys: set[tuple] = set()
        #: Dispatch bindings of whole buffers, checked once per buffer (drivers never modify refs).
        self._whole_refs: dict[Buffer, BufferRef] = {}
        #: The last binding table that passed the checks: [its entries as given, resolved, buffers to watch].
        self._checked_table: list | None = None

    @property
    def reusable(self) -> bool:
        return bool(self.mode._value_ & _REUSABLE_BIT)

    # -- recording state -------------------------------------------------------
    def begin(self) -> None:
        if self.state is not CommandBufferState.INITIAL:
            raise FailedPreconditionError(
                f"begin() needs a command buffer in the initial state, it is {self.state.value}")
        self.device._check_open()
        self.state = CommandBufferState.RECORDING
        self._begin()

    def end(self) -> None:
        self._check_recording("end()")
        self._end()
        self.state = CommandBufferState.EXECUTABLE

    @contextlib.contextmanager
    def record(self) -> Iterator[CommandBuffer]:
        """``with cb.record():`` begins, and ends when the block completes."""
        self.begin()
        yield self
        self.end()

    def _check_recording(self, what: str) -> None:
        if self.state is not CommandBufferState.RECORDING:
            raise FailedPreconditionError(
                f"{what} needs a command buffer in the recording state, it is {self.state.value}")

    # -- references -------------------------------------------------------------
    def _ref(self, ref: object, what: str, usage: BufferUsage, alignment: int = 1) -> BufferRef:
        if type(ref) is Buffer:
            # Fast path for the common case (a whole live buffer of this device): dispatch is hot.
            if not ref._released and not ref._root._released and ref.device is self.device \
                    and usage in ref.usage and (alignment == 1 or ref.offset % alignment == 0 == ref.size % alignment):
                return BufferRef(ref, None, 0, ref.size)
            buffer, offset, length = ref, 0, None
        elif isinstance(ref, Slot):
            return self._slot_ref(ref, what, usage, alignment)
        elif isinstance(ref, tuple) and len(ref) in (2, 3) and isinstance(ref[0], Buffer):
            buffer, offset = ref[0], ref[1]
            length = ref[2] if len(ref) == 3 else None
        elif isinstance(ref, Buffer):
            buffer, offset, length = ref, 0, None
        else:
            raise InvalidArgumentError(
                f"{what} must be a Buffer, a (Buffer, offset, length) tuple or a hal.Slot, got {ref!r}")
        buffer.check_live(what)
        if buffer.device is not self.device:
            raise InvalidArgumentError(f"{what} belongs to another device ({buffer.device!r})")
        if usage not in buffer.usage:
            raise FailedPreconditionError(f"{what} usage {buffer.usage} lacks {usage}")
        offset, length = buffer.check_range(offset, length, what)
        if alignment > 1 and ((buffer.offset + offset) % alignment or length % alignment):
            raise InvalidArgumentError(
                f"{what} offset {offset} and length {length} must be multiples of the "
                f"{alignment}-byte pattern length")
        return BufferRef(buffer, None, offset, length)

    def _slot_ref(self, slot: Slot, what: str, usage: BufferUsage, alignment: int) -> BufferRef:
        if self.binding_capacity == 0:
            raise InvalidArgumentError(f"{what} uses {slot!r} but the command buffer has binding_capacity 0")
        index = check_int(slot.index, f"{what} slot index")
        if index >= self.binding_capacity:
            raise InvalidArgumentError(
                f"{what} slot index {index} is not below the binding capacity {self.binding_capacity}")
        offset = check_int(slot.offset, f"{what} slot offset")
        length = None if slot.length is None else check_int(slot.length, f"{what} slot length")
        if alignment > 1 and (offset % alignment or (length is not None and length % alignment)):
            raise InvalidArgumentError(
                f"{what} slot offset {offset} and length {length} must be multiples of the "
                f"{alignment}-byte pattern length")
        ref = BufferRef(None, index, offset, length)
        key = (index, offset, length, usage, alignment)
        if key not in self._slot_use_keys:
            self._slot_use_keys.add(key)
            self._slot_uses.append(_SlotUse(ref, what, usage, alignment))
        return ref

    def check_binding_table(self, table: Sequence[Binding]) -> None:
        """Validate every slot use against a resolved table (at submission, before any work)."""
        for use in self._slot_uses:
            ref = use.ref
            buffer, base, size = table[ref.slot]  # type: ignore[index]
            if use.usage._value_ & ~buffer.usage._value_:
                raise FailedPreconditionError(
                    f"binding table entry {ref.slot} (used as {use.what}) lacks usage {use.usage}")
            length = size - ref.offset if ref.length is None else ref.length
            if ref.offset + length > size or length < 0:
                raise OutOfRangeError(
                    f"{use.what} [{ref.offset}, {ref.offset + length}) exceeds binding table entry "
                    f"{ref.slot} of {size} bytes")
            if use.alignment > 1 and ((buffer.offset + base + ref.offset) % use.alignment
                                      or length % use.alignment):
                raise InvalidArgumentError(
                    f"{use.what} through slot {ref.slot} is not aligned to the "
                    f"{use.alignment}-byte pattern length")

    # -- commands ---------------------------------------------------------------
    def fill_buffer(self, target: object, pattern: int, pattern_length: int) -> None:
        """Fill ``target`` with a little-endian 1, 2 or 4-byte ``pattern``."""
        self._check_recording("fill_buffer")
        if pattern_length not in (1, 2, 4) or isinstance(pattern_length, bool):
            raise InvalidArgumentError(f"pattern_length must be 1, 2 or 4, got {pattern_length!r}")
        pattern = check_int(pattern, "fill pattern")
        if pattern >> (8 * pattern_length):
            raise InvalidArgumentError(
                f"fill pattern {pattern:#x} does not fit in pattern_length {pattern_length} bytes")
        ref = self._ref(target, "fill target", BufferUsage.TRANSFER, pattern_length)
        if ref.length != 0:
            self._fill(ref, pattern, pattern_length)

    def update_buffer(self, data: object, target: object) -> None:
        """Copy ``data`` (<= 64 KiB, captured now) into ``target``."""
        self._check_recording("update_buffer")
        try:
            payload = memoryview(data).cast("B").tobytes()  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgumentError(
                f"update data must be bytes-like or a contiguous array, got {type(data).__name__}") from None
        if len(payload) > MAX_UPDATE_SIZE:
            raise InvalidArgumentError(
                f"update data is {len(payload)} bytes; update_buffer takes at most {MAX_UPDATE_SIZE}")
        if isinstance(target, Buffer):
            target = (target, 0, len(payload))
        elif isinstance(target, Slot) and target.length is None:
            target = target._replace(length=len(payload))
        elif isinstance(target, tuple) and len(target) == 2:
            target = (*target, len(payload))
        ref = self._ref(target, "update target", BufferUsage.TRANSFER)
        if ref.length != len(payload):
            raise InvalidArgumentError(
                f"update data is {len(payload)} bytes but the target range is {ref.length} bytes")
        if payload:
            self._update(payload, ref)

    def copy_buffer(self, source: object, target: object) -> None:
        """Copy between two ranges of equal length (which must not overlap)."""
        self._check_recording("copy_buffer")
        src = self._ref(source, "copy source", BufferUsage.TRANSFER)
        dst = self._ref(target, "copy target", BufferUsage.TRANSFER)
        if src.length is None and dst.length is not None:
            src.length = dst.length
        elif dst.length is None and src.length is not None:
            dst.length = src.length
        if src.length != dst.length:
            raise InvalidArgumentError(
                f"copy source length {src.length} differs from target length {dst.length}")
        if src.buffer is not None and dst.buffer is not None and src.buffer.root is dst.buffer.root:
            a = src.buffer.offset + src.offset
            b = dst.buffer.offset + dst.offset
            if a < b + dst.length and b < a + src.length:  # type: ignore[operator]
                raise InvalidArgumentError(
                    f"copy source [{a}, {a + src.length}) and target [{b}, {b + dst.length}) "  # type: ignore[operator]
                    "overlap in the same allocation")
        if src.length != 0:
            self._copy(src, dst)

    def execution_barrier(self) -> None:
        """Commands after the barrier start only after every command before it completed."""
        self._check_recording("execution_barrier")
        self._barrier()

    def dispatch(self, executable: Executable, entry_point: str | int,
                 workgroups: int | Sequence[int] = (1, 1, 1), constants: Sequence[int] = (),
                 bindings: Sequence[object] = ()) -> None:
        """Run export ``entry_point`` over ``workgroups`` with uint32 ``constants`` and buffer ``bindings``."""
        # Recording thousands of dispatches is a hot loop: the common well-formed cases are checked
        # inline here, anything else goes through the full checks (and their error messages).
        if self.state is not _RECORDING:
            self._check_recording("dispatch")
        if not isinstance(executable, Executable):
            raise InvalidArgumentError(f"dispatch needs a hal.Executable, got {type(executable).__name__}")
        device = self.device
        if executable.device is not device:
            raise InvalidArgumentError("dispatch executable belongs to another device")
        exports = executable.exports
        if type(entry_point) is int and 0 <= entry_point < len(exports):
            ordinal, export = entry_point, exports[entry_point]
        else:
            ordinal, export = executable.export(entry_point)
        grid = workgroups
        if type(workgroups) is tuple and len(workgroups) == 3:
            x, y, z = workgroups
            limits = device.limits["max_workgroup_count"]
            if not (type(x) is int and type(y) is int and type(z) is int and 0 <= x <= limits[0]
                    and 0 <= y <= limits[1] and 0 <= z <= limits[2]):
                grid = self._check_workgroups(workgroups)
        else:
            grid = self._check_workgroups(workgroups)
        if (type(constants) is tuple or type(constants) is list) and len(constants) == export.constants:
            for value in constants:
                if type(value) is not int or not 0 <= value <= UINT32_MAX:
                    values = self._check_constants(export, constants)
                    break
            else:
                values = tuple(constants)
        else:
            values = self._check_constants(export, constants)
        if type(bindings) is not list and type(bindings) is not tuple and (
                isinstance(bindings, (str, bytes)) or not isinstance(bindings, Sequence)):
            raise InvalidArgumentError(f"dispatch bindings must be a sequence, got {bindings!r}")
        if len(bindings) != export.bindings:
            raise InvalidArgumentError(
                f"export {export.name!r} takes {export.bindings} bindings, got {len(bindings)}")
        refs = []
        whole_refs = self._whole_refs
        for i, b in enumerate(bindings):
            # Inline fast path (whole live buffer of this device): formatting `what` costs more than the check.
            if type(b) is Buffer and not b._released and not b._root._released:
                ref = whole_refs.get(b)  # device and usage never change: checked once per buffer
                if ref is None and b.device is device and _DISPATCH_BIT & b.usage._value_:
                    ref = whole_refs[b] = BufferRef(b, None, 0, b.size)
                if ref is not None:
                    refs.append(ref)
                    continue
            refs.append(self._ref(b, f"binding {i} of {export.name!r}", BufferUsage.DISPATCH_STORAGE))
        if 0 in grid:
            return
        self._dispatch(executable, ordinal, export, grid, values, refs)

    def _check_workgroups(self, workgroups: object) -> tuple[int, int, int]:
        limits = self.device.limits["max_workgroup_count"]
        if type(workgroups) is tuple and len(workgroups) == 3:
            x, y, z = workgroups
            if type(x) is int and type(y) is int and type(z) is int and 0 <= x <= limits[0] \
                    and 0 <= y <= limits[1] and 0 <= z <= limits[2]:
                return workgroups  # type: ignore[return-value]
        if isinstance(workgroups, (int,)) and not isinstance(workgroups, bool):
            grid: tuple = (workgroups, 1, 1)
        elif isinstance(workgroups, Sequence) and 1 <= len(workgroups) <= 3:
            grid = tuple(workgroups) + (1,) * (3 - len(workgroups))
        else:
            raise InvalidArgumentError(f"workgroups must be an int or 1-3 ints, got {workgroups!r}")
        for axis, (count, limit) in enumerate(zip(grid, limits)):
            count = check_int(count, f"workgroups[{axis}]")
            if count > limit:
                raise InvalidArgumentError(f"workgroups[{axis}] = {count} exceeds the device limit {limit}")
        return grid  # type: ignore[return-value]

    @staticmethod
    def _check_constants(export: Export, constants: object) -> tuple[int, ...]:
        if (type(constants) is tuple or type(constants) is list) and len(constants) == export.constants \
                and all(type(v) is int and 0 <= v <= UINT32_MAX for v in constants):
            return tuple(constants)
        if isinstance(constants, (str, bytes)) or not isinstance(constants, Sequence):
            raise InvalidArgumentError(f"dispatch constants must be a sequence of ints, got {constants!r}")
        if len(constants) != export.constants:
            raise InvalidArgumentError(
                f"export {export.name!r} takes {export.constants} constants, got {len(constants)}")
        values = []
        for i, value in enumerate(constants):
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise InvalidArgumentError(
                    f"constant {i} must be an int (pass floats as their uint32 bits), got {value!r}")
            value = value.__index__()
            if not -(1 << 31) <= value <= UINT32_MAX:
                raise InvalidArgumentError(f"constant {i} = {value} does not fit in 32 bits")
            values.append(value & UINT32_MAX)
        return tuple(values)

    # -- driver hooks -------------------------------------------------------------
    def _begin(self) -> None:
        pass

    def _end(self) -> None:
        pass

    def _fill(self, target: BufferRef, pattern: int, pattern_length: int) -> None:
        raise NotImplementedError

    def _update(self, data: bytes, target: BufferRef) -> None:
        raise NotImplementedError

    def _copy(self, source: BufferRef, target: BufferRef) -> None:
        raise NotImplementedError

    def _barrier(self) -> None:
        raise NotImplementedError

    def _dispatch(self, executable: Executable, ordinal: int, export: Export,
                  workgroups: tuple[int, int, int], constants: tuple[int, ...],
                  bindings: list[BufferRef]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<hal.CommandBuffer {self.mode} {self.state.value} capacity={self.binding_capacity}>"
