"""Batched matmul with broadcast batch dims: the device's vendor GEMM (cuBLASLt, hipBLASLt) on
GPUs that have one, else a tiled shared-memory kernel; numpy matmul (its BLAS) on CPU.

A product goes to the library (``plan_library``: a ``hal.Gemm`` dispatch of a ``library``
executable) when the device lists the ``library`` format, the dtype is a float the libraries
take, and each operand is a matrix with a unit stride in one of its two dims (a row-major or a
transposed matrix, as views and transposes make them) and one collapsed batch dim at most.
float32 products are IEEE float32 unless ``set_float32_matmul_precision("high")`` asked for
TF32 (``matmul_precision``); the choice is the node's parameter, so it is part of the graph key.

Matrix-vector products (one output column or row, no batch) take a GEMV kernel on GPUs
instead: the tiled kernel would idle 15 of every 16 threads and walk K in one block per
16 outputs. `gemv_rows` gives every output a warp reading its row contiguously;
`gemv_cols`, for matrices whose rows are strided (a transposed operand), gives 32
neighbouring outputs one block whose 32 thread rows split K and sum in shared memory;
`gemv_colsk`, the same code for few outputs and a long K, 4 outputs and 256 thread rows.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

import hal

from .. import dtypes as _dt
from ..shapes import broadcast_strides, collapse, contiguous_strides, size_of
from .complex import SOURCE as COMPLEX_SOURCE
from .complex import shfl_down
from .cuda_common import load_expr, store_expr
from .numpy_util import ERRSTATE, signed, store, strided_view, to_compute
from .source import WORKGROUP, KernelSource, executable, source, u32

TILE = 16
MAX_BATCH = 6
_NCONST = 4 + MAX_BATCH + 2 * (3 + MAX_BATCH)
_NCONST_GEMV = 7  # M, K, matrix offset, row stride, column stride, vector offset, vector stride
GEMV_COLS_BLOCK = (32, 32, 1)
#: gemv_colsk: few outputs and a long K (X.T @ v of a 1000 x 100 X) split K over 256 threads per
#: output group, so that more blocks share the work: 2.8 us on an H100 against 7.6 us with
#: GEMV_COLS_BLOCK's four blocks (cuBLAS: 2.8 us). Used up to GEMV_COLSK_MAX_M outputs, from
#: GEMV_COLSK_MIN_K on; wider products fill the GPU with 32-output blocks, whose rows are whole sectors.
GEMV_COLSK_BLOCK = (4, 256, 1)
GEMV_COLSK_MAX_M = 1024
GEMV_COLSK_MIN_K = 256


def matmul_source(dt) -> KernelSource:
    key = ("matmul", dt.name)
    return source(key, lambda: KernelSource(
        key, [hal.Export(f"matmul_{dt.code}", (TILE, TILE, 1), 3, _NCONST),
              hal.Export(f"gemv_rows_{dt.code}", (WORKGROUP, 1, 1), 3, _NCONST_GEMV),
              hal.Export(f"gemv_cols_{dt.code}", GEMV_COLS_BLOCK, 3, _NCONST_GEMV),
              hal.Export(f"gemv_colsk_{dt.code}", GEMV_COLSK_BLOCK, 3, _NCONST_GEMV)],
        lambda: (COMPLEX_SOURCE if dt.is_complex else "") + _cuda(dt) + _cuda_gemv(dt), lambda: _numpy(dt)))


def _acc(dt) -> str:
    """C type products are summed in: float for the narrow floats, the dtype's compute type otherwise
    (integer sums wrap in the dtype as numpy's do; bool sums are counts, tested against zero)."""
    if dt.is_float:
        return "double" if dt is _dt.float64 else "float"
    return "int" if dt is _dt.bool_ else dt.c_compute  # (complex: its struct)


def _np_matmul(a: np.ndarray, b: np.ndarray, dt) -> np.ndarray:
    """numpy's matmul in the dtype the GPU kernels accumulate in."""
    if dt is _dt.bool_:
        return np.matmul(a.astype(np.int32), b.astype(np.int32)) != 0
    if dt is _dt.float16 or dt is _dt.bfloat16:
        return np.matmul(a.astype(np.float32), b.astype(np.float32))
    return np.matmul(a, b)


def _cuda_gemv(dt) -> str:
    """out[i] = sum_k mat[moff + i*rs + k*cs] * vec[voff + k*vs] for i < M."""
    acc = _acc(dt)
    params = (f"{dt.c_storage}* __restrict__ out, const {dt.c_storage}* __restrict__ mat, "
              f"const {dt.c_storage}* __restrict__ vec, u32 M, u32 K, u32 moff, u32 rs, u32 cs, u32 voff, u32 vs")
    def term(k: str) -> str:
        m = load_expr(dt, f"mat[base + (i64){k} * (int)cs]")
        v = load_expr(dt, f"vec[(i64)voff + (i64){k} * (int)vs]")
        return f"({acc})({m}) * ({acc})({v})"

    return f"""
extern "C" __global__ void gemv_rows_{dt.code}({params}) {{
  const u32 lane = threadIdx.x % RT_WARP, warps = blockDim.x / RT_WARP;
  for (u32 i = blockIdx.x * warps + threadIdx.x / RT_WARP; i < M; i += gridDim.x * warps) {{
    const i64 base = (i64)moff + (i64)i * (int)rs;
    {acc} s0 = 0, s1 = 0;
    u32 k = lane;
    for (; k + RT_WARP < K; k += 2 * RT_WARP) {{
      const u32 k1 = k + RT_WARP;
      s0 += {term("k")};
      s1 += {term("k1")};
    }}
    if (k < K) s0 += {term("k")};
    {acc} s = s0 + s1;
    for (int o = RT_WARP / 2; o > 0; o /= 2) s += {shfl_down(dt, "s", "o")};
    if (lane == 0) out[i] = {store_expr(dt, "s")};
  }}
}}
{_gemv_cols(f'gemv_cols_{dt.code}', GEMV_COLS_BLOCK, params, term, acc, dt)}
{_gemv_cols(f'gemv_colsk_{dt.code}', GEMV_COLSK_BLOCK, params, term, acc, dt)}
"""


def _gemv_cols(name: str, block: tuple, params: str, term, acc: str, dt) -> str:
    """out[i] for strided matrix rows: blockDim.x neighbouring outputs a block, blockDim.y threads
    splitting K, summed in shared memory."""
    cx, cy = block[0], block[1]
    return f"""extern "C" __global__ void {name}({params}) {{
  __shared__ {acc} part[{cy}][{cx + 1}];
  const u32 tx = threadIdx.x, ty = threadIdx.y;
  const u32 i = blockIdx.x * blockDim.x + tx;
  {acc} s = 0;
  if (i < M) {{
    const i64 base = (i64)moff + (i64)i * (int)rs;
    for (u32 k = ty; k < K; k += blockDim.y) s += {term("k")};
  }}
  part[ty][tx] = s;
  __syncthreads();
  for (u32 h = blockDim.y / 2; h > 0; h /= 2) {{
    if (ty < h) part[ty][tx] += part[ty + h][tx];
    __syncthreads();
  }}
  if (ty == 0 && i < M) out[i] = {store_expr(dt, "part[0][tx]")};
}}
"""


def _cuda(dt) -> str:
    acc = _acc(dt)
    params = [f"{dt.c_storage}* __restrict__ out", f"const {dt.c_storage}* __restrict__ a",
              f"const {dt.c_storage}* __restrict__ b", "u32 M", "u32 N", "u32 K", "u32 nbd"]
    params += [f"u32 bs{i}" for i in range(MAX_BATCH)]
    for p in ("a", "b"):
        params += [f"u32 {p}off", f"u32 {p}r", f"u32 {p}c"] + [f"u32 {p}b{i}" for i in range(MAX_BATCH)]
    bs = ", ".join(f"bs{i}" for i in range(MAX_BATCH))
    ab = ", ".join(f"(int)ab{i}" for i in range(MAX_BATCH))
    bb = ", ".join(f"(int)bb{i}" for i in range(MAX_BATCH))
    la = load_expr(dt, "a[pa + (i64)row * (int)ar + (i64)(k0 + tx) * (int)ac]")
    lb = load_expr(dt, "b[pb + (i64)(k0 + ty) * (int)br + (i64)col * (int)bc]")
    return f"""
extern "C" __global__ void matmul_{dt.code}({", ".join(params)}) {{
  __shared__ {acc} As[{TILE}][{TILE + 1}];
  __shared__ {acc} Bs[{TILE}][{TILE + 1}];
  const u32 bsh[{MAX_BATCH}] = {{{bs}}};
  const int sa[{MAX_BATCH}] = {{{ab}}};
  const int sb[{MAX_BATCH}] = {{{bb}}};
  const u32 tx = threadIdx.x, ty = threadIdx.y;
  const u32 row = blockIdx.y * {TILE} + ty, col = blockIdx.x * {TILE} + tx;
  const u32 batch = blockIdx.z;
  i64 pa = aoff, pb = boff;
  u32 rem = batch;
  #pragma unroll
  for (int d = {MAX_BATCH - 1}; d >= 0; --d) {{
    if (d < (int)nbd) {{
      u32 q = rem / bsh[d]; u32 c_ = rem - q * bsh[d]; rem = q;
      pa += (i64)c_ * sa[d]; pb += (i64)c_ * sb[d];
    }}
  }}
  {acc} sum = 0;
  for (u32 k0 = 0; k0 < K; k0 += {TILE}) {{
    As[ty][tx] = (row < M && k0 + tx < K) ? ({acc})({la}) : ({acc})0;
    Bs[ty][tx] = (k0 + ty < K && col < N) ? ({acc})({lb}) : ({acc})0;
    __syncthreads();
    #pragma unroll
    for (int kk = 0; kk < {TILE}; ++kk) sum += As[ty][kk] * Bs[kk][tx];
    __syncthreads();
  }}
  if (row < M && col < N) out[(u64)batch * M * N + (u64)row * N + col] = {store_expr(dt, "sum")};
}}
"""


def _numpy(dt) -> dict:
    fns = {f"matmul_{dt.code}": _run_f32 if dt is _dt.float32 else _general(dt)}
    fns[f"gemv_rows_{dt.code}"] = fns[f"gemv_cols_{dt.code}"] = fns[f"gemv_colsk_{dt.code}"] = _gemv(dt)
    return fns


def _gemv(dt):
    def run(wg, bindings, c):
        M, K, moff, rs, cs, voff, vs = c[0], c[1], c[2], signed(c[3]), signed(c[4]), c[5], signed(c[6])
        mat = to_compute(strided_view(bindings[1], dt, (M, K), (rs, cs), moff), dt)
        vec = to_compute(strided_view(bindings[2], dt, (K,), (vs,), voff), dt)
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=M)
        with np.errstate(**ERRSTATE):
            store(out, _np_matmul(mat, vec, dt), dt)
    return run


def _f32_operands(bindings, c) -> tuple:
    """(a, b, out) views of an unbatched float32 product."""
    M, N, K = c[0], c[1], c[2]
    b0 = 4 + MAX_BATCH
    b1 = b0 + 3 + MAX_BATCH
    a = np.ndarray((M, K), np.float32, bindings[1], c[b0] * 4, (signed(c[b0 + 1]) * 4, signed(c[b0 + 2]) * 4))
    if N == 1:
        b = np.ndarray((K,), np.float32, bindings[2], c[b1] * 4, (signed(c[b1 + 1]) * 4,))
        return a, b, np.frombuffer(bindings[0], np.float32, M)
    b = np.ndarray((K, N), np.float32, bindings[2], c[b1] * 4, (signed(c[b1 + 1]) * 4, signed(c[b1 + 2]) * 4))
    return a, b, np.frombuffer(bindings[0], np.float32, M * N).reshape(M, N)


def _run_f32(wg, bindings, c):
    """float32: BLAS through np.matmul on strided views (no conversions, no warnings to silence)."""
    if c[3] == 0:
        a, b, out = _f32_operands(bindings, c)
        np.matmul(a, b, out=out)
        return
    _general(_dt.float32)(wg, bindings, c)


def _prepare_f32(wg, bindings, c):
    """The product bound once to its views (see cpu_program); None for batched products."""
    if c[3] != 0:
        return None
    a, b, out = _f32_operands(bindings, c)
    # np.dot: the same BLAS product for 2-d operands into a contiguous output, ~0.5 us less per call
    return functools.partial(np.dot, a, b, out)  # (out positionally: no keyword dict per call)


_run_f32.prepare = _prepare_f32


def _general(dt):
    def run(wg, bindings, c):
        M, N, K, nbd = c[0], c[1], c[2], c[3]
        bshape = tuple(c[4:4 + nbd])
        views = []
        for i, base in enumerate((4 + MAX_BATCH, 4 + MAX_BATCH + 3 + MAX_BATCH)):
            off, rs, cs = c[base], signed(c[base + 1]), signed(c[base + 2])
            bst = tuple(signed(s) for s in c[base + 3:base + 3 + nbd])
            shape = bshape + ((M, K) if i == 0 else (K, N))
            views.append(strided_view(bindings[1 + i], dt, shape, bst + (rs, cs), off))
        nb = size_of(bshape)
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=nb * M * N).reshape(bshape + (M, N))
        a, b = (to_compute(v, dt) for v in views)
        with np.errstate(**ERRSTATE):
            if dt is _dt.float32 or dt is _dt.int32:
                np.matmul(a, b, out=out)
            else:
                store(out, _np_matmul(a, b, dt), dt)
    return run


#: dtypes whose products the GPU libraries compute (float accumulation for the 16-bit ones).
LIBRARY_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16", "complex64", "complex128"})
#: Those whose products take the libraries' epilogues (runtime/lowering/epilogues.py): the real ones.
EPILOGUE_DTYPES = frozenset({"float32", "float64", "float16", "bfloat16"})
#: float32 matmul precision: "highest" (IEEE float32, numpy's and PyTorch's default) or "high" (TF32).
_float32_precision = ["highest"]


def set_float32_matmul_precision(precision: str) -> None:
    """float32 products from now on: "highest" (IEEE float32, the default) or "high" (TF32 tensor
    cores where the device's GEMM library has them: about 8x faster, 10-bit mantissas), as
    ``torch.set_float32_matmul_precision``. "medium" is taken as "high"."""
    if precision not in ("highest", "high", "medium"):
        raise ValueError(f"float32 matmul precision must be 'highest', 'high' or 'medium', got {precision!r}")
    _float32_precision[0] = precision


def get_float32_matmul_precision() -> str:
    return _float32_precision[0]


def matmul_precision(dt) -> str | None:
    """The matmul node's parameter for dtype ``dt``: "tf32" when float32 products may use TF32."""
    return "tf32" if dt is _dt.float32 and _float32_precision[0] != "highest" else None


class LibrarySource:
    """A ``hal.Gemm`` routine as the lowering's kernel source: a ``library`` executable of one export."""

    __slots__ = ("key", "routine", "export")

    def __init__(self, routine: hal.Gemm) -> None:
        self.routine = routine
        self.key = ("library", routine)
        self.export = "gemm"

    def specs(self, formats: tuple) -> list:
        return [hal.library_spec({self.export: self.routine})]

    def numpy_code(self) -> dict:
        return {self.export: self.routine.reference()}


def library_source(dtype_name: str, epilogue: str = "none", precision: str = "ieee") -> LibrarySource:
    return source(("gemm", dtype_name, epilogue, precision),
                  lambda: LibrarySource(hal.Gemm(dtype_name, epilogue=epilogue, precision=precision)))


def _matrix(rows: int, cols: int, rs: int, cs: int) -> tuple[bool, int] | None:
    """(stored transposed, leading dimension) of a rows x cols operand with element strides (rs, cs),
    or None when neither stride is a unit one (a broadcast or a strided slice: the own kernel)."""
    if cs == 1 or cols == 1:
        ld = rs if rows > 1 else cols
        if ld >= cols and (cs == 1 or rows == 1 or rs >= 1):
            return False, max(ld, cols)
    if rs == 1 or rows == 1:
        ld = cs if cols > 1 else rows
        if ld >= rows:
            return True, max(ld, rows)
    return None


def plan_library(node, layouts: list, ctx, epilogue: str = "none", out: int | None = None,
                 extra_roles: Sequence = ()) -> list | None:
    """The product as one library Gemm dispatch, or None when it does not fit one (see the module doc).

    A fold (runtime/lowering/epilogues.py) gives the Gemm's ``epilogue``, the node whose value the
    result is (``out``; default: the product's) and the roles of the bindings after C, A and B.
    """
    dt = node.dtype
    if not ctx.is_gpu or dt.name not in LIBRARY_DTYPES or not ctx.device.can_prepare("library"):
        return None
    (ashape, astr, aoff), (bshape, bstr, boff) = layouts
    M, N = node.shape[-2:]
    K = ashape[-1]
    batch = node.shape[:-2]
    if K == 0 or size_of(node.shape) == 0:
        return None
    ab = broadcast_strides(ashape[:-2], astr[:-2], batch)
    bb = broadcast_strides(bshape[:-2], bstr[:-2], batch)
    cshape, (ab, bb) = collapse(batch, [ab, bb])
    if len(cshape) > 1 or any(s < 0 for s in ab + bb):
        return None
    a = _matrix(M, K, astr[-2], astr[-1])
    b = _matrix(K, N, bstr[-2], bstr[-1])
    if a is None or b is None:
        return None
    nb = size_of(cshape)
    consts = hal.Gemm.constants_for(M, N, K, nb, transpose_a=a[0], transpose_b=b[0], lda=a[1], ldb=b[1],
                                    stride_a=ab[0] if cshape else 0, stride_b=bb[0] if cshape else 0)
    if any(c > 0xFFFFFFFF for c in consts):
        return None
    precision = "tf32" if node.params == "tf32" else "ieee"
    size = dt.itemsize
    roles = [("out",) if out is None else ("out", out), ("in_at", 0, aoff * size), ("in_at", 1, boff * size),
             *extra_roles]
    src = library_source(dt.name, epilogue, precision)
    if not _loadable(ctx, src):
        return None
    return [("dispatch", src, src.export, (1, 1, 1), consts, roles)]


def _loadable(ctx, src: LibrarySource) -> bool:
    """Whether the device runs ``src``'s routine (hipBLASLt has no float64 GEMM, say): a routine it
    refuses is remembered, and its products take the runtime's kernels."""
    refused = ("refused",) + src.key
    if refused in ctx.executables:
        return False
    try:
        executable(ctx, src)
    except (hal.UnimplementedError, hal.IncompatibleError):
        ctx.executables[refused] = None
        return False
    return True


def plan(node, layouts: list, ctx) -> list:
    library = plan_library(node, layouts, ctx)
    if library is not None:
        return library
    (ashape, astr, aoff), (bshape, bstr, boff) = layouts
    M, N = node.shape[-2:]
    K = ashape[-1]
    batch = node.shape[:-2]
    if size_of(node.shape) == 0:
        return []
    if K == 0:
        return [("fill", ("out",), 0, 1)]
    ab = broadcast_strides(ashape[:-2], astr[:-2], batch)
    bb = broadcast_strides(bshape[:-2], bstr[:-2], batch)
    cshape, (ab, bb) = collapse(batch, [ab, bb])
    if len(cshape) > MAX_BATCH:
        raise hal.InvalidArgumentError(f"matmul supports at most {MAX_BATCH} batch dimensions")
    nb = size_of(cshape)
    if nb > 65535:
        raise hal.InvalidArgumentError("matmul batch too large (at most 65535 matrices)")
    pad = [0] * (MAX_BATCH - len(cshape))
    consts = [M, N, K, len(cshape)] + list(cshape) + pad
    consts += [aoff, u32(astr[-2]), u32(astr[-1])] + [u32(s) for s in ab] + pad
    consts += [boff, u32(bstr[-2]), u32(bstr[-1])] + [u32(s) for s in bb] + pad
    src = matmul_source(node.dtype)
    if ctx.is_gpu and not cshape and (N == 1 or M == 1):
        return [_plan_gemv(node.dtype, src, M, N, K, (aoff, astr[-2], astr[-1]), (boff, bstr[-2], bstr[-1]))]
    wg = ((N + TILE - 1) // TILE, (M + TILE - 1) // TILE, nb)
    return [("dispatch", src, f"matmul_{node.dtype.code}", wg, consts, [("out",), ("in", 0), ("in", 1)])]


def _plan_gemv(dt, src, M, N, K, a, b) -> tuple:
    """One output column (N == 1): rows of A times B's column; one output row: B's columns times A's row."""
    (aoff, ar, ac), (boff, br, bc) = a, b
    if N == 1:
        count, mat, vec = M, (aoff, ar, ac), (boff, br)
        bindings = [("out",), ("in", 0), ("in", 1)]
    else:
        count, mat, vec = N, (boff, bc, br), (aoff, ac)
        bindings = [("out",), ("in", 1), ("in", 0)]
    moff, rs, cs = mat
    consts = [count, K, moff, u32(rs), u32(cs), vec[0], u32(vec[1])]
    if cs != 1 and rs == 1:
        name, block = f"gemv_cols_{dt.code}", GEMV_COLS_BLOCK
        if count <= GEMV_COLSK_MAX_M and K >= GEMV_COLSK_MIN_K:
            name, block = f"gemv_colsk_{dt.code}", GEMV_COLSK_BLOCK
        wg = ((count + block[0] - 1) // block[0], 1, 1)
        return ("dispatch", src, name, wg, consts, bindings)
    warps = WORKGROUP // 32
    return ("dispatch", src, f"gemv_rows_{dt.code}", (min((count + warps - 1) // warps, 65535), 1, 1), consts, bindings)


_ = contiguous_strides
