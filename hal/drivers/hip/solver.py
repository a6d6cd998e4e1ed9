"""hipSOLVER behind the HIP driver's solver routines (``hal.solver``), through hip-python's
``hip.hipsolver``. It has never run on AMD hardware (docs/hip.md).

``load()`` gives the backend of every solver routine kind when hip-python's ``hip.hipsolver``
imports, else an empty mapping, logging the reason once; ``libhipsolver.so`` loads at the first
routine (hip-python loads a library at its first call), and a library that fails to load makes
every solver routine refused with the reason: the runtime's linalg then raises
``UnimplementedError`` naming it.

The planning (out-of-place copies, a loop over the batch, workspace layout, the plan cache) is the
GPU drivers' (``hal/drivers/gpu/solver.py``), shared with the CUDA driver's cuSOLVER; this module
gives hipSOLVER's compatibility API (``hipsolver<T>potrf``, ``getrf``/``getrs``, ``syevd``/
``heevd``, ``gesvdj``, ``geqrf``, ``orgqr``/``ungqr``), which unlike cuSOLVER's takes a workspace
for ``getrf`` and ``getrs`` too. Every call returns ``(hipsolverStatus_t, values...)`` and is
checked here (``check_hipsolver``).
"""

from __future__ import annotations

from typing import Any

from hal import errors
from hal.distribution import install_hint
from hal.drivers.bindings_shim import check
from hal.drivers.gpu.library import DeferredBackend, VendorLibrary
from hal.drivers.gpu.solver import ShimTransfers, SolverBackend, kinds
from hal.drivers.gpu.status import StatusTable

PREFIX = {"float32": "S", "float64": "D", "complex64": "C", "complex128": "Z"}

HIPSOLVER = StatusTable("hipSOLVER", {
    **dict.fromkeys(("HIPSOLVER_STATUS_INVALID_VALUE", "HIPSOLVER_STATUS_INVALID_ENUM",
                     "HIPSOLVER_STATUS_HANDLE_IS_NULLPTR", "HIPSOLVER_STATUS_MATRIX_TYPE_NOT_SUPPORTED"),
                    errors.InvalidArgumentError),
    "HIPSOLVER_STATUS_ALLOC_FAILED": errors.ResourceExhaustedError,
    **dict.fromkeys(("HIPSOLVER_STATUS_NOT_SUPPORTED", "HIPSOLVER_STATUS_ARCH_MISMATCH"), errors.UnimplementedError),
    "HIPSOLVER_STATUS_NOT_INITIALIZED": errors.FailedPreconditionError,
}, (), lambda code: "")


def check_hipsolver(result: tuple, function: str, detail: str = "") -> object:
    """Raise for a failing hipsolverStatus_t; return the call's value(s)."""
    return check(HIPSOLVER, result, function, detail)


class HipSolverCalls(ShimTransfers):
    """hipSOLVER's dense calls on one handle (``hal.drivers.gpu.solver.SolverCalls``)."""

    name = "hipSOLVER"

    #: hipSOLVER has no batched LU (hipBLAS's is another library, often not installed).
    batched_lu = False

    def __init__(self, hs: Any, api: Any) -> None:
        self.hs, self.api = hs, api
        self.lower = hs.hipblasFillMode_t.HIPBLAS_FILL_MODE_LOWER
        self.op_n, self.op_t = hs.hipblasOperation_t.HIPBLAS_OP_N, hs.hipblasOperation_t.HIPBLAS_OP_T
        modes = hs.hipsolverEigMode_t
        self.vector, self.novector = modes.HIPSOLVER_EIG_MODE_VECTOR, modes.HIPSOLVER_EIG_MODE_NOVECTOR
        self.handle = self._call("hipsolverCreate")
        self._gesvdj: Any = None
        self._syevj_params: Any = None

    def _call(self, name: str, *args: Any) -> Any:
        return check_hipsolver(getattr(self.hs, name)(*args), name)

    def _typed(self, dtype: str, name: str, *args: Any) -> Any:
        return self._call(f"hipsolver{PREFIX[dtype]}{name}", *args)

    def set_stream(self, stream: Any) -> None:
        self._call("hipsolverSetStream", self.handle, stream)


    def potrf_lwork(self, dtype, n, a):
        return self._typed(dtype, "potrf_bufferSize", self.handle, self.lower, n, a, n)

    def potrf(self, dtype, n, a, work, lwork, info):
        self._typed(dtype, "potrf", self.handle, self.lower, n, a, n, work, lwork, info)


    def potrf_batched_lwork(self, dtype, n, array, batch):
        return self._typed(dtype, "potrfBatched_bufferSize", self.handle, self.lower, n, array, n, batch)

    def potrf_batched(self, dtype, n, array, work, lwork, info, batch):
        self._typed(dtype, "potrfBatched", self.handle, self.lower, n, array, n, work, lwork, info, batch)

    def getrf_lwork(self, dtype, n, a):
        return self._typed(dtype, "getrf_bufferSize", self.handle, n, n, a, n)

    def getrf(self, dtype, n, a, work, lwork, pivots, info):
        self._typed(dtype, "getrf", self.handle, n, n, a, n, work, lwork, pivots, info)

    def getrs_lwork(self, dtype, transpose, n, nrhs, a, pivots, b):
        return self._typed(dtype, "getrs_bufferSize", self.handle, self.op_t if transpose else self.op_n, n, nrhs,
                           a, n, pivots, b, n)

    def getrs(self, dtype, transpose, n, nrhs, a, pivots, b, work, lwork, info):
        self._typed(dtype, "getrs", self.handle, self.op_t if transpose else self.op_n, n, nrhs, a, n, pivots, b, n,
                    work, lwork, info)

    @staticmethod
    def _evd(dtype: str) -> str:
        return "syevd" if dtype.startswith("float") else "heevd"

    def evd_lwork(self, dtype, vectors, n, a, w):
        return self._typed(dtype, self._evd(dtype) + "_bufferSize", self.handle,
                           self.vector if vectors else self.novector, self.lower, n, a, n, w)

    def evd(self, dtype, vectors, n, a, w, work, lwork, info):
        self._typed(dtype, self._evd(dtype), self.handle, self.vector if vectors else self.novector, self.lower, n,
                    a, n, w, work, lwork, info)

    def _syevj(self) -> Any:
        if self._syevj_params is None:
            self._syevj_params = self._call("hipsolverCreateSyevjInfo")
        return self._syevj_params

    @staticmethod
    def _evj(dtype: str) -> str:
        return "syevjBatched" if dtype.startswith("float") else "heevjBatched"

    def evd_batched_lwork(self, dtype, vectors, n, a, w, batch):
        return self._typed(dtype, self._evj(dtype) + "_bufferSize", self.handle,
                           self.vector if vectors else self.novector, self.lower, n, a, n, w, self._syevj(), batch)

    def evd_batched(self, dtype, vectors, n, a, w, work, lwork, info, batch):
        self._typed(dtype, self._evj(dtype), self.handle, self.vector if vectors else self.novector, self.lower, n,
                    a, n, w, work, lwork, info, self._syevj(), batch)

    def gesvdj_batched_lwork(self, dtype, m, n, a, s, u, v, batch):
        return self._typed(dtype, "gesvdjBatched_bufferSize", self.handle, self.vector, m, n, a, m, s, u, m, v, n,
                           self._params(), batch)

    def gesvdj_batched(self, dtype, m, n, a, s, u, v, work, lwork, info, batch):
        self._typed(dtype, "gesvdjBatched", self.handle, self.vector, m, n, a, m, s, u, m, v, n, work, lwork, info,
                    self._params(), batch)

    def _params(self) -> Any:
        if self._gesvdj is None:
            self._gesvdj = self._call("hipsolverCreateGesvdjInfo")
        return self._gesvdj

    def gesvdj_lwork(self, dtype, full, m, n, a, s, u, v):
        return self._typed(dtype, "gesvdj_bufferSize", self.handle, self.vector, 0 if full else 1, m, n, a, m, s, u,
                           m, v, n, self._params())

    def gesvdj(self, dtype, full, m, n, a, s, u, v, work, lwork, info):
        self._typed(dtype, "gesvdj", self.handle, self.vector, 0 if full else 1, m, n, a, m, s, u, m, v, n, work,
                    lwork, info, self._params())

    def geqrf_lwork(self, dtype, m, n, a):
        return self._typed(dtype, "geqrf_bufferSize", self.handle, m, n, a, m)

    def geqrf(self, dtype, m, n, a, tau, work, lwork, info):
        self._typed(dtype, "geqrf", self.handle, m, n, a, m, tau, work, lwork, info)

    @staticmethod
    def _gqr(dtype: str) -> str:
        return "orgqr" if dtype.startswith("float") else "ungqr"

    def orgqr_lwork(self, dtype, m, n, k, a, tau):
        return self._typed(dtype, self._gqr(dtype) + "_bufferSize", self.handle, m, n, k, a, m, tau)

    def orgqr(self, dtype, m, n, k, a, tau, work, lwork, info):
        self._typed(dtype, self._gqr(dtype), self.handle, m, n, k, a, m, tau, work, lwork, info)


def HipSolver(hs: Any, api: Any) -> SolverBackend:  # noqa: N802 - the backend's name
    """The solver backend over ``hs`` (hip-python's hipsolver, or a stand-in) and the device's shim."""
    return SolverBackend(HipSolverCalls(hs, api))


#: hipSOLVER's backend of each HIP device.
LIBRARY = VendorLibrary("hip", "hipSOLVER", "rt.linalg's decompositions cannot run on HIP devices; "
                        f"{install_hint('hip')} (hip-python's libraries and ROCm's hipSOLVER) for them")


def _bindings() -> Any:
    from hip import hipsolver

    return hipsolver


def load(ordinal: int, api: Any = None) -> dict[str, DeferredBackend]:
    """The hipSOLVER backend of HIP device ``ordinal`` for every solver routine kind, loaded at its
    first use; empty when hip-python's ``hip.hipsolver`` does not import (the reason logged once)."""
    return kinds(LIBRARY.load(ordinal, _bindings, lambda hs: HipSolver(hs, api)))
