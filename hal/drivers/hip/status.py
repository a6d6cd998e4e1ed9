"""hipError_t and hiprtcResult codes -> typed HalErrors, in one place.

Every HIP and hiprtc call of the HIP driver goes through ``check`` (or
``raise_for`` / ``check_hiprtc``): a failing code becomes the HalError subclass
named below, with the API function name and the runtime's error string
(``hipGetErrorString`` / ``hiprtcGetErrorString``). Every ``hipError_t`` of
hip-python is named here explicitly (a test holds the tables to the installed
enum), so an unlisted code never silently becomes an ``InternalError``.

The error strings are asked of the runtime only once its library has loaded:
hip-python prints a traceback (instead of raising) when ``hipGetErrorString``
cannot load ``libamdhip64``, and no traceback may reach the user.
"""

from __future__ import annotations

from typing import NoReturn

from hal.drivers.gpu.status import CompileError, DeviceLostError, StatusTable
from hal.errors import (
    FailedPreconditionError,
    HalError,
    IncompatibleError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
    UnimplementedError,
)

__all__ = ["HIP", "HIPRTC", "CompileError", "DeviceLostError", "check", "check_hiprtc", "mark_loaded", "raise_for"]


def _named(cls: type[HalError], *names: str) -> dict[str, type[HalError]]:
    return dict.fromkeys(names, cls)


_HIP_CLASSES: dict[str, type[HalError]] = {
    **_named(
        InvalidArgumentError,
        "hipErrorInvalidValue",
        "hipErrorInvalidConfiguration",
        "hipErrorMissingConfiguration",
        "hipErrorInvalidPitchValue",
        "hipErrorInvalidSymbol",
        "hipErrorInvalidDevicePointer",
        "hipErrorInvalidMemcpyDirection",
        "hipErrorInvalidDeviceFunction",
        "hipErrorInvalidDevice",
        "hipErrorInvalidImage",
        "hipErrorInvalidKernelFile",
        "hipErrorInvalidSource",
        "hipErrorInvalidHandle",
        "hipErrorInvalidGraphicsContext",
        "hipErrorInvalidChannelDescriptor",
        "hipErrorInvalidTexture",
        "hipErrorInvalidResourceType",
        "hipErrorInvalidResourceConfiguration",
        "hipErrorInvalidClusterSize",
        "hipErrorUnsupportedLimit",
        "hipErrorAlreadyMapped",
        "hipErrorNotMapped",
        "hipErrorNotMappedAsArray",
        "hipErrorNotMappedAsPointer",
        "hipErrorArrayIsMapped",
        "hipErrorAlreadyAcquired",
        "hipErrorHostMemoryAlreadyRegistered",
        "hipErrorHostMemoryNotRegistered",
    ),
    **_named(
        ResourceExhaustedError,
        "hipErrorOutOfMemory",
        "hipErrorMemoryAllocation",
        "hipErrorRuntimeMemory",
        "hipErrorLaunchOutOfResources",
        "hipErrorCooperativeLaunchTooLarge",
    ),
    **_named(NotFoundError, "hipErrorNotFound", "hipErrorFileNotFound", "hipErrorSharedObjectSymbolNotFound"),
    **_named(UnavailableError, "hipErrorNotReady", "hipErrorNoDevice", "hipErrorSharedObjectInitFailed"),
    **_named(
        FailedPreconditionError,
        "hipErrorNotInitialized",
        "hipErrorInitializationError",
        "hipErrorDeinitialized",
        "hipErrorInvalidContext",
        "hipErrorContextAlreadyCurrent",
        "hipErrorContextAlreadyInUse",
        "hipErrorIllegalState",
        "hipErrorSetOnActiveProcess",
        "hipErrorPeerAccessAlreadyEnabled",
        "hipErrorPeerAccessNotEnabled",
        "hipErrorProfilerDisabled",
        "hipErrorProfilerNotInitialized",
        "hipErrorProfilerAlreadyStarted",
        "hipErrorProfilerAlreadyStopped",
        "hipErrorStreamCaptureUnsupported",
        "hipErrorStreamCaptureInvalidated",
        "hipErrorStreamCaptureMerge",
        "hipErrorStreamCaptureUnmatched",
        "hipErrorStreamCaptureUnjoined",
        "hipErrorStreamCaptureIsolation",
        "hipErrorStreamCaptureImplicit",
        "hipErrorStreamCaptureWrongThread",
        "hipErrorCapturedEvent",
        "hipErrorStreamDetached",
        "hipErrorGraphExecUpdateFailure",
    ),
    **_named(UnimplementedError, "hipErrorNotSupported", "hipErrorPeerAccessUnsupported"),
    **_named(IncompatibleError, "hipErrorNoBinaryForGpu", "hipErrorInsufficientDriver"),
    # Failures of the runtime itself, with nothing the caller can change about them.
    **_named(
        InternalError,
        "hipErrorUnknown",
        "hipErrorRuntimeOther",
        "hipErrorOperatingSystem",
        "hipErrorMapFailed",
        "hipErrorMapBufferObjectFailed",
        "hipErrorUnmapFailed",
        "hipErrorTbd",
    ),
}

#: Faults that leave the device's context unusable: later calls keep failing (DeviceLostError).
_HIP_STICKY = (
    "hipErrorIllegalAddress",
    "hipErrorLaunchFailure",
    "hipErrorLaunchTimeOut",
    "hipErrorPriorLaunchFailure",
    "hipErrorAssert",
    "hipErrorECCNotCorrectable",
    "hipErrorContextIsDestroyed",
)

_HIPRTC_CLASSES: dict[str, type[HalError]] = {
    **_named(ResourceExhaustedError, "HIPRTC_ERROR_OUT_OF_MEMORY"),
    **_named(
        InvalidArgumentError,
        "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE",
        "HIPRTC_ERROR_INVALID_INPUT",
        "HIPRTC_ERROR_INVALID_PROGRAM",
        "HIPRTC_ERROR_INVALID_OPTION",
        "HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
        "HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
        "HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
    ),
    **_named(CompileError, "HIPRTC_ERROR_COMPILATION", "HIPRTC_ERROR_LINKING"),
    **_named(InternalError, "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE", "HIPRTC_ERROR_INTERNAL_ERROR"),
}

#: The libraries ("hip", "hiprtc") known to be loaded: a call of theirs returned a code.
_loaded: set[str] = set()


def mark_loaded(library: str) -> None:
    """Record that ``library`` ("hip" or "hiprtc") loaded, so its codes may be described."""
    _loaded.add(library)


def _text(value: object) -> str:
    if isinstance(value, tuple):  # hip-python returns (status, text) for some releases' string getters
        value = value[-1]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return "" if value is None else str(value)  # hip-python's CStr prints as the text


def _describe_hip(code: object) -> str:
    """``hipGetErrorString``; "" before the runtime loaded (it must never raise nor print)."""
    if "hip" not in _loaded:
        return ""
    try:
        from hip import hip

        return _text(hip.hipGetErrorString(code))
    except Exception:
        return ""


def _describe_hiprtc(code: object) -> str:
    if "hiprtc" not in _loaded:
        return ""
    try:
        from hip import hiprtc

        return _text(hiprtc.hiprtcGetErrorString(code))
    except Exception:
        return ""


HIP = StatusTable("HIP runtime", _HIP_CLASSES, _HIP_STICKY, _describe_hip)
HIPRTC = StatusTable("hiprtc", _HIPRTC_CLASSES, (), _describe_hiprtc)


def raise_for(code: object, function: str, detail: str = "") -> NoReturn:
    raise HIP.error(code, function, detail)


def _values(result: tuple) -> object:
    """A successful call's single value, the tuple of its values, or None."""
    if len(result) == 2:
        return result[1]
    return result[1:] or None


def check(result: tuple, function: str) -> object:
    """Raise for a failing hipError_t; return the call's value(s) (hip-python returns ``(status, values...)``)."""
    if result[0]:
        raise HIP.error(result[0], function)
    return _values(result)


def check_hiprtc(result: tuple, function: str, detail: str = "") -> object:
    if result[0]:
        raise HIPRTC.error(result[0], function, detail)
    return _values(result)
