"""`pad`: scatter a basic-index window back into zeros (the gradient of slicing)."""

from __future__ import annotations

import numpy as np

import hal

from ..shapes import MAX_DIMS, contiguous_strides, size_of
from .complex import SOURCE as COMPLEX_SOURCE
from .cuda_common import load_expr, store_expr
from .numpy_util import signed, strided_view
from .source import WORKGROUP, KernelSource, grid_1d, source, u32

_NCONST = 2 + MAX_DIMS * 5 + 1  # n, ndim, shape, start, step, count, g strides, g offset


def pad_source(dt) -> KernelSource:
    key = ("pad", dt.name)
    name = f"pad_{dt.code}"
    return source(key, lambda: KernelSource(
        key, [hal.Export(name, (WORKGROUP, 1, 1), 2, _NCONST)], lambda: _cuda(dt, name),
        lambda: {name: _numpy_fn(dt)}))


def _cuda(dt, name) -> str:
    arrs = []
    params = [f"{dt.c_storage}* __restrict__ out", f"const {dt.c_storage}* __restrict__ g", "u32 n", "u32 ndim"]
    for p in ("s", "b", "e", "c", "t"):
        params += [f"u32 {p}{d}" for d in range(MAX_DIMS)]
        arrs.append(f"  const int {p}[{MAX_DIMS}] = {{{', '.join(f'(int){p}{d}' for d in range(MAX_DIMS))}}};")
    params.append("u32 goff")
    zero = store_expr(dt, "0")
    val = store_expr(dt, load_expr(dt, "g[pg]"))
    return (COMPLEX_SOURCE if dt.is_complex else "") + f"""
extern "C" __global__ void {name}({", ".join(params)}) {{
{chr(10).join(arrs)}
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{
    u64 rem = i; i64 pg = goff; bool inside = true;
    #pragma unroll
    for (int d = {MAX_DIMS - 1}; d >= 0; --d) {{
      if (d < (int)ndim) {{
        const u64 q = rem / (u32)s[d]; const int x = (int)(rem - q * (u32)s[d]); rem = q;
        const int rel = x - b[d];
        const int j = rel / e[d];
        if (rel % e[d] != 0 || j < 0 || j >= c[d]) inside = false;
        pg += (i64)j * t[d];
      }}
    }}
    out[i] = inside ? {val} : {zero};
  }}
}}
"""


def _numpy_fn(dt):
    def run(wg, bindings, c):
        n, ndim = c[0], c[1]
        vals = [tuple(signed(v) for v in c[2 + k * MAX_DIMS:2 + k * MAX_DIMS + ndim]) for k in range(5)]
        shape, start, step, count, gstr = vals
        goff = c[2 + 5 * MAX_DIMS]
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=n).reshape(shape)
        out[...] = 0
        if 0 in count:
            return
        g = strided_view(bindings[1], dt, count, gstr, goff)
        index = tuple(slice(b, b + e * (k - 1) + (1 if e > 0 else -1), e) if b + e * (k - 1) + (1 if e > 0 else -1) >= 0
                      else slice(b, None, e) for b, e, k in zip(start, step, count))
        out[index] = g
    return run


def plan(node, layouts: list, ctx) -> list:
    in_shape, info = node.params
    n = size_of(in_shape)
    if n == 0:
        return []
    (gshape, gstr, goff), = layouts
    # g has the kept axes of the index; integer-indexed axes become count-1 axes of stride 0.
    full_strides = []
    gi = 0
    gstrides = list(gstr)
    for (_, _, _, keep) in info:
        if keep:
            full_strides.append(gstrides[gi])
            gi += 1
        else:
            full_strides.append(0)
    nd = len(in_shape)
    if nd > MAX_DIMS:
        raise hal.InvalidArgumentError("too many dimensions")
    pad = [0] * (MAX_DIMS - nd)
    consts = [n, nd] + list(in_shape) + pad
    consts += [start for start, _, _, _ in info] + pad
    consts += [u32(step) for _, step, _, _ in info] + pad
    consts += [count for _, _, count, _ in info] + pad
    consts += [u32(s) for s in full_strides] + pad + [goff]
    src = pad_source(node.dtype)
    return [("dispatch", src, f"pad_{node.dtype.code}", (grid_1d(n), 1, 1), consts, [("out",), ("in", 0)])]


_ = contiguous_strides
