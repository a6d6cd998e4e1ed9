"""cuFFT behind the CUDA driver's FFT routines (``hal.Fft``), through nvmath-python's bindings.

``load()`` gives the backend (``hal.drivers.gpu.library.LibraryBackend`` of the "fft" kind) when
nvmath-python's cuFFT bindings import; the library itself (the ``nvidia-cufft`` wheel) is loaded at
the first FFT routine, and a failure then refuses every FFT routine with the reason, logged once
(the runtime's ``rt.fft`` raises ``UnimplementedError`` naming cuFFT when the op is built).

The plan cache, the locking and the c2r input copy are the GPU drivers' (``hal/drivers/gpu/fft.py``);
this module makes cuFFT's plans: ``cufftMakePlanMany64`` in the routine's layout (cuFFT's advanced
data layout is the routine's constants) with automatic work-area allocation off, so every call
gets the ``LibraryCall``'s workspace (``cufftSetWorkArea``) and the queue's or the capture's stream
(``cufftSetStream``) right before the typed exec call (``cufftExecC2C``/``Z2Z``/``R2C``/``D2Z``/
``C2R``/``Z2D``). A captured call therefore holds no memory node.
"""

from __future__ import annotations

from typing import Any

from hal.distribution import install_hint
from hal.drivers.gpu.fft import DIRECTIONS, FftBackend, Run, plan_arguments
from hal.drivers.gpu.library import DeferredBackend, VendorLibrary
from hal.library_fft import Fft, FftShape

#: The exec function of each cufftType (nvmath's names of cufftExec*), and whether it takes a direction.
EXECS = {"C2C": ("exec_c2c", True), "Z2Z": ("exec_z2z", True), "R2C": ("exec_r2c", False),
         "D2Z": ("exec_d2z", False), "C2R": ("exec_c2r", False), "Z2D": ("exec_z2d", False)}


class Cufft(FftBackend):
    """The FFT ``LibraryBackend`` of a CUDA device: a cuFFT plan per (routine, constants)."""

    def __init__(self, cufft: Any, api: Any = None) -> None:
        super().__init__(api)
        self.cufft = cufft
        version = int(cufft.get_version())  # CUFFT_VERSION: major * 1000 + minor * 100 + patch
        self.name = f"cuFFT {version // 1000}.{version // 100 % 10}.{version % 100}"

    def make(self, fft: Fft, shape: FftShape) -> tuple[Any, Run, int]:
        cufft = self.cufft
        rank, n, inembed, istride, idist, onembed, ostride, odist, type_name, batch = plan_arguments(fft, shape)
        handle = cufft.create()
        try:
            cufft.set_auto_allocation(handle, 0)  # the call's workspace, never cuFFT's own allocation
            work_size = int(cufft.make_plan_many64(handle, rank, n, inembed, istride, idist, onembed, ostride,
                                                   odist, int(getattr(cufft.Type, type_name)), batch))
        except BaseException:
            cufft.destroy(handle)
            raise
        name, directed = EXECS[type_name]
        execute = getattr(cufft, name)
        direction = DIRECTIONS[fft.direction]
        if directed:
            def run(plan: Any, source: int, result: int) -> None:
                execute(plan, source, result, direction)
        else:
            def run(plan: Any, source: int, result: int) -> None:
                execute(plan, source, result)
        return handle, run, work_size

    def bind(self, handle: Any, stream: Any, work_area: int) -> None:
        self.cufft.set_stream(handle, int(stream))
        self.cufft.set_work_area(handle, work_area)


#: cuFFT's backend of each CUDA device (its plans are the device's).
LIBRARY = VendorLibrary("cuda", "cuFFT", "FFT routines are refused (rt.fft raises UnimplementedError); "
                        f"{install_hint('cuda')} (nvmath-python and nvidia-cufft) for FFTs")


def _bindings() -> Any:
    from nvmath.bindings import cufft

    return cufft


def load(ordinal: int, api: Any = None) -> DeferredBackend | None:
    """The cuFFT backend of CUDA device ``ordinal`` (``api``: the shim that copies c2r inputs),
    loaded at its first use; None when nvmath-python's cuFFT bindings are missing (the reason
    logged once per process)."""
    return LIBRARY.load(ordinal, _bindings, lambda cufft: Cufft(cufft, api))
