"""`cumsum` / `cumprod`: the running sum or product along the rows of a contiguous (rows, n) array
(``cumulative_sum``, ``cumulative_prod``; what follows says sums, products are scanned the same way).

A workgroup scans a tile of TILE elements at a time: the tile is read coalesced into shared memory,
each thread scans its ITEMS consecutive elements in registers, the threads' totals are scanned
across each warp by shuffles, and the warps' totals are added in order by every thread; the tile is
written back coalesced, offset by the carry of the tiles before it. So a row is read once and
written once whatever its length.

Many rows (FEW_ROWS or more) take one dispatch, a workgroup a row. Fewer long rows would leave most
of the GPU idle that way, so they are cut into chunks of CHUNK elements scanned in three dispatches
(reduce, then scan): each chunk's total, the running sum of the totals along each row (this same
kernel, on rows of totals), then each chunk's scan started from the totals before it. That reads the
input twice and writes it once, with every multiprocessor busy, instead of a few workgroups walking
the rows alone.

Floats accumulate in float32 (float64 for float64: narrower floats round once, at the store, rather
than at each step as numpy's float16 loop does); integers in 64-bit unsigned arithmetic, whose
wrap-around truncates to the same values as numpy's running sum (or product) in the dtype. Complex
and boolean scans take the log-step composition of ``array_api._cumulative``.
"""

from __future__ import annotations

import numpy as np

import hal

from .. import dtypes as _dt
from .cuda_common import load_expr, store_expr
from .numpy_util import store, to_compute
from .source import MAX_WORKGROUPS, KernelSource, rows_of, source

DTYPES = tuple(d for d in _dt.ALL if not d.is_complex and d is not _dt.bool_)
#: Elements a workgroup scans at a time, ITEMS a thread (TILE / ITEMS threads a workgroup).
TILE = 2048
ITEMS = 8
#: Tiles a chunk of a long row holds (a chunk is a workgroup's share of it).
CHUNK_TILES = 2
#: Rows at which each row is a workgroup's, whatever its length: enough workgroups to fill the GPU.
FEW_ROWS = 512


def chunk() -> int:
    """Elements of a chunk of a long row, as the kernels are built now."""
    return TILE * CHUNK_TILES


def acc_dtype(dt):
    """The runtime dtype the running sum is kept in (the chunks' totals are stored in it)."""
    if dt is _dt.float64:
        return _dt.float64
    return _dt.float32 if dt.is_float else _dt.uint64


def scan_source(dt, op: str = "cumsum") -> KernelSource:
    """The running sums (``op`` "cumsum") or products ("cumprod") of rows of `dt`."""
    tile, items, chunk_tiles = TILE, ITEMS, CHUNK_TILES  # (as they are now: the source may be built later)
    threads = tile // items
    key = (op, dt.name, tile, items, chunk_tiles)
    code = dt.code
    exports = [hal.Export(f"{op}_{code}", (threads, 1, 1), 2, 3),
               hal.Export(f"{op}_totals_{code}", (threads, 1, 1), 2, 4),
               hal.Export(f"{op}_chunks_{code}", (threads, 1, 1), 3, 4)]
    return source(key, lambda: KernelSource(key, exports, lambda: _cuda(dt, op, tile, items, chunk_tiles),
                                            lambda: _numpy_fns(dt, op, tile * chunk_tiles)))


#: Per op: how two values combine (C, the operator), and the identity.
_COMBINE = {"cumsum": ("+", "0"), "cumprod": ("*", "1")}


def _cuda(dt, op: str, tile: int, items: int, chunk_tiles: int) -> str:
    acc = acc_dtype(dt).c_storage
    st = dt.c_storage
    code = dt.code
    o_, one = _COMBINE[op]
    ident = f"({acc}){one}"
    load = f"({acc})({load_expr(dt, 'in[base + i]')})"
    return f"""
#define SP(i) ((i) + ((i) >> 5))  // a padded slot: a thread's {items} consecutive slots fall on distinct banks

// Scans the tile in buf (padded slots) in place, each slot becoming carry + its inclusive running sum;
// returns carry + the tile's total (in every thread). wsum holds a value a warp.
__device__ {acc} {op}_tile_{code}({acc}* buf, {acc}* wsum, {acc} carry) {{
  const u32 t = threadIdx.x, lane = t % RT_WARP, w = t / RT_WARP, warps = (blockDim.x + RT_WARP - 1) / RT_WARP;
  {acc} v[{items}];
  {acc} s = {ident};
  #pragma unroll
  for (u32 e = 0; e < {items}u; ++e) {{ s = s {o_} buf[SP(t * {items}u + e)]; v[e] = s; }}
  {acc} ws = s;  // the warp's inclusive scan of the threads' totals
  for (u32 o = 1; o < RT_WARP; o <<= 1) {{
    const {acc} u = RT_SHFL_UP(ws, o);
    if (lane >= o) ws = ws {o_} u;
  }}
  {acc} before = RT_SHFL_UP(ws, 1);
  if (lane == 0) before = {ident};
  if (lane == RT_WARP - 1 || t == blockDim.x - 1) wsum[w] = ws;
  __syncthreads();
  {acc} pre = carry, total = carry;
  for (u32 k = 0; k < warps; ++k) {{
    if (k < w) pre = pre {o_} wsum[k];
    total = total {o_} wsum[k];
  }}
  pre = pre {o_} before;
  #pragma unroll
  for (u32 e = 0; e < {items}u; ++e) buf[SP(t * {items}u + e)] = pre {o_} v[e];
  __syncthreads();
  return total;
}}

// The running sums of in[base, base + len) into out[base, ...), from `carry`, a tile at a time.
__device__ void {op}_span_{code}({st}* __restrict__ out, const {st}* __restrict__ in, u64 base, u32 len,
                                   {acc} carry, {acc}* buf, {acc}* wsum) {{
  const u32 t = threadIdx.x, T = blockDim.x;
  for (u32 start = 0; start < len; start += {tile}u) {{
    #pragma unroll
    for (u32 e = 0; e < {items}u; ++e) {{
      const u32 i = start + e * T + t;
      buf[SP(e * T + t)] = i < len ? {load} : {ident};
    }}
    __syncthreads();
    carry = {op}_tile_{code}(buf, wsum, carry);
    #pragma unroll
    for (u32 e = 0; e < {items}u; ++e) {{
      const u32 i = start + e * T + t;
      if (i < len) out[base + i] = {store_expr(dt, "buf[SP(e * T + t)]")};
    }}
    __syncthreads();  // (every slot is stored before the next tile is loaded over it)
  }}
}}

// A workgroup a row: rows of n elements from in[ioff].
extern "C" __global__ void {op}_{code}({st}* __restrict__ out, const {st}* __restrict__ in,
                                         u32 rows, u32 n, u32 ioff) {{
  __shared__ {acc} buf[{tile} + {tile} / 32];
  __shared__ {acc} wsum[{tile // items} / 32 + 1];
  for (u32 r = blockIdx.x; r < rows; r += gridDim.x)
    {op}_span_{code}(out, in + ioff, (u64)r * n, n, {ident}, buf, wsum);
}}

// Each chunk's total: tot[r * chunks + c] of row r's elements [c * CHUNK, (c + 1) * CHUNK).
extern "C" __global__ void {op}_totals_{code}({acc}* __restrict__ tot, const {st}* __restrict__ in,
                                                u32 rows, u32 n, u32 ioff, u32 chunks) {{
  __shared__ {acc} wsum[{tile // items} / 32 + 1];
  const u32 t = threadIdx.x, T = blockDim.x, lane = t % RT_WARP, w = t / RT_WARP;
  const u32 warps = (T + RT_WARP - 1) / RT_WARP;
  in += ioff;
  for (u32 b = blockIdx.x; b < rows * chunks; b += gridDim.x) {{
    const u32 r = b / chunks, c = b % chunks;
    const u32 first = c * {tile * chunk_tiles}u;
    const u32 len = min({tile * chunk_tiles}u, n - first);
    const u64 base = (u64)r * n + first;
    {acc} s = {ident};
    for (u32 start = 0; start < len; start += {tile}u) {{
      #pragma unroll
      for (u32 e = 0; e < {items}u; ++e) {{
        const u32 i = start + e * T + t;
        if (i < len) s = s {o_} {load};
      }}
    }}
    for (u32 o = RT_WARP / 2; o > 0; o >>= 1) {{
      const {acc} u = RT_SHFL_DOWN(s, o);
      if (lane + o < RT_WARP && t + o < T) s = s {o_} u;
    }}
    if (lane == 0) wsum[w] = s;
    __syncthreads();
    if (t == 0) {{
      {acc} total = {ident};
      for (u32 k = 0; k < warps; ++k) total = total {o_} wsum[k];
      tot[b] = total;
    }}
    __syncthreads();  // (wsum is read before the next chunk writes it)
  }}
}}

// Each chunk's running sums, from the running sum of the row's chunk totals before it (scanned: the
// inclusive running sums of tot along each row).
extern "C" __global__ void {op}_chunks_{code}({st}* __restrict__ out, const {st}* __restrict__ in,
                                                const {acc}* __restrict__ scanned, u32 rows, u32 n, u32 ioff,
                                                u32 chunks) {{
  __shared__ {acc} buf[{tile} + {tile} / 32];
  __shared__ {acc} wsum[{tile // items} / 32 + 1];
  for (u32 b = blockIdx.x; b < rows * chunks; b += gridDim.x) {{
    const u32 r = b / chunks, c = b % chunks;
    const u32 first = c * {tile * chunk_tiles}u;
    const {acc} carry = c ? scanned[b - 1] : {ident};
    {op}_span_{code}(out, in + ioff, (u64)r * n + first, min({tile * chunk_tiles}u, n - first), carry, buf, wsum);
  }}
}}
"""


def _numpy_fns(dt, op: str, chunk_len: int) -> dict:
    acc = np.dtype(acc_dtype(dt).storage)
    code = dt.code
    scan, total, one = (np.cumsum, np.sum, 0) if op == "cumsum" else (np.cumprod, np.prod, 1)

    def rows_in(bindings, k: int, rows: int, n: int, ioff: int) -> np.ndarray:
        x = to_compute(np.frombuffer(bindings[k], dtype=dt.storage, count=rows * n, offset=ioff * dt.itemsize), dt)
        return x.reshape(rows, n).astype(acc)

    def scan_rows(wg, bindings, c):
        rows, n, ioff = c
        with np.errstate(over="ignore", invalid="ignore"):
            sums = scan(rows_in(bindings, 1, rows, n, ioff), axis=1, dtype=acc)
        store(np.frombuffer(bindings[0], dtype=dt.storage, count=rows * n).reshape(rows, n), sums, dt)

    def totals(wg, bindings, c):
        rows, n, ioff, chunks = c
        x = rows_in(bindings, 1, rows, n, ioff)
        padded = np.full((rows, chunks * chunk_len), one, acc)
        padded[:, :n] = x
        with np.errstate(over="ignore", invalid="ignore"):
            sums = total(padded.reshape(rows, chunks, chunk_len), axis=2, dtype=acc)
        np.frombuffer(bindings[0], dtype=acc, count=rows * chunks)[:] = sums.ravel()

    def chunked(wg, bindings, c):
        rows, n, ioff, chunks = c
        x = rows_in(bindings, 1, rows, n, ioff)
        scanned = np.frombuffer(bindings[2], dtype=acc, count=rows * chunks).reshape(rows, chunks)
        carries = np.repeat(np.concatenate([np.full((rows, 1), one, acc), scanned[:, :-1]], axis=1), chunk_len,
                            axis=1)[:, :n]
        padded = np.full((rows, chunks * chunk_len), one, acc)
        padded[:, :n] = x
        with np.errstate(over="ignore", invalid="ignore"):
            sums = scan(padded.reshape(rows, chunks, chunk_len), axis=2, dtype=acc).reshape(rows, -1)[:, :n]
            sums = sums + carries if op == "cumsum" else sums * carries
        store(np.frombuffer(bindings[0], dtype=dt.storage, count=rows * n).reshape(rows, n), sums, dt)

    return {f"{op}_{code}": scan_rows, f"{op}_totals_{code}": totals, f"{op}_chunks_{code}": chunked}


def plan(node, layouts: list, ctx) -> list:
    if node.size == 0:
        return []
    rows, n, ioff = rows_of(node, layouts)
    dt = node.dtype
    op = node.op  # "cumsum" or "cumprod"
    src = scan_source(dt, op)
    code = dt.code
    size = chunk()
    if n <= size or rows >= FEW_ROWS or not ctx.is_gpu:  # (a CPU driver scans any row at once)
        return [("dispatch", src, f"{op}_{code}", (min(rows, MAX_WORKGROUPS), 1, 1), [rows, n, ioff],
                 [("out",), ("in", 0)])]
    chunks = -(-n // size)
    groups = (min(rows * chunks, MAX_WORKGROUPS), 1, 1)
    acc = acc_dtype(dt)
    totals, scanned = ("tmp", 0), ("tmp", 1)
    return [("temps", [rows * chunks * acc.itemsize] * 2),
            ("dispatch", src, f"{op}_totals_{code}", groups, [rows, n, ioff, chunks], [totals, ("in", 0)]),
            ("barrier",),
            ("dispatch", scan_source(acc, op), f"{op}_{acc.code}", (min(rows, MAX_WORKGROUPS), 1, 1), [rows, chunks, 0],
             [scanned, totals]),
            ("barrier",),
            ("dispatch", src, f"{op}_chunks_{code}", groups, [rows, n, ioff, chunks], [("out",), ("in", 0), scanned])]
