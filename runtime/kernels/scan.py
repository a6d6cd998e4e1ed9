"""`cumsum`: the running sum along the rows of a contiguous (rows, n) array (``cumulative_sum``).

One workgroup a row: the row is read in tiles of one element a thread (coalesced), each tile scanned
in shared memory and offset by the carry of the tiles before it, so the row is read once and written
once. Floats accumulate in float32 (float64 for float64: narrower floats round once, at the store,
rather than at each step as numpy's float16 loop does); integers in 64-bit unsigned arithmetic, whose
wrap-around truncates to the same values as numpy's running sum in the dtype. Few long rows are cut
into chunks scanned as rows of their own and offset by their totals' running sum
(``array_api._scanned_rows``); complex and boolean scans take the log-step composition of
``array_api._cumulative``.
"""

from __future__ import annotations

import numpy as np

import hal

from .. import dtypes as _dt
from .cuda_common import load_expr, store_expr
from .numpy_util import store, to_compute
from .source import WORKGROUP, KernelSource, rows_of, source

_NCONST = 3  # rows, row length, input offset
DTYPES = tuple(d for d in _dt.ALL if not d.is_complex and d is not _dt.bool_)
#: A workgroup scans its row in steps of WORKGROUP elements, one after another: rows longer than
#: CHUNK when there are fewer of them than SMs of a large GPU, and any rows longer than LONG_ROW, are
#: cut into chunks of CHUNK (``array_api._scanned_rows``), each scanned by its own workgroup.
CHUNK = 1024
LONG_ROW = 8 * CHUNK
FEW_ROWS = 132


def takes(rows: int, n: int, dt) -> bool:
    """Whether the kernel scans (rows, n) of `dt` in one dispatch, a workgroup a row."""
    return dt in DTYPES and (n <= CHUNK or (rows >= FEW_ROWS and n <= LONG_ROW))


def _acc(dt) -> tuple[str, np.dtype]:
    """(C type, numpy type) the running sum is kept in."""
    if dt is _dt.float64:
        return "double", np.dtype(np.float64)
    if dt.is_float:
        return "float", np.dtype(np.float32)
    return "unsigned long long", np.dtype(np.uint64)


def scan_source(dt) -> KernelSource:
    key = ("cumsum", dt.name)
    name = f"cumsum_{dt.code}"
    return source(key, lambda: KernelSource(key, [hal.Export(name, (WORKGROUP, 1, 1), 2, _NCONST)],
                                            lambda: _cuda(dt, name), lambda: {name: _numpy_fn(dt)}))


def _cuda(dt, name) -> str:
    acc, _ = _acc(dt)
    load = f"({acc})({load_expr(dt, 'in[ioff + base + j]')})"
    return f"""
extern "C" __global__ void {name}({dt.c_storage}* __restrict__ out, const {dt.c_storage}* __restrict__ in,
                                  u32 rows, u32 n, u32 ioff) {{
  __shared__ {acc} part[{WORKGROUP}];
  const u32 t = threadIdx.x;
  for (u32 r = blockIdx.x; r < rows; r += gridDim.x) {{
    const u64 base = (u64)r * n;
    {acc} carry = ({acc})0;
    for (u32 start = 0; start < n; start += blockDim.x) {{
      const u32 j = start + t;
      part[t] = j < n ? {load} : ({acc})0;
      __syncthreads();
      for (u32 o = 1; o < blockDim.x; o <<= 1) {{  // the tile's inclusive scan
        const {acc} w = t >= o ? part[t - o] : ({acc})0;
        __syncthreads();
        part[t] += w;
        __syncthreads();
      }}
      if (j < n) out[base + j] = {store_expr(dt, "carry + part[t]")};
      carry += part[blockDim.x - 1];
      __syncthreads();  // (every thread has read the tile's total before the next tile is written)
    }}
  }}
}}
"""


def _numpy_fn(dt):
    _, acc = _acc(dt)

    def run(wg, bindings, c):
        rows, n, ioff = c
        x = to_compute(np.frombuffer(bindings[1], dtype=dt.storage, count=rows * n, offset=ioff * dt.itemsize), dt)
        with np.errstate(over="ignore", invalid="ignore"):
            sums = np.cumsum(x.reshape(rows, n).astype(acc), axis=1, dtype=acc)
        store(np.frombuffer(bindings[0], dtype=dt.storage, count=rows * n).reshape(rows, n), sums, dt)
    return run


def plan(node, layouts: list, ctx) -> list:
    if node.size == 0:
        return []
    rows, n, ioff = rows_of(node, layouts)
    return [("dispatch", scan_source(node.dtype), f"cumsum_{node.dtype.code}", (min(rows, 65535 * 16), 1, 1),
             [rows, n, ioff], [("out",), ("in", 0)])]
