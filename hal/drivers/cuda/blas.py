"""cuBLASLt behind the CUDA driver's library routines, through nvmath-python's bindings.

``load()`` gives the backend (``hal.drivers.gpu.library.LibraryBackend``) when nvmath-python and
the cuBLASLt library (the ``nvidia-cublas`` wheel) load, else None, logging the reason once: the
device then lacks the ``library`` format and the runtime keeps its own kernels.

cuBLASLt is column-major; a ``hal.Gemm`` is row-major. A row-major C (m x n) is, read as
column-major, C^T (n x m) = op(B)^T op(A)^T, so each product is planned as D = X Y with X the
memory of B and Y the memory of A (``column_major``); a bias of n elements is then per row of D,
which is what cuBLASLt's bias epilogues add.

Plans (descriptors, layouts, the heuristic's algorithm and its workspace size) are made once per
(routine, shape, operand alignment) and cached: a re-issue or a graph re-capture is one
``cublasLtMatmul``. Products never allocate: the workspace is the call's own (``LibraryCall``),
so a captured call holds no memory node.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from hal.errors import UnimplementedError
from hal.library import Gemm, GemmShape, Routine
from hal.log import driver_logger

#: cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h).
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70
OP_N, OP_T = 0, 1
#: The most workspace a plan may ask for (NVIDIA's advice for Hopper).
WORKSPACE_LIMIT = 32 << 20
#: Largest alignment the heuristic distinguishes (its default assumption).
MAX_ALIGNMENT = 256
EPILOGUES = {"none": "DEFAULT", "bias": "BIAS", "relu": "RELU", "bias_relu": "RELU_BIAS", "gelu": "GELU",
             "bias_gelu": "GELU_BIAS"}


@dataclasses.dataclass(frozen=True)
class ColumnMajor:
    """A row-major Gemm as cuBLASLt's D (rows x cols) = op(X) op(Y): operations, and each matrix's
    (rows, cols, ld) as stored (column-major) with its batch stride, in elements."""

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


class _Plan:
    """One planned product: descriptors, layouts, the algorithm, scalars and the workspace size."""

    __slots__ = ("desc", "layouts", "heuristic", "algo", "workspace_size", "alpha", "beta", "bias_attribute")


class CublasLt:
    """The ``LibraryBackend`` of a CUDA device (one cuBLASLt handle, plans cached per problem)."""

    def __init__(self, lt: Any) -> None:
        self.lt = lt
        version = lt.get_version()
        self.name = f"cuBLASLt {version // 10000}.{version // 100 % 100}.{version % 100}"
        self.handle = lt.create()
        self._plans: dict[tuple, _Plan] = {}
        self._lock = threading.Lock()

    def supports(self, routine: Routine) -> str | None:
        if not isinstance(routine, Gemm):
            return f"{type(routine).__name__} is not a routine of cuBLASLt"
        return None

    # -- LibraryBackend ------------------------------------------------------------------------
    def workspace_size(self, routine: Routine, checked: Any, pointers: Sequence[int]) -> int:
        return self._plan(routine, checked, pointers).workspace_size  # type: ignore[arg-type]

    def enqueue(self, routine: Routine, checked: Any, constants: tuple[int, ...], pointers: Sequence[int],
                workspace: int, workspace_size: int, stream: Any) -> None:
        gemm: Gemm = routine  # type: ignore[assignment]
        plan = self._plan(gemm, checked, pointers)
        lt = self.lt
        c, a, b = pointers[0], pointers[1], pointers[2]
        layout_x, layout_y, layout_d = plan.layouts
        with self._lock:  # the bias pointer is an attribute of the plan's shared descriptor
            if plan.bias_attribute is not None:
                plan.bias_attribute[0] = pointers[3]
                lt.matmul_desc_set_attribute(plan.desc, lt.MatmulDescAttribute.BIAS_POINTER,
                                             plan.bias_attribute.ctypes.data, 8)
            lt.matmul(self.handle, plan.desc, plan.alpha.ctypes.data, b, layout_x, a, layout_y,
                      plan.beta.ctypes.data, c, layout_d, c, layout_d, plan.algo, workspace, workspace_size,
                      int(stream))

    # -- planning ----------------------------------------------------------------------------------
    def _plan(self, gemm: Gemm, shape: GemmShape, pointers: Sequence[int]) -> _Plan:
        size = gemm.element_size
        aligned = (alignment(pointers[1], shape.lda, shape.stride_a, element_size=size),
                   alignment(pointers[2], shape.ldb, shape.stride_b, element_size=size),
                   alignment(pointers[0], shape.ldc, shape.stride_c, element_size=size))
        key = (gemm, shape, aligned)
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = self._plans[key] = self._make_plan(gemm, shape, aligned)
        return plan

    def _make_plan(self, gemm: Gemm, shape: GemmShape, aligned: tuple[int, int, int]) -> _Plan:
        lt = self.lt
        problem = column_major(shape)
        data_type = DATA_TYPES[gemm.dtype]
        if gemm.dtype == "float64":
            compute, scale = COMPUTE_64F, np.float64
        else:  # 16-bit inputs accumulate in float32 on tensor cores; float32 is IEEE unless tf32 was asked
            compute, scale = (COMPUTE_32F_FAST_TF32 if gemm.precision == "tf32" else COMPUTE_32F), np.float32
        plan = _Plan()
        plan.alpha = np.ones(1, scale)
        plan.beta = np.zeros(1, scale)
        plan.desc = lt.matmul_desc_create(compute, DATA_TYPES["float64" if scale is np.float64 else "float32"])
        attribute = lt.MatmulDescAttribute
        _set(lt.matmul_desc_set_attribute, plan.desc, attribute.TRANSA, np.int32(problem.transpose_x))
        _set(lt.matmul_desc_set_attribute, plan.desc, attribute.TRANSB, np.int32(problem.transpose_y))
        epilogue = getattr(lt.Epilogue, EPILOGUES[gemm.epilogue])
        _set(lt.matmul_desc_set_attribute, plan.desc, attribute.EPILOGUE, np.uint32(epilogue))
        plan.bias_attribute = np.zeros(1, np.uint64) if gemm.has_bias else None
        plan.layouts = tuple(self._layout(data_type, rows, cols, ld, stride, shape.batch)
                             for rows, cols, ld, stride in (problem.x, problem.y, problem.d))
        preference = lt.matmul_preference_create()
        try:
            prefs = lt.MatmulPreferenceAttribute
            _set(lt.matmul_preference_set_attribute, preference, prefs.MAX_WORKSPACE_BYTES, np.uint64(WORKSPACE_LIMIT))
            align_y, align_x, align_d = aligned  # (A, B, C) -> Y, X, D
            for attr, value in ((prefs.MIN_ALIGNMENT_A_BYTES, align_x), (prefs.MIN_ALIGNMENT_B_BYTES, align_y),
                                (prefs.MIN_ALIGNMENT_C_BYTES, align_d), (prefs.MIN_ALIGNMENT_D_BYTES, align_d)):
                _set(lt.matmul_preference_set_attribute, preference, attr, np.uint32(value))
            results = np.zeros(1, lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, np.int32)
            layout_x, layout_y, layout_d = plan.layouts
            lt.matmul_algo_get_heuristic(self.handle, plan.desc, layout_x, layout_y, layout_d, layout_d, preference,
                                         1, results.ctypes.data, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(preference)
        if count[0] < 1:
            raise UnimplementedError(f"{self.name} has no algorithm for {gemm} of {shape}")
        plan.heuristic = results  # keeps the algorithm's memory alive
        plan.algo = results.ctypes.data  # the first field of the result is the algorithm
        plan.workspace_size = int(results["workspace_size"][0])
        return plan

    def _layout(self, data_type: int, rows: int, cols: int, ld: int, stride: int, batch: int) -> int:
        lt = self.lt
        layout = lt.matrix_layout_create(data_type, rows, cols, ld)
        if batch > 1:
            attribute = lt.MatrixLayoutAttribute
            _set(lt.matrix_layout_set_attribute, layout, attribute.BATCH_COUNT, np.int32(batch))
            _set(lt.matrix_layout_set_attribute, layout, attribute.STRIDED_BATCH_OFFSET, np.int64(stride))
        return layout


def _set(setter: Any, target: int, attribute: Any, value: np.generic) -> None:
    """Set a cuBLASLt attribute from a numpy scalar of the attribute's C type."""
    buffer = np.array(value)
    setter(target, attribute, buffer.ctypes.data, buffer.nbytes)


#: One backend per device ordinal (its plans are the device's), made at the first device of each.
_backends: dict[int, CublasLt] = {}
_reported: list[BaseException] = []
_lock = threading.Lock()


def load(ordinal: int) -> CublasLt | None:
    """The cuBLASLt backend of CUDA device ``ordinal``, or None when the library is missing
    (the reason logged once per process)."""
    with _lock:
        backend = _backends.get(ordinal)
        if backend is not None:
            return backend
        try:
            from nvmath.bindings import cublasLt as lt

            backend = _backends[ordinal] = CublasLt(lt)
            return backend
        except Exception as exc:  # an import error, a missing library, or a failing handle creation
            if not _reported:
                _reported.append(exc)
                driver_logger("cuda").warning(
                    "cuBLASLt is unavailable (%s: %s): matmul runs on the runtime's own kernels; "
                    "pip install 'pyhal[cuda]' (nvmath-python and nvidia-cublas) for vendor GEMMs",
                    type(exc).__name__, exc)
            return None
