"""Differential tests: random HAL programs run on a driver and on the numpy model must agree byte for byte.

Programs (see hal_model.py) allocate a few buffers, record command buffers
of fills, updates, copies, barriers and CTS kernel dispatches (direct
references, subspans, binding-table slots), and submit them as a chain of
submissions ordered by semaphores: sometimes submitted out of order,
sometimes all deferred behind a host signal, reusable command buffers
resubmitted with new binding tables. The generator inserts a barrier
wherever a command touches a buffer that an earlier command since the last
barrier touched (and at least one of them writes it), so the result never
depends on how a driver overlaps commands, and any correct driver must end
with exactly the model's bytes.

Uses the driver selection of tests/conftest.py (--driver, HAL_CTS_DRIVERS).
"""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
from cts.kernels import KERNELS, WORKGROUP_SIZE, load_kernels
from hal_model import (
    Barrier,
    BufferRange,
    Command,
    CommandBufferProgram,
    Copy,
    Dispatch,
    Fill,
    Program,
    Ref,
    SlotRange,
    Submission,
    TableEntry,
    Update,
    run_model,
)
from hypothesis import HealthCheck, given, settings

import hal

# More examples for a longer hunt: HAL_DIFFERENTIAL_EXAMPLES=5000.
EXAMPLES = int(os.environ.get("HAL_DIFFERENTIAL_EXAMPLES", "500"))
WAIT_TIMEOUT = 30.0

# Which bindings each kernel reads and writes (by binding position).
KERNEL_ACCESS = {
    "cts_iota": ((), (0,)),
    "cts_add_one": ((0,), (0,)),
    "cts_copy_offset": ((0,), (1,)),
    "cts_mix3": ((0, 1, 2), (2,)),
    "cts_fill_constant": ((), (0,)),
    "cts_workgroup_id": ((), (0,)),
}


class ProgramGenerator:
    """Draws one random program; keeps the per-barrier-segment hazard bookkeeping."""

    def __init__(self, draw, sizes: list[int], slot_span: int) -> None:
        self.draw = draw
        self.sizes = sizes
        self.slot_span = slot_span  # every slot range lies within the first slot_span bytes of its entry
        self.all_buffers = frozenset(range(len(sizes)))

    # -- references ------------------------------------------------------------
    def direct_range(
        self, align: int, *, buffers=None, length: int | None = None, max_length: int | None = None, bare_if=None
    ) -> BufferRange:
        draw = self.draw
        candidates = sorted(buffers if buffers is not None else self.all_buffers)
        if length is not None:
            candidates = [b for b in candidates if self.sizes[b] >= length]
        buffer = draw(st.sampled_from(candidates))
        size = self.sizes[buffer]
        if length is None:
            # Whole buffers and ranges running to the end get their own share of cases.
            shape = draw(st.sampled_from(["any", "any", "whole", "tail"]))
            offset = 0 if shape == "whole" else align * draw(st.integers(0, size // align - 1))
            longest = size - offset if max_length is None else min(size - offset, max_length)
            if shape == "any" or longest < size - offset:
                length = align * draw(st.integers(1, longest // align))
            else:
                length = longest
        else:
            offset = align * draw(st.integers(0, (size - length) // align))
        forms = ["tuple", "subspan"]
        if offset + length == size:
            forms.append("open")
        if (bare_if or (lambda o, n, s: o == 0 and n == s))(offset, length, size):
            forms.append("bare")
        form = draw(st.sampled_from(forms))
        view_offset = draw(st.integers(0, offset)) if form == "subspan" else 0
        return BufferRange(buffer, offset, length, form, view_offset)

    def slot_range(
        self, capacity: int, align: int, *, slots=None, length: int | None = None, may_be_open: bool = False
    ) -> SlotRange:
        draw = self.draw
        slot = draw(st.sampled_from(sorted(slots if slots is not None else range(capacity))))
        span = self.slot_span
        if length is None:
            offset = align * draw(st.integers(0, span // align - 1))
            length = align * draw(st.integers(1, (span - offset) // align))
        else:
            offset = align * draw(st.integers(0, (span - length) // align))
        is_open = may_be_open and offset + length == span and draw(st.booleans())
        return SlotRange(slot, offset, length, is_open)

    # -- commands ------------------------------------------------------------------
    def fill(self, capacity: int):
        draw = self.draw
        pattern_length = draw(st.sampled_from([1, 2, 4]))
        pattern = draw(st.integers(0, (1 << (8 * pattern_length)) - 1))
        if capacity and draw(st.booleans()):
            target: Ref = self.slot_range(capacity, pattern_length, may_be_open=True)
            return Fill(target, pattern, pattern_length), set(), set(self.all_buffers)
        target = self.direct_range(pattern_length)
        return Fill(target, pattern, pattern_length), set(), {target.buffer}

    def update(self, capacity: int):
        draw = self.draw
        if capacity and draw(st.booleans()):
            target: Ref = self.slot_range(capacity, 1)
            writes = set(self.all_buffers)
        else:
            target = self.direct_range(1, bare_if=lambda offset, length, size: offset == 0)
            writes = {target.buffer}
        data = draw(st.binary(min_size=target.length, max_size=target.length))
        return Update(data, target), set(), writes

    def copy(self, capacity: int):
        draw = self.draw
        if capacity >= 2 and draw(st.booleans()):
            source = self.slot_range(capacity, 1)
            target = self.slot_range(capacity, 1, slots=set(range(capacity)) - {source.slot}, length=source.length)
            return Copy(source, target), set(self.all_buffers), set(self.all_buffers)
        source_buffer = draw(st.sampled_from(sorted(self.all_buffers)))
        others = self.all_buffers - {source_buffer}
        source = self.direct_range(1, buffers={source_buffer}, max_length=max(self.sizes[b] for b in others))
        target = self.direct_range(1, buffers=others, length=source.length)
        return Copy(source, target), {source.buffer}, {target.buffer}

    def dispatch(self, capacity: int):
        draw = self.draw
        use_slots = capacity > 0 and draw(st.booleans())
        room = capacity if use_slots else len(self.sizes)
        kernel = draw(st.sampled_from([k for k in KERNEL_ACCESS if KERNELS[k].bindings <= room]))
        count = KERNELS[kernel].bindings
        refs: list[Ref] = []
        if use_slots:
            for _ in range(count):
                used = {r.slot for r in refs}  # type: ignore[union-attr]
                refs.append(self.slot_range(capacity, 4, slots=set(range(capacity)) - used, may_be_open=True))
        else:
            for _ in range(count):
                used = {r.buffer for r in refs}  # type: ignore[union-attr]
                refs.append(self.direct_range(4, buffers=self.all_buffers - used))
        words = [r.length // 4 for r in refs]
        if kernel == "cts_copy_offset":
            src_offset = draw(st.integers(0, words[0]))
            dst_offset = draw(st.integers(0, words[1]))
            longest = min(words[0] - src_offset, words[1] - dst_offset)
            n = draw(st.integers(0, longest) | st.just(longest))
            constants: tuple[int, ...] = (n, src_offset, dst_offset)
        else:
            n = draw(st.integers(0, min(words)) | st.just(min(words)))
            constants = (n,)
            if kernel == "cts_fill_constant":
                constants = (n, draw(st.integers(0, (1 << 32) - 1)))
        enough = -(-n // WORKGROUP_SIZE)
        x = draw(st.integers(0, enough + 1) | st.just(enough))
        y = draw(st.sampled_from([1, 1, 1, 2, 0]))
        z = draw(st.sampled_from([1, 1, 1, 2, 3]))
        reads_at, writes_at = KERNEL_ACCESS[kernel]
        if use_slots:
            reads, writes = set(self.all_buffers), set(self.all_buffers)
        else:
            reads = {refs[i].buffer for i in reads_at}  # type: ignore[union-attr]
            writes = {refs[i].buffer for i in writes_at}  # type: ignore[union-attr]
        return Dispatch(kernel, (x, y, z), constants, tuple(refs)), reads, writes

    def command_buffer(self) -> CommandBufferProgram:
        draw = self.draw
        reusable = draw(st.booleans())
        capacity = draw(st.integers(0, min(3, len(self.sizes))))
        commands: list[Command] = []
        seg_reads: set[int] = set()
        seg_writes: set[int] = set()
        for _ in range(draw(st.integers(0, 6))):
            kind = draw(st.sampled_from(["fill", "update", "copy", "dispatch", "dispatch", "barrier"]))
            if kind == "barrier":
                commands.append(Barrier())
                seg_reads, seg_writes = set(), set()
                continue
            command, reads, writes = getattr(self, kind)(capacity)
            if writes & (seg_reads | seg_writes) or reads & seg_writes:
                commands.append(Barrier())  # a hazard: this command must see the earlier ones complete
                seg_reads, seg_writes = set(), set()
            commands.append(command)
            seg_reads |= reads
            seg_writes |= writes
        return CommandBufferProgram(commands, reusable, capacity)

    # -- submissions -------------------------------------------------------------------
    def binding_table(self, capacity: int) -> list[TableEntry]:
        draw = self.draw
        order = draw(st.permutations(sorted(self.all_buffers)))
        table = []
        for buffer in order[:capacity]:
            size = self.sizes[buffer]
            offset = 4 * draw(st.integers(0, (size - self.slot_span) // 4))
            length = 4 * draw(st.integers(self.slot_span // 4, (size - offset) // 4))
            table.append(TableEntry(buffer, offset, length))
        return table

    def submissions(self, command_buffers: list[CommandBufferProgram]) -> list[Submission]:
        draw = self.draw
        submitted_one_shots: set[int] = set()
        result = []
        for _ in range(draw(st.integers(1, 5))):
            chosen: list[int] = []
            if draw(st.integers(0, 5)):  # else: a queue_barrier
                for _ in range(draw(st.integers(1, 3))):
                    candidates = [
                        i
                        for i, cb in enumerate(command_buffers)
                        if cb.reusable or i not in submitted_one_shots | set(chosen)
                    ]
                    if not candidates:
                        break
                    chosen.append(draw(st.sampled_from(candidates)))
                submitted_one_shots |= {i for i in chosen if not command_buffers[i].reusable}
            tables = [
                self.binding_table(command_buffers[i].binding_capacity) if command_buffers[i].binding_capacity else None
                for i in chosen
            ]
            result.append(Submission(chosen, tables, draw(st.booleans()), draw(st.booleans())))
        return result


@st.composite
def programs(draw) -> Program:
    sizes = [4 * draw(st.integers(16, 64)) for _ in range(draw(st.sampled_from([2, 3, 3, 4])))]
    slot_span = 4 * draw(st.integers(4, 16))  # <= the smallest buffer (64 bytes)
    generator = ProgramGenerator(draw, sizes, slot_span)
    command_buffers = [generator.command_buffer() for _ in range(draw(st.integers(1, 3)))]
    submissions = generator.submissions(command_buffers)
    order = list(range(len(submissions)))
    if draw(st.booleans()):
        order = list(draw(st.permutations(order)))
    return Program(sizes, draw(st.integers(0, 2**32 - 1)), command_buffers, submissions, order, draw(st.booleans()))


# -- running a program on a device ------------------------------------------------------------


def api_ref(ref: Ref, buffers: list[hal.Buffer]) -> object:
    if isinstance(ref, SlotRange):
        return hal.Slot(ref.slot, ref.offset, None if ref.open else ref.length)
    buf = buffers[ref.buffer]
    if ref.form == "bare":
        return buf
    if ref.form == "open":
        return (buf, ref.offset, None)
    if ref.form == "subspan":
        return (buf.subspan(ref.view_offset), ref.offset - ref.view_offset, ref.length)
    return (buf, ref.offset, ref.length)


def record(
    device: hal.Device, exe: hal.Executable, program: CommandBufferProgram, buffers: list[hal.Buffer]
) -> hal.CommandBuffer:
    mode = hal.CommandBufferMode.REUSABLE if program.reusable else hal.CommandBufferMode.ONE_SHOT
    cb = device.create_command_buffer(mode=mode, binding_capacity=program.binding_capacity)
    with cb.record():
        for command in program.commands:
            if isinstance(command, Fill):
                cb.fill_buffer(api_ref(command.target, buffers), command.pattern, command.pattern_length)
            elif isinstance(command, Update):
                cb.update_buffer(command.data, api_ref(command.target, buffers))
            elif isinstance(command, Copy):
                cb.copy_buffer(api_ref(command.source, buffers), api_ref(command.target, buffers))
            elif isinstance(command, Dispatch):
                cb.dispatch(
                    exe,
                    command.kernel,
                    workgroups=command.workgroups,
                    constants=list(command.constants),
                    bindings=[api_ref(ref, buffers) for ref in command.bindings],
                )
            else:
                cb.execution_barrier()
    return cb


def api_table(table: list[TableEntry] | None, buffers: list[hal.Buffer]) -> list[object] | None:
    if table is None:
        return None
    entries: list[object] = []
    for entry in table:
        buf = buffers[entry.buffer]
        whole = entry.offset == 0 and entry.length == buf.size
        entries.append(buf if whole else (buf, entry.offset, entry.length))
    return entries


def run_on_device(device: hal.Device, exe: hal.Executable, program: Program) -> list[bytes]:
    buffers = []
    for data in program.initial_contents():
        buf = device.allocator.allocate(len(data))
        device.write(buf, data)
        buffers.append(buf)
    try:
        command_buffers = [record(device, exe, cb, buffers) for cb in program.command_buffers]
        chain, aux = device.create_semaphore(0), device.create_semaphore(0)
        base = 1 if program.deferred else 0
        # The aux semaphore's value after each submission (in execution order).
        aux_after, value = [], 0
        for submission in program.submissions:
            value += submission.signal_aux
            aux_after.append(value)
        for k in program.submit_order:
            submission = program.submissions[k]
            wait = [(chain, base + k)]
            if submission.wait_aux and k > 0:
                wait.append((aux, aux_after[k - 1]))
            signal = [(chain, base + k + 1)]
            if submission.signal_aux:
                signal.append((aux, aux_after[k]))
            if submission.command_buffers:
                device.queue_execute(
                    [command_buffers[i] for i in submission.command_buffers],
                    wait=wait,
                    signal=signal,
                    binding_tables=[api_table(t, buffers) for t in submission.binding_tables],
                )
            else:
                device.queue_barrier(wait=wait, signal=signal)
        if program.deferred:
            chain.signal(1)
        chain.wait(base + len(program.submissions), timeout=WAIT_TIMEOUT)
        assert aux.value == aux_after[-1]
        return [device.read(buf) for buf in buffers]
    finally:
        for buf in buffers:
            buf.release()


@pytest.fixture(scope="module")
def device_and_kernels(shared_device):
    return shared_device, load_kernels(shared_device)


@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(program=programs())
def test_driver_matches_model(device_and_kernels, program):
    device, exe = device_and_kernels
    expected = run_model(program)
    actual = run_on_device(device, exe, program)
    for index, (got, want) in enumerate(zip(actual, expected)):
        assert got == want, f"buffer {index} differs from the model at bytes " + str(
            [i for i in range(len(want)) if got[i] != want[i]][:16]
        )


def test_model_agrees_with_hand_computed_program():
    """The model itself, on a program whose result is worked out by hand."""
    program = Program(
        buffer_sizes=[16, 16],
        contents_seed=0,
        command_buffers=[
            CommandBufferProgram(
                [
                    Fill(BufferRange(0, 0, 16), 0x01020304, 4),
                    Barrier(),
                    Copy(BufferRange(0, 4, 8), BufferRange(1, 0, 8)),
                    Update(b"\xaa\xbb", BufferRange(1, 8, 2)),
                ]
            ),
            CommandBufferProgram([Dispatch("cts_add_one", (1, 1, 1), (2,), (SlotRange(0, 0, 8),))], True, 1),
        ],
        submissions=[
            Submission([0], [None]),
            Submission([1, 1], [[TableEntry(1, 0, 16)], [TableEntry(0, 8, 8)]]),
        ],
    )
    initial = program.initial_contents()
    buf0, buf1 = run_model(program)
    word = bytes([4, 3, 2, 1])
    assert buf0 == word * 2 + bytes([5, 3, 2, 1]) * 2
    assert buf1 == bytes([5, 3, 2, 1]) * 2 + b"\xaa\xbb" + initial[1][10:]
