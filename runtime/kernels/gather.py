"""`gather`: out[i] = src[idx[i]] over flat element indices (take, integer-array and boolean indexing).

Both inputs are read contiguously from their offsets; indices are int64. A gather whose indices were
computed on the device and may be out of range (``node.params == "raise"``) is *checked*: its kernel
reads a fourth binding, a status word (the node's third input, zero-filled before it runs), and sets
it to 1 when an index is outside the source's elements; the runtime raises IndexError when the
result is read (``graph.raise_index_errors``). The callers mark an out-of-range index of any axis by
making the flat index negative. Unchecked gathers (indices checked on the host, or clipped or
wrapped by ``take``) clamp, so that a bad index can never read outside its buffer.
"""

from __future__ import annotations

import numpy as np

from ..shapes import size_of
from .complex import SOURCE as COMPLEX_SOURCE
from .cuda_common import load_expr, store_expr
from .source import KernelSource, checked_pair, checked_pair_dispatch

_NCONST = 4  # n, source offset, index offset, source elements


def gather_source(dt) -> KernelSource:
    return checked_pair("gather", dt, _NCONST, _cuda, _numpy_fn)


def _cuda(dt, name, checked) -> str:
    val = store_expr(dt, load_expr(dt, "src[soff + j]"))
    return (COMPLEX_SOURCE if dt.is_complex else "") + f"""
extern "C" __global__ void {name}({dt.c_storage}* __restrict__ out, const {dt.c_storage}* __restrict__ src,
                                  const long long* __restrict__ idx, u32 n, u32 soff, u32 ioff, u32 m) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{
    long long j = idx[ioff + i];
    j = j < 0 ? 0 : (j >= (long long)m ? (long long)m - 1 : j);
    out[i] = {val};
  }}
}}

extern "C" __global__ void {checked}({dt.c_storage}* __restrict__ out, const {dt.c_storage}* __restrict__ src,
                                     const long long* __restrict__ idx, unsigned int* __restrict__ status,
                                     u32 n, u32 soff, u32 ioff, u32 m) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{
    long long j = idx[ioff + i];
    if (j < 0 || j >= (long long)m) {{
      status[0] = 1u;
      j = 0;
    }}
    out[i] = {val};
  }}
}}
"""


def _numpy_fn(dt, checked: bool):
    def run(wg, bindings, c):
        n, soff, ioff, m = c
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=n)
        src = np.frombuffer(bindings[1], dtype=dt.storage, count=m, offset=soff * dt.itemsize)
        idx = np.frombuffer(bindings[2], dtype=np.int64, count=n, offset=ioff * 8)
        if checked:
            bad = (idx < 0) | (idx >= m)
            if bad.any():
                np.frombuffer(bindings[3], dtype=np.uint32, count=1)[0] = 1
                idx = np.where(bad, 0, idx)
            np.take(src, idx, out=out)
            return
        np.take(src, np.clip(idx, 0, max(m - 1, 0)), out=out)
    return run


def plan(node, layouts: list, ctx) -> list:
    n = node.size
    if n == 0:
        return []
    (sshape, _, soff), (_, _, ioff) = layouts[:2]
    return [checked_pair_dispatch(gather_source(node.dtype), "gather", node.dtype, node.params == "raise", n,
                                  [n, soff, ioff, size_of(sshape)])]
