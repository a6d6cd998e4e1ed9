"""The CUDA device: the GPU-generic device on the primary context of one CUdevice."""

from __future__ import annotations

from typing import Any

from hal.drivers.cuda.executable_cache import FORMATS, JOIN_KERNEL_SOURCE, CudaExecutableCache, nvrtc_version
from hal.drivers.gpu.device import GpuDevice
from hal.errors import HalError
from hal.executable import Executable, ExecutableSpec, Export


class CudaDevice(GpuDevice):
    def __init__(self, driver, info, *, api: Any, handle: Any, context: Any, options: dict[str, Any]) -> None:
        props = info.properties
        limits = {
            "max_workgroup_count": (props["max_grid_dim_x"], props["max_grid_dim_y"], props["max_grid_dim_z"]),
            "max_workgroup_size": props["max_threads_per_block"],
        }
        super().__init__(driver, info, api=api, handle=handle, context=context, options=options, limits=limits,
                         memory_bytes=props["memory_total"], memory_pools=bool(props.get("memory_pools_supported")))
        self.executables = CudaExecutableCache(self, (props["compute_capability_major"],
                                                      props["compute_capability_minor"]))
        try:
            nvrtc_version()
            self.executable_formats = FORMATS
        except HalError:  # no NVRTC library: precompiled formats only
            self.executable_formats = tuple(f for f in FORMATS if f != "cuda-c")

    def _prepare_executable(self, spec: ExecutableSpec) -> Executable:
        return self.executables.prepare(spec)

    def _load_join_function(self) -> Any:
        spec = ExecutableSpec("cuda-c", JOIN_KERNEL_SOURCE, [Export("hal_join")])
        return self.load_executable(spec).functions[0]  # type: ignore[attr-defined]
