"""The HIP device: the GPU-generic device on one HIP device ordinal.

Everything device-specific is handed to ``GpuDevice``: the shim, the device
ordinal (HIP's handle and, made current with ``hipSetDevice``, its context),
the launch limits and memory from the device's properties, and the executable
cache compiling for its exact ``gcnArchName``, with hipBLASLt behind its library
routines where the library loads (``blas.py``), hipFFT behind its FFTs (``fft.py``).
"""

from __future__ import annotations

from typing import Any

from hal.driver import DeviceInfo, Driver
from hal.drivers.gpu.channel import GpuCollectives
from hal.drivers.gpu.device import GpuDevice
from hal.drivers.gpu.library import LibraryBackends
from hal.drivers.hip import blas, fft, rccl, solver
from hal.drivers.hip.executable_cache import HipExecutableCache


def create_device(driver: Driver, info: DeviceInfo, *, api: Any, options: dict[str, Any]) -> GpuDevice:
    props = info.properties
    limits = {"max_workgroup_count": props["max_grid_dims"], "max_workgroup_size": props["max_threads_per_block"]}
    executables = HipExecutableCache(props["gcn_arch_name"])
    executables.libraries = LibraryBackends.of({"gemm": blas.load(info.ordinal, api),
                                                  "fft": fft.load(info.ordinal, api), **solver.load(info.ordinal, api)})
    device = GpuDevice(
        driver,
        info,
        api=api,
        handle=info.ordinal,
        context=info.ordinal,
        options=options,
        limits=limits,
        memory_bytes=props["memory_total"],
        memory_pools=bool(props.get("memory_pools_supported")),
        executables=executables,
    )
    device.collectives = GpuCollectives(device, rccl.load)  # loaded at the first channel
    return device
