"""Counter-based random numbers: Philox4x32-10, the same stream from CUDA C and numpy.

Element i of an array drawn with key (k0, k1) uses the Philox block of counter
(i_lo, i_hi, 0, 0): uniform takes word 0, normal uses words 0 and 1
(Box-Muller), `bits` returns word 0.
"""

from __future__ import annotations

import numpy as np

import hal

from .. import dtypes as _dt
from .cuda_common import store_expr
from .numpy_util import ERRSTATE, store
from .source import WORKGROUP, KernelSource, grid_1d, source

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
_TWO_PI = 6.283185307179586


def random_source(dist: str, dt) -> KernelSource:
    key = ("random", dist, dt.name)
    name = f"random_{dist}_{dt.code}"
    return source(key, lambda: KernelSource(
        key, [hal.Export(name, (WORKGROUP, 1, 1), 2, 2)],
        lambda: _cuda(dist, dt, name), lambda: {name: _numpy_fn(dist, dt)}))


def _cuda(dist, dt, name) -> str:
    if dist == "bits":
        value = "(int)w0"
    elif dist == "uniform":
        m = _mantissa_bits(dt)
        value = f"(float)(w0 >> {32 - m}) * {2.0 ** -m!r}f"
    else:
        value = ("sqrtf(-2.0f * logf(((float)(w0 >> 8) + 1.0f) * 5.9604644775390625e-08f))"
                 f" * cosf({_TWO_PI}f * ((float)(w1 >> 8) * 5.9604644775390625e-08f))")
    store = "(int)w0" if dist == "bits" else store_expr(dt, "v")
    return f"""
RT_DEV void rt_philox(u32 c0, u32 c1, u32 k0, u32 k1, u32& w0, u32& w1) {{
  u32 c2 = 0, c3 = 0;
  #pragma unroll
  for (int r = 0; r < 10; ++r) {{
    const u64 p0 = (u64){M0}u * c0, p1 = (u64){M1}u * c2;
    const u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0, hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
    c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    k0 += {W0}u; k1 += {W1}u;
  }}
  w0 = c0; w1 = c1;
}}
extern "C" __global__ void {name}({dt.c_storage}* __restrict__ out, const int* __restrict__ key, u32 n, u32 koff) {{
  const u32 k0 = (u32)key[koff], k1 = (u32)key[koff + 1];
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)blockDim.x * gridDim.x) {{
    u32 w0, w1;
    rt_philox((u32)i, (u32)(i >> 32), k0, k1, w0, w1);
    const float v = {value if dist != "bits" else "0.0f"};
    (void)w1; (void)v;
    out[i] = {store};
  }}
}}
"""


def _mantissa_bits(dt) -> int:
    """Random bits a uniform draw of `dt` uses: k * 2**-m for k < 2**m is exact in dt, so a draw
    never rounds up to 1.0 (float16 has 11 significant bits, bfloat16 8)."""
    return {"f16": 11, "bf16": 8}.get(dt.code, 24)


def philox(counter: np.ndarray, k0: int, k1: int):
    """Philox4x32-10 of counters (lo = counter, others 0) -> words 0 and 1 (uint32 arrays)."""
    c0 = counter.astype(np.uint64)
    c1 = np.zeros_like(c0)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    mask = np.uint64(0xFFFFFFFF)
    m0, m1 = np.uint64(M0), np.uint64(M1)
    ka, kb = k0, k1
    for _ in range(10):
        p0 = c0 * m0
        p1 = c2 * m1
        hi0, lo0 = p0 >> np.uint64(32), p0 & mask
        hi1, lo1 = p1 >> np.uint64(32), p1 & mask
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(ka), lo1, hi0 ^ c3 ^ np.uint64(kb), lo0
        ka = (ka + W0) & 0xFFFFFFFF
        kb = (kb + W1) & 0xFFFFFFFF
    return c0.astype(np.uint32), c1.astype(np.uint32)


def _numpy_fn(dist, dt):
    def run(wg, bindings, c):
        n, koff = c[0], c[1]
        key = np.frombuffer(bindings[1], dtype=np.int32)[koff:koff + 2].view(np.uint32)
        k0, k1 = int(key[0]), int(key[1])
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=n)
        step = 1 << 22  # bounded temporaries for big draws
        with np.errstate(**ERRSTATE):
            for s in range(0, n, step):
                e = min(n, s + step)
                w0, w1 = philox(np.arange(s, e, dtype=np.uint64), k0, k1)
                if dist == "bits":
                    out[s:e] = w0.view(np.int32)
                    continue
                if dist == "uniform":
                    m = _mantissa_bits(dt)
                    v = (w0 >> (32 - m)).astype(np.float32) * np.float32(2.0 ** -m)
                else:
                    u1 = ((w0 >> 8).astype(np.float32) + np.float32(1.0)) * np.float32(5.9604644775390625e-08)
                    u2 = (w1 >> 8).astype(np.float32) * np.float32(5.9604644775390625e-08)
                    v = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(_TWO_PI) * u2)
                store(out[s:e], v, dt)
    return run


def plan(node, layouts: list, ctx) -> list:
    n = node.size
    if n == 0:
        return []
    dist = node.params
    src = random_source(dist, node.dtype)
    return [("dispatch", src, f"random_{dist}_{node.dtype.code}", (grid_1d(n), 1, 1),
             [n, layouts[0][2]], [("out",), ("in", 0)])]


_ = _dt
