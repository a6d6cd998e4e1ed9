"""cuFFT behind the CUDA driver's FFT routines (``hal.Fft``), through nvmath-python's bindings.

``load()`` gives the backend (``hal.drivers.gpu.library.LibraryBackend`` of the "fft" kind) when
nvmath-python's cuFFT bindings import; the library itself (the ``nvidia-cufft`` wheel) is loaded at
the first FFT routine, and a failure then refuses every FFT routine with the reason, logged once
(the runtime's ``rt.fft`` raises ``UnimplementedError`` naming cuFFT when the op is built).

A plan is made once per (routine, constants) with ``cufftMakePlanMany64`` in the routine's layout
(cuFFT's advanced data layout is the routine's constants), with automatic work-area allocation off:
every call gets the ``LibraryCall``'s workspace (``cufftSetWorkArea``) and the queue's or the
capture's stream (``cufftSetStream``) right before the typed exec call, under the backend's lock
(a plan holds one stream and one work area at a time). A captured call therefore holds no memory
node. Plans are kept for the life of the process: a captured graph's kernels read the plan's
twiddle factors.

cuFFT's complex-to-real transforms overwrite their input; ``hal.Fft`` promises it is left as it
was, so a c2r call first copies its input into the front of its workspace (a device copy on the
same stream, captured with the call) and transforms the copy.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from hal.distribution import install_hint
from hal.errors import UnavailableError
from hal.library import Routine
from hal.library_fft import Fft, FftShape, side_lengths
from hal.log import driver_logger

#: cufftType members by (transform, complex dtype).
TYPES = {("c2c", "complex64"): "C2C", ("c2c", "complex128"): "Z2Z", ("r2c", "complex64"): "R2C",
         ("r2c", "complex128"): "D2Z", ("c2r", "complex64"): "C2R", ("c2r", "complex128"): "Z2D"}
#: The exec function of each cufftType (nvmath's names of cufftExec*), and whether it takes a direction.
EXECS = {"C2C": ("exec_c2c", True), "Z2Z": ("exec_z2z", True), "R2C": ("exec_r2c", False),
         "D2Z": ("exec_d2z", False), "C2R": ("exec_c2r", False), "Z2D": ("exec_z2d", False)}
#: CUFFT_FORWARD and CUFFT_INVERSE.
DIRECTIONS = {"forward": -1, "inverse": 1}
#: Alignment of the work area behind a c2r call's input copy in its workspace.
WORK_ALIGN = 256
ITEMSIZE = {"float32": 4, "float64": 8, "complex64": 8, "complex128": 16}


def plan_arguments(fft: Fft, shape: FftShape) -> tuple:
    """``cufftMakePlanMany64``'s arguments after the handle: rank, n, inembed, istride, idist,
    onembed, ostride, odist, the cufftType's name, batch (the embeds' first entries are each side's
    first length, which cuFFT ignores)."""
    rank = shape.rank
    inembed = [side_lengths(fft.transform, shape.lengths, "in")[0], *shape.inembed[:rank - 1]]
    onembed = [side_lengths(fft.transform, shape.lengths, "out")[0], *shape.onembed[:rank - 1]]
    return (rank, list(shape.lengths), inembed, shape.istride, shape.idist, onembed, shape.ostride, shape.odist,
            TYPES[fft.transform, fft.dtype], shape.batch)


class FftPlan:
    """A cuFFT plan: its handle, its call, and the workspace it needs (the input copy of c2r first)."""

    __slots__ = ("handle", "run", "workspace_size", "copy_bytes", "copy_offset")

    def __init__(self, handle: Any, run: Any, work_size: int, copy_bytes: int) -> None:
        self.handle = handle
        self.run = run  # run(handle, input, output)
        self.copy_bytes = copy_bytes
        self.copy_offset = -(-copy_bytes // WORK_ALIGN) * WORK_ALIGN if copy_bytes else 0
        self.workspace_size = self.copy_offset + work_size


class Cufft:
    """The FFT ``LibraryBackend`` of a CUDA device: a cuFFT plan per (routine, constants)."""

    def __init__(self, cufft: Any, api: Any = None) -> None:
        self.cufft = cufft
        #: The device API (``GpuApi``) that copies a c2r call's input on its stream.
        self.api = api
        version = int(cufft.get_version())  # CUFFT_VERSION: major * 1000 + minor * 100 + patch
        self.name = f"cuFFT {version // 1000}.{version // 100 % 10}.{version % 100}"
        self._plans: dict[tuple, FftPlan] = {}
        #: Held while a plan is made and while one runs (a plan's stream and work area are per call).
        self.lock = threading.Lock()

    def supports(self, routine: Routine) -> str | None:
        if not isinstance(routine, Fft):
            return f"{type(routine).__name__} is not a routine of {self.name}"
        return None

    def plan(self, fft: Fft, shape: FftShape, pointers: Sequence[int]) -> FftPlan:
        """The plan of the transform (the same for any operand addresses)."""
        key = (fft, shape)
        plan = self._plans.get(key)
        if plan is None:
            with self.lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = self._plans[key] = self._make(fft, shape)
        return plan

    def _make(self, fft: Fft, shape: FftShape) -> FftPlan:
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
        copy_bytes = 0
        if fft.transform == "c2r":  # its input is overwritten: a copy of it goes first in the workspace
            copy_bytes = fft.extents(shape)[1] * ITEMSIZE[fft.input_dtype]
        return FftPlan(handle, run, work_size, copy_bytes)

    def enqueue(self, plan: FftPlan, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        cufft = self.cufft
        output, source = pointers[0], pointers[1]
        with self.lock:
            if plan.copy_bytes:
                self.api.memcpy_dtod_async(workspace, source, plan.copy_bytes, stream)
                source = workspace
            cufft.set_stream(plan.handle, int(stream))
            cufft.set_work_area(plan.handle, workspace + plan.copy_offset if workspace else 0)
            plan.run(plan.handle, source, output)


class DeferredCufft:
    """The device's FFT backend until its first FFT routine: cuFFT and the CUDA runtime it starts are
    loaded then, not when the device is created. A library that fails to load makes every FFT
    routine refused with the reason (``supports``)."""

    def __init__(self, ordinal: int, api: Any, cufft: Any) -> None:
        self._ordinal, self._api, self._cufft = ordinal, api, cufft
        self._backend: Cufft | None = None
        self._failure: str | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._backend.name if self._backend is not None else "cuFFT"

    def backend(self) -> Cufft:
        if self._backend is None:
            with self._lock:
                if self._backend is None and self._failure is None:
                    try:
                        self._backend = Cufft(self._cufft, self._api)
                    except Exception as exc:  # a missing libcufft, no CUDA driver
                        self._failure = f"{type(exc).__name__}: {exc}"
                        _report(exc)
        if self._backend is None:
            raise UnavailableError(f"cuFFT could not be loaded: {self._failure}")
        return self._backend

    def supports(self, routine: Any) -> str | None:
        try:
            return self.backend().supports(routine)
        except UnavailableError as exc:
            return str(exc)

    def plan(self, routine: Any, checked: Any, pointers: Any) -> FftPlan:
        return self.backend().plan(routine, checked, pointers)

    def enqueue(self, *args: Any) -> None:
        self.backend().enqueue(*args)


#: One backend per device ordinal (its plans are the device's).
_backends: dict[int, DeferredCufft] = {}
_reported: list[BaseException] = []
_lock = threading.Lock()


def _report(exc: BaseException) -> None:
    """Log once per process why FFTs are unavailable."""
    if not _reported:
        _reported.append(exc)
        driver_logger("cuda").warning(
            "cuFFT is unavailable (%s: %s): FFT routines are refused (rt.fft raises UnimplementedError); "
            "%s (nvmath-python and nvidia-cufft) for FFTs", type(exc).__name__, exc, install_hint("cuda"))


def load(ordinal: int, api: Any = None) -> DeferredCufft | None:
    """The cuFFT backend of CUDA device ``ordinal`` (``api``: the shim that copies c2r inputs),
    loaded at its first use; None when nvmath-python's cuFFT bindings are missing (the reason
    logged once per process)."""
    with _lock:
        backend = _backends.get(ordinal)
        if backend is not None:
            return backend
        try:
            from nvmath.bindings import cufft
        except Exception as exc:  # not installed, or its bindings fail to import
            _report(exc)
            return None
        backend = _backends[ordinal] = DeferredCufft(ordinal, api, cufft)
        return backend
