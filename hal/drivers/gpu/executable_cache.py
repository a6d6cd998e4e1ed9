"""Executables on a GPU: a loaded module and one function per export.

The driver turns a spec into a loadable image (``image_for``: compile CUDA C
with NVRTC, or take PTX/cubin as given, cached on disk); loading the image and
looking up each export's function is the same for every GPU API.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from hal.errors import InvalidArgumentError, NotFoundError
from hal.executable import Executable, ExecutableSpec

if TYPE_CHECKING:
    from hal.drivers.gpu.device import GpuDevice


class GpuExecutable(Executable):
    """``functions[i]`` is the API function handle of ``exports[i]``."""

    def __init__(self, device: GpuDevice, spec: ExecutableSpec, module: Any, functions: list[Any]) -> None:
        super().__init__(device, spec)
        self.module = module
        self.functions = functions


class ExecutableCache:
    """Prepares executables for one device; subclasses implement ``image_for``."""

    def __init__(self, device: GpuDevice) -> None:
        self.device = device

    def image_for(self, spec: ExecutableSpec) -> bytes:
        """The module image (cubin, NUL-terminated PTX, hsaco, ...) for ``spec``."""
        raise NotImplementedError

    def prepare(self, spec: ExecutableSpec) -> GpuExecutable:
        image = self.image_for(spec)
        device = self.device
        api = device.api
        device.make_current()
        module = api.module_load(image)
        try:
            functions = [self._function(module, export) for export in spec.exports]
        except BaseException:
            api.module_unload(module)
            raise
        device.register_module(module)
        return GpuExecutable(device, spec, module, functions)

    def _function(self, module: Any, export) -> Any:
        api = self.device.api
        try:
            function = api.module_function(module, export.name)
        except NotFoundError:
            raise InvalidArgumentError(
                f"export {export.name!r} is not a kernel of the executable (declare it "
                f'extern "C" __global__ so its name is not mangled)') from None
        threads = math.prod(export.workgroup_size)
        limit = api.function_max_threads(function)
        if threads > limit:
            raise InvalidArgumentError(
                f"export {export.name!r} workgroup size {export.workgroup_size} ({threads} threads) exceeds "
                f"the {limit} threads per block the compiled kernel supports")
        return function
