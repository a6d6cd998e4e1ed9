"""FFT planning shared by the GPU FFT backends (cuFFT for CUDA, hipFFT for HIP).

``FftBackend`` is the "fft" ``LibraryBackend`` of both drivers: it caches one plan per (routine,
constants) (a plan does not depend on the operand addresses) and runs each call under its lock,
since a plan holds one stream and one work area at a time: the vendor subclass sets both, then
calls the library's typed exec function. A vendor subclass makes the plans (``make``: the library's
``PlanMany64`` in the routine's layout, with automatic work-area allocation off) and runs nothing
else. Plans are kept for the life of the process: a graph captured with a call reads the plan's
twiddle factors.

Both libraries' complex-to-real transforms overwrite their input, which ``hal.Fft`` promises to
leave as it was: a c2r call first copies its input into the front of its workspace (a device copy
on the same stream, captured with the call) and transforms the copy; the library's work area
follows, aligned to ``WORK_ALIGN``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from hal.library import Routine
from hal.library_fft import Fft, FftShape, side_lengths

#: Alignment of the work area behind a c2r call's input copy in its workspace.
WORK_ALIGN = 256
ITEMSIZE = {"float32": 4, "float64": 8, "complex64": 8, "complex128": 16}
#: The vendors' transform types by (transform, complex dtype): C2C/Z2Z, R2C/D2Z, C2R/Z2D.
TYPES = {("c2c", "complex64"): "C2C", ("c2c", "complex128"): "Z2Z", ("r2c", "complex64"): "R2C",
         ("r2c", "complex128"): "D2Z", ("c2r", "complex64"): "C2R", ("c2r", "complex128"): "Z2D"}
#: The FORWARD and INVERSE (BACKWARD) direction arguments of both libraries.
DIRECTIONS = {"forward": -1, "inverse": 1}

#: ``run(handle, input, output)``: the typed exec call of a plan.
Run = Callable[[Any, int, int], None]


def plan_arguments(fft: Fft, shape: FftShape) -> tuple:
    """``PlanMany64``'s arguments after the handle: rank, n, inembed, istride, idist, onembed,
    ostride, odist, the transform type's name (``TYPES``), batch. The embeds' first entries, which
    the libraries ignore, are each side's first length."""
    rank = shape.rank
    first_in, *_ = side_lengths(fft.transform, shape.lengths, "in")
    first_out, *_ = side_lengths(fft.transform, shape.lengths, "out")
    inembed = [first_in, *shape.inembed[:rank - 1]]
    onembed = [first_out, *shape.onembed[:rank - 1]]
    return (rank, list(shape.lengths), inembed, shape.istride, shape.idist, onembed, shape.ostride, shape.odist,
            TYPES[fft.transform, fft.dtype], shape.batch)


class FftPlan:
    """A plan: its handle, its call, and the workspace it needs (a c2r call's input copy first)."""

    __slots__ = ("handle", "run", "workspace_size", "copy_bytes", "copy_offset", "owned")

    def __init__(self, handle: Any, run: Run, work_size: int, copy_bytes: int, owned: Any = None) -> None:
        self.handle = handle
        self.run = run
        self.copy_bytes = copy_bytes
        self.copy_offset = -(-copy_bytes // WORK_ALIGN) * WORK_ALIGN if copy_bytes else 0
        self.workspace_size = self.copy_offset + work_size
        self.owned = owned  # what the plan's calls read (kept alive with it)


class FftBackend:
    """The plan cache and the calls of a vendor FFT library (see the module docstring)."""

    name = "FFT library"

    def __init__(self, api: Any = None) -> None:
        #: The device API (``GpuApi``) that copies a c2r call's input on its stream.
        self.api = api
        self._plans: dict[tuple, FftPlan] = {}
        self.lock = threading.Lock()

    def supports(self, routine: Routine) -> str | None:
        if not isinstance(routine, Fft):
            return f"{type(routine).__name__} is not a routine of {self.name}"
        return None

    def make(self, fft: Fft, shape: FftShape) -> tuple[Any, Run, int]:
        """(handle, run, work-area bytes) of a new plan (the lock is held)."""
        raise NotImplementedError

    def bind(self, handle: Any, stream: Any, work_area: int) -> None:
        """Set the plan's stream and work area for the call about to run (the lock is held)."""
        raise NotImplementedError

    # -- LibraryBackend ------------------------------------------------------------------------
    def capturable(self, routine: Routine, checked: Any) -> bool:
        return True  # (cuFFT and hipFFT plans run asynchronously)

    def serial_key(self, routine: Routine, checked: Any) -> Hashable:
        return self  # (a plan executed on two streams at once is not promised to work)

    def plan(self, fft: Fft, shape: FftShape, pointers: Sequence[int]) -> FftPlan:
        """The plan of the transform (the same for any operand addresses), made once."""
        key = (fft, shape)
        plan = self._plans.get(key)
        if plan is None:
            with self.lock:
                plan = self._plans.get(key)
                if plan is None:
                    handle, run, work_size = self.make(fft, shape)
                    copy_bytes = 0
                    if fft.transform == "c2r":  # its input is overwritten: a copy goes first in the workspace
                        copy_bytes = fft.extents(shape)[1] * ITEMSIZE[fft.input_dtype]
                    plan = self._plans[key] = FftPlan(handle, run, work_size, copy_bytes)
        return plan

    def enqueue(self, plan: FftPlan, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        output, source = pointers[0], pointers[1]
        with self.lock:
            if plan.copy_bytes:
                self.api.memcpy_dtod_async(workspace, source, plan.copy_bytes, stream)
                source = workspace
            self.bind(plan.handle, stream, workspace + plan.copy_offset if workspace else 0)
            plan.run(plan.handle, source, output)
