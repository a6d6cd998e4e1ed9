"""``tril`` / ``triu``: a matrix, or a batch of them, with the elements on one side of a diagonal
set to zero, in one pass over it.

Each element's row and column come from its index, so no mask is read: the mask these ops
multiplied by was made on the host and uploaded at each call past the size kept on the device
(16 MB of bools for a 4096x4096 matrix, 0.002x PyTorch's ``tril`` on an H200). Where the rows'
length and the input's offset are multiples of 4, a thread moves 4 neighbours of one row as one
vector.
"""

from __future__ import annotations

import numpy as np

import hal

from ..shapes import size_of
from .complex import SOURCE as COMPLEX_SOURCE
from .cuda_common import store_expr
from .source import WORKGROUP, KernelSource, grid_1d, source, u32

#: Constants: the element count, rows, columns, the diagonal's offset k (signed), 1 for triu (keep
#: column - row >= k) or 0 for tril (keep column - row <= k), the input's offset in elements.
_NCONST = 6


def tri_source(dt) -> KernelSource:
    key = ("tri", dt.name)
    name = f"tri_{dt.code}"
    return source(key, lambda: KernelSource(
        key, [hal.Export(name, (WORKGROUP, 1, 1), 2, _NCONST)], lambda: _cuda(dt, name),
        lambda: {name: _numpy_fn(dt)}))


def _cuda(dt, name: str) -> str:
    t = dt.c_storage
    return (COMPLEX_SOURCE if dt.is_complex else "") + f"""
extern "C" __global__ void {name}({t}* __restrict__ out, const {t}* __restrict__ x, u32 n, u32 rows,
                                  u32 cols, u32 kk, u32 upper, u32 off) {{
  const i64 k = (i64)(int)kk;
  const {t} zero = {store_expr(dt, "0")};
  if (((cols | off) & 3u) == 0) {{
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < (n >> 2); j += (u64)blockDim.x * gridDim.x) {{
      const u32 i = (u32)j << 2;
      const u32 q = i / cols;
      const i64 diagonal = (i64)(i - q * cols) - (i64)(q % rows);  // column - row of the first
      rt_vec4<{t}> w = reinterpret_cast<const rt_vec4<{t}>*>(x + off)[j];
      #pragma unroll
      for (int e = 0; e < 4; ++e) {{
        const i64 d = diagonal + e;
        if (upper ? d < k : d > k) w.v[e] = zero;
      }}
      reinterpret_cast<rt_vec4<{t}>*>(out)[j] = w;
    }}
    return;
  }}
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{
    const u32 q = (u32)i / cols;
    const i64 d = (i64)((u32)i - q * cols) - (i64)(q % rows);
    out[i] = (upper ? d < k : d > k) ? zero : x[off + i];
  }}
}}
"""


def _numpy_fn(dt):
    def run(workgroups, bindings, c):
        n, rows, cols, k, upper, off = c
        k = k - (1 << 32) if k >= 1 << 31 else k
        x = np.frombuffer(bindings[1], dt.storage, n, off * dt.itemsize).reshape(-1, rows, cols)
        out = np.frombuffer(bindings[0], dt.storage, n).reshape(-1, rows, cols)
        out[...] = np.triu(x, k) if upper else np.tril(x, k)
    return run


def plan(node, layouts: list, ctx) -> list:
    """One dispatch over ``node``'s elements; its input is dense from its offset (``ops.dense``)."""
    n = size_of(node.shape)
    if n == 0:
        return []
    k, upper = node.params
    rows, cols = node.shape[-2:]
    (_, _, offset), = layouts
    consts = [n, rows, cols, u32(k), int(upper), offset]
    per_thread = 4 if cols % 4 == 0 and offset % 4 == 0 else 1
    return [("dispatch", tri_source(node.dtype), f"tri_{node.dtype.code}", (grid_1d(n // per_thread), 1, 1), consts,
             [("out",), ("in", 0)])]
