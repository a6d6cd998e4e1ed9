"""Stream compaction: the positions of a boolean array's True elements, in order, on the device
(``nonzero`` and boolean-mask indexing).

Three steps over tiles of TILE elements: ``mask_count`` counts each tile's True elements (one
workgroup a tile), a running sum of the counts (the scan kernel) gives each tile's first output, and
``compact`` has each workgroup find its elements' ranks within the tile (each thread's ITEMS
consecutive elements counted, then a scan of the threads' counts across warps by shuffles), gather their
positions in shared memory in order and write them out together. The mask is read twice and each
position written once; the count of True elements, which sizes the result, is the last running sum
(read on the host: the result's shape depends on it).
"""

from __future__ import annotations

import numpy as np

import hal

from .source import MAX_WORKGROUPS, KernelSource, source

THREADS = 256
ITEMS = 8
TILE = THREADS * ITEMS
#: Masks at most this long (32-bit positions and counts in the kernels); longer ones are compacted
#: on the host.
MAX_N = 1 << 31


def tiles(n: int) -> int:
    return -(-n // TILE)


def compact_source() -> KernelSource:
    key = ("compact", TILE)
    exports = [hal.Export("mask_count", (THREADS, 1, 1), 2, 2), hal.Export("compact", (THREADS, 1, 1), 3, 3)]
    return source(key, lambda: KernelSource(key, exports, _cuda, _numpy_fns))


def _cuda() -> str:
    return f"""
// The {ITEMS} mask bytes from `at` on, as nonzero flags (one 8-byte load where aligned).
__device__ __forceinline__ void mask_items(bool* set, const unsigned char* __restrict__ mask, u64 at, u32 n,
                                           u32 moff) {{
  if (((moff + at) & 7u) == 0u && at + {ITEMS}u <= n) {{
    const u64 bytes = *(const u64*)(mask + moff + at);
#pragma unroll
    for (u32 e = 0; e < {ITEMS}u; ++e) set[e] = ((bytes >> (8u * e)) & 0xFFu) != 0u;
  }} else {{
#pragma unroll
    for (u32 e = 0; e < {ITEMS}u; ++e) set[e] = at + e < n && mask[moff + at + e] != 0;
  }}
}}

// Each tile's count of nonzero mask bytes, as int64 (the scan kernel's input).
extern "C" __global__ void mask_count(long long* __restrict__ counts, const unsigned char* __restrict__ mask,
                                      u32 n, u32 moff) {{
  __shared__ u32 wsum[{THREADS} / 32 + 1];
  const u32 tiles = (n + {TILE}u - 1u) / {TILE}u;
  for (u32 b = blockIdx.x; b < tiles; b += gridDim.x) {{
    bool set[{ITEMS}];
    mask_items(set, mask, (u64)b * {TILE}u + threadIdx.x * {ITEMS}u, n, moff);
    u32 mine = 0u;
#pragma unroll
    for (u32 e = 0; e < {ITEMS}u; ++e) mine += set[e];
    u32 total;
    rt_block_exclusive(mine, wsum, &total);
    if (threadIdx.x == 0) counts[b] = (long long)total;
  }}
}}

// The positions of the nonzero mask bytes, in order: tile b's go from the running sum of the
// counts before it (ends: the inclusive running sums). Each thread reads its ITEMS consecutive bytes,
// the threads' counts are scanned (rt_block_exclusive), the tile's positions gathered in shared
// memory in order and written out together (coalesced).
extern "C" __global__ void compact(long long* __restrict__ out, const unsigned char* __restrict__ mask,
                                   const long long* __restrict__ ends, u32 n, u32 moff, u32 eoff) {{
  __shared__ u32 wsum[{THREADS} / 32 + 1];
  __shared__ u32 found[{TILE}];
  const u32 tiles = (n + {TILE}u - 1u) / {TILE}u;
  const u32 t = threadIdx.x;
  for (u32 b = blockIdx.x; b < tiles; b += gridDim.x) {{
    const u64 start = (u64)b * {TILE}u;
    const u32 first = t * {ITEMS}u;
    bool set[{ITEMS}];
    mask_items(set, mask, start + first, n, moff);
    u32 mine = 0u;
#pragma unroll
    for (u32 e = 0; e < {ITEMS}u; ++e) mine += set[e];
    u32 count;
    u32 at = rt_block_exclusive(mine, wsum, &count);
#pragma unroll
    for (u32 e = 0; e < {ITEMS}u; ++e)
      if (set[e]) found[at++] = first + e;
    __syncthreads();
    const u64 to = b ? (u64)ends[eoff + b - 1u] : 0ull;
    for (u32 q = t; q < count; q += blockDim.x) out[to + q] = (long long)(start + found[q]);
    __syncthreads();
  }}
}}
"""


def _numpy_fns() -> dict:
    def mask_count(wg, bindings, c):
        n, moff = c
        mask = np.frombuffer(bindings[1], dtype=np.uint8, count=n, offset=moff) != 0
        padded = np.zeros(tiles(n) * TILE, bool)
        padded[:n] = mask
        np.frombuffer(bindings[0], dtype=np.int64, count=tiles(n))[...] = padded.reshape(-1, TILE).sum(axis=1)

    def compact(wg, bindings, c):
        n, moff, _ = c
        where = np.flatnonzero(np.frombuffer(bindings[1], dtype=np.uint8, count=n, offset=moff))
        np.frombuffer(bindings[0], dtype=np.int64, count=where.size)[...] = where

    return {"mask_count": mask_count, "compact": compact}


def _groups(n: int) -> tuple:
    return (min(tiles(n), MAX_WORKGROUPS), 1, 1)


def plan_count(node, layouts: list, ctx) -> list:
    """A "mask_count" node: each tile's count of the contiguous boolean input's True elements."""
    (shape, _, moff), = layouts
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return []
    return [("dispatch", compact_source(), "mask_count", _groups(n), [n, moff], [("out",), ("in", 0)])]


def plan_compact(node, layouts: list, ctx) -> list:
    """A "compact" node: the positions of the True elements of input 0 (a contiguous boolean array),
    input 1 the inclusive running sums of its tiles' counts."""
    (shape, _, moff), (_, _, eoff) = layouts
    n = int(np.prod(shape, dtype=np.int64))
    if node.size == 0:
        return []
    return [("dispatch", compact_source(), "compact", _groups(n), [n, moff, eoff], [("out",), ("in", 0), ("in", 1)])]
