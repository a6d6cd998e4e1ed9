"""The GPU-generic device: queues as streams, the pending-action queue and the completion thread.

Submission path (``queue_execute``, ``queue_barrier``, ``queue_alloca``, ``queue_dealloca``):

1. The submission gets a sequence number and is counted as outstanding.
2. Its waits are resolved through the core's ``FenceWaiter`` over *issuable*
   views of the semaphores: a wait is issuable once its value is reached on
   the host or a device timepoint covers it. Until then the submission is
   parked (wait-before-signal) and ``queue_execute`` returns at once.
3. Once issuable, the submission is issued on its queue's stream, in the
   order submissions became ready: device waits (``stream_wait_event``), the
   commands, then one event recorded as the timepoint of every signal.
   Issuing can make parked work issuable; a per-thread trampoline turns that
   into a loop rather than a recursion.
4. Issued submissions are retired in issue order once their event completed:
   the signalled semaphores advance (or, on a device fault, fail), what the
   submission held is released and deferred frees whose submissions all
   completed run. A host wait retires its own work right after blocking on
   (or polling) its event. The completion thread retires whatever nobody
   waits for, every RETIRE_DELAY while it is awake. It sleeps while nothing
   needs it and is woken only when something does: a host listener on a
   semaphore (``hal.wait_any``), a deferred free, or WAKE_INFLIGHT submissions
   in flight. A thread that submits and waits in a loop therefore never wakes
   it: measured on an H100 host, waking it each round trip (a system call and
   a GIL hand-over) cost more than the rest of the round trip's bookkeeping,
   and even a thread merely polling every millisecond slowed every round trip.

A sticky device fault marks the device lost: every later submission fails its
semaphores with the same ``DeviceLostError``, so nothing waits forever.
"""

from __future__ import annotations

import collections
import queue as queue_module
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from hal.buffer import Buffer
from hal.command_buffer import Binding, CommandBuffer
from hal.device import Device
from hal.drivers.gpu.allocator import DEVICE_MEMORY, Allocation, GpuAllocator, wants_host_memory
from hal.drivers.gpu.api import GpuApi
from hal.drivers.gpu.event_semaphore import EventPool, EventSemaphore, Issuable, Timepoint, poll_event
from hal.drivers.gpu.executable_cache import ExecutableCache
from hal.drivers.gpu.graph_command_buffer import JOIN_KINDS, GraphCommandBuffer
from hal.drivers.gpu.staging import StagingPool
from hal.drivers.gpu.status import DeviceLostError
from hal.drivers.gpu.stream_command_buffer import StreamCommandBuffer
from hal.errors import DeadlineExceededError, HalError, InvalidArgumentError
from hal.executable import Executable, ExecutableSpec
from hal.semaphore import Fence, FenceWaiter, Semaphore, remaining
from hal.types import BufferUsage, CommandBufferMode, MemoryType

COMMAND_BUFFER_MODES = ("auto", "graph", "stream")
#: How long the completion thread leaves in-flight work to host waiters before retiring it itself:
#: waiters retire their own work at once; the thread mostly releases what nobody waits for.
RETIRE_DELAY = 1e-3
#: Submissions in flight that wake the sleeping completion thread even when nothing waits for
#: them (their events, staging blocks and deferred frees go back to their pools once retired).
WAKE_INFLIGHT = 32
#: With indirect_bindings="auto", graphs with at least this many slot-bound dispatches use indirect bindings.
INDIRECT_MIN_DISPATCHES = 16
#: Bytes the stream-ordered memory pool keeps reserved instead of returning them to the driver.
POOL_RELEASE_THRESHOLD = 1 << 30

#: Per thread: the issue trampoline (submissions made issuable while this thread issues one).
_thread = threading.local()


class Queue:
    __slots__ = ("index", "stream", "lock")

    def __init__(self, index: int, stream: Any) -> None:
        self.index = index
        self.stream = stream
        self.lock = threading.Lock()


class Submission:
    __slots__ = ("device", "queue", "command_buffers", "tables", "waits", "signals", "action", "seq",
                 "timepoint", "resources")

    def __init__(self, device: GpuDevice, queue: int, command_buffers: list[CommandBuffer],
                 tables: list[list[Binding] | None], waits: list[Fence], signals: list[Fence],
                 action: Callable[[Queue], None] | None = None) -> None:
        self.device = device
        self.queue = queue
        self.command_buffers = command_buffers
        self.tables = tables
        self.waits = waits
        self.signals = signals
        self.action = action
        self.seq = 0
        self.timepoint: Timepoint | None = None
        #: Released when the submission retires (staging memory of its commands).
        self.resources: list[Callable[[], Any]] = []


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
        self.api = api
        self.handle = handle
        self.context = context
        self.executables = executables
        self.executable_formats = executables.formats
        self.command_buffer_mode: str = options["command_buffer"]
        self.barrier_lowering: str = options["barrier_lowering"]
        # One device table per command buffer: with several queues a buffer could run on two at once.
        self.indirect_bindings: str | bool = options["indirect_bindings"] if self.queue_count == 1 else False
        self.closed_for_good = False
        self.lost: BaseException | None = None
        self.make_current()
        self._queues = [Queue(i, api.stream_create()) for i in range(self.queue_count)]
        self.events = EventPool(api)
        self.staging = StagingPool(api)
        self.allocator = GpuAllocator(self, memory_bytes)
        self.memory_pools = memory_pools
        if memory_pools:
            api.configure_memory_pool(handle, POOL_RELEASE_THRESHOLD)
        #: Guards the submission bookkeeping (_outstanding, _deferred, _parked); _idle is its condition.
        self._state_lock = threading.RLock()
        self._idle = threading.Condition(self._state_lock)
        self._idle_waiters = 0
        self._outstanding: collections.OrderedDict[int, Submission] = collections.OrderedDict()
        self._next_seq = 1
        self._deferred: collections.deque[tuple[int, Callable[[], Any]]] = collections.deque()
        self._parked: dict[int, FenceWaiter] = {}
        self._modules: list[Any] = []
        self._join_function: Any = None
        #: Graph command buffers' device objects, released at close if still alive.
        self.graph_resources: weakref.WeakSet = weakref.WeakSet()
        self._completion_inbox: queue_module.SimpleQueue = queue_module.SimpleQueue()
        #: Issued submissions not yet retired, in issue order.
        self._inflight: collections.deque[Submission] = collections.deque()
        self._retire_lock = threading.Lock()
        self._completion_lock = threading.Lock()
        self._completion_idle = False
        self._stopping = False
        self._completion = threading.Thread(target=self._completion_loop, name=f"hal-{info.driver}-completion",
                                            daemon=True)
        self._completion.start()

    # -- context -----------------------------------------------------------------------
    def make_current(self) -> None:
        """Make this device's context current on the calling thread (a cheap check when it is)."""
        self.api.activate(self.context)

    def check_usable(self) -> None:
        if self.lost is not None:
            raise self.lost

    def stream(self, queue: int) -> Any:
        return self._queues[queue].stream

    # -- objects -------------------------------------------------------------------------
    def _create_semaphore(self, initial_value: int) -> Semaphore:
        return EventSemaphore(self, initial_value)

    def _create_command_buffer(self, mode: CommandBufferMode, binding_capacity: int) -> CommandBuffer:
        kind = self.command_buffer_mode
        if kind == "auto":
            kind = "graph" if CommandBufferMode.REUSABLE in mode else "stream"
        cls = GraphCommandBuffer if kind == "graph" else StreamCommandBuffer
        return cls(self, mode, binding_capacity)

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

    def use_indirect_bindings(self, slot_dispatches: int) -> bool:
        """Whether a graph with this many dispatches through binding-table slots reads its bindings
        from a device table: always or never when the option says so; with "auto" from
        INDIRECT_MIN_DISPATCHES on (below that, updating the few nodes a new table changes costs
        less than compiling the kernels' indirect variants the first time)."""
        if self.indirect_bindings == "auto":
            return slot_dispatches >= INDIRECT_MIN_DISPATCHES
        return bool(self.indirect_bindings)

    def indirect_function(self, executable: Any, ordinal: int) -> Any:
        """The export's variant reading binding addresses from a device table, or None."""
        if not self.indirect_bindings:
            return None
        functions = executable.indirect
        if functions is None:
            functions = executable.indirect = self.executables.indirect_functions(self, executable)
        return functions[ordinal] if functions else None

    def _prepare_executable(self, spec: ExecutableSpec) -> Executable:
        return self.executables.prepare(self, spec)

    # -- host transfers ----------------------------------------------------------------------
    def _write(self, buffer: Buffer, offset: int, data: memoryview) -> None:
        import numpy as np

        self.check_usable()
        allocation: Allocation = buffer._allocation
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
        allocation: Allocation = buffer._allocation
        start = buffer.offset + offset
        if allocation.kind == Allocation.HOST:
            return ctypes.string_at(allocation.host + start, length)
        out = ctypes.create_string_buffer(length)
        self.make_current()
        self.api.memcpy_dtoh(ctypes.addressof(out), allocation.ptr + start, length)
        return out.raw

    # -- submissions -------------------------------------------------------------------------
    def _queue_execute(self, queue: int, command_buffers: list[CommandBuffer],
                       binding_tables: list[list[Binding] | None], waits: list[Fence],
                       signals: list[Fence]) -> None:
        for cb in command_buffers:
            if cb._roots:  # type: ignore[attr-defined]
                cb.check_submittable()  # type: ignore[attr-defined]
        self._submit(Submission(self, queue, command_buffers, binding_tables, waits, signals))

    def _queue_alloca(self, queue: int, size: int, memory_type: MemoryType, usage: BufferUsage,
                      waits: list[Fence], signals: list[Fence]) -> Buffer:
        if wants_host_memory(memory_type) or not self.memory_pools:
            buffer = self.allocator.allocate(size, memory_type, usage)
        else:
            self.check_usable()
            self.make_current()
            q = self._queues[queue]
            # Allocated now in stream order: the signal's event, recorded later on this stream, follows it.
            with q.lock:
                ptr = self.api.mem_alloc_async(size, q.stream)
            allocation = Allocation(ptr, size, Allocation.POOL, queue=queue)
            self.allocator.track(allocation)
            buffer = self.allocator.wrap(allocation, size, DEVICE_MEMORY, usage)
        self._submit(Submission(self, queue, [], [], waits, signals))
        return buffer

    def _queue_dealloca(self, queue: int, buffer: Buffer, waits: list[Fence], signals: list[Fence]) -> None:
        def release(q: Queue) -> None:
            allocation: Allocation = buffer._allocation
            if allocation.kind == Allocation.POOL:
                # Stream-ordered: the free follows everything issued on this stream so far.
                allocation.free_stream = q.stream
            buffer.release()

        self._submit(Submission(self, queue, [], [], waits, signals, release))

    def _submit(self, sub: Submission) -> None:
        with self._state_lock:
            sub.seq = seq = self._next_seq
            self._next_seq += 1
            self._outstanding[seq] = sub
        if self.lost is not None:
            self._finish(sub, self.lost)
            return
        if not sub.waits:
            self._ready(sub)
            return
        waiter = FenceWaiter([(Issuable(sem), value) for sem, value in sub.waits],  # type: ignore[misc]
                             lambda: self._unparked(sub, None), lambda exc: self._unparked(sub, exc))
        with self._state_lock:
            if not waiter.done:
                self._parked[seq] = waiter

    def _unparked(self, sub: Submission, failure: BaseException | None) -> None:
        with self._state_lock:
            self._parked.pop(sub.seq, None)
        if failure is None:
            self._ready(sub)
        else:  # the original failure travels on, as the core's drivers do
            self._finish(sub, failure)

    def _cancel_parked(self, cause: BaseException) -> None:
        with self._state_lock:
            parked, self._parked = self._parked, {}
        for waiter in parked.values():
            waiter.cancel(cause)

    @staticmethod
    def _ready(sub: Submission) -> None:
        """Issue ``sub`` now, or after the submission this thread is issuing (no recursion)."""
        pending = getattr(_thread, "pending", None)
        if pending is not None:
            pending.append(sub)
            return
        _thread.pending = pending = collections.deque()
        try:
            sub.device._issue(sub)
            while pending:
                item = pending.popleft()
                item.device._issue(item)
        finally:
            _thread.pending = None

    def _issue(self, sub: Submission) -> None:
        if self.lost is not None:
            self._finish(sub, self.lost)
            return
        waits = sub.waits
        for sem, _ in waits:
            if sem._failure is not None:  # failed after the submission became issuable
                self._finish(sub, sem._failure)
                return
        q = self._queues[sub.queue]
        api = self.api
        try:
            api.activate(self.context)
            with q.lock:
                stream = q.stream
                for sem, value in waits:
                    timepoint = sem._timepoint_for(value)  # type: ignore[attr-defined]
                    if timepoint is not None:
                        api.stream_wait_event(stream, timepoint.event)
                tables = sub.tables
                for i, cb in enumerate(sub.command_buffers):
                    cb.issue(q, tables[i], sub)  # type: ignore[attr-defined]
                if sub.action is not None:
                    sub.action(q)
                events = self.events
                event = events.acquire()
                try:
                    api.event_record(event, stream)
                except BaseException:
                    events.release(event)
                    raise
                sub.timepoint = timepoint = Timepoint(event, events)
                for sem, value in sub.signals:
                    sem._add_timepoint(value, timepoint)  # type: ignore[attr-defined]
        except BaseException as exc:  # nothing of it runs: its signals carry the failure
            if isinstance(exc, DeviceLostError):
                self._mark_lost(exc)
            self._finish(sub, self.lost or exc)
            return
        inflight = self._inflight
        inflight.append(sub)
        # Read after the append (the completion thread sets the flag before it looks at _inflight
        # again): a sleeping thread is woken when this work needs it, else it sees the work itself.
        if self._completion_idle:
            if len(inflight) >= WAKE_INFLIGHT or self._deferred:
                self.wake_completion()
            else:
                for sem, _ in sub.signals:
                    if sem._listeners:
                        self.wake_completion()
                        break
        if self._idle_waiters:
            with self._state_lock:
                self._idle.notify_all()

    # -- completion ------------------------------------------------------------------------
    def wake_completion(self) -> None:
        """Wake the completion thread if it sleeps (something needs in-flight work retired)."""
        if self._completion_idle:
            with self._completion_lock:
                if self._completion_idle:
                    self._completion_idle = False
                    self._completion_inbox.put(True)

    def _retire_completed(self, wait_for_lock: bool = True, known_done: Timepoint | None = None) -> None:
        """Retire, in issue order, every in-flight submission whose event completed.

        Called by the completion thread and by host waiters (so a waiter whose work is done
        need not wait for the completion thread); issue order keeps semaphore values
        consistent: a submission never appears complete before one issued ahead of it.
        ``wait_for_lock=False`` returns at once when another thread is retiring; ``known_done``
        is a timepoint whose event the caller saw complete (no need to query it again).

        With one queue, a stream runs its work in order: once a submission completed, every
        one issued before it did too, so those are retired without asking the driver (each
        query is a call that hands the GIL to whichever thread wants it).
        """
        inflight = self._inflight
        if not inflight or not self._retire_lock.acquire(blocking=wait_for_lock):
            return
        try:
            done_through = None  # with one queue: a submission known complete, and all before it
            if not inflight:  # another thread retired everything while this one waited for the lock
                return
            if self.queue_count == 1:
                if known_done is not None:
                    # By index: other threads append while this one looks (only the lock holder pops).
                    for i in range(min(len(inflight), 64)):
                        if inflight[i].timepoint is known_done:
                            done_through = inflight[i]
                            break
                elif len(inflight) > 1:
                    newest = inflight[-1]
                    try:
                        if self.api.event_query(newest.timepoint.event):  # type: ignore[union-attr]
                            done_through = newest
                    except HalError:
                        pass  # the queries below find and record the failure
            while inflight:
                sub = inflight[0]
                failure = None
                try:
                    if done_through is None:
                        timepoint = sub.timepoint
                        if timepoint is not known_done and not self.api.event_query(timepoint.event):  # type: ignore[union-attr]
                            return
                    elif sub is done_through:
                        done_through = None
                except HalError as exc:
                    if isinstance(exc, DeviceLostError):
                        self._mark_lost(exc)
                    failure = self.lost or exc
                inflight.popleft()
                try:
                    self._finish(sub, failure)
                except BaseException:  # keep retiring: one bad release must not stall every waiter
                    import traceback

                    traceback.print_exc()
        finally:
            self._retire_lock.release()

    def _completion_loop(self) -> None:
        """Retire in-flight work while awake; sleep once nothing is in flight (see the module docstring).

        Host waiters retire their own work first (``_wait_timepoint``); the thread
        lets them for ``RETIRE_DELAY`` before blocking on the oldest event.
        """
        inbox = self._completion_inbox
        inflight = self._inflight
        api = self.api
        self.make_current()
        while not (self.closed_for_good or self._stopping):
            if not inflight:
                self._completion_idle = True
                if inflight:  # issued after the check above: its submitter may have missed the flag
                    with self._completion_lock:
                        self._completion_idle = False
                    continue
                if not inbox.get():
                    return
                if self.closed_for_good or self._stopping:
                    return
                self.make_current()
                continue
            time.sleep(RETIRE_DELAY)
            self._retire_completed()
            try:
                sub = inflight[0]
            except IndexError:
                continue
            timepoint = sub.timepoint  # holding it keeps its event from being recycled
            if timepoint is not None:
                try:
                    api.event_synchronize(timepoint.event)
                except HalError:
                    pass  # _retire_completed records the failure
            self._retire_completed()

    def _wait_timepoint(self, timepoint: Timepoint, deadline: float | None) -> None:
        """A host wait on a timepoint: block on (or poll) its event directly, then retire what completed."""
        if self.closed_for_good:
            return
        try:
            self.make_current()
            if deadline is None:
                self.api.event_synchronize(timepoint.event)
            elif not poll_event(self.api, timepoint.event, deadline):
                return  # the deadline passed: the caller reports it
        except HalError:
            self._retire_completed()  # records the device's error on the semaphores
            return
        self._retire_completed(known_done=timepoint)

    def _mark_lost(self, exc: BaseException) -> None:
        with self._state_lock:
            if self.lost is None:
                self.lost = DeviceLostError(
                    f"device {self.info.uri} is lost after a GPU fault; create a new process to use it again: {exc}")
                self.lost.__cause__ = exc

    def _finish(self, sub: Submission, failure: BaseException | None) -> None:
        """Advance or fail the submission's signals, release what it held, retire it."""
        if failure is None:
            if sub.timepoint is not None:
                for sem, value in sub.signals:  # Timepoint.reached, inlined
                    sem._advance(value)
        else:
            for sem, _ in sub.signals:
                sem._fail(failure)
        for cb in sub.command_buffers:
            cb.retired()  # type: ignore[attr-defined]
        if sub.resources:
            for release in sub.resources:
                self._run_released(release)
        sub.timepoint = None
        deferred = self._deferred
        run = None
        with self._state_lock:
            outstanding = self._outstanding
            del outstanding[sub.seq]
            if deferred:
                oldest = next(iter(outstanding), None)
                run = []
                while deferred and (oldest is None or deferred[0][0] < oldest):
                    run.append(deferred.popleft()[1])
            if self._idle_waiters and not outstanding:
                self._idle.notify_all()
        if run:
            for fn in run:
                self._run_released(fn)

    # -- deferred releases ---------------------------------------------------------------------
    def defer(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` once every submission made so far has completed (now if none is outstanding)."""
        with self._state_lock:
            deferred = bool(self._outstanding) and not self.closed_for_good
            if deferred:
                self._deferred.append((self._next_seq - 1, fn))
        if deferred:
            self.wake_completion()  # released as soon as the work completes, even if nothing waits for it
            return
        self._run_released(fn)

    def release_later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Release a resource from any thread (a finalizer): skipped once the device is closed."""
        if self.closed_for_good:
            return
        self._run_released(lambda: fn(*args))

    def _run_released(self, fn: Callable[[], Any]) -> None:
        if self.closed_for_good:
            return
        try:
            self.make_current()
            fn()
        except HalError:
            if self.lost is None:
                raise

    def _wait_idle(self, deadline: float | None) -> None:
        """Wait on the oldest in-flight event and retire, until nothing is outstanding."""
        while True:
            with self._idle:
                if not self._outstanding:
                    return
                if not self._inflight:  # only parked work: wait for it to be issued or to fail
                    left = remaining(deadline)
                    if left == 0.0:
                        raise DeadlineExceededError(
                            f"timed out waiting for {len(self._outstanding)} outstanding submissions")
                    self._idle_waiters += 1
                    try:
                        self._idle.wait(left)
                    finally:
                        self._idle_waiters -= 1
                    continue
            try:
                timepoint = self._inflight[0].timepoint
            except IndexError:
                continue
            if timepoint is not None:
                self._wait_timepoint(timepoint, deadline)
            self._retire_completed()
            if deadline is not None and remaining(deadline) == 0.0 and self._outstanding:
                raise DeadlineExceededError(f"timed out waiting for {len(self._outstanding)} outstanding submissions")

    # -- close ------------------------------------------------------------------------------------
    def register_module(self, module: Any) -> None:
        self._modules.append(module)

    def _close(self) -> None:
        self._stopping = True
        self._completion_inbox.put(False)
        if self._completion is not threading.current_thread():
            self._completion.join(timeout=30)
        api = self.api
        try:
            self.make_current()
        except HalError:
            pass
        with self._state_lock:
            deferred, self._deferred = list(self._deferred), collections.deque()
        for _, fn in deferred:
            self._quietly(fn)
        for q in self._queues:
            self._quietly(lambda q=q: api.stream_synchronize(q.stream))
            self._quietly(lambda q=q: api.stream_destroy(q.stream))
        for resources in list(self.graph_resources):
            self._quietly(resources.release)
        self.allocator.free_all()
        self.staging.close()
        self.events.close()
        for module in self._modules:
            self._quietly(lambda module=module: api.module_unload(module))
        self._modules = []
        self.closed_for_good = True

    @staticmethod
    def _quietly(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except Exception:  # close releases what it can; a lost context frees the rest itself
            pass

