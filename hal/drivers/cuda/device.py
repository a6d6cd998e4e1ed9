"""The CUDA device: the GPU-generic device on the primary context of one CUdevice.

Everything device-specific is handed to ``GpuDevice``: the shim, the context,
the launch limits and memory from the device's attributes, and the executable
cache compiling for its exact ``sm_XY``, with cuBLASLt behind its library routines
where the library loads (``blas.py``).
"""

from __future__ import annotations

from typing import Any

from hal.driver import DeviceInfo, Driver
from hal.drivers.cuda import blas, fft, nccl, solver
from hal.drivers.cuda.executable_cache import CudaExecutableCache
from hal.drivers.gpu.channel import GpuCollectives
from hal.drivers.gpu.device import GpuDevice
from hal.drivers.gpu.library import LibraryBackends


def create_device(
    driver: Driver, info: DeviceInfo, *, api: Any, handle: Any, context: Any, options: dict[str, Any]
) -> GpuDevice:
    props = info.properties
    limits = {
        "max_workgroup_count": (props["max_grid_dim_x"], props["max_grid_dim_y"], props["max_grid_dim_z"]),
        "max_workgroup_size": props["max_threads_per_block"],
    }
    executables = CudaExecutableCache((props["compute_capability_major"], props["compute_capability_minor"]))
    executables.libraries = LibraryBackends.of({"gemm": blas.load(info.ordinal, api),
                                                  "fft": fft.load(info.ordinal, api), **solver.load(info.ordinal, api)})
    device = GpuDevice(
        driver,
        info,
        api=api,
        handle=handle,
        context=context,
        options=options,
        limits=limits,
        memory_bytes=props["memory_total"],
        memory_pools=bool(props.get("memory_pools_supported")),
        executables=executables,
    )
    device.collectives = GpuCollectives(device, nccl.load)  # loaded at the first channel
    return device
