"""Dense linear-algebra routines (LAPACK's, as cuSOLVER and hipSOLVER run them) as library routines.

Like ``hal.Gemm`` they are exports of a ``library`` executable, recorded into command buffers like
kernels; the CUDA driver runs them through cuSOLVER, the HIP driver through hipSOLVER, the CPU
drivers and the simulated GPU through the numpy references defined here, which the conformance
suite checks every driver against::

    exe = dev.load_executable(hal.library_spec({"potrf": hal.Cholesky("float32")}))
    with cb.record():
        cb.dispatch(exe, "potrf", constants=[batch, n], bindings=[factor, a, info])

Conventions, shared by every routine:

- Matrices are **column-major** (LAPACK's order), packed (leading dimension = rows), a batch of
  them one after another. A row-major caller passes the transpose of what it means (the runtime
  uses that: a Hermitian matrix read column-major is its conjugate).
- Routines are out of place: the inputs are only read; each output has a binding of its own.
- ``info`` is an int32 per batch entry, as LAPACK's: 0 on success, ``k > 0`` when the entry
  failed (the leading minor of order k is not positive definite; the k-th pivot of an LU is
  exactly zero; an eigen or singular value solver did not converge). The outputs of a failed
  entry are unspecified (an LU's are defined: LAPACK completes a factorization with a zero pivot).
- Constants are uint32, in elements: the batch count first, then the sizes.
- dtypes: float32, float64, complex64, complex128; eigenvalues and singular values are real
  (float32 for complex64, float64 for complex128).
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

#: Element types of the solver routines, and the real type of each (eigenvalues, singular values).
SOLVER_DTYPES = {"float32": "float32", "float64": "float64", "complex64": "float32", "complex128": "float64"}
#: The largest size (rows, columns, right-hand sides, batch) a routine takes: the libraries' int32.
MAX_SIZE = (1 << 31) - 1
INFO_SIZE = 4
PIVOT_SIZE = 4


@dataclasses.dataclass(frozen=True)
class SolverCall:
    """A checked dispatch of a solver routine: its constants by name and the bytes of each binding."""

    sizes: tuple[tuple[str, int], ...]
    extents: tuple[tuple[str, int], ...]

    def __getattr__(self, name: str) -> int:
        for key, value in self.sizes:
            if key == name:
                return value
        raise AttributeError(name)


@dataclasses.dataclass(frozen=True)
class SolverRoutine(Routine):
    """What every solver routine shares: a dtype, its constants' names, the bytes of its bindings."""

    dtype: str = "float32"

    #: The constants' names, in order (the batch count first).
    NAMES: ClassVar[tuple[str, ...]] = ("batch", "n")
    #: Binding indices the routine writes (the others it reads).
    OUTPUTS: ClassVar[tuple[int, ...]] = ()
    #: A short name for messages.
    TITLE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        if self.dtype not in SOLVER_DTYPES:
            raise InvalidArgumentError(
                f"{type(self).__name__} dtype must be one of {sorted(SOLVER_DTYPES)}, got {self.dtype!r}")

    @property
    def constants(self) -> int:
        return len(self.NAMES)

    @property
    def bindings(self) -> int:
        return len(self.binding_names())

    @property
    def element_size(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def real_dtype(self) -> str:
        return SOLVER_DTYPES[self.dtype]

    def binding_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def binding_bytes(self, sizes: dict[str, int]) -> list[int]:
        """Bytes each binding spans, in binding order, for the named constants ``sizes``."""
        raise NotImplementedError

    def validate(self, sizes: dict[str, int]) -> None:
        """Raise InvalidArgumentError for sizes that describe no call (beyond the ranges)."""

    def call_of(self, constants: Sequence[int]) -> SolverCall:
        if len(constants) != len(self.NAMES):
            raise InvalidArgumentError(f"{self.TITLE} takes {len(self.NAMES)} constants "
                                       f"({', '.join(self.NAMES)}), got {len(constants)}")
        sizes = dict(zip(self.NAMES, (int(c) for c in constants)))
        for name, value in sizes.items():
            if not 0 <= value <= MAX_SIZE:
                raise InvalidArgumentError(f"{self.TITLE} {name} {value} is out of range (0 to {MAX_SIZE})")
        self.validate(sizes)
        extents = tuple(zip(self.binding_names(), self.binding_bytes(sizes)))
        return SolverCall(tuple(sizes.items()), extents)

    def check(self, constants: tuple[int, ...], bindings: Sequence[BufferRef]) -> SolverCall:
        call = self.call_of(constants)
        self.check_lengths(call, [ref.length if ref.buffer is not None else None for ref in bindings])
        return call

    def check_lengths(self, checked: object, lengths: Sequence[int | None]) -> None:
        call: SolverCall = checked  # type: ignore[assignment]
        for (name, nbytes), length in zip(call.extents, lengths):
            if length is not None and length < nbytes:
                sizes = ", ".join(f"{k}={v}" for k, v in call.sizes)
                raise InvalidArgumentError(f"{self.TITLE} {name} range of {length} bytes is too short: "
                                           f"{sizes} of {self.dtype} needs {nbytes} bytes")

    def is_empty(self, checked: object) -> bool:
        call: SolverCall = checked  # type: ignore[assignment]
        return all(nbytes == 0 for _, nbytes in call.extents)

    def reference(self) -> NumpyKernel:
        def run(workgroups, bindings, constants) -> None:
            call = self.call_of(constants)
            if self.is_empty(call):
                return
            sizes = dict(call.sizes)
            with np.errstate(all="ignore"):
                self.compute(sizes, bindings)

        return run

    def compute(self, sizes: dict[str, int], bindings: Sequence[memoryview]) -> None:
        raise NotImplementedError


def matrices(view: memoryview, dtype: str, batch: int, rows: int, cols: int) -> np.ndarray:
    """A (batch, rows, cols) array over ``batch`` packed column-major matrices of a binding."""
    count = batch * rows * cols
    flat = np.frombuffer(view, np.uint8)[:count * np.dtype(dtype).itemsize].view(dtype)
    return flat.reshape(batch, cols, rows).transpose(0, 2, 1)


def store_matrices(view: memoryview, values: np.ndarray, dtype: str) -> None:
    """Write (batch, rows, cols) values as packed column-major matrices."""
    batch, rows, cols = values.shape
    matrices(view, dtype, batch, rows, cols)[...] = values.astype(dtype)


def vector(view: memoryview, dtype: str, count: int) -> np.ndarray:
    return np.frombuffer(view, np.uint8)[:count * np.dtype(dtype).itemsize].view(dtype)


@dataclasses.dataclass(frozen=True)
class Cholesky(SolverRoutine):
    """``A = L L^H`` of Hermitian positive-definite matrices (LAPACK's potrf, lower).

    Bindings: L (batch n x n; the factor in the lower triangle, the strictly upper triangle
    unspecified), A (batch n x n, read from its lower triangle), info (batch int32).
    Constants: batch, n.
    """

    kind: ClassVar[str] = "cholesky"
    TITLE: ClassVar[str] = "Cholesky"
    OUTPUTS: ClassVar[tuple[int, ...]] = (0, 2)

    def binding_names(self) -> tuple[str, ...]:
        return ("L", "A", "info")

    def binding_bytes(self, s: dict[str, int]) -> list[int]:
        matrix = s["batch"] * s["n"] * s["n"] * self.element_size
        return [matrix, matrix, s["batch"] * INFO_SIZE if s["n"] else 0]

    def compute(self, s: dict[str, int], bindings: Sequence[memoryview]) -> None:
        batch, n = s["batch"], s["n"]
        a = matrices(bindings[1], self.dtype, batch, n, n).copy()
        info = vector(bindings[2], "int32", batch)
        lower = np.tril(a)
        hermitian = lower + np.conj(np.swapaxes(np.tril(a, -1), -1, -2))
        try:  # every entry at once, unless one fails
            factors = np.linalg.cholesky(hermitian)
            info[...] = 0
            failed = [i for i in range(batch) if not np.all(np.isfinite(factors[i]))]
        except np.linalg.LinAlgError:
            factors = np.full((batch, n, n), np.nan, a.dtype)
            failed = list(range(batch))
        for i in failed:
            try:
                factors[i] = np.linalg.cholesky(hermitian[i])
                info[i] = 0 if np.all(np.isfinite(factors[i])) else _failed_minor(hermitian[i])
            except np.linalg.LinAlgError:
                factors[i] = np.nan
                info[i] = _failed_minor(hermitian[i])
        store_matrices(bindings[0], np.tril(factors) + np.triu(a, 1), self.dtype)


def _failed_minor(a: np.ndarray) -> int:
    """The order of the first leading minor of ``a`` that is not positive definite."""
    for k in range(1, a.shape[0] + 1):
        try:
            if not np.all(np.isfinite(np.linalg.cholesky(a[:k, :k]))):
                return k
        except np.linalg.LinAlgError:
            return k
    return a.shape[0]


def lu_factor(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LAPACK's getrf on (batch, n, n): (LU with the unit lower factor below the diagonal, 1-based
    pivots (batch, n) int32, info (batch,) int32: the first exactly zero pivot, 1-based)."""
    lu = np.array(a)
    batch, n, _ = lu.shape
    pivots = np.zeros((batch, n), np.int32)
    info = np.zeros(batch, np.int32)
    for k in range(n):
        p = k + np.argmax(np.abs(lu[:, k:, k]), axis=1)
        pivots[:, k] = p + 1
        swapped = np.nonzero(p != k)[0]
        if len(swapped):
            rows = p[swapped]
            top = lu[swapped, k].copy()
            lu[swapped, k] = lu[swapped, rows]
            lu[swapped, rows] = top
        pivot = lu[:, k, k]
        zero = pivot == 0
        if zero.any():  # LAPACK goes on past a zero pivot, leaving its column as it is
            info[(info == 0) & zero] = k + 1
            below = np.where(zero[:, None], 0, lu[:, k + 1:, k] / np.where(zero, 1, pivot)[:, None])
            lu[:, k + 1:, k] = np.where(zero[:, None], lu[:, k + 1:, k], below)
        else:
            below = lu[:, k + 1:, k] / pivot[:, None]
            lu[:, k + 1:, k] = below
        lu[:, k + 1:, k + 1:] -= below[:, :, None] * lu[:, k, None, k + 1:]
    return lu, pivots, info


def _permutation(pivots: np.ndarray) -> np.ndarray:
    """(batch, n) row order of P^T A from LAPACK's pivots: row i of P^T A is row order[i] of A."""
    batch, n = pivots.shape
    order = np.tile(np.arange(n), (batch, 1))
    rows = np.arange(batch)
    for k in range(n):
        p = pivots[:, k] - 1
        top = order[rows, k].copy()
        order[rows, k] = order[rows, p]
        order[rows, p] = top
    return order


def lu_solve(lu: np.ndarray, pivots: np.ndarray, b: np.ndarray, transpose: bool) -> np.ndarray:
    """LAPACK's getrs: X with ``A X = B`` (``A^T X = B`` when ``transpose``), A's LU and pivots from
    ``lu_factor``; b is (batch, n, nrhs)."""
    batch, n, _ = lu.shape
    upper = np.triu(lu)
    if np.all(np.diagonal(upper, axis1=1, axis2=2) != 0):  # LAPACK's solve of the same matrix, batched
        lower = np.tril(lu, -1) + np.eye(n, dtype=lu.dtype)
        order = _permutation(pivots)
        a = np.empty_like(lu)
        np.put_along_axis(a, order[:, :, None], lower @ upper, axis=1)  # A = P L U
        try:
            return np.linalg.solve(np.swapaxes(a, -1, -2) if transpose else a, b)
        except np.linalg.LinAlgError:
            pass
    x = np.array(b)
    rows = np.arange(batch)

    def swap(k: int) -> None:
        p = pivots[:, k] - 1
        top = x[rows, k].copy()
        x[rows, k] = x[rows, p]
        x[rows, p] = top

    if not transpose:
        for k in range(n):
            swap(k)
        for k in range(n):  # L y = P b (unit lower)
            x[:, k + 1:] -= lu[:, k + 1:, k, None] * x[:, k, None]
        for k in reversed(range(n)):  # U x = y
            x[:, k] /= lu[:, k, k, None]
            x[:, :k] -= lu[:, :k, k, None] * x[:, k, None]
        return x
    for k in range(n):  # U^T y = b (lower)
        x[:, k] /= lu[:, k, k, None]
        x[:, k + 1:] -= lu[:, k, k + 1:, None] * x[:, k, None]
    for k in reversed(range(n)):  # L^T z = y (unit upper)
        x[:, :k] -= lu[:, k, :k, None] * x[:, k, None]
    for k in reversed(range(n)):
        swap(k)
    return x


@dataclasses.dataclass(frozen=True)
class LU(SolverRoutine):
    """``A = P L U`` with partial pivoting (LAPACK's getrf).

    Bindings: LU (batch n x n: U on and above the diagonal, the unit lower L below it), A (batch
    n x n), pivots (batch x n int32, 1-based: row i was swapped with row pivots[i], in order),
    info (batch int32: the first exactly zero pivot of U, 1-based, else 0). Constants: batch, n.
    """

    kind: ClassVar[str] = "lu"
    TITLE: ClassVar[str] = "LU"
    OUTPUTS: ClassVar[tuple[int, ...]] = (0, 2, 3)

    def binding_names(self) -> tuple[str, ...]:
        return ("LU", "A", "pivots", "info")

    def binding_bytes(self, s: dict[str, int]) -> list[int]:
        batch, n = s["batch"], s["n"]
        matrix = batch * n * n * self.element_size
        return [matrix, matrix, batch * n * PIVOT_SIZE, batch * INFO_SIZE if n else 0]

    def compute(self, s: dict[str, int], bindings: Sequence[memoryview]) -> None:
        batch, n = s["batch"], s["n"]
        lu, pivots, info = lu_factor(matrices(bindings[1], self.dtype, batch, n, n))
        store_matrices(bindings[0], lu, self.dtype)
        vector(bindings[2], "int32", batch * n)[...] = pivots.ravel()
        vector(bindings[3], "int32", batch)[...] = info


@dataclasses.dataclass(frozen=True)
class LUSolve(SolverRoutine):
    """X with ``A X = B`` (``A^T X = B`` when ``transpose``) from A's ``LU`` (LAPACK's getrs).

    Bindings: X (batch n x nrhs), LU (batch n x n), pivots (batch x n int32), B (batch n x nrhs).
    Constants: batch, n, nrhs. A zero pivot gives infinities and NaNs (no check).
    """

    kind: ClassVar[str] = "lu_solve"
    TITLE: ClassVar[str] = "LUSolve"
    NAMES: ClassVar[tuple[str, ...]] = ("batch", "n", "nrhs")
    OUTPUTS: ClassVar[tuple[int, ...]] = (0,)

    transpose: bool = False

    def binding_names(self) -> tuple[str, ...]:
        return ("X", "LU", "pivots", "B")

    def binding_bytes(self, s: dict[str, int]) -> list[int]:
        batch, n, nrhs = s["batch"], s["n"], s["nrhs"]
        rhs = batch * n * nrhs * self.element_size
        if rhs == 0:
            return [0, 0, 0, 0]
        return [rhs, batch * n * n * self.element_size, batch * n * PIVOT_SIZE, rhs]

    def compute(self, s: dict[str, int], bindings: Sequence[memoryview]) -> None:
        batch, n, nrhs = s["batch"], s["n"], s["nrhs"]
        lu = matrices(bindings[1], self.dtype, batch, n, n)
        pivots = vector(bindings[2], "int32", batch * n).reshape(batch, n)
        b = matrices(bindings[3], self.dtype, batch, n, nrhs)
        store_matrices(bindings[0], lu_solve(lu, pivots, b, self.transpose), self.dtype)


@dataclasses.dataclass(frozen=True)
class Eigh(SolverRoutine):
    """Eigenvalues (ascending) and eigenvectors of Hermitian matrices (LAPACK's syevd/heevd).

    Bindings: V (batch n x n, the eigenvectors as columns; unspecified when ``vectors`` is False),
    W (batch x n, real), A (batch n x n, read from its lower triangle), info (batch int32).
    Constants: batch, n.
    """

    kind: ClassVar[str] = "eigh"
    TITLE: ClassVar[str] = "Eigh"
    OUTPUTS: ClassVar[tuple[int, ...]] = (0, 1, 3)

    vectors: bool = True

    def binding_names(self) -> tuple[str, ...]:
        return ("V", "W", "A", "info")

    def binding_bytes(self, s: dict[str, int]) -> list[int]:
        batch, n = s["batch"], s["n"]
        matrix = batch * n * n * self.element_size
        return [matrix, batch * n * np.dtype(self.real_dtype).itemsize, matrix, batch * INFO_SIZE if n else 0]

    def compute(self, s: dict[str, int], bindings: Sequence[memoryview]) -> None:
        batch, n = s["batch"], s["n"]
        a = matrices(bindings[2], self.dtype, batch, n, n)
        info = vector(bindings[3], "int32", batch)
        w = np.full((batch, n), np.nan, self.real_dtype)
        v = np.full((batch, n, n), np.nan, self.dtype)
        try:  # every entry at once, unless one fails
            w[...], v[...] = np.linalg.eigh(a, UPLO="L")
            info[...] = 0
        except np.linalg.LinAlgError:
            for i in range(batch):
                try:
                    w[i], v[i] = np.linalg.eigh(a[i], UPLO="L")
                    info[i] = 0
                except np.linalg.LinAlgError:
                    info[i] = 1
        store_matrices(bindings[0], v, self.dtype)
        vector(bindings[1], self.real_dtype, batch * n)[...] = w.ravel()


@dataclasses.dataclass(frozen=True)
class Svd(SolverRoutine):
    """``A = U diag(S) V^H`` (LAPACK's gesvd, with V itself, not V^H, as cuSOLVER's gesvdj writes).

    Bindings: U (batch m x ku), S (batch x k, real, descending), V (batch n x kv), A (batch m x n),
    info (batch int32); k = min(m, n), ku = m and kv = n with ``full_matrices``, else k.
    Constants: batch, m, n.
    """

    kind: ClassVar[str] = "svd"
    TITLE: ClassVar[str] = "Svd"
    NAMES: ClassVar[tuple[str, ...]] = ("batch", "m", "n")
    OUTPUTS: ClassVar[tuple[int, ...]] = (0, 1, 2, 4)

    full_matrices: bool = False

    def binding_names(self) -> tuple[str, ...]:
        return ("U", "S", "V", "A", "info")

    def columns(self, m: int, n: int) -> tuple[int, int]:
        """(columns of U, columns of V)."""
        k = min(m, n)
        return (m, n) if self.full_matrices else (k, k)

    def binding_bytes(self, s: dict[str, int]) -> list[int]:
        batch, m, n = s["batch"], s["m"], s["n"]
        ku, kv = self.columns(m, n)
        size = self.element_size
        k = min(m, n)
        return [batch * m * ku * size, batch * k * np.dtype(self.real_dtype).itemsize, batch * n * kv * size,
                batch * m * n * size, batch * INFO_SIZE if m * n else 0]

    def compute(self, s: dict[str, int], bindings: Sequence[memoryview]) -> None:
        batch, m, n = s["batch"], s["m"], s["n"]
        ku, kv = self.columns(m, n)
        k = min(m, n)
        a = matrices(bindings[3], self.dtype, batch, m, n)
        info = vector(bindings[4], "int32", batch)
        u = np.full((batch, m, ku), np.nan, self.dtype)
        sv = np.full((batch, k), np.nan, self.real_dtype)
        v = np.full((batch, n, kv), np.nan, self.dtype)
        try:  # every entry at once, unless one fails
            ui, si, vhi = np.linalg.svd(a, full_matrices=self.full_matrices)
            u[...], sv[...], v[...] = ui, si, np.conj(np.swapaxes(vhi, -1, -2))
            info[...] = 0
        except np.linalg.LinAlgError:
            for i in range(batch):
                try:
                    ui, si, vhi = np.linalg.svd(a[i], full_matrices=self.full_matrices)
                    u[i], sv[i], v[i] = ui, si, np.conj(vhi).T
                    info[i] = 0
                except np.linalg.LinAlgError:
                    info[i] = 1
        if m * ku:
            store_matrices(bindings[0], u, self.dtype)
        if k:
            vector(bindings[1], self.real_dtype, batch * k)[...] = sv.ravel()
        if n * kv:
            store_matrices(bindings[2], v, self.dtype)


@dataclasses.dataclass(frozen=True)
class Qr(SolverRoutine):
    """``A = Q R`` by Householder reflections (LAPACK's geqrf, then orgqr/ungqr for Q).

    Bindings: Q (batch m x kq: kq = m when ``complete``, else min(m, n)), R (batch m x n: R on and
    above the diagonal, the strictly lower triangle unspecified), A (batch m x n). Constants:
    batch, m, n.
    """

    kind: ClassVar[str] = "qr"
    TITLE: ClassVar[str] = "Qr"
    NAMES: ClassVar[tuple[str, ...]] = ("batch", "m", "n")
    OUTPUTS: ClassVar[tuple[int, ...]] = (0, 1)

    complete: bool = False

    def binding_names(self) -> tuple[str, ...]:
        return ("Q", "R", "A")

    def q_columns(self, m: int, n: int) -> int:
        return m if self.complete else min(m, n)

    def binding_bytes(self, s: dict[str, int]) -> list[int]:
        batch, m, n = s["batch"], s["m"], s["n"]
        size = self.element_size
        return [batch * m * self.q_columns(m, n) * size, batch * m * n * size, batch * m * n * size]

    def compute(self, s: dict[str, int], bindings: Sequence[memoryview]) -> None:
        batch, m, n = s["batch"], s["m"], s["n"]
        kq = self.q_columns(m, n)
        a = matrices(bindings[2], self.dtype, batch, m, n)
        q = np.zeros((batch, m, kq), self.dtype)
        r = np.zeros((batch, m, n), self.dtype)
        for i in range(batch):
            qi, ri = np.linalg.qr(a[i], mode="complete" if self.complete else "reduced")
            q[i] = qi
            r[i, :ri.shape[0]] = ri
        if m * kq:
            store_matrices(bindings[0], q, self.dtype)
        if m * n:
            store_matrices(bindings[1], r, self.dtype)


#: The solver routines by kind.
SOLVER_ROUTINES: dict[str, type[SolverRoutine]] = {
    cls.kind: cls for cls in (Cholesky, LU, LUSolve, Eigh, Svd, Qr)}
ROUTINES.update(SOLVER_ROUTINES)
