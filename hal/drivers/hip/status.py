"""hipError_t, hiprtcResult and hipblasStatus_t codes -> typed HalErrors, in one place.

Every HIP call of the HIP driver is checked by its shim (``api.py``, through
``HIP``), every hiprtc call by ``check_hiprtc`` and every hipBLASLt call by
``check_hipblaslt`` (``blas.py``): a failing code becomes the HalError subclass
named below, with the API function name and the runtime's error string
(``hipGetErrorString`` / ``hiprtcGetErrorString``; hipBLASLt has none, its code's
name says it). Every code of hip-python's enums is named here explicitly (a test
holds the tables to the installed enums), so an unlisted code never silently
becomes an ``InternalError``.

The error strings are asked of the runtime only once its library has loaded:
hip-python prints a traceback (instead of raising) when ``hipGetErrorString``
cannot load ``libamdhip64``, and no traceback may reach the user.
"""

from __future__ import annotations

from hal import errors
from hal.drivers.bindings_shim import check
from hal.drivers.gpu.status import CompileError, DeviceLostError, StatusTable

__all__ = ["HIP", "HIPBLASLT", "HIPRTC", "CompileError", "DeviceLostError", "check_hipblaslt", "check_hiprtc",
           "mark_loaded"]


def _named(cls: type[errors.HalError], *names: str) -> dict[str, type[errors.HalError]]:
    return dict.fromkeys(names, cls)


_HIP_CLASSES: dict[str, type[errors.HalError]] = {
    **_named(
        errors.InvalidArgumentError,
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
        errors.ResourceExhaustedError,
        "hipErrorOutOfMemory",
        "hipErrorMemoryAllocation",
        "hipErrorRuntimeMemory",
        "hipErrorLaunchOutOfResources",
        "hipErrorCooperativeLaunchTooLarge",
    ),
    **_named(errors.NotFoundError, "hipErrorNotFound", "hipErrorFileNotFound", "hipErrorSharedObjectSymbolNotFound"),
    **_named(errors.UnavailableError, "hipErrorNotReady", "hipErrorNoDevice", "hipErrorSharedObjectInitFailed"),
    **_named(
        errors.FailedPreconditionError,
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
    **_named(errors.UnimplementedError, "hipErrorNotSupported", "hipErrorPeerAccessUnsupported"),
    **_named(errors.IncompatibleError, "hipErrorNoBinaryForGpu", "hipErrorInsufficientDriver"),
    # Failures of the runtime itself, with nothing the caller can change about them.
    **_named(
        errors.InternalError,
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

_HIPRTC_CLASSES: dict[str, type[errors.HalError]] = {
    **_named(errors.ResourceExhaustedError, "HIPRTC_ERROR_OUT_OF_MEMORY"),
    **_named(
        errors.InvalidArgumentError,
        "HIPRTC_ERROR_PROGRAM_CREATION_FAILURE",
        "HIPRTC_ERROR_INVALID_INPUT",
        "HIPRTC_ERROR_INVALID_PROGRAM",
        "HIPRTC_ERROR_INVALID_OPTION",
        "HIPRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
        "HIPRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
        "HIPRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
    ),
    **_named(CompileError, "HIPRTC_ERROR_COMPILATION", "HIPRTC_ERROR_LINKING"),
    **_named(errors.InternalError, "HIPRTC_ERROR_BUILTIN_OPERATION_FAILURE", "HIPRTC_ERROR_INTERNAL_ERROR"),
}

#: hipblasStatus_t, the status of every hipBLASLt call (shared with hipBLAS).
_HIPBLAS_CLASSES: dict[str, type[errors.HalError]] = {
    **_named(
        errors.InvalidArgumentError,
        "HIPBLAS_STATUS_INVALID_VALUE",
        "HIPBLAS_STATUS_HANDLE_IS_NULLPTR",
        "HIPBLAS_STATUS_INVALID_ENUM",
    ),
    **_named(errors.ResourceExhaustedError, "HIPBLAS_STATUS_ALLOC_FAILED"),
    **_named(errors.FailedPreconditionError, "HIPBLAS_STATUS_NOT_INITIALIZED"),
    # The library has no kernel for this problem on this device: another way of running it may.
    **_named(errors.UnimplementedError, "HIPBLAS_STATUS_NOT_SUPPORTED", "HIPBLAS_STATUS_ARCH_MISMATCH"),
    **_named(
        errors.InternalError,
        "HIPBLAS_STATUS_MAPPING_ERROR",
        "HIPBLAS_STATUS_EXECUTION_FAILED",
        "HIPBLAS_STATUS_INTERNAL_ERROR",
        "HIPBLAS_STATUS_UNKNOWN",
    ),
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


def _describer(library: str, function: str):
    """``describe`` for a StatusTable: the library's error string; "" before the library loaded
    (it must never raise nor print)."""

    def describe(code: object) -> str:
        if library not in _loaded:
            return ""
        try:
            import hip

            return _text(getattr(getattr(hip, library), function)(code))
        except Exception:
            return ""

    return describe


HIP = StatusTable("HIP runtime", _HIP_CLASSES, _HIP_STICKY, _describer("hip", "hipGetErrorString"))
HIPRTC = StatusTable("hiprtc", _HIPRTC_CLASSES, (), _describer("hiprtc", "hiprtcGetErrorString"))
# hipBLASLt exports no error-string function (hipBLAS's hipblasStatusToString is another library,
# perhaps not installed): the code's name is the description.
HIPBLASLT = StatusTable("hipBLASLt", _HIPBLAS_CLASSES, (), lambda code: "")


def check_hiprtc(result: tuple, function: str, detail: str = "") -> object:
    """Raise for a failing hiprtcResult; return the call's value(s) (hip-python returns ``(status, values...)``)."""
    return check(HIPRTC, result, function, detail)


def check_hipblaslt(result: tuple, function: str, detail: str = "") -> object:
    """Raise for a failing hipblasStatus_t; return the call's value(s) (``(status, values...)`` as hip-python's)."""
    return check(HIPBLASLT, result, function, detail)
