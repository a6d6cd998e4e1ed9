"""GEMM planning shared by the GPU BLAS backends (cuBLASLt for CUDA, hipBLASLt for HIP).

The vendor libraries are column-major; a ``hal.Gemm`` is row-major. A row-major C (m x n) read
as column-major is C^T (n x m) = op(B)^T op(A)^T, so each product is planned as D = op(X) op(Y)
with X the memory of B, Y the memory of A and D the memory of C (``column_major``); a bias of n
elements is then per row of D, which is what the libraries' bias epilogues add.

``GemmBackend`` is the ``LibraryBackend`` of both drivers: it caches one plan per (routine, shape,
operand alignment) and, where a product offers several candidates (the heuristic's algorithms,
another library call), times each on scratch operands of the same shape and alignment, in a graph
captured on a private stream, and keeps the fastest (``fastest``). A vendor subclass lists the candidates
(``candidates``) and runs nothing else. A re-issue or a graph re-capture is then one library call.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hal.errors import UnimplementedError
from hal.library import Gemm, GemmShape, Routine

OP_N, OP_T = 0, 1
#: Largest alignment the heuristics distinguish (their default assumption).
MAX_ALIGNMENT = 256
#: Products of at least TUNE_FLOPS with several candidates are timed: each candidate's graph holds
#: enough runs for about TUNE_WORK floating-point operations, from TUNE_RUNS to TUNE_MAX_RUNS.
TUNE_FLOPS = 1 << 24
TUNE_WORK = 1 << 30
TUNE_RUNS = 3
TUNE_MAX_RUNS = 20

#: ``run(pointers, workspace, workspace_size, stream)``: one library call on ``stream``, with the
#: operand addresses in binding order (C, A, B, then the bias and the aux of the Gemm's epilogue).
Run = Callable[[Sequence[int], int, int, int], None]


@dataclasses.dataclass(frozen=True)
class ColumnMajor:
    """A row-major Gemm as D (rows x cols) = op(X) op(Y): operations, and each matrix's
    (rows, cols, ld, batch stride) as stored (column-major), in elements."""

    transpose_x: int
    transpose_y: int
    x: tuple[int, int, int, int]
    y: tuple[int, int, int, int]
    d: tuple[int, int, int, int]


def column_major(shape: GemmShape) -> ColumnMajor:
    """X is B's memory, Y is A's, D is C's (see the module docstring)."""
    s = shape
    # B row-major k x n is column-major n x k: op(B)^T as it is; stored transposed (n x k row-major),
    # it is column-major k x n and must be transposed.
    x = (s.k, s.n, s.ldb, s.stride_b) if s.transpose_b else (s.n, s.k, s.ldb, s.stride_b)
    y = (s.m, s.k, s.lda, s.stride_a) if s.transpose_a else (s.k, s.m, s.lda, s.stride_a)
    d = (s.n, s.m, s.ldc, s.stride_c)
    return ColumnMajor(OP_T if s.transpose_b else OP_N, OP_T if s.transpose_a else OP_N, x, y, d)


def alignment(pointer: int, *element_counts: int, element_size: int) -> int:
    """The largest power of two (<= MAX_ALIGNMENT) dividing the address and every stride in bytes."""
    bits = pointer | MAX_ALIGNMENT
    for count in element_counts:
        if count:
            bits |= count * element_size
    return bits & -bits


class Plan:
    """One way to run a planned product (``run``) and the workspace it needs."""

    __slots__ = ("run", "workspace_size", "owned", "kind")

    def __init__(self, run: Run, workspace_size: int, owned: list, kind: str) -> None:
        self.run = run
        self.workspace_size = workspace_size
        self.owned = owned  # what ``run`` reads (descriptors, scalars, the algorithm's memory)
        self.kind = kind  # the library and call it is, for reports


class GemmBackend:
    """The plan cache and the measured choice of a vendor BLAS (see the module docstring)."""

    name = "GEMM library"

    def __init__(self, api: Any = None) -> None:
        #: The device API (``GpuApi``) that times candidates; None: the first candidate is taken.
        self.api = api
        self._plans: dict[tuple, Plan] = {}
        #: Held while a plan is made and while one runs: plans keep per-call state (a bias pointer
        #: in a shared descriptor, a handle's stream), and tuning runs on the same handles.
        self.lock = threading.Lock()

    def supports(self, routine: Routine) -> str | None:
        if not isinstance(routine, Gemm):
            return f"{type(routine).__name__} is not a routine of {self.name}"
        return None

    def candidates(self, gemm: Gemm, shape: GemmShape, aligned: tuple[int, int, int]) -> list[Plan]:
        """The ways to run the product, the vendor's preferred first (the lock is held)."""
        raise NotImplementedError

    # -- LibraryBackend ------------------------------------------------------------------------
    def capturable(self, routine: Routine, checked: Any) -> bool:
        return True  # (cuBLASLt and hipBLASLt products never wait on the device)

    def serial_key(self, routine: Routine, checked: Any) -> None:
        return None  # (each product's scratch is its call's workspace, also the classic handle's)

    def enqueue(self, plan: Plan, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        with self.lock:
            plan.run(pointers, workspace, workspace_size, int(stream))

    def plan(self, gemm: Gemm, shape: GemmShape, pointers: Sequence[int]) -> Plan:
        """The plan of the product with operands at ``pointers`` (C, A, B), made once per
        (routine, shape, alignment)."""
        size = gemm.element_size
        aligned = (alignment(pointers[1], shape.lda, shape.stride_a, element_size=size),
                   alignment(pointers[2], shape.ldb, shape.stride_b, element_size=size),
                   alignment(pointers[0], shape.ldc, shape.stride_c, element_size=size))
        key = (gemm, shape, aligned)
        plan = self._plans.get(key)
        if plan is None:
            with self.lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = self._plans[key] = self._choose(gemm, shape, aligned)
        return plan

    def _choose(self, gemm: Gemm, shape: GemmShape, aligned: tuple[int, int, int]) -> Plan:
        candidates = self.candidates(gemm, shape, aligned)
        if not candidates:
            raise UnimplementedError(f"{self.name} has no algorithm for {gemm} of {shape}")
        flops = 2 * shape.m * shape.n * shape.k * shape.batch
        if len(candidates) > 1 and self.api is not None and flops >= TUNE_FLOPS:
            return candidates[fastest(self.api, gemm, shape, aligned, candidates)]
        return candidates[0]


def tune_runs(shape: GemmShape) -> int:
    """How many runs of a candidate one timing holds (more for smaller products)."""
    flops = 2 * shape.m * shape.n * shape.k * shape.batch
    return min(TUNE_MAX_RUNS, max(TUNE_RUNS, TUNE_WORK // max(flops, 1)))


def fastest(api: Any, gemm: Gemm, shape: GemmShape, aligned: tuple[int, int, int], candidates: list[Plan]) -> int:
    """The index of the fastest candidate by device time, each timed on scratch operands (never the
    caller's: work queued before may still read them) of the same shape and alignment.

    A candidate's runs are captured into a graph on a private stream and the graph's launch is
    timed, not calls issued one after the other: a library call's host cost (about 20 us a call
    through nvmath on an H100 host) exceeds a small product's kernels (6-7 us for 256^2 float32),
    and calls back to back timed that cost, picking the candidate with the fewest kernels to launch
    (cuBLASLt's single kernel, 6.8 us on the device, over its split-K pair, 6.3 us). A candidate that
    fails to run or to be captured is not a choice (a graph command buffer captures it too)."""
    size = gemm.element_size
    extent_a, extent_b, extent_c = shape.extents()
    workspace = max(plan.workspace_size for plan in candidates)
    sizes = [extent_c * size, extent_a * size, extent_b * size]
    if gemm.has_bias or gemm.bias_gradient:
        sizes.append(shape.n * size)
    if gemm.aux:
        sizes.append(Gemm.relu_mask_bytes(shape.m, shape.n) if gemm.aux == "relu_mask" else extent_c * size)
    aligns = [aligned[2], aligned[0], aligned[1]] + [MAX_ALIGNMENT] * (len(sizes) - 3)
    scratch: list[int] = []
    events: list[Any] = []
    stream = None
    try:
        for nbytes in [*sizes, workspace]:
            scratch.append(api.mem_alloc(max(nbytes, 1) + MAX_ALIGNMENT))
        operands = [base + align % MAX_ALIGNMENT for base, align in zip(scratch, aligns)]
        work = scratch[-1]
        stream = api.stream_create()
        events = [api.timing_event_create(), api.timing_event_create()]
        runs = tune_runs(shape)
        times = []
        for plan in candidates:
            try:
                times.append(_graph_time(api, plan, runs, operands, work, workspace, stream, events))
            except Exception:  # not a choice
                times.append(float("inf"))
        api.stream_synchronize(stream)
        return int(np.argmin(times))
    finally:
        for event in events:
            api.event_destroy(event)
        if stream is not None:
            api.stream_destroy(stream)
        for base in scratch:
            api.mem_free(base)


def _graph_time(api: Any, plan: Plan, runs: int, operands: list[int], work: int, workspace: int, stream: Any,
                events: list[Any]) -> float:
    """Milliseconds of one launch of a graph holding ``runs`` runs of ``plan`` (launched once before:
    a graph's first launch uploads it)."""
    plan.run(operands, work, workspace, int(stream))  # a check that it runs, outside a capture
    api.stream_synchronize(stream)
    graph = graph_exec = None
    try:
        api.stream_begin_capture(stream)
        try:
            for _ in range(runs):
                plan.run(operands, work, workspace, int(stream))
        finally:
            graph = api.stream_end_capture(stream)  # (the capture must end on this stream)
        graph_exec = api.graph_instantiate(graph)
        api.graph_launch(graph_exec, stream)
        api.event_record(events[0], stream)
        api.graph_launch(graph_exec, stream)
        api.event_record(events[1], stream)
        api.event_synchronize(events[1])
        return api.event_elapsed_ms(events[0], events[1])
    finally:
        if graph_exec is not None:
            api.graph_exec_destroy(graph_exec)
        if graph is not None:
            api.graph_destroy(graph)
