"""Executables on a GPU: a loaded module and one function per export.

A driver hands its ``GpuDevice`` an ``ExecutableCache`` that turns a spec into a
loadable image (``image_for``: compile CUDA C with NVRTC or HIP C with hiprtc,
or take a precompiled format as given, cached on disk) and lists the formats it
prepares; loading the image and looking up each export's function is the same
for every GPU API, written here once against ``GpuApi``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hal import interrupts
from hal.errors import InvalidArgumentError, NotFoundError, UnimplementedError
from hal.executable import Executable, ExecutableSpec, Export

if TYPE_CHECKING:
    from hal.drivers.gpu.device import GpuDevice


class GpuExecutable(Executable):
    """``functions[i]`` is the API function handle of ``exports[i]``.

    Its modules (its own, and its indirect-binding variants' once loaded) are unloaded when it is
    collected: command buffers that recorded a dispatch of it hold it (and so does a submission
    of them until it retires), the device's executable cache holds the recently loaded ones. A
    device closed first has unloaded them already (``LoadedModules.unload_all``).
    """

    def __init__(self, device: GpuDevice, spec: ExecutableSpec, module: Any, functions: list[Any]) -> None:
        super().__init__(device, spec)
        self.spec = spec
        self.module = module
        self.functions = functions
        #: Indirect-binding variants (``None``: not loaded yet; ``()``: none available).
        self.indirect: Any = None
        #: The modules to unload with it (the finalizer holds this list, not the executable).
        self.modules: list[Any] = [] if module is None else [module]
        interrupts.finalize(self, device.modules.unload, self.modules).atexit = False  # (exit frees them all)


#: The no-op kernel that joins graph levels when a barrier is lowered to a kernel node (CUDA and HIP C).
JOIN_KERNEL_SOURCE = 'extern "C" __global__ void hal_join() {}\n'


class ExecutableCache:
    """Prepares executables for one device; subclasses implement ``image_for``.

    ``formats`` lists the executable formats the device accepts (``Device.executable_formats``);
    ``source_format`` is the one compiled from source text (the join kernel's), None if none.
    """

    formats: tuple[str, ...] = ()
    source_format: str | None = None
    #: The vendor library behind the ``library`` format (``hal/drivers/gpu/library.py``), None
    #: when it is not installed or does not load (the device then lacks the format).
    libraries: Any = None

    def image_for(self, spec: ExecutableSpec) -> bytes:
        """The module image (cubin, NUL-terminated PTX, hsaco, ...) for ``spec``."""
        raise NotImplementedError

    def indirect_image_for(self, spec: ExecutableSpec) -> bytes | None:
        """The image of the indirect-binding variants of ``spec``'s exports, or None if the format has none."""
        return None

    def indirect_functions(self, device: GpuDevice, executable: GpuExecutable) -> tuple[Any, ...]:
        """Per export: the variant reading its binding addresses from a device table (see
        graph_command_buffer), or None for exports without bindings; () when unavailable."""
        try:
            image = self.indirect_image_for(executable.spec)
        except Exception:  # a source the transformation does not fit: keep direct bindings
            return ()
        if image is None:
            return ()
        api = device.api
        device.make_current()
        module = api.module_load(image)
        device.modules.register(module)
        executable.modules.append(module)
        return tuple(api.module_function(module, indirect_name(export.name)) if export.bindings else None
                     for export in executable.spec.exports)

    def prepare(self, device: GpuDevice, spec: ExecutableSpec) -> GpuExecutable:
        image = self.image_for(spec)
        api = device.api
        device.make_current()
        module = api.module_load(image)
        try:
            functions = [self._function(api, module, export) for export in spec.exports]
        except BaseException:
            api.module_unload(module)
            raise
        device.modules.register(module)
        return GpuExecutable(device, spec, module, functions)

    def join_function(self, device: GpuDevice) -> Any:
        """The function of the no-op kernel joining graph levels (loaded through the device's cache)."""
        if self.source_format is None:
            raise UnimplementedError("this device compiles no kernel source: barriers cannot join with a kernel")
        spec = ExecutableSpec(self.source_format, JOIN_KERNEL_SOURCE, [Export("hal_join")])
        executable = device.load_executable(spec)
        device.keep_loaded(executable)  # (its function serves for the device's life)
        return executable.functions[0]  # type: ignore[attr-defined]

    @staticmethod
    def _function(api: Any, module: Any, export) -> Any:
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


def compiler_flags(options: Mapping[str, Any] | None, base: Sequence[str], extra_option: str) -> list[str]:
    """The compiler command line of a spec's options: ``base``, then ``-D`` for each of ``defines``
    (``{name: value}``, value None for a bare name), then the strings of option ``extra_option``."""
    options = dict(options or {})
    extra = options.pop(extra_option, ())
    if isinstance(extra, str) or not all(isinstance(flag, str) for flag in extra):
        raise InvalidArgumentError(f"{extra_option} must be a list of strings, got {extra!r}")
    defines = dict(options.pop("defines", {}) or {}).items()
    return [*base, *(f"-D{name}" if value is None else f"-D{name}={value}" for name, value in defines), *extra]


def indirect_name(name: str) -> str:
    return f"{name}__hal_indirect"


#: Put before kernel source for its indirect-binding variants: the kernels become inlinable device
#: functions, whose launch bounds (allowed on kernels only) the wrappers carry instead.
INDIRECT_HEAD = r"""
#define __global__ __device__
#undef __launch_bounds__
#define __launch_bounds__(...)
"""

#: Appended to that source: each export gets a kernel that reads its binding addresses from a
#: device table and calls the export's function, bounded to the export's workgroup size (so that
#: the registers the inlined body takes still fit the workgroup: 64 a thread for 1024 threads).
#: Conversions keep the direct ABI exactly: any pointer type from the table entry, any 4-byte
#: constant type bit for bit.
INDIRECT_PRELUDE = r"""
#undef __global__
#define __global__ __attribute__((global))
#if defined(__HIP__) || defined(__HIPCC_RTC__)
#define HAL_MAX_THREADS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#else
#define HAL_MAX_THREADS(n) __attribute__((launch_bounds(n)))
#endif
struct hal_indirect_pointer {
  unsigned long long value;
  template <class T> __device__ __forceinline__ operator T*() const { return reinterpret_cast<T*>(value); }
};
struct hal_indirect_constant {
  unsigned int value;
  template <class T> __device__ __forceinline__ operator T() const {
    T result{};
    memcpy(&result, &value, sizeof(T) < sizeof(value) ? sizeof(T) : sizeof(value));
    return result;
  }
};
"""


def indirect_source(source: str, exports) -> str:
    """CUDA/HIP C of the indirect-binding variants of ``exports`` defined in ``source``."""
    wrappers = [INDIRECT_PRELUDE]
    for export in exports:
        if not export.bindings:
            continue
        params = "".join(f", unsigned int c{i}" for i in range(export.constants))
        args = [f"hal_indirect_pointer{{hal_bindings[{i}]}}" for i in range(export.bindings)]
        args += [f"hal_indirect_constant{{c{i}}}" for i in range(export.constants)]
        threads = math.prod(export.workgroup_size)
        wrappers.append(
            f'extern "C" __global__ void HAL_MAX_THREADS({threads}) {indirect_name(export.name)}('
            f"const unsigned long long* __restrict__ hal_bindings{params}) {{ {export.name}({', '.join(args)}); }}\n")
    return INDIRECT_HEAD + source + "\n" + "".join(wrappers)
