"""hipBLASLt behind the HIP driver's library routines, through hip-python's bindings (``hip.hipblaslt``).

``load()`` gives the backend (``hal.drivers.gpu.library.LibraryBackend``) when hip-python's library
bindings import and ``libhipblaslt.so`` loads, else None, logging the reason once: the device then
lacks the ``library`` format and the runtime keeps its own kernels.

The row-major to column-major mapping, the plan cache and the measured choice among candidates
are the GPU drivers' (``hal/drivers/gpu/gemm.py``); this module lists the candidates of a product:
the algorithms hipBLASLt's heuristic offers (``hipblasLtMatmulAlgoGetHeuristic``) for
D = op(X) op(Y), epilogues included. There is no second library among them, as the CUDA driver's
classic cuBLAS: hipBLAS is another ROCm library, often not installed beside hipBLASLt.

Types: hipBLASLt multiplies float32, float16 and bfloat16 (its GEMM type table); float64 is refused
by ``supports``. Products accumulate in float32 (``HIPBLAS_COMPUTE_32F``, IEEE); the ``tf32``
precision asks for ``HIPBLAS_COMPUTE_32F_FAST_TF32``, which hipBLASLt runs as its xf32. Where the
device has no xf32 kernels the heuristic offers nothing and planning raises UnimplementedError.

Products never allocate: the workspace is the call's own (``LibraryCall``), so a captured call holds
no memory node. Every call's hipblasStatus_t is checked by ``status.check_hipblaslt``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hal.distribution import install_hint
from hal.drivers.gpu.gemm import OP_N, OP_T, ColumnMajor, GemmBackend, Plan, column_major
from hal.drivers.gpu.library import VendorLibrary
from hal.drivers.hip.status import check_hipblaslt
from hal.errors import UnimplementedError
from hal.library import Gemm, GemmShape, Routine

#: hipDataType members of the routine dtypes hipBLASLt multiplies.
DATA_TYPES = {"float32": "HIP_R_32F", "float16": "HIP_R_16F", "bfloat16": "HIP_R_16BF"}
#: The alpha/beta scalars are float32 for every type above.
SCALE_TYPE = "HIP_R_32F"
#: hipblasComputeType_t members by Gemm precision.
COMPUTE_TYPES = {"ieee": "HIPBLAS_COMPUTE_32F", "tf32": "HIPBLAS_COMPUTE_32F_FAST_TF32"}
#: hipblasLtEpilogue_t members by Gemm epilogue.
EPILOGUES = {"none": "HIPBLASLT_EPILOGUE_DEFAULT", "bias": "HIPBLASLT_EPILOGUE_BIAS",
             "relu": "HIPBLASLT_EPILOGUE_RELU", "bias_relu": "HIPBLASLT_EPILOGUE_RELU_BIAS",
             "gelu": "HIPBLASLT_EPILOGUE_GELU", "bias_gelu": "HIPBLASLT_EPILOGUE_GELU_BIAS"}
#: hipblasOperation_t members by the planner's operations (hipBLAS numbers them 111, 112).
OPERATIONS = {OP_N: "HIPBLAS_OP_N", OP_T: "HIPBLAS_OP_T"}
#: The most workspace an algorithm may ask for; the call's workspace is made to its plan's size.
WORKSPACE_LIMIT = 32 << 20
#: Algorithms asked of the heuristic.
CANDIDATES = 8


@dataclasses.dataclass(frozen=True)
class Enums:
    """hip-python's enums that hipBLASLt's calls take but ``hip.hipblaslt`` does not define."""

    data_type: Any  # hip.hip.hipDataType
    compute_type: Any  # hip.hipblas.hipblasComputeType_t
    operation: Any  # hip.hipblas.hipblasOperation_t

    @classmethod
    def installed(cls) -> Enums:
        from hip import hip, hipblas

        return cls(hip.hipDataType, hipblas.hipblasComputeType_t, hipblas.hipblasOperation_t)


@dataclasses.dataclass(frozen=True)
class GemmTypes:
    """The hipBLASLt enum members of one Gemm routine."""

    data: Any
    scale: Any
    compute: Any
    epilogue: Any


def unsupported(lt: Any, enums: Enums, gemm: Gemm) -> str | None:
    """Why hipBLASLt (as bound by the installed hip-python) cannot run ``gemm``, or None."""
    if gemm.epilogue not in EPILOGUES:
        # hipBLASLt's aux outputs differ from the HAL's (its ReLU aux is the pre-activation matrix,
        # not a mask of bits) and were never run on AMD hardware here: the runtime keeps the
        # separate kernels for these on HIP.
        return f"the {gemm.epilogue!r} epilogue is not wired to hipBLASLt (forward epilogues without aux are)"
    if gemm.dtype not in DATA_TYPES:
        return f"hipBLASLt has no {gemm.dtype} GEMM (it multiplies {', '.join(DATA_TYPES)})"
    compute = COMPUTE_TYPES[gemm.precision]
    if not hasattr(enums.compute_type, compute):
        return f"the installed hip-python has no {compute} compute type (hipBLASLt's xf32)"
    if not hasattr(lt.hipblasLtEpilogue_t, EPILOGUES[gemm.epilogue]):
        return f"the installed hip-python has no {EPILOGUES[gemm.epilogue]} epilogue"
    return None


def types_of(lt: Any, enums: Enums, gemm: Gemm) -> GemmTypes:
    """The enum members of a Gemm that ``unsupported`` accepts."""
    return GemmTypes(data=getattr(enums.data_type, DATA_TYPES[gemm.dtype]),
                     scale=getattr(enums.data_type, SCALE_TYPE),
                     compute=getattr(enums.compute_type, COMPUTE_TYPES[gemm.precision]),
                     epilogue=getattr(lt.hipblasLtEpilogue_t, EPILOGUES[gemm.epilogue]))


class HipblasLt(GemmBackend):
    """The ``LibraryBackend`` of a HIP device: one hipBLASLt handle (made with the device current)."""

    def __init__(self, lt: Any, enums: Enums, api: Any = None) -> None:
        super().__init__(api)
        self.lt = lt
        self.enums = enums
        self.handle = self.call(lt.hipblasLtCreate)
        version = int(self.call(lt.hipblasLtGetVersion, self.handle))  # major * 100000 + minor * 100 + patch
        self.name = f"hipBLASLt {version // 100000}.{version // 100 % 1000}.{version % 100}"
        #: Bytes of one hipblasLtMatmulHeuristicResult_t (the heuristic fills an array of them).
        self.result_size = int(lt.hipblasLtMatmulHeuristicResult_t().c_sizeof())

    @staticmethod
    def call(function: Callable[..., tuple], *args: Any) -> Any:
        """``function(*args)`` with its status checked; its value(s) (hip-python returns ``(status, ...)``)."""
        return check_hipblaslt(function(*args), function.__name__)

    def supports(self, routine: Routine) -> str | None:
        reason = super().supports(routine)
        if reason is None:
            reason = unsupported(self.lt, self.enums, routine)  # type: ignore[arg-type]
        return reason

    def candidates(self, gemm: Gemm, shape: GemmShape, aligned: tuple[int, int, int]) -> list[Plan]:
        """The heuristic's algorithms (best first). hipBLASLt's preferences take no operand
        alignment (cuBLASLt's do): ``aligned`` still keys the plan cache."""
        lt = self.lt
        types = types_of(lt, self.enums, gemm)
        problem = column_major(shape)
        desc = self.call(lt.hipblasLtMatmulDescCreate, types.compute, types.scale)
        layouts: list[Any] = []
        try:
            for rows, cols, ld, stride in (problem.x, problem.y, problem.d):
                layouts.append(self._layout(types.data, rows, cols, ld, stride, shape.batch))
            self._describe(desc, problem, types, gemm.has_bias)
            results = self._heuristic(desc, layouts)
        except BaseException:
            self._destroy(desc, layouts)
            raise
        if not results:
            self._destroy(desc, layouts)
            return []
        return [self._plan(desc, layouts, gemm.has_bias, result, workspace) for result, workspace in results]

    # -- the parts of a candidate -------------------------------------------------------------------
    def _describe(self, desc: Any, problem: ColumnMajor, types: GemmTypes, has_bias: bool) -> None:
        """Set the operations, the epilogue and the bias type on a new matmul descriptor."""
        lt = self.lt
        attribute = lt.hipblasLtMatmulDescAttributes_t
        operation = self.enums.operation
        op_x, op_y = (getattr(operation, OPERATIONS[op]) for op in (problem.transpose_x, problem.transpose_y))
        values = [(attribute.HIPBLASLT_MATMUL_DESC_TRANSA, np.int32(op_x)),
                  (attribute.HIPBLASLT_MATMUL_DESC_TRANSB, np.int32(op_y)),
                  (attribute.HIPBLASLT_MATMUL_DESC_EPILOGUE, np.uint32(types.epilogue))]
        if has_bias:  # the bias binding has the Gemm's type (else hipBLASLt may assume another)
            values.append((attribute.HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, np.int32(types.data)))
        for name, value in values:
            self._set(lt.hipblasLtMatmulDescSetAttribute, desc, name, value)

    def _layout(self, data_type: Any, rows: int, cols: int, ld: int, stride: int, batch: int) -> Any:
        lt = self.lt
        layout = self.call(lt.hipblasLtMatrixLayoutCreate, data_type, rows, cols, ld)
        if batch > 1:
            attribute = lt.hipblasLtMatrixLayoutAttribute_t
            self._set(lt.hipblasLtMatrixLayoutSetAttribute, layout, attribute.HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                      np.int32(batch))
            self._set(lt.hipblasLtMatrixLayoutSetAttribute, layout,
                      attribute.HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, np.int64(stride))
        return layout

    def _heuristic(self, desc: Any, layouts: list[Any]) -> list[tuple[np.ndarray, int]]:
        """(the algorithm's result record, its workspace bytes) of each usable heuristic result."""
        lt = self.lt
        preference = self.call(lt.hipblasLtMatmulPreferenceCreate)
        try:
            self._set(lt.hipblasLtMatmulPreferenceSetAttribute, preference,
                      lt.hipblasLtMatmulPreferenceAttributes_t.HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                      np.uint64(WORKSPACE_LIMIT))
            size = self.result_size
            results = np.zeros(CANDIDATES * size, np.uint8)
            layout_x, layout_y, layout_d = layouts
            try:
                count = int(self.call(lt.hipblasLtMatmulAlgoGetHeuristic, self.handle, desc, layout_x, layout_y,
                                      layout_d, layout_d, preference, CANDIDATES, results.ctypes.data))
            except UnimplementedError:  # no algorithm for this problem on this device
                return []
        finally:
            self.call(lt.hipblasLtMatmulPreferenceDestroy, preference)
        usable = []
        for i in range(min(count, CANDIDATES)):
            record = results[i * size:(i + 1) * size].copy()  # its own memory: the plan keeps the algorithm
            result = lt.hipblasLtMatmulHeuristicResult_t.fromObj(record.ctypes.data)
            if int(result.state) == 0:  # HIPBLAS_STATUS_SUCCESS: the other fields are valid
                usable.append((record, int(result.workspaceSize)))
        return usable

    def _plan(self, desc: Any, layouts: list[Any], has_bias: bool, record: np.ndarray, workspace_size: int) -> Plan:
        """One algorithm as a ``Plan``: D = op(X) op(Y) with X = B, Y = A, C = D (in place, beta 0)."""
        lt, call = self.lt, self.call
        matmul, handle = lt.hipblasLtMatmul, self.handle
        set_attribute = lt.hipblasLtMatmulDescSetAttribute
        bias_attribute = lt.hipblasLtMatmulDescAttributes_t.HIPBLASLT_MATMUL_DESC_BIAS_POINTER
        alpha, beta = np.ones(1, np.float32), np.zeros(1, np.float32)
        alpha_ptr, beta_ptr, algo = alpha.ctypes.data, beta.ctypes.data, record.ctypes.data  # algo: offset 0
        bias_pointer = np.zeros(1, np.uint64) if has_bias else None
        bias_at = bias_pointer.ctypes.data if bias_pointer is not None else 0
        layout_x, layout_y, layout_d = layouts

        def run(pointers: Sequence[int], workspace: int, size: int, stream: int) -> None:
            c, a, b = pointers[0], pointers[1], pointers[2]
            if bias_pointer is not None:  # the descriptor is shared by the plan's calls: set it for this one
                bias_pointer[0] = pointers[3]
                call(set_attribute, desc, bias_attribute, bias_at, bias_pointer.nbytes)
            call(matmul, handle, desc, alpha_ptr, b, layout_x, a, layout_y, beta_ptr, c, layout_d, c, layout_d,
                 algo, workspace, size, stream)

        return Plan(run, workspace_size, [alpha, beta, desc, layouts, bias_pointer, record], "hipblasLt")

    def _set(self, setter: Callable[..., tuple], target: Any, attribute: Any, value: np.generic) -> None:
        """Set a hipBLASLt attribute from a numpy scalar of the attribute's C type."""
        buffer = np.array(value)
        self.call(setter, target, attribute, buffer.ctypes.data, buffer.nbytes)

    def _destroy(self, desc: Any, layouts: list[Any]) -> None:
        """Free the descriptors of a product that has no plan; their statuses are not checked, since
        this runs on the way out of a failure or of a problem hipBLASLt cannot run."""
        lt = self.lt
        for layout in layouts:
            lt.hipblasLtMatrixLayoutDestroy(layout)
        lt.hipblasLtMatmulDescDestroy(desc)


#: hipBLASLt's backend of each HIP device (its plans are the device's), made at the first device of each.
LIBRARY = VendorLibrary("hip", "hipBLASLt", "matmul runs on the runtime's own kernels; "
                        f"{install_hint('hip')} (hip-python's library bindings) and install ROCm's hipBLASLt "
                        "(libhipblaslt.so on the loader's path) for vendor GEMMs")


def load(ordinal: int, api: Any = None) -> HipblasLt | None:
    """The hipBLASLt backend of HIP device ``ordinal`` (``api``: the shim that makes the device current
    and times candidate algorithms), or None when the library is missing (the reason logged once
    per process)."""

    def make() -> HipblasLt:
        from hip import hipblaslt as lt

        if api is not None:
            api.activate(ordinal)  # a hipBLASLt handle belongs to the current device (HIP's context: its ordinal)
        return HipblasLt(lt, Enums.installed(), api)

    return LIBRARY.load_now(ordinal, make)
