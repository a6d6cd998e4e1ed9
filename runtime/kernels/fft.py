"""FFT nodes as ``hal.Fft`` library dispatches: cuFFT on CUDA, hipFFT on HIP, the routine's numpy
reference (pocketfft) on the CPU drivers.

An ``fft`` node (``runtime/fft.py`` builds them) transforms up to three axes of a dense root
without normalization; its params are (transform, direction, axes), the axes in the order the
transform takes them (the halved axis of r2c/c2r last). The runtime arranges its input so that one
dispatch covers it (``layout``): the transformed axes are either the trailing ones (a batch of
packed transforms) or one block followed by untransformed axes with nothing before it (strided
transforms interleaved along the trailing axes, cuFFT's ``stride``/``dist = 1`` layout).
"""

from __future__ import annotations

import hal
from hal.library_fft import FFT_MAX_RANK

from ..shapes import size_of
from .source import source


class FftSource:
    """A ``hal.Fft`` routine as the lowering's kernel source: a ``library`` executable of one export."""

    __slots__ = ("key", "routine", "export")

    def __init__(self, routine: hal.Fft) -> None:
        self.routine = routine
        self.key = ("library", routine)
        self.export = "fft"

    def specs(self, formats: tuple) -> list:
        return [hal.library_spec({self.export: self.routine})]

    def numpy_code(self) -> dict:
        return {self.export: self.routine.reference()}


def fft_source(transform: str, direction: str, dtype_name: str) -> FftSource:
    """The source of the routine; ``dtype_name`` is the transform's complex dtype."""
    return source(("fft", transform, direction, dtype_name),
                  lambda: FftSource(hal.Fft(transform, direction, dtype_name)))


def layout(shape: tuple, axes: tuple) -> tuple[int, int, int] | None:
    """(batch, stride, dist) of one dispatch transforming ``axes`` of a dense array of ``shape``, or
    None when no single dispatch does (the caller moves the axes to the end first)."""
    nd = len(shape)
    if not 1 <= len(axes) <= FFT_MAX_RANK or list(axes) != list(range(axes[0], axes[0] + len(axes))):
        return None
    first, last = axes[0], axes[-1]
    if last == nd - 1:  # a batch of packed transforms
        return size_of(shape[:first]), 1, 0
    if size_of(shape[:first]) == 1:  # one block, then untransformed axes: transforms interleaved
        inner = size_of(shape[last + 1:])
        return inner, inner, 1
    return None


def constants(transform: str, in_shape: tuple, out_shape: tuple, axes: tuple) -> list[int] | None:
    """The dispatch constants of an fft node (None: its layout takes more than one dispatch)."""
    found = layout(in_shape, axes)
    if found is None:
        return None
    batch, stride, dist = found
    logical = tuple((out_shape if transform == "c2r" else in_shape)[a] for a in axes)
    in_len = tuple(in_shape[a] for a in axes)
    out_len = tuple(out_shape[a] for a in axes)
    idist = dist if dist else size_of(in_len)
    odist = dist if dist else size_of(out_len)
    return hal.Fft.constants_for(logical, batch, transform=transform, istride=stride, idist=idist, ostride=stride,
                                 odist=odist, inembed=in_len, onembed=out_len)


def plan(node, layouts: list, ctx) -> list:
    transform, direction, axes = node.params
    if size_of(node.shape) == 0:
        return []
    (in_shape, _, _), = layouts
    consts = constants(transform, in_shape, node.shape, axes)
    if consts is None:  # (runtime/fft.py arranges every node it builds)
        raise hal.InternalError(f"fft node over axes {axes} of {in_shape} takes more than one dispatch")
    dt = node.dtype if node.dtype.is_complex else node.inputs[0].dtype
    src = fft_source(transform, direction, dt.name)
    return [("dispatch", src, src.export, (1, 1, 1), consts, [("out",), ("in", 0)])]
