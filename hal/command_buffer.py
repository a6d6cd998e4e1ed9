"""Command buffers: validated recording of transfers, dispatches, collectives and barriers.

The public methods check every argument and the recording state once, here;
drivers implement the protected hooks (``_fill``, ``_update``, ``_copy``,
``_dispatch``, ``_collective``, ``_barrier``, ``_begin``, ``_end``) and never re-validate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

from hal.buffer import Buffer, check_buffer, check_range, split_buffer_range
from hal.channel import Channel, Collective, check_collective, check_operands
from hal.checks import (
    check_constants,
    check_int,
    check_pattern,
    check_sequence,
    check_update_data,
    check_workgroups,
)
from hal.errors import FailedPreconditionError, HalError, InvalidArgumentError, OutOfRangeError
from hal.executable import Executable, Export
from hal.library import Routine
from hal.pickling import not_picklable
from hal.types import BufferUsage, CommandBufferMode, CommandBufferState

if TYPE_CHECKING:
    from hal.device import Device

#: Largest inline payload of update_buffer (IREE's limit too).
MAX_UPDATE_SIZE = 64 * 1024
UINT32_MAX = (1 << 32) - 1
_RECORDING = CommandBufferState.RECORDING


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


#: What no argument can be (None is a bad argument the checks must see).
_NOTHING_CHECKED = object()


class _SlotUse(NamedTuple):
    ref: BufferRef
    what: str
    usage: BufferUsage
    alignment: int


class CommandBuffer:
    """A recorded sequence of commands for one device.

    Driver-facing read-only views of a recording (``hal.validation`` uses them at submission):
    ``direct_buffers`` (buffers commands reference directly, checked live at each submission),
    ``slot_uses`` (each distinct use of a binding-table slot) and ``slot_copies`` (copies whose
    operands both come from the table, so their lengths are checked against each other).
    """

    __reduce_ex__ = not_picklable("a hal.CommandBuffer", "record it again in the other process")

    def __init__(self, device: Device, mode: CommandBufferMode, binding_capacity: int) -> None:
        self.device = device
        self.mode = mode
        #: Whether the command buffer may be submitted again (``mode`` holds REUSABLE).
        self.reusable = CommandBufferMode.REUSABLE in mode
        self.binding_capacity = binding_capacity
        self.state = CommandBufferState.INITIAL
        self._slot_uses: list[_SlotUse] = []
        # Identical slot uses are checked once per submission: the check costs O(distinct uses), not O(commands).
        self._slot_use_keys: set[tuple] = set()
        self._slot_copies: list[tuple[BufferRef, BufferRef]] = []
        #: Library dispatches binding a slot: (routine, what its check returned, refs), checked per table.
        self._slot_routines: list[tuple[Routine, object, list[BufferRef]]] = []
        #: Collectives with an operand through a slot: (operation, rank, ranks, send, recv), checked per table.
        self._slot_collectives: list[tuple[Collective, int, int, BufferRef | None, BufferRef | None]] = []
        #: Buffers referenced directly, by identity (views and roots alike).
        self._direct: dict[int, Buffer] = {}
        #: Dispatch bindings of whole buffers, checked once per buffer (drivers never modify refs).
        self._whole_refs: dict[Buffer, BufferRef] = {}
        self._whole_refs_at = device.release_epoch
        #: The workgroups tuple the last dispatch passed as it was (checked; tuples are immutable).
        self._checked_workgroups: object = _NOTHING_CHECKED
        #: (executable, entry point as passed, ordinal, export) of the last dispatch: a loop's
        #: dispatches of one export are resolved once (executables never change device or exports).
        self._last_export: tuple = (_NOTHING_CHECKED, _NOTHING_CHECKED, 0, None)

    @property
    def direct_buffers(self) -> Iterable[Buffer]:
        return self._direct.values()

    @property
    def slot_uses(self) -> Sequence[_SlotUse]:
        return self._slot_uses

    @property
    def slot_copies(self) -> Sequence[tuple[BufferRef, BufferRef]]:
        return self._slot_copies

    @property
    def slot_routines(self) -> Sequence[tuple[Routine, object, list[BufferRef]]]:
        return self._slot_routines

    @property
    def slot_collectives(self) -> Sequence[tuple[Collective, int, int, BufferRef | None, BufferRef | None]]:
        return self._slot_collectives

    # -- recording state -------------------------------------------------------
    def begin(self) -> None:
        if self.state is not CommandBufferState.INITIAL:
            raise FailedPreconditionError(
                f"begin() needs a command buffer in the initial state, it is {self.state.value}")
        self.device.check_open()
        self.state = CommandBufferState.RECORDING
        self._begin()

    def end(self) -> None:
        self._check_recording("end()")
        try:
            self._end()
        except HalError as exc:
            # A close() racing the end tears down what the driver was building (a GPU graph's
            # context): that is the close's rejection, not a fault of the commands.
            if self.device.closed and not isinstance(exc, FailedPreconditionError):
                raise FailedPreconditionError(f"the device was closed while the command buffer ended ({exc})") from exc
            raise
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
        self.device.check_open()

    # -- references -------------------------------------------------------------
    def _ref(self, ref: object, what: str, usage: BufferUsage, alignment: int = 1) -> BufferRef:
        result = check_buffer_ref(self, ref, what, usage, alignment)
        buffer = result.buffer
        if buffer is None:
            self._note_slot_use(result, what, usage, alignment)
        else:
            self._direct[id(buffer)] = buffer
        return result

    def _note_slot_use(self, ref: BufferRef, what: str, usage: BufferUsage, alignment: int) -> None:
        key = (ref.slot, ref.offset, ref.length, usage, alignment)
        if key not in self._slot_use_keys:
            self._slot_use_keys.add(key)
            self._slot_uses.append(_SlotUse(ref, what, usage, alignment))

    def check_binding_table(self, table: Sequence[Binding]) -> None:
        """Validate every slot use against a resolved table (at submission, before any work)."""
        check_slot_uses(self, table)

    # -- commands ---------------------------------------------------------------
    def fill_buffer(self, target: object, pattern: int, pattern_length: int) -> None:
        """Fill ``target`` with a little-endian 1, 2 or 4-byte ``pattern`` (a zero-length range: no-op)."""
        self._check_recording("fill_buffer")
        pattern, pattern_length = check_pattern(pattern, pattern_length)
        ref = self._ref(target, "fill target", BufferUsage.TRANSFER, pattern_length)
        if ref.length != 0:
            self._fill(ref, pattern, pattern_length)

    def update_buffer(self, data: object, target: object) -> None:
        """Copy ``data`` (<= 64 KiB, captured now) into ``target`` (empty data: no-op)."""
        self._check_recording("update_buffer")
        payload = check_update_data(data, MAX_UPDATE_SIZE)
        if isinstance(target, Buffer):
            target = (target, 0, len(payload))
        elif isinstance(target, Slot) and target.length is None:
            target = Slot(target.index, target.offset, len(payload))
        elif isinstance(target, tuple) and len(target) == 2:
            target = (*target, len(payload))
        ref = self._ref(target, "update target", BufferUsage.TRANSFER)
        if ref.length != len(payload):
            raise InvalidArgumentError(
                f"update data is {len(payload)} bytes but the target range is {ref.length} bytes")
        if payload:
            self._update(payload, ref)

    def copy_buffer(self, source: object, target: object) -> None:
        """Copy between two ranges of equal length (which must not overlap; zero-length: no-op)."""
        self._check_recording("copy_buffer")
        src = self._ref(source, "copy source", BufferUsage.TRANSFER)
        dst = self._ref(target, "copy target", BufferUsage.TRANSFER)
        if src.length is None and dst.length is not None:
            src.length = dst.length
        elif dst.length is None and src.length is not None:
            dst.length = src.length
        if src.length is None:  # both lengths come from the binding table: checked at submission
            self._slot_copies.append((src, dst))
        elif src.length != dst.length:
            raise InvalidArgumentError(
                f"copy source length {src.length} differs from target length {dst.length}")
        else:
            check_no_overlap(src, dst)
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
        if self.state is not _RECORDING or self.device.closed:
            self._check_recording("dispatch")
        device = self.device
        last_executable, last_entry, ordinal, export = self._last_export
        if executable is not last_executable or entry_point is not last_entry:
            ordinal, export = self._resolve_export(executable, entry_point)
        if workgroups is self._checked_workgroups:  # the same tuple as the last dispatch (a loop's constant)
            grid = workgroups
        else:
            grid = check_workgroups(workgroups, device.limits["max_workgroup_count"])
            if grid is workgroups:  # immutable and valid as given: remembered by identity
                self._checked_workgroups = grid
        values = check_constants(export, constants)
        if type(bindings) is not list and type(bindings) is not tuple:
            bindings = check_sequence(bindings, "dispatch bindings", "buffers")
        if len(bindings) != export.bindings:
            raise InvalidArgumentError(
                f"export {export.name!r} takes {export.bindings} bindings, got {len(bindings)}")
        refs = []
        whole_refs = self._whole_refs
        if self._whole_refs_at != device.release_epoch:  # a release since: look at every buffer again
            whole_refs.clear()
            self._whole_refs_at = device.release_epoch
        for b in bindings:
            # A whole buffer's ref is made once (device and usage never change, liveness as above).
            ref = whole_refs.get(b) if type(b) is Buffer else None
            if ref is None:
                ref = self._binding_ref(b, len(refs), export)
            refs.append(ref)
        routines = executable.routines
        if routines is not None:  # a library routine: its constants and ranges are checked here too
            routine = routines[ordinal]
            checked = routine.check(values, refs)
            if any(ref.buffer is None for ref in refs):
                self._slot_routines.append((routine, checked, refs))
            if 0 not in grid:
                self._dispatch_routine(executable, ordinal, export, routine, checked, values, refs)
            return
        if 0 in grid:
            return
        self._dispatch(executable, ordinal, export, grid, values, refs)

    def _resolve_export(self, executable: object, entry_point: object) -> tuple[int, Export]:
        if not isinstance(executable, Executable):
            raise InvalidArgumentError(f"dispatch needs a hal.Executable, got {type(executable).__name__}")
        if executable.device is not self.device:
            raise InvalidArgumentError("dispatch executable belongs to another device")
        exports = executable.exports
        if type(entry_point) is int and 0 <= entry_point < len(exports):
            ordinal, export = entry_point, exports[entry_point]
        else:
            ordinal, export = executable.export(entry_point)
        self._last_export = (executable, entry_point, ordinal, export)
        return ordinal, export

    def _binding_ref(self, binding: object, index: int, export: Export) -> BufferRef:
        ref = self._ref(binding, f"dispatch binding {index} of {export.name!r}", BufferUsage.DISPATCH_STORAGE)
        if type(binding) is Buffer:
            self._whole_refs[binding] = ref
        return ref

    # -- collectives (hal.channel) ----------------------------------------------------
    def collective(self, channel: Channel, kind: str, send: object = None, recv: object = None, count: int = 0, *,
                   dtype: object = "float32", reduction: str | None = None, root: int | None = None,
                   peer: int | None = None) -> None:
        """Record collective operation ``kind`` of ``channel`` over ``count`` elements of ``dtype``
        (``hal.channel`` tabulates each kind's operands, roots, peers and in-place rules); ``send``
        and ``recv`` are buffer refs like other commands' (a Buffer, (Buffer, offset[, length]) or a
        ``hal.Slot``), None where the kind takes none on this rank."""
        self._check_recording("collective")
        if not isinstance(channel, Channel):
            raise InvalidArgumentError(f"collective channel must be a hal.Channel, got {type(channel).__name__}")
        if channel.device is not self.device:
            raise InvalidArgumentError("collective channel belongs to another device")
        channel.check_usable(f"collective {kind!r}")
        op = check_collective(channel, kind, count, dtype, reduction, root, peer)
        rank, ranks = channel.rank, channel.count
        send_ref = self._collective_operand(op, "send", send, op.needs_send(rank), rank)
        recv_ref = self._collective_operand(op, "recv", recv, op.needs_recv(rank), rank)
        if (send_ref is not None and send_ref.buffer is None) or (recv_ref is not None and recv_ref.buffer is None):
            self._slot_collectives.append((op, rank, ranks, send_ref, recv_ref))
            if send_ref is not None and send_ref.buffer is not None:  # the direct one is checked now
                check_operands(op, rank, ranks, _absolute(send_ref), None)
            if recv_ref is not None and recv_ref.buffer is not None:
                check_operands(op, rank, ranks, None, _absolute(recv_ref))
        else:
            check_operands(op, rank, ranks, _absolute(send_ref), _absolute(recv_ref))
        self._collective(channel, op, send_ref, recv_ref)

    def _collective_operand(self, op: Collective, name: str, ref: object, needed: bool, rank: int) -> BufferRef | None:
        if ref is None:
            if needed:
                raise InvalidArgumentError(f"{op.kind} needs a {name} operand on rank {rank}")
            return None
        if (op.kind, name) in (("send", "recv"), ("recv", "send")):
            raise InvalidArgumentError(f"{op.kind} takes no {name} operand; got {ref!r}")
        return self._ref(ref, f"{op.kind} {name}", BufferUsage.DISPATCH_STORAGE)

    def all_reduce(self, channel: Channel, send: object, recv: object, count: int, dtype: object = "float32",
                   reduction: str = "sum") -> None:
        """recv = send reduced over every rank (``count`` elements; in place when send is recv)."""
        self.collective(channel, "all_reduce", send, recv, count, dtype=dtype, reduction=reduction)

    def all_gather(self, channel: Channel, send: object, recv: object, count: int, dtype: object = "float32") -> None:
        """recv = every rank's ``count`` elements of send, in rank order."""
        self.collective(channel, "all_gather", send, recv, count, dtype=dtype)

    def reduce_scatter(self, channel: Channel, send: object, recv: object, count: int, dtype: object = "float32",
                       reduction: str = "sum") -> None:
        """recv = chunk ``rank`` (``count`` elements) of send reduced over every rank."""
        self.collective(channel, "reduce_scatter", send, recv, count, dtype=dtype, reduction=reduction)

    def all_to_all(self, channel: Channel, send: object, recv: object, count: int, dtype: object = "float32") -> None:
        """Chunk i of send goes to rank i; chunk i of recv comes from rank i (``count`` elements each)."""
        self.collective(channel, "all_to_all", send, recv, count, dtype=dtype)

    def broadcast(self, channel: Channel, send: object, recv: object, count: int, dtype: object = "float32",
                  root: int = 0) -> None:
        """recv = the root's send (``send`` may be None on the other ranks)."""
        self.collective(channel, "broadcast", send, recv, count, dtype=dtype, root=root)

    def reduce(self, channel: Channel, send: object, recv: object, count: int, dtype: object = "float32",
               reduction: str = "sum", root: int = 0) -> None:
        """The root's recv = send reduced over every rank (``recv`` may be None on the other ranks)."""
        self.collective(channel, "reduce", send, recv, count, dtype=dtype, reduction=reduction, root=root)

    def send(self, channel: Channel, source: object, count: int, peer: int, dtype: object = "float32") -> None:
        """Send ``count`` elements to rank ``peer``, which records the matching ``recv``."""
        self.collective(channel, "send", source, None, count, dtype=dtype, peer=peer)

    def recv(self, channel: Channel, target: object, count: int, peer: int, dtype: object = "float32") -> None:
        """Receive ``count`` elements from rank ``peer``, which records the matching ``send``."""
        self.collective(channel, "recv", None, target, count, dtype=dtype, peer=peer)

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

    def _collective(self, channel: Channel, op: Collective, send: BufferRef | None, recv: BufferRef | None) -> None:
        """Record a checked collective (``hal.channel``); operands None where the kind takes none here."""
        raise NotImplementedError

    def _dispatch_routine(self, executable: Executable, ordinal: int, export: Export, routine: Routine,
                          checked: object, constants: tuple[int, ...], bindings: list[BufferRef]) -> None:
        """Record a library routine (``checked``: what ``routine.check`` returned). By default the
        executable's ``functions`` run it as a kernel of one workgroup (the CPU drivers' references)."""
        self._dispatch(executable, ordinal, export, (1, 1, 1), constants, bindings)

    def __repr__(self) -> str:
        return f"<hal.CommandBuffer {self.mode} {self.state.value} capacity={self.binding_capacity}>"


# -- checks of commands' buffer operands (recording and submission call these) ------------------------
def check_buffer_ref(cb: CommandBuffer, ref: object, what: str, usage: BufferUsage,
                     alignment: int = 1) -> BufferRef:
    """A command's buffer operand: a Buffer, (Buffer, offset[, length]) or hal.Slot."""
    if isinstance(ref, Slot):
        return _slot_ref(cb, ref, what, usage, alignment)
    buffer, offset, length = split_buffer_range(ref, what)
    check_buffer(buffer, cb.device, what)
    if usage not in buffer.usage:
        raise FailedPreconditionError(f"{what} usage {buffer.usage} lacks {usage}")
    offset, length = check_range(buffer, offset, length, what)
    if alignment > 1 and ((buffer.offset + offset) % alignment or length % alignment):
        raise InvalidArgumentError(
            f"{what} offset {offset} and length {length} must be multiples of the "
            f"{alignment}-byte pattern length")
    return BufferRef(buffer, None, offset, length)


def _slot_ref(cb: CommandBuffer, slot: Slot, what: str, usage: BufferUsage, alignment: int) -> BufferRef:
    if cb.binding_capacity == 0:
        raise InvalidArgumentError(f"{what} uses {slot!r} but the command buffer has binding_capacity 0")
    index = check_int(slot.index, f"{what} slot index")
    if index >= cb.binding_capacity:
        raise InvalidArgumentError(
            f"{what} slot index {index} is not below the binding capacity {cb.binding_capacity}")
    offset = check_int(slot.offset, f"{what} slot offset")
    length = None if slot.length is None else check_int(slot.length, f"{what} slot length")
    if alignment > 1 and (offset % alignment or (length is not None and length % alignment)):
        raise InvalidArgumentError(
            f"{what} slot offset {offset} and length {length} must be multiples of the "
            f"{alignment}-byte pattern length")
    return BufferRef(None, index, offset, length)


def check_no_overlap(src: BufferRef, dst: BufferRef, what: str = "copy") -> None:
    """Direct copy ranges must not overlap within one allocation."""
    if src.buffer is None or dst.buffer is None or src.buffer.root is not dst.buffer.root:
        return
    a = src.buffer.offset + src.offset
    b = dst.buffer.offset + dst.offset
    if a < b + dst.length and b < a + src.length:  # type: ignore[operator]
        raise InvalidArgumentError(
            f"{what} source [{a}, {a + src.length}) and target [{b}, {b + dst.length}) "  # type: ignore[operator]
            "overlap in the same allocation")


def check_slot_uses(cb: CommandBuffer, table: Sequence[Binding], index: int = 0) -> None:
    """Every use of a slot in ``cb`` fits the entry ``table`` gives it: usage, range, alignment,
    and commands whose operands come from two entries (copies) agree on length and do not overlap."""
    for use in cb.slot_uses:
        ref = use.ref
        buffer, base, size = table[ref.slot]  # type: ignore[index]
        if use.usage not in buffer.usage:
            raise FailedPreconditionError(
                f"binding_tables[{index}] entry {ref.slot} (used as {use.what}) lacks usage {use.usage}")
        length = size - ref.offset if ref.length is None else ref.length
        if ref.offset + length > size or length < 0:
            raise OutOfRangeError(
                f"{use.what} [{ref.offset}, {ref.offset + length}) exceeds binding_tables[{index}] entry "
                f"{ref.slot} of {size} bytes")
        if use.alignment > 1 and ((buffer.offset + base + ref.offset) % use.alignment or length % use.alignment):
            raise InvalidArgumentError(
                f"{use.what} through binding_tables[{index}] entry {ref.slot} is not aligned to the "
                f"{use.alignment}-byte pattern length")
    for src, dst in cb.slot_copies:
        s_buffer, s_offset, s_length = src.resolve(table)
        d_buffer, d_offset, d_length = dst.resolve(table)
        if s_length != d_length:
            raise InvalidArgumentError(
                f"copy source length {s_length} differs from target length {d_length} "
                f"through binding_tables[{index}] (entries {src.slot}, {dst.slot})")
        check_no_overlap(BufferRef(s_buffer, None, s_offset, s_length), BufferRef(d_buffer, None, d_offset, d_length))
    for routine, checked, refs in cb.slot_routines:
        routine.check_lengths(checked, [ref.resolve(table)[2] for ref in refs])
    for op, rank, ranks, send, recv in cb.slot_collectives:
        resolved = [None if ref is None else ref.resolve(table) for ref in (send, recv)]
        check_operands(op, rank, ranks, *[None if r is None else (r[0].root, r[0].offset + r[1], r[2])
                                          for r in resolved], where=f" through binding_tables[{index}]")


def _absolute(ref: BufferRef | None) -> tuple[Buffer, int, int] | None:
    """(root buffer, offset in it, length) of a direct ref."""
    if ref is None:
        return None
    buffer = ref.buffer
    return buffer.root, buffer.offset + ref.offset, ref.length  # type: ignore[union-attr,return-value]

