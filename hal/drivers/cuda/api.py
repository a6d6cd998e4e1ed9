"""The CUDA shim: ``hal.drivers.gpu.api.GpuApi`` over ``cuda.bindings.driver``.

The generic modules in ``hal/drivers/gpu`` speak of streams, events, graphs,
memory and modules through the protocol ``GpuApi`` (its docstring states the
contract); this class maps each call onto the driver API, checking every
CUresult in one place (``status.py``). The CUDA driver's own probing and device
enumeration (``driver.py``) use the calls under "driver and devices".

Handles are the bindings' own objects (CUstream, CUevent, CUgraphNode, ...), except that
streams, events and graph executables are ints while the native calls serve (``use_native``);
device pointers are plain ints so the generic code can do address arithmetic.
``cuda.bindings`` is imported when the shim is created, never at module import.
"""

from __future__ import annotations

from typing import Any

from hal.drivers.bindings_shim import BindingsShim, process_wide
from hal.drivers.cuda.status import CUDA, check

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


class CudaApi(BindingsShim):
    """The shim over ``cuda.bindings.driver`` (one per process: see ``get_api``)."""

    name = "cuda"

    def __init__(self) -> None:
        from cuda.bindings import driver

        self.driver = d = driver
        results = d.CUresult
        # the codes with which cuGraphExec{Memset,Memcpy}NodeSetParams refuse a change in place
        rejected = (results.CUDA_ERROR_INVALID_VALUE, results.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE)
        super().__init__(d, "cuda", {
            "status": CUDA, "not_ready": results.CUDA_ERROR_NOT_READY, "update_rejected": rejected,
            "stream_flags": d.CUstream_flags.CU_STREAM_NON_BLOCKING,
            "event_flags": d.CUevent_flags.CU_EVENT_DISABLE_TIMING,
            "timing_event_flags": d.CUevent_flags.CU_EVENT_DEFAULT,
            "host_flags": d.CU_MEMHOSTALLOC_PORTABLE | d.CU_MEMHOSTALLOC_DEVICEMAP,
            "max_threads_attribute": d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            "memset_params_type": d.CUDA_MEMSET_NODE_PARAMS,
            "capture_mode": d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        })
        self._launch = d.cuLaunchKernel
        self._memory_device = d.CUmemorytype.CU_MEMORYTYPE_UNIFIED
        # The driver library cuda.bindings loaded (already open: dlopen finds the same one).
        self.use_native("libcuda.so.1", "cuLaunchKernel")

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

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of the current context's device."""
        return check(self.driver.cuMemGetInfo(), "cuMemGetInfo")  # type: ignore[return-value]

    # -- memory (the rest of the calls: BindingsShim) -----------------------------------------------
    def configure_memory_pool(self, device: Any, release_threshold: int) -> None:
        d = self.driver
        pool = check(d.cuDeviceGetDefaultMemPool(device), "cuDeviceGetDefaultMemPool")
        check(d.cuMemPoolSetAttribute(pool, d.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                      d.cuuint64_t(release_threshold)), "cuMemPoolSetAttribute")

    # -- prepared calls: (bindings function, its arguments), addresses as CUdeviceptr once ---------------
    def prepare_launch(self, func: Any, grid: tuple[int, int, int], block: tuple[int, int, int], stream: Any,
                       params: int) -> Any:
        if self.native is not None:  # the packed fields run_prepared launches from C (handles are ints then)
            return self.pack_launch(func, *grid, *block, 0, stream, params)
        return (self._launch, (func, *grid, *block, 0, stream, params, 0))

    def prepare_memset(self, ptr: int, value: int, element_size: int, count: int, stream: Any) -> tuple[Any, tuple]:
        return (self._memset[element_size], (self.driver.CUdeviceptr(ptr), value, count, stream))

    def prepare_copy(self, dst: int, src: int, size: int, stream: Any) -> tuple[Any, tuple]:
        d = self.driver
        return (self._memcpy_dtod_async, (d.CUdeviceptr(dst), d.CUdeviceptr(src), size, stream))

    def prepare_upload(self, dst: int, host: int, size: int, stream: Any) -> tuple[Any, tuple]:
        return (self._memcpy_htod_async, (self.driver.CUdeviceptr(dst), host, size, stream))

    # -- graphs: CUDA's node records; memset and copy nodes name their context --------------------------
    def kernel_node_params(self, func: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                           params: int) -> Any:
        p = self.driver.CUDA_KERNEL_NODE_PARAMS()
        p.func = func
        p.gridDimX, p.gridDimY, p.gridDimZ = grid
        p.blockDimX, p.blockDimY, p.blockDimZ = block
        p.sharedMemBytes = 0
        p.kernelParams = params
        return p

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

    def graph_add_memset_node(self, graph: Any, deps: list, params: Any) -> Any:
        return check(self.driver.cuGraphAddMemsetNode(graph, deps, len(deps), params, self._current.context),
                     "cuGraphAddMemsetNode")

    def graph_add_memcpy_node(self, graph: Any, deps: list, params: Any) -> Any:
        return check(self.driver.cuGraphAddMemcpyNode(graph, deps, len(deps), params, self._current.context),
                     "cuGraphAddMemcpyNode")

    def exec_set_memset_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        function = self.driver.cuGraphExecMemsetNodeSetParams
        return self.updated(function(graph_exec, node, params, self._current.context)[0], function)

    def exec_set_memcpy_params(self, graph_exec: Any, node: Any, params: Any) -> bool:
        function = self.driver.cuGraphExecMemcpyNodeSetParams
        return self.updated(function(graph_exec, node, params, self._current.context)[0], function)


get_api = process_wide(CudaApi)
get_api.__doc__ = "The process-wide shim; imports cuda.bindings on first use (ImportError if it is not installed)."
