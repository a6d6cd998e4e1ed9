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

``scatter_last`` (``x.at[indices].set(v)``): for each output element, one plus the last position i
whose index names it, zero where none does (an atomic max of i + 1 a position, into zeros); the
update then gathers v at those positions, so where indices repeat the last value wins, as numpy's
indexed assignment leaves it. Its checked form skips and flags an index out of range, as above.
"""

from __future__ import annotations

import numpy as np

import hal

from .. import dtypes as _dt
from .source import WORKGROUP, KernelSource, checked_pair, checked_pair_dispatch, grid_1d, source

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


# ---- scatter_last --------------------------------------------------------------------------------

def last_source() -> KernelSource:
    key = ("scatter_last",)
    exports = [hal.Export("scatter_last", (WORKGROUP, 1, 1), 2, 3),
               hal.Export("scatter_last_checked", (WORKGROUP, 1, 1), 3, 3)]
    return source(key, lambda: KernelSource(key, exports, _last_cuda, _last_numpy_fns))


def _last_cuda() -> str:
    loop = "for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x)"
    return f"""
extern "C" __global__ void scatter_last(u32* __restrict__ out, const long long* __restrict__ idx, u32 n, u32 ioff,
                                        u32 m) {{
  {loop} {{
    long long j = idx[ioff + i];
    j = j < 0 ? 0 : (j >= (long long)m ? (long long)m - 1 : j);
    atomicMax(out + j, (u32)(i + 1u));
  }}
}}

extern "C" __global__ void scatter_last_checked(u32* __restrict__ out, const long long* __restrict__ idx,
                                                unsigned int* __restrict__ status, u32 n, u32 ioff, u32 m) {{
  {loop} {{
    const long long j = idx[ioff + i];
    if (j < 0 || j >= (long long)m) {{
      status[0] = 1u;
      continue;
    }}
    atomicMax(out + j, (u32)(i + 1u));
  }}
}}
"""


def _last_numpy_fns() -> dict:
    def run(checked: bool):
        def last(wg, bindings, c):
            n, ioff, m = c
            out = np.frombuffer(bindings[0], dtype=np.uint32, count=m)
            idx = np.frombuffer(bindings[1], dtype=np.int64, count=n, offset=ioff * 8)
            at = np.arange(1, n + 1, dtype=np.uint32)
            if checked:
                good = (idx >= 0) & (idx < m)
                if not good.all():
                    np.frombuffer(bindings[2], dtype=np.uint32, count=1)[0] = 1
                    idx, at = idx[good], at[good]
            else:
                idx = np.clip(idx, 0, m - 1)
            np.maximum.at(out, idx, at)
        return last
    return {"scatter_last": run(False), "scatter_last_checked": run(True)}


#: Positions (and output elements) scatter_last counts at most: one plus a position is a uint32.
LAST_MAX = (1 << 32) - 2


def plan_last(node, layouts: list, ctx) -> list:
    """A "scatter_last" node (params: output elements, mode): input 0 the int64 indices, input 1 the
    checked form's status word."""
    m, mode = node.params
    if m == 0:
        return []
    n = node.inputs[0].size
    fill = ("fill", ("out",), 0, 4)
    if n == 0:
        return [fill]
    ioff = layouts[0][2]
    checked = mode == "raise"
    roles = [("out",), ("in", 0), ("in", 1)] if checked else [("out",), ("in", 0)]
    return [fill, ("barrier",), ("dispatch", last_source(), "scatter_last_checked" if checked else "scatter_last",
                                 (grid_1d(n), 1, 1), [n, ioff, m], roles)]
