"""HIP executables: ``hip-c`` through hiprtc, ``hsaco`` code objects as given.

HIP C is compiled for the device's exact ``gcnArchName`` (``gfx90a:sramecc+:xnack-``)
into a code object (hsaco). Code objects are cached on disk (``hal.disk_cache``,
``HAL_CACHE_DIR``) keyed by the source, the target, the options and the
compiler's identity. ``compile_hip_c`` needs no GPU, so CI compiles every kernel
of the project with it (Debian's ROCm 5.2 hiprtc on a CPU machine).

The compiler (AMD's code-object manager, comgr) aborts the whole process when
asked for a processor it does not know (ROCm 5.2's for gfx940 and later), so a
target is first checked against comgr's own list of ISAs and refused with
``IncompatibleError``.

Options (``ExecutableSpec.options``): ``hiprtc_options`` (extra command-line
flags), ``defines`` (``{name: value}`` macros).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Mapping
from typing import Any

from hal.disk_cache import DiskCache
from hal.drivers.gpu.executable_cache import ExecutableCache, compiler_flags, indirect_source
from hal.drivers.hip.status import HIPRTC, CompileError, check_hiprtc, mark_loaded
from hal.errors import IncompatibleError, InvalidArgumentError, UnavailableError
from hal.executable import ExecutableSpec

FORMATS = ("hip-c", "hsaco")
BASE_OPTIONS = ("-std=c++17",)
#: What a code object starts with: an ELF image, or a clang offload bundle of several.
CODE_OBJECT_MAGICS = (b"\x7fELF", b"__CLANG_OFFLOAD_BUNDLE__")
#: The comgr libraries of the ROCm releases the driver knows, newest first.
COMGR_LIBRARIES = ("libamd_comgr.so.3", "libamd_comgr.so.2", "libamd_comgr.so")

_disk_cache = DiskCache("hip")
_comgr_lock = threading.Lock()
_hiprtc_lock = threading.Lock()
_comgr: dict[str, Any] = {}


def _import_hiprtc() -> Any:
    try:
        from hip import hiprtc
    except ImportError as exc:
        raise UnavailableError(f"hiprtc is unavailable: hip-python is not installed ({exc})") from None
    return hiprtc


def hiprtc_version() -> tuple[int, int]:
    """(major, minor) as ``hiprtcVersion`` reports it; UnavailableError when hiprtc cannot be loaded.
    (ROCm 5.2's hiprtc reports a fixed 9.0: ``compiler_identity`` names comgr's version too.)"""
    hiprtc = _import_hiprtc()
    try:
        result = hiprtc.hiprtcVersion()
    except RuntimeError as exc:  # the loader did not find libhiprtc.so
        raise UnavailableError(f"hiprtc is unavailable: {exc}") from None
    mark_loaded("hiprtc")
    major, minor = check_hiprtc(result, "hiprtcVersion")  # type: ignore[misc]
    return int(major), int(minor)


def _comgr_library() -> Any:
    """comgr through ctypes (hip-python does not bind it), or None where no known release loads."""
    with _comgr_lock:
        if "lib" not in _comgr:
            _comgr["lib"] = None
            for name in COMGR_LIBRARIES:
                try:
                    _comgr["lib"] = ctypes.CDLL(name)
                    break
                except OSError:
                    continue
        return _comgr["lib"]


def comgr_version() -> str | None:
    lib = _comgr_library()
    if lib is None:
        return None
    major, minor = ctypes.c_size_t(), ctypes.c_size_t()
    lib.amd_comgr_get_version(ctypes.byref(major), ctypes.byref(minor))
    return f"{major.value}.{minor.value}"


def known_processors() -> frozenset[str] | None:
    """The processors (``gfx90a``, ...) the installed comgr compiles for; None if comgr cannot be asked."""
    lib = _comgr_library()
    if lib is None:
        return None
    with _comgr_lock:
        if "isas" not in _comgr:
            count = ctypes.c_size_t()
            names = set()
            if lib.amd_comgr_get_isa_count(ctypes.byref(count)) == 0:
                for index in range(count.value):
                    name = ctypes.c_char_p()
                    if lib.amd_comgr_get_isa_name(ctypes.c_size_t(index), ctypes.byref(name)) == 0 and name.value:
                        # "amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-" -> "gfx90a"
                        names.add(name.value.decode().rsplit("--", 1)[-1].split(":", 1)[0])
            _comgr["isas"] = frozenset(names)
        return _comgr["isas"]


def processor(target: str) -> str:
    """The processor of a gcnArchName: ``gfx90a:sramecc+:xnack-`` -> ``gfx90a``."""
    return target.split(":", 1)[0]


def check_target(target: str) -> None:
    """IncompatibleError unless the installed compiler knows ``target``'s processor (see the module doc)."""
    known = known_processors()
    if known is not None and processor(target) not in known:
        newest = sorted(known, key=lambda p: (len(p), p))[-3:]
        raise IncompatibleError(
            f"the installed HIP compiler (comgr {comgr_version()}) cannot compile for {processor(target)!r}; "
            f"it knows {len(known)} processors, the newest {', '.join(newest)}"
        )


def compiler_identity() -> str:
    """What decides the compiled code besides the source and options (the disk cache's key)."""
    major, minor = hiprtc_version()
    return f"hiprtc-{major}.{minor}/comgr-{comgr_version()}"


def compiler_properties() -> dict[str, Any]:
    """What ``--dump-devices`` reports of the compiler: its identity and the formats a device accepts."""
    try:
        return {"compiler": compiler_identity(), "executable_formats": list(FORMATS)}
    except UnavailableError as exc:
        return {"compiler": f"unavailable ({exc.message})", "executable_formats": ["hsaco"]}


def _options(options: Mapping[str, Any] | None) -> list[str]:
    return compiler_flags(options, BASE_OPTIONS, "hiprtc_options")


def compile_hip_c(
    source: str | bytes, target: str, options: Mapping[str, Any] | None = None, name: str = "kernels.hip"
) -> bytes:
    """Compile HIP C into a code object for ``target`` (a gcnArchName); CompileError with the log."""
    check_target(target)
    hiprtc = _import_hiprtc()
    text = source.encode() if isinstance(source, str) else bytes(source)
    flags = [flag.encode() for flag in (f"--offload-arch={target}", *_options(options))]
    with _hiprtc_lock:  # ROCm 5.2's hiprtc aborts the process when two threads compile at once
        return _compile(hiprtc, text, name, target, flags)


def _compile(hiprtc: Any, text: bytes, name: str, target: str, flags: list[bytes]) -> bytes:
    program = check_hiprtc(hiprtc.hiprtcCreateProgram(text, name.encode(), 0, [], []), "hiprtcCreateProgram")
    mark_loaded("hiprtc")
    try:
        result = hiprtc.hiprtcCompileProgram(program, len(flags), flags)
        log = _log(hiprtc, program)
        if result[0]:
            if HIPRTC.error_class(result[0].name) is CompileError:
                raise CompileError(f"hiprtc could not compile {name} for {target}:\n{log}", log)
            check_hiprtc(result, "hiprtcCompileProgram", log)
        size = int(check_hiprtc(hiprtc.hiprtcGetCodeSize(program), "hiprtcGetCodeSize"))  # type: ignore[call-overload]
        image = bytearray(size)
        check_hiprtc(hiprtc.hiprtcGetCode(program, image), "hiprtcGetCode")
        return bytes(image)
    finally:
        hiprtc.hiprtcDestroyProgram(program.createRef())


def _log(hiprtc: Any, program: Any) -> str:
    size = int(check_hiprtc(hiprtc.hiprtcGetProgramLogSize(program), "hiprtcGetProgramLogSize"))  # type: ignore[call-overload]
    if size <= 1:
        return ""
    log = bytearray(size)
    check_hiprtc(hiprtc.hiprtcGetProgramLog(program, log), "hiprtcGetProgramLog")
    return bytes(log).rstrip(b"\0").decode(errors="replace")


def cached_compile(source: str | bytes, target: str, options: Mapping[str, Any] | None = None) -> bytes:
    """``compile_hip_c`` through the disk cache."""
    text = source.encode() if isinstance(source, str) else bytes(source)
    key = "|".join([hashlib.sha256(text).hexdigest(), target, repr(_options(options)), compiler_identity()])
    image = _disk_cache.get(key)
    if image is None:
        image = compile_hip_c(text, target, options)
        _disk_cache.put(key, image)
    return image


def code_object(code: Any) -> bytes:
    """An ``hsaco`` spec's code checked to be a code object (before any device work)."""
    if not isinstance(code, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"hsaco code must be bytes, got {type(code).__name__}")
    image = bytes(code)
    if not image.startswith(CODE_OBJECT_MAGICS):
        raise InvalidArgumentError("hsaco code is not an AMDGPU code object (neither ELF nor an offload bundle)")
    return image


class HipExecutableCache(ExecutableCache):
    """``hip-c`` (when hiprtc loads) and ``hsaco`` for a device of gcnArchName ``target``."""

    source_format = "hip-c"

    def __init__(self, target: str) -> None:
        self.target = target
        try:
            hiprtc_version()
            self.formats = FORMATS
        except UnavailableError:  # no hiprtc: code objects only
            self.formats = ("hsaco",)
            self.source_format = None

    def image_for(self, spec: ExecutableSpec) -> bytes:
        if spec.format == "hip-c":
            if not isinstance(spec.code, (str, bytes)):
                raise InvalidArgumentError(f"hip-c code must be HIP C source text, got {type(spec.code).__name__}")
            return cached_compile(spec.code, self.target, spec.options)
        if spec.format == "hsaco":
            return code_object(spec.code)
        raise IncompatibleError(f"the HIP driver cannot prepare {spec.format!r} executables")

    def indirect_image_for(self, spec: ExecutableSpec) -> bytes | None:
        if spec.format != "hip-c":
            return None  # a code object cannot be given another entry point
        code = spec.code.decode() if isinstance(spec.code, bytes) else spec.code
        return cached_compile(indirect_source(code, spec.exports), self.target, spec.options)
