"""The CUDA shim: ``hal.drivers.gpu.api.GpuApi`` over ``cuda.bindings.driver``.

The generic modules in ``hal/drivers/gpu`` speak of streams, events, graphs,
memory and modules through the protocol ``GpuApi`` (its docstring states the
contract); this class maps each call onto the driver API, checking every
CUresult in one place (``status.py``). The CUDA driver's own probing and device
enumeration (``driver.py``) use the calls under "driver and devices".

Handles are the bindings' own objects (CUstream, CUevent, CUgraphNode, ...);
device pointers are plain ints so the generic code can do address arithmetic.
``cuda.bindings`` is imported when the shim is created, never at module import.
"""

from __future__ import annotations

import threading
from typing import Any

from hal.drivers.cuda.status import check, raise_for

#: Device attributes reported in DeviceInfo.properties (and used for limits).
DEVICE_ATTRIBUTES = {
    "max_threads_per_block": "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK",
    "max_block_dim_x": "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X",
    "max_block_dim_y": "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y",
    "max_block_dim_z": "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z",
    "max_grid_dim_x": "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X",
    "max_grid_dim_y": "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y",
    "max_grid_dim_z": "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z",
    "compute_capability_major": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
    "compute_capability_minor": "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR",
    "sm_count": "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT",
    "warp_size": "CU_DEVICE_ATTRIBUTE_WARP_SIZE",
    "max_shared_memory_per_block": "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK",
    "l2_cache_size": "CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE",
    "clock_rate_khz": "CU_DEVICE_ATTRIBUTE_CLOCK_RATE",
    "memory_clock_rate_khz": "CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE",
    "memory_bus_width": "CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH",
    "memory_pools_supported": "CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED",
    "unified_addressing": "CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING",
    "can_map_host_memory": "CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY",
    "concurrent_kernels": "CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS",
    "async_engine_count": "CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT",
    "integrated": "CU_DEVICE_ATTRIBUTE_INTEGRATED",
}


class CudaApi:
    """The shim over ``cuda.bindings.driver`` (one per process: see ``get_api``)."""

    name = "cuda"

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.driver = driver
        d = driver
        self._launch = d.cuLaunchKernel
        self._memset = {1: d.cuMemsetD8Async, 2: d.cuMemsetD16Async, 4: d.cuMemsetD32Async}
        self._memcpy_dtod_async = d.cuMemcpyDtoDAsync
        self._memcpy_htod_async = d.cuMemcpyHtoDAsync
        self._graph_launch = d.cuGraphLaunch
        self._event_record = d.cuEventRecord
        self._event_query = d.cuEventQuery
        self._event_sync = d.cuEventSynchronize
        self._stream_wait = d.cuStreamWaitEvent
        self._exec_kernel = d.cuGraphExecKernelNodeSetParams
        self._ctx_set_current = d.cuCtxSetCurrent
        #: Per thread: the context made current last (``activate``), also the context of graph memory nodes.
        self._current = threading.local()
        self.NOT_READY = d.CUresult.CUDA_ERROR_NOT_READY
        #: Codes with which cuGraphExec{Memset,Memcpy}NodeSetParams refuse a change in place.
        self._update_rejected = (d.CUresult.CUDA_ERROR_INVALID_VALUE, d.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
        self._stream_flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING
        self._event_flags = d.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self._host_flags = d.CU_MEMHOSTALLOC_PORTABLE | d.CU_MEMHOSTALLOC_DEVICEMAP
        self._memory_device = d.CUmemorytype.CU_MEMORYTYPE_UNIFIED

    # -- driver and devices ------------------------------------------------------
    def init(self) -> None:
        """cuInit(0); raises the HalError for a failing code (the library loader may raise its own error)."""
        check(self.driver.cuInit(0), "cuInit")

    def driver_version(self) -> int:
        return check(self.driver.cuDriverGetVersion(), "cuDriverGetVersion")  # type: ignore[return-value]

    def device_count(self) -> int:
        return check(self.driver.cuDeviceGetCount(), "cuDeviceGetCount")  # type: ignore[return-value]

    def device(self, ordinal: int) -> Any:
        return check(self.driver.cuDeviceGet(ordinal), "cuDeviceGet")

    def device_name(self, dev: Any) -> str:
        raw = check(self.driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
        return raw.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw, bytes) else str(raw)

    def device_uuid(self, dev: Any) -> str:
        """The device UUID formatted as nvidia-smi does: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
        uuid = check(self.driver.cuDeviceGetUuid(dev), "cuDeviceGetUuid")
        raw = uuid.bytes  # type: ignore[attr-defined]
        if isinstance(raw, str):
            raw = raw.encode("latin-1")
        h = bytes(raw).ljust(16, b"\0")[:16].hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def device_total_memory(self, dev: Any) -> int:
        return check(self.driver.cuDeviceTotalMem(dev), "cuDeviceTotalMem")  # type: ignore[return-value]

    def device_attributes(self, dev: Any) -> dict[str, int]:
        attrs = {}
        for key, name in DEVICE_ATTRIBUTES.items():
            attr = getattr(self.driver.CUdevice_attribute, name, None)
            if attr is None:
                continue
            err, value = self.driver.cuDeviceGetAttribute(attr, dev)
            if not err:
                attrs[key] = int(value)
        return attrs

    def pci_bus_id(self, dev: Any) -> str:
        raw = check(self.driver.cuDeviceGetPCIBusId(32, dev), "cuDeviceGetPCIBusId")
        return raw.split(b"\0", 1)[0].decode() if isinstance(raw, bytes) else str(raw)

    def primary_context_retain(self, dev: Any) -> Any:
        return check(self.driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")

    def activate(self, context: Any) -> None:
        """cuCtxSetCurrent, skipped when ``context`` is already this thread's current one."""
        current = self._current
        if getattr(current, "context", None) is not context:
            err = self._ctx_set_current(context)[0]
            if err:
                raise_for(err, "cuCtxSetCurrent")
            current.context = context

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's device."""
        return check(self.driver.cuMemGetInfo(), "cuMemGetInfo")  # type: ignore[return-value]

    # -- streams and events ------------------------------------------------------------
    def stream_create(self) -> Any:
        return check(self.driver.cuStreamCreate(self._stream_flags), "cuStreamCreate")

    def stream_destroy(self, stream: Any) -> None:
        check(self.driver.cuStreamDestroy(stream), "cuStreamDestroy")

    def stream_synchronize(self, stream: Any) -> None:
        check(self.driver.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        err = self._stream_wait(stream, event, 0)[0]
        if err:
            raise_for(err, "cuStreamWaitEvent")

    def event_create(self) -> Any:
        return check(self.driver.cuEventCreate(self._event_flags), "cuEventCreate")

    def event_destroy(self, event: Any) -> None:
        check(self.driver.cuEventDestroy(event), "cuEventDestroy")

    def event_record(self, event: Any, stream: Any) -> None:
        err = self._event_record(event, stream)[0]
        if err:
            raise_for(err, "cuEventRecord")

    def event_query(self, event: Any) -> bool:
        """True once the work the event captured completed; False while it runs."""
        err = self._event_query(event)[0]
        if not err:
            return True
        if err == self.NOT_READY:
            return False
        raise_for(err, "cuEventQuery")

    def event_synchronize(self, event: Any) -> None:
        err = self._event_sync(event)[0]
        if err:
            raise_for(err, "cuEventSynchronize")

    def timing_event_create(self) -> Any:
        return check(self.driver.cuEventCreate(self.driver.CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(check(self.driver.cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    # -- memory --------------------------------------------------------------------------
    def mem_alloc(self, size: int) -> int:
        return int(check(self.driver.cuMemAlloc(size), "cuMemAlloc"))  # type: ignore[call-overload]

    def mem_free(self, ptr: int) -> None:
        check(self.driver.cuMemFree(ptr), "cuMemFree")

    def mem_alloc_async(self, size: int, stream: Any) -> int:
        return int(check(self.driver.cuMemAllocAsync(size, stream), "cuMemAllocAsync"))  # type: ignore[call-overload]

    def mem_free_async(self, ptr: int, stream: Any) -> None:
        check(self.driver.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")

    def host_alloc(self, size: int) -> int:
        """Pinned, portable host memory mapped into the device address space."""
        return int(check(self.driver.cuMemHostAlloc(size, self._host_flags), "cuMemHostAlloc"))  # type: ignore[call-overload]

    def host_free(self, ptr: int) -> None:
        check(self.driver.cuMemFreeHost(ptr), "cuMemFreeHost")

    def host_device_pointer(self, ptr: int) -> int:
        return int(check(self.driver.cuMemHostGetDevicePointer(ptr, 0), "cuMemHostGetDevicePointer"))  # type: ignore[call-overload]

    def configure_memory_pool(self, device: Any, release_threshold: int) -> None:
        d = self.driver
        pool = check(d.cuDeviceGetDefaultMemPool(device), "cuDeviceGetDefaultMemPool")
        check(d.cuMemPoolSetAttribute(pool, d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                      d.cuuint64_t(release_threshold)), "cuMemPoolSetAttribute")

    def memset_async(self, ptr: int, value: int, element_size: int, count: int, stream: Any) -> None:
        err = self._memset[element_size](ptr, value, count, stream)[0]
        if err:
            raise_for(err, f"cuMemsetD{8 * element_size}Async")

    def memcpy_dtod_async(self, dst: int, src: int, size: int, stream: Any) -> None:
        err = self._memcpy_dtod_async(dst, src, size, stream)[0]
        if err:
            raise_for(err, "cuMemcpyDtoDAsync")

    def memcpy_htod_async(self, dst: int, host: int, size: int, stream: Any) -> None:
        err = self._memcpy_htod_async(dst, host, size, stream)[0]
        if err:
            raise_for(err, "cuMemcpyHtoDAsync")

    def memcpy_htod(self, dst: int, host: int, size: int) -> None:
        check(self.driver.cuMemcpyHtoD(dst, host, size), "cuMemcpyHtoD")

    def memcpy_dtoh(self, host: int, src: int, size: int) -> None:
        check(self.driver.cuMemcpyDtoH(host, src, size), "cuMemcpyDtoH")

    # -- modules and launches ------------------------------------------------------------
    def module_load(self, image: bytes) -> Any:
        return check(self.driver.cuModuleLoadData(image), "cuModuleLoadData")

    def module_unload(self, module: Any) -> None:
        check(self.driver.cuModuleUnload(module), "cuModuleUnload")

    def module_function(self, module: Any, name: str) -> Any:
        return check(self.driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name!r})")

    def function_max_threads(self, func: Any) -> int:
        attr = self.driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        return int(check(self.driver.cuFuncGetAttribute(attr, func), "cuFuncGetAttribute"))  # type: ignore[call-overload]

    # -- prepared calls: (bindings function, its arguments, its name for errors) -----------------------
    def prepare_launch(self, func: Any, grid: tuple[int, int, int], block: tuple[int, int, int], stream: Any,
                       params: int) -> tuple[Any, tuple, str]:
        return (self._launch, (func, *grid, *block, 0, stream, params, 0), "cuLaunchKernel")

    def prepare_memset(self, ptr: int, value: int, element_size: int, count: int,
                       stream: Any) -> tuple[Any, tuple, str]:
        return (self._memset[element_size], (self.driver.CUdeviceptr(ptr), value, count, stream),
                f"cuMemsetD{8 * element_size}Async")

    def prepare_copy(self, dst: int, src: int, size: int, stream: Any) -> tuple[Any, tuple, str]:
        d = self.driver
        return (self._memcpy_dtod_async, (d.CUdeviceptr(dst), d.CUdeviceptr(src), size, stream), "cuMemcpyDtoDAsync")

    def prepare_upload(self, dst: int, host: int, size: int, stream: Any) -> tuple[Any, tuple, str]:
        return (self._memcpy_htod_async, (self.driver.CUdeviceptr(dst), host, size, stream), "cuMemcpyHtoDAsync")

    def run_prepared(self, calls) -> None:
        for call, args, name in calls:
            err = call(*args)[0]
            if err:
                raise_for(err, name)

    # -- graphs --------------------------------------------------------------------------
    def graph_create(self) -> Any:
        return check(self.driver.cuGraphCreate(0), "cuGraphCreate")

    def graph_destroy(self, graph: Any) -> None:
        check(self.driver.cuGraphDestroy(graph), "cuGraphDestroy")

    def kernel_node_params(self, func: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                           params: int) -> Any:
        p = self.driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = func
        p.gridDimX, p.gridDimY, p.gridDimZ = grid
        p.blockDimX, p.blockDimY, p.blockDimZ = block
        p.sharedMemBytes = 0
        p.kernelParams = params
        return p

    def memset_node_params(self, ptr: int, value: int, element_size: int, count: int) -> Any:
        p = self.driver.CUDA_MEMSET_NODE_PARAMS()
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
        p = self.driver.CUDA_MEMCPY3D()
        p.srcMemoryType = self._memory_device
        p.dstMemoryType = self._memory_device
        p.srcDevice = src
        p.dstDevice = dst
        p.WidthInBytes = size
        p.Height = 1
        p.Depth = 1
        return p

    def set_memcpy_node_target(self, params: Any, dst: int, src: int, size: int) -> None:
        params.srcDevice = src
        params.dstDevice = dst
        params.WidthInBytes = size

    def graph_add_kernel_node(self, graph: Any, deps: list, params: Any) -> Any:
        return check(self.driver.cuGraphAddKernelNode(graph, deps, len(deps), params), "cuGraphAddKernelNode")

    def graph_add_memset_node(self, graph: Any, deps: list, params: Any) -> Any:
        return check(self.driver.cuGraphAddMemsetNode(graph, deps, len(deps), params, self._current.context),
                     "cuGraphAddMemsetNode")

    def graph_add_memcpy_node(self, graph: Any, deps: list, params: Any) -> Any:
        return check(self.driver.cuGraphAddMemcpyNode(graph, deps, len(deps), params, self._current.context),
                     "cuGraphAddMemcpyNode")

    def graph_add_empty_node(self, graph: Any, deps: list) -> Any:
        return check(self.driver.cuGraphAddEmptyNode(graph, deps, len(deps)), "cuGraphAddEmptyNode")

    def graph_instantiate(self, graph: Any) -> Any:
        return check(self.driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        check(self.driver.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        err = self._graph_launch(graph_exec, stream)[0]
        if err:
            raise_for(err, "cuGraphLaunch")

    def exec_set_kernel_params(self, graph_exec: Any, node: Any, params: Any) -> None:
        err = self._exec_kernel(graph_exec, node, params)[0]
        if err:
            raise_for(err, "cuGraphExecKernelNodeSetParams")

    def exec_set_memset_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        err = self.driver.cuGraphExecMemsetNodeSetParams(graph_exec, node, params, self._current.context)[0]
        return self._updated(err, "cuGraphExecMemsetNodeSetParams")

    def exec_set_memcpy_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        err = self.driver.cuGraphExecMemcpyNodeSetParams(graph_exec, node, params, self._current.context)[0]
        return self._updated(err, "cuGraphExecMemcpyNodeSetParams")

    def _updated(self, err: Any, function: str) -> bool:
        """True for success, False for a change refused in place; raises for other failures."""
        if not err:
            return True
        if err in self._update_rejected:
            return False
        raise_for(err, function)


_api: CudaApi | None = None
_api_lock = threading.Lock()


def get_api() -> CudaApi:
    """The process-wide shim; imports cuda.bindings on first use (ImportError if it is not installed)."""
    global _api
    with _api_lock:
        if _api is None:
            _api = CudaApi()
        return _api
