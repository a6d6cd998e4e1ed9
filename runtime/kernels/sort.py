"""`sort` and `argsort` along the rows of a contiguous (rows, n) array, and `searchsorted`, on the device.

Elements are compared by an order-preserving unsigned key made from their bits (``sort_keys.py``:
integers with the sign bit flipped; floats by sign and magnitude, -0.0 as 0.0, every NaN above +inf as
numpy sorts them), the key inverted for a descending sort, and ties broken by position: every pair
compares strictly, so the order is numpy's stable one (a descending sort keeps equal elements in their
order and puts NaNs first, as reversing a stable ascending sort of the flipped row does).

The sort is a merge sort. A workgroup sorts a tile of TILE elements in shared memory (a block merge
sort: ITEMS elements a thread sorted in registers, then merge levels on the merge path); rows of up to
TILE elements sort in that one dispatch, a tile holding TILE / n' rows (n' the power of two at or above
n). Longer rows sort their tiles into scratch, then each pass merges pairs of sorted runs (TILE, 2 TILE,
...) from one scratch pair of keys and positions into the other, each workgroup writing TILE outputs of
a pair; the last pass writes positions (argsort) or the elements at them (sort). A row of 2**15 floats
takes 1 + 4 dispatches, each reading and writing the keys and positions once. One row of
``radix.MIN_N`` elements or more is radix sorted instead (``radix.py``: a pass a byte of the key,
whatever the length).

``searchsorted`` finds each value's insertion point in a sorted 1-D array by binary search over the
same keys (NaNs last, as numpy's).
"""

from __future__ import annotations

import numpy as np

import hal

from .. import dtypes as _dt
from . import radix
from .numpy_util import to_compute
from .sort_keys import key_c, stable_order
from .source import MAX_WORKGROUPS, WORKGROUP, KernelSource, grid_1d, rows_of, source

#: Elements a workgroup sorts in shared memory (a power of two); rows longer than this merge runs in
#: global memory. The tests lower it to reach the merge passes with small rows.
TILE = 2048
#: The dtypes sorted on the device; complex values (ordered lexicographically, as numpy does) are
#: sorted on the host.
DTYPES = tuple(d for d in _dt.ALL if not d.is_complex)
#: Rows (and searchsorted's arrays) at most this long: positions are 32-bit in the kernels, with room
#: for a run's end past the row. Longer ones are sorted on the host.
MAX_N = 1 << 31


def takes(x_dtype, n: int) -> bool:
    """Whether the device sorts (or searches) rows of `n` elements of `x_dtype`."""
    return x_dtype in DTYPES and n <= MAX_N


#: Elements a thread of the shared-memory sort holds (TILE / ITEMS threads a workgroup).
ITEMS = 8


def _tile_sort_c(tile: int) -> str:
    """C of ``rt_sort_tile``: a workgroup sorts its shared tile, segment by segment (a block merge sort:
    each thread's ITEMS consecutive slots by odd-even transposition in registers, then merge levels
    in which each thread finds where its ITEMS outputs start on the merge path of its pair of runs and
    merges them serially). Slots holding no element carry SORT_PAD and position 0xFFFFFFFF, and stay
    after every element of their segment."""
    return f"""
#define SORT_PAD ((sort_key)~(sort_key)0)
// A padded slot index: a thread's {ITEMS} consecutive slots fall on distinct banks.
#define SP(q) ((q) + ((q) >> 5))
// The {ITEMS} outputs from the d-th on of the merge of the shared runs [a0, a0 + la) and [b0, b0 + lb),
// into k and i (those past the end left as they are): where they start on the merge path by binary
// search, then a serial merge. A's element first among equal keys (A holds the earlier positions).
__device__ __forceinline__ void rt_merge_items(const sort_key* sk, const u32* si, u32 a0, u32 la, u32 b0, u32 lb,
                                               u32 d, sort_key* k, u32* i) {{
  u32 lo = d > lb ? d - lb : 0u, hi = d < la ? d : la;
  while (lo < hi) {{
    const u32 mid = (lo + hi) >> 1;
    if (sk[SP(a0 + mid)] <= sk[SP(b0 + d - 1u - mid)]) lo = mid + 1u; else hi = mid;
  }}
  u32 ia = a0 + lo, ib = b0 + (d - lo);
  const u32 ea = a0 + la, eb = b0 + lb;
#pragma unroll
  for (u32 e = 0; e < {ITEMS}u; ++e) {{
    if (ia >= ea && ib >= eb) break;
    const bool from_a = ib >= eb || (ia < ea && sk[SP(ia)] <= sk[SP(ib)]);
    const u32 from = from_a ? ia : ib;
    k[e] = sk[SP(from)];
    i[e] = si[SP(from)];
    if (from_a) ++ia; else ++ib;
  }}
}}

__device__ __forceinline__ void rt_sort_tile(sort_key* sk, u32* si, u32 lseg) {{
  const u32 first = threadIdx.x * {ITEMS}u;
  sort_key k[{ITEMS}];
  u32 i[{ITEMS}];
#pragma unroll
  for (u32 e = 0; e < {ITEMS}u; ++e) {{ k[e] = sk[SP(first + e)]; i[e] = si[SP(first + e)]; }}
#pragma unroll
  for (u32 r = 0; r < {ITEMS}u; ++r) {{
#pragma unroll
    for (u32 e = r & 1u; e + 1u < {ITEMS}u; e += 2u) {{
      const bool same_segment = ((first + e) >> lseg) == ((first + e + 1u) >> lseg);
      if (same_segment && (k[e] > k[e + 1u] || (k[e] == k[e + 1u] && i[e] > i[e + 1u]))) {{
        const sort_key tk = k[e]; k[e] = k[e + 1u]; k[e + 1u] = tk;
        const u32 ti = i[e]; i[e] = i[e + 1u]; i[e + 1u] = ti;
      }}
    }}
  }}
#pragma unroll
  for (u32 e = 0; e < {ITEMS}u; ++e) {{ sk[SP(first + e)] = k[e]; si[SP(first + e)] = i[e]; }}
  const u32 top = lseg < {tile.bit_length() - 1}u ? 1u << lseg : {tile}u;
  for (u32 run = {ITEMS}u; run < top; run <<= 1) {{
    __syncthreads();
    const u32 a0 = first & ~(2u * run - 1u);  // this thread's pair of runs: [a0, a0 + run), [a0 + run, a0 + 2 run)
    rt_merge_items(sk, si, a0, run, a0 + run, run, first - a0, k, i);
    __syncthreads();
#pragma unroll
    for (u32 e = 0; e < {ITEMS}u; ++e) {{ sk[SP(first + e)] = k[e]; si[SP(first + e)] = i[e]; }}
  }}
  __syncthreads();
}}
"""


def sort_source(dt) -> KernelSource:
    tile = TILE  # (as it is now: the source may be built later)
    threads = tile // ITEMS
    key = ("sort", dt.name, tile)
    code = dt.code
    exports = [
        hal.Export(f"sort_rows_{code}", (threads, 1, 1), 2, 5),
        hal.Export(f"argsort_rows_{code}", (threads, 1, 1), 2, 5),
        hal.Export(f"sort_tiles_{code}", (threads, 1, 1), 3, 5),
        hal.Export(f"sort_split_{code}", (WORKGROUP, 1, 1), 2, 4),
        hal.Export(f"sort_merge_{code}", (threads, 1, 1), 5, 4),
        hal.Export(f"sort_last_{code}", (threads, 1, 1), 5, 5),
        hal.Export(f"argsort_last_{code}", (threads, 1, 1), 4, 4),
        hal.Export(f"searchsorted_{code}", (WORKGROUP, 1, 1), 3, 5),
    ]
    return source(key, lambda: KernelSource(key, exports, lambda: _cuda(dt, tile),
                                            lambda: _numpy_fns(dt)))


def _cuda(dt, tile: int) -> str:
    code = dt.code
    padded = tile + tile // 32
    log_tile = tile.bit_length() - 1
    storage = dt.c_storage
    # Rows of n <= TILE: a tile holds TILE >> lseg rows, each in its own segment of 2**lseg slots.
    rows_head = f"""
  __shared__ sort_key sk[{padded}];
  __shared__ u32 si[{padded}];
  const u32 per = {tile}u >> lseg, mask = (1u << lseg) - 1u;
  for (u32 b = blockIdx.x; (u64)b * per < rows; b += gridDim.x) {{
    auto valid = [&](u32 q) {{ return (q & mask) < n && (u64)b * per + (q >> lseg) < rows; }};
    for (u32 q = threadIdx.x; q < {tile}u; q += blockDim.x) {{
      const bool here = valid(q);
      sk[SP(q)] = here ? rt_key(in[ioff + ((u64)b * per + (q >> lseg)) * n + (q & mask)], desc) : SORT_PAD;
      si[SP(q)] = here ? q & mask : 0xFFFFFFFFu;
    }}
    __syncthreads();
    rt_sort_tile(sk, si, lseg);"""
    rows_tail = """
    __syncthreads();
  }"""

    # Where tile b's outputs lie in its row's pair of runs (runs of `run`, the second maybe short or
    # empty at the row's end): the row's base, the first output o, the pair's runs A = [ps, a_end) and
    # B = [a_end, a_end + lb_all), and the diagonal d0 of the merge path at o.
    pair_geometry = f"""
    const u64 base = (b / tiles) * n;
    const u32 o = (u32)(b % tiles) << {log_tile}u;
    const u32 ps = o & ~(2u * run - 1u);
    const u32 a_end = ps + run < n ? ps + run : n, b_end = a_end + run < n ? a_end + run : n;
    const u32 la_all = a_end - ps, lb_all = b_end - a_end, d0 = o - ps;"""
    # Each tile's start on the merge path of its pair: how many of its pair's first d0 outputs come
    # from run A (binary search; A's element first among equal keys, as A holds earlier positions).
    # One thread a tile, so that the merge pass's workgroups start streaming at once.
    split_kernel = f"""
extern "C" __global__ void sort_split_{code}(u32* __restrict__ splits, const sort_key* __restrict__ keys,
                                             u32 rows, u32 n, u32 tiles, u32 run) {{
  const u64 count = (u64)rows * tiles, step = (u64)blockDim.x * gridDim.x;
  for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < count; b += step) {{{pair_geometry}
    const sort_key* A = keys + base + ps;
    const sort_key* B = keys + base + a_end;
    u32 lo = d0 > lb_all ? d0 - lb_all : 0u, hi = d0 < la_all ? d0 : la_all;
    while (lo < hi) {{
      const u32 mid = (lo + hi) >> 1;
      if (A[mid] <= B[d0 - 1u - mid]) lo = mid + 1u; else hi = mid;
    }}
    splits[b] = lo;
  }}
}}
"""

    def merge(name: str, params: str, emit: str) -> str:
        """A merge pass over pairs of sorted runs of `run` elements (run >= TILE, a power of two):
        each workgroup writes TILE consecutive outputs of one pair. The ends of its stretch of the
        merge path are its own split and the next tile's; the stretch's elements of each run are
        read into shared memory, merged there as a merge level of the tile sort is (A's element
        first among equal keys: the merge is stable), and written out in order. `emit` writes
        element {i} (its key {k}) at {at}."""
        extra = ", u32 ioff" if "ioff" in emit else ""  # (the values' offset, for sort_last)
        return f"""
extern "C" __global__ void {name}({params}, const u32* __restrict__ splits,
                               u32 rows, u32 n, u32 tiles, u32 run{extra}) {{
  __shared__ sort_key sk[{padded}];
  __shared__ u32 si[{padded}];
  for (u64 b = blockIdx.x; b < (u64)rows * tiles; b += gridDim.x) {{{pair_geometry}
    const u32 d1 = d0 + {tile}u < la_all + lb_all ? d0 + {tile}u : la_all + lb_all;
    // (the next tile's stretch starts where this one's ends, unless this one ends the pair)
    const u32 i0 = splits[b], i1 = o + {tile}u < a_end + lb_all ? splits[b + 1] : la_all;
    const u32 j0 = d0 - i0;
    const u32 la = i1 - i0, lb = (d1 - i1) - j0;
    const u32 total = la + lb;
    for (u32 q = threadIdx.x; q < total; q += blockDim.x) {{
      const u32 from = q < la ? ps + i0 + q : a_end + j0 + (q - la);
      sk[SP(q)] = keys[base + from];
      si[SP(q)] = idx[base + from];
    }}
    __syncthreads();
    const u32 first = threadIdx.x * {ITEMS}u;
    sort_key k[{ITEMS}];
    u32 i[{ITEMS}];
    if (first < total) rt_merge_items(sk, si, 0u, la, la, lb, first, k, i);
    __syncthreads();
#pragma unroll
    for (u32 e = 0; e < {ITEMS}u; ++e)
      if (first + e < total) {{ sk[SP(first + e)] = k[e]; si[SP(first + e)] = i[e]; }}
    __syncthreads();
    for (u32 q = threadIdx.x; q < total; q += blockDim.x) {{
      {emit.format(at="base + o + q", i="si[SP(q)]", k="sk[SP(q)]")}
    }}
    __syncthreads();
  }}
}}
"""

    ins = "const sort_key* __restrict__ keys, const u32* __restrict__ idx"
    return key_c(dt) + _tile_sort_c(tile) + f"""
extern "C" __global__ void sort_rows_{code}({storage}* __restrict__ out, const sort_bits* __restrict__ in,
                                            u32 rows, u32 n, u32 ioff, u32 lseg, u32 desc) {{
  const {storage}* values = (const {storage}*)in;{rows_head}
    for (u32 q = threadIdx.x; q < {tile}u; q += blockDim.x) {{
      if (valid(q)) {{
        const u64 row = ((u64)b * per + (q >> lseg)) * n;
        out[row + (q & mask)] = values[ioff + row + si[SP(q)]];
      }}
    }}{rows_tail}
}}

extern "C" __global__ void argsort_rows_{code}(long long* __restrict__ out, const sort_bits* __restrict__ in,
                                               u32 rows, u32 n, u32 ioff, u32 lseg, u32 desc) {{{rows_head}
    for (u32 q = threadIdx.x; q < {tile}u; q += blockDim.x)
      if (valid(q)) out[((u64)b * per + (q >> lseg)) * n + (q & mask)] = (long long)si[SP(q)];{rows_tail}
}}

// Rows of n > TILE: each tile of TILE positions sorted, into the scratch of keys and positions.
extern "C" __global__ void sort_tiles_{code}(sort_key* __restrict__ keys_out, u32* __restrict__ idx_out,
                                             const sort_bits* __restrict__ in,
                                             u32 rows, u32 n, u32 ioff, u32 tiles, u32 desc) {{
  __shared__ sort_key sk[{padded}];
  __shared__ u32 si[{padded}];
  for (u64 b = blockIdx.x; b < (u64)rows * tiles; b += gridDim.x) {{
    const u64 base = (b / tiles) * n;
    const u32 start = (u32)(b % tiles) << {log_tile}u;
    for (u32 q = threadIdx.x; q < {tile}u; q += blockDim.x) {{
      const bool here = start + q < n;
      sk[SP(q)] = here ? rt_key(in[ioff + base + start + q], desc) : SORT_PAD;
      si[SP(q)] = here ? start + q : 0xFFFFFFFFu;
    }}
    __syncthreads();
    rt_sort_tile(sk, si, {log_tile}u);
    for (u32 q = threadIdx.x; q < {tile}u && start + q < n; q += blockDim.x) {{
      keys_out[base + start + q] = sk[SP(q)];
      idx_out[base + start + q] = si[SP(q)];
    }}
    __syncthreads();
  }}
}}
{split_kernel}
{merge(f"sort_merge_{code}", f"sort_key* __restrict__ keys_out, u32* __restrict__ idx_out, {ins}",
       "keys_out[{at}] = {k}; idx_out[{at}] = {i};")}
{merge(f"sort_last_{code}", f"{storage}* __restrict__ out, {ins}, const {storage}* __restrict__ in",
       "out[{at}] = in[ioff + base + {i}];")}
{merge(f"argsort_last_{code}", f"long long* __restrict__ out, {ins}", "out[{at}] = (long long){i};")}
// For each of the m values v: the first position of the sorted n-array a where v would go, after
// the elements equal to it where right != 0.
extern "C" __global__ void searchsorted_{code}(long long* __restrict__ out, const sort_bits* __restrict__ a,
                                               const sort_bits* __restrict__ v, u32 n, u32 m, u32 aoff, u32 voff,
                                               u32 right) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (u64)blockDim.x * gridDim.x) {{
    const sort_key kv = rt_key(v[voff + i], 0u);
    u32 lo = 0, hi = n;
    while (lo < hi) {{
      const u32 mid = lo + (hi - lo) / 2u;
      const sort_key km = rt_key(a[aoff + mid], 0u);
      if (right ? km <= kv : km < kv) lo = mid + 1u; else hi = mid;
    }}
    out[i] = (long long)lo;
  }}
}}
"""


# ---- numpy forms (the CPU drivers): numpy's stable argsort, the same order --------------------------

def _numpy_fns(dt) -> dict:
    code = dt.code

    def rows_input(bindings, slot, rows, n, ioff):
        raw = np.frombuffer(bindings[slot], dtype=dt.storage, count=rows * n, offset=ioff * dt.itemsize)
        return raw.reshape(rows, n)

    def sort_rows(wg, bindings, c):
        rows, n, ioff, _, desc = c
        raw = rows_input(bindings, 1, rows, n, ioff)
        order = stable_order(to_compute(raw, dt), bool(desc))
        np.frombuffer(bindings[0], dtype=dt.storage, count=rows * n).reshape(rows, n)[...] = \
            np.take_along_axis(raw, order, axis=1)

    def argsort_rows(wg, bindings, c):
        rows, n, ioff, _, desc = c
        order = stable_order(to_compute(rows_input(bindings, 1, rows, n, ioff), dt), bool(desc))
        np.frombuffer(bindings[0], dtype=np.int64, count=rows * n).reshape(rows, n)[...] = order

    def searchsorted(wg, bindings, c):
        n, m, aoff, voff, right = c
        a = to_compute(np.frombuffer(bindings[1], dtype=dt.storage, count=n, offset=aoff * dt.itemsize), dt)
        v = to_compute(np.frombuffer(bindings[2], dtype=dt.storage, count=m, offset=voff * dt.itemsize), dt)
        np.frombuffer(bindings[0], dtype=np.int64, count=m)[...] = \
            np.searchsorted(a, v, side="right" if right else "left")

    # The tiled exports' scratch is private to them: the numpy form orders each whole row in
    # ``sort_tiles`` (the positions in order; the keys are not kept), which leaves each merge pass
    # only the positions to pass on (and no splits to find); the last pass writes the result from them.
    def positions(bindings, slot, rows, n):
        return np.frombuffer(bindings[slot], dtype=np.uint32, count=rows * n).reshape(rows, n)

    def sort_tiles(wg, bindings, c):
        rows, n, ioff, _, desc = c
        positions(bindings, 1, rows, n)[...] = stable_order(
            to_compute(rows_input(bindings, 2, rows, n, ioff), dt), bool(desc))

    def merge(wg, bindings, c):
        rows, n, _, _ = c
        positions(bindings, 1, rows, n)[...] = positions(bindings, 3, rows, n)

    def sort_last(wg, bindings, c):
        rows, n, _, _, ioff = c
        order = positions(bindings, 2, rows, n).astype(np.int64)
        np.frombuffer(bindings[0], dtype=dt.storage, count=rows * n).reshape(rows, n)[...] = \
            np.take_along_axis(rows_input(bindings, 3, rows, n, ioff), order, axis=1)

    def argsort_last(wg, bindings, c):
        rows, n, _, _ = c
        out = np.frombuffer(bindings[0], dtype=np.int64, count=rows * n)
        out.reshape(rows, n)[...] = positions(bindings, 2, rows, n)

    return {f"sort_rows_{code}": sort_rows, f"argsort_rows_{code}": argsort_rows, f"sort_tiles_{code}": sort_tiles,
            f"sort_split_{code}": lambda wg, bindings, c: None, f"sort_merge_{code}": merge,
            f"sort_last_{code}": sort_last, f"argsort_last_{code}": argsort_last,
            f"searchsorted_{code}": searchsorted}


# ---- plans --------------------------------------------------------------------------------------------

def plan(node, layouts: list, ctx) -> list:
    """A "sort" or "argsort" node over the rows of its contiguous input (params: descending)."""
    if node.size == 0:
        return []
    rows, n, ioff = rows_of(node, layouts)
    dt = node.inputs[0].dtype
    src = sort_source(dt)
    code = dt.code
    desc = 1 if node.params else 0
    what = node.op  # "sort" or "argsort"
    tile = TILE
    if n <= tile or not ctx.is_gpu:  # (the CPU drivers sort a row of any length in one call)
        lseg = max(0, (n - 1).bit_length()) if n <= tile else 0
        per = max(1, tile >> lseg)
        workgroups = min(-(-rows // per), MAX_WORKGROUPS)
        return [("dispatch", src, f"{what}_rows_{code}", (workgroups, 1, 1), [rows, n, ioff, lseg, desc],
                 [("out",), ("in", 0)])]
    if radix.takes(rows, n):
        return radix.plan(what, dt, n, ioff, desc)
    key_bytes = 8 if dt.itemsize == 8 else 4
    tiles = -(-n // tile)
    groups = (min(rows * tiles, MAX_WORKGROUPS), 1, 1)
    # Two scratch pairs of (keys, positions), read and written in turn by the merge passes.
    scratch = [[("tmp", 0), ("tmp", 1)], [("tmp", 2), ("tmp", 3)]]
    splits = ("tmp", 4)  # each tile's start on its pair's merge path, for the pass that follows
    cmds: list = [("temps", [rows * n * key_bytes, rows * n * 4] * 2 + [rows * tiles * 4]),
                  ("dispatch", src, f"sort_tiles_{code}", groups, [rows, n, ioff, tiles, desc],
                   [*scratch[0], ("in", 0)])]
    run, side = tile, 0
    while run < n:
        geometry = [rows, n, tiles, run]
        cmds += [("barrier",), ("dispatch", src, f"sort_split_{code}", (grid_1d(rows * tiles), 1, 1), geometry,
                                [splits, scratch[side][0]]), ("barrier",)]
        if 2 * run < n:
            cmds.append(("dispatch", src, f"sort_merge_{code}", groups, geometry,
                         [*scratch[1 - side], *scratch[side], splits]))
        elif what == "sort":
            cmds.append(("dispatch", src, f"sort_last_{code}", groups, [*geometry, ioff],
                         [("out",), *scratch[side], ("in", 0), splits]))
        else:
            cmds.append(("dispatch", src, f"argsort_last_{code}", groups, geometry, [("out",), *scratch[side], splits]))
        run, side = 2 * run, 1 - side
    return cmds


def plan_searchsorted(node, layouts: list, ctx) -> list:
    """A "searchsorted" node: input 0 the sorted 1-D array, input 1 the values (contiguous);
    params: right (side="right")."""
    m = node.size
    if m == 0:
        return []
    (ashape, _, aoff), (_, _, voff) = layouts
    dt = node.inputs[0].dtype
    return [("dispatch", sort_source(dt), f"searchsorted_{dt.code}", (grid_1d(m), 1, 1),
             [ashape[0], m, aoff, voff, 1 if node.params else 0], [("out",), ("in", 0), ("in", 1)])]
