"""The array API's ``linalg`` extension (2024.12): ``rt.linalg``, also ``xp.linalg`` of the namespace.

Every function takes stacks of matrices (leading batch dimensions) of float32, float64, complex64
and complex128; other dtypes raise ``InvalidTypeError`` (a TypeError), arrays of too few
dimensions or non-square matrices where square ones are needed ``InvalidValueError``.

- The decompositions (cholesky, eigh/eigvalsh, the LU behind det, slogdet, solve and inv, qr,
  svd/svdvals, and pinv, matrix_rank and the 2 and nuclear matrix norms on svd) are HAL library
  routines (``hal.solver``) recorded like any kernel (``kernels/linalg.py``): numpy's LAPACK on
  the CPU drivers, cuSOLVER on CUDA, hipSOLVER on HIP. A GPU whose solver library is missing
  raises ``hal.UnimplementedError`` naming it when the op is built.
- The others are compositions of the runtime's ops.

Failures follow JAX rather than raising: a matrix that is not positive definite gives a Cholesky
factor of NaNs for that batch entry, a singular matrix NaNs from ``solve`` and ``inv`` (its
determinant is 0 and its slogdet (0, -inf), as numpy's), and an eigen or singular value solver
that does not converge NaNs, the same on every driver (the routines' ``info`` decides it on the
device, so nothing waits for the host).

Gradients (``rt.grad``, JAX's convention for complex inputs): inv, solve, det, slogdet's
logabsdet, cholesky, eigh and eigvalsh, svd (reduced factors, or square matrices) and svdvals,
and qr (reduced, of tall or square matrices), and everything composed of the runtime's ops.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

import hal

from . import array_api as _api
from . import dtypes as _dt
from . import ops
from .errors import InvalidTypeError, InvalidValueError
from .graph import Node, new_node
from .kernels import linalg as _kernels
from .shapes import broadcast_shapes

if TYPE_CHECKING:
    from .array import Array

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul", "matrix_norm",
           "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv", "qr", "slogdet", "solve", "svd",
           "svdvals", "tensordot", "trace", "vecdot", "vector_norm"]

_FLOATS = (_dt.float32, _dt.float64, _dt.complex64, _dt.complex128)
#: Bytes each output starts on in a decomposition's buffer.
_ALIGN = 256


class EighResult(NamedTuple):
    eigenvalues: Array
    eigenvectors: Array


class QRResult(NamedTuple):
    Q: Array
    R: Array


class SlogdetResult(NamedTuple):
    sign: Array
    logabsdet: Array


class SVDResult(NamedTuple):
    U: Array
    S: Array
    Vh: Array


# -- checks ----------------------------------------------------------------------------------------

def _floating(x, name: str) -> Array:
    x = ops.asarray(x) if not isinstance(x, Node) else x
    if x.dtype not in _FLOATS:
        raise InvalidTypeError(f"linalg.{name} takes float32, float64, complex64 or complex128 arrays, "
                               f"got {x.dtype.name}")
    return x


def _matrices(x, name: str, square: bool = False) -> Array:
    x = _floating(x, name)
    if x.ndim < 2:
        raise InvalidValueError(f"linalg.{name} takes a matrix or a stack of matrices, got shape {x.shape}")
    if square and x.shape[-1] != x.shape[-2]:
        raise InvalidValueError(f"linalg.{name} takes square matrices, got shape {x.shape}")
    return x


def _real(dt: _dt.DType) -> _dt.DType:
    return {_dt.complex64: _dt.float32, _dt.complex128: _dt.float64}.get(dt, dt)


# -- the library routines --------------------------------------------------------------------------

def _decompose(routine: hal.Routine, inputs: list, constants: list, keep: list, shapes: list) -> list:
    """Run ``routine`` on ``inputs`` (contiguous arrays): one node per output binding kept
    (``keep``: for each output binding, its dtype, or None when nothing reads it), shaped
    ``shapes`` (the bytes as the routine writes them, read in row-major order)."""
    ctx = inputs[0].ctx
    packed, outputs = _packed(routine, inputs, constants, keep)
    results = []
    for dtype, shape, (start, _) in zip(keep, shapes, outputs):
        if dtype is None:
            results.append(None)
            continue
        results.append(new_node("linalg_get", (packed,), (start,), tuple(shape), dtype, ctx))
    return results


def _packed(routine: hal.Routine, inputs: list, constants: list, keep: list) -> tuple[Array, list]:
    """The node of ``routine``'s outputs in one byte buffer, and each output's (byte offset, bytes
    kept) in it (0 bytes for those ``keep`` says nobody reads)."""
    ctx = inputs[0].ctx
    reason = _kernels.loadable(ctx, routine)
    if reason is not None:
        raise hal.UnimplementedError(f"linalg: {routine.TITLE} cannot run on {ctx.device.info.uri}: {reason}")
    call = routine.call_of(constants)
    extents = [nbytes for i, (_, nbytes) in enumerate(call.extents) if i in routine.OUTPUTS]
    outputs, offset = [], 0
    for dtype, nbytes in zip(keep, extents):
        kept = nbytes if dtype is not None else 0
        outputs.append((offset, kept))
        offset += -(-kept // _ALIGN) * _ALIGN
    if offset > 0xFFFFFFFF:  # (the kernels reading the buffer take 32-bit byte offsets and counts)
        raise hal.UnimplementedError(f"linalg: the results of {routine.TITLE} of {inputs[0].shape} take {offset} "
                                     "bytes, too many for one dispatch (4 GiB at most): split the batch")
    packed = new_node("linalg", tuple(inputs), (routine, tuple(constants), tuple(outputs)), (max(offset, 1),),
                      _dt.uint8, ctx)
    return packed, outputs


def _batch(x: Array) -> tuple[tuple, int]:
    return x.shape[:-2], math.prod(x.shape[:-2])


def _dense(x: Array) -> Array:
    return ops.contiguous(x)


def _failed(info: Array, value: Array, dims: int) -> Array:
    """``value`` with NaN in every batch entry whose ``info`` is not 0 (``dims``: the entry's own dims)."""
    ok = ops.reshape(ops.equal(info, 0), info.shape + (1,) * dims)
    return ops.where(ok, value, float("nan"))


def _graded(value: Array, tag: tuple, inputs: tuple, outputs: tuple) -> Array:
    """``value`` as a node whose gradient to ``inputs`` is ``tag``'s rule (``_rule``) given all the
    decomposition's ``outputs``; gradients never flow through the routine itself. A view (a
    transposed factor) is copied whole by the node itself."""
    return new_node("linalg_result", (value, *inputs, *outputs), (tag, len(inputs)), value.shape, value.dtype,
                    value.ctx)


# -- decompositions ---------------------------------------------------------------------------------

def cholesky(x, /, *, upper: bool = False) -> Array:
    """The lower (``upper``: upper) Cholesky factor of Hermitian positive-definite matrices; NaNs for
    a batch entry that is not positive definite."""
    x = _matrices(x, "cholesky", square=True)
    batch, count = _batch(x)
    n = x.shape[-1]
    if count == 0 or n == 0:
        return ops.zeros(x.shape, x.dtype, x.ctx)
    # Column-major, the row-major buffer of a Hermitian A is conj(A): its factor conj(L), whose
    # row-major reading is L^H, upper (the strictly lower triangle is unspecified). The result, its
    # triangle, its transpose and a failed entry's NaNs, is one kernel reading the routine's buffer.
    packed, ((raw_at, _), (info_at, _)) = _packed(hal.Cholesky(x.dtype.name), [_dense(x)], [count, n],
                                                  [x.dtype, _dt.int32])
    factor = _kernels.factor_params(raw_at, info_at, n, transposed=not upper,
                                    conjugated=not upper and x.dtype.is_complex)
    return new_node("linalg_result", (packed, x), (("cholesky", upper), 1, factor), batch + (n, n), x.dtype, x.ctx)


def _lu(x: Array) -> tuple:
    """(LU bytes, pivots, info) of the column-major reading of x (A^T: same determinant)."""
    batch, count = _batch(x)
    n = x.shape[-1]
    lu, pivots, info = _decompose(hal.LU(x.dtype.name), [_dense(x)], [count, n], [x.dtype, _dt.int32, _dt.int32],
                                  [batch + (n, n), batch + (n,), batch])
    return lu, pivots, info


def _diagonal_of(x: Array) -> Array:
    return diagonal(x)


def slogdet(x, /) -> SlogdetResult:
    """(sign, log |det|) of square matrices: sign 0 and -inf for a singular one, as numpy's."""
    x = _matrices(x, "slogdet", square=True)
    batch, count = _batch(x)
    n = x.shape[-1]
    real = _real(x.dtype)
    if count == 0 or n == 0:
        return SlogdetResult(ops.ones(batch, x.dtype, x.ctx), ops.zeros(batch, real, x.ctx))
    lu, pivots, _ = _lu(x)
    d = _diagonal_of(lu)
    magnitude = ops.absolute(d)
    logabsdet = ops.sum(ops.log(magnitude), axis=-1)
    swaps = _api.count_nonzero(ops.not_equal(pivots, ops.arange(1, n + 1, dtype=_dt.int32, device=x.ctx)), axis=-1)
    parity = ops.astype(1 - 2 * (swaps % 2), x.dtype)
    zero = _api.any(ops.equal(magnitude, 0), axis=-1)
    phases = d / ops.where(ops.equal(magnitude, 0), 1, ops.astype(magnitude, x.dtype) if x.dtype.is_complex
                           else magnitude)
    sign = ops.where(zero, 0, parity * _api.prod(phases, axis=-1))
    return SlogdetResult(sign, _graded(logabsdet, ("logabsdet",), (x,), (logabsdet,)))


def det(x, /) -> Array:
    """Determinants of square matrices."""
    x = _matrices(x, "det", square=True)
    batch, count = _batch(x)
    n = x.shape[-1]
    if count == 0 or n == 0:
        return ops.ones(batch, x.dtype, x.ctx)
    lu, pivots, _ = _lu(x)
    swaps = _api.count_nonzero(ops.not_equal(pivots, ops.arange(1, n + 1, dtype=_dt.int32, device=x.ctx)), axis=-1)
    parity = ops.astype(1 - 2 * (swaps % 2), x.dtype)
    result = parity * _api.prod(_diagonal_of(lu), axis=-1)
    return _graded(result, ("det",), (x,), (result,))


def _lu_solve(a: Array, b: Array) -> Array:
    """X with A X = B for square A (..., n, n) and B (..., n, k) of A's batch shape; NaNs for a
    singular A."""
    batch, count = _batch(a)
    n, k = b.shape[-2], b.shape[-1]
    lu, pivots, info = _lu(a)
    # The LU is of A^T (column-major reading): solve with its transpose. B and X are column-major.
    bt = _dense(_api.matrix_transpose(b))
    (xt,) = _decompose(hal.LUSolve(a.dtype.name, transpose=True), [lu, pivots, bt], [count, n, k], [a.dtype],
                       [batch + (k, n)])
    return _failed(info, _api.matrix_transpose(xt), 2)


def solve(x1, x2, /) -> Array:
    """X with ``x1 @ X = x2``: x2 a stack of matrices, or a vector (shape (n,)) solved for each
    matrix of x1, as the standard says."""
    a = _matrices(x1, "solve", square=True)
    b = _floating(x2, "solve")
    _, _, dt = ops.operands(a, b)
    a = a if a.dtype is dt else ops.astype(a, dt)
    b = b if b.dtype is dt else ops.astype(b, dt)
    n = a.shape[-1]
    vector = b.ndim == 1
    if vector:
        if b.shape[0] != n:
            raise InvalidValueError(f"linalg.solve: a vector of {b.shape[0]} for matrices of {n} rows")
        b2 = ops.reshape(b, (n, 1))
    else:
        if b.ndim < 2 or b.shape[-2] != n:
            raise InvalidValueError(f"linalg.solve: x2 of shape {b.shape} does not fit x1 of shape {a.shape}")
        b2 = b
    batch = broadcast_shapes(a.shape[:-2], b2.shape[:-2])
    a_b = ops.broadcast_to(a, tuple(batch) + a.shape[-2:])
    b_b = ops.broadcast_to(b2, tuple(batch) + b2.shape[-2:])
    if math.prod(batch) == 0 or n == 0 or b2.shape[-1] == 0:
        out = ops.zeros(tuple(batch) + b2.shape[-2:], dt, a.ctx)
    else:
        out = _lu_solve(a_b, b_b)
    if vector:
        out = ops.reshape(out, out.shape[:-1])
    return _graded(out, ("solve", vector), (a, b), (out,))


def inv(x, /) -> Array:
    """Inverses of square matrices (NaNs for a singular one)."""
    x = _matrices(x, "inv", square=True)
    batch, count = _batch(x)
    n = x.shape[-1]
    if count == 0 or n == 0:
        return ops.zeros(x.shape, x.dtype, x.ctx)
    eye = ops.broadcast_to(_api.eye(n, dtype=x.dtype, device=x.ctx), x.shape)
    result = _lu_solve(x, eye)
    return _graded(result, ("inv",), (x,), (result,))


def _eigh(x: Array, vectors: bool, name: str) -> tuple:
    x = _matrices(x, name, square=True)
    batch, count = _batch(x)
    n = x.shape[-1]
    real = _real(x.dtype)
    if count == 0 or n == 0:
        return x, ops.zeros(batch + (n,), real, x.ctx), ops.zeros(x.shape, x.dtype, x.ctx)
    # Column-major, A's buffer is conj(A): eigenvalues W, eigenvectors conj(V), read row-major as V^H.
    raw, w, info = _decompose(hal.Eigh(x.dtype.name, vectors=vectors), [_dense(x)], [count, n],
                              [x.dtype if vectors else None, real, _dt.int32], [batch + (n, n), batch + (n,), batch])
    w = _failed(info, w, 1)
    v = _failed(info, ops.conj(_api.matrix_transpose(raw)), 2) if vectors else None
    return x, w, v


def eigh(x, /) -> EighResult:
    """Eigenvalues (ascending) and eigenvectors (columns) of Hermitian matrices."""
    x, w, v = _eigh(x, True, "eigh")
    return EighResult(_graded(w, ("eigh", 0), (x,), (w, v)), _graded(v, ("eigh", 1), (x,), (w, v)))


def eigvalsh(x, /) -> Array:
    """Eigenvalues (ascending) of Hermitian matrices."""
    x, w, v = _eigh(x, True, "eigvalsh")
    return _graded(w, ("eigh", 0), (x,), (w, v))


def _svd(x: Array, full_matrices: bool, name: str) -> tuple:
    x = _matrices(x, name)
    batch, count = _batch(x)
    m, n = x.shape[-2:]
    k = min(m, n)
    real = _real(x.dtype)
    ku, kv = (m, n) if full_matrices else (k, k)
    if count == 0 or k == 0:
        u = ops.broadcast_to(_api.eye(m, ku, dtype=x.dtype, device=x.ctx), batch + (m, ku))
        vh = ops.broadcast_to(_api.eye(kv, n, dtype=x.dtype, device=x.ctx), batch + (kv, n))
        return x, ops.contiguous(u), ops.zeros(batch + (k,), real, x.ctx), ops.contiguous(vh)
    # Column-major, A's buffer is A^T = conj(V) S conj(U)^H: the routine's U (n x kv) read row-major is
    # V^H, its V (m x ku) read row-major U^H.
    raw_u, s, raw_v, info = _decompose(
        hal.Svd(x.dtype.name, full_matrices=full_matrices), [_dense(x)], [count, n, m],
        [x.dtype, real, x.dtype, _dt.int32], [batch + (kv, n), batch + (k,), batch + (ku, m), batch])
    vh = _failed(info, raw_u, 2)
    u = _failed(info, ops.conj(_api.matrix_transpose(raw_v)), 2)
    return x, u, _failed(info, s, 1), vh


def svd(x, /, *, full_matrices: bool = True) -> SVDResult:
    """U, S (descending) and Vh with ``x = U @ diag(S) @ Vh``."""
    x, u, s, vh = _svd(x, full_matrices, "svd")
    outs = (u, s, vh)
    if full_matrices and x.shape[-1] != x.shape[-2]:
        return SVDResult(u, s, vh)  # (the gradient of the full factors is not unique)
    return SVDResult(*(_graded(o, ("svd", i), (x,), outs) for i, o in enumerate(outs)))


def svdvals(x, /) -> Array:
    """Singular values (descending)."""
    x, u, s, vh = _svd(x, False, "svdvals")
    return _graded(s, ("svd", 1), (x,), (u, s, vh))


def qr(x, /, *, mode: str = "reduced") -> QRResult:
    """Q and R with ``x = Q @ R``, Q with orthonormal columns and R upper triangular."""
    if mode not in ("reduced", "complete"):
        raise InvalidValueError(f"linalg.qr mode must be 'reduced' or 'complete', got {mode!r}")
    x = _matrices(x, "qr")
    batch, count = _batch(x)
    m, n = x.shape[-2:]
    k = min(m, n)
    kq = m if mode == "complete" else k
    kr = m if mode == "complete" else k
    if count == 0 or m == 0 or n == 0:
        q = ops.contiguous(ops.broadcast_to(_api.eye(m, kq, dtype=x.dtype, device=x.ctx), batch + (m, kq)))
        return QRResult(q, ops.zeros(batch + (kr, n), x.dtype, x.ctx))
    # The routine is column-major: it is given x^T's row-major buffer, and its outputs are transposed back.
    raw_q, raw_r = _decompose(hal.Qr(x.dtype.name, complete=mode == "complete"),
                              [_dense(_api.matrix_transpose(x))], [count, m, n], [x.dtype, x.dtype],
                              [batch + (kq, m), batch + (n, m)])
    q = _api.matrix_transpose(raw_q)
    r = _api.triu(_api.matrix_transpose(raw_r))[..., :kr, :]
    if mode == "complete" and m > n:
        return QRResult(q, r)
    outs = (q, r)
    return QRResult(*(_graded(o, ("qr", i), (x,), outs) for i, o in enumerate(outs)))


# -- built on the decompositions -------------------------------------------------------------------

def _default_rtol(x: Array) -> float:
    return max(x.shape[-2:]) * float(np.finfo(_real(x.dtype).storage).eps)


def pinv(x, /, *, rtol=None) -> Array:
    """The Moore-Penrose pseudo-inverse (singular values up to ``rtol`` times the largest dropped)."""
    x = _matrices(x, "pinv")
    u, s, vh = svd(x, full_matrices=False)
    if s.shape[-1] == 0:
        return ops.zeros(x.shape[:-2] + x.shape[-1:] + x.shape[-2:-1], x.dtype, x.ctx)
    tol = _default_rtol(x) if rtol is None else rtol
    if isinstance(tol, Node):
        tol = ops.expand_dims(tol, -1)
    cutoff = tol * ops.max(s, axis=-1, keepdims=True)
    s_inv = ops.where(ops.greater(s, cutoff), 1 / ops.where(ops.equal(s, 0), 1, s), 0)
    s_inv = ops.astype(s_inv, x.dtype) if x.dtype.is_complex else s_inv
    return ops.matmul(ops.conj(_api.matrix_transpose(vh)) * ops.expand_dims(s_inv, -2),
                      ops.conj(_api.matrix_transpose(u)))


def matrix_rank(x, /, *, rtol=None) -> Array:
    """The number of singular values above ``rtol`` times the largest."""
    x = _matrices(x, "matrix_rank")
    s = svdvals(x)
    if s.shape[-1] == 0:
        return ops.zeros(s.shape[:-1], _dt.int64, x.ctx)
    tol = _default_rtol(x) if rtol is None else rtol
    if isinstance(tol, Node):
        tol = ops.expand_dims(tol, -1)
    return ops.astype(_api.count_nonzero(ops.greater(s, tol * ops.max(s, axis=-1, keepdims=True)), axis=-1),
                      _dt.int64)


def matrix_norm(x, /, *, keepdims: bool = False, ord="fro") -> Array:  # noqa: A002
    """Matrix norms: 'fro', 'nuc', 1, -1, 2, -2, inf and -inf."""
    x = _matrices(x, "matrix_norm")
    a = ops.absolute(x)
    if ord == "fro":
        result = ops.sqrt(ops.sum(a * a, axis=(-2, -1)))
    elif ord in ("nuc", 2, -2):
        s = svdvals(x)
        result = ops.sum(s, axis=-1) if ord == "nuc" else ops.max(s, axis=-1) if ord == 2 else ops.min(s, axis=-1)
    elif ord in (1, -1):
        sums = ops.sum(a, axis=-2)
        result = ops.max(sums, axis=-1) if ord == 1 else ops.min(sums, axis=-1)
    elif ord in (math.inf, -math.inf):
        sums = ops.sum(a, axis=-1)
        result = ops.max(sums, axis=-1) if ord > 0 else ops.min(sums, axis=-1)
    else:
        raise InvalidValueError(f"linalg.matrix_norm: unsupported ord {ord!r}")
    return ops.reshape(result, result.shape + (1, 1)) if keepdims else result


def vector_norm(x, /, *, axis=None, keepdims: bool = False, ord=2) -> Array:  # noqa: A002
    """Vector norms over ``axis`` (all axes by default): any p, inf, -inf and 0 (the count of non-zeros)."""
    x = _floating(x, "vector_norm")
    a = ops.absolute(x)
    if ord == 2:
        result = ops.sqrt(ops.sum(a * a, axis=axis, keepdims=keepdims))
    elif ord == 1:
        result = ops.sum(a, axis=axis, keepdims=keepdims)
    elif ord == math.inf:
        result = ops.max(a, axis=axis, keepdims=keepdims)
    elif ord == -math.inf:
        result = ops.min(a, axis=axis, keepdims=keepdims)
    elif ord == 0:
        result = ops.astype(ops.sum(ops.astype(ops.not_equal(a, 0), a.dtype), axis=axis, keepdims=keepdims),
                            a.dtype)
    elif isinstance(ord, (int, float)) and not isinstance(ord, bool):
        result = ops.sum(a ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)
    else:
        raise InvalidValueError(f"linalg.vector_norm: unsupported ord {ord!r}")
    return result


def matrix_power(x, n: int, /) -> Array:
    """x raised to the integer ``n`` by repeated squaring (``n < 0``: of its inverse)."""
    x = _matrices(x, "matrix_power", square=True)
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise InvalidTypeError(f"linalg.matrix_power takes an integer power, got {type(n).__name__}")
    n = int(n)
    if n == 0:
        return ops.contiguous(ops.broadcast_to(_api.eye(x.shape[-1], dtype=x.dtype, device=x.ctx), x.shape))
    base = inv(x) if n < 0 else x
    n = abs(n)
    result = None
    while n:
        if n & 1:
            result = base if result is None else ops.matmul(result, base)
        n >>= 1
        if n:
            base = ops.matmul(base, base)
    return result


# -- compositions ----------------------------------------------------------------------------------

def matmul(x1, x2, /) -> Array:
    return ops.matmul(x1, x2)


def matrix_transpose(x, /) -> Array:
    return _api.matrix_transpose(x)


def tensordot(x1, x2, /, *, axes=2) -> Array:
    return _api.tensordot(x1, x2, axes=axes)


def vecdot(x1, x2, /, *, axis=-1) -> Array:
    return _api.vecdot(x1, x2, axis=axis)


def outer(x1, x2, /) -> Array:
    """The outer product of two vectors."""
    x1, x2 = ops.asarray(x1) if not isinstance(x1, Node) else x1, ops.asarray(x2) if not isinstance(x2, Node) else x2
    if x1.ndim != 1 or x2.ndim != 1:
        raise InvalidValueError(f"linalg.outer takes two vectors, got shapes {x1.shape} and {x2.shape}")
    return ops.reshape(x1, (x1.shape[0], 1)) * ops.reshape(x2, (1, x2.shape[0]))


def diagonal(x, /, *, offset: int = 0) -> Array:
    """The ``offset`` diagonal of each matrix (above the main one for offset > 0), a view's copy."""
    x = ops.asarray(x) if not isinstance(x, Node) else x
    if x.ndim < 2:
        raise InvalidValueError(f"linalg.diagonal takes a matrix or a stack of matrices, got shape {x.shape}")
    m, n = x.shape[-2:]
    if offset >= 0:
        start, count = offset, max(0, min(m, n - offset))
    else:
        start, count = -offset * n, max(0, min(m + offset, n))
    flat = ops.reshape(x, x.shape[:-2] + (m * n,))
    if count == 0:
        return ops.zeros(x.shape[:-2] + (0,), x.dtype, x.ctx)
    return flat[..., start:start + (count - 1) * (n + 1) + 1:n + 1]


def trace(x, /, *, offset: int = 0, dtype=None) -> Array:
    """Sums of the ``offset`` diagonal."""
    x = ops.asarray(x) if not isinstance(x, Node) else x
    return _api.sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def cross(x1, x2, /, *, axis: int = -1) -> Array:
    """Cross products of 3-vectors along ``axis`` (broadcast)."""
    a, b, _ = ops.operands(x1, x2)
    if a.dtype is _dt.bool_:
        raise InvalidTypeError(f"linalg.cross takes numeric arrays, got {a.dtype.name}")
    if axis >= 0:
        raise InvalidValueError("linalg.cross: axis must be negative (counted from the end of the broadcast shape)")
    if -axis > min(a.ndim, b.ndim) or a.shape[axis] != 3 or b.shape[axis] != 3:
        raise InvalidValueError(f"linalg.cross takes vectors of 3 along axis {axis}, got shapes {a.shape} "
                                f"and {b.shape}")
    a, b = _api.moveaxis(a, axis, -1), _api.moveaxis(b, axis, -1)
    a0, a1, a2 = a[..., 0], a[..., 1], a[..., 2]
    b0, b1, b2 = b[..., 0], b[..., 1], b[..., 2]
    c = _api.stack([a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0], axis=-1)
    return _api.moveaxis(c, -1, axis)


# -- gradients (runtime/autodiff.py calls vjp for "linalg_result" nodes) ----------------------------

def _t(x: Array) -> Array:
    return _api.matrix_transpose(x)


def _h(x: Array) -> Array:
    return ops.conj(_api.matrix_transpose(x))


def _sym(x: Array) -> Array:
    """The transpose of making a matrix Hermitian, (dA + dA^H) / 2, in JAX's convention."""
    return (x + _h(x)) * 0.5


def _tril_half(x: Array) -> Array:
    """The lower triangle with its diagonal halved."""
    n = x.shape[-1]
    return _api.tril(x) - _api.eye(n, dtype=x.dtype, device=x.ctx) * x * 0.5


def vjp(node: Array, k: int, g: Array) -> Array | None:
    """The cotangent of a decomposition's input k given its result's cotangent g (JAX's convention)."""
    tag, count = node.params[:2]
    if k == 0 or k > count:
        return None
    inputs = node.inputs[1:1 + count]
    outs = node.inputs[1 + count:] or (node,)  # (a factor finished by the node itself is its value)
    x = inputs[k - 1]
    name = tag[0]
    if name == "inv":
        xi = outs[0]
        return -ops.matmul(ops.matmul(_t(xi), g), _t(xi))
    if name == "solve":
        a, b = inputs
        out = outs[0]
        vector = tag[1]
        gb = solve(_t(a), g if not vector else g)
        if k == 2:
            return _unbatch(gb, b.shape)
        gm = ops.reshape(gb, gb.shape + (1,)) if vector else gb
        om = ops.reshape(out, out.shape + (1,)) if vector else out
        return _unbatch(-ops.matmul(gm, _t(om)), a.shape)
    if name == "det":
        d = outs[0]
        return ops.reshape(g * d, d.shape + (1, 1)) * _t(inv(x))
    if name == "logabsdet":
        xinv = _t(inv(x))  # (complex: the rule of log det, holomorphic, through the real part)
        return ops.reshape(ops.astype(g, x.dtype), g.shape + (1, 1)) * xinv
    if name == "cholesky":  # JAX's rule: dL = L phi(L^-1 dA L^-H), dA made Hermitian first
        upper = tag[1]
        lower = _h(outs[0]) if upper else outs[0]
        gl = _h(g) if upper else g
        p = _tril_half(ops.matmul(_t(lower), gl))
        li = inv(lower)
        s = ops.matmul(ops.matmul(_t(li), p), ops.conj(li))
        return _sym(s)
    if name == "eigh":  # JAX's rule: dw = re diag(V^H dA V), dV = V (F o (V^H dA V)), dA made Hermitian
        w, v = outs
        if tag[1] == 0:
            inner = ops.astype(g, v.dtype) if v.dtype.is_complex else g
            return _sym(ops.matmul(ops.conj(v) * ops.expand_dims(inner, -2), _t(v)))
        diff = ops.expand_dims(w, -2) - ops.expand_dims(w, -1)  # w_j - w_i
        f = ops.where(ops.equal(diff, 0), 0, 1 / ops.where(ops.equal(diff, 0), 1, diff))
        if v.dtype.is_complex:
            f = ops.astype(f, v.dtype)
        return _sym(ops.matmul(ops.matmul(ops.conj(v), f * ops.matmul(_t(v), g)), _t(v)))
    if name == "svd":  # the transpose of JAX's JVP of the reduced SVD, complex parts included
        u, s, vh = outs
        conj_v_t = ops.conj(vh)  # V^T
        cast = (lambda y: ops.astype(y, u.dtype)) if u.dtype.is_complex else (lambda y: y)
        if tag[1] == 1:
            return ops.matmul(ops.conj(u) * ops.expand_dims(cast(g), -2), conj_v_t)
        k = s.shape[-1]
        s2 = s * s
        diff = ops.expand_dims(s2, -2) - ops.expand_dims(s2, -1)  # s_j^2 - s_i^2
        f = cast(ops.where(ops.equal(diff, 0), 0, 1 / ops.where(ops.equal(diff, 0), 1, diff)))
        s_inv = cast(ops.where(ops.equal(s, 0), 0, 1 / ops.where(ops.equal(s, 0), 1, s)))
        if tag[1] == 0:
            kk = ops.matmul(_t(u), g)
            fk = f * kk
            diagonal_part = kk * _api.eye(k, dtype=kk.dtype, device=kk.ctx) * ops.expand_dims(s_inv, -2)
            ds = (fk + _h(fk)) * ops.expand_dims(cast(s), -2) + (diagonal_part - _h(diagonal_part)) * 0.5
            result = ops.matmul(ops.matmul(ops.conj(u), ds), conj_v_t)
            if u.shape[-2] > k:
                proj = g - ops.matmul(ops.conj(u), kk)
                result = result + ops.matmul(proj * ops.expand_dims(s_inv, -2), conj_v_t)
            return result
        gv = _h(g)  # the cotangent of V
        kk = ops.matmul(conj_v_t, gv)
        fk = f * kk
        ds = ops.expand_dims(cast(s), -1) * (fk + _h(fk))
        result = ops.matmul(ops.matmul(ops.conj(u), ds), conj_v_t)
        if vh.shape[-1] > k:
            proj = gv - ops.matmul(_t(vh), kk)
            result = result + _h(ops.matmul(proj * ops.expand_dims(s_inv, -2), _t(u)))
        return result
    if name == "qr":  # the transpose of JAX's JVP (j-towns' derivation), complex parts included
        q, r = outs
        if q.shape[-2] < r.shape[-1]:
            raise hal.UnimplementedError("linalg: no gradient of qr of wide matrices (more columns than rows)")
        gq = g if tag[1] == 0 else ops.zeros(q.shape, q.dtype, q.ctx)
        gr = g if tag[1] == 1 else ops.zeros(r.shape, r.dtype, r.ctx)
        c = ops.matmul(_t(q), gq) - ops.matmul(gr, _t(r))
        eye = _api.eye(c.shape[-1], dtype=c.dtype, device=c.ctx)
        cy = -c + _api.tril(c, k=-1) - _api.tril(_h(c), k=-1)
        if c.dtype.is_complex:
            cy = cy + (c - ops.conj(c)) * 0.5 * eye  # (the diagonal's imaginary parts)
        b = gq + ops.matmul(ops.conj(q), cy)
        return _t(solve(r, _t(b)))
    raise hal.UnimplementedError(f"linalg: no gradient rule for {name}")


def _unbatch(g: Array, shape: tuple) -> Array:
    """g summed over the leading dims broadcasting added to an operand of ``shape``."""
    extra = g.ndim - len(shape)
    if extra > 0:
        g = ops.sum(g, axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape)) if b == 1 and a != 1)
    if axes:
        g = ops.sum(g, axis=axes, keepdims=True)
    return g
