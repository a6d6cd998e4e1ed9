"""Devices: the queue, allocation and executable entry points of one driver device."""

from __future__ import annotations

import abc
import collections
import functools
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hal import tracing
from hal.allocator import Allocator
from hal.buffer import Buffer
from hal.command_buffer import Binding, CommandBuffer
from hal.errors import (
    FailedPreconditionError,
    IncompatibleError,
    InvalidArgumentError,
)
from hal.executable import Executable, ExecutableSpec, numpy_functions
from hal.execution import Execution, Issue, check_joined, held_buffers
from hal.library import routines_of
from hal.log import driver_logger
from hal.pickling import not_picklable
from hal.semaphore import Fence, Semaphore
from hal.types import BufferUsage, CommandBufferMode, MemoryType
from hal.validation import (
    MAX_U64,
    check_binding,
    check_binding_tables,
    check_buffer,
    check_command_buffers,
    check_direct_buffers,
    check_fences,
    check_int,
    check_queue,
    check_range,
    check_signal_fences,
    deadline_from,
)

if TYPE_CHECKING:
    from hal.driver import DeviceInfo, Driver

#: Executables a device keeps loaded for ``load_executable`` to find again (the least recently
#: used go first; one still used by a command buffer stays alive through it).
EXECUTABLE_CACHE_ENTRIES = 512

DEFAULT_LIMITS = {
    "max_workgroup_count": ((1 << 31) - 1, 65535, 65535),
    "max_workgroup_size": 1024,
}


_FIRST_QUEUE = 0

# The open devices of this process by URI (``DeviceInfo.uri``, the normalized form), oldest first, held
# weakly: ``hal.open_device`` returns the oldest that is still open, so that every user of a URI that
# asks for it (the runtime among them) shares one device object.
_open_devices: dict[str, list] = {}
_open_lock = threading.Lock()


def register_open(device: Device) -> None:
    """Note a newly created device as open under its URI (``Driver.create_device`` calls it)."""
    with _open_lock:
        refs = [r for r in _open_devices.get(device.info.uri, ()) if _is_open(r())]
        refs.append(weakref.ref(device))
        _open_devices[device.info.uri] = refs


def find_open(uri: str) -> Device | None:
    """The oldest device created in this process for the normalized `uri` that is still open, or None."""
    with _open_lock:
        refs = _open_devices.get(uri)
        if not refs:
            return None
        live = [r for r in refs if _is_open(r())]
        if live:
            _open_devices[uri] = live
            return live[0]()
        del _open_devices[uri]
        return None


def _is_open(device: Device | None) -> bool:
    return device is not None and not device.closed


class Device(abc.ABC):
    """One device of a driver. Validates every call; drivers implement the ``_hooks``."""

    __reduce_ex__ = not_picklable("a hal.Device", "pickle its URI (device.info.uri) and call hal.create_device(uri)")

    #: Executable formats this device can prepare, in order of preference.
    executable_formats: tuple[str, ...] = ()
    #: The channel factory of a driver with collectives (``hal.channel.ChannelFactory``), else None.
    collectives: Any = None

    def __init__(self, driver: Driver, info: DeviceInfo, *, queue_count: int = 1,
                 limits: dict[str, Any] | None = None) -> None:
        self.driver = driver
        self.info = info
        self.queue_count = queue_count
        self.limits = dict(DEFAULT_LIMITS, **(limits or {}))
        self.allocator: Allocator
        #: Set once by close(); from then on every call is rejected.
        self.closed = False
        #: Held while a submission enters the driver and while close() begins: a submission
        #: either enters before close() (and completes or fails) or is rejected after it.
        self.submission_gate = threading.RLock()
        #: Bumped by every buffer release: an execution prepared at the same epoch holds live buffers.
        self.release_epoch = 0
        self._executables: collections.OrderedDict[tuple, tuple[ExecutableSpec, Executable]] = \
            collections.OrderedDict()
        self._executables_lock = threading.Lock()

    @property
    def driver_name(self) -> str:
        return self.info.driver

    # -- lifetime ---------------------------------------------------------------
    def check_open(self) -> None:
        if self.closed:
            raise FailedPreconditionError(f"device {self.info.uri} is closed")

    def note_release(self) -> None:
        """A buffer of this device was released (called by ``Buffer.release``)."""
        self.release_epoch += 1

    def close(self) -> None:
        """Reject new work, fail work parked on unreached waits, wait for the rest, then release
        everything the device holds. Idempotent and safe to race with submissions."""
        with self.submission_gate:
            if self.closed:
                return
            self.closed = True  # from here on every submission is rejected
        find_open(self.info.uri)  # (forgets it)
        # Work parked on waits that nothing will ever reach would keep the device busy forever.
        self._cancel_parked(FailedPreconditionError(
            f"device {self.info.uri} was closed before the work's waits were reached"))
        try:
            self._wait_idle(None)
        except Exception:  # failed work must not prevent releasing the device
            pass
        self._executables.clear()
        self._close()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- objects ------------------------------------------------------------------
    def create_semaphore(self, initial: int = 0) -> Semaphore:
        self.check_open()
        return self._create_semaphore(check_int(initial, "semaphore initial value", maximum=MAX_U64))

    def create_command_buffer(self, mode: CommandBufferMode = CommandBufferMode.ONE_SHOT,
                              binding_capacity: int = 0) -> CommandBuffer:
        self.check_open()
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
        self.check_open()
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
        if spec.format == "numpy":  # the core's formats: their code is checked here, not per driver
            numpy_functions(spec)
        elif spec.format == "library":
            routines_of(spec)
        key = spec.cache_key()
        with self._executables_lock:
            cached = self._executables.get(key)
            log = driver_logger(self.info.driver)
            if cached is not None:
                log.debug("executable cache hit: %s %s", spec.format, [e.name for e in spec.exports])
                self._executables.move_to_end(key)
                return cached[1]
            log.debug("preparing %s executable %s", spec.format, [e.name for e in spec.exports])
            if tracing.ENABLED:
                executable = tracing.call("prepare_executable", self._prepare_executable, spec,
                                          device=self.info.uri, format=spec.format)
            else:
                executable = self._prepare_executable(spec)
            # Keep the spec alive: callables are keyed by identity.
            self._executables[key] = (spec, executable)
            if len(self._executables) > EXECUTABLE_CACHE_ENTRIES:
                self._executables.popitem(last=False)
            return executable

    # -- host transfers -------------------------------------------------------------
    def write(self, buffer: Buffer, data: object, offset: int = 0) -> None:
        """Synchronously copy host ``data`` into ``buffer`` at ``offset`` (not ordered with queued work)."""
        self.check_open()
        self._check_own_buffer(buffer, "write target")
        try:
            payload = memoryview(data).cast("B")  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgumentError(
                f"write data must be bytes-like or a contiguous array, got {type(data).__name__}") from None
        offset, length = check_range(buffer, offset, len(payload), "write")
        if length:
            self._write(buffer, offset, payload)

    def read(self, buffer: Buffer, offset: int = 0, length: int | None = None) -> bytes:
        """Synchronously copy ``buffer[offset:offset+length]`` to the host."""
        self.check_open()
        self._check_own_buffer(buffer, "read source")
        offset, length = check_range(buffer, offset, length, "read")
        return self._read(buffer, offset, length) if length else b""

    def _check_own_buffer(self, buffer: object, what: str) -> Buffer:
        return check_buffer(buffer, self, what)

    # -- queue operations -------------------------------------------------------------
    def _check_queue(self, queue: object) -> int:
        if type(queue) is int and 0 <= queue < self.queue_count:
            return queue
        return check_queue(self, queue)

    def _check_submission(self, wait: object, signal: object) -> tuple[list[Fence], list[Fence]]:
        return check_fences(wait, "wait", self), check_signal_fences(signal, self)

    def prepare(self, command_buffers: Sequence[CommandBuffer], binding_tables: Sequence[object] | None = None,
                *, queue: int = 0) -> Execution:
        """Validate command buffers and their binding tables once, for submissions on ``queue``.

        The returned ``hal.Execution``'s ``submit(wait, signal)`` issues the work as
        ``queue_execute`` would, checking only the fences; it refuses once a buffer the work uses
        is released or the device closes. ONE_SHOT command buffers make an execution submittable once.
        """
        self.check_open()
        if queue is not _FIRST_QUEUE and (type(queue) is not int or not 0 <= queue < self.queue_count):
            queue = check_queue(self, queue)
        epoch = self.release_epoch  # read before the checks: a release during them is seen at submit
        command_buffers, one_shot, uses_tables = check_command_buffers(self, command_buffers)
        for i, cb in enumerate(command_buffers):
            check_direct_buffers(cb, i)
        if binding_tables is None and not uses_tables:
            tables: list[list[Binding] | None] = [None] * len(command_buffers)
        else:
            tables = check_binding_tables(self, command_buffers, binding_tables)
        buffers = held_buffers(command_buffers, tables)
        issue = self._prepare_execution(queue, command_buffers, tables)
        return Execution(self, queue, command_buffers, tables, issue, epoch, buffers, one_shot)

    def join(self, executions: Sequence[Execution]) -> Execution:
        """One execution running prepared ``executions`` in order as one submission: one wait, one
        signal and one retirement for all of them. Nothing they validated is validated again; each
        must still be valid (FailedPreconditionError), of this device and all of one queue
        (InvalidArgumentError). Like ``prepare``'s, it refuses once a buffer it uses is released
        or the device closes; ONE_SHOT work in it runs once, whichever execution submits it."""
        self.check_open()
        epoch = self.release_epoch  # read before the checks: a release during them is seen at submit
        executions, one_shot = check_joined(self, executions)
        queue = executions[0].queue
        command_buffers = [cb for execution in executions for cb in execution.command_buffers]
        tables = [table for execution in executions for table in execution.binding_tables]
        issue = self._prepare_execution(queue, command_buffers, tables)
        return Execution(self, queue, command_buffers, tables, issue, epoch,
                         held_buffers(command_buffers, tables), one_shot)

    def queue_execute(self, command_buffers: Sequence[CommandBuffer], wait: Sequence[Fence] = (),
                      signal: Sequence[Fence] = (), binding_tables: Sequence[object] | None = None,
                      *, queue: int = 0) -> None:
        """Run command buffers in order once every ``wait`` is reached, then signal ``signal``:
        ``prepare`` and one ``submit`` (a loop repeating a submission prepares it once instead)."""
        self.prepare(command_buffers, binding_tables, queue=queue).submit(wait, signal)

    def _check_binding(self, entry: object, what: str) -> Binding:
        return check_binding(entry, self, what)

    def queue_barrier(self, wait: Sequence[Fence] = (), signal: Sequence[Fence] = (),
                      *, queue: int = 0) -> None:
        """Signal ``signal`` once ``wait`` is reached and prior work on the queue completed."""
        self.check_open()
        queue = self._check_queue(queue)
        waits, signals = self._check_submission(wait, signal)
        with self.submission_gate:
            self.check_open()
            if tracing.ENABLED:
                tracing.call("queue_barrier", self._queue_execute, queue, [], [], waits, signals, device=self.info.uri)
            else:
                self._queue_execute(queue, [], [], waits, signals)

    def queue_alloca(self, size: int, wait: Sequence[Fence] = (), signal: Sequence[Fence] = (),
                     memory_type: MemoryType = MemoryType.DEVICE_LOCAL,
                     usage: BufferUsage = BufferUsage.DEFAULT, *, queue: int = 0) -> Buffer:
        """A buffer usable by work ordered after ``signal`` (stream-ordered allocation)."""
        self.check_open()
        queue = self._check_queue(queue)
        size, memory_type, usage = self.allocator.check_request(size, memory_type, usage)
        waits, signals = self._check_submission(wait, signal)
        with self.submission_gate:
            self.check_open()
            if size == 0:  # an empty buffer needs no stream ordering: a plain one, signalled in order
                buffer = self.allocator.allocate(0, memory_type, usage)
                self._queue_execute(queue, [], [], waits, signals)
                return buffer
            if tracing.ENABLED:
                return tracing.call("queue_alloca", self._queue_alloca, queue, size, memory_type, usage, waits,
                                    signals, device=self.info.uri, size=size)
            return self._queue_alloca(queue, size, memory_type, usage, waits, signals)

    def queue_dealloca(self, buffer: Buffer, wait: Sequence[Fence] = (),
                       signal: Sequence[Fence] = (), *, queue: int = 0) -> None:
        """Release ``buffer`` once ``wait`` is reached; ``signal`` follows the release."""
        self.check_open()
        queue = self._check_queue(queue)
        self._check_own_buffer(buffer, "dealloca buffer")
        if buffer.root is not buffer:
            raise InvalidArgumentError("queue_dealloca takes a root buffer, not a subspan")
        waits, signals = self._check_submission(wait, signal)
        with self.submission_gate:
            self.check_open()
            if tracing.ENABLED:
                tracing.call("queue_dealloca", self._queue_dealloca, queue, buffer, waits, signals,
                             device=self.info.uri)
            else:
                self._queue_dealloca(queue, buffer, waits, signals)

    def wait_idle(self, timeout: float | None = None) -> None:
        """Block until all submitted work completed; DeadlineExceededError after ``timeout``."""
        self.check_open()
        if tracing.ENABLED:
            tracing.call("wait_idle", self._wait_idle, deadline_from(timeout), device=self.info.uri)
        else:
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

    def _prepare_execution(self, queue: int, command_buffers: list[CommandBuffer],
                           binding_tables: list[list[Binding] | None]) -> Issue:
        """What issues a prepared execution: ``issue(waits, signals)``. By default each submit is a
        ``_queue_execute``; a driver that can do part of the work once (pick the queue's objects,
        the graph for the tables) returns its own callable."""
        return functools.partial(self._queue_execute, queue, command_buffers, binding_tables)

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
        state = " closed" if self.closed else ""
        return f"<hal.Device {self.info.uri} {self.info.name!r}{state}>"
