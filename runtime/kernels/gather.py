"""`gather`: out[i] = src[idx[i]] over flat element indices (take, integer-array and boolean indexing).

Both inputs are read contiguously from their offsets; indices are int64 and clamped to the
source's elements, so that a bad index can never read outside its buffer (indices are checked
when they are known on the host; the device clamps the ones computed there).
"""

from __future__ import annotations

import numpy as np

import hal

from ..shapes import size_of
from .complex import SOURCE as COMPLEX_SOURCE
from .cuda_common import load_expr, store_expr
from .source import WORKGROUP, KernelSource, grid_1d, source

_NCONST = 4  # n, source offset, index offset, source elements


def gather_source(dt) -> KernelSource:
    key = ("gather", dt.name)
    name = f"gather_{dt.code}"
    return source(key, lambda: KernelSource(
        key, [hal.Export(name, (WORKGROUP, 1, 1), 3, _NCONST)], lambda: _cuda(dt, name),
        lambda: {name: _numpy_fn(dt)}))


def _cuda(dt, name) -> str:
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
"""


def _numpy_fn(dt):
    def run(wg, bindings, c):
        n, soff, ioff, m = c
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=n)
        src = np.frombuffer(bindings[1], dtype=dt.storage, count=m, offset=soff * dt.itemsize)
        idx = np.frombuffer(bindings[2], dtype=np.int64, count=n, offset=ioff * 8)
        np.take(src, np.clip(idx, 0, max(m - 1, 0)), out=out)
    return run


def plan(node, layouts: list, ctx) -> list:
    n = node.size
    if n == 0:
        return []
    (sshape, _, soff), (_, _, ioff) = layouts
    src = gather_source(node.dtype)
    return [("dispatch", src, f"gather_{node.dtype.code}", (grid_1d(n), 1, 1),
             [n, soff, ioff, size_of(sshape)], [("out",), ("in", 0), ("in", 1)])]
