"""Library routines: vendor-library calls (a GEMM) recorded into command buffers like kernels.

A ``library`` executable's exports are routines instead of kernels::

    exe = dev.load_executable(hal.library_spec({"mm": hal.Gemm("float32")}))
    with cb.record():
        cb.dispatch(exe, "mm", constants=hal.Gemm.constants_for(m, n, k), bindings=[c, a, b])

Each driver runs a routine its own way: the CUDA driver through cuBLASLt (on the queue's stream
in stream command buffers, captured into a child-graph node in graph command buffers), the HIP
driver through hipBLASLt, the CPU drivers and the simulated GPU with the numpy reference defined
here (``Routine.reference``), which is also what the conformance suite checks every driver against.
A device that cannot run routines does not list the ``library`` format (``Device.can_prepare``).

A routine's shape and layout are dispatch constants (uint32, in elements), so one executable serves
every shape; a driver plans the library call once per (shape, dtype, layout, alignment) and caches it.
The routine checks its constants and the byte ranges of its direct bindings when the dispatch is
recorded (``Routine.check``), before any device work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from hal.errors import InvalidArgumentError

if TYPE_CHECKING:
    from hal.command_buffer import BufferRef
    from hal.executable import ExecutableSpec, NumpyKernel

#: The element types routines take, and their sizes in bytes.
DTYPE_SIZES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16}
#: The complex ones (pairs of float32 / float64, real part first): Gemms of them take no epilogue.
COMPLEX_DTYPES = frozenset({"complex64", "complex128"})


class Routine:
    """A library routine an export stands for: how many bindings and constants it takes, the
    checks of a dispatch, and the numpy reference of what it computes."""

    kind: ClassVar[str] = ""

    @property
    def bindings(self) -> int:
        raise NotImplementedError

    @property
    def constants(self) -> int:
        raise NotImplementedError

    def check(self, constants: tuple[int, ...], bindings: Sequence[BufferRef]) -> object:
        """Raise InvalidArgumentError for constants that describe no valid call, or a direct
        binding range too short for them; returns what ``check_lengths`` takes to check the
        ranges of binding-table slots at submission."""
        return None

    def check_lengths(self, checked: object, lengths: Sequence[int | None]) -> None:
        """Raise InvalidArgumentError when a binding range (bytes; None: not known yet) is too short
        for the call ``check`` returned ``checked`` for."""

    def is_empty(self, checked: object) -> bool:
        """Whether the call ``check`` returned ``checked`` for writes nothing (a zero-size problem)."""
        return False

    def reference(self) -> NumpyKernel:
        """``fn(workgroups, bindings, constants)`` computing the routine with numpy."""
        raise NotImplementedError


#: Gemm's epilogues (cuBLASLt's, named for a row-major product): what is applied to the product
#: before it is stored, and what else the dispatch writes.
#:
#: - forward: ``bias`` adds a vector of n elements to every row; ``relu`` / ``gelu`` (GELU in its
#:   tanh form) follow it. The ``*_aux`` forms also write what the backward pass needs (the aux
#:   binding): ``relu_aux`` the mask ``pre >= 0`` as bits (``relu_mask_bytes``), ``gelu_aux`` the
#:   pre-activation itself (C's shape and ``ldc``).
#: - backward: ``drelu`` / ``dgelu`` multiply the product by the activation's derivative read from
#:   a forward pass's aux binding; ``*_bgrad`` also write the bias gradient (the column sums of
#:   the result, n elements) to the bias binding. ``bgrad_b`` writes the plain product and the sums
#:   of B over k (a layer's bias gradient beside its weight gradient ``x^T @ dy``).
#:
#: ReLU's mask is ``pre >= 0`` (its derivative at 0 is 1, as the runtime's ``maximum(x, 0)``
#: defines it), the convention cuBLASLt follows.
GEMM_EPILOGUES = ("none", "bias", "relu", "bias_relu", "gelu", "bias_gelu",
                  "relu_aux", "bias_relu_aux", "gelu_aux", "bias_gelu_aux",
                  "drelu", "drelu_bgrad", "dgelu", "dgelu_bgrad", "bgrad_b")
#: Bits of a ReLU mask row are padded to a multiple of this (cuBLASLt's rule for the mask's ld).
RELU_MASK_ALIGN = 128
#: float32 products: "ieee" (float32 arithmetic, numpy's and PyTorch's default) or "tf32"
#: (tensor cores with 10-bit mantissas, an explicit opt-in as torch.set_float32_matmul_precision).
GEMM_PRECISIONS = ("ieee", "tf32")
TRANSPOSE_A = 1
TRANSPOSE_B = 2


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """The constants of one Gemm dispatch, in elements (see ``Gemm``)."""

    m: int
    n: int
    k: int
    batch: int
    transpose_a: bool
    transpose_b: bool
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int

    @classmethod
    def of(cls, constants: Sequence[int]) -> GemmShape:
        m, n, k, batch, flags, lda, ldb, ldc, sa, sb, sc = constants
        return cls(m, n, k, batch, bool(flags & TRANSPOSE_A), bool(flags & TRANSPOSE_B), lda, ldb, ldc, sa, sb, sc)

    def extents(self) -> tuple[int, int, int]:
        """Elements each of A, B and C spans from its first element (0 for an empty problem)."""
        m, n, k, batch = self.m, self.n, self.k, self.batch
        a_rows, a_cols = (k, m) if self.transpose_a else (m, k)
        b_rows, b_cols = (n, k) if self.transpose_b else (k, n)

        def extent(rows: int, cols: int, ld: int, stride: int) -> int:
            if rows == 0 or cols == 0 or batch == 0:
                return 0
            return (batch - 1) * stride + (rows - 1) * ld + cols

        return (extent(a_rows, a_cols, self.lda, self.stride_a), extent(b_rows, b_cols, self.ldb, self.stride_b),
                extent(m, n, self.ldc, self.stride_c))


@dataclasses.dataclass(frozen=True)
class Gemm(Routine):
    """Batched matrix product of row-major matrices: ``C[i] = epilogue(op(A[i]) @ op(B[i]) [+ bias])``.

    Bindings: C, A, B, then the bias (``n`` elements) for the ``bias*`` epilogues. Constants
    (``Gemm.constants_for`` builds them): m, n, k, batch, flags (1: A is stored transposed, as a
    k x m row-major matrix; 2: B stored transposed, n x k), lda, ldb, ldc (row strides), and the
    batch strides of A, B and C (0 repeats one matrix for every batch entry; C's must not be 0
    when batch > 1). ``dtype`` is the element type of every operand; products accumulate in
    float32 for the 16-bit types and float32/float64 otherwise (complex64/complex128 in their own
    precision, without an epilogue: none of them is defined for complex values; neither operand
    is conjugated).
    """

    kind: ClassVar[str] = "gemm"
    CONSTANTS: ClassVar[int] = 11

    dtype: str = "float32"
    epilogue: str = "none"
    precision: str = "ieee"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_SIZES:
            raise InvalidArgumentError(f"Gemm dtype must be one of {sorted(DTYPE_SIZES)}, got {self.dtype!r}")
        if self.epilogue not in GEMM_EPILOGUES:
            raise InvalidArgumentError(f"Gemm epilogue must be one of {GEMM_EPILOGUES}, got {self.epilogue!r}")
        if self.precision not in GEMM_PRECISIONS:
            raise InvalidArgumentError(f"Gemm precision must be one of {GEMM_PRECISIONS}, got {self.precision!r}")
        if self.dtype in COMPLEX_DTYPES and self.epilogue != "none":
            raise InvalidArgumentError(f"{self.dtype} Gemms take no epilogue, not {self.epilogue!r}")
        if self.precision == "tf32" and self.dtype != "float32":
            raise InvalidArgumentError(f"tf32 precision applies to float32 products only, not {self.dtype}")

    @property
    def has_bias(self) -> bool:
        """Whether the dispatch reads a bias vector (binding 3)."""
        return self.epilogue.startswith("bias")

    @property
    def bias_gradient(self) -> bool:
        """Whether the dispatch writes a bias gradient (binding 3)."""
        return self.epilogue.endswith("bgrad") or self.epilogue == "bgrad_b"

    @property
    def activation(self) -> str:
        """The forward activation applied: "relu", "gelu" or "" (none)."""
        for name in ("relu", "gelu"):
            if name in self.epilogue and not self.epilogue.startswith("d"):
                return name
        return ""

    @property
    def derivative(self) -> str:
        """The activation whose derivative multiplies the product (backward): "relu", "gelu" or ""."""
        return self.epilogue[1:5] if self.epilogue.startswith("d") else ""

    @property
    def aux(self) -> str:
        """What the aux binding holds: "relu_mask", "gelu_input" or "" (no aux binding); written
        by the ``*_aux`` epilogues, read by ``drelu*`` / ``dgelu*``."""
        if self.epilogue.endswith("_aux") or self.derivative:
            return "relu_mask" if "relu" in self.epilogue else "gelu_input"
        return ""

    @property
    def bindings(self) -> int:
        return 3 + (self.has_bias or self.bias_gradient) + bool(self.aux)

    @staticmethod
    def relu_mask_bytes(m: int, n: int) -> int:
        """Bytes of the ReLU mask of an m x n product: m rows of n bits, each row padded to a
        multiple of ``RELU_MASK_ALIGN`` bits (the padding's value unspecified: cuBLASLt leaves it
        as it was); bit j of row i is bit ``j % 8`` of byte ``i * row_bytes + j // 8``."""
        return m * relu_mask_row_bytes(n)

    @property
    def constants(self) -> int:
        return self.CONSTANTS

    @property
    def element_size(self) -> int:
        return DTYPE_SIZES[self.dtype]

    @staticmethod
    def constants_for(m: int, n: int, k: int, batch: int = 1, *, transpose_a: bool = False,
                      transpose_b: bool = False, lda: int | None = None, ldb: int | None = None,
                      ldc: int | None = None, stride_a: int | None = None, stride_b: int | None = None,
                      stride_c: int | None = None) -> list[int]:
        """The dispatch constants of a product; leading dimensions and batch strides default to
        packed matrices."""
        lda = (m if transpose_a else k) if lda is None else lda
        ldb = (k if transpose_b else n) if ldb is None else ldb
        ldc = n if ldc is None else ldc
        stride_a = m * k if stride_a is None else stride_a
        stride_b = k * n if stride_b is None else stride_b
        stride_c = m * n if stride_c is None else stride_c
        flags = (TRANSPOSE_A if transpose_a else 0) | (TRANSPOSE_B if transpose_b else 0)
        return [m, n, k, batch, flags, lda, ldb, ldc, stride_a, stride_b, stride_c]

    def check(self, constants: tuple[int, ...], bindings: Sequence[BufferRef]) -> GemmShape:
        shape = self.shape_of(constants)
        self.check_lengths(shape, [ref.length if ref.buffer is not None else None for ref in bindings])
        return shape

    def shape_of(self, constants: Sequence[int]) -> GemmShape:
        """The checked shape of a dispatch's constants."""
        if constants[4] & ~(TRANSPOSE_A | TRANSPOSE_B):
            raise InvalidArgumentError(f"Gemm flags must be a combination of 1 and 2, got {constants[4]}")
        s = GemmShape.of(constants)
        if s.k == 0 and s.m * s.n * s.batch:
            raise InvalidArgumentError("Gemm k must be >= 1 (a product over no terms is a fill)")
        a_cols = s.m if s.transpose_a else s.k
        b_cols = s.k if s.transpose_b else s.n
        for name, ld, cols in (("lda", s.lda, a_cols), ("ldb", s.ldb, b_cols), ("ldc", s.ldc, s.n)):
            if ld < max(cols, 1):
                raise InvalidArgumentError(f"Gemm {name} {ld} is less than the {cols} columns of its matrix")
        if s.batch > 1 and s.stride_c < s.m * s.ldc - (s.ldc - s.n) and s.m * s.n:
            raise InvalidArgumentError(
                f"Gemm batch stride of C ({s.stride_c}) makes its {s.batch} matrices of {s.m}x{s.n} overlap")
        if s.batch > 1 and (self.aux or self.bias_gradient):
            raise InvalidArgumentError(f"Gemm epilogue {self.epilogue!r} takes one matrix product, not a batch "
                                       f"of {s.batch}")
        return s

    def check_lengths(self, shape: GemmShape, lengths: Sequence[int | None]) -> None:  # type: ignore[override]
        size = self.element_size
        a, b, c = shape.extents()
        empty = shape.m * shape.n * shape.batch == 0
        needed = [("C", c * size), ("A", a * size), ("B", b * size)]
        if self.has_bias or self.bias_gradient:
            needed.append(("bias gradient" if self.bias_gradient else "bias", 0 if empty else shape.n * size))
        if self.aux == "relu_mask":
            needed.append(("ReLU mask", 0 if empty else Gemm.relu_mask_bytes(shape.m, shape.n)))
        elif self.aux:
            needed.append(("GELU input", c * size))
        for (name, nbytes), length in zip(needed, lengths):
            if length is not None and length < nbytes:
                raise InvalidArgumentError(
                    f"Gemm {name} range of {length} bytes is too short: the {self.epilogue} product of "
                    f"{shape.m}x{shape.n}x{shape.k} {self.dtype} needs {nbytes} bytes")

    def is_empty(self, checked: object) -> bool:
        shape: GemmShape = checked  # type: ignore[assignment]
        return shape.m * shape.n * shape.batch == 0

    def reference(self) -> NumpyKernel:
        def gemm(workgroups, bindings, constants) -> None:
            run_gemm_reference(self, bindings, constants)

        return gemm


def run_gemm_reference(gemm: Gemm, bindings: Sequence[memoryview], constants: Sequence[int]) -> None:
    """Compute a Gemm dispatch with numpy (float32 accumulation for the 16-bit types)."""
    s = GemmShape.of(constants)
    if s.m * s.n * s.batch == 0:
        return
    a = _matrices(bindings[1], gemm.dtype, s.batch, s.stride_a, (s.k, s.m) if s.transpose_a else (s.m, s.k), s.lda)
    b = _matrices(bindings[2], gemm.dtype, s.batch, s.stride_b, (s.n, s.k) if s.transpose_b else (s.k, s.n), s.ldb)
    if s.transpose_a:
        a = a.transpose(0, 2, 1)
    if s.transpose_b:
        b = b.transpose(0, 2, 1)
    compute = np.dtype(gemm.dtype) if gemm.dtype in ("float64", *COMPLEX_DTYPES) else np.float32
    with np.errstate(all="ignore"):
        result = np.matmul(a.astype(compute), b.astype(compute))
        if gemm.has_bias:
            result += _matrices(bindings[3], gemm.dtype, 1, 0, (1, s.n), s.n)[0].astype(compute)
        aux = bindings[-1] if gemm.aux else None
        if gemm.aux == "gelu_input" and not gemm.derivative:
            _store(_matrices(aux, gemm.dtype, 1, 0, (s.m, s.n), s.ldc, writable=True), result[0], gemm.dtype)
        elif gemm.aux == "relu_mask" and not gemm.derivative:
            write_relu_mask(aux, result[0] >= 0)
        if gemm.activation == "relu":
            result = np.maximum(result, 0)
        elif gemm.activation == "gelu":
            result = gelu_tanh(result)
        elif gemm.derivative == "relu":
            result = np.where(read_relu_mask(aux, s.m, s.n), result, 0).astype(compute)
        elif gemm.derivative == "gelu":
            pre = _matrices(aux, gemm.dtype, 1, 0, (s.m, s.n), s.ldc)[0].astype(compute)
            result = result * gelu_tanh_derivative(pre)
    out = _matrices(bindings[0], gemm.dtype, s.batch, s.stride_c, (s.m, s.n), s.ldc, writable=True)
    _store(out, result, gemm.dtype)
    if gemm.bias_gradient:
        # the column sums of what was stored, or of B over k (``bgrad_b``)
        with np.errstate(all="ignore"):
            summed = (b[0] if gemm.epilogue == "bgrad_b" else result[0]).astype(compute).sum(axis=0)
        _store(_matrices(bindings[3], gemm.dtype, 1, 0, (1, s.n), s.n, writable=True)[0], summed[None], gemm.dtype)


def relu_mask_row_bytes(n: int) -> int:
    """Bytes of one row of a ReLU mask of n columns (see ``Gemm.relu_mask_bytes``)."""
    return -(-n // RELU_MASK_ALIGN) * RELU_MASK_ALIGN // 8


def write_relu_mask(view: memoryview, mask: np.ndarray) -> None:
    """Store an (m, n) boolean mask as the bits ``Gemm.relu_mask_bytes`` describes (padding 0)."""
    m, n = mask.shape
    row = relu_mask_row_bytes(n)
    padded = np.zeros((m, row * 8), bool)
    padded[:, :n] = mask
    np.frombuffer(view, np.uint8)[:m * row] = np.packbits(padded, axis=1, bitorder="little").ravel()


def read_relu_mask(view: memoryview, m: int, n: int) -> np.ndarray:
    """The (m, n) boolean mask stored by ``write_relu_mask``."""
    row = relu_mask_row_bytes(n)
    bits = np.frombuffer(view, np.uint8)[:m * row].reshape(m, row)
    return np.unpackbits(bits, axis=1, bitorder="little")[:, :n].astype(bool)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU in the tanh approximation (the form cuBLASLt's GELU epilogue computes)."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi).astype(x.dtype) * (x + x.dtype.type(0.044715) * x ** 3)))


def gelu_tanh_derivative(x: np.ndarray) -> np.ndarray:
    """The derivative of ``gelu_tanh`` (what cuBLASLt's DGELU epilogue multiplies by)."""
    c, a = np.sqrt(2 / np.pi).astype(x.dtype), x.dtype.type(0.044715)
    t = np.tanh(c * (x + a * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * a * x * x)


def _matrices(view: memoryview, dtype: str, batch: int, stride: int, shape: tuple[int, int], ld: int,
              writable: bool = False) -> np.ndarray:
    """A (batch, rows, cols) strided view of a binding (bfloat16 as its uint16 bits)."""
    storage = np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)
    raw = np.frombuffer(view, dtype=np.uint8)
    size = storage.itemsize
    elements = raw[:len(raw) - len(raw) % size].view(storage)
    array = np.lib.stride_tricks.as_strided(elements, (batch, *shape), (stride * size, ld * size, size),
                                            writeable=writable)
    if dtype == "bfloat16" and not writable:
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array


def _store(out: np.ndarray, result: np.ndarray, dtype: str) -> None:
    if dtype == "bfloat16":
        bits = result.astype(np.float32).view(np.uint32)
        rounded = bits + 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
        nan = np.isnan(result)
        out[...] = np.where(nan, 0x7FC0, rounded >> 16).astype(np.uint16)
    else:
        out[...] = result.astype(out.dtype)


#: The routine kinds the core knows, by ``Routine.kind``.
ROUTINES: dict[str, type[Routine]] = {"gemm": Gemm}


def library_spec(routines: Mapping[str, Routine]) -> ExecutableSpec:
    """An ExecutableSpec of format ``library`` whose exports are ``routines`` (export name -> routine)."""
    from hal.executable import ExecutableSpec, Export

    if not isinstance(routines, Mapping) or not routines:
        raise InvalidArgumentError(
            f"library_spec takes a non-empty mapping of export name to routine, got {routines!r}")
    exports = []
    for name, routine in routines.items():
        if not isinstance(routine, Routine):
            raise InvalidArgumentError(f"library export {name!r} must be a hal routine (hal.Gemm), got {routine!r}")
        exports.append(Export(name, bindings=routine.bindings, constants=routine.constants))
    return ExecutableSpec("library", dict(routines), exports)


def routines_of(spec: ExecutableSpec) -> tuple[Routine, ...]:
    """The routines of a ``library`` spec in export order; InvalidArgumentError when they do not fit
    the exports (checked by ``Device.load_executable`` before a driver sees the spec)."""
    code = spec.code
    if not isinstance(code, Mapping):
        raise InvalidArgumentError(
            f"library executable code must be a mapping of export name to routine, got {type(code).__name__}")
    routines = []
    for export in spec.exports:
        routine = code.get(export.name)
        if not isinstance(routine, Routine):
            raise InvalidArgumentError(f"library export {export.name!r} has no routine (got {routine!r})")
        if (export.bindings, export.constants) != (routine.bindings, routine.constants):
            raise InvalidArgumentError(
                f"library export {export.name!r} declares {export.bindings} bindings and {export.constants} "
                f"constants; its {routine.kind} takes {routine.bindings} and {routine.constants}")
        routines.append(routine)
    return tuple(routines)
