"""`sort` and `argsort` of one long row: a least-significant-digit radix sort on the device.

A merge sort makes one pass over its row per doubling past a tile (13 at 2**24 elements); a radix sort
makes one per byte of the key, whatever the length (4 for float32, 2 for float16, 8 for int64). The key
is the merge sort's order-preserving key (``sort_keys.key_c``: NaNs last, -0.0 as 0.0, inverted when
descending), computed from the element's bits at each pass, so a sort carries only the elements'
bits from pass to pass and an argsort their bits and positions.

Each pass over digit ``shift`` (8 bits) is three dispatches:

- ``radix_count``: each of the BLOCKS workgroups counts the digits of its stretch of tiles (shared
  counters a warp), into ``hist[digit * blocks + block]``;
- ``radix_scan``: a workgroup a digit (a thread a digit for few workgroups) turns its row of
  ``hist`` into its exclusive running sum and the digit's total: where each workgroup's elements
  of each digit start among the digit's;
- ``radix_scatter``: each workgroup finds where each digit's elements start (the running sum of the
  digits' totals, plus its row entry), then walks its tiles in order; in a tile, each warp ranks its
  elements among those of the same digit (the lanes agreeing with it on each of the digit's 8 bits,
  by 8 ballots), the warps' counts are added in warp order, the tile is reordered by digit in shared
  memory, and written out in runs of equal digits. Elements of one digit keep their order (the sort
  is stable, numpy's order), so each pass sorts by its digit without undoing the ones before.

The first pass reads the input; the last writes the result (the bits are the sorted elements; an
argsort writes the positions). Several rows take the merge sort (``sort.py``); rows past
``sort.MAX_N`` are sorted on the host.
"""

from __future__ import annotations

import numpy as np

import hal

from .numpy_util import to_compute
from .sort_keys import key_c, stable_order
from .source import KernelSource, source

#: Digits a pass (8 bits) and threads of a workgroup: one thread a digit where digits are counted.
RADIX = 256
#: Elements a thread holds in a tile of the scatter (TILE = RADIX * ITEMS elements a tile).
ITEMS = 8
#: Workgroups of the count and scatter dispatches at most (each walks a stretch of tiles).
BLOCKS = 1024
#: Workgroups up to which a thread scans each digit's counts alone (one workgroup, no barriers).
SERIAL_SCAN = 16
#: Rows at least this long (one row) take the radix sort on a GPU.
MIN_N = 1 << 14
#: Longer rows take the merge sort: the kernels count in 32 bits.
MAX_N = (1 << 32) - 1


def tile() -> int:
    return RADIX * ITEMS


def takes(rows: int, n: int) -> bool:
    """Whether a GPU sorts these rows by the radix sort."""
    return rows == 1 and MIN_N <= n <= MAX_N


def radix_source(dt) -> KernelSource:
    items, serial = ITEMS, SERIAL_SCAN  # (as they are now: the source may be built later)
    key = ("radix", dt.name, items, serial)
    code = dt.code
    scatter = [(RADIX, 1, 1), 5, 5]
    exports = [hal.Export(f"radix_count_{code}", (RADIX, 1, 1), 2, 5),
               hal.Export(f"radix_scan_{code}", (RADIX, 1, 1), 1, 1),
               hal.Export(f"radix_sort_{code}", *scatter)]
    exports += [hal.Export(f"radix_argsort_{v}_{code}", *scatter) for v in _ARG_VARIANTS]
    return source(key, lambda: KernelSource(key, exports, lambda: _cuda(dt, items, serial), lambda: _numpy_fns(dt)))


#: The argsort's scatter by pass: (first, last) -> name.
_ARG_VARIANTS = {"first": (True, False), "mid": (False, False), "last": (False, True), "only": (True, True)}


def _cuda(dt, items: int, serial: int) -> str:
    code = dt.code
    tile = RADIX * items
    scatter_params = """void* __restrict__ dst, u32* __restrict__ dst_pos, const sort_bits* __restrict__ src,
    const u32* __restrict__ src_pos, const u32* __restrict__ hist, u32 n, u32 ioff, u32 shift, u32 desc,
    u32 per_block"""
    wrappers = "".join(f"""
extern "C" __global__ void __launch_bounds__({RADIX}) radix_argsort_{v}_{code}({scatter_params}) {{
  __shared__ radix_shared<true> sh;
  radix_scatter<true, {str(first).lower()}, {str(last).lower()}>(sh, dst, dst_pos, src, src_pos, hist, n, ioff,
                                                                 shift, desc, per_block);
}}
""" for v, (first, last) in _ARG_VARIANTS.items())
    return key_c(dt) + f"""
#define R_WARPS ({RADIX} / RT_WARP)

__device__ __forceinline__ u32 radix_digit(sort_key k, u32 shift) {{ return (u32)(k >> shift) & {RADIX - 1}u; }}

// Each workgroup's count of each digit of its tiles [b * per_block, (b + 1) * per_block).
extern "C" __global__ void __launch_bounds__({RADIX}) radix_count_{code}(u32* __restrict__ hist,
    const sort_bits* __restrict__ src, u32 n, u32 ioff, u32 shift, u32 desc, u32 per_block) {{
  __shared__ u32 counts[R_WARPS * {RADIX}];  // a warp's own counters: atomics contend within a warp only
  const u32 t = threadIdx.x, w = t / RT_WARP, b = blockIdx.x;
  for (u32 i = t; i < R_WARPS * {RADIX}u; i += {RADIX}u) counts[i] = 0;
  __syncthreads();
  const u64 first = (u64)b * per_block * {tile}u;
  const u64 end = min((u64)n, first + (u64)per_block * {tile}u);
  src += ioff;
  for (u64 start = first; start < end; start += {tile}u) {{
    #pragma unroll
    for (u32 e = 0; e < {items}u; ++e) {{
      const u64 i = start + e * {RADIX}u + t;
      if (i < end) atomicAdd(&counts[w * {RADIX}u + radix_digit(rt_key(src[i], desc), shift)], 1u);
    }}
  }}
  __syncthreads();
  u32 c = 0;
  for (u32 k = 0; k < R_WARPS; ++k) c += counts[k * {RADIX}u + t];
  hist[t * gridDim.x + b] = c;
}}

// Row `d` of hist (the workgroups' counts of digit d, in workgroup order) into its exclusive running
// sum, and the digit's total into hist[RADIX * blocks + d]: a workgroup a digit (or several).
extern "C" __global__ void __launch_bounds__({RADIX}) radix_scan_{code}(u32* __restrict__ hist, u32 blocks) {{
  __shared__ u32 wsum[{RADIX} / 32 + 1];
  if (blocks <= {serial}u) {{  // short rows: a thread a digit, one workgroup (the plan's grid)
    const u32 d = threadIdx.x;
    u32* row = hist + (u64)d * blocks;
    u32 carry = 0;
    for (u32 i = 0; i < blocks; ++i) {{
      const u32 v = row[i];
      row[i] = carry;
      carry += v;
    }}
    hist[(u64){RADIX} * blocks + d] = carry;
    return;
  }}
  for (u32 d = blockIdx.x; d < {RADIX}u; d += gridDim.x) {{
    u32* row = hist + (u64)d * blocks;
    u32 carry = 0;
    for (u32 start = 0; start < blocks; start += {RADIX}u) {{
      const u32 i = start + threadIdx.x;
      const u32 v = i < blocks ? row[i] : 0u;
      u32 total;
      const u32 before = rt_block_exclusive(v, wsum, &total);
      if (i < blocks) row[i] = carry + before;
      carry += total;
    }}
    if (threadIdx.x == 0) hist[(u64){RADIX} * blocks + d] = carry;
  }}
}}

// A scatter's shared memory, declared by each kernel (a function's own __shared__ variables would be
// every kernel's on hiprtc).
template <bool ARG> struct radix_shared {{
  u32 ranks[R_WARPS * {RADIX}];  // each warp's running count of each digit, then its offset
  u32 next[{RADIX}], starts[{RADIX}];  // where each digit goes next in the output; in the tile
  u32 wsum[{RADIX} / 32 + 1];
  sort_bits staged[{tile}];
  u32 staged_pos[ARG ? {tile} : 1];
}};

// One pass's scatter by digit `shift`: the workgroup's tiles in order, each ranked and written out
// where its digits' elements go (hist: the exclusive running sum of the counts). ARG: the positions
// travel with the bits (FIRST: they are the elements' indices; LAST: they are the output, as int64);
// without, the bits are the output at the last pass.
template <bool ARG, bool FIRST, bool LAST>
__device__ __forceinline__ void radix_scatter(radix_shared<ARG>& sh, {scatter_params}) {{
  const u32 t = threadIdx.x, lane = t % RT_WARP, w = t / RT_WARP, b = blockIdx.x;
  {{
    u32 all;  // (where digit t starts: the totals of the digits below it, then the workgroups' before b)
    const u32 digits_below = rt_block_exclusive(hist[(u64){RADIX} * gridDim.x + t], sh.wsum, &all);
    sh.next[t] = digits_below + hist[t * gridDim.x + b];
  }}
  src += ioff;
  const rt_lanes below = ((rt_lanes)1 << lane) - (rt_lanes)1;
  for (u32 j = 0; j < per_block; ++j) {{
    const u64 start = ((u64)b * per_block + j) * {tile}u;
    if (start >= n) break;  // (the same for every thread)
    const u32 valid = (u32)min((u64){tile}u, n - start);
    for (u32 i = t; i < R_WARPS * {RADIX}u; i += {RADIX}u) sh.ranks[i] = 0;
    __syncthreads();
    // A warp's elements are a stretch of the tile, lane by lane in each of its {items} rounds: ranking the
    // rounds in order ranks the stretch in order. Slots past the row take the last digit: they rank
    // after every element, at the end of the tile, and are not written.
    sort_bits bits[{items}];
    u32 pos[{items}], digit[{items}], rank[{items}];
    #pragma unroll
    for (u32 e = 0; e < {items}u; ++e) {{
      const u32 q = w * (RT_WARP * {items}u) + e * RT_WARP + lane;
      const bool here = q < valid;
      bits[e] = here ? src[start + q] : (sort_bits)0;
      if (ARG) pos[e] = FIRST ? (u32)(start + q) : (here ? src_pos[start + q] : 0u);
      digit[e] = here ? radix_digit(rt_key(bits[e], desc), shift) : {RADIX - 1}u;
    }}
    #pragma unroll
    for (u32 e = 0; e < {items}u; ++e) {{
      const u32 d = digit[e];
      const rt_lanes peers = rt_match_any8(d);  // the lanes whose element has this lane's digit
      const u32 earlier = RT_POPC(peers & below);
      const u32 before = sh.ranks[w * {RADIX}u + d];
      RT_SYNCWARP();  // (every peer has read the count before the first of them moves it on)
      if (earlier == 0) sh.ranks[w * {RADIX}u + d] = before + RT_POPC(peers);
      RT_SYNCWARP();
      rank[e] = before + earlier;
    }}
    __syncthreads();
    u32 count = 0;  // of digit t in the tile; the warps' counts become their offsets within it
    for (u32 k = 0; k < R_WARPS; ++k) {{
      const u32 c = sh.ranks[k * {RADIX}u + t];
      sh.ranks[k * {RADIX}u + t] = count;
      count += c;
    }}
    u32 total;
    sh.starts[t] = rt_block_exclusive(count, sh.wsum, &total);
    __syncthreads();
    #pragma unroll
    for (u32 e = 0; e < {items}u; ++e) {{
      const u32 d = digit[e];
      const u32 at = sh.starts[d] + sh.ranks[w * {RADIX}u + d] + rank[e];
      sh.staged[at] = bits[e];
      if (ARG) sh.staged_pos[at] = pos[e];
    }}
    __syncthreads();
    for (u32 q = t; q < valid; q += {RADIX}u) {{
      const sort_bits v = sh.staged[q];
      const u32 d = radix_digit(rt_key(v, desc), shift);
      const u64 at = (u64)sh.next[d] + (q - sh.starts[d]);
      if (ARG && LAST) {{
        ((long long*)dst)[at] = (long long)sh.staged_pos[q];
      }} else {{
        ((sort_bits*)dst)[at] = v;
        if (ARG) dst_pos[at] = sh.staged_pos[q];
      }}
    }}
    __syncthreads();
    sh.next[t] += count;  // (read again after the next tile's first barrier)
  }}
}}

extern "C" __global__ void __launch_bounds__({RADIX}) radix_sort_{code}({scatter_params}) {{
  __shared__ radix_shared<false> sh;
  radix_scatter<false, false, false>(sh, dst, dst_pos, src, src_pos, hist, n, ioff, shift, desc, per_block);
}}
{wrappers}"""


# ---- numpy forms (never dispatched by the CPU drivers, which sort a row at once) ---------------------

def _numpy_fns(dt) -> dict:
    """The passes' scratch is private to them, so the first scatter orders the whole row (numpy's
    stable order), later ones pass it on, and the last writes the result; counts and scans do
    nothing."""
    code = dt.code
    bits_type = np.dtype(f"u{dt.itemsize}")

    def view(bindings, slot, dtype, n, offset=0):
        return np.frombuffer(bindings[slot], dtype=dtype, count=n, offset=offset * np.dtype(dtype).itemsize)

    def scatter(arg: bool, last: bool):
        def run(wg, bindings, c):
            n, ioff, shift, desc, _ = c
            src = view(bindings, 2, bits_type, n, ioff)
            if shift == 0:  # (the first pass)
                order = stable_order(to_compute(src.view(dt.storage).reshape(1, n), dt), bool(desc))[0]
                bits, pos = src[order], order
            else:
                bits, pos = src, (view(bindings, 3, np.uint32, n) if arg else None)
            if arg and last:
                view(bindings, 0, np.int64, n)[...] = pos
                return
            view(bindings, 0, bits_type, n)[...] = bits
            if arg:
                view(bindings, 1, np.uint32, n)[...] = pos
        return run

    def nothing(wg, bindings, c):
        return None

    fns = {f"radix_count_{code}": nothing, f"radix_scan_{code}": nothing,
           f"radix_sort_{code}": scatter(False, False)}
    fns.update({f"radix_argsort_{v}_{code}": scatter(True, last) for v, (_, last) in _ARG_VARIANTS.items()})
    return fns


# ---- the plan -----------------------------------------------------------------------------------------

def plan(what: str, dt, n: int, ioff: int, desc: int) -> list:
    """The commands sorting (what: "sort") or argsorting one row of n elements from input 0 at ioff."""
    src = radix_source(dt)
    code = dt.code
    tiles = -(-n // tile())
    per_block = -(-tiles // BLOCKS)
    blocks = -(-tiles // per_block)
    passes = dt.itemsize
    arg = what == "argsort"
    hist = ("tmp", 0)
    # Scratch: the bits (and positions) between passes, in two pairs used in turn.
    between = min(passes - 1, 2)
    sizes = [RADIX * (blocks + 1) * 4] + [n * dt.itemsize] * between + ([n * 4] * between if arg else [])
    bits = [("tmp", 1 + k) for k in range(between)]
    pos = [("tmp", 1 + between + k) for k in range(between)] if arg else [hist] * between
    cmds: list = [("temps", sizes)]
    for p in range(passes):
        first, last = p == 0, p == passes - 1
        source_bits = ("in", 0) if first else bits[(p - 1) % 2]
        source_pos = hist if first or not arg else pos[(p - 1) % 2]
        out_bits = ("out",) if last else bits[p % 2]
        out_pos = hist if last or not arg else pos[p % 2]
        consts = [n, ioff if first else 0, 8 * p, desc, per_block]
        if arg:
            variant = "only" if first and last else "first" if first else "last" if last else "mid"
            name = f"radix_argsort_{variant}_{code}"
        else:
            name = f"radix_sort_{code}"
        cmds += [("dispatch", src, f"radix_count_{code}", (blocks, 1, 1), consts, [hist, source_bits]),
                 ("barrier",),
                 ("dispatch", src, f"radix_scan_{code}", (1 if blocks <= SERIAL_SCAN else RADIX, 1, 1), [blocks],
                  [hist]),
                 ("barrier",),
                 ("dispatch", src, name, (blocks, 1, 1), consts, [out_bits, out_pos, source_bits, source_pos, hist])]
        if not last:
            cmds.append(("barrier",))
    return cmds
