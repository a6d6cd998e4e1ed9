"""Library routines on a GPU: vendor-library calls recorded into command buffers.

A vendor driver hands its ``ExecutableCache`` its ``LibraryBackends``: a ``LibraryBackend`` per
routine kind whose library's bindings import (cuBLASLt for CUDA's GEMMs, hipBLASLt for HIP's); the
device then lists the ``library`` format. What is written
once here, for every vendor:

- ``LibraryExecutable``: the executable of a ``library`` spec (``hal.library``). It has no
  ``functions``: nothing can launch it as a kernel.
- ``LibraryCall``: one recorded routine with its operands as ``Target`` (fixed addresses or
  binding-table slots) and its own workspace, taken from the device's memory through the
  allocator and grown to what the plan for the bound addresses asks. A command buffer's calls
  never share a workspace, so calls of one graph level may run concurrently, except those sharing
  a library handle's internal state (a solver's, an FFT plan's: ``serial_key``), which a graph
  command buffer orders one after another.
- ``issue`` (stream command buffers: the call enqueued on the queue's stream) and ``capture``
  (graph command buffers: the call captured on the device's capture stream into a graph the
  caller adds as a child-graph node, or sets in place on an executable graph after a rebind).

The backend plans a call once per (routine, shape, alignment of the bound addresses) and caches
the plan, so a re-issue or a re-capture costs the library call itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hal.command_buffer import Binding
from hal.errors import IncompatibleError, UnavailableError, UnimplementedError
from hal.executable import Executable, ExecutableSpec
from hal.library import Routine
from hal.log import driver_logger

if TYPE_CHECKING:
    from hal.drivers.gpu.context import GpuContext
    from hal.drivers.gpu.device import GpuDevice
    from hal.drivers.gpu.recording import Target


class LibraryBackend(Protocol):
    """A vendor library behind the ``library`` format (one per device)."""

    #: The library and its version, for messages ("cuBLASLt 13.1.0").
    name: str

    def supports(self, routine: Routine) -> str | None:
        """None when the backend runs ``routine``, else why not (the executable is then refused)."""

    def plan(self, routine: Routine, checked: Any, pointers: Sequence[int]) -> Any:
        """The call's plan with operands at ``pointers`` (made once, then cached), its
        ``workspace_size`` the bytes of workspace it needs; ``checked`` is what ``routine.check``
        made of the dispatch's constants."""

    def capturable(self, routine: Routine, checked: Any) -> bool:
        """Whether the call can be captured into a graph: False for one that waits on the device
        while it is enqueued (reading a convergence flag, say); graph command buffers issue such a
        call on the stream instead."""

    def serial_key(self, routine: Routine, checked: Any) -> Hashable | None:
        """What the call's device work shares with other calls beyond its own operands and
        workspace (a library handle's internal buffers, say), or None when it shares nothing. Calls
        with equal keys never run concurrently: a graph command buffer orders those of one level."""

    def enqueue(self, plan: Any, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        """Enqueue the planned call on ``stream`` (also while the stream captures into a graph,
        when ``capturable``)."""


class DeferredBackend:
    """A device's backend of one library until its first routine: ``make()`` loads the library and
    makes its handle then (with the device current), not when the device is created (a library of
    hundreds of MB, and the runtime it starts). A library that fails to load refuses every routine
    with the reason (``supports``: the runtime then takes its own kernels or raises), and
    ``report`` is told once."""

    def __init__(self, name: str, make: Callable[[], LibraryBackend],
                 report: Callable[[BaseException], None]) -> None:
        self._name, self._make, self._report = name, make, report
        self._backend: LibraryBackend | None = None
        self._failure: str | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._backend.name if self._backend is not None else self._name

    def backend(self) -> LibraryBackend:
        if self._backend is None:
            with self._lock:
                if self._backend is None and self._failure is None:
                    try:
                        self._backend = self._make()
                    except Exception as exc:  # a missing library, a failing handle creation
                        self._failure = f"{type(exc).__name__}: {exc}"
                        self._report(exc)
        if self._backend is None:
            raise UnavailableError(f"{self._name} could not be loaded: {self._failure}")
        return self._backend

    def supports(self, routine: Routine) -> str | None:
        try:
            return self.backend().supports(routine)
        except UnavailableError as exc:
            return str(exc)

    def plan(self, routine: Routine, checked: Any, pointers: Sequence[int]) -> Any:
        return self.backend().plan(routine, checked, pointers)

    def capturable(self, routine: Routine, checked: Any) -> bool:
        return self.backend().capturable(routine, checked)

    def serial_key(self, routine: Routine, checked: Any) -> Hashable | None:
        return self.backend().serial_key(routine, checked)

    def enqueue(self, *args: Any) -> None:
        self.backend().enqueue(*args)


class VendorLibrary:
    """A vendor library of one driver (cuBLASLt, cuFFT, hipSOLVER, ...): its backend per device ordinal,
    made once, and why it is unavailable, logged once per process as
    "<name> is unavailable (<error>): <consequence>"."""

    def __init__(self, driver: str, name: str, consequence: str) -> None:
        self.driver, self.name, self.consequence = driver, name, consequence
        self._backends: dict[int, Any] = {}
        self._reported: list[BaseException] = []
        self._lock = threading.Lock()

    def report(self, exc: BaseException) -> None:
        """Log why the library is unavailable (the first reason only)."""
        if not self._reported:
            self._reported.append(exc)
            driver_logger(self.driver).warning("%s is unavailable (%s: %s): %s", self.name, type(exc).__name__, exc,
                                               self.consequence)

    def load(self, ordinal: int, bindings: Callable[[], Any],
             make: Callable[[Any], LibraryBackend]) -> DeferredBackend | None:
        """Device ``ordinal``'s backend, made by ``make(bindings())`` at its first routine
        (``DeferredBackend``); None when ``bindings()`` (the import of the library's Python
        bindings) fails, the reason reported."""
        with self._lock:
            backend = self._backends.get(ordinal)
            if backend is None:
                try:
                    module = bindings()
                except Exception as exc:  # not installed, or its bindings fail to import
                    self.report(exc)
                    return None
                backend = self._backends[ordinal] = DeferredBackend(self.name, lambda: make(module), self.report)
            return backend

    def load_now(self, ordinal: int, make: Callable[[], Any]) -> Any:
        """Device ``ordinal``'s backend made now by ``make()`` (kept once made); None when that fails,
        the reason reported."""
        with self._lock:
            backend = self._backends.get(ordinal)
            if backend is None:
                try:
                    backend = self._backends[ordinal] = make()
                except Exception as exc:  # an import error, a missing library, a failing handle creation
                    self.report(exc)
            return backend


class Planned:
    """A plan of one of ``LibraryBackends``' backends, with the backend that made it."""

    __slots__ = ("backend", "plan", "workspace_size")

    def __init__(self, backend: LibraryBackend, plan: Any) -> None:
        self.backend, self.plan = backend, plan
        self.workspace_size: int = plan.workspace_size


class LibraryBackends:
    """A device's library backends by routine kind (``Routine.kind``: cuBLASLt for "gemm", ...),
    itself the device's ``LibraryBackend``: each routine goes to its kind's library."""

    def __init__(self, backends: dict[str, LibraryBackend]) -> None:
        self.backends = dict(backends)
        self.name = ", ".join(dict.fromkeys(backend.name for backend in self.backends.values()))  # (each library once)

    @classmethod
    def of(cls, backends: dict[str, LibraryBackend | None]) -> LibraryBackends | None:
        """The backends that loaded (None: a library missing here, its reason logged where it
        failed); None when none did, and the device then lacks the ``library`` format."""
        loaded = {kind: backend for kind, backend in backends.items() if backend is not None}
        return cls(loaded) if loaded else None

    def supports(self, routine: Routine) -> str | None:
        backend = self.backends.get(routine.kind)
        if backend is None:
            return f"no library runs {routine.kind!r} routines on this device (it has {self.name})"
        return backend.supports(routine)

    def plan(self, routine: Routine, checked: Any, pointers: Sequence[int]) -> Planned:
        backend = self.backends[routine.kind]
        return Planned(backend, backend.plan(routine, checked, pointers))

    def capturable(self, routine: Routine, checked: Any) -> bool:
        return self.backends[routine.kind].capturable(routine, checked)

    def serial_key(self, routine: Routine, checked: Any) -> Hashable | None:
        return self.backends[routine.kind].serial_key(routine, checked)

    def enqueue(self, plan: Planned, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        plan.backend.enqueue(plan.plan, constants, pointers, workspace, workspace_size, stream)


class LibraryExecutable(Executable):
    """The routines of a ``library`` spec on a GPU device and the backend that runs them."""

    def __init__(self, device: GpuDevice, spec: ExecutableSpec, backend: LibraryBackend) -> None:
        super().__init__(device, spec)
        self.backend = backend


def prepare(device: GpuDevice, spec: ExecutableSpec, backend: LibraryBackend | None) -> LibraryExecutable:
    """The executable of a ``library`` spec; IncompatibleError without a backend, UnimplementedError
    (with the backend's reason) for a routine it does not run."""
    if backend is None:
        raise IncompatibleError(f"device {device.info.uri} has no library backend for 'library' executables")
    executable = LibraryExecutable(device, spec, backend)
    for export, routine in zip(spec.exports, executable.routines or ()):
        reason = backend.supports(routine)
        if reason is not None:
            raise UnimplementedError(f"library export {export.name!r}: {backend.name} cannot run {routine}: {reason}")
    return executable


class Workspace:
    """A library call's device workspace (allocations of the device, freed with the command buffer).

    A plan for other operand addresses may need more: a larger allocation is added, and the
    smaller ones stay until the command buffer goes, since graphs captured with them (a recurring
    table's executable graph) may still run them.
    """

    __slots__ = ("allocations",)

    def __init__(self) -> None:
        self.allocations: list[Any] = []

    def ensure(self, device: GpuDevice, size: int) -> tuple[int, int]:
        """(address, size) of at least ``size`` bytes (0, 0 when none is needed and none was made)."""
        allocations = self.allocations
        if size and (not allocations or allocations[-1].size < size):
            allocations.append(device.allocate_staging(size))
        if not allocations:
            return 0, 0
        return allocations[-1].ptr, allocations[-1].size

    def release(self, device: GpuDevice) -> None:
        allocations, self.allocations = self.allocations, []
        for allocation in allocations:
            device.allocator.free_now(allocation)


#: ``LibraryCall._prepared``'s table where the call's operands are fixed addresses.
_ANY_TABLE = object()


class LibraryCall:
    """A recorded library routine: its operands, its constants' checked form and its workspace."""

    __slots__ = ("backend", "routine", "checked", "constants", "targets", "workspace", "empty", "capturable",
                 "serial_key", "_prepared")

    def __init__(self, backend: LibraryBackend, routine: Routine, checked: Any, constants: tuple[int, ...],
                 targets: list[Target], empty: bool) -> None:
        self.backend = backend
        self.routine = routine
        self.checked = checked
        self.constants = constants
        self.targets = targets
        self.workspace = Workspace()
        #: A call with no output (a zero-size product): recorded, never enqueued.
        self.empty = empty
        #: Whether graph command buffers can capture it (``LibraryBackend.capturable``).
        self.capturable = empty or backend.capturable(routine, checked)
        #: Calls of one graph level with the same key run one after another (``LibraryBackend.serial_key``).
        self.serial_key = None if empty else backend.serial_key(routine, checked)
        #: (table, ``prepare``'s result for it) of the last issue, one tuple so that a thread reads a
        #: consistent pair while another replaces it (the table is ``_ANY_TABLE`` where no operand goes
        #: through a binding-table slot). Re-issued with the same table object (a prepared execution
        #: hands its one checked table at every submission), the call resolves nothing again
        #: (addresses, plan, workspace).
        self._prepared: tuple[object, tuple[Any, list[int], int, int]] | None = None

    @property
    def slots(self) -> set[int]:
        return {target.slot for target in self.targets if target.slot is not None}

    def pointers(self, table: Sequence[Binding] | None) -> list[int]:
        addresses = []
        for target in self.targets:
            address, _ = target.resolve(table)
            addresses.append(address)
        return addresses

    def prepare(self, device: GpuDevice, table: Sequence[Binding] | None) -> tuple[Any, list[int], int, int]:
        """(plan, operand addresses, workspace address, workspace size) against ``table``: the plan
        is made and the workspace allocated here, never while a stream captures."""
        pointers = self.pointers(table)
        plan = self.backend.plan(self.routine, self.checked, pointers)
        workspace, capacity = self.workspace.ensure(device, plan.workspace_size)
        return plan, pointers, workspace, capacity

    def enqueue(self, prepared: tuple[Any, list[int], int, int], stream: Any) -> None:
        plan, pointers, workspace, capacity = prepared
        self.backend.enqueue(plan, self.constants, pointers, workspace, capacity, stream)

    def issue(self, device: GpuDevice, stream: Any, table: Sequence[Binding] | None) -> None:
        """Enqueue the call on ``stream`` with its operands resolved against ``table``."""
        if self.empty:
            return
        last = self._prepared
        if last is not None and (last[0] is table or last[0] is _ANY_TABLE):
            prepared = last[1]
        else:  # (the targets are all recorded by the first issue: collectives add theirs while recording)
            prepared = self.prepare(device, table)
            self._prepared = (table if self.slots else _ANY_TABLE, prepared)
        self.enqueue(prepared, stream)


class Capturer:
    """Captures library calls into graphs on one private stream per device (one capture at a time).
    It holds the device's context, not the device: the device's close, or its finalizer, destroys
    the stream (``release``)."""

    def __init__(self, context: GpuContext) -> None:
        self.context = context
        self._lock = threading.Lock()
        self._stream: Any = None
        #: Routines whose capture a graph could not hold as a child node (see ``refuse``).
        self._refused: set[Routine] = set()

    def holds(self, call: LibraryCall) -> bool:
        """Whether a child-graph node can hold the call's capture (not refused before)."""
        return call.routine not in self._refused

    def refuse(self, call: LibraryCall) -> None:
        """The call's capture held nodes a child graph may not (memory the library allocated while
        captured): its routine is issued on the stream from now on, on this device."""
        self._refused.add(call.routine)

    def capture(self, device: GpuDevice, call: LibraryCall, table: Sequence[Binding] | None) -> Any:
        """A new graph holding ``call`` with operands from ``table`` (the caller destroys it)."""
        context = self.context
        api = context.api
        with self._lock:
            context.make_current()
            prepared = call.prepare(device, table)
            if self._stream is None:
                self._stream = api.stream_create()
            stream = self._stream
            api.stream_begin_capture(stream)
            try:
                call.enqueue(prepared, stream)
            except BaseException:
                api.graph_destroy(api.stream_end_capture(stream))  # the capture must end on this stream
                raise
            return api.stream_end_capture(stream)

    def release(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            self.context.api.stream_destroy(stream)
