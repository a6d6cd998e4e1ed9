"""cuSOLVER behind the CUDA driver's solver routines (``hal.solver``), through nvmath-python's
``nvmath.bindings.cusolverDn``.

``load()`` gives the backend of each solver routine kind when nvmath-python imports, else an
empty mapping, logging the reason once; the library itself (the ``nvidia-cusolver`` wheel) loads
at the first routine (``DeferredCuSolver``), and a library that fails to load makes every solver
routine refused with the reason: the runtime's linalg then raises ``UnimplementedError`` naming it.

Every call is out of place as the HAL's routines are: the input is copied into the output (or the
call's workspace) on the stream, and cuSOLVER's in-place routine runs there. Per batch entry, on
the queue's stream (captured into a graph like any library call):

- Cholesky: ``potrf`` (lower), LU: ``getrf`` (int32 pivots), LUSolve: ``getrs`` (``CUBLAS_OP_T``
  for ``transpose``), Eigh: ``syevd`` / ``heevd``, Svd: ``gesvdj`` (``econ`` unless
  ``full_matrices``; it writes V, as the routine does), Qr: ``geqrf`` then ``orgqr`` / ``ungqr``.

The batched forms (``potrfBatched``, ``syevjBatched``, ``gesvdjBatched``) take arrays of device
pointers or sizes up to 32: the loop serves every size with one handle and one workspace, which a
call's plan sizes once per (routine, sizes). Nothing allocates during a call: the library's
workspace, the Householder scalars, scratch matrices and a scratch info word are the call's own
workspace (``LibraryCall``).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hal.distribution import install_hint
from hal.errors import UnavailableError
from hal.log import driver_logger
from hal.solver import SOLVER_DTYPES, SOLVER_ROUTINES, SolverCall, SolverRoutine

#: cuSOLVER/cuBLAS enum values (cublas_api.h, cusolver_common.h).
FILL_LOWER = 0
OP_N, OP_T = 0, 1
EIG_NOVECTOR, EIG_VECTOR = 0, 1
PREFIX = {"float32": "s", "float64": "d", "complex64": "c", "complex128": "z"}
ALIGN = 256


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


@dataclasses.dataclass
class SolverPlan:
    """One planned call: ``run(pointers, workspace, stream)`` and the workspace bytes it needs."""

    run: Callable[[Sequence[int], int, Any], None]
    workspace_size: int


class CuSolver:
    """The cuSOLVER backend of one CUDA device: one handle, plans cached by (routine, sizes)."""

    def __init__(self, dn: Any, api: Any) -> None:
        self.dn, self.api = dn, api
        self.name = "cuSOLVER"
        self.handle = dn.create()
        self.gesvdj_params: Any = None
        self.plans: dict = {}
        self._lock = threading.Lock()

    def supports(self, routine: Any) -> str | None:
        if not isinstance(routine, SolverRoutine) or routine.kind not in SOLVER_ROUTINES:
            return f"cuSOLVER does not run {type(routine).__name__} routines"
        if routine.dtype not in SOLVER_DTYPES:
            return f"cuSOLVER has no {routine.dtype} routines"
        return None

    def plan(self, routine: SolverRoutine, checked: SolverCall, pointers: Sequence[int]) -> SolverPlan:
        key = (routine, checked.sizes)
        with self._lock:
            plan = self.plans.get(key)
            if plan is None:
                plan = self.plans[key] = getattr(self, f"_plan_{routine.kind}")(routine, dict(checked.sizes), pointers)
        return plan

    def enqueue(self, plan: SolverPlan, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        self.dn.set_stream(self.handle, stream)
        plan.run(pointers, workspace, stream)

    def _fn(self, routine: SolverRoutine, name: str) -> Callable:
        return getattr(self.dn, PREFIX[routine.dtype] + name)

    def _copy(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        if nbytes:
            self.api.memcpy_dtod_async(dst, src, nbytes, stream)

    # -- one planner per routine kind: (pointers in binding order, workspace address, stream) -------

    def _plan_cholesky(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        batch, n = s["batch"], s["n"]
        size = routine.element_size
        potrf = self._fn(routine, "potrf")
        lwork = self._fn(routine, "potrf_buffer_size")(self.handle, FILL_LOWER, n, pointers[0], n)
        matrix = n * n * size

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            out, a, info = p[0], p[1], p[2]
            self._copy(out, a, batch * matrix, stream)
            for i in range(batch):
                potrf(self.handle, FILL_LOWER, n, out + i * matrix, n, work, lwork, info + 4 * i)

        return SolverPlan(run, _aligned(max(lwork, 1) * size))

    def _plan_lu(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        batch, n = s["batch"], s["n"]
        size = routine.element_size
        getrf = self._fn(routine, "getrf")
        lwork = self._fn(routine, "getrf_buffer_size")(self.handle, n, n, pointers[0], n)
        matrix = n * n * size

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            out, a, pivots, info = p
            self._copy(out, a, batch * matrix, stream)
            for i in range(batch):
                getrf(self.handle, n, n, out + i * matrix, n, work, pivots + 4 * n * i, info + 4 * i)

        return SolverPlan(run, _aligned(max(lwork, 1) * size))

    def _plan_lu_solve(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        batch, n, nrhs = s["batch"], s["n"], s["nrhs"]
        size = routine.element_size
        getrs = self._fn(routine, "getrs")
        trans = OP_T if routine.transpose else OP_N  # type: ignore[attr-defined]
        matrix, rhs = n * n * size, n * nrhs * size

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            x, lu, pivots, b = p
            self._copy(x, b, batch * rhs, stream)
            for i in range(batch):
                getrs(self.handle, trans, n, nrhs, lu + i * matrix, n, pivots + 4 * n * i, x + i * rhs, n, work)

        return SolverPlan(run, ALIGN)  # (getrs's info word)

    def _plan_eigh(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        batch, n = s["batch"], s["n"]
        size = routine.element_size
        name = "syevd" if routine.dtype.startswith("float") else "heevd"
        evd = self._fn(routine, name)
        jobz = EIG_VECTOR if routine.vectors else EIG_NOVECTOR  # type: ignore[attr-defined]
        lwork = self._fn(routine, name + "_buffer_size")(self.handle, jobz, FILL_LOWER, n, pointers[0], n, pointers[1])
        matrix = n * n * size
        real = size // 2 if routine.dtype.startswith("complex") else size

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            v, w, a, info = p
            self._copy(v, a, batch * matrix, stream)
            for i in range(batch):
                evd(self.handle, jobz, FILL_LOWER, n, v + i * matrix, n, w + i * n * real, work, lwork, info + 4 * i)

        return SolverPlan(run, _aligned(max(lwork, 1) * size))

    def _plan_svd(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        batch, m, n = s["batch"], s["m"], s["n"]
        size = routine.element_size
        full = routine.full_matrices  # type: ignore[attr-defined]
        econ = 0 if full else 1
        ku, kv = routine.columns(m, n)  # type: ignore[attr-defined]
        k = min(m, n)
        real = size // 2 if routine.dtype.startswith("complex") else size
        gesvdj = self._fn(routine, "gesvdj")
        if self.gesvdj_params is None:
            self.gesvdj_params = self.dn.create_gesvdj_info()
        params = self.gesvdj_params
        lwork = self._fn(routine, "gesvdj_buffer_size")(self.handle, EIG_VECTOR, econ, m, n, pointers[3], m,
                                                         pointers[1], pointers[0], m, pointers[2], n, params)
        library = _aligned(max(lwork, 1) * size)
        matrix = m * n * size

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            u, sv, v, a, info = p
            scratch = work + library  # gesvdj overwrites its input
            self._copy(scratch, a, batch * matrix, stream)
            for i in range(batch):
                gesvdj(self.handle, EIG_VECTOR, econ, m, n, scratch + i * matrix, m, sv + i * k * real,
                       u + i * m * ku * size, m, v + i * n * kv * size, n, work, lwork, info + 4 * i, params)

        return SolverPlan(run, library + _aligned(batch * matrix))

    def _plan_qr(self, routine: SolverRoutine, s: dict, pointers: Sequence[int]) -> SolverPlan:
        batch, m, n = s["batch"], s["m"], s["n"]
        size = routine.element_size
        k = min(m, n)
        kq = routine.q_columns(m, n)  # type: ignore[attr-defined]
        geqrf = self._fn(routine, "geqrf")
        gen = "orgqr" if routine.dtype.startswith("float") else "ungqr"
        orgqr = self._fn(routine, gen)
        a0 = pointers[2]
        lwork = max(self._fn(routine, "geqrf_buffer_size")(self.handle, m, n, a0, m),
                    self._fn(routine, gen + "_buffer_size")(self.handle, m, kq, k, a0, m, a0), 1)
        library = _aligned(lwork * size)
        tau = _aligned(max(k, 1) * size)
        info_word = ALIGN
        columns = max(n, kq)

        def run(p: Sequence[int], work: int, stream: Any) -> None:
            q, r, a = p
            tau_at = work + library
            info = tau_at + tau
            scratch = info + info_word  # m x max(n, kq), column-major
            for i in range(batch):
                self._copy(scratch, a + i * m * n * size, m * n * size, stream)
                geqrf(self.handle, m, n, scratch, m, tau_at, work, lwork, info)
                self._copy(r + i * m * n * size, scratch, m * n * size, stream)
                orgqr(self.handle, m, kq, k, scratch, m, tau_at, work, lwork, info)
                self._copy(q + i * m * kq * size, scratch, m * kq * size, stream)

        return SolverPlan(run, library + tau + info_word + _aligned(m * columns * size))


class DeferredCuSolver:
    """The device's cuSOLVER until its first solver routine (the library and its handle are made
    then); a library that fails to load refuses every routine with the reason (``supports``)."""

    def __init__(self, ordinal: int, api: Any, dn: Any) -> None:
        self._ordinal, self._api, self._dn = ordinal, api, dn
        self._backend: CuSolver | None = None
        self._failure: str | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._backend.name if self._backend is not None else "cuSOLVER"

    def backend(self) -> CuSolver:
        if self._backend is None:
            with self._lock:
                if self._backend is None and self._failure is None:
                    try:
                        self._backend = CuSolver(self._dn, self._api)
                    except Exception as exc:  # a missing library, a failing handle creation
                        self._failure = f"{type(exc).__name__}: {exc}"
                        _report(exc)
        if self._backend is None:
            raise UnavailableError(f"cuSOLVER could not be loaded: {self._failure}")
        return self._backend

    def supports(self, routine: Any) -> str | None:
        try:
            return self.backend().supports(routine)
        except UnavailableError as exc:
            return str(exc)

    def plan(self, routine: Any, checked: Any, pointers: Any) -> SolverPlan:
        return self.backend().plan(routine, checked, pointers)

    def enqueue(self, *args: Any) -> None:
        self.backend().enqueue(*args)


_backends: dict[int, DeferredCuSolver] = {}
_reported: list[BaseException] = []
_lock = threading.Lock()


def _report(exc: BaseException) -> None:
    """Log once per process why the solver routines are unavailable."""
    if not _reported:
        _reported.append(exc)
        driver_logger("cuda").warning(
            "cuSOLVER is unavailable (%s: %s): rt.linalg's decompositions cannot run on CUDA devices; "
            "%s (nvmath-python and nvidia-cusolver) for them", type(exc).__name__, exc, install_hint("cuda"))


def load(ordinal: int, api: Any = None) -> dict[str, DeferredCuSolver]:
    """The cuSOLVER backend of CUDA device ``ordinal`` for each solver routine kind, loaded at its
    first use; empty when nvmath-python is missing (the reason logged once per process)."""
    with _lock:
        backend = _backends.get(ordinal)
        if backend is None:
            try:
                from nvmath.bindings import cusolverDn as dn
            except Exception as exc:  # not installed, or its bindings fail to import
                _report(exc)
                return {}
            backend = _backends[ordinal] = DeferredCuSolver(ordinal, api, dn)
        return {kind: backend for kind in SOLVER_ROUTINES}
