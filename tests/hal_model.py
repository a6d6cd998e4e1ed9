"""A pure numpy model of the HAL, and the small program language it runs.

A `Program` allocates a few buffers with known contents, records command
buffers (fills, updates, copies, barriers and dispatches of the CTS kernels,
referring to buffers directly or through binding-table slots) and submits
them in a chain of submissions ordered by semaphores. The model runs it on
bytearrays, one command after another: the programs generated for the
differential tests only contain work whose result does not depend on how a
driver overlaps commands between barriers, so a correct driver ends with
exactly the model's bytes in every buffer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from cts.kernels import KERNELS


@dataclass(frozen=True)
class BufferRange:
    """Bytes [offset, offset + length) of program buffer `buffer`.

    `form` says how the driver run spells it: "tuple" (buf, offset, length),
    "open" (buf, offset, None) (only when the range runs to the end), "bare"
    (the Buffer itself; only for the whole buffer) or "subspan"
    ((buf.subspan(view_offset), offset - view_offset, length)).
    """

    buffer: int
    offset: int
    length: int
    form: str = "tuple"
    view_offset: int = 0


@dataclass(frozen=True)
class SlotRange:
    """Bytes [offset, offset + length) of binding-table entry `slot`.

    `open`: the range runs to the end of the entry (hal.Slot(slot, offset, None));
    `length` is then only the least length any table of the program gives it.
    """

    slot: int
    offset: int
    length: int
    open: bool = False


Ref = BufferRange | SlotRange


@dataclass(frozen=True)
class Fill:
    target: Ref
    pattern: int
    pattern_length: int


@dataclass(frozen=True)
class Update:
    data: bytes
    target: Ref


@dataclass(frozen=True)
class Copy:
    source: Ref
    target: Ref


@dataclass(frozen=True)
class Dispatch:
    kernel: str
    workgroups: tuple[int, int, int]
    constants: tuple[int, ...]
    bindings: tuple[Ref, ...]


@dataclass(frozen=True)
class Barrier:
    pass


Command = Fill | Update | Copy | Dispatch | Barrier


@dataclass(frozen=True)
class TableEntry:
    """A binding-table entry: bytes [offset, offset + length) of program buffer `buffer`."""

    buffer: int
    offset: int
    length: int


@dataclass
class CommandBufferProgram:
    commands: list[Command]
    reusable: bool = False
    binding_capacity: int = 0


@dataclass
class Submission:
    """Command buffers (indices into Program.command_buffers) with one table each (None: no slots).

    No command buffers: a queue_barrier. `signal_aux` / `wait_aux` add a second
    semaphore to the fences, so submissions also wait on several fences.
    """

    command_buffers: list[int]
    binding_tables: list[list[TableEntry] | None]
    signal_aux: bool = False
    wait_aux: bool = False


@dataclass
class Program:
    buffer_sizes: list[int]
    contents_seed: int
    command_buffers: list[CommandBufferProgram]
    submissions: list[Submission]  # in execution order: submission k waits for submission k - 1
    submit_order: list[int] = field(default_factory=list)  # the order queue_execute is called in
    deferred: bool = False  # the first submission waits for a host signal made after every submit

    def initial_contents(self) -> list[bytes]:
        rng = np.random.default_rng(self.contents_seed)
        return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in self.buffer_sizes]


class HalModel:
    """Executes programs on bytearrays."""

    def __init__(self, contents: list[bytes]) -> None:
        self.buffers = [bytearray(c) for c in contents]

    # -- references -------------------------------------------------------------
    def resolve(self, ref: Ref, table: list[TableEntry] | None) -> tuple[int, int, int]:
        """(buffer index, absolute offset, length) of a reference."""
        if isinstance(ref, BufferRange):
            return ref.buffer, ref.offset, ref.length
        assert table is not None, "a slot needs a binding table"
        entry = table[ref.slot]
        length = entry.length - ref.offset if ref.open else ref.length
        assert ref.offset + length <= entry.length
        return entry.buffer, entry.offset + ref.offset, length

    def view(self, ref: Ref, table: list[TableEntry] | None) -> memoryview:
        index, offset, length = self.resolve(ref, table)
        assert offset + length <= len(self.buffers[index])
        return memoryview(self.buffers[index])[offset : offset + length]

    # -- commands -------------------------------------------------------------------
    def execute_command(self, command: Command, table: list[TableEntry] | None) -> None:
        if isinstance(command, Fill):
            target = self.view(command.target, table)
            unit = command.pattern.to_bytes(command.pattern_length, "little")
            target[:] = unit * (len(target) // command.pattern_length)
        elif isinstance(command, Update):
            self.view(command.target, table)[:] = command.data
        elif isinstance(command, Copy):
            source = bytes(self.view(command.source, table))
            self.view(command.target, table)[:] = source
        elif isinstance(command, Dispatch):
            views = [self.view(ref, table) for ref in command.bindings]
            KERNELS[command.kernel].numpy_fn(command.workgroups, views, list(command.constants))
        elif isinstance(command, Barrier):
            pass  # commands already run one after another
        else:
            raise TypeError(f"unknown command {command!r}")

    def execute(self, program: CommandBufferProgram, table: list[TableEntry] | None) -> None:
        for command in program.commands:
            self.execute_command(command, table)

    def run(self, program: Program) -> list[bytes]:
        """Every submission in semaphore order; returns the final buffer contents."""
        for submission in program.submissions:
            for index, table in zip(submission.command_buffers, submission.binding_tables):
                self.execute(program.command_buffers[index], table)
        return [bytes(b) for b in self.buffers]


def run_model(program: Program) -> list[bytes]:
    return HalModel(program.initial_contents()).run(program)
