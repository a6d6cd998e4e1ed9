"""cuSOLVER behind the CUDA driver's solver routines (``hal.solver``), through nvmath-python's
``nvmath.bindings.cusolverDn``.

``load()`` gives the backend of every solver routine kind when nvmath-python imports, else an
empty mapping, logging the reason once; the library itself (the ``nvidia-cusolver`` wheel) loads
at the first routine, and a library that fails to load makes every solver routine refused with the
reason: the runtime's linalg then raises ``UnimplementedError`` naming it.

The planning (out-of-place copies, a loop over the batch, workspace layout, the plan cache) is the
GPU drivers' (``hal/drivers/gpu/solver.py``); this module gives cuSOLVER's legacy dense calls
(``cusolverDn<t>potrf``, ``getrf``/``getrs`` with int32 pivots, ``syevd``/``heevd``,
``gesvdj``, ``geqrf``, ``orgqr``/``ungqr``), their workspace sizes in elements, and the enums; and
cuBLAS's batched LU (``cublas<t>getrfBatched``/``getrsBatched``, on a cuBLAS handle of its own)
where nvmath-python's cuBLAS bindings import: cuSOLVER has no batched LU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hal.distribution import install_hint
from hal.drivers.cuda.blas import classic_bindings
from hal.drivers.gpu.library import DeferredBackend, VendorLibrary
from hal.drivers.gpu.solver import ShimTransfers, SolverBackend, SolverPlan, kinds
from hal.log import driver_logger

#: cuSOLVER/cuBLAS enum values (cublas_api.h, cusolver_common.h).
FILL_LOWER = 0
OP_N, OP_T = 0, 1
EIG_NOVECTOR, EIG_VECTOR = 0, 1
PREFIX = {"float32": "s", "float64": "d", "complex64": "c", "complex128": "z"}

__all__ = ["CuSolverCalls", "SolverPlan", "load"]


class CuSolverCalls(ShimTransfers):
    """cuSOLVER's dense calls on one handle (``hal.drivers.gpu.solver.SolverCalls``)."""

    name = "cuSOLVER"

    def __init__(self, dn: Any, api: Any, blas: Any = None) -> None:
        self.dn, self.api, self.blas = dn, api, blas
        self.handle = dn.create()
        self._gesvdj: Any = None
        self._syevj_params: Any = None
        self.blas_handle: Any = None
        if blas is not None:
            try:
                self.blas_handle = blas.create()
            except Exception as exc:  # libcublas missing: the LUs run one matrix at a time
                driver_logger("cuda").info("cuBLAS's batched LU is unavailable (%s: %s)", type(exc).__name__, exc)
        self.batched_lu = self.blas_handle is not None
        #: getrsBatched's info word is host memory (it reports a bad argument, nothing the device finds).
        self._getrs_info = np.zeros(1, np.int32)

    def _fn(self, dtype: str, name: str) -> Any:
        return getattr(self.dn, PREFIX[dtype] + name)

    @staticmethod
    def _real(dtype: str) -> bool:
        return dtype.startswith("float")

    def set_stream(self, stream: Any) -> None:
        stream = int(stream)  # (a CUstream, or the native path's integer)
        self.dn.set_stream(self.handle, stream)
        if self.blas_handle is not None:
            self.blas.set_stream(self.blas_handle, stream)


    def potrf_lwork(self, dtype, n, a):
        return self._fn(dtype, "potrf_buffer_size")(self.handle, FILL_LOWER, n, a, n)

    def potrf(self, dtype, n, a, work, lwork, info):
        self._fn(dtype, "potrf")(self.handle, FILL_LOWER, n, a, n, work, lwork, info)


    def potrf_batched_lwork(self, dtype, n, array, batch):
        return 0  # (cuSOLVER's potrfBatched takes no workspace)

    def potrf_batched(self, dtype, n, array, work, lwork, info, batch):
        self._fn(dtype, "potrf_batched")(self.handle, FILL_LOWER, n, array, n, info, batch)

    def getrf_lwork(self, dtype, n, a):
        return self._fn(dtype, "getrf_buffer_size")(self.handle, n, n, a, n)

    def getrf(self, dtype, n, a, work, lwork, pivots, info):
        self._fn(dtype, "getrf")(self.handle, n, n, a, n, work, pivots, info)

    def getrs_lwork(self, dtype, transpose, n, nrhs, a, pivots, b):
        return 0  # (cuSOLVER's getrs takes no workspace)

    def getrs(self, dtype, transpose, n, nrhs, a, pivots, b, work, lwork, info):
        self._fn(dtype, "getrs")(self.handle, OP_T if transpose else OP_N, n, nrhs, a, n, pivots, b, n, info)

    def _evd(self, dtype: str) -> str:
        return "syevd" if self._real(dtype) else "heevd"

    def evd_lwork(self, dtype, vectors, n, a, w):
        return self._fn(dtype, self._evd(dtype) + "_buffer_size")(
            self.handle, EIG_VECTOR if vectors else EIG_NOVECTOR, FILL_LOWER, n, a, n, w)

    def evd(self, dtype, vectors, n, a, w, work, lwork, info):
        self._fn(dtype, self._evd(dtype))(self.handle, EIG_VECTOR if vectors else EIG_NOVECTOR, FILL_LOWER, n, a, n,
                                          w, work, lwork, info)

    def _syevj(self) -> Any:
        if self._syevj_params is None:
            self._syevj_params = self.dn.create_syevj_info()
        return self._syevj_params

    def _evj(self, dtype: str) -> str:
        return "syevj_batched" if self._real(dtype) else "heevj_batched"

    def evd_batched_lwork(self, dtype, vectors, n, a, w, batch):
        return self._fn(dtype, self._evj(dtype) + "_buffer_size")(
            self.handle, EIG_VECTOR if vectors else EIG_NOVECTOR, FILL_LOWER, n, a, n, w, self._syevj(), batch)

    def evd_batched(self, dtype, vectors, n, a, w, work, lwork, info, batch):
        self._fn(dtype, self._evj(dtype))(self.handle, EIG_VECTOR if vectors else EIG_NOVECTOR, FILL_LOWER, n, a, n,
                                          w, work, lwork, info, self._syevj(), batch)

    def gesvdj_batched_lwork(self, dtype, m, n, a, s, u, v, batch):
        return self._fn(dtype, "gesvdj_batched_buffer_size")(self.handle, EIG_VECTOR, m, n, a, m, s, u, m, v, n,
                                                             self._params(), batch)

    def gesvdj_batched(self, dtype, m, n, a, s, u, v, work, lwork, info, batch):
        self._fn(dtype, "gesvdj_batched")(self.handle, EIG_VECTOR, m, n, a, m, s, u, m, v, n, work, lwork, info,
                                          self._params(), batch)

    def _params(self) -> Any:
        if self._gesvdj is None:
            self._gesvdj = self.dn.create_gesvdj_info()
        return self._gesvdj

    def gesvdj_lwork(self, dtype, full, m, n, a, s, u, v):
        return self._fn(dtype, "gesvdj_buffer_size")(self.handle, EIG_VECTOR, 0 if full else 1, m, n, a, m, s, u, m,
                                                     v, n, self._params())

    def gesvdj(self, dtype, full, m, n, a, s, u, v, work, lwork, info):
        self._fn(dtype, "gesvdj")(self.handle, EIG_VECTOR, 0 if full else 1, m, n, a, m, s, u, m, v, n, work, lwork,
                                  info, self._params())

    def getrf_batched(self, dtype, n, array, pivots, info, batch):
        getattr(self.blas, PREFIX[dtype] + "getrf_batched")(self.blas_handle, n, array, n, pivots, info, batch)

    def getrs_batched(self, dtype, transpose, n, nrhs, lu_array, pivots, b_array, batch):
        getattr(self.blas, PREFIX[dtype] + "getrs_batched")(self.blas_handle, OP_T if transpose else OP_N, n, nrhs,
                                                            lu_array, n, pivots, b_array, n,
                                                            self._getrs_info.ctypes.data, batch)

    def geqrf_lwork(self, dtype, m, n, a):
        return self._fn(dtype, "geqrf_buffer_size")(self.handle, m, n, a, m)

    def geqrf(self, dtype, m, n, a, tau, work, lwork, info):
        self._fn(dtype, "geqrf")(self.handle, m, n, a, m, tau, work, lwork, info)

    def _gqr(self, dtype: str) -> str:
        return "orgqr" if self._real(dtype) else "ungqr"

    def orgqr_lwork(self, dtype, m, n, k, a, tau):
        return self._fn(dtype, self._gqr(dtype) + "_buffer_size")(self.handle, m, n, k, a, m, tau)

    def orgqr(self, dtype, m, n, k, a, tau, work, lwork, info):
        self._fn(dtype, self._gqr(dtype))(self.handle, m, n, k, a, m, tau, work, lwork, info)


def CuSolver(dn: Any, api: Any, blas: Any = None) -> SolverBackend:  # noqa: N802 - the backend's name
    """The solver backend over ``dn`` (nvmath's cusolverDn, or a stand-in), the device's shim and
    ``blas`` (nvmath's cublas, for the batched LU; None: LUs one matrix at a time)."""
    return SolverBackend(CuSolverCalls(dn, api, blas))


#: cuSOLVER's backend of each CUDA device.
LIBRARY = VendorLibrary("cuda", "cuSOLVER", "rt.linalg's decompositions cannot run on CUDA devices; "
                        f"{install_hint('cuda')} (nvmath-python and nvidia-cusolver) for them")


def _bindings() -> Any:
    from nvmath.bindings import cusolverDn

    return cusolverDn


def load(ordinal: int, api: Any = None) -> dict[str, DeferredBackend]:
    """The cuSOLVER backend of CUDA device ``ordinal`` for every solver routine kind, loaded at its
    first use; empty when nvmath-python is missing (the reason logged once per process)."""
    return kinds(LIBRARY.load(ordinal, _bindings, lambda dn: CuSolver(dn, api, classic_bindings())))
