"""`scatter_add`: out[idx[i]] += g[i] over flat element indices, into zeros (the gradient of a gather:
``take``, ``take_along_axis``, integer-array and boolean indexing, and ``sort``, which gathers).

The output is zero-filled, then one thread per value adds it at its index with an atomic add, so
indices may repeat (a row of an embedding looked up twice gets both cotangents). The order of the
additions is the device's: a sum over repeated indices may round differently from run to run (as
PyTorch's ``index_add_`` and JAX's scatter-add on GPUs). Indices are clamped to the output as the
unchecked gather clamps them, so each value lands where the gather read it; a *checked* scatter
(``params[1] == "raise"``: indices computed on the device, ``x.at[i].add(v)``) skips an index out of
range and sets its status word (a fourth binding), as the checked gather does, so reading the result
raises IndexError. float32, float64 and uint64: narrower floats accumulate in float32, complex
values part by part, and integers in uint64, whose wrap-around truncates to numpy's ``add.at`` in
the integer's own dtype (``ops.scatter_add``).
"""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from .source import KernelSource, checked_pair, checked_pair_dispatch

_NCONST = 4  # n, value offset, index offset, output elements
DTYPES = (_dt.float32, _dt.float64, _dt.uint64)


def scatter_source(dt) -> KernelSource:
    return checked_pair("scatter_add", dt, _NCONST, _cuda, _numpy_fn)


def _cuda(dt, name, checked) -> str:
    t = dt.c_storage
    return f"""
extern "C" __global__ void {name}({t}* __restrict__ out, const {t}* __restrict__ g,
                                  const long long* __restrict__ idx, u32 n, u32 goff, u32 ioff, u32 m) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{
    long long j = idx[ioff + i];
    j = j < 0 ? 0 : (j >= (long long)m ? (long long)m - 1 : j);
    atomicAdd(out + j, g[goff + i]);
  }}
}}

extern "C" __global__ void {checked}({t}* __restrict__ out, const {t}* __restrict__ g,
                                     const long long* __restrict__ idx, unsigned int* __restrict__ status,
                                     u32 n, u32 goff, u32 ioff, u32 m) {{
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{
    const long long j = idx[ioff + i];
    if (j < 0 || j >= (long long)m) {{
      status[0] = 1u;
      continue;
    }}
    atomicAdd(out + j, g[goff + i]);
  }}
}}
"""


def _numpy_fn(dt, checked: bool):
    def run(wg, bindings, c):
        n, goff, ioff, m = c
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=m)
        g = np.frombuffer(bindings[1], dtype=dt.storage, count=n, offset=goff * dt.itemsize)
        idx = np.frombuffer(bindings[2], dtype=np.int64, count=n, offset=ioff * 8)
        if checked:
            good = (idx >= 0) & (idx < m)
            if not good.all():
                np.frombuffer(bindings[3], dtype=np.uint32, count=1)[0] = 1
                idx, g = idx[good], g[good]
            np.add.at(out, idx, g)
            return
        np.add.at(out, np.clip(idx, 0, m - 1), g)
    return run


def plan(node, layouts: list, ctx) -> list:
    m, mode = node.params
    if m == 0:
        return []
    n = node.inputs[0].size
    fill = ("fill", ("out",), 0, 4)  # (zero is all-zero bits in every dtype it adds in)
    if n == 0:
        return [fill]
    (_, _, goff), (_, _, ioff) = layouts[:2]
    return [fill, ("barrier",), checked_pair_dispatch(scatter_source(node.dtype), "scatter_add", node.dtype,
                                                      mode == "raise", n, [n, goff, ioff, m])]
