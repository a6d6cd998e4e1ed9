"""The GPU-generic device: it composes the machinery of each concern, in a module named for it.

- ``context.GpuContext``: the bottom layer every part below shares: the vendor API and
  context, make-current, the lost state after a sticky fault, releases from any thread;
- ``queue.GpuQueue``: a stream per queue; issue (device waits, commands, one event)
  and in-order retirement of what was issued on it;
- ``pending_queue.PendingQueue``: submissions waiting for values nothing has
  signalled yet (wait-before-signal), issued by whichever thread reaches them;
- ``completion.Completion``: retiring a submission (signals advance or fail,
  resources released), deferred frees, ``wait_idle`` and the completion thread;
- ``event_pool.EventPool``, ``staging.StagingPool``, ``allocator.GpuAllocator``
  (``allocator.LiveMemory``: the allocations not freed yet), ``modules.LoadedModules``;
- ``teardown.DeviceTeardown``: releasing all of the above, at close or, for a device
  dropped without close, from its finalizer;
- ``event_semaphore.EventSemaphore``: timeline semaphores with device timepoints.

Submission path (``queue_execute``, ``queue_barrier``, ``queue_alloca``,
``queue_dealloca``): the submission is numbered and counted as outstanding; if
every wait is issuable (reached, or signalled by work already issued) it is
issued on its queue at once, else parked in the pending queue. A host wait
blocks on the covering submission's event and retires through it on its own
thread; the completion thread retires what nobody waits for.

A sticky device fault marks the device lost: every later submission fails its
semaphores with the same ``DeviceLostError``, so nothing waits forever.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from hal import interrupts
from hal.buffer import Buffer
from hal.checks import check_queue
from hal.command_buffer import Binding, CommandBuffer
from hal.device import Device
from hal.drivers.gpu.allocator import DEVICE_MEMORY, Allocation, GpuAllocator, LiveMemory, wants_host_memory
from hal.drivers.gpu.api import GpuApi
from hal.drivers.gpu.completion import Completion
from hal.drivers.gpu.context import GpuContext
from hal.drivers.gpu.event_pool import EventPool
from hal.drivers.gpu.event_semaphore import EventSemaphore
from hal.drivers.gpu.executable_cache import ExecutableCache
from hal.drivers.gpu.execution import GpuExecution
from hal.drivers.gpu.graph_command_buffer import INDIRECT_AFTER_REBINDS, JOIN_KINDS, GraphCommandBuffer
from hal.drivers.gpu.library import Capturer
from hal.drivers.gpu.library import prepare as prepare_library
from hal.drivers.gpu.modules import LoadedModules
from hal.drivers.gpu.pending_queue import PendingQueue
from hal.drivers.gpu.queue import GpuQueue
from hal.drivers.gpu.staging import StagingPool
from hal.drivers.gpu.stream_command_buffer import StreamCommandBuffer
from hal.drivers.gpu.teardown import DeviceTeardown
from hal.errors import FailedPreconditionError, InvalidArgumentError
from hal.executable import Executable, ExecutableSpec
from hal.semaphore import Fence, Semaphore
from hal.types import BufferUsage, CommandBufferMode, MemoryType

COMMAND_BUFFER_MODES = ("auto", "graph", "stream")
#: With indirect_bindings="auto", graphs with at least this many slot-bound dispatches use indirect bindings.
INDIRECT_MIN_DISPATCHES = 16
#: Bytes the stream-ordered memory pool keeps reserved instead of returning them to the driver.
POOL_RELEASE_THRESHOLD = 1 << 30


def parse_options(options: dict[str, Any]) -> dict[str, Any]:
    """Device options common to the GPU drivers; InvalidArgumentError for unknown ones."""
    options = dict(options)
    parsed = {
        "command_buffer": options.pop("command_buffer", "auto"),
        "barrier_lowering": options.pop("barrier_lowering", "auto"),
        "queue_count": options.pop("queue_count", 1),
        "indirect_bindings": options.pop("indirect_bindings", "auto"),
    }
    if options:
        raise InvalidArgumentError(
            f"unknown device options {sorted(options)}; known: command_buffer ({'|'.join(COMMAND_BUFFER_MODES)}), "
            f"barrier_lowering (auto|{'|'.join(JOIN_KINDS)}), queue_count, indirect_bindings")
    if parsed["command_buffer"] not in COMMAND_BUFFER_MODES:
        raise InvalidArgumentError(
            f"command_buffer must be one of {COMMAND_BUFFER_MODES}, got {parsed['command_buffer']!r}")
    if parsed["barrier_lowering"] not in ("auto", *JOIN_KINDS):
        raise InvalidArgumentError(
            f"barrier_lowering must be one of {('auto', *JOIN_KINDS)}, got {parsed['barrier_lowering']!r}")
    if parsed["indirect_bindings"] not in ("auto", True, False):
        raise InvalidArgumentError(
            f"indirect_bindings must be 'auto', True or False, got {parsed['indirect_bindings']!r}")
    count = parsed["queue_count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidArgumentError(f"queue_count must be an int >= 1, got {count!r}")
    return parsed


class GpuDevice(Device):
    """A device on one GPU context: the vendor API (``api``), the context, the launch limits and
    the executable cache are handed in by the driver (``hal/drivers/cuda/device.py``)."""

    def __init__(self, driver, info, *, api: GpuApi, handle: Any, context: Any, options: dict[str, Any],
                 limits: dict[str, Any], memory_bytes: int, memory_pools: bool, executables: ExecutableCache) -> None:
        options = parse_options(options)
        super().__init__(driver, info, queue_count=options["queue_count"], limits=limits)
        #: The vendor API, context and lost state every part below shares (hal/drivers/gpu/context.py).
        self.gpu = GpuContext(api, handle, context, info.uri, info.driver)
        self.api = api
        self.handle = handle
        self.context = context
        self.executables = executables
        self.executable_formats = executables.formats + (("library",) if executables.libraries is not None else ())
        self.command_buffer_mode: str = options["command_buffer"]
        self.barrier_lowering: str = options["barrier_lowering"]
        # One device table per command buffer: with several queues a buffer could run on two at once.
        self.indirect_bindings: str | bool = options["indirect_bindings"] if self.queue_count == 1 else False
        self.make_current()
        self.events = EventPool(api)
        self.staging = StagingPool(api)
        self.completion = Completion(self.gpu)
        memory = LiveMemory(self.gpu)
        self.allocator = GpuAllocator(self, memory, self.completion, memory_bytes)
        self.memory_pools = memory_pools
        if memory_pools:
            api.configure_memory_pool(handle, POOL_RELEASE_THRESHOLD)
        self.pending = PendingQueue(self.completion)
        self.queues = [GpuQueue(self.gpu, self.completion, self.events, i) for i in range(self.queue_count)]
        self.completion.queues = self.queues
        #: Loaded modules not unloaded yet (an executable's are unloaded when it is collected).
        self.modules = LoadedModules(self.gpu)
        self._kept: list[Executable] = []  # executables the device itself uses for its whole life
        self._join_function: Any = None
        #: Captures library calls into graphs for graph command buffers (hal/drivers/gpu/library.py).
        self.capturer = Capturer(self.gpu)
        #: Graph command buffers' device objects, released at close if still alive.
        self.graph_resources: weakref.WeakSet = weakref.WeakSet()
        #: Releases the parts' driver objects, at close or, for a device dropped without close,
        #: from its finalizer (``hal/drivers/gpu/teardown.py``).
        self.teardown = DeviceTeardown(
            self.gpu, completion=self.completion, pending=self.pending, queues=self.queues, events=self.events,
            staging=self.staging, memory=memory, capturer=self.capturer, modules=self.modules,
            graph_resources=self.graph_resources)
        self._dropped = interrupts.finalize(self, self.teardown.run_apart)
        self._dropped.atexit = False  # (the process's end frees everything)
        self.completion.start()

    # -- context (the parts above the GpuContext: command buffers, executables, library calls) ----------
    def make_current(self) -> None:
        """Make this device's context current on the calling thread (a cheap check when it is)."""
        self.gpu.make_current()

    def check_usable(self) -> None:
        self.gpu.check_usable()

    @property
    def lost(self) -> BaseException | None:
        """The failure every submission reports once a GPU fault lost the device, or None."""
        return self.gpu.lost

    @property
    def closed_for_good(self) -> bool:
        """Whether the close released the device's objects (releases are skipped from then on)."""
        return self.gpu.closed_for_good

    def stream(self, queue: int) -> Any:
        """The stream of queue ``queue`` (None once the device is closed): for interop, work of other
        libraries ordered with the queue's."""
        return self.queues[check_queue(self, queue)].stream

    # -- objects -------------------------------------------------------------------------
    def _create_semaphore(self, initial_value: int) -> Semaphore:
        return EventSemaphore(self, initial_value)

    def _create_command_buffer(self, mode: CommandBufferMode, binding_capacity: int) -> CommandBuffer:
        kind = self.command_buffer_mode
        if kind == "auto":
            kind = "graph" if CommandBufferMode.REUSABLE in mode else "stream"
        cls = GraphCommandBuffer if kind == "graph" else StreamCommandBuffer
        return cls(self, mode, binding_capacity)

    def _prepare_executable(self, spec: ExecutableSpec) -> Executable:
        if spec.format == "library":
            return prepare_library(self, spec, self.executables.libraries)
        return self.executables.prepare(self, spec)

    def allocate_staging(self, size: int) -> Allocation:
        """Device memory for a graph command buffer's update payloads (not a user buffer)."""
        self.make_current()
        allocation = Allocation(self.api.mem_alloc(size), size, Allocation.DEVICE)
        self.allocator.track(allocation)
        return allocation

    def join_kernel_params(self) -> Any:
        """Kernel-node parameters of the no-op kernel joining graph levels."""
        if self._join_function is None:
            self._join_function = self.executables.join_function(self)
        return self.api.kernel_node_params(self._join_function, (1, 1, 1), (1, 1, 1), 0)

    def use_indirect_bindings(self, slot_dispatches: int, rebinds: int = 0) -> bool:
        """Whether a graph with this many dispatches through binding-table slots, rebound with new
        tables ``rebinds`` times so far, reads its bindings from a device table: always or never
        when the option says so; with "auto" from INDIRECT_MIN_DISPATCHES dispatches or
        INDIRECT_AFTER_REBINDS rebinds on (below that, updating the few nodes a new table changes
        costs less than compiling the kernels' indirect variants the first time)."""
        if self.indirect_bindings == "auto":
            return slot_dispatches >= INDIRECT_MIN_DISPATCHES or rebinds >= INDIRECT_AFTER_REBINDS
        return bool(self.indirect_bindings)

    def indirect_function(self, executable: Any, ordinal: int) -> Any:
        """The export's variant reading binding addresses from a device table, or None."""
        if not self.indirect_bindings:
            return None
        functions = executable.indirect
        if functions is None:
            functions = executable.indirect = self.executables.indirect_functions(self, executable)
        return functions[ordinal] if functions else None

    # -- host transfers ----------------------------------------------------------------------
    def _write(self, buffer: Buffer, offset: int, data: memoryview) -> None:
        import numpy as np

        self.check_usable()
        allocation: Allocation = buffer.allocation
        source = np.frombuffer(data, dtype=np.uint8)
        start = buffer.offset + offset
        if allocation.kind == Allocation.HOST:
            import ctypes

            ctypes.memmove(allocation.host + start, source.ctypes.data, len(source))
            return
        self.make_current()
        self.api.memcpy_htod(allocation.ptr + start, source.ctypes.data, len(source))

    def _read(self, buffer: Buffer, offset: int, length: int) -> bytes:
        import ctypes

        self.check_usable()
        allocation: Allocation = buffer.allocation
        start = buffer.offset + offset
        if allocation.kind == Allocation.HOST:
            return ctypes.string_at(allocation.host + start, length)
        out = ctypes.create_string_buffer(length)
        self.make_current()
        self.api.memcpy_dtoh(ctypes.addressof(out), allocation.ptr + start, length)
        return out.raw

    # -- submissions -------------------------------------------------------------------------
    def _prepare_execution(self, queue: int, command_buffers: list[CommandBuffer],
                           binding_tables: list[list[Binding] | None]) -> Callable[[list, list], None]:
        return GpuExecution(self.queues[queue], self.completion, self.pending, command_buffers, binding_tables).issue

    def _queue_execute(self, queue: int, command_buffers: list[CommandBuffer],
                       binding_tables: list[list[Binding] | None], waits: list[Fence],
                       signals: list[Fence]) -> None:
        self._prepare_execution(queue, command_buffers, binding_tables)(waits, signals)

    def _queue_alloca(self, queue: int, size: int, memory_type: MemoryType, usage: BufferUsage,
                      waits: list[Fence], signals: list[Fence]) -> Buffer:
        if wants_host_memory(memory_type) or not self.memory_pools:
            buffer = self.allocator.allocate(size, memory_type, usage)
        else:
            self.check_usable()
            self.make_current()
            q = self.queues[queue]
            # Allocated now in stream order: the signal's event, recorded later on this stream, follows it.
            with q.lock:
                if q.closed:
                    raise FailedPreconditionError(f"device {self.info.uri} is closed")
                ptr = self.api.mem_alloc_async(size, q.stream)
            allocation = Allocation(ptr, size, Allocation.POOL, stream=q.stream)
            self.allocator.track(allocation)
            buffer = self.allocator.wrap(allocation, size, DEVICE_MEMORY, usage)
        self._submit(queue, [], [], waits, signals, None)
        return buffer

    def _queue_dealloca(self, queue: int, buffer: Buffer, waits: list[Fence], signals: list[Fence]) -> None:
        def release(q: GpuQueue) -> None:
            allocation: Allocation = buffer.allocation
            if allocation.kind == Allocation.POOL:
                # Stream-ordered: the free follows everything issued on this stream so far.
                allocation.free_stream = q.stream
            buffer.release()

        self._submit(queue, [], [], waits, signals, release)

    def _submit(self, queue: int, command_buffers: list[CommandBuffer], tables: list[list[Binding] | None],
                waits: list[Fence], signals: list[Fence], action: Callable[[GpuQueue], None] | None) -> None:
        GpuExecution(self.queues[queue], self.completion, self.pending, command_buffers, tables, action).issue(
            waits, signals)

    def _cancel_parked(self, cause: BaseException) -> None:
        self.pending.close(cause)
        collectives = self.collectives
        if collectives is not None and hasattr(collectives, "device_closing"):
            collectives.device_closing()  # (before the wait for idle: no NCCL kernel keeps a stream waiting)

    # -- completion ------------------------------------------------------------------------
    def retire_completed(self, blocking: bool = True) -> None:
        """Retire what completed on every queue (``blocking=False``: skip queues another thread retires)."""
        for q in self.queues:
            q.retire_completed(blocking)

    def wake_completion(self) -> None:
        self.completion.wake()

    def catch_up(self) -> None:
        """Do what a notification that a KeyboardInterrupt cut short would have done: retire the
        work that completed, issue the parked work whose waits are issuable. A waiter that waits in
        vain calls this after each slice of its wait (``hal.semaphore.RECHECK_SECONDS``)."""
        self.retire_completed(blocking=False)
        self.pending.recheck()

    def _wait_idle(self, deadline: float | None) -> None:
        self.completion.wait_idle(deadline, self.pending.recheck)

    # -- deferred releases ---------------------------------------------------------------------
    def defer(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once every submission made so far has completed (now if none is outstanding)."""
        self.completion.defer_release(fn)

    def release_later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Release a resource from any thread (a finalizer): skipped once the device is closed."""
        self.gpu.release_later(fn, *args)

    # -- close ------------------------------------------------------------------------------------
    def keep_loaded(self, executable: Executable) -> None:
        """Keep an executable the device uses itself (the join kernel) loaded until it closes."""
        self._kept.append(executable)

    def _close(self) -> None:
        self._dropped.detach()
        self.teardown.run(FailedPreconditionError(f"device {self.info.uri} was closed"))
        self._kept = []
