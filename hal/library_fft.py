"""The FFT routine: batched 1-, 2- and 3-D discrete Fourier transforms recorded like a kernel.

``hal.Fft`` is a library routine (``hal.library``): a ``library`` executable's export that a
command buffer dispatches with its shape and layout as constants::

    exe = dev.load_executable(hal.library_spec({"fft": hal.Fft("c2c", "forward", "complex64")}))
    with cb.record():
        cb.dispatch(exe, "fft", constants=hal.Fft.constants_for((64, 64), batch=8), bindings=[out, x])

The CUDA driver runs it with cuFFT, the HIP driver with hipFFT, the CPU drivers and the simulated
GPU with the numpy reference here (numpy's pocketfft), which the conformance suite checks every
driver against.

What a dispatch computes (the vendors' definition, no normalization in either direction):

- ``c2c`` forward: ``X[k] = sum_j x[j] exp(-2 pi i j.k / n)`` over the transformed dims; inverse:
  the same with ``+2 pi i`` (numpy's ``ifftn`` times the number of points).
- ``r2c`` (always forward): the first ``n[-1] // 2 + 1`` entries along the last transformed dim of
  the forward transform of real data (the others are their conjugates).
- ``c2r`` (always inverse): the real inverse transform of the half spectrum ``r2c`` makes, the
  imaginary parts that a Hermitian spectrum cannot have (the zero and Nyquist frequencies of the
  last dim) ignored, as numpy's ``irfftn`` (times the number of points) does. The input is never
  modified (cuFFT's C2R overwrites its input: the CUDA driver transforms a copy).

Layout (cuFFT's "advanced data layout", in elements of each side's own type): transform ``b`` of
the batch has its element ``(x0, x1, x2)`` at ``b * dist + ((x0 * embed1 + x1) * embed2 + x2) *
stride`` (rank 2: ``b * dist + (x0 * embed1 + x1) * stride``; rank 1: ``b * dist + x0 * stride``).
The logical lengths ``n`` are those of the complex data for ``c2c`` and of the real data for
``r2c``/``c2r``; the complex side of those has ``n[-1] // 2 + 1`` entries along the last dim.

Bindings: the output, then the input (they must not overlap). Constants (``Fft.constants_for``
builds them): rank (1-3), n0, n1, n2 (1 past the rank), batch, istride, idist, ostride, odist,
inembed1, inembed2, onembed1, onembed2 (1 past the rank; an embed of dim 0 is never needed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hal.errors import InvalidArgumentError
from hal.library import ROUTINES, Routine

if TYPE_CHECKING:
    from hal.command_buffer import BufferRef
    from hal.executable import NumpyKernel

#: Transform kinds: complex to complex, real to complex (forward), complex to real (inverse).
FFT_TRANSFORMS = ("c2c", "r2c", "c2r")
FFT_DIRECTIONS = ("forward", "inverse")
#: The precision of a transform by its complex dtype, and the matching real dtype.
FFT_DTYPES = {"complex64": "float32", "complex128": "float64"}
#: The most dims one dispatch transforms (cuFFT's and hipFFT's plans); more take several dispatches.
FFT_MAX_RANK = 3


@dataclasses.dataclass(frozen=True)
class FftShape:
    """The checked constants of one Fft dispatch (see the module docstring), each tuple of length 3."""

    rank: int
    n: tuple[int, int, int]
    batch: int
    istride: int
    idist: int
    ostride: int
    odist: int
    inembed: tuple[int, int]
    onembed: tuple[int, int]

    @classmethod
    def of(cls, constants: Sequence[int]) -> FftShape:
        rank, n0, n1, n2, batch, istride, idist, ostride, odist, ie1, ie2, oe1, oe2 = constants
        return cls(rank, (n0, n1, n2), batch, istride, idist, ostride, odist, (ie1, ie2), (oe1, oe2))

    @property
    def lengths(self) -> tuple[int, ...]:
        """The logical lengths of the transformed dims."""
        return self.n[:self.rank]

    @property
    def points(self) -> int:
        """Points of one transform (the inverse of numpy's normalization of a backward transform)."""
        return int(np.prod(self.lengths))


def side_lengths(transform: str, lengths: Sequence[int], side: str) -> tuple[int, ...]:
    """The lengths of the input (``side`` "in") or output ("out") data of a transform of ``lengths``."""
    lengths = tuple(lengths)
    half = lengths[:-1] + (lengths[-1] // 2 + 1,)
    if (transform, side) in (("r2c", "out"), ("c2r", "in")):
        return half
    return lengths


def _span(lengths: Sequence[int], embed: Sequence[int], stride: int) -> int:
    """Elements from the first to one past the last element of one transform: the last element is
    at ``((x0 * embed1 + x1) * embed2 + x2) * stride`` with every ``x`` its length less one."""
    last = 0
    for i, length in enumerate(lengths):
        last = last * (embed[i - 1] if i else 1) + (length - 1)
    return last * stride + 1


@dataclasses.dataclass(frozen=True)
class Fft(Routine):
    """A batched DFT of rank 1-3: ``transform`` "c2c", "r2c" or "c2r", ``direction`` "forward" or
    "inverse" (r2c is forward, c2r inverse), ``dtype`` the complex type ("complex64" or
    "complex128"; the real side of r2c/c2r is float32 or float64). See the module docstring."""

    kind: ClassVar[str] = "fft"
    CONSTANTS: ClassVar[int] = 13

    transform: str = "c2c"
    direction: str = "forward"
    dtype: str = "complex64"

    def __post_init__(self) -> None:
        if self.transform not in FFT_TRANSFORMS:
            raise InvalidArgumentError(f"Fft transform must be one of {FFT_TRANSFORMS}, got {self.transform!r}")
        if self.direction not in FFT_DIRECTIONS:
            raise InvalidArgumentError(f"Fft direction must be one of {FFT_DIRECTIONS}, got {self.direction!r}")
        if self.dtype not in FFT_DTYPES:
            raise InvalidArgumentError(f"Fft dtype must be one of {sorted(FFT_DTYPES)}, got {self.dtype!r}")
        wanted = {"r2c": "forward", "c2r": "inverse"}.get(self.transform)
        if wanted is not None and self.direction != wanted:
            raise InvalidArgumentError(f"an {self.transform} Fft is {wanted}, not {self.direction}")

    @property
    def bindings(self) -> int:
        return 2

    @property
    def constants(self) -> int:
        return self.CONSTANTS

    @property
    def input_dtype(self) -> str:
        return FFT_DTYPES[self.dtype] if self.transform == "r2c" else self.dtype

    @property
    def output_dtype(self) -> str:
        return FFT_DTYPES[self.dtype] if self.transform == "c2r" else self.dtype

    @staticmethod
    def constants_for(lengths: Sequence[int], batch: int = 1, *, transform: str = "c2c", istride: int = 1,
                      idist: int | None = None, ostride: int = 1, odist: int | None = None,
                      inembed: Sequence[int] | None = None, onembed: Sequence[int] | None = None) -> list[int]:
        """The dispatch constants of a transform of ``lengths`` (1-3 dims). ``inembed``/``onembed`` are
        cuFFT's (one entry a dim, the first unused), by default each side's own lengths (packed);
        distances default to the size of an embedded transform times its stride."""
        lengths = [int(n) for n in lengths]
        if not 1 <= len(lengths) <= FFT_MAX_RANK:
            raise InvalidArgumentError(f"an Fft transforms 1 to {FFT_MAX_RANK} dims, not {len(lengths)}")
        rank = len(lengths)
        sides = []
        for side, stride, dist, embed in (("in", istride, idist, inembed), ("out", ostride, odist, onembed)):
            own = side_lengths(transform, lengths, side)
            inner = own[1:] if embed is None else tuple(int(e) for e in embed)[1:]
            if dist is None:
                dist = int(np.prod((own[0], *inner))) * stride
            sides.append((stride, dist, [*inner, 1, 1][:2]))
        (istride, idist, ie), (ostride, odist, oe) = sides
        return [rank, *lengths, *[1] * (FFT_MAX_RANK - rank), batch, istride, idist, ostride, odist, *ie, *oe]

    def check(self, constants: tuple[int, ...], bindings: Sequence[BufferRef]) -> FftShape:
        shape = self.shape_of(constants)
        self.check_lengths(shape, [ref.length if ref.buffer is not None else None for ref in bindings])
        return shape

    def shape_of(self, constants: Sequence[int]) -> FftShape:
        """The checked shape of a dispatch's constants."""
        s = FftShape.of(constants)
        if not 1 <= s.rank <= FFT_MAX_RANK:
            raise InvalidArgumentError(f"Fft rank must be 1 to {FFT_MAX_RANK}, got {s.rank}")
        if any(n < 1 for n in s.lengths) or any(n != 1 for n in s.n[s.rank:]):
            raise InvalidArgumentError(
                f"Fft lengths must be >= 1 for the {s.rank} transformed dims and 1 past them, got {list(s.n)}")
        if s.istride < 1 or s.ostride < 1:
            raise InvalidArgumentError(f"Fft strides must be >= 1, got {s.istride} and {s.ostride}")
        for side, embed in (("in", s.inembed), ("out", s.onembed)):
            own = side_lengths(self.transform, s.lengths, side)
            used = embed[:s.rank - 1]
            if any(e < length for e, length in zip(used, own[1:])):
                raise InvalidArgumentError(
                    f"Fft {side}put embed {list(used)} is smaller than its transform's {list(own)}")
        if s.batch > 1:
            span = self._span(s, "out")
            if s.odist < span and s.ostride < s.odist * s.batch or s.odist < 1:
                raise InvalidArgumentError(
                    f"Fft output distance {s.odist} and stride {s.ostride} make its {s.batch} transforms overlap")
        return s

    def _span(self, s: FftShape, side: str) -> int:
        own = side_lengths(self.transform, s.lengths, side)
        embed = s.inembed if side == "in" else s.onembed
        return _span(own, embed[:s.rank - 1], s.istride if side == "in" else s.ostride)

    def extents(self, s: FftShape) -> tuple[int, int]:
        """Elements (of each side's type) the output and the input span from their first element."""
        if s.batch == 0:
            return 0, 0
        return ((s.batch - 1) * s.odist + self._span(s, "out"), (s.batch - 1) * s.idist + self._span(s, "in"))

    def check_lengths(self, shape: FftShape, lengths: Sequence[int | None]) -> None:  # type: ignore[override]
        out, inp = self.extents(shape)
        needed = [("output", out * np.dtype(self.output_dtype).itemsize),
                  ("input", inp * np.dtype(self.input_dtype).itemsize)]
        for (name, nbytes), length in zip(needed, lengths):
            if length is not None and length < nbytes:
                raise InvalidArgumentError(
                    f"Fft {name} range of {length} bytes is too short: {shape.batch} {self.transform} transforms of "
                    f"{list(shape.lengths)} {self.dtype} need {nbytes} bytes")

    def is_empty(self, checked: object) -> bool:
        shape: FftShape = checked  # type: ignore[assignment]
        return shape.batch == 0

    def reference(self) -> NumpyKernel:
        def fft(workgroups, bindings, constants) -> None:
            run_fft_reference(self, bindings, constants)

        return fft


def _transforms(view: memoryview, dtype: str, s: FftShape, lengths: tuple[int, ...], stride: int, dist: int,
                embed: tuple[int, int], writable: bool = False) -> np.ndarray:
    """A (batch, *lengths) strided view of a binding in the Fft layout."""
    item = np.dtype(dtype).itemsize
    raw = np.frombuffer(view, dtype=np.uint8)
    elements = raw[:len(raw) - len(raw) % item].view(dtype)
    e1, e2 = embed
    inner = {1: (stride,), 2: (stride * e1, stride), 3: (stride * e1 * e2, stride * e2, stride)}[s.rank]
    strides = tuple(v * item for v in (dist, *inner))
    return np.lib.stride_tricks.as_strided(elements, (s.batch, *lengths), strides, writeable=writable)


def run_fft_reference(fft: Fft, bindings: Sequence[memoryview], constants: Sequence[int]) -> None:
    """Compute an Fft dispatch with numpy's pocketfft (in the routine's precision)."""
    s = FftShape.of(constants)
    if s.batch == 0:
        return
    lengths = s.lengths
    x = _transforms(bindings[1], fft.input_dtype, s, side_lengths(fft.transform, lengths, "in"), s.istride, s.idist,
                    s.inembed)
    axes = tuple(range(1, s.rank + 1))
    with np.errstate(all="ignore"):
        if fft.transform == "c2c" and fft.direction == "forward":
            y = np.fft.fftn(x, axes=axes)
        elif fft.transform == "c2c":
            y = np.fft.ifftn(x, axes=axes, norm="forward")  # (no 1/n: the vendors' unnormalized inverse)
        elif fft.transform == "r2c":
            y = np.fft.rfftn(x, axes=axes)
        else:
            y = np.fft.irfftn(x, s=lengths, axes=axes, norm="forward")
    out = _transforms(bindings[0], fft.output_dtype, s, side_lengths(fft.transform, lengths, "out"), s.ostride,
                      s.odist, s.onembed, writable=True)
    out[...] = y.astype(out.dtype, copy=False)


ROUTINES["fft"] = Fft
