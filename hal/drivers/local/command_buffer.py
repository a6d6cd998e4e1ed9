"""CPU command buffers: each command becomes a closure over the binding table.

Execution on the CPU is sequential, so barriers need no work; a command
buffer runs its closures in recording order.

A dispatch of a reusable command buffer keeps the byte views it handed its
kernel for the last binding table: replayed with an equal table (the same
buffers and ranges; the core has checked they are live), it hands the kernel
the very same list of views again, without resolving a slot or making a view.
Kernels may rely on that identity to keep work prepared for those views (the
runtime's CPU program does).

Collectives recorded one after another without a barrier form one ``CollectiveBatch``
(one group, as NCCL's): running it posts every rank's part to its channel's group
(``hal.drivers.local.channel``) and the execution stops until all of them completed
(``Execution``), then carries on with the next command.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from hal.channel import Channel, Collective
from hal.command_buffer import Binding, BufferRef, CommandBuffer
from hal.drivers.local.allocator import span
from hal.executable import Executable, Export
from hal.submission import Deferred

Op = Callable[[Sequence[Binding] | None], None]
_PATTERN_DTYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _bytes(ref: BufferRef, table: Sequence[Binding] | None) -> np.ndarray:
    buffer, offset, length = ref.resolve(table)
    return span(buffer, offset, length)


class CollectiveBatch:
    """Collectives recorded without a barrier between them: their parts are posted together."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[tuple[Channel, Collective, BufferRef | None, BufferRef | None]] = []

    def start(self, table: Sequence[Binding] | None, done: Callable[[BaseException | None], None]) -> None:
        """Post every part; ``done(None)`` once all completed, or ``done(failure)`` for the first failure."""
        latch = _Latch(len(self.parts), done)
        for channel, op, send, recv in self.parts:
            rank, ranks, size = channel.rank, channel.count, op.element_size
            send_bytes = None if send is None else _bytes(send, table)[:op.send_elements(rank, ranks) * size]
            recv_bytes = None if recv is None else _bytes(recv, table)[:op.recv_elements(rank, ranks) * size]
            channel.start(op, send_bytes, recv_bytes, latch.arrive)  # type: ignore[attr-defined]


class _Latch:
    """Calls ``done`` once ``count`` parts arrived (with the first failure among them)."""

    __slots__ = ("_lock", "_left", "_failure", "_done")

    def __init__(self, count: int, done: Callable[[BaseException | None], None]) -> None:
        self._lock = threading.Lock()
        self._left = count
        self._failure: BaseException | None = None
        self._done = done

    def arrive(self, failure: BaseException | None) -> None:
        with self._lock:
            if failure is not None and self._failure is None:
                self._failure = failure
            self._left -= 1
            if self._left:
                return
        self._done(self._failure)


_STARTING, _PARKED, _EARLY = 1, 2, 3


class Execution:
    """The commands of one submission, run in order; at a collective batch the run stops until every
    rank's part completed, and carries on through ``resume`` (the queue's scheduler)."""

    def __init__(self, steps: list[tuple[object, Sequence[Binding] | None]],
                 resume: Callable[[Callable[[], None]], None]) -> None:
        self.steps = steps
        self.resume = resume
        self.next = 0
        self.deferred: Deferred | None = None
        self._lock = threading.Lock()
        self._state = 0
        self._failure: BaseException | None = None

    def run(self) -> Deferred | None:
        """Run to the end (None) or to a collective still waiting for other ranks (the Deferred)."""
        steps = self.steps
        while self.next < len(steps):
            op, table = steps[self.next]
            self.next += 1
            if type(op) is not CollectiveBatch:
                op(table)  # type: ignore[operator]
                continue
            with self._lock:
                self._state = _STARTING
                self._failure = None
            op.start(table, self._arrived)
            with self._lock:
                if self._state == _STARTING:  # not all there yet: whoever completes the batch resumes the run
                    self._state = _PARKED
                    if self.deferred is None:
                        self.deferred = Deferred()
                    return self.deferred
            if self._failure is not None:
                raise self._failure
        return None

    def _arrived(self, failure: BaseException | None) -> None:
        with self._lock:
            self._failure = failure
            if self._state == _STARTING:  # completed while start() still runs: run() carries on
                self._state = _EARLY
                return
            self._state = 0
        self.resume(self._continue)

    def _continue(self) -> None:
        deferred = self.deferred
        try:
            if self._failure is not None:
                raise self._failure
            if self.run() is not None:
                return  # waiting again
        except BaseException as exc:
            deferred.complete(exc)  # type: ignore[union-attr]
            if not isinstance(exc, Exception):  # a KeyboardInterrupt: the thread's too, not only the work's
                raise
            return
        deferred.complete(None)  # type: ignore[union-attr]


class LocalCommandBuffer(CommandBuffer):
    def __init__(self, device, mode, binding_capacity) -> None:
        super().__init__(device, mode, binding_capacity)
        self.ops: list[Op | CollectiveBatch] = []
        #: The batch the next collective joins (None after a barrier or another command).
        self._batch: CollectiveBatch | None = None
        self.has_collectives = False

    def execute(self, table: Sequence[Binding] | None) -> None:
        for op in self.ops:
            op(table)  # type: ignore[operator]

    def _fill(self, target: BufferRef, pattern: int, pattern_length: int) -> None:
        dtype = _PATTERN_DTYPES[pattern_length]

        def fill(table):
            _bytes(target, table).view(dtype)[:] = pattern

        self.ops.append(fill)

    def _update(self, data: bytes, target: BufferRef) -> None:
        source = np.frombuffer(data, dtype=np.uint8)

        def update(table):
            _bytes(target, table)[:] = source

        self.ops.append(update)

    def _copy(self, source: BufferRef, target: BufferRef) -> None:
        def copy(table):
            _bytes(target, table)[:] = _bytes(source, table)

        self.ops.append(copy)

    def _barrier(self) -> None:
        self._batch = None  # commands run one after another on the CPU; collectives group up to here

    def _collective(self, channel: Channel, op: Collective, send: BufferRef | None, recv: BufferRef | None) -> None:
        batch = self._batch
        if batch is None or not self.ops or self.ops[-1] is not batch:
            batch = self._batch = CollectiveBatch()
            self.ops.append(batch)
            self.has_collectives = True
        batch.parts.append((channel, op, send, recv))

    def _dispatch(self, executable: Executable, ordinal: int, export: Export,
                  workgroups: tuple[int, int, int], constants: tuple[int, ...],
                  bindings: list[BufferRef]) -> None:
        function = executable.functions[ordinal]  # type: ignore[attr-defined]
        values = list(constants)
        if not self.reusable:
            def dispatch(table):
                function(workgroups, [memoryview(_bytes(ref, table)) for ref in bindings], list(values))

            self.ops.append(dispatch)
            return
        # The views stay valid while the table entries this dispatch reads do: those are compared, not
        # the whole table (a copy of a table of n slots at each of n dispatches was quadratic: a
        # 10,000-op graph held 800 MB of copies).
        slots = [ref.slot for ref in bindings if ref.buffer is None]
        last: list = [None, None]  # [the entries at `slots` the views were made from, the views]

        def replay(table):
            used = None if table is None else [table[i] for i in slots]
            if used != last[0] or last[1] is None:
                last[1] = [memoryview(_bytes(ref, table)) for ref in bindings]
                last[0] = used
            function(workgroups, last[1], list(values))

        self.ops.append(replay)
