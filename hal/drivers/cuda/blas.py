"""cuBLASLt (and cuBLAS) behind the CUDA driver's library routines, through nvmath-python's bindings.

``load()`` gives the backend (``hal.drivers.gpu.library.LibraryBackend``) when nvmath-python and
the cuBLASLt library (the ``nvidia-cublas`` wheel) load, else None, logging the reason once: the
device then lacks the ``library`` format and the runtime keeps its own kernels.

The row-major to column-major mapping, the plan cache and the measured choice among candidates
are the GPU drivers' (``hal/drivers/gpu/gemm.py``); this module lists the candidates of a product:

- cuBLASLt's heuristic algorithms (``cublasLtMatmul``, epilogues included);
- without an epilogue, cuBLAS's classic ``cublasGemmStridedBatchedEx``. For IEEE float32 none of
  cuBLASLt's algorithms is among the fast ones: its float32 products of 4096^2 ran at 19-23
  TFLOP/s on an H200, where the classic GEMM (which PyTorch calls) ran at 51.

Products never allocate: the workspace is the call's own (``LibraryCall``), also given to the
classic handle (``cublasSetWorkspace``), so a captured call holds no memory node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hal.distribution import install_hint
from hal.drivers.gpu.gemm import GemmBackend, Plan, column_major
from hal.drivers.gpu.library import DeferredBackend, VendorLibrary
from hal.library import Gemm, GemmShape, relu_mask_row_bytes

#: cudaDataType_t and cublasComputeType_t values (library_types.h, cublas_api.h): CUDA_R_32F, CUDA_R_64F,
#: CUDA_R_16F, CUDA_R_16BF, CUDA_C_32F, CUDA_C_64F.
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14, "complex64": 4, "complex128": 5}
#: The cudaDataType_t of alpha and beta by their numpy type.
SCALE_TYPES = {np.float32: DATA_TYPES["float32"], np.float64: DATA_TYPES["float64"],
               np.complex64: DATA_TYPES["complex64"], np.complex128: DATA_TYPES["complex128"]}
COMPUTE_32F, COMPUTE_32F_FAST_TF32, COMPUTE_64F = 68, 77, 70
#: The most workspace a cuBLASLt plan may ask for (NVIDIA's advice for Hopper).
WORKSPACE_LIMIT = 32 << 20
#: cuBLASLt algorithms asked of the heuristic.
CANDIDATES = 8
#: cublasGemmEx's algorithm choice left to cuBLAS, and the workspace its calls are given.
DEFAULT_ALGORITHM = -1
CLASSIC_WORKSPACE = 1 << 20
#: cublasLtEpilogue_t members by Gemm epilogue. The row-major product is D = op(X) op(Y) with X the
#: memory of B (``column_major``), so B's sums over k (``bgrad_b``) are cuBLASLt's BGRADA.
EPILOGUES = {"none": "DEFAULT", "bias": "BIAS", "relu": "RELU", "bias_relu": "RELU_BIAS", "gelu": "GELU",
             "bias_gelu": "GELU_BIAS", "relu_aux": "RELU_AUX", "bias_relu_aux": "RELU_AUX_BIAS",
             "gelu_aux": "GELU_AUX", "bias_gelu_aux": "GELU_AUX_BIAS", "drelu": "DRELU",
             "drelu_bgrad": "DRELU_BGRAD", "dgelu": "DGELU", "dgelu_bgrad": "DGELU_BGRAD", "bgrad_b": "BGRADA"}


def compute_types(gemm: Gemm) -> tuple[int, type]:
    """(cublasComputeType_t, the scalars' numpy type): 16-bit inputs accumulate in float32 on
    tensor cores; float32 is IEEE unless TF32 was asked for; complex products compute in their
    parts' precision with complex scalars."""
    if gemm.dtype == "float64":
        return COMPUTE_64F, np.float64
    if gemm.dtype == "complex128":
        return COMPUTE_64F, np.complex128
    if gemm.dtype == "complex64":
        return COMPUTE_32F, np.complex64
    return (COMPUTE_32F_FAST_TF32 if gemm.precision == "tf32" else COMPUTE_32F), np.float32


class CublasLt(GemmBackend):
    """The ``LibraryBackend`` of a CUDA device: one cuBLASLt handle, one classic cuBLAS handle."""

    def __init__(self, lt: Any, api: Any = None, blas: Any = None) -> None:
        super().__init__(api)
        self.lt = lt
        #: nvmath's classic cuBLAS bindings (None: cuBLASLt only).
        self.blas = blas
        version = lt.get_version()
        self.name = f"cuBLASLt {version // 10000}.{version // 100 % 100}.{version % 100}"
        self.handle = lt.create()
        self.blas_handle: Any = None  # made at the first classic plan, with the device's context current

    def candidates(self, gemm: Gemm, shape: GemmShape, aligned: tuple[int, int, int]) -> list[Plan]:
        plans = self._lt_candidates(gemm, shape, aligned)
        classic = self._classic_candidate(gemm, shape)
        return plans + ([classic] if classic is not None else [])

    def _lt_candidates(self, gemm: Gemm, shape: GemmShape, aligned: tuple[int, int, int]) -> list[Plan]:
        """The heuristic's algorithms (best first) for the product as cuBLASLt's D = op(X) op(Y)."""
        lt = self.lt
        problem = column_major(shape)
        data_type = DATA_TYPES[gemm.dtype]
        compute, scale = compute_types(gemm)
        alpha, beta = np.ones(1, scale), np.zeros(1, scale)
        desc = lt.matmul_desc_create(compute, SCALE_TYPES[scale])
        attribute = lt.MatmulDescAttribute
        _set(lt.matmul_desc_set_attribute, desc, attribute.TRANSA, np.int32(problem.transpose_x))
        _set(lt.matmul_desc_set_attribute, desc, attribute.TRANSB, np.int32(problem.transpose_y))
        _set(lt.matmul_desc_set_attribute, desc, attribute.EPILOGUE,
             np.uint32(getattr(lt.Epilogue, EPILOGUES[gemm.epilogue])))
        bias_pointer = np.zeros(1, np.uint64) if gemm.has_bias or gemm.bias_gradient else None
        aux_pointer = np.zeros(1, np.uint64) if gemm.aux else None
        if gemm.aux:  # the mask's ld counts bits (rows padded to 128); the GELU input has C's layout
            aux_ld = relu_mask_row_bytes(shape.n) * 8 if gemm.aux == "relu_mask" else shape.ldc
            _set(lt.matmul_desc_set_attribute, desc, attribute.EPILOGUE_AUX_LD, np.int64(aux_ld))
        layouts = [self._layout(data_type, rows, cols, ld, stride, shape.batch)
                   for rows, cols, ld, stride in (problem.x, problem.y, problem.d)]
        layout_x, layout_y, layout_d = layouts
        preference = lt.matmul_preference_create()
        try:
            prefs = lt.MatmulPreferenceAttribute
            _set(lt.matmul_preference_set_attribute, preference, prefs.MAX_WORKSPACE_BYTES, np.uint64(WORKSPACE_LIMIT))
            align_y, align_x, align_d = aligned  # (A, B, C) -> Y, X, D
            for attr, value in ((prefs.MIN_ALIGNMENT_A_BYTES, align_x), (prefs.MIN_ALIGNMENT_B_BYTES, align_y),
                                (prefs.MIN_ALIGNMENT_C_BYTES, align_d), (prefs.MIN_ALIGNMENT_D_BYTES, align_d)):
                _set(lt.matmul_preference_set_attribute, preference, attr, np.uint32(value))
            results = np.zeros(CANDIDATES, lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, np.int32)
            lt.matmul_algo_get_heuristic(self.handle, desc, layout_x, layout_y, layout_d, layout_d, preference,
                                         CANDIDATES, results.ctypes.data, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(preference)
        owned = [alpha, beta, desc, layouts, bias_pointer, aux_pointer]
        set_attribute = lt.matmul_desc_set_attribute
        bias_attribute, aux_attribute = attribute.BIAS_POINTER, attribute.EPILOGUE_AUX_POINTER
        # The host addresses a call passes, taken once (``ndarray.ctypes`` builds an object each time).
        alpha_at, beta_at = alpha.ctypes.data, beta.ctypes.data
        bias_at = bias_pointer.ctypes.data if bias_pointer is not None else 0
        aux_at = aux_pointer.ctypes.data if aux_pointer is not None else 0
        plans = []
        for i in range(int(count[0])):
            algorithm = results[i:i + 1].copy()

            def run(pointers, workspace, workspace_size, stream, algo=algorithm.ctypes.data) -> None:
                c, a, b = pointers[0], pointers[1], pointers[2]
                if bias_pointer is not None:
                    bias_pointer[0] = pointers[3]
                    set_attribute(desc, bias_attribute, bias_at, 8)
                if aux_pointer is not None:
                    aux_pointer[0] = pointers[-1]
                    set_attribute(desc, aux_attribute, aux_at, 8)
                lt.matmul(self.handle, desc, alpha_at, b, layout_x, a, layout_y, beta_at,
                          c, layout_d, c, layout_d, algo, workspace, workspace_size, stream)

            plans.append(Plan(run, int(algorithm["workspace_size"][0]), [*owned, algorithm], "cublasLt"))
        return plans

    def _classic_candidate(self, gemm: Gemm, shape: GemmShape) -> Plan | None:
        """cuBLAS's own GEMM (``cublasGemmStridedBatchedEx``) for products without an epilogue."""
        blas = self.blas
        if blas is None or gemm.epilogue != "none":
            return None
        problem = column_major(shape)
        data_type = DATA_TYPES[gemm.dtype]
        compute, scale = compute_types(gemm)
        alpha, beta = np.ones(1, scale), np.zeros(1, scale)
        (_, _, ldx, stride_x), (_, _, ldy, stride_y), (rows, cols, ldd, stride_d) = problem.x, problem.y, problem.d
        if self.blas_handle is None:
            self.blas_handle = blas.create()
        handle = self.blas_handle
        alpha_at, beta_at = alpha.ctypes.data, beta.ctypes.data  # (taken once, as in _lt_candidates)

        def run(pointers, workspace, workspace_size, stream) -> None:
            c, a, b = pointers[0], pointers[1], pointers[2]
            blas.set_stream(handle, stream)
            blas.set_workspace(handle, workspace, workspace_size)  # never its own: captures hold no allocation
            blas.gemm_strided_batched_ex(handle, problem.transpose_x, problem.transpose_y, rows, cols, shape.k,
                                         alpha_at, b, data_type, ldx, stride_x, a, data_type, ldy, stride_y,
                                         beta_at, c, data_type, ldd, stride_d, shape.batch, compute,
                                         DEFAULT_ALGORITHM)

        return Plan(run, CLASSIC_WORKSPACE, [alpha, beta], "cublas")

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


#: cuBLASLt's backend of each CUDA device (its plans are the device's).
LIBRARY = VendorLibrary("cuda", "cuBLASLt", "matmul runs on the runtime's own kernels; "
                        f"{install_hint('cuda')} (nvmath-python and nvidia-cublas) for vendor GEMMs")


def _bindings() -> Any:
    from nvmath.bindings import cublasLt

    return cublasLt


def classic_bindings() -> Any:
    """nvmath's classic cuBLAS bindings, or None where they do not import (cuBLASLt alone still
    serves every product; the solvers then run their LUs one matrix at a time)."""
    try:
        from nvmath.bindings import cublas
    except Exception:
        return None
    return cublas


def load(ordinal: int, api: Any = None) -> DeferredBackend | None:
    """The cuBLASLt backend of CUDA device ``ordinal`` (``api``: the shim that times candidate
    algorithms), loaded at its first use; None when nvmath-python is missing (the reason logged
    once per process)."""
    return LIBRARY.load(ordinal, _bindings, lambda lt: CublasLt(lt, api, classic_bindings()))
