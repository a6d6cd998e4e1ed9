"""CUresult and nvrtcResult codes -> typed HalErrors, in one place.

Every driver-API call of the CUDA driver goes through ``check`` (or ``raise_for``):
a failing code becomes the HalError subclass below, with the API function name and
the driver's error string (``cuGetErrorString``; the code's name when the driver
library cannot be loaded, as on a machine without a GPU).
"""

from __future__ import annotations

from typing import NoReturn

from hal.drivers.bindings_shim import check as checked
from hal.drivers.gpu.status import CompileError, DeviceLostError, StatusTable
from hal.errors import (
    FailedPreconditionError,
    HalError,
    IncompatibleError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
)

__all__ = ["CUDA", "NVRTC", "CompileError", "DeviceLostError", "check", "check_nvrtc", "raise_for"]

_CUDA_CLASSES: dict[str, type[HalError]] = {
    "CUDA_ERROR_INVALID_VALUE": InvalidArgumentError,
    "CUDA_ERROR_INVALID_HANDLE": InvalidArgumentError,
    "CUDA_ERROR_INVALID_DEVICE": InvalidArgumentError,
    "CUDA_ERROR_INVALID_IMAGE": InvalidArgumentError,
    "CUDA_ERROR_INVALID_SOURCE": InvalidArgumentError,
    "CUDA_ERROR_INVALID_CLUSTER_SIZE": InvalidArgumentError,
    "CUDA_ERROR_ALREADY_MAPPED": InvalidArgumentError,
    "CUDA_ERROR_NOT_MAPPED": InvalidArgumentError,
    "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED": InvalidArgumentError,
    "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED": InvalidArgumentError,
    "CUDA_ERROR_OUT_OF_MEMORY": ResourceExhaustedError,
    "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES": ResourceExhaustedError,
    "CUDA_ERROR_TOO_MANY_PEERS": ResourceExhaustedError,
    "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE": ResourceExhaustedError,
    "CUDA_ERROR_NOT_FOUND": NotFoundError,
    "CUDA_ERROR_FILE_NOT_FOUND": NotFoundError,
    "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND": NotFoundError,
    "CUDA_ERROR_NOT_READY": UnavailableError,
    "CUDA_ERROR_NO_DEVICE": UnavailableError,
    "CUDA_ERROR_DEVICE_UNAVAILABLE": UnavailableError,
    "CUDA_ERROR_SYSTEM_NOT_READY": UnavailableError,
    "CUDA_ERROR_STUB_LIBRARY": UnavailableError,
    "CUDA_ERROR_NOT_INITIALIZED": FailedPreconditionError,
    "CUDA_ERROR_DEINITIALIZED": FailedPreconditionError,
    "CUDA_ERROR_INVALID_CONTEXT": FailedPreconditionError,
    "CUDA_ERROR_CONTEXT_ALREADY_IN_USE": FailedPreconditionError,
    "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE": FailedPreconditionError,
    "CUDA_ERROR_ILLEGAL_STATE": FailedPreconditionError,
    "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": FailedPreconditionError,
    "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": FailedPreconditionError,
    "CUDA_ERROR_CAPTURED_EVENT": FailedPreconditionError,
    "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE": FailedPreconditionError,
    "CUDA_ERROR_NOT_PERMITTED": PermissionDeniedError,
    "CUDA_ERROR_DEVICE_NOT_LICENSED": PermissionDeniedError,
    "CUDA_ERROR_NOT_SUPPORTED": UnimplementedError,
    "CUDA_ERROR_CDP_NOT_SUPPORTED": UnimplementedError,
    "CUDA_ERROR_NO_BINARY_FOR_GPU": IncompatibleError,
    "CUDA_ERROR_INVALID_PTX": IncompatibleError,
    "CUDA_ERROR_UNSUPPORTED_PTX_VERSION": IncompatibleError,
    "CUDA_ERROR_JIT_COMPILER_NOT_FOUND": IncompatibleError,
    "CUDA_ERROR_JIT_COMPILATION_DISABLED": IncompatibleError,
    "CUDA_ERROR_INSUFFICIENT_DRIVER": IncompatibleError,
    "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER": IncompatibleError,
    "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH": IncompatibleError,
    "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE": IncompatibleError,
    "CUDA_ERROR_TIMEOUT": InternalError,
}

#: Faults that leave the context unusable: every later call fails with the same code.
_CUDA_STICKY = (
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_NVLINK_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_CONTAINED",
    "CUDA_ERROR_EXTERNAL_DEVICE",
    "CUDA_ERROR_TENSOR_MEMORY_LEAK",
)


def _describe_cuda(code: object) -> str:
    """``cuGetErrorString``, or "" when the driver library is missing (it must never raise)."""
    try:
        from cuda.bindings import driver

        err, text = driver.cuGetErrorString(code)
        if err == 0 and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # no libcuda: describe by name only
        pass
    return ""


def _describe_nvrtc(code: object) -> str:
    try:
        from cuda.bindings import nvrtc

        err, text = nvrtc.nvrtcGetErrorString(code)
        if err == 0 and text:
            return text.decode() if isinstance(text, bytes) else str(text)
    except Exception:
        pass
    return ""


CUDA = StatusTable("CUDA driver", _CUDA_CLASSES, _CUDA_STICKY, _describe_cuda)

NVRTC = StatusTable(
    "NVRTC",
    {
        "NVRTC_ERROR_OUT_OF_MEMORY": ResourceExhaustedError,
        "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED": ResourceExhaustedError,
        "NVRTC_ERROR_PROGRAM_CREATION_FAILURE": InvalidArgumentError,
        "NVRTC_ERROR_INVALID_INPUT": InvalidArgumentError,
        "NVRTC_ERROR_INVALID_PROGRAM": InvalidArgumentError,
        "NVRTC_ERROR_INVALID_OPTION": InvalidArgumentError,
        "NVRTC_ERROR_COMPILATION": CompileError,
        "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID": InvalidArgumentError,
        "NVRTC_ERROR_CANCELLED": InternalError,
    },
    (),
    _describe_nvrtc,
)


def raise_for(code: object, function: str, detail: str = "") -> NoReturn:
    raise CUDA.error(code, function, detail)


def check(result: tuple, function: str) -> object:
    """Raise for a failing CUresult; return the call's single value (or the tuple of values, or None)."""
    return checked(CUDA, result, function)


def check_nvrtc(result: tuple, function: str, detail: str = "") -> object:
    return checked(NVRTC, result, function, detail)
