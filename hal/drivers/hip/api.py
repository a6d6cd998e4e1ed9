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
import threading
from collections.abc import Sequence
from typing import Any

from hal.drivers.hip.status import check, mark_loaded, raise_for

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


def _nodes(deps: list) -> Any:
    """Graph nodes as the C array of ``hipGraphNode_t`` hip-python passes on (None for no dependencies)."""
    if not deps:
        return None
    import ctypes

    return (ctypes.c_void_p * len(deps))(*(int(node) for node in deps))


def _text(raw: Any) -> str:
    """A fixed-size char array field (bytes up to the first NUL) as text."""
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
    return str(raw)


class HipApi:
    """The shim over hip-python (one per process: see ``get_api``). ``hip`` may be given for tests."""

    name = "hip"

    def __init__(self, hip: Any = None) -> None:
        if hip is None:
            from hip import hip
        self.hip = h = hip
        self._launch = h.hipModuleLaunchKernel
        self._memset = {1: h.hipMemsetD8Async, 2: h.hipMemsetD16Async, 4: h.hipMemsetD32Async}
        self._memcpy_dtod_async = h.hipMemcpyDtoDAsync
        self._memcpy_htod_async = h.hipMemcpyHtoDAsync
        self._graph_launch = h.hipGraphLaunch
        self._event_record = h.hipEventRecord
        self._event_query = h.hipEventQuery
        self._event_sync = h.hipEventSynchronize
        self._stream_wait = h.hipStreamWaitEvent
        self._exec_kernel = h.hipGraphExecKernelNodeSetParams
        self._set_device = h.hipSetDevice
        #: Per thread: the device ordinal made current last (``activate``).
        self._current = threading.local()
        errors = h.hipError_t
        self.NOT_READY = errors.hipErrorNotReady
        #: Codes with which hipGraphExec{Memset,Memcpy}NodeSetParams* refuse a change in place.
        self._update_rejected = (errors.hipErrorInvalidValue, errors.hipErrorGraphExecUpdateFailure)
        self._stream_flags = h.hipStreamNonBlocking
        self._event_flags = h.hipEventDisableTiming
        self._host_flags = h.hipHostMallocPortable | h.hipHostMallocMapped
        self._device_to_device = h.hipMemcpyKind.hipMemcpyDeviceToDevice

    # -- runtime and devices (the driver's probe and enumeration) --------------------------------
    def runtime_version(self) -> int:
        """hipRuntimeGetVersion (needs no device); the loader's RuntimeError when libamdhip64 is missing."""
        version = check(self.hip.hipRuntimeGetVersion(), "hipRuntimeGetVersion")
        mark_loaded("hip")
        return int(version)  # type: ignore[call-overload]

    def driver_version(self) -> int:
        return int(check(self.hip.hipDriverGetVersion(), "hipDriverGetVersion"))  # type: ignore[call-overload]

    def init(self) -> None:
        check(self.hip.hipInit(0), "hipInit")

    def device_count(self) -> int:
        return int(check(self.hip.hipGetDeviceCount(), "hipGetDeviceCount"))  # type: ignore[call-overload]

    def device_properties(self, ordinal: int) -> dict[str, Any]:
        """Name, gcnArchName, UUID, limits and memory of a device (hipGetDeviceProperties)."""
        props = check(self.hip.hipGetDeviceProperties(ordinal), "hipGetDeviceProperties")
        out: dict[str, Any] = {"name": _text(props.name), "gcn_arch_name": _text(props.gcnArchName)}  # type: ignore[attr-defined]
        for key, field in DEVICE_PROPERTIES.items():
            out[key] = int(getattr(props, field))
        out["max_block_dims"] = tuple(int(v) for v in props.maxThreadsDim)  # type: ignore[attr-defined]
        out["max_grid_dims"] = tuple(int(v) for v in props.maxGridSize)  # type: ignore[attr-defined]
        out["uuid"] = self._uuid(props.uuid)  # type: ignore[attr-defined]
        return out

    @staticmethod
    def _uuid(uuid: Any) -> str:
        """rocm-smi's form: AMD devices report their unique id as 16 ASCII characters."""
        raw = bytes(int(b) & 0xFF for b in uuid.bytes) if not isinstance(uuid.bytes, bytes) else uuid.bytes
        raw = raw.split(b"\0", 1)[0]
        if raw and all(chr(c).isalnum() for c in raw):
            return f"GPU-{raw.decode()}"
        return f"GPU-{raw.hex()}"

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

    def activate(self, context: Any) -> None:
        """hipSetDevice(ordinal), skipped when it is already this thread's current device."""
        current = self._current
        if getattr(current, "context", None) != context:
            err = self._set_device(context)[0]
            if err:
                raise_for(err, "hipSetDevice")
            current.context = context

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current device."""
        free, total = check(self.hip.hipMemGetInfo(), "hipMemGetInfo")  # type: ignore[misc]
        return int(free), int(total)

    # -- streams and events ----------------------------------------------------------------------
    def stream_create(self) -> Any:
        return check(self.hip.hipStreamCreateWithFlags(self._stream_flags), "hipStreamCreateWithFlags")

    def stream_destroy(self, stream: Any) -> None:
        check(self.hip.hipStreamDestroy(stream), "hipStreamDestroy")

    def stream_synchronize(self, stream: Any) -> None:
        check(self.hip.hipStreamSynchronize(stream), "hipStreamSynchronize")

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        err = self._stream_wait(stream, event, 0)[0]
        if err:
            raise_for(err, "hipStreamWaitEvent")

    def event_create(self) -> Any:
        return check(self.hip.hipEventCreateWithFlags(self._event_flags), "hipEventCreateWithFlags")

    def event_destroy(self, event: Any) -> None:
        check(self.hip.hipEventDestroy(event), "hipEventDestroy")

    def event_record(self, event: Any, stream: Any) -> None:
        err = self._event_record(event, stream)[0]
        if err:
            raise_for(err, "hipEventRecord")

    def event_query(self, event: Any) -> bool:
        err = self._event_query(event)[0]
        if not err:
            return True
        if err == self.NOT_READY:
            return False
        raise_for(err, "hipEventQuery")

    def event_synchronize(self, event: Any) -> None:
        err = self._event_sync(event)[0]
        if err:
            raise_for(err, "hipEventSynchronize")

    # -- memory --------------------------------------------------------------------------------------
    def mem_alloc(self, size: int) -> int:
        return int(check(self.hip.hipMalloc(size), "hipMalloc"))  # type: ignore[call-overload]

    def mem_free(self, ptr: int) -> None:
        check(self.hip.hipFree(ptr), "hipFree")

    def mem_alloc_async(self, size: int, stream: Any) -> int:
        return int(check(self.hip.hipMallocAsync(size, stream), "hipMallocAsync"))  # type: ignore[call-overload]

    def mem_free_async(self, ptr: int, stream: Any) -> None:
        check(self.hip.hipFreeAsync(ptr, stream), "hipFreeAsync")

    def configure_memory_pool(self, device: Any, release_threshold: int) -> None:
        import ctypes

        h = self.hip
        pool = check(h.hipDeviceGetDefaultMemPool(device), "hipDeviceGetDefaultMemPool")
        threshold = ctypes.c_uint64(release_threshold)  # the runtime reads a uint64_t through the pointer
        check(
            h.hipMemPoolSetAttribute(pool, h.hipMemPoolAttr.hipMemPoolAttrReleaseThreshold, threshold),
            "hipMemPoolSetAttribute",
        )

    def host_alloc(self, size: int) -> int:
        """Pinned, portable host memory mapped into the device address space."""
        return int(check(self.hip.hipHostMalloc(size, self._host_flags), "hipHostMalloc"))  # type: ignore[call-overload]

    def host_free(self, ptr: int) -> None:
        check(self.hip.hipHostFree(ptr), "hipHostFree")

    def host_device_pointer(self, ptr: int) -> int:
        return int(check(self.hip.hipHostGetDevicePointer(ptr, 0), "hipHostGetDevicePointer"))  # type: ignore[call-overload]

    def memset_async(self, ptr: int, value: int, element_size: int, count: int, stream: Any) -> None:
        err = self._memset[element_size](ptr, value, count, stream)[0]
        if err:
            raise_for(err, f"hipMemsetD{8 * element_size}Async")

    def memcpy_dtod_async(self, dst: int, src: int, size: int, stream: Any) -> None:
        err = self._memcpy_dtod_async(dst, src, size, stream)[0]
        if err:
            raise_for(err, "hipMemcpyDtoDAsync")

    def memcpy_htod_async(self, dst: int, host: int, size: int, stream: Any) -> None:
        err = self._memcpy_htod_async(dst, host, size, stream)[0]
        if err:
            raise_for(err, "hipMemcpyHtoDAsync")

    def memcpy_htod(self, dst: int, host: int, size: int) -> None:
        check(self.hip.hipMemcpyHtoD(dst, host, size), "hipMemcpyHtoD")

    def memcpy_dtoh(self, host: int, src: int, size: int) -> None:
        check(self.hip.hipMemcpyDtoH(host, src, size), "hipMemcpyDtoH")

    # -- modules -------------------------------------------------------------------------------------
    def module_load(self, image: bytes) -> Any:
        return check(self.hip.hipModuleLoadData(image), "hipModuleLoadData")

    def module_unload(self, module: Any) -> None:
        check(self.hip.hipModuleUnload(module), "hipModuleUnload")

    def module_function(self, module: Any, name: str) -> Any:
        return check(self.hip.hipModuleGetFunction(module, name.encode()), f"hipModuleGetFunction({name!r})")

    def function_max_threads(self, function: Any) -> int:
        attr = self.hip.hipFunction_attribute.HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        return int(check(self.hip.hipFuncGetAttribute(attr, function), "hipFuncGetAttribute"))  # type: ignore[call-overload]

    # -- prepared calls: (bindings function, its arguments, its name for errors) ------------------------
    def prepare_launch(
        self, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], stream: Any, params: int
    ) -> tuple[Any, tuple, str]:
        return (self._launch, (function, *grid, *block, 0, stream, params or None, None), "hipModuleLaunchKernel")

    def prepare_memset(
        self, ptr: int, value: int, element_size: int, count: int, stream: Any
    ) -> tuple[Any, tuple, str]:
        return (self._memset[element_size], (ptr, value, count, stream), f"hipMemsetD{8 * element_size}Async")

    def prepare_copy(self, dst: int, src: int, size: int, stream: Any) -> tuple[Any, tuple, str]:
        return (self._memcpy_dtod_async, (dst, src, size, stream), "hipMemcpyDtoDAsync")

    def prepare_upload(self, dst: int, host: int, size: int, stream: Any) -> tuple[Any, tuple, str]:
        return (self._memcpy_htod_async, (dst, host, size, stream), "hipMemcpyHtoDAsync")

    def run_prepared(self, calls: Sequence[tuple[Any, tuple, str]]) -> None:
        for call, args, name in calls:
            err = call(*args)[0]
            if err:
                raise_for(err, name)

    # -- graphs ----------------------------------------------------------------------------------------
    def graph_create(self) -> Any:
        return check(self.hip.hipGraphCreate(0), "hipGraphCreate")

    def graph_destroy(self, graph: Any) -> None:
        check(self.hip.hipGraphDestroy(graph), "hipGraphDestroy")

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

    def memset_node_params(self, ptr: int, value: int, element_size: int, count: int) -> Any:
        p = self.hip.hipMemsetParams()
        p.dst = ptr
        p.value = value
        p.elementSize = element_size
        p.width = count
        p.height = 1
        p.pitch = 0
        return p

    def set_memset_node_target(self, params: Any, ptr: int, count: int) -> None:
        params.dst = ptr
        params.width = count

    def memcpy_node_params(self, dst: int, src: int, size: int) -> Any:
        return [dst, src, size]  # the arguments of hipGraph{AddMemcpyNode1D,ExecMemcpyNodeSetParams1D}

    def set_memcpy_node_target(self, params: Any, dst: int, src: int, size: int) -> None:
        params[:] = (dst, src, size)

    def graph_add_kernel_node(self, graph: Any, deps: list, params: Any) -> Any:
        return check(self.hip.hipGraphAddKernelNode(graph, _nodes(deps), len(deps), params), "hipGraphAddKernelNode")

    def graph_add_memset_node(self, graph: Any, deps: list, params: Any) -> Any:
        return check(self.hip.hipGraphAddMemsetNode(graph, _nodes(deps), len(deps), params), "hipGraphAddMemsetNode")

    def graph_add_memcpy_node(self, graph: Any, deps: list, params: Any) -> Any:
        dst, src, size = params
        return check(
            self.hip.hipGraphAddMemcpyNode1D(graph, _nodes(deps), len(deps), dst, src, size, self._device_to_device),
            "hipGraphAddMemcpyNode1D",
        )

    def graph_add_empty_node(self, graph: Any, deps: list) -> Any:
        return check(self.hip.hipGraphAddEmptyNode(graph, _nodes(deps), len(deps)), "hipGraphAddEmptyNode")

    def graph_instantiate(self, graph: Any) -> Any:
        return check(self.hip.hipGraphInstantiateWithFlags(graph, 0), "hipGraphInstantiateWithFlags")

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        check(self.hip.hipGraphExecDestroy(graph_exec), "hipGraphExecDestroy")

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        err = self._graph_launch(graph_exec, stream)[0]
        if err:
            raise_for(err, "hipGraphLaunch")

    def exec_set_kernel_params(self, graph_exec: Any, node: Any, params: Any) -> None:
        err = self._exec_kernel(graph_exec, node, params)[0]
        if err:
            raise_for(err, "hipGraphExecKernelNodeSetParams")

    def exec_set_memset_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        err = self.hip.hipGraphExecMemsetNodeSetParams(graph_exec, node, params)[0]
        return self._updated(err, "hipGraphExecMemsetNodeSetParams")

    def exec_set_memcpy_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        dst, src, size = params
        err = self.hip.hipGraphExecMemcpyNodeSetParams1D(graph_exec, node, dst, src, size, self._device_to_device)[0]
        return self._updated(err, "hipGraphExecMemcpyNodeSetParams1D")

    def _updated(self, err: Any, function: str) -> bool:
        """True for success, False for a change refused in place; raises for other failures."""
        if not err:
            return True
        if err in self._update_rejected:
            return False
        raise_for(err, function)


_api: HipApi | None = None
_api_lock = threading.Lock()


def get_api() -> HipApi:
    """The process-wide shim; imports hip-python on first use (ImportError if it is not installed)."""
    global _api
    with _api_lock:
        if _api is None:
            _api = HipApi()
        return _api
