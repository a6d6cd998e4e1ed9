"""The HIP driver's hipSOLVER backend without an AMD GPU or libhipsolver: loading, and the calls each
solver routine makes, recorded by a stand-in for ``hip.hipsolver`` that also passes every call
through the installed hip-python function, which converts each argument before it looks for
libhipsolver.so (a wrong argument type raises TypeError there, a right one the loader's error)."""

from __future__ import annotations

import logging
import sys

import pytest

import hal
from hal.drivers.gpu.library import DeferredBackend
from hal.drivers.gpu.solver import SolverBackend
from hal.drivers.hip import solver

from .solver_stubs import RecordingApi


class Recorder:
    """``hip.hipsolver`` as a recorder: statuses 0, buffer sizes 7, handles 11; with ``real``, each
    call is also made through the real binding (whose library is missing here)."""

    def __init__(self, real=None) -> None:
        self.calls: list = []
        self.real = real
        enums = real if real is not None else installed_hipsolver()
        self.hipblasFillMode_t = enums.hipblasFillMode_t
        self.hipblasOperation_t = enums.hipblasOperation_t
        self.hipsolverEigMode_t = enums.hipsolverEigMode_t

    def __getattr__(self, name: str):
        def call(*args):
            self.calls.append((name, *args))
            if self.real is not None:
                with pytest.raises(RuntimeError, match="libhipsolver"):
                    getattr(self.real, name)(*args)  # the arguments convert; only the library is missing
            if name.endswith("bufferSize"):
                return (0, 7)
            if name in ("hipsolverCreate", "hipsolverCreateGesvdjInfo", "hipsolverCreateSyevjInfo"):
                return (0, 11)
            return (0,)

        return call



CASES = [
    (hal.Cholesky("float32"), [1, 3], ["hipsolverSpotrf"]),
    (hal.Cholesky("float32"), [2, 3], ["hipsolverSpotrfBatched"]),
    (hal.LU("complex64"), [2, 3], ["hipsolverCgetrf"] * 2),
    (hal.LUSolve("float64", transpose=True), [2, 3, 2], ["hipsolverDgetrs"] * 2),
    (hal.Eigh("complex128"), [2, 40], ["hipsolverZheevd"] * 2),
    (hal.Eigh("complex128"), [2, 3], ["hipsolverZheevjBatched"]),
    (hal.Eigh("float64", vectors=False), [1, 3], ["hipsolverDsyevjBatched"]),
    (hal.Eigh("float64", vectors=False), [1, 33], ["hipsolverDsyevd"]),
    (hal.Svd("float32", full_matrices=True), [2, 4, 3], ["hipsolverSgesvdjBatched"]),
    (hal.Svd("float32"), [2, 4, 3], ["hipsolverSgesvdj"] * 2),
    (hal.Qr("complex64", complete=True), [1, 4, 3], ["hipsolverCgeqrf", "hipsolverCungqr"]),
    (hal.Qr("float64"), [1, 4, 3], ["hipsolverDgeqrf", "hipsolverDorgqr"]),
]


def installed_hipsolver():
    """hip-python's ``hip.hipsolver`` (an attribute of ``hip`` in hip-python 10, not a submodule)."""
    try:
        from hip import hipsolver
    except ImportError:
        pytest.skip("hip-python's library bindings are not installed")
    return hipsolver


@pytest.fixture
def real_hipsolver():
    hs = installed_hipsolver()
    try:
        hs.hipsolverCreate()
    except RuntimeError:
        return hs  # the library is missing, as on the CI machine: calls stop after converting
    pytest.skip("libhipsolver.so loads here: the calls would reach the library")


@pytest.mark.parametrize("routine,constants,expected", CASES, ids=lambda c: getattr(c, "kind", None))
def test_each_routine_calls_hipsolver_per_batch_entry_with_arguments_that_convert(
        routine, constants, expected, real_hipsolver):
    hs = Recorder(real_hipsolver)
    backend = solver.HipSolver(hs, RecordingApi(hs.calls))
    assert backend.supports(routine) is None
    pointers = [4096 * (i + 1) for i in range(routine.bindings)]
    plan = backend.plan(routine, routine.call_of(constants), pointers)
    assert plan is backend.plan(routine, routine.call_of(constants), pointers)  # planned once
    hs.calls.clear()
    backend.enqueue(plan, tuple(constants), pointers, 1 << 20, plan.workspace_size, 5)
    names = [c[0] for c in hs.calls]
    assert names[0] == "hipsolverSetStream" and names[1] == "memcpy"
    assert [n for n in names if n not in ("hipsolverSetStream", "memcpy")] == expected


def test_a_failing_status_raises_its_typed_error():
    with pytest.raises(hal.ResourceExhaustedError, match="hipsolverSpotrf"):
        solver.check_hipsolver((_Status("HIPSOLVER_STATUS_ALLOC_FAILED", 2),), "hipsolverSpotrf")
    with pytest.raises(hal.UnimplementedError):
        solver.check_hipsolver((_Status("HIPSOLVER_STATUS_NOT_SUPPORTED", 15),), "hipsolverSgesvdj")
    assert solver.check_hipsolver((0, 7), "hipsolverSpotrf_bufferSize") == 7


class _Status(int):
    def __new__(cls, name: str, value: int):
        status = super().__new__(cls, value)
        status.name = name
        return status


def test_a_library_that_fails_to_load_refuses_every_routine_with_the_reason(real_hipsolver):
    deferred = DeferredBackend("hipSOLVER", lambda: SolverBackend(solver.HipSolverCalls(real_hipsolver, None)),
                               lambda exc: None)
    reason = deferred.supports(hal.Cholesky("float32"))
    assert reason is not None and "libhipsolver" in reason
    with pytest.raises(hal.UnavailableError):
        deferred.plan(hal.Cholesky("float32"), None, [])


def test_without_the_bindings_there_is_no_backend_and_the_reason_is_logged_once(monkeypatch, caplog, fresh_library):
    fresh_library(solver)
    monkeypatch.setitem(sys.modules, "hip.hipsolver", None)
    hip = sys.modules.get("hip")
    if hip is not None:
        monkeypatch.delattr(hip, "hipsolver", raising=False)
    with caplog.at_level(logging.WARNING, logger="hal"):
        assert solver.load(0) == {}
        assert solver.load(1) == {}
    assert len([r for r in caplog.records if "hipSOLVER is unavailable" in r.getMessage()]) == 1
