"""The CUDA driver's cuSOLVER backend without a GPU: the calls each solver routine makes, recorded by a
stand-in for ``nvmath.bindings.cusolverDn`` (the real one is checked on a GPU by scripts/gpu-check),
and the refusal with the reason where the library does not load."""

from __future__ import annotations

import pytest

import hal
from hal.drivers.cuda import solver
from hal.drivers.gpu.library import DeferredBackend
from hal.drivers.gpu.solver import SolverBackend

from .solver_stubs import RecordingApi


class Recorder:
    """``cusolverDn`` as a recorder: buffer sizes of 7 elements, handles 11."""

    def __init__(self) -> None:
        self.calls: list = []

    def __getattr__(self, name: str):
        def call(*args):
            self.calls.append((name, *args))
            if name.endswith("buffer_size"):
                return 7
            return 11 if name in ("create", "create_gesvdj_info", "create_syevj_info") else None

        return call



CASES = [
    (hal.Cholesky("float32"), [1, 3], ["spotrf"]),
    (hal.Cholesky("float32"), [2, 3], ["spotrf_batched"]),
    (hal.LU("complex64"), [2, 3], ["cgetrf", "cgetrf"]),
    (hal.LUSolve("float64", transpose=True), [2, 3, 2], ["dgetrs", "dgetrs"]),
    (hal.Eigh("complex128"), [2, 40], ["zheevd", "zheevd"]),
    (hal.Eigh("complex128"), [2, 3], ["zheevj_batched"]),  # matrices up to 32 x 32: one Jacobi call
    (hal.Eigh("float64", vectors=False), [1, 3], ["dsyevj_batched"]),
    (hal.Eigh("float64", vectors=False), [1, 33], ["dsyevd"]),
    (hal.Svd("float32", full_matrices=True), [2, 4, 3], ["sgesvdj_batched"]),
    (hal.Svd("float32"), [2, 4, 3], ["sgesvdj", "sgesvdj"]),  # (the batched form has no economy SVD)
    (hal.Svd("complex128"), [2, 40, 40], ["zgesvdj", "zgesvdj"]),
    (hal.Qr("complex64", complete=True), [1, 4, 3], ["cgeqrf", "cungqr"]),
]


@pytest.mark.parametrize("routine,constants,expected", CASES, ids=lambda c: getattr(c, "kind", None))
def test_each_routine_copies_its_input_and_calls_cusolver_per_batch_entry(routine, constants, expected):
    dn = Recorder()
    backend = solver.CuSolver(dn, RecordingApi(dn.calls))
    assert backend.supports(routine) is None
    pointers = [4096 * (i + 1) for i in range(routine.bindings)]
    plan = backend.plan(routine, routine.call_of(constants), pointers)
    assert plan is backend.plan(routine, routine.call_of(constants), pointers)  # planned once
    assert plan.workspace_size >= 256
    dn.calls.clear()
    backend.enqueue(plan, tuple(constants), pointers, 1 << 20, plan.workspace_size, 5)
    names = [c[0] for c in dn.calls]
    assert names[0] == "set_stream" and names[1] == "memcpy"
    assert [n for n in names if n not in ("set_stream", "memcpy")] == expected
    for call in dn.calls:  # every library call on the call's own memory: no allocation
        assert call[0] != "malloc"


CAPTURABLE = [
    (hal.Cholesky("float32"), [4, 100], True),
    (hal.LU("float32"), [4, 100], True),
    (hal.LUSolve("float32"), [4, 100, 3], True),
    (hal.Qr("float32"), [4, 100, 50], True),
    (hal.Eigh("float32"), [4, 32], True),  # syevjBatched
    (hal.Eigh("float32"), [1, 33], False),  # syevd reads its progress on the host
    (hal.Svd("float32", full_matrices=True), [1, 32, 20], True),  # gesvdjBatched
    (hal.Svd("float32"), [3, 20, 20], True),
    (hal.Svd("float32"), [3, 20, 10], False),  # gesvdj (no batched economy form)
    (hal.Svd("float32", full_matrices=True), [1, 33, 20], False),
]


@pytest.mark.parametrize("routine,constants,capturable", CAPTURABLE, ids=lambda c: getattr(c, "kind", None))
def test_what_waits_on_the_host_is_not_capturable(routine, constants, capturable):
    dn = Recorder()
    backend = solver.CuSolver(dn, RecordingApi(dn.calls))
    assert backend.capturable(routine, routine.call_of(constants)) is capturable


def test_batches_of_lus_and_solves_take_cublas_batched_calls_over_arrays_uploaded_at_planning():
    dn, blas = Recorder(), Recorder()
    api = RecordingApi(dn.calls)
    backend = solver.CuSolver(dn, api, blas)
    lu, solve = hal.LU("float64"), hal.LUSolve("complex64", transpose=True)
    lu_plan = backend.plan(lu, lu.call_of([3, 4]), [4096, 8192, 12288, 16384])
    solve_plan = backend.plan(solve, solve.call_of([3, 4, 2]), [20480, 4096, 12288, 24576])
    assert [c[0] for c in dn.calls].count("memcpy_htod") == 3  # LU's outputs, then X's and LU's
    dn.calls.clear()
    backend.enqueue(lu_plan, (3, 4), [4096, 8192, 12288, 16384], 1 << 20, lu_plan.workspace_size, 5)
    backend.enqueue(solve_plan, (3, 4, 2), [20480, 4096, 12288, 24576], 1 << 20, solve_plan.workspace_size, 5)
    assert [c[0] for c in dn.calls] == ["set_stream", "memcpy", "set_stream", "memcpy"]
    assert [c[0] for c in blas.calls if c[0] != "set_stream"] == ["create", "dgetrf_batched", "cgetrs_batched"]
    getrf = [c for c in blas.calls if c[0] == "dgetrf_batched"][0]
    assert getrf[2:] == (4, 1 << 30, 4, 12288, 16384, 3)  # n, the matrices' array, lda, pivots, info, batch
    getrs = [c for c in blas.calls if c[0] == "cgetrs_batched"][0]
    assert getrs[2:6] == (solver.OP_T, 4, 2, 1 << 30) and getrs[-1] == 3
    # one matrix, or matrices past BATCHED_LU_MAX: cuSOLVER's getrf per matrix
    for constants in ([1, 4], [2, 513]):
        dn.calls.clear()
        plan = backend.plan(lu, lu.call_of(constants), [4096, 8192, 12288, 16384])
        backend.enqueue(plan, tuple(constants), [4096, 8192, 12288, 16384], 1 << 20, plan.workspace_size, 5)
        assert [c[0] for c in dn.calls].count("dgetrf") == constants[0]


def test_a_cublas_that_fails_to_load_leaves_the_lus_one_matrix_at_a_time():
    class Broken:
        def create(self):
            raise OSError("libcublas.so.13: cannot open shared object file")

    dn = Recorder()
    calls = solver.CuSolverCalls(dn, RecordingApi(dn.calls), Broken())
    assert not calls.batched_lu


def test_the_transposed_solve_asks_for_op_t():
    dn = Recorder()
    backend = solver.CuSolver(dn, RecordingApi(dn.calls))
    routine = hal.LUSolve("float32", transpose=True)
    plan = backend.plan(routine, routine.call_of([1, 3, 1]), [4096, 8192, 12288, 16384])
    backend.enqueue(plan, (1, 3, 1), [4096, 8192, 12288, 16384], 1 << 20, plan.workspace_size, 5)
    (getrs,) = [c for c in dn.calls if c[0] == "sgetrs"]
    assert getrs[2] == solver.OP_T


def test_a_library_that_fails_to_load_refuses_every_routine_with_the_reason():
    class Broken:
        def create(self):
            raise OSError("libcusolver.so.12: cannot open shared object file")

    deferred = DeferredBackend("cuSOLVER", lambda: SolverBackend(solver.CuSolverCalls(Broken(), None)),
                               lambda exc: None)
    reason = deferred.supports(hal.Cholesky("float32"))
    assert reason is not None and "libcusolver" in reason
    with pytest.raises(hal.UnavailableError):
        deferred.plan(hal.Cholesky("float32"), None, [])


def test_load_gives_a_backend_for_every_solver_kind():
    backends = solver.load(99)
    assert set(backends) in (set(), {"cholesky", "lu", "lu_solve", "eigh", "svd", "qr"})
    assert len({id(b) for b in backends.values()}) <= 1


def test_a_batched_cholesky_uploads_its_matrix_addresses_once_per_output_while_planning():
    dn = Recorder()
    api = RecordingApi(dn.calls)
    backend = solver.CuSolver(dn, api)
    routine, constants = hal.Cholesky("float64"), [3, 4]
    for out in (4096, 4096, 65536):
        plan = backend.plan(routine, routine.call_of(constants), [out, 8192, 12288])
    assert [c[0] for c in dn.calls].count("memcpy_htod") == 2  # one array per output address
    dn.calls.clear()
    backend.enqueue(plan, tuple(constants), [65536, 8192, 12288], 1 << 20, plan.workspace_size, 5)
    assert "memcpy_htod" not in [c[0] for c in dn.calls]  # (nothing synchronous while a stream may capture)
    (batched,) = [c for c in dn.calls if c[0] == "dpotrf_batched"]
    assert batched[4] == 1 << 30 and batched[-1] == 3
