"""Per-device runtime state: the timeline semaphore, buffer cache, graph cache and executables, and the
submission of prepared executions on the context's timeline (``DeviceContext.submit``)."""

from __future__ import annotations

import collections
import threading
from math import prod

import hal
from hal import env, interrupts

from .buffer_cache import BufferCache, default_limit
from .errors import ArrayTooLargeError
from .graph_cache import GraphCache

#: The most elements an array may have on any device. The kernels (CUDA C on the GPU drivers, their
#: numpy functions on the CPU drivers) take sizes, strides and offsets as 32-bit dispatch constants:
#: in an array of more elements, or a view into one, a stride would wrap and the kernel read outside
#: its buffer (wrong values or a fault on a GPU, a crash of the process on a CPU). Within the limit
#: every element of an array, and of any view of it, lies at a position the constants hold.
MAX_ELEMENTS = 2**31 - 1

MAX_IN_FLIGHT = env.integer("RUNTIME_MAX_IN_FLIGHT", 4, minimum=1)  # submissions handed over before the host waits
#: Evaluations and replays of compiled functions queued into one submission at most (1: each submitted
#: on its own). Batching is what MLX's command encoder does with its ops: the submission's fixed host
#: cost (fences, the driver's event, retirement) is paid once for the batch; each one adds its launch.
SUBMIT_BATCH = env.integer("RUNTIME_SUBMIT_BATCH", 8, minimum=1)
#: Bytes the queued work may move at most (each recording's inputs and the arrays it writes): an
#: execution that would take the queue past it is handed over at once, with the queue before it.
#: Holding work back pays where a submission's host cost (its fences, event and retirement) is a large
#: part of the work's own time; work that keeps the device busy much longer only leaves the device
#: idle until the batch is full. On an H200, eager calls of 8192x4096 float32 (256 MB each, 68 us of
#: GPU time, about as long as their host time), us an iteration, medians of 11 rounds taken in turn
#: in one process, twice: layer norm queued 8 to a batch 70.4 / 70.1 (the device idle between
#: batches), 2 to a batch (this bound) 68.7 / 69.2, each alone (a bound of 32 MiB) 69.7 / 75.9 (a
#: submission and a retirement a call: 80-82 us in the rounds where the host ran slower); softmax
#: 69.6 / 69.6, 68.8 / 68.7 and 68.1 / 68.0.
SUBMIT_BATCH_BYTES = env.integer("RUNTIME_SUBMIT_BATCH_BYTES", 512 << 20, minimum=0)
#: Joined executions of batches kept per context (a loop's batches repeat).
BATCHES_KEPT = 8


class DeviceContext:
    """Everything the runtime keeps for one hal.Device."""

    __slots__ = ("device", "semaphore", "submitted", "completed", "flushed", "queued", "queued_bytes", "batches",
                 "in_flight", "buffers", "graphs", "failed", "programs", "retired_programs",
                 "executables", "fusion_wanted", "constants", "is_gpu", "gpu_format", "lock", "name", "max_array_bytes",
                 "__weakref__")

    def __init__(self, device: hal.Device) -> None:
        self.device = device
        self.semaphore = device.create_semaphore(0)
        self.submitted = 0  # value of the latest submission, queued ones included
        self.completed = 0  # last value seen reached (a hint, refreshed by refresh())
        self.flushed = 0  # value the latest submission handed to the device signals
        #: Evaluations and replays not yet handed to the device (their executions), values flushed+1 ...
        #: submitted, in order. Submitted with the next submission, or by flush() before any wait.
        self.queued: list[hal.Execution] = []
        #: What the queued executions' work moves (SUBMIT_BATCH_BYTES).
        self.queued_bytes = 0
        #: tuple of the executions of a batch -> the execution of their command buffers as one submission.
        self.batches: dict[tuple, hal.Execution] = {}
        #: Values signalled by the submissions handed to the device that may still run (throttle()).
        self.in_flight: collections.deque[int] = collections.deque()
        self.graphs = GraphCache()
        self.executables: dict = {}
        self.fusion_wanted: dict = {}  # fused kernel key -> recordings or evaluations that wanted it
        self.constants: dict = {}
        self.programs: dict = {}  # program id -> cpu_program.Program of live recordings
        self.retired_programs: list = []  # (submission value, program id) of dropped recordings
        self.gpu_format = next((f for f in ("cuda-c", "hip-c") if device.can_prepare(f)), None)
        self.is_gpu = self.gpu_format is not None
        self.buffers = BufferCache(device, default_limit(device, self.is_gpu))
        self.lock = threading.RLock()
        self.name = getattr(device, "driver_name", "device")
        self.max_array_bytes = device.allocator.max_allocation_size
        # semaphore -> (last value known reached, the failure) for timelines replaced after a failure
        self.failed: dict = {}

    def check_fits(self, shape: tuple, dtype) -> None:
        """ArrayTooLargeError for an array no buffer of this device can hold, or of more elements than the
        kernels address (MAX_ELEMENTS), views included (whatever reads a view of that size computes a
        result as large, or reads that many elements).

        Called where an op can make an array larger than its inputs (creation, broadcasting, products),
        so that the error comes when the op is built, not later from the evaluation it would poison.
        """
        count = prod(shape)
        if count > MAX_ELEMENTS:
            raise ArrayTooLargeError(
                f"an array of shape {shape} has {count} elements, more than the {MAX_ELEMENTS} (2**31 - 1) the "
                "runtime's kernels address (their sizes, strides and offsets are 32-bit)")
        n = dtype.itemsize * count
        if n > self.max_array_bytes:
            raise ArrayTooLargeError(
                f"an array of shape {shape} and dtype {dtype.name} needs {n} bytes, more than the largest "
                f"allocation of {self.max_array_bytes} bytes that {self.device.info.uri} supports")

    def refresh(self) -> int:
        """Poll the timeline; after a failed submission, move on to a fresh one."""
        try:
            value = self.semaphore.value
        except hal.AbortedError as exc:
            self.recover(exc)
            value = self.completed
        self.completed = value
        self.buffers.retire(value)
        if self.retired_programs:
            self._forget_programs(value)
        return value

    def _forget_programs(self, reached: int) -> None:
        """Drop the CPU programs of dropped recordings whose last submissions the timeline has reached
        (``retire_program``): wherever the context learns a value was reached, a poll or a wait."""
        keep = []
        for fence, pid in self.retired_programs:
            if fence <= reached:
                self.programs.pop(pid, None)
            else:
                keep.append((fence, pid))
        self.retired_programs = keep

    def throttle(self) -> None:
        """Bound the submissions in flight, so a fast host cannot queue unbounded work and memory.

        The timeline is not polled first: a wait for the oldest submission returns at once when it
        completed, and retires every submission through it in one go, where a poll queries events
        and retires them one at a time (the polls of every eval and throttle were about 300 of the
        2441 bytecodes of a pipelined eager 256x256 product over the simulated GPU). A failure found
        there moves the context to a fresh timeline (``recover``) and is raised where the failed
        work's arrays are read, not here."""
        in_flight = self.in_flight
        if len(in_flight) >= MAX_IN_FLIGHT:
            completed = self.completed
            if in_flight[-1] <= completed:  # all reached (a synced loop): at once, not one by one
                in_flight.clear()
            while in_flight and in_flight[0] <= completed:
                in_flight.popleft()
            if len(in_flight) >= MAX_IN_FLIGHT:
                try:
                    self.wait(in_flight.popleft())
                except hal.AbortedError:
                    pass  # (recovered by wait)

    def submit(self, execution: hal.Execution, queue: bool = False, nbytes: int = 0) -> int:
        """Submit `execution` after every earlier submission of this context: the timeline value it
        signals. The one place the runtime hands work to a device.

        ``queue=True`` (evaluations and rt.compile's replays without collectives, which every rank
        issues at once): while work handed to the device earlier may still run, the execution is
        queued and handed over with the next submission, up to SUBMIT_BATCH in one and work moving
        SUBMIT_BATCH_BYTES (``nbytes``: what this execution's work reads and writes); a device known
        idle gets it at once (a closed one refuses it at once), and any wait for a queued value
        hands the queue over first (``flush``).
        """
        value = self.submitted + 1
        if (queue and self.flushed > self.completed and len(self.queued) < SUBMIT_BATCH - 1
                and self.queued_bytes + nbytes <= SUBMIT_BATCH_BYTES and not self.device.closed):
            self.queued.append(execution)
            self.queued_bytes += nbytes
        else:
            self._hand_over(execution, value)
        self.submitted = value
        return value

    def flush(self) -> None:
        """Hand the queued replays to the device now (one submission)."""
        with self.lock:
            if self.queued:
                self._hand_over(None, self.submitted)

    def _hand_over(self, execution: hal.Execution | None, value: int) -> None:
        """Submit the queued executions, then `execution`, as one submission signalling `value`; if the
        device refuses it, the queued replays fail with it (their arrays raise the error when read)."""
        if len(self.in_flight) >= MAX_IN_FLIGHT:  # (the usual case asked here, not in a call)
            self.throttle()
        queued = self.queued
        sem = self.semaphore
        try:
            if queued:
                execution = self._batch(queued if execution is None else [*queued, execution])
            if execution is not None:
                execution.submit([(sem, self.flushed)] if self.flushed > self.completed else (), [(sem, value)])
        except BaseException as exc:
            if queued:
                self.recover(exc)
            raise
        if queued:
            self.queued = []
            self.queued_bytes = 0
        self.flushed = self.buffers.handed_over = value
        self.in_flight.append(value)

    def forget_batches(self) -> None:
        """Drop the prepared executions of queued-replay batches (they hold command buffers)."""
        with self.lock:
            self.batches.clear()

    def _batch(self, executions: list[hal.Execution]) -> hal.Execution:
        """One execution running `executions` in order, joined once per batch (one execution alone is
        its own batch): what they validated is not validated again."""
        if len(executions) == 1:
            return executions[0]
        key = tuple(executions)
        batch = self.batches.get(key)
        if batch is None:
            batch = self.device.join(executions)
            if len(self.batches) >= BATCHES_KEPT:
                del self.batches[next(iter(self.batches))]
            self.batches[key] = batch
        return batch

    def retire_program(self, pid: int) -> None:
        """Forget a dropped recording's CPU program once the submissions already queued have run."""
        self.retired_programs.append((self.submitted, pid))

    def wait(self, value: int) -> None:
        """Wait until the current timeline reaches `value` (AbortedError if its work failed)."""
        if value > self.completed:
            if value > self.flushed:
                self.flush()
            try:
                self.semaphore.wait(value)
            except hal.AbortedError as exc:
                self.recover(exc)
                raise
            if value > self.completed:
                self.completed = value
                buffers = self.buffers
                if value > buffers.completed:  # (BufferCache.retire, without the call)
                    buffers.completed = value
                if self.retired_programs:
                    self._forget_programs(value)
                in_flight = self.in_flight
                if in_flight and in_flight[-1] <= value:  # a synced loop: nothing is in flight any more
                    in_flight.clear()

    def wait_storage(self, st: Storage) -> None:
        """Wait until a storage's contents are written; AbortedError if the work writing it failed."""
        if st.sem is self.semaphore:
            self.wait(st.ready)
            return
        record = self.failed.get(st.sem)
        if record is not None and st.ready > record[0]:
            raise hal.AbortedError(f"the submission computing this array failed: {record[1]}") from record[1]

    def recover(self, exc: BaseException) -> None:
        """A submission failed the timeline, or the device refused one carrying queued replays:
        drain the queue and continue on a new semaphore.

        Arrays from before the failure that were seen complete stay readable;
        the rest raise AbortedError with the cause when read.
        """
        old = self.semaphore
        if old in self.failed:
            return
        self.failed[old] = (self.completed, exc)
        # Queued replays read what the failed work wrote, or were refused with it: they fail with it.
        self.queued = []
        self.queued_bytes = 0
        self.batches.clear()
        self.in_flight.clear()
        try:
            self.device.wait_idle()
        except hal.HalError:
            pass
        try:  # what the device did run before the refusal stays readable
            reached = old.value
        except hal.HalError:
            reached = self.completed
        self.failed[old] = (max(reached, self.completed), exc)
        self.semaphore = self.device.create_semaphore(self.submitted)
        self.completed = self.flushed = self.submitted
        self.buffers.retire(self.submitted)

    def __repr__(self) -> str:
        return f"DeviceContext({self.name})"


class Storage:
    """A device buffer owned by one evaluated array (and the views and host arrays sharing it).

    No per-submission fence is kept: a storage that dies hands its buffer back with the
    context's latest submission as its fence, which is at or after the last submission
    that touched it. Device reuse never waits anyway (submissions of a context run in
    order); host reuse waits for that submission, which costs nothing in practice and
    saves updating every input's fence on every submission.
    """

    __slots__ = ("buffer", "bucket", "ctx", "sem", "ready", "nbytes", "__weakref__")

    def __init__(self, buffer: hal.Buffer, bucket: int, ctx: DeviceContext, ready: int, nbytes: int) -> None:
        self.buffer = buffer
        self.bucket = bucket
        self.ctx = ctx
        self.sem = ctx.semaphore  # the timeline `ready` counts on
        self.ready = ready  # semaphore value at which the contents are written
        self.nbytes = nbytes

    def __del__(self) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        try:
            ctx.buffers.release(self.buffer, self.bucket, ctx.submitted)
        except KeyboardInterrupt:
            interrupts.redeliver()
        except Exception:  # noqa: BLE001 - interpreter shutdown or closed device
            pass


_contexts: dict[int, DeviceContext] = {}
_by_uri: dict[str, DeviceContext] = {}
_default: list = [None]
_registry_lock = threading.Lock()


def contexts() -> list[DeviceContext]:
    """The contexts of every device the runtime has used."""
    return list(_contexts.values())


def context_for(device=None) -> DeviceContext:
    """Resolve None (the default device), a URI string or a hal.Device to its context.

    A hal.Device is used itself. A URI resolves as ``hal.open_device`` does: to the device created for
    it in this process that is still open (the program's own, if it created one first), else a new
    one. The runtime closes no device: one it opened stays open for the arrays made on it.
    """
    if device is None:
        ctx = _default[0]
        if ctx is None or ctx.device.closed:
            ctx = _default[0] = _default_context() if ctx is None else _reopened(ctx)
        return ctx
    ctx = _contexts.get(id(device))  # the usual call: a hal.Device the runtime knows already
    if ctx is not None and ctx.device is device:
        return ctx
    if isinstance(device, DeviceContext):
        return device
    if isinstance(device, str):
        ctx = _by_uri.get(device)
        if ctx is None or ctx.device.closed:
            # The process's device for the URI (hal.open_device): one the program created and still has
            # open, else a new one. "local-task", "local-task://0" and the default name one device.
            with _registry_lock:
                ctx = _by_uri.get(device)
                if ctx is None or ctx.device.closed:
                    ctx = _by_uri[device] = _context_of_device(hal.open_device(device))
        return ctx
    if isinstance(device, DefaultDevice):
        return context_for(device.device)
    if not isinstance(device, hal.Device):
        raise hal.InvalidArgumentError(
            f"device must be a URI string (such as 'local-task' or 'cuda://0'), a hal.Device or None, "
            f"not {type(device).__name__}")
    with _registry_lock:
        return _context_of_device(device)


def _reopened(ctx: DeviceContext) -> DeviceContext:
    """The default device was closed under the runtime (by its owner): the same URI opened anew."""
    return context_for(ctx.device.info.uri)


def _default_context() -> DeviceContext:
    """The context of the device `hal.create_device()` would pick (HAL_DEVICE, else the first available
    driver), shared with the URI naming it: device="local-task" and the default are one device."""
    from_env = env.text("HAL_DEVICE")
    if from_env is not None:
        try:
            return context_for(from_env)
        except hal.HalError as exc:
            raise hal.HalError(exc.code, f"HAL_DEVICE={from_env!r}: {exc.message}") from None
    for info in hal.list_drivers():
        if info.available:
            return context_for(info.name)
    raise hal.UnavailableError("no HAL driver is available")


def _context_of_device(device: hal.Device) -> DeviceContext:
    ctx = _contexts.get(id(device))
    if ctx is None or ctx.device is not device:
        # The contexts of devices closed since are dropped here (each held its device, caches and
        # recordings: a program that makes and closes devices in turn grew by one a device).
        # Arrays of a closed device keep their own context.
        for key in [key for key, known in _contexts.items() if known.device.closed]:
            del _contexts[key]
        ctx = DeviceContext(device)
        _contexts[id(device)] = ctx
    return ctx


def default_device() -> hal.Device:
    """The runtime's default device: `hal.create_device()` (honours HAL_DEVICE), created once."""
    return context_for(None).device


class DefaultDevice:
    """What `set_default_device` returns: the hal.Device made the default (its attributes pass through,
    and `.device` is the device itself) and, in a `with` block, a scope.

    Leaving the block makes the previous default the default again, as `jax.default_device` and
    `with torch.device(...)` do. It closes nothing: the device is shared with every array made on it
    and with every other user of its URI, and arrays made inside the block stay usable after it.
    """

    __slots__ = ("device", "previous")

    def __init__(self, device: hal.Device, previous: DeviceContext | None) -> None:
        self.device = device
        self.previous = previous

    def __getattr__(self, name: str):
        return getattr(self.device, name)

    def __enter__(self) -> hal.Device:
        return self.device

    def __exit__(self, *exc: object) -> None:
        _default[0] = self.previous

    def __repr__(self) -> str:
        return f"DefaultDevice({self.device!r})"


def set_default_device(device: str | hal.Device) -> DefaultDevice:
    """Make a URI string or hal.Device the default for new arrays.

    Returns a `DefaultDevice`: use it as the hal.Device (`.info`, `.device`), or as a context manager,
    `with rt.set_default_device("local-sync"):`, to make the device the default inside the block only.
    """
    ctx = context_for(device)
    previous = _default[0]
    _default[0] = ctx
    return DefaultDevice(ctx.device, previous)
