"""The HIP shim: ``hal.drivers.gpu.api.GpuApi`` over hip-python's ``hip`` module.

The generic modules in ``hal/drivers/gpu`` speak of streams, events, graphs,
memory and modules through the protocol ``GpuApi`` (its docstring states the
contract); this class maps each call onto the HIP runtime API, checking every
hipError_t in one place (``status.py``). The HIP driver's own probing and device
enumeration (``driver.py``) use the calls under "runtime and devices".

HIP's conventions, kept here so the generic code never sees them:

- hip-python returns ``(hipError_t, values...)`` tuples and loads libamdhip64 at
  the first call (a missing library raises ``RuntimeError`` from its loader).
- HIP has no context objects: a device's "context" is its ordinal, made current
  per thread with ``hipSetDevice``.
- Graph kernel nodes take the module function (``hipFunction_t``) in the
  ``func`` field, as the runtime accepts for module launches; copy nodes are
  1-D (``hipGraphAddMemcpyNode1D``), so their parameters are a plain record.
- A change to a memset or copy node that the runtime will not make in place
  comes back as ``hipErrorInvalidValue`` or ``hipErrorGraphExecUpdateFailure``:
  reported as ``False`` (the caller re-instantiates).

Handles are hip-python's objects (``ihipStream_t``, ``ihipEvent_t``, ...);
addresses are plain ints. hip-python is imported when the shim is created,
never at module import (``get_api``).
"""

from __future__ import annotations

import re
from typing import Any

from hal.drivers.bindings_shim import BindingsShim, process_wide
from hal.drivers.hip.status import HIP, mark_loaded

#: Device properties (hipDeviceProp_t fields) reported in DeviceInfo.properties, by the name used there.
DEVICE_PROPERTIES = {
    "compute_units": "multiProcessorCount",
    "memory_total": "totalGlobalMem",
    "max_threads_per_block": "maxThreadsPerBlock",
    "warp_size": "warpSize",
    "max_shared_memory_per_block": "sharedMemPerBlock",
    "l2_cache_size": "l2CacheSize",
    "clock_rate_khz": "clockRate",
    "memory_clock_rate_khz": "memoryClockRate",
    "memory_bus_width": "memoryBusWidth",
    "memory_pools_supported": "memoryPoolsSupported",
    "can_map_host_memory": "canMapHostMemory",
    "concurrent_kernels": "concurrentKernels",
    "integrated": "integrated",
    "pci_domain_id": "pciDomainID",
    "pci_bus_id": "pciBusID",
    "pci_device_id": "pciDeviceID",
}


#: The hip-python functions the shim calls (a test holds this list to the code and to the installed bindings).
ENTRY_POINTS = (
    "hipRuntimeGetVersion",
    "hipDriverGetVersion",
    "hipInit",
    "hipGetDeviceCount",
    "hipGetDeviceProperties",
    "hipSetDevice",
    "hipMemGetInfo",
    "hipStreamCreateWithFlags",
    "hipStreamDestroy",
    "hipStreamSynchronize",
    "hipStreamWaitEvent",
    "hipEventCreateWithFlags",
    "hipEventDestroy",
    "hipEventRecord",
    "hipEventQuery",
    "hipEventSynchronize",
    "hipEventElapsedTime",
    "hipMalloc",
    "hipFree",
    "hipMallocAsync",
    "hipFreeAsync",
    "hipDeviceGetDefaultMemPool",
    "hipMemPoolSetAttribute",
    "hipHostMalloc",
    "hipHostFree",
    "hipHostGetDevicePointer",
    "hipMemsetD8Async",
    "hipMemsetD16Async",
    "hipMemsetD32Async",
    "hipMemcpyDtoDAsync",
    "hipMemcpyHtoDAsync",
    "hipMemcpyHtoD",
    "hipMemcpyDtoH",
    "hipModuleLoadData",
    "hipModuleUnload",
    "hipModuleGetFunction",
    "hipFuncGetAttribute",
    "hipModuleLaunchKernel",
    "hipGraphCreate",
    "hipGraphDestroy",
    "hipGraphAddKernelNode",
    "hipGraphAddMemsetNode",
    "hipGraphAddMemcpyNode1D",
    "hipGraphAddEmptyNode",
    "hipGraphInstantiateWithFlags",
    "hipGraphExecDestroy",
    "hipGraphLaunch",
    "hipGraphExecKernelNodeSetParams",
    "hipGraphExecMemsetNodeSetParams",
    "hipGraphExecMemcpyNodeSetParams1D",
    "hipStreamBeginCapture",
    "hipStreamEndCapture",
    "hipGraphAddChildGraphNode",
    "hipGraphExecChildGraphNodeSetParams",
)
_C_SIGNATURE = re.compile(r"\b(hip\w+)\s*\(")


def c_symbol(function: Any) -> str:
    """The C function a hip-python function calls, from the C signature its docstring ends with
    (hip-python binds some to versioned symbols: hipGetDeviceProperties -> hipGetDevicePropertiesR0600)."""
    doc = getattr(function, "__doc__", None) or ""
    _, _, c_part = doc.rpartition("code-block:: c")
    match = _C_SIGNATURE.search(c_part)
    return match.group(1) if match else getattr(function, "__name__", "")


def loaded_library(fragment: str = "libamdhip64") -> str | None:
    """The file of a loaded shared library whose name contains ``fragment`` (Linux), else None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if fragment in path.rsplit("/", 1)[-1]:
                    return path
    except OSError:
        pass
    return None


def _uuid(uuid: Any) -> str:
    """rocm-smi's form: AMD devices report their unique id as 16 ASCII characters."""
    raw = uuid.bytes if isinstance(uuid.bytes, bytes) else bytes(int(b) & 0xFF for b in uuid.bytes)
    raw = raw.split(b"\0", 1)[0]
    if raw and all(chr(c).isalnum() for c in raw):
        return f"GPU-{raw.decode()}"
    return f"GPU-{raw.hex()}"


def _text(raw: Any) -> str:
    """A fixed-size char array field (bytes up to the first NUL) as text."""
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
    return str(raw)


class HipApi(BindingsShim):
    """The shim over hip-python (one per process: see ``get_api``). ``hip`` may be given for tests."""

    name = "hip"

    def __init__(self, hip: Any = None) -> None:
        if hip is None:
            from hip import hip
        self.hip = h = hip
        errors = h.hipError_t
        values = {
            "status": HIP,
            "not_ready": errors.hipErrorNotReady,
            "update_rejected": (errors.hipErrorInvalidValue, errors.hipErrorGraphExecUpdateFailure),
            "stream_flags": h.hipStreamNonBlocking,
            "event_flags": h.hipEventDisableTiming,
            "timing_event_flags": h.hipEventDefault,
            "host_flags": h.hipHostMallocPortable | h.hipHostMallocMapped,
            "max_threads_attribute": h.hipFunction_attribute.HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            "memset_params_type": h.hipMemsetParams,
            "capture_mode": h.hipStreamCaptureMode.hipStreamCaptureModeThreadLocal,
        }
        super().__init__(h, "hip", values)
        self._launch = h.hipModuleLaunchKernel
        self._device_to_device = h.hipMemcpyKind.hipMemcpyDeviceToDevice

    # -- runtime and devices (the driver's probe and enumeration) --------------------------------
    def runtime_version(self) -> int:
        """hipRuntimeGetVersion (needs no device); the loader's RuntimeError when libamdhip64 is missing."""
        version = self.call(self.hip.hipRuntimeGetVersion)
        mark_loaded("hip")
        return int(version)

    def driver_version(self) -> int:
        return int(self.call(self.hip.hipDriverGetVersion))

    def init(self) -> None:
        self.call(self.hip.hipInit, 0)

    def device_count(self) -> int:
        return int(self.call(self.hip.hipGetDeviceCount))

    def device_properties(self, ordinal: int) -> dict[str, Any]:
        """Name, gcnArchName, UUID, limits and memory of a device (hipGetDeviceProperties)."""
        props = self.call(self.hip.hipGetDeviceProperties, ordinal)
        out: dict[str, Any] = {"name": _text(props.name), "gcn_arch_name": _text(props.gcnArchName)}
        for key, field in DEVICE_PROPERTIES.items():
            out[key] = int(getattr(props, field))
        out["max_block_dims"] = tuple(int(v) for v in props.maxThreadsDim)
        out["max_grid_dims"] = tuple(int(v) for v in props.maxGridSize)
        out["uuid"] = _uuid(props.uuid)
        return out

    def library_path(self) -> str | None:
        """The HIP runtime library file in use (after ``runtime_version`` loaded it)."""
        return loaded_library()

    def missing_entry_points(self) -> list[str]:
        """The C functions behind ``ENTRY_POINTS`` that the loaded runtime library does not export
        (an older ROCm than the installed hip-python binds); [] when all are there or it cannot tell."""
        import ctypes

        path = self.library_path()
        if path is None:
            return []
        library = ctypes.CDLL(path)  # already loaded: the same handle
        symbols = (c_symbol(getattr(self.hip, name, None)) for name in ENTRY_POINTS)
        return sorted({symbol for symbol in symbols if symbol and not hasattr(library, symbol)})

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        err, free, total = self.hip.hipMemGetInfo()
        if err:
            self.fail(err, "hipMemGetInfo")
        return int(free), int(total)

    def configure_memory_pool(self, device: Any, release_threshold: int) -> None:
        import ctypes

        h = self.hip
        pool = self.call(h.hipDeviceGetDefaultMemPool, device)
        threshold = ctypes.c_uint64(release_threshold)  # the runtime reads a uint64_t through the pointer
        self.call(h.hipMemPoolSetAttribute, pool, h.hipMemPoolAttr.hipMemPoolAttrReleaseThreshold, threshold)

    # -- launches and graph nodes: HIP's argument forms ------------------------------------------------
    def prepare_launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], stream: Any, params: int
    ) -> tuple:
        return (self._launch, (function, *grid, *block, 0, stream, params or None, None))

    def node_list(self, deps: list) -> Any:
        """hip-python takes the dependencies as a C array of ``hipGraphNode_t`` (None for none)."""
        if not deps:
            return None
        import ctypes

        return (ctypes.c_void_p * len(deps))(*(int(node) for node in deps))

    def kernel_node_params(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], params: int
    ) -> Any:
        p = self.hip.hipKernelNodeParams()
        p.func = function
        # gridDim/blockDim are views into the record: set their members
        p.gridDim.x, p.gridDim.y, p.gridDim.z = grid
        p.blockDim.x, p.blockDim.y, p.blockDim.z = block
        p.sharedMemBytes = 0
        p.kernelParams = params or None
        return p

    def memcpy_node_params(self, dst: int, src: int, size: int) -> Any:
        return [dst, src, size]  # the arguments of hipGraph{AddMemcpyNode1D,ExecMemcpyNodeSetParams1D}

    def set_memcpy_node_target(self, params: Any, dst: int, src: int, size: int) -> None:
        params[:] = (dst, src, size)

    def graph_add_memset_node(self, graph: Any, deps: list, params: Any) -> Any:
        return self.call(self.hip.hipGraphAddMemsetNode, graph, self.node_list(deps), len(deps), params)

    def graph_add_memcpy_node(self, graph: Any, deps: list, params: Any) -> Any:
        dst, src, size = params
        return self.call(
            self.hip.hipGraphAddMemcpyNode1D,
            graph,
            self.node_list(deps),
            len(deps),
            dst,
            src,
            size,
            self._device_to_device,
        )

    def exec_set_memset_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        function = self.hip.hipGraphExecMemsetNodeSetParams
        return self.updated(function(graph_exec, node, params)[0], function)

    def exec_set_memcpy_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        function = self.hip.hipGraphExecMemcpyNodeSetParams1D
        return self.updated(function(graph_exec, node, *params, self._device_to_device)[0], function)


get_api = process_wide(HipApi)
get_api.__doc__ = "The process-wide shim; imports hip-python on first use (ImportError if it is not installed)."
