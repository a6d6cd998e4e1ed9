"""CUDA executables: ``cuda-c`` through NVRTC, ``ptx`` and ``cubin`` as given.

CUDA C is compiled to a cubin for the device's exact ``sm_XY``: PTX from an
NVRTC newer than the installed driver does not JIT there. Cubins are cached on
disk (``hal.disk_cache``, ``HAL_CACHE_DIR``) keyed by the source, the target,
the options and the NVRTC version. ``compile_cuda_c`` needs no GPU, so CI
compiles every kernel of the project with it.

Options (``ExecutableSpec.options``): ``nvrtc_options`` (extra command-line
flags), ``defines`` (``{name: value}`` macros).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from hal.disk_cache import DiskCache
from hal.drivers.cuda.status import CompileError, check_nvrtc
from hal.drivers.gpu.executable_cache import ExecutableCache, compiler_flags, indirect_source
from hal.errors import IncompatibleError, InvalidArgumentError, UnavailableError
from hal.executable import ExecutableSpec

FORMATS = ("cuda-c", "cubin", "ptx")
BASE_OPTIONS = ("-std=c++17",)

_disk_cache = DiskCache("cuda")


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library; UnavailableError when it cannot be loaded."""
    try:
        from cuda.bindings import nvrtc

        return tuple(check_nvrtc(nvrtc.nvrtcVersion(), "nvrtcVersion"))  # type: ignore[return-value]
    except ImportError as exc:
        raise UnavailableError(f"NVRTC is unavailable: cuda-bindings is not installed ({exc})") from None
    except RuntimeError as exc:  # the loader did not find libnvrtc
        raise UnavailableError(f"NVRTC is unavailable: {exc} (pip install nvidia-cuda-nvrtc)") from None


def supported_architectures() -> list[int]:
    from cuda.bindings import nvrtc

    return list(check_nvrtc(nvrtc.nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs"))  # type: ignore[arg-type]


def target_for(compute_capability: tuple[int, int], supported: Sequence[int]) -> str:
    """The NVRTC target for a device: its exact ``sm_XY`` cubin if NVRTC knows it, else the newest
    ``sm_XZ`` of the same major below it (a cubin runs on later minors), else PTX for the newest
    architecture below the device (JIT-compiled by the driver)."""
    major, minor = compute_capability
    wanted = major * 10 + minor
    same_major = [a for a in supported if a // 10 == major and a <= wanted]
    if same_major:
        return f"sm_{max(same_major)}"
    older = [a for a in supported if a <= wanted]
    if older:
        return f"compute_{max(older)}"
    raise IncompatibleError(
        f"NVRTC supports architectures {sorted(supported)}, none of which runs on compute capability "
        f"{major}.{minor}")


def _options(options: Mapping[str, Any] | None) -> list[str]:
    return compiler_flags(options, BASE_OPTIONS, "nvrtc_options")


def compile_cuda_c(source: str | bytes, target: str, options: Mapping[str, Any] | None = None,
                   name: str = "kernels.cu") -> bytes:
    """Compile CUDA C for ``target`` (``sm_90``: cubin, ``compute_90``: PTX); CompileError with the log."""
    from cuda.bindings import nvrtc

    text = source.encode() if isinstance(source, str) else bytes(source)
    flags = [f"--gpu-architecture={target}", *_options(options)]
    program = check_nvrtc(nvrtc.nvrtcCreateProgram(text, name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        encoded = [flag.encode() for flag in flags]
        result = nvrtc.nvrtcCompileProgram(program, len(encoded), encoded)
        log = _log(nvrtc, program)
        if result[0]:
            if result[0] == nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
                raise CompileError(f"NVRTC could not compile {name} for {target}:\n{log}", log)
            check_nvrtc(result, "nvrtcCompileProgram", log)
        if target.startswith("sm_"):
            size = check_nvrtc(nvrtc.nvrtcGetCUBINSize(program), "nvrtcGetCUBINSize")
            image = b" " * size  # type: ignore[operator]
            check_nvrtc(nvrtc.nvrtcGetCUBIN(program, image), "nvrtcGetCUBIN")
        else:
            size = check_nvrtc(nvrtc.nvrtcGetPTXSize(program), "nvrtcGetPTXSize")
            image = b" " * size  # type: ignore[operator]
            check_nvrtc(nvrtc.nvrtcGetPTX(program, image), "nvrtcGetPTX")
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _log(nvrtc: Any, program: Any) -> str:
    size = check_nvrtc(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
    if not size or size <= 1:
        return ""
    log = b" " * size  # type: ignore[operator]
    check_nvrtc(nvrtc.nvrtcGetProgramLog(program, log), "nvrtcGetProgramLog")
    return log.rstrip(b"\0").decode(errors="replace")


def cached_compile(source: str | bytes, target: str, options: Mapping[str, Any] | None = None) -> bytes:
    """``compile_cuda_c`` through the disk cache."""
    text = source.encode() if isinstance(source, str) else bytes(source)
    major, minor = nvrtc_version()
    key = "|".join([hashlib.sha256(text).hexdigest(), target, repr(_options(options)), f"nvrtc-{major}.{minor}"])
    image = _disk_cache.get(key)
    if image is None:
        image = compile_cuda_c(text, target, options)
        _disk_cache.put(key, image)
    return image


class CudaExecutableCache(ExecutableCache):
    """``cuda-c`` (when NVRTC loads), ``cubin`` and ``ptx`` for a device of ``compute_capability``."""

    source_format = "cuda-c"

    def __init__(self, compute_capability: tuple[int, int]) -> None:
        self.compute_capability = compute_capability
        self._target: str | None = None
        try:
            nvrtc_version()
            self.formats = FORMATS
        except UnavailableError:  # no NVRTC library: precompiled formats only
            self.formats = tuple(f for f in FORMATS if f != "cuda-c")
            self.source_format = None

    @property
    def target(self) -> str:
        if self._target is None:
            self._target = target_for(self.compute_capability, supported_architectures())
        return self._target

    def image_for(self, spec: ExecutableSpec) -> bytes:
        code = spec.code
        if spec.format == "cuda-c":
            if not isinstance(code, (str, bytes)):
                raise InvalidArgumentError(f"cuda-c code must be CUDA C source text, got {type(code).__name__}")
            return cached_compile(code, self.target, spec.options)
        if spec.format == "ptx":
            if isinstance(code, str):
                code = code.encode()
            if not isinstance(code, (bytes, bytearray, memoryview)):
                raise InvalidArgumentError(f"ptx code must be PTX text, got {type(code).__name__}")
            text = bytes(code)
            return text if text.endswith(b"\0") else text + b"\0"
        if spec.format == "cubin":
            if not isinstance(code, (bytes, bytearray, memoryview)):
                raise InvalidArgumentError(f"cubin code must be bytes, got {type(code).__name__}")
            return bytes(code)
        raise IncompatibleError(f"the CUDA driver cannot prepare {spec.format!r} executables")

    def indirect_image_for(self, spec: ExecutableSpec) -> bytes | None:
        if spec.format != "cuda-c":
            return None  # precompiled code cannot be given another entry point
        code = spec.code.decode() if isinstance(spec.code, bytes) else spec.code
        return cached_compile(indirect_source(code, spec.exports), self.target, spec.options)

