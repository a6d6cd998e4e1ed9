"""Solver routines (``hal.solver``) on a GPU: the planning shared by the CUDA and HIP drivers.

The vendor module (``cuda/solver.py`` over cuSOLVER, ``hip/solver.py`` over hipSOLVER) gives the
library's calls as a ``SolverCalls``: LAPACK's routines by name, each taking the routine's dtype,
with the library's own enums already chosen. What is written once here:

- every call is out of place as the HAL's routines are: the input is copied into the output (or
  into the call's workspace) on the stream, and the library's in-place routine runs there;
- per batch entry, on the queue's stream (captured into a graph like any library call): Cholesky
  ``potrf`` (lower), LU ``getrf`` (int32 pivots), LUSolve ``getrs`` (transposed for
  ``transpose``), Eigh ``syevd``/``heevd``, Svd ``gesvdj`` (``econ`` unless ``full_matrices``; it
  writes V, as the routine does), Qr ``geqrf`` then ``orgqr``/``ungqr``. Matrices up to 32 x 32
  take one batched Jacobi call instead: ``syevjBatched``/``heevjBatched`` (Eigh) and
  ``gesvdjBatched`` (Svd with full factors or square matrices: it has no economy form); batched
  Choleskys one ``potrfBatched`` over a device array of the matrices' addresses (made once per
  output address). Where the library has a batched LU (``SolverCalls.batched_lu``: cuBLAS's
  ``getrfBatched``/``getrsBatched`` beside cuSOLVER), batches of matrices up to
  ``BATCHED_LU_MAX`` take it, over device arrays of the matrices' addresses as the batched
  Cholesky; one call instead of one per matrix, each tens of microseconds of host time;
- ``syevd`` and ``gesvdj`` read their progress on the host while they run (measured on the H100:
  enqueuing either while the stream captures invalidates the capture), so an Eigh or Svd that
  takes them is not ``capturable``: graph command buffers issue it on the stream. The batched
  Jacobi calls and every other routine capture;
- the plan of a call (workspace sizes asked of the library) is made once per (routine, sizes);
- nothing allocates during a call: the library's workspace, the Householder scalars, scratch
  matrices and a scratch info word are the call's own workspace (``LibraryCall``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import numpy as np

from hal.drivers.gpu.library import DeferredBackend
from hal.solver import SOLVER_DTYPES, SOLVER_ROUTINES, SolverCall, SolverRoutine

ALIGN = 256
#: The largest matrices the libraries' batched Jacobi solvers take (``syevjBatched``, ``gesvdjBatched``).
BATCHED_MAX = 32


#: The largest matrices a batch of LU factorizations or solves takes the batched LU for (larger
#: ones are each enough work for the per-matrix call).
BATCHED_LU_MAX = 512


def batched_eigh(n: int) -> bool:
    """Whether an Eigh of n x n matrices takes the batched Jacobi call."""
    return n <= BATCHED_MAX


def batched_svd(m: int, n: int, full: bool) -> bool:
    """Whether an Svd of m x n matrices takes the batched Jacobi call (it has no economy form)."""
    return max(m, n) <= BATCHED_MAX and (full or m == n)


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


class SolverCalls(Protocol):
    """A vendor solver library's calls (pointers are device addresses; sizes in elements)."""

    #: The library, for messages.
    name: str

    def set_stream(self, stream: Any) -> None: ...
    def copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None: ...
    def potrf_lwork(self, dtype: str, n: int, a: int) -> int: ...
    def potrf(self, dtype: str, n: int, a: int, work: int, lwork: int, info: int) -> None: ...
    def pointer_array(self, pointers: Sequence[int]) -> int: ...
    def potrf_batched_lwork(self, dtype: str, n: int, array: int, batch: int) -> int: ...
    def potrf_batched(self, dtype: str, n: int, array: int, work: int, lwork: int, info: int, batch: int) -> None: ...
    def getrf_lwork(self, dtype: str, n: int, a: int) -> int: ...
    def getrf(self, dtype: str, n: int, a: int, work: int, lwork: int, pivots: int, info: int) -> None: ...
    def getrs_lwork(self, dtype: str, transpose: bool, n: int, nrhs: int, a: int, pivots: int, b: int) -> int: ...
    def getrs(self, dtype: str, transpose: bool, n: int, nrhs: int, a: int, pivots: int, b: int, work: int,
              lwork: int, info: int) -> None: ...
    def evd_lwork(self, dtype: str, vectors: bool, n: int, a: int, w: int) -> int: ...
    def evd(self, dtype: str, vectors: bool, n: int, a: int, w: int, work: int, lwork: int, info: int) -> None: ...
    def evd_batched_lwork(self, dtype: str, vectors: bool, n: int, a: int, w: int, batch: int) -> int: ...
    def evd_batched(self, dtype: str, vectors: bool, n: int, a: int, w: int, work: int, lwork: int, info: int,
                    batch: int) -> None: ...
    def gesvdj_batched_lwork(self, dtype: str, m: int, n: int, a: int, s: int, u: int, v: int, batch: int) -> int: ...
    def gesvdj_batched(self, dtype: str, m: int, n: int, a: int, s: int, u: int, v: int, work: int, lwork: int,
                       info: int, batch: int) -> None: ...
    def gesvdj_lwork(self, dtype: str, full: bool, m: int, n: int, a: int, s: int, u: int, v: int) -> int: ...
    def gesvdj(self, dtype: str, full: bool, m: int, n: int, a: int, s: int, u: int, v: int, work: int, lwork: int,
               info: int) -> None: ...
    #: Whether the library has the batched LU below (``getrf_batched``/``getrs_batched``).
    batched_lu: bool

    def getrf_batched(self, dtype: str, n: int, array: int, pivots: int, info: int, batch: int) -> None: ...
    def getrs_batched(self, dtype: str, transpose: bool, n: int, nrhs: int, lu_array: int, pivots: int,
                      b_array: int, batch: int) -> None: ...
    def geqrf_lwork(self, dtype: str, m: int, n: int, a: int) -> int: ...
    def geqrf(self, dtype: str, m: int, n: int, a: int, tau: int, work: int, lwork: int, info: int) -> None: ...
    def orgqr_lwork(self, dtype: str, m: int, n: int, k: int, a: int, tau: int) -> int: ...
    def orgqr(self, dtype: str, m: int, n: int, k: int, a: int, tau: int, work: int, lwork: int, info: int) -> None: ...


@dataclasses.dataclass
class SolverPlan:
    """One planned call: ``run(pointers, workspace, stream)``, the workspace bytes it needs, and what
    must be made for a set of operand addresses before a call with them is enqueued (``bind``:
    never while a stream captures)."""

    run: Callable[[Sequence[int], int, Any], None]
    workspace_size: int
    bind: Callable[[Sequence[int]], None] | None = None


class ShimTransfers:
    """``SolverCalls``' ``copy`` and ``pointer_array`` over the device's API shim (``self.api``): the
    same for every vendor library."""

    api: Any

    def copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        if nbytes:
            self.api.memcpy_dtod_async(dst, src, nbytes, stream)

    def pointer_array(self, pointers: Sequence[int]) -> int:
        """A device array of ``pointers`` (uint64), uploaded now (never while a stream captures)."""
        host = np.asarray(pointers, np.uint64)
        array = self.api.mem_alloc(host.nbytes)
        self.api.memcpy_htod(array, host.ctypes.data, host.nbytes)
        return array


class PointerArrays:
    """Device arrays of a batch's matrix addresses, for the batched calls that take them: per
    operand (by binding index) the matrices ``stride`` bytes apart from its address. Made and
    uploaded once per address at planning (``bind``: never while a stream captures) and kept while
    the backend lives, as graphs captured with them may replay them."""

    def __init__(self, calls: SolverCalls, batch: int, strides: dict[int, int]) -> None:
        self.calls, self.batch, self.strides = calls, batch, strides
        self.arrays: dict[tuple[int, int], int] = {}

    def bind(self, pointers: Sequence[int]) -> None:
        arrays = self.arrays
        for index, stride in self.strides.items():
            key = (pointers[index], stride)
            if key not in arrays:
                arrays[key] = self.calls.pointer_array([key[0] + i * stride for i in range(self.batch)])

    def of(self, index: int, pointers: Sequence[int]) -> int:
        """The array of binding ``index``'s matrices at ``pointers``."""
        return self.arrays[(pointers[index], self.strides[index])]


class SolverBackend:
    """The ``LibraryBackend`` of the solver routine kinds: plans cached by (routine, sizes)."""

    def __init__(self, calls: SolverCalls) -> None:
        self.calls = calls
        self.name = calls.name
        self.plans: dict = {}
        self._lock = threading.Lock()

    def supports(self, routine: Any) -> str | None:
        if not isinstance(routine, SolverRoutine) or routine.kind not in SOLVER_ROUTINES:
            return f"{self.name} does not run {type(routine).__name__} routines"
        if routine.dtype not in SOLVER_DTYPES:
            return f"{self.name} has no {routine.dtype} routines"
        return None

    def plan(self, routine: SolverRoutine, checked: SolverCall, pointers: Sequence[int]) -> SolverPlan:
        key = (routine, checked.sizes)
        with self._lock:
            plan = self.plans.get(key)
            if plan is None:
                plan = self.plans[key] = getattr(self, f"_plan_{routine.kind}")(routine, dict(checked.sizes), pointers)
            if plan.bind is not None:
                plan.bind(pointers)
        return plan

    def capturable(self, routine: SolverRoutine, checked: SolverCall) -> bool:
        s = dict(checked.sizes)
        if routine.kind == "eigh":
            return batched_eigh(s["n"])
        if routine.kind == "svd":
            return batched_svd(s["m"], s["n"], bool(routine.full_matrices))  # type: ignore[attr-defined]
        return True

    def serial_key(self, routine: SolverRoutine, checked: SolverCall) -> Hashable:
        # The handle's routines keep scratch of their own: two of them captured in one graph level
        # ran at once and corrupted each other's results (a complex QR's gradient, on an H200).
        return self

    def enqueue(self, plan: SolverPlan, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        with self._lock:  # (the handles' stream is set for this call: two queues must not interleave)
            self.calls.set_stream(stream)
            plan.run(pointers, workspace, stream)

    # -- one planner per routine kind: run(pointers in binding order, workspace address, stream) ---

    def _plan_cholesky(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        calls, dtype = self.calls, routine.dtype
        batch, n = s["batch"], s["n"]
        size = routine.element_size
        matrix = n * n * size
        if batch > 1:
            return self._plan_potrf_batched(dtype, batch, n, size, pointers)
        lwork = max(calls.potrf_lwork(dtype, n, pointers[0]), 1)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            out, a, info = p[0], p[1], p[2]
            calls.copy(out, a, batch * matrix, stream)
            for i in range(batch):
                calls.potrf(dtype, n, out + i * matrix, work, lwork, info + 4 * i)

        return SolverPlan(run, aligned(lwork * size))

    def _plan_potrf_batched(self, dtype: str, batch: int, n: int, size: int, pointers: Sequence[int]) -> SolverPlan:
        """One ``potrfBatched`` call, whose matrices are given as a device array of their addresses."""
        calls = self.calls
        matrix = n * n * size
        arrays = PointerArrays(calls, batch, {0: matrix})
        arrays.bind(pointers)
        lwork = max(calls.potrf_batched_lwork(dtype, n, arrays.of(0, pointers), batch), 1)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            out, a, info = p[0], p[1], p[2]
            calls.copy(out, a, batch * matrix, stream)
            calls.potrf_batched(dtype, n, arrays.of(0, p), work, lwork, info, batch)

        return SolverPlan(run, aligned(lwork * size), arrays.bind)

    def _plan_lu(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        calls, dtype = self.calls, routine.dtype
        batch, n = s["batch"], s["n"]
        size = routine.element_size
        matrix = n * n * size
        if batch > 1 and n <= BATCHED_LU_MAX and calls.batched_lu:
            arrays = PointerArrays(calls, batch, {0: matrix})
            arrays.bind(pointers)

            def batched(p: Sequence[int], work: int, stream: Any) -> None:
                out, a, pivots, info = p
                calls.copy(out, a, batch * matrix, stream)
                calls.getrf_batched(dtype, n, arrays.of(0, p), pivots, info, batch)

            return SolverPlan(batched, ALIGN, arrays.bind)
        lwork = max(calls.getrf_lwork(dtype, n, pointers[0]), 1)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            out, a, pivots, info = p
            calls.copy(out, a, batch * matrix, stream)
            for i in range(batch):
                calls.getrf(dtype, n, out + i * matrix, work, lwork, pivots + 4 * n * i, info + 4 * i)

        return SolverPlan(run, aligned(lwork * size))

    def _plan_lu_solve(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        calls, dtype = self.calls, routine.dtype
        batch, n, nrhs = s["batch"], s["n"], s["nrhs"]
        size = routine.element_size
        transpose = bool(routine.transpose)  # type: ignore[attr-defined]
        matrix, rhs = n * n * size, n * nrhs * size
        if batch > 1 and n <= BATCHED_LU_MAX and calls.batched_lu:
            arrays = PointerArrays(calls, batch, {0: rhs, 1: matrix})  # X's and LU's matrices
            arrays.bind(pointers)

            def batched(p: Sequence[int], work: int, stream: Any) -> None:
                x, lu, pivots, b = p
                calls.copy(x, b, batch * rhs, stream)
                calls.getrs_batched(dtype, transpose, n, nrhs, arrays.of(1, p), pivots, arrays.of(0, p), batch)

            return SolverPlan(batched, ALIGN, arrays.bind)
        lwork = max(calls.getrs_lwork(dtype, transpose, n, nrhs, pointers[1], pointers[2], pointers[0]), 1)
        library = aligned(lwork * size)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            x, lu, pivots, b = p
            info = work + library  # (getrs's info word: the LU's info tells of singular matrices)
            calls.copy(x, b, batch * rhs, stream)
            for i in range(batch):
                calls.getrs(dtype, transpose, n, nrhs, lu + i * matrix, pivots + 4 * n * i, x + i * rhs, work, lwork,
                            info)

        return SolverPlan(run, library + ALIGN)

    def _plan_eigh(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        calls, dtype = self.calls, routine.dtype
        batch, n = s["batch"], s["n"]
        size = routine.element_size
        vectors = bool(routine.vectors)  # type: ignore[attr-defined]
        matrix = n * n * size
        real = size // 2 if dtype.startswith("complex") else size
        if batched_eigh(n):
            blwork = max(calls.evd_batched_lwork(dtype, vectors, n, pointers[0], pointers[1], batch), 1)

            def batched(p: Sequence[int], work: int, stream: Any) -> None:
                v, w, a, info = p
                calls.copy(v, a, batch * matrix, stream)
                calls.evd_batched(dtype, vectors, n, v, w, work, blwork, info, batch)

            return SolverPlan(batched, aligned(blwork * size))
        lwork = max(calls.evd_lwork(dtype, vectors, n, pointers[0], pointers[1]), 1)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            v, w, a, info = p
            calls.copy(v, a, batch * matrix, stream)
            for i in range(batch):
                calls.evd(dtype, vectors, n, v + i * matrix, w + i * n * real, work, lwork, info + 4 * i)

        return SolverPlan(run, aligned(lwork * size))

    def _plan_svd(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        calls, dtype = self.calls, routine.dtype
        batch, m, n = s["batch"], s["m"], s["n"]
        size = routine.element_size
        full = bool(routine.full_matrices)  # type: ignore[attr-defined]
        ku, kv = routine.columns(m, n)  # type: ignore[attr-defined]
        k = min(m, n)
        real = size // 2 if dtype.startswith("complex") else size
        matrix = m * n * size
        if batched_svd(m, n, full):
            blwork = max(calls.gesvdj_batched_lwork(dtype, m, n, pointers[3], pointers[1], pointers[0], pointers[2],
                                                    batch), 1)
            blibrary = aligned(blwork * size)

            def batched(p: Sequence[int], work: int, stream: Any) -> None:
                u, sv, v, a, info = p
                scratch = work + blibrary
                calls.copy(scratch, a, batch * matrix, stream)
                calls.gesvdj_batched(dtype, m, n, scratch, sv, u, v, work, blwork, info, batch)

            return SolverPlan(batched, blibrary + aligned(batch * matrix))
        lwork = max(calls.gesvdj_lwork(dtype, full, m, n, pointers[3], pointers[1], pointers[0], pointers[2]), 1)
        library = aligned(lwork * size)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            u, sv, v, a, info = p
            scratch = work + library  # gesvdj overwrites its input
            calls.copy(scratch, a, batch * matrix, stream)
            for i in range(batch):
                calls.gesvdj(dtype, full, m, n, scratch + i * matrix, sv + i * k * real, u + i * m * ku * size,
                             v + i * n * kv * size, work, lwork, info + 4 * i)

        return SolverPlan(run, library + aligned(batch * matrix))

    def _plan_qr(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        calls, dtype = self.calls, routine.dtype
        batch, m, n = s["batch"], s["m"], s["n"]
        size = routine.element_size
        k = min(m, n)
        kq = routine.q_columns(m, n)  # type: ignore[attr-defined]
        a0 = pointers[2]
        lwork = max(calls.geqrf_lwork(dtype, m, n, a0), calls.orgqr_lwork(dtype, m, kq, k, a0, a0), 1)
        library = aligned(lwork * size)
        tau = aligned(max(k, 1) * size)
        columns = max(n, kq)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            q, r, a = p
            tau_at = work + library
            info = tau_at + tau
            scratch = info + ALIGN  # m x max(n, kq), column-major
            for i in range(batch):
                calls.copy(scratch, a + i * m * n * size, m * n * size, stream)
                calls.geqrf(dtype, m, n, scratch, tau_at, work, lwork, info)
                calls.copy(r + i * m * n * size, scratch, m * n * size, stream)
                calls.orgqr(dtype, m, kq, k, scratch, tau_at, work, lwork, info)
                calls.copy(q + i * m * kq * size, scratch, m * kq * size, stream)

        return SolverPlan(run, library + tau + ALIGN + aligned(m * columns * size))


def kinds(backend: DeferredBackend | None) -> dict[str, DeferredBackend]:
    """``backend`` for every solver routine kind (none when None)."""
    return {} if backend is None else dict.fromkeys(SOLVER_ROUTINES, backend)
