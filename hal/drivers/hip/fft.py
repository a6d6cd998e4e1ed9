"""hipFFT behind the HIP driver's FFT routines (``hal.Fft``), through hip-python's bindings (``hip.hipfft``).

``load()`` gives the backend (``hal.drivers.gpu.library.LibraryBackend`` of the "fft" kind) when
hip-python's hipFFT bindings import; ``libhipfft.so`` itself is loaded at the first FFT routine, and
a failure then refuses every FFT routine with the reason, logged once (the runtime's ``rt.fft``
raises ``UnimplementedError`` naming hipFFT when the op is built).

The plan cache, the locking and the c2r input copy are the GPU drivers' (``hal/drivers/gpu/fft.py``);
this module makes hipFFT's plans: ``hipfftMakePlanMany64`` in the routine's layout (hipFFT takes
cuFFT's advanced data layout) with automatic work-area allocation off, so every call gets the
``LibraryCall``'s workspace (``hipfftSetWorkArea``) and the queue's or the capture's stream
(``hipfftSetStream``) right before the typed exec call. Every call's hipfftResult is checked
(``check_hipfft``): a failing code becomes the HalError subclass named in ``HIPFFT``.

This backend was never run on AMD hardware: CI checks its calls' arguments against hip-python's
signatures and conversions (tests/drivers/test_hip_fft.py), not their results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hal import errors
from hal.distribution import install_hint
from hal.drivers.bindings_shim import check
from hal.drivers.gpu.fft import DIRECTIONS, FftBackend, Run, plan_arguments
from hal.drivers.gpu.library import DeferredBackend, VendorLibrary
from hal.drivers.gpu.status import StatusTable
from hal.library_fft import Fft, FftShape

#: The exec function of each transform type, and whether it takes a direction.
EXECS = {"C2C": ("hipfftExecC2C", True), "Z2Z": ("hipfftExecZ2Z", True), "R2C": ("hipfftExecR2C", False),
         "D2Z": ("hipfftExecD2Z", False), "C2R": ("hipfftExecC2R", False), "Z2D": ("hipfftExecZ2D", False)}

_CLASSES: dict[str, type[errors.HalError]] = {
    **dict.fromkeys(("HIPFFT_INVALID_PLAN", "HIPFFT_INVALID_TYPE", "HIPFFT_INVALID_VALUE", "HIPFFT_INVALID_SIZE",
                     "HIPFFT_UNALIGNED_DATA", "HIPFFT_INCOMPLETE_PARAMETER_LIST", "HIPFFT_PARSE_ERROR"),
                    errors.InvalidArgumentError),
    "HIPFFT_ALLOC_FAILED": errors.ResourceExhaustedError,
    **dict.fromkeys(("HIPFFT_NO_WORKSPACE", "HIPFFT_INVALID_DEVICE"), errors.FailedPreconditionError),
    **dict.fromkeys(("HIPFFT_NOT_IMPLEMENTED", "HIPFFT_NOT_SUPPORTED"), errors.UnimplementedError),
    **dict.fromkeys(("HIPFFT_INTERNAL_ERROR", "HIPFFT_EXEC_FAILED", "HIPFFT_SETUP_FAILED"), errors.InternalError),
}
#: hipfftResult codes -> typed errors (hipFFT has no error-string function: the code's name says it).
HIPFFT = StatusTable("hipFFT", _CLASSES, (), lambda code: "")


def check_hipfft(result: tuple, function: str, detail: str = "") -> Any:
    """Raise for a failing hipfftResult; return the call's value(s) (hip-python returns ``(status, values...)``)."""
    return check(HIPFFT, result, function, detail)


class Hipfft(FftBackend):
    """The FFT ``LibraryBackend`` of a HIP device: a hipFFT plan per (routine, constants)."""

    def __init__(self, hipfft: Any, api: Any = None) -> None:
        super().__init__(api)
        self.hipfft = hipfft
        version = int(self.call(hipfft.hipfftGetVersion))  # (the backend's: rocFFT's or cuFFT's number)
        self.name = f"hipFFT {version}"

    @staticmethod
    def call(function: Callable[..., tuple], *args: Any) -> Any:
        return check_hipfft(function(*args), function.__name__)

    def make(self, fft: Fft, shape: FftShape) -> tuple[Any, Run, int]:
        lib, call = self.hipfft, self.call
        rank, n, inembed, istride, idist, onembed, ostride, odist, type_name, batch = plan_arguments(fft, shape)
        handle = call(lib.hipfftCreate)
        arrays = [np.array(v, np.int64) for v in (n, inembed, onembed)]  # long long * (hip-python takes buffers)
        try:
            call(lib.hipfftSetAutoAllocation, handle, 0)  # the call's workspace, never hipFFT's own allocation
            work_size = int(call(lib.hipfftMakePlanMany64, handle, rank, arrays[0], arrays[1], istride, idist,
                                 arrays[2], ostride, odist, getattr(lib.hipfftType, f"HIPFFT_{type_name}"), batch))
        except BaseException:
            lib.hipfftDestroy(handle)  # (on the way out of a failure: its status is not checked)
            raise
        name, directed = EXECS[type_name]
        execute = getattr(lib, name)
        direction = DIRECTIONS[fft.direction]
        if directed:
            def run(plan: Any, source: int, result: int) -> None:
                call(execute, plan, source, result, direction)
        else:
            def run(plan: Any, source: int, result: int) -> None:
                call(execute, plan, source, result)
        return handle, run, work_size

    def bind(self, handle: Any, stream: Any, work_area: int) -> None:
        self.call(self.hipfft.hipfftSetStream, handle, int(stream))
        self.call(self.hipfft.hipfftSetWorkArea, handle, work_area)


#: hipFFT's backend of each HIP device (its plans are the device's).
LIBRARY = VendorLibrary("hip", "hipFFT", "FFT routines are refused (rt.fft raises UnimplementedError); "
                        f"{install_hint('hip')} (hip-python's library bindings) and install ROCm's hipFFT "
                        "(libhipfft.so on the loader's path) for FFTs")


def _bindings() -> Any:
    from hip import hipfft

    return hipfft


def load(ordinal: int, api: Any = None) -> DeferredBackend | None:
    """The hipFFT backend of HIP device ``ordinal`` (``api``: the shim that copies c2r inputs), loaded
    at its first use; None when hip-python's hipFFT bindings are missing (the reason logged once)."""
    return LIBRARY.load(ordinal, _bindings, lambda hipfft: Hipfft(hipfft, api))
