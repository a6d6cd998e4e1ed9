"""Devices: the queue, allocation and executable entry points of one driver device."""

from __future__ import annotations

import abc
import operator
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hal.allocator import Allocator
from hal.buffer import Buffer, check_int
from hal.command_buffer import Binding, CommandBuffer
from hal.errors import (
    FailedPreconditionError,
    IncompatibleError,
    InvalidArgumentError,
)
from hal.executable import Executable, ExecutableSpec
from hal.log import driver_logger
from hal.semaphore import Fence, Semaphore, check_fences, deadline_from
from hal.types import BufferUsage, CommandBufferMode, CommandBufferState, MemoryType

if TYPE_CHECKING:
    from hal.driver import DeviceInfo, Driver

DEFAULT_LIMITS = {
    "max_workgroup_count": ((1 << 31) - 1, 65535, 65535),
    "max_workgroup_size": 1024,
}


_EXECUTABLE = CommandBufferState.EXECUTABLE
_REUSABLE = CommandBufferMode.REUSABLE.value
_released = operator.attrgetter("_released")


def _same_live_entries(table: Sequence[object], checked: list) -> bool:
    """Whether ``table`` holds the entries of a table checked before, their buffers still live.

    The checks of a binding table depend only on its entries' values (buffers never change
    size, usage or device) and on buffers being live, so an equal table passes again as it
    did; the resolved entries are shared, so drivers can tell an unchanged table by identity.
    """
    sources, entries, watched = checked
    try:
        same = (table if type(table) is list else list(table)) == sources
    except Exception:  # an entry whose comparison fails is no checked entry
        return False
    if not same:
        return False
    if watched is None:  # made on the first reuse: a table used once never pays for it
        views = [entry[0] for entry in entries]
        watched = checked[2] = tuple(views + [view._root for view in views if view._root is not view])
    return not any(map(_released, watched))


class Device(abc.ABC):
    """One device of a driver. Validates every call; drivers implement the ``_hooks``."""

    #: Executable formats this device can prepare, in order of preference.
    executable_formats: tuple[str, ...] = ()

    def __init__(self, driver: Driver, info: DeviceInfo, *, queue_count: int = 1,
                 limits: dict[str, Any] | None = None) -> None:
        self.driver = driver
        self.info = info
        self.queue_count = queue_count
        self.limits = dict(DEFAULT_LIMITS, **(limits or {}))
        self.allocator: Allocator
        self._closed = False
        self._executables: dict[tuple, tuple[ExecutableSpec, Executable]] = {}
        self._executables_lock = threading.Lock()

    @property
    def driver_name(self) -> str:
        return self.info.driver

    # -- lifetime ---------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise FailedPreconditionError(f"device {self.info.uri} is closed")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wait for queued work, then release everything the device holds. Idempotent."""
        if self._closed:
            return
        # Work parked on waits that nothing will ever reach would keep the device busy forever.
        self._cancel_parked(FailedPreconditionError(
            f"device {self.info.uri} was closed before the work's waits were reached"))
        try:
            self._wait_idle(None)
        except Exception:  # failed work must not prevent releasing the device
            pass
        self._closed = True
        self._executables.clear()
        self._close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- objects ------------------------------------------------------------------
    def create_semaphore(self, initial: int = 0) -> Semaphore:
        self._check_open()
        return self._create_semaphore(check_int(initial, "semaphore initial value"))

    def create_command_buffer(self, mode: CommandBufferMode = CommandBufferMode.ONE_SHOT,
                              binding_capacity: int = 0) -> CommandBuffer:
        self._check_open()
        if not isinstance(mode, CommandBufferMode) or not mode:
            raise InvalidArgumentError(f"mode must be a hal.CommandBufferMode, got {mode!r}")
        if mode == CommandBufferMode.ONE_SHOT | CommandBufferMode.REUSABLE:
            raise InvalidArgumentError("a command buffer is either ONE_SHOT or REUSABLE, not both")
        binding_capacity = check_int(binding_capacity, "binding_capacity")
        return self._create_command_buffer(mode, binding_capacity)

    def can_prepare(self, format: str) -> bool:
        return format in self.executable_formats

    def load_executable(self, specs: ExecutableSpec | Sequence[ExecutableSpec]) -> Executable:
        """Prepare the first spec whose format this device supports; cached by content."""
        self._check_open()
        if isinstance(specs, ExecutableSpec):
            specs = [specs]
        if not isinstance(specs, Sequence) or not specs or not all(isinstance(s, ExecutableSpec) for s in specs):
            raise InvalidArgumentError(f"load_executable takes an ExecutableSpec or a list of them, got {specs!r}")
        spec = next((s for s in specs if self.can_prepare(s.format)), None)
        if spec is None:
            raise IncompatibleError(
                f"device {self.info.uri} cannot prepare any of the formats "
                f"{[s.format for s in specs]}; it supports {list(self.executable_formats)}")
        limit = self.limits["max_workgroup_size"]
        for export in spec.exports:
            x, y, z = export.workgroup_size
            if x * y * z > limit:
                raise InvalidArgumentError(
                    f"export {export.name!r} workgroup size {export.workgroup_size} exceeds "
                    f"the device limit of {limit} invocations")
        key = spec.cache_key()
        with self._executables_lock:
            cached = self._executables.get(key)
            log = driver_logger(self.info.driver)
            if cached is not None:
                log.debug("executable cache hit: %s %s", spec.format, [e.name for e in spec.exports])
                return cached[1]
            log.debug("preparing %s executable %s", spec.format, [e.name for e in spec.exports])
            executable = self._prepare_executable(spec)
            # Keep the spec alive: callables are keyed by identity.
            self._executables[key] = (spec, executable)
            return executable

    # -- host transfers -------------------------------------------------------------
    def write(self, buffer: Buffer, data: object, offset: int = 0) -> None:
        """Synchronously copy host ``data`` into ``buffer`` at ``offset`` (not ordered with queued work)."""
        self._check_open()
        self._check_own_buffer(buffer, "write target")
        try:
            payload = memoryview(data).cast("B")  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgumentError(
                f"write data must be bytes-like or a contiguous array, got {type(data).__name__}") from None
        offset, length = buffer.check_range(offset, len(payload), "write")
        if length:
            self._write(buffer, offset, payload)

    def read(self, buffer: Buffer, offset: int = 0, length: int | None = None) -> bytes:
        """Synchronously copy ``buffer[offset:offset+length]`` to the host."""
        self._check_open()
        self._check_own_buffer(buffer, "read source")
        offset, length = buffer.check_range(offset, length, "read")
        return self._read(buffer, offset, length) if length else b""

    def _check_own_buffer(self, buffer: object, what: str) -> Buffer:
        if not isinstance(buffer, Buffer):
            raise InvalidArgumentError(f"{what} must be a hal.Buffer, got {type(buffer).__name__}")
        buffer.check_live(what)
        if buffer.device is not self:
            raise InvalidArgumentError(f"{what} belongs to another device ({buffer.device!r})")
        return buffer

    # -- queue operations -------------------------------------------------------------
    def _check_queue(self, queue: int) -> int:
        queue = check_int(queue, "queue")
        if queue >= self.queue_count:
            raise InvalidArgumentError(f"queue {queue} does not exist; the device has {self.queue_count}")
        return queue

    def _check_submission(self, wait: object, signal: object) -> tuple[list[Fence], list[Fence]]:
        waits = check_fences(wait, "wait", self)
        signals = check_fences(signal, "signal", self)
        for i, (sem, value) in enumerate(signals):
            if sem._failure is None and value <= sem._value:
                raise InvalidArgumentError(
                    f"signal[{i}] value {value} is not above the semaphore's current value {sem._value}")
        return waits, signals

    def queue_execute(self, command_buffers: Sequence[CommandBuffer], wait: Sequence[Fence] = (),
                      signal: Sequence[Fence] = (), binding_tables: Sequence[object] | None = None,
                      *, queue: int = 0) -> None:
        """Run command buffers in order once every ``wait`` is reached, then signal ``signal``."""
        if self._closed:
            self._check_open()
        if type(queue) is not int or not 0 <= queue < self.queue_count:
            queue = self._check_queue(queue)
        if isinstance(command_buffers, CommandBuffer):
            command_buffers = [command_buffers]
        # Checked by type first: the ABC check costs more than the rest of a small submission's checks.
        if type(command_buffers) is not list and type(command_buffers) is not tuple \
                and not isinstance(command_buffers, Sequence):
            raise InvalidArgumentError(f"command_buffers must be a sequence, got {command_buffers!r}")
        one_shot = []
        uses_tables = False
        for i, cb in enumerate(command_buffers):
            if not isinstance(cb, CommandBuffer):
                raise InvalidArgumentError(f"command_buffers[{i}] is not a hal.CommandBuffer: {cb!r}")
            if cb.device is not self:
                raise InvalidArgumentError(f"command_buffers[{i}] belongs to another device")
            state = cb.state
            if state is not _EXECUTABLE:
                if state is CommandBufferState.SUBMITTED:
                    raise FailedPreconditionError(
                        f"command_buffers[{i}] is ONE_SHOT and was already submitted")
                raise FailedPreconditionError(
                    f"command_buffers[{i}] is {state.value}; end() it before submitting")
            if not cb.mode._value_ & _REUSABLE:
                one_shot.append(cb)
            if cb.binding_capacity:
                uses_tables = True
        if len(one_shot) > 1 and len({id(cb) for cb in one_shot}) != len(one_shot):
            raise FailedPreconditionError("a ONE_SHOT command buffer appears twice in one submission")
        waits, signals = self._check_submission(wait, signal)
        if binding_tables is None and not uses_tables:
            tables: list[list[Binding] | None] = [None] * len(command_buffers)
        else:
            tables = self._check_binding_tables(command_buffers, binding_tables)
        for cb in one_shot:
            cb.state = CommandBufferState.SUBMITTED
        self._queue_execute(queue, list(command_buffers), tables, waits, signals)

    def _check_binding_tables(self, command_buffers: Sequence[CommandBuffer],
                              binding_tables: object) -> list[list[Binding] | None]:
        if binding_tables is None:
            binding_tables = [None] * len(command_buffers)
        if (type(binding_tables) is not list and type(binding_tables) is not tuple and (
                isinstance(binding_tables, (str, bytes)) or not isinstance(binding_tables, Sequence))) \
                or len(binding_tables) != len(command_buffers):
            raise InvalidArgumentError(
                f"binding_tables must be None or hold one table per command buffer "
                f"({len(command_buffers)}), got {binding_tables!r}")
        resolved: list[list[Binding] | None] = []
        for i, (cb, table) in enumerate(zip(command_buffers, binding_tables)):
            if cb.binding_capacity == 0:
                if table:
                    raise InvalidArgumentError(
                        f"binding_tables[{i}] given for a command buffer with binding_capacity 0")
                resolved.append(None)
                continue
            if table is None or (type(table) is not list and type(table) is not tuple and (
                    isinstance(table, (str, bytes)) or not isinstance(table, Sequence))):
                raise InvalidArgumentError(
                    f"command_buffers[{i}] has binding_capacity {cb.binding_capacity} and needs a binding table")
            if len(table) < cb.binding_capacity:
                raise InvalidArgumentError(
                    f"binding_tables[{i}] has {len(table)} entries; the command buffer needs "
                    f"{cb.binding_capacity}")
            checked = cb._checked_table
            if checked is not None and _same_live_entries(table, checked):
                resolved.append(checked[1])  # the same entries as last time: nothing to check again
                continue
            entries = []
            for j, entry in enumerate(table):
                if type(entry) is Buffer and entry.device is self and not entry._released \
                        and not entry._root._released:
                    entries.append((entry, 0, entry.size))  # fast path: a whole live buffer of this device
                else:
                    entries.append(self._check_binding(entry, f"binding_tables[{i}][{j}]"))
            cb.check_binding_table(entries)
            cb._checked_table = [list(table), entries, None]  # the entries given, resolved, buffers to watch
            resolved.append(entries)
        return resolved

    def _check_binding(self, entry: object, what: str) -> Binding:
        if type(entry) is Buffer and entry.device is self and not entry._released and not entry._root._released:
            return entry, 0, entry.size  # fast path: a whole live buffer of this device
        if isinstance(entry, Buffer):
            buffer, offset, length = entry, 0, None
        elif isinstance(entry, tuple) and len(entry) in (2, 3) and isinstance(entry[0], Buffer):
            buffer, offset = entry[0], entry[1]
            length = entry[2] if len(entry) == 3 else None
        else:
            raise InvalidArgumentError(f"{what} must be a Buffer or (Buffer, offset, length), got {entry!r}")
        self._check_own_buffer(buffer, what)
        offset, length = buffer.check_range(offset, length, what)
        return buffer, offset, length

    def queue_barrier(self, wait: Sequence[Fence] = (), signal: Sequence[Fence] = (),
                      *, queue: int = 0) -> None:
        """Signal ``signal`` once ``wait`` is reached and prior work on the queue completed."""
        self._check_open()
        queue = self._check_queue(queue)
        waits, signals = self._check_submission(wait, signal)
        self._queue_execute(queue, [], [], waits, signals)

    def queue_alloca(self, size: int, wait: Sequence[Fence] = (), signal: Sequence[Fence] = (),
                     memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                     usage: BufferUsage = BufferUsage.DEFAULT, *, queue: int = 0) -> Buffer:
        """A buffer usable by work ordered after ``signal`` (stream-ordered allocation)."""
        self._check_open()
        queue = self._check_queue(queue)
        size, memory_type, usage = self.allocator.check_request(size, memory_type, usage)
        waits, signals = self._check_submission(wait, signal)
        return self._queue_alloca(queue, size, memory_type, usage, waits, signals)

    def queue_dealloca(self, buffer: Buffer, wait: Sequence[Fence] = (),
                       signal: Sequence[Fence] = (), *, queue: int = 0) -> None:
        """Release ``buffer`` once ``wait`` is reached; ``signal`` follows the release."""
        self._check_open()
        queue = self._check_queue(queue)
        self._check_own_buffer(buffer, "dealloca buffer")
        if buffer.root is not buffer:
            raise InvalidArgumentError("queue_dealloca takes a root buffer, not a subspan")
        waits, signals = self._check_submission(wait, signal)
        self._queue_dealloca(queue, buffer, waits, signals)

    def wait_idle(self, timeout: float | None = None) -> None:
        """Block until all submitted work completed; DeadlineExceededError after ``timeout``."""
        self._check_open()
        self._wait_idle(deadline_from(timeout))

    # -- driver hooks -------------------------------------------------------------------
    @abc.abstractmethod
    def _create_semaphore(self, initial_value: int) -> Semaphore: ...

    @abc.abstractmethod
    def _create_command_buffer(self, mode: CommandBufferMode, binding_capacity: int) -> CommandBuffer: ...

    @abc.abstractmethod
    def _prepare_executable(self, spec: ExecutableSpec) -> Executable: ...

    @abc.abstractmethod
    def _write(self, buffer: Buffer, offset: int, data: memoryview) -> None: ...

    @abc.abstractmethod
    def _read(self, buffer: Buffer, offset: int, length: int) -> bytes: ...

    @abc.abstractmethod
    def _queue_execute(self, queue: int, command_buffers: list[CommandBuffer],
                       binding_tables: list[list[Binding] | None], waits: list[Fence],
                       signals: list[Fence]) -> None: ...

    @abc.abstractmethod
    def _queue_alloca(self, queue: int, size: int, memory_type: MemoryType, usage: BufferUsage,
                      waits: list[Fence], signals: list[Fence]) -> Buffer: ...

    @abc.abstractmethod
    def _queue_dealloca(self, queue: int, buffer: Buffer, waits: list[Fence],
                        signals: list[Fence]) -> None: ...

    @abc.abstractmethod
    def _wait_idle(self, deadline: float | None) -> None: ...

    def _cancel_parked(self, cause: BaseException) -> None:
        """Fail submissions still parked on their waits (``FenceWaiter.cancel``); called by close()."""

    def _close(self) -> None:
        pass

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<hal.Device {self.info.uri} {self.info.name!r}{state}>"
