"""Every bad input of the contract: the exact error class, a message naming the problem,
nothing executed, and a device that keeps working afterwards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

import hal

from .helpers import MAPPABLE, WAIT_TIMEOUT, allocate_with, random_bytes, read_u32, record, submit_and_wait
from .kernels import load_kernels

Mode = hal.CommandBufferMode
Slot = hal.Slot
ORIGINAL = random_bytes(64, seed=99)


class Context:
    """Objects a bad call is made against; checked afterwards for untouched state."""

    def __init__(self, device: hal.Device, kernels: hal.Executable, make_device: Callable[[], hal.Device]):
        self.device = device
        self.kernels = kernels
        self.buf = allocate_with(device, ORIGINAL)
        self.other = allocate_with(device, ORIGINAL)
        self.sem = device.create_semaphore(0)
        self._make_device = make_device
        self._cb: hal.CommandBuffer | None = None
        self._foreign: hal.Device | None = None

    @property
    def cb(self) -> hal.CommandBuffer:
        """A one-shot command buffer in the recording state."""
        if self._cb is None:
            self._cb = self.device.create_command_buffer()
            self._cb.begin()
        return self._cb

    def reusable(self, capacity: int, body: Callable[[hal.CommandBuffer], None]) -> hal.CommandBuffer:
        return record(self.device, body, mode=Mode.REUSABLE, binding_capacity=capacity)

    def add_one(self, cb: hal.CommandBuffer, ref: object) -> None:
        cb.dispatch(self.kernels, "cts_add_one", workgroups=1, constants=[4], bindings=[ref])

    def submit(self, cbs, **kwargs) -> None:
        self.device.queue_execute(cbs, signal=[(self.sem, 1)], **kwargs)

    @property
    def foreign(self) -> hal.Device:
        if self._foreign is None:
            self._foreign = self._make_device()
        return self._foreign

    def finish_recording(self) -> None:
        """Submits what the command buffer holds: a rejected command must not be in it."""
        if self._cb is not None and self._cb.state == hal.CommandBufferState.RECORDING:
            self._cb.end()
            submit_and_wait(self.device, [self._cb])


@dataclass(frozen=True)
class Case:
    expected: type[hal.HalError]
    call: Callable[[Context], object]
    words: tuple[str, ...]  # the message names at least one of these (case-insensitive)


def _closed_device_call(ctx: Context) -> None:
    dev = ctx._make_device()
    dev.close()
    dev.create_semaphore(0)


def _released(ctx: Context) -> None:
    buf = ctx.device.allocator.allocate(16)
    buf.release()
    ctx.cb.fill_buffer(buf, 0, 1)


def _one_shot_twice(ctx: Context) -> None:
    cb = record(ctx.device, lambda cb: cb.fill_buffer(ctx.other, 1, 1))
    submit_and_wait(ctx.device, [cb])
    ctx.device.write(ctx.other, ORIGINAL)
    ctx.submit([cb])


def _map_without_mapping(ctx: Context) -> None:
    usage = hal.BufferUsage.TRANSFER | hal.BufferUsage.DISPATCH_STORAGE
    buf = ctx.device.allocator.allocate(16, memory_type=MAPPABLE, usage=usage)
    with buf.map():
        pass


def _map_outside(ctx: Context) -> None:
    buf = ctx.device.allocator.allocate(64, memory_type=MAPPABLE)
    with buf.map(hal.MemoryAccess.READ, 60, 8):
        pass


def _failed_wait(ctx: Context) -> None:
    sem = ctx.device.create_semaphore(0)
    sem.fail("the failure being reported")
    sem.wait(1, timeout=WAIT_TIMEOUT)


def _too_many_workgroups(ctx: Context) -> None:
    limit = ctx.device.limits["max_workgroup_count"][0]
    ctx.cb.dispatch(ctx.kernels, "cts_add_one", workgroups=(limit + 1, 1, 1), constants=[4], bindings=[ctx.buf])


TRANSFER_ONLY = hal.BufferUsage.TRANSFER | hal.BufferUsage.MAPPING
STORAGE_ONLY = hal.BufferUsage.DISPATCH_STORAGE | hal.BufferUsage.MAPPING
IA, OOR, FP = hal.InvalidArgumentError, hal.OutOfRangeError, hal.FailedPreconditionError

CASES: dict[str, Case] = {
    # allocation
    "allocate-float-size": Case(IA, lambda c: c.device.allocator.allocate(1.5), ("size", "1.5")),
    "allocate-str-size": Case(IA, lambda c: c.device.allocator.allocate("64"), ("size", "'64'")),
    "allocate-none-size": Case(IA, lambda c: c.device.allocator.allocate(None), ("size", "None")),
    "allocate-negative-size": Case(IA, lambda c: c.device.allocator.allocate(-8), ("size", "-8")),
    "allocate-bad-memory-type": Case(
        IA, lambda c: c.device.allocator.allocate(8, memory_type="device"), ("memory_type",)
    ),
    "allocate-bad-usage": Case(IA, lambda c: c.device.allocator.allocate(8, usage=3), ("usage",)),
    "allocate-huge": Case(
        hal.ResourceExhaustedError, lambda c: c.device.allocator.allocate(1 << 62), ("size", str(1 << 62))
    ),
    # fill
    "fill-pattern-length-3": Case(IA, lambda c: c.cb.fill_buffer(c.buf, 0, 3), ("pattern_length",)),
    "fill-pattern-too-big": Case(IA, lambda c: c.cb.fill_buffer(c.buf, 0x1FF, 1), ("pattern", "0x1ff")),
    "fill-misaligned-offset": Case(IA, lambda c: c.cb.fill_buffer((c.buf, 2, 8), 0, 4), ("offset", "align")),
    "fill-misaligned-length": Case(IA, lambda c: c.cb.fill_buffer((c.buf, 0, 6), 0, 4), ("length", "align")),
    "fill-outside-buffer": Case(OOR, lambda c: c.cb.fill_buffer((c.buf, 32, 64), 0, 1), ("64", "96")),
    "fill-not-a-buffer": Case(IA, lambda c: c.cb.fill_buffer("buffer", 0, 1), ("target", "'buffer'")),
    "fill-without-transfer-usage": Case(
        FP, lambda c: c.cb.fill_buffer(c.device.allocator.allocate(16, usage=STORAGE_ONLY), 0, 1), ("TRANSFER",)
    ),
    # update
    "update-too-large": Case(IA, lambda c: c.cb.update_buffer(bytes(65537), c.buf), ("65537", "65536")),
    "update-length-mismatch": Case(IA, lambda c: c.cb.update_buffer(bytes(8), (c.buf, 0, 16)), ("8", "16")),
    "update-not-bytes": Case(IA, lambda c: c.cb.update_buffer(12345, c.buf), ("data", "int")),
    "update-outside-buffer": Case(OOR, lambda c: c.cb.update_buffer(bytes(8), (c.buf, 60, 8)), ("60", "68")),
    # copy
    "copy-length-mismatch": Case(IA, lambda c: c.cb.copy_buffer((c.buf, 0, 8), (c.other, 0, 16)), ("length",)),
    "copy-overlap": Case(IA, lambda c: c.cb.copy_buffer((c.buf, 0, 16), (c.buf, 8, 16)), ("overlap",)),
    "copy-outside-source": Case(OOR, lambda c: c.cb.copy_buffer((c.buf, 60, 8), (c.other, 0, 8)), ("source",)),
    "copy-outside-target": Case(OOR, lambda c: c.cb.copy_buffer((c.buf, 0, 8), (c.other, 60, 8)), ("target",)),
    # dispatch
    "dispatch-too-few-bindings": Case(
        IA,
        lambda c: c.cb.dispatch(c.kernels, "cts_mix3", workgroups=1, constants=[4], bindings=[c.buf, c.other]),
        ("bindings",),
    ),
    "dispatch-too-many-constants": Case(
        IA,
        lambda c: c.cb.dispatch(c.kernels, "cts_add_one", workgroups=1, constants=[4, 5], bindings=[c.buf]),
        ("constants",),
    ),
    "dispatch-constant-too-big": Case(
        IA,
        lambda c: c.cb.dispatch(c.kernels, "cts_add_one", workgroups=1, constants=[1 << 32], bindings=[c.buf]),
        ("constant", str(1 << 32)),
    ),
    "dispatch-constant-too-negative": Case(
        IA,
        lambda c: c.cb.dispatch(c.kernels, "cts_add_one", workgroups=1, constants=[-(2**31) - 1], bindings=[c.buf]),
        ("constant", str(-(2**31) - 1)),
    ),
    "dispatch-constant-float": Case(
        IA,
        lambda c: c.cb.dispatch(c.kernels, "cts_add_one", workgroups=1, constants=[1.5], bindings=[c.buf]),
        ("constant", "1.5"),
    ),
    "dispatch-negative-workgroups": Case(
        IA,
        lambda c: c.cb.dispatch(c.kernels, "cts_add_one", workgroups=(1, -1, 1), constants=[4], bindings=[c.buf]),
        ("workgroups",),
    ),
    "dispatch-too-many-workgroups": Case(IA, _too_many_workgroups, ("workgroups", "limit")),
    "dispatch-unknown-export": Case(
        IA,
        lambda c: c.cb.dispatch(c.kernels, "no_such_export", workgroups=1, constants=[4], bindings=[c.buf]),
        ("no_such_export",),
    ),
    "dispatch-export-index-out-of-range": Case(
        IA, lambda c: c.cb.dispatch(c.kernels, 99, workgroups=1, constants=[4], bindings=[c.buf]), ("99",)
    ),
    "dispatch-binding-outside-buffer": Case(
        OOR,
        lambda c: c.cb.dispatch(c.kernels, "cts_add_one", workgroups=1, constants=[4], bindings=[(c.buf, 32, 64)]),
        ("binding",),
    ),
    "dispatch-without-storage-usage": Case(
        FP, lambda c: c.add_one(c.cb, c.device.allocator.allocate(16, usage=TRANSFER_ONLY)), ("DISPATCH_STORAGE",)
    ),
    "dispatch-foreign-buffer": Case(IA, lambda c: c.add_one(c.cb, c.foreign.allocator.allocate(16)), ("device",)),
    "dispatch-foreign-executable": Case(
        IA,
        lambda c: c.cb.dispatch(load_kernels(c.foreign), "cts_add_one", workgroups=1, constants=[4], bindings=[c.buf]),
        ("device",),
    ),
    # semaphores and fences
    "signal-not-increasing": Case(IA, lambda c: c.sem.signal(0), ("0",)),
    "fence-not-a-pair": Case(IA, lambda c: c.device.queue_barrier(signal=[c.sem]), ("signal",)),
    "fence-value-not-int": Case(IA, lambda c: c.device.queue_barrier(signal=[(c.sem, "1")]), ("signal", "value")),
    "fence-foreign-semaphore": Case(
        IA,
        lambda c: c.device.queue_barrier(wait=[(c.foreign.create_semaphore(1), 1)], signal=[(c.sem, 1)]),
        ("device",),
    ),
    "semaphore-negative-initial-value": Case(IA, lambda c: c.device.create_semaphore(-1), ("initial", "-1")),
    "fence-value-float": Case(IA, lambda c: c.device.queue_barrier(signal=[(c.sem, 1.5)]), ("signal", "1.5")),
    "wait-timeout": Case(hal.DeadlineExceededError, lambda c: c.sem.wait(1, timeout=0), ("1",)),
    "wait-on-failed-semaphore": Case(hal.AbortedError, _failed_wait, ("the failure being reported",)),
    # submission and binding tables
    "submit-without-binding-table": Case(
        IA, lambda c: c.submit([c.reusable(1, lambda cb: c.add_one(cb, Slot(0)))]), ("binding",)
    ),
    "submit-short-binding-table": Case(
        IA,
        lambda c: c.submit([c.reusable(2, lambda cb: c.add_one(cb, Slot(1)))], binding_tables=[[c.buf]]),
        ("binding",),
    ),
    "slot-index-beyond-capacity": Case(
        IA, lambda c: c.reusable(1, lambda cb: c.add_one(cb, Slot(1))), ("slot", "capacity")
    ),
    "slot-without-capacity": Case(IA, lambda c: c.reusable(0, lambda cb: c.add_one(cb, Slot(0))), ("slot", "capacity")),
    "slot-range-outside-entry": Case(
        OOR,
        lambda c: c.submit([c.reusable(1, lambda cb: c.add_one(cb, Slot(0, 56, 16)))], binding_tables=[[c.buf]]),
        ("slot", "entry", "binding"),
    ),
    "binding-table-entry-outside-buffer": Case(
        OOR,
        lambda c: c.submit([c.reusable(1, lambda cb: c.add_one(cb, Slot(0)))], binding_tables=[[(c.buf, 48, 32)]]),
        ("binding_tables",),
    ),
    "negative-binding-capacity": Case(
        IA, lambda c: c.device.create_command_buffer(mode=Mode.REUSABLE, binding_capacity=-1), ("binding_capacity",)
    ),
    "slot-negative-index": Case(IA, lambda c: c.reusable(2, lambda cb: c.add_one(cb, Slot(-1))), ("slot", "-1")),
    "binding-table-foreign-buffer": Case(
        IA,
        lambda c: c.submit(
            [c.reusable(1, lambda cb: c.add_one(cb, Slot(0)))], binding_tables=[[c.foreign.allocator.allocate(64)]]
        ),
        ("device",),
    ),
    "submit-foreign-command-buffer": Case(
        IA, lambda c: c.submit([record(c.foreign, lambda cb: cb.execution_barrier())]), ("device",)
    ),
    # state
    "record-before-begin": Case(
        FP, lambda c: c.device.create_command_buffer().fill_buffer(c.buf, 0, 1), ("recording",)
    ),
    "begin-twice": Case(FP, lambda c: c.cb.begin(), ("begin",)),
    "end-without-begin": Case(FP, lambda c: c.device.create_command_buffer().end(), ("end", "recording")),
    "submit-unended": Case(FP, lambda c: c.submit([c.device.create_command_buffer()]), ("end",)),
    "submit-one-shot-twice": Case(FP, _one_shot_twice, ("submitted", "one_shot")),
    "use-released-buffer": Case(FP, _released, ("released",)),
    "use-closed-device": Case(FP, _closed_device_call, ("closed",)),
    "map-without-mapping-usage": Case(FP, _map_without_mapping, ("MAPPING",)),
    # ranges of host access
    "subspan-outside": Case(OOR, lambda c: c.buf.subspan(60, 8), ("subspan",)),
    "read-outside": Case(OOR, lambda c: c.device.read(c.buf, 60, 8), ("read",)),
    "write-outside": Case(OOR, lambda c: c.device.write(c.buf, bytes(8), 60), ("write",)),
    "map-outside": Case(OOR, _map_outside, ("map",)),
    # executables and drivers
    "executable-no-preparable-format": Case(
        hal.IncompatibleError,
        lambda c: c.device.load_executable(hal.ExecutableSpec("cts-bogus", "", [hal.Export("x")])),
        ("cts-bogus",),
    ),
    "unknown-driver": Case(hal.NotFoundError, lambda c: hal.get_driver("cts-no-such-driver"), ("cts-no-such-driver",)),
}


@pytest.fixture
def context(device, kernels, make_device):
    return Context(device, kernels, make_device)


@pytest.mark.parametrize("case_id", list(CASES))
def test_bad_input(context, case_id):
    case = CASES[case_id]
    with pytest.raises(hal.HalError) as info:
        case.call(context)
    err = info.value
    assert type(err) is case.expected, f"expected {case.expected.__name__}, got {type(err).__name__}: {err}"
    assert err.code == case.expected.code
    message = str(err).lower()
    assert any(word.lower() in message for word in case.words), f"message {str(err)!r} names none of {case.words}"

    # Nothing ran: the rejected command was not recorded, no semaphore moved, no buffer changed.
    context.finish_recording()
    assert context.sem.failure is None and context.sem.value == 0
    assert context.device.read(context.buf) == ORIGINAL
    assert context.device.read(context.other) == ORIGINAL

    # The device still works.
    add = record(context.device, lambda cb: context.add_one(cb, context.buf))
    submit_and_wait(context.device, [add])
    expected = np.frombuffer(ORIGINAL, np.uint32).copy()
    expected[:4] += 1
    np.testing.assert_array_equal(read_u32(context.device, context.buf), expected)


def test_every_error_class_takes_a_message():
    for cls in (
        hal.InvalidArgumentError,
        hal.OutOfRangeError,
        hal.ResourceExhaustedError,
        hal.FailedPreconditionError,
        hal.UnavailableError,
        hal.NotFoundError,
        hal.DeadlineExceededError,
        hal.AbortedError,
        hal.UnimplementedError,
        hal.IncompatibleError,
        hal.InternalError,
    ):
        err = cls("some message")
        assert isinstance(err, hal.HalError)
        assert "some message" in str(err)
        assert hal.HalError(err.code, "again").__class__ is cls


def test_hal_objects_refuse_pickling_with_a_typed_error_naming_what_to_send(device, kernels):
    import copy
    import pickle

    buf = device.allocator.allocate(16)
    cb = device.create_command_buffer()
    objects = [("hal.Device", device), ("hal.Buffer", buf), ("hal.Buffer", buf.subspan(0, 8)),
               ("hal.Semaphore", device.create_semaphore(0)), ("hal.CommandBuffer", cb), ("hal.Executable", kernels),
               ("hal.Allocator", device.allocator), ("hal.Driver", device.driver)]
    for what, obj in objects:
        for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(hal.UnimplementedError, match=f"{what} cannot be pickled") as info:
                attempt(obj)
            assert isinstance(info.value, TypeError)  # what Python's own "cannot pickle" errors are
    assert pickle.loads(pickle.dumps(device.info)) == device.info  # plain data pickles
    buf.release()
