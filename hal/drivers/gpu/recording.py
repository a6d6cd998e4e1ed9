"""What both GPU command buffer kinds record: commands with device addresses resolved once.

``RecordingCommandBuffer`` implements the core's command hooks by appending
commands to ``levels`` (a new level after each barrier): direct buffer ranges
become device addresses at record time, ``hal.Slot`` ranges stay symbolic
(``Target.slot``) until a binding table resolves them at submission. ``end()``
packs every dispatch's kernel arguments into one ``ArgArena`` and every
``update_buffer`` payload into one staging block. The stream command buffer
issues these commands on a stream; the graph command buffer turns them into
graph nodes.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hal import interrupts
from hal.channel import Channel, Collective
from hal.command_buffer import Binding, BufferRef, CommandBuffer
from hal.drivers.gpu import channel as collectives
from hal.drivers.gpu.kernel_args import ArgArena
from hal.drivers.gpu.library import LibraryCall
from hal.executable import Executable, Export
from hal.library import Routine

if TYPE_CHECKING:
    from hal.drivers.gpu.device import GpuDevice

#: update_buffer payloads are laid out at this alignment in the staging block.
STAGING_ALIGNMENT = 16


class Target:
    """A device byte range: fixed (``slot`` None) or relative to binding-table entry ``slot``."""

    __slots__ = ("ptr", "length", "slot", "offset")

    def __init__(self, ptr: int, length: int | None, slot: int | None = None, offset: int = 0) -> None:
        self.ptr = ptr
        self.length = length
        self.slot = slot
        self.offset = offset

    def resolve(self, table: Sequence[Binding] | None) -> tuple[int, int]:
        """(device address, length) against a binding table."""
        if self.slot is None:
            return self.ptr, self.length  # type: ignore[return-value]
        buffer, base, size = table[self.slot]  # type: ignore[index]
        length = size - self.offset if self.length is None else self.length
        return buffer.allocation.ptr + buffer.offset + base + self.offset, length


def slot_address(entry: Binding) -> tuple[int, int]:
    """(device address, size) of a binding-table entry."""
    buffer, base, size = entry
    return buffer.allocation.ptr + buffer.offset + base, size


#: A kernel launch with direct bindings only, the commonest command: the plain tuple (function, grid,
#: block, first ``ArgArena`` slot, slot count). A recorded dispatch made a ``Dispatch`` object before:
#: creating it took a quarter of the host time recording a dispatch costs (0.85 -> 0.65 us a dispatch
#: over the simulated GPU, record and submit 4.2 -> 4.0 us).
DirectDispatch = tuple  # (function, grid, block, arg_start, arg_count)


class Dispatch:
    """A kernel launch: its function, grid, block and packed arguments (``ArgArena`` slots), the
    fields of a dispatch through binding-table slots (``SlotDispatch``), which also carries what
    rebinding it needs. A direct dispatch is a ``DirectDispatch`` tuple of the same five fields.
    """

    __slots__ = ("function", "grid", "block", "arg_start", "arg_count")

    #: (arena index, slot, byte offset in the slot) of bindings that go through the table.
    slot_args: Sequence[tuple[int, int, int]] = ()

    def __init__(self, function: object, grid: tuple[int, int, int], block: tuple[int, int, int],
                 arg_start: int, arg_count: int) -> None:
        self.function = function
        self.grid = grid
        self.block = block
        self.arg_start = arg_start
        self.arg_count = arg_count


class SlotDispatch(Dispatch):
    """A dispatch with bindings through binding-table slots (what rebinding and indirect bindings use)."""

    __slots__ = ("slot_args", "executable", "ordinal", "bindings", "constants")  # type: ignore[assignment]

    def __init__(self, function: object, grid: tuple[int, int, int], block: tuple[int, int, int],
                 arg_start: int, arg_count: int, slot_args: list[tuple[int, int, int]], executable: Executable,
                 ordinal: int, bindings: list[Target], constants: tuple[int, ...]) -> None:
        super().__init__(function, grid, block, arg_start, arg_count)
        self.slot_args = slot_args
        self.executable = executable
        self.ordinal = ordinal
        #: Each binding as a Target (fixed address, or slot + offset).
        self.bindings = bindings
        self.constants = constants


class Fill:
    __slots__ = ("target", "value", "element_size")

    def __init__(self, target: Target, value: int, element_size: int) -> None:
        self.target = target
        self.value = value
        self.element_size = element_size


class Copy:
    __slots__ = ("source", "target")

    def __init__(self, source: Target, target: Target) -> None:
        self.source = source
        self.target = target


class Update:
    __slots__ = ("staging_offset", "target", "length")

    def __init__(self, staging_offset: int, target: Target, length: int) -> None:
        self.staging_offset = staging_offset
        self.target = target
        self.length = length


Command = DirectDispatch | SlotDispatch | Fill | Copy | Update | LibraryCall


def _release_workspaces(device: GpuDevice, calls: list[LibraryCall]) -> None:
    for call in calls:
        call.workspace.release(device)


class RecordingCommandBuffer(CommandBuffer):
    """Records commands into barrier-separated levels; subclasses issue or lower them."""

    device: GpuDevice

    def __init__(self, device: GpuDevice, mode, binding_capacity: int) -> None:
        super().__init__(device, mode, binding_capacity)
        self.levels: list[list[Command]] = [[]]
        #: The level commands are appended to (the last of ``levels``).
        self._level: list[Command] = self.levels[0]
        self.args = ArgArena()
        self._payloads: list[bytes] = []
        self._staging_size = 0
        self.uses_slots = False
        self.slot_dispatches: list[SlotDispatch] = []
        #: Serializes submissions of this buffer issued on different queues (argument patching,
        #: rebinding); see ``serialized``.
        self.issue_lock = threading.Lock()
        #: One-shot: its resources go when its one submission retires (read at each retirement).
        self.one_shot = not self.reusable
        #: The library routines recorded (their workspaces are freed with the command buffer).
        self.library_calls: list[LibraryCall] = []
        self._release_library: Any = None
        #: The executables its dispatches run, by id: held so that their modules stay loaded for as
        #: long as the command buffer may run (an executable's modules unload when it is collected).
        self.executables: dict[int, Executable] = {}
        self._last_executable: Executable | None = None
        #: The channels its collectives run on (their failures fail its submissions: see hal/drivers/gpu/channel.py).
        self.channels: list[Channel] = []
        #: Its collectives in record order, each with its channel (compared with the peers' at each
        #: issue where the channel ``checks_matching``).
        self.collectives: list[tuple[Channel, Collective]] = []

    # -- references ----------------------------------------------------------------
    def _target(self, ref: BufferRef) -> Target:
        buffer = ref.buffer
        if buffer is None:
            self.uses_slots = True
            return Target(0, ref.length, ref.slot, ref.offset)
        return Target(buffer.allocation.ptr + buffer.offset + ref.offset, ref.length)

    # -- core hooks ------------------------------------------------------------------
    def _fill(self, target: BufferRef, pattern: int, pattern_length: int) -> None:
        self._level.append(Fill(self._target(target), pattern, pattern_length))

    def _update(self, data: bytes, target: BufferRef) -> None:
        offset = self._staging_size
        self._payloads.append(data)
        padded = -(-len(data) // STAGING_ALIGNMENT) * STAGING_ALIGNMENT
        self._staging_size += padded
        self._level.append(Update(offset, self._target(target), len(data)))

    def _copy(self, source: BufferRef, target: BufferRef) -> None:
        self._level.append(Copy(self._target(source), self._target(target)))

    def _barrier(self) -> None:
        if self._level:
            self._level = []
            self.levels.append(self._level)

    def _dispatch(self, executable: Executable, ordinal: int, export: Export,
                  workgroups: tuple[int, int, int], constants: tuple[int, ...],
                  bindings: list[BufferRef]) -> None:
        if executable is not self._last_executable:
            self._last_executable = self.executables[id(executable)] = executable
        pending = self.args.pending
        start = len(pending)  # this dispatch's first argument slot
        for ref in bindings:  # the usual case first: direct bindings only, no Targets needed
            buffer = ref.buffer
            if buffer is None:
                del pending[start:]
                break
            pending.append(buffer.allocation.ptr + buffer.offset + ref.offset)
        else:
            pending.extend(constants)
            self._level.append((executable.functions[ordinal], workgroups,  # type: ignore[attr-defined]
                                export.workgroup_size, start, len(bindings) + len(constants)))
            return
        slot_args = []
        targets = []
        for i, ref in enumerate(bindings):
            buffer = ref.buffer
            if buffer is None:
                self.uses_slots = True
                slot_args.append((start + i, ref.slot, ref.offset))
                target = Target(0, ref.length, ref.slot, ref.offset)
            else:
                target = Target(buffer.allocation.ptr + buffer.offset + ref.offset, ref.length)
            targets.append(target)
            pending.append(target.ptr)
        pending.extend(constants)
        dispatch = SlotDispatch(executable.functions[ordinal], workgroups,  # type: ignore[attr-defined]
                                export.workgroup_size, start, len(targets) + len(constants), slot_args,
                                executable, ordinal, targets, constants)
        self._level.append(dispatch)
        self.slot_dispatches.append(dispatch)

    def _collective(self, channel: Channel, op: Collective, send: BufferRef | None, recv: BufferRef | None) -> None:
        if not any(channel is c for c in self.channels):
            self.channels.append(channel)
            channel.recorders.add(self)  # type: ignore[attr-defined]
        send_target = None if send is None else self._target(send)
        recv_target = None if recv is None else self._target(recv)
        windows = collectives.window_offsets(channel, op, send_target, recv_target)  # type: ignore[arg-type]
        if windows is not None:  # (compared with the peers' like the rest of the operation)
            op = dataclasses.replace(op, windows=windows)
        self.collectives.append((channel, op))
        collectives.record(self._level, channel, op, send_target, recv_target)  # type: ignore[arg-type]

    def _dispatch_routine(self, executable: Executable, ordinal: int, export: Export, routine: Routine,
                          checked: object, constants: tuple[int, ...], bindings: list[BufferRef]) -> None:
        self.executables[id(executable)] = executable
        targets = [self._target(ref) for ref in bindings]
        call = LibraryCall(executable.backend, routine, checked, constants, targets,  # type: ignore[attr-defined]
                           empty=routine.is_empty(checked))
        if not self.library_calls:
            self._release_library = interrupts.finalize(self, self.device.release_later, _release_workspaces,
                                                     self.device, self.library_calls)
        self.library_calls.append(call)
        self._level.append(call)

    def _end(self) -> None:
        if not self.levels[-1] and len(self.levels) > 1:
            self.levels.pop()
        self.args.pack()
        self._pack_staging()
        self._recorded()

    def _recorded(self) -> None:
        """Subclasses make what their submissions issue, once the commands are all recorded."""

    def _pack_staging(self) -> None:
        """Subclasses place ``staging_payload()`` where their commands read it."""

    def staging_payload(self) -> bytes:
        """Every update_buffer payload at its staging offset."""
        block = bytearray(self._staging_size)
        offset = 0
        for data in self._payloads:
            block[offset:offset + len(data)] = data
            offset += -(-len(data) // STAGING_ALIGNMENT) * STAGING_ALIGNMENT
        self._payloads = []
        return bytes(block)

    @property
    def staging_size(self) -> int:
        return self._staging_size

    def commands(self) -> list[Command]:
        return [command for level in self.levels for command in level]

    def patch_slot_args(self, table: Sequence[Binding] | None) -> None:
        """Write the table's addresses into the argument slots of every slot binding."""
        for command in self.slot_dispatches:
            self.patch_dispatch(command, table)

    def patch_dispatch(self, command: SlotDispatch, table: Sequence[Binding] | None) -> None:
        values = self.args.values
        for index, slot, offset in command.slot_args:
            buffer, base, _ = table[slot]  # type: ignore[index]
            values[index] = buffer.allocation.ptr + buffer.offset + base + offset  # type: ignore[index]

    # -- submission (subclasses) ---------------------------------------------------------
    def issuer(self, queue, table: Sequence[Binding] | None) -> Callable[[], None] | None:
        """What issues this command buffer's commands on ``queue`` with ``table``, resolved once when
        an execution is prepared and called at each of its submissions with the queue's lock held
        (None: nothing to issue). What the commands hold until the submission retires goes on
        ``queue.issuing`` (``Submission.hold``)."""
        raise NotImplementedError

    def release_captures(self) -> None:
        """Destroy what captured its collectives (a graph command buffer's graphs): their channel
        broke, so it never runs again (called with every queue's lock held)."""

    def serialized(self, issue: Callable[[], None]) -> Callable[[], None]:
        """``issue``, an issuer that changes the buffer's state (patched arguments, a rebound graph),
        as it must run: as is on a device of one queue (every issue already holds that queue's
        lock), else under ``issue_lock`` (submissions on two queues must not interleave)."""
        if self.device.queue_count == 1:
            return issue
        return functools.partial(self._locked, issue)

    def _locked(self, issue: Callable[[], None]) -> None:
        with self.issue_lock:
            issue()

    def retired(self) -> None:
        """The one submission of this one-shot command buffer completed: release its resources."""
        if self._release_library is not None:
            self._release_library()
