"""Reductions over a strided axis whose kept innermost axis is contiguous (a column sum, `x.sum(axis=0)`).

The input is viewed as x[a, r, b] = base[off + a*sA + r*sR + b]: the reduced
axis r, the kept axes a (outer) and b (inner, unit stride). Reading one output
per workgroup along r (the row kernels' way) would make every thread of a warp
touch its own cache line. Here a workgroup owns a tile of 32*VEC adjacent
columns b and 8 lanes of r: each warp reads 32*VEC consecutive elements of one
row (coalesced, VEC = 4 elements per load where rows start aligned), the 8
lanes' partials meet in shared memory. A tall matrix would leave the GPU with
one workgroup per column tile, so the reduced axis is split into C chunks
(enough workgroups to fill every SM a few times) whose partials, laid out
(a, chunk, b), a second `combine` kernel reduces, also reading along b.
"""

from __future__ import annotations

import numpy as np

import hal

from .. import dtypes as _dt
from .cuda_common import load_expr, store_expr
from .numpy_util import ERRSTATE, signed, store, strided_view, to_compute
from .reduce_ops import acc_dtype, c_combine, c_identity, np_reduce
from .source import WORKGROUP, KernelSource, source, u32

OPS = frozenset(("sum", "mean", "max", "min", "prod"))
#: Columns a kept inner axis needs at least for this kernel (fewer leave most lanes idle).
MIN_COLUMNS = 16
#: Workgroups the first pass aims at (132 SMs on an H100, several resident each).
TARGET_GROUPS = 1024
LANES = 8  # lanes of r a workgroup reads at once (WORKGROUP = 32 columns x LANES)
_NCONST = 9  # A, R, B, off, sA, sR, chunk, C, (unused: keeps the partial and final kernels alike)


def _names(op, dt, out, vec) -> dict:
    base = f"colred_{op}_{dt.code}_{out.code}_v{vec}"
    return {"final": base, "part": base + "_p", "combine": base + "_c"}


def columns_source(op: str, dt, out, vec: int) -> KernelSource:
    key = ("colreduce", op, dt.name, out.name, vec)
    names = _names(op, dt, out, vec)
    exports = [hal.Export(names["final"], (WORKGROUP, 1, 1), 2, _NCONST),
               hal.Export(names["part"], (WORKGROUP, 1, 1), 2, _NCONST),
               hal.Export(names["combine"], (WORKGROUP, 1, 1), 2, 4)]
    return source(key, lambda: KernelSource(key, exports, lambda: _cuda(op, dt, out, vec, names),
                                            lambda: _numpy(op, dt, out, names)))


def _final(op: str, out, value: str, count: str) -> str:
    if op == "mean":
        f = out.c_compute if out.is_float else "double"
        value = f"({f})({value}) / ({f}){count}"
    return store_expr(out, value)


def _cuda(op, dt, out, vec, names) -> str:
    acc = acc_dtype(op, dt)
    A = acc.c_compute
    ident = c_identity(op, acc)
    S = dt.c_storage
    lines = [f"RT_DEV {A} rt_comb({A} x, {A} y) {{ return {c_combine(op, acc)}; }}"]
    for kind in ("final", "part"):
        dest = f"{out.c_storage}* __restrict__ out" if kind == "final" else f"{A}* __restrict__ pv"
        body = [
            f"  constexpr u32 VEC = {vec}, LANES = {LANES};",
            "  const u32 tx = threadIdx.x % 32, ty = threadIdx.x / 32;",
            "  const u32 b0 = (blockIdx.x * 32 + tx) * VEC, a = blockIdx.z, ck = blockIdx.y;",
            "  const u32 r0 = ck * chunk, r1 = r0 + chunk < R ? r0 + chunk : R;",
            f"  {A} v[VEC];",
            "  #pragma unroll",
            f"  for (u32 e = 0; e < VEC; ++e) v[e] = {ident};",
            "  if (b0 < B) {",
            "    const i64 base = (i64)off + (i64)(int)sA * a + b0;",
            "    const i64 step = (i64)(int)sR;",
            "    u32 r = r0 + ty;",
            # Four rows in flight a thread: loads issued before their values are combined.
            "    for (; r + 3 * LANES < r1; r += 4 * LANES) {",
        ]
        if vec == 4:
            body += [f"      const rt_vec4<{S}> w0 = *reinterpret_cast<const rt_vec4<{S}>*>(x + base + step * r);",
                     f"      const rt_vec4<{S}> w1 = *reinterpret_cast<const rt_vec4<{S}>*>"
                     "(x + base + step * (r + LANES));",
                     f"      const rt_vec4<{S}> w2 = *reinterpret_cast<const rt_vec4<{S}>*>"
                     "(x + base + step * (r + 2 * LANES));",
                     f"      const rt_vec4<{S}> w3 = *reinterpret_cast<const rt_vec4<{S}>*>"
                     "(x + base + step * (r + 3 * LANES));",
                     "      #pragma unroll",
                     "      for (u32 e = 0; e < 4; ++e) {",
                     f"        v[e] = rt_comb(v[e], ({A}){load_expr(dt, 'w0.v[e]')});",
                     f"        v[e] = rt_comb(v[e], ({A}){load_expr(dt, 'w1.v[e]')});",
                     f"        v[e] = rt_comb(v[e], ({A}){load_expr(dt, 'w2.v[e]')});",
                     f"        v[e] = rt_comb(v[e], ({A}){load_expr(dt, 'w3.v[e]')});",
                     "      }",
                     "    }",
                     "    for (; r < r1; r += LANES) {",
                     f"      const rt_vec4<{S}> w0 = *reinterpret_cast<const rt_vec4<{S}>*>(x + base + step * r);",
                     "      #pragma unroll",
                     f"      for (u32 e = 0; e < 4; ++e) v[e] = rt_comb(v[e], ({A}){load_expr(dt, 'w0.v[e]')});",
                     "    }"]
        else:
            ld = lambda k: f"({A}){load_expr(dt, f'x[base + step * (r + {k} * LANES)]')}"  # noqa: E731
            body += [f"      const {A} w0 = {ld(0)}, w1 = {ld(1)}, w2 = {ld(2)}, w3 = {ld(3)};",
                     "      v[0] = rt_comb(rt_comb(v[0], w0), rt_comb(w1, rt_comb(w2, w3)));"
                     if op in ("max", "min") else
                     "      v[0] = rt_comb(rt_comb(rt_comb(rt_comb(v[0], w0), w1), w2), w3);",
                     "    }",
                     "    for (; r < r1; r += LANES)",
                     f"      v[0] = rt_comb(v[0], ({A}){load_expr(dt, 'x[base + step * r]')});"]
        body += [
            "  }",
            # The LANES partials of each column meet in shared memory; lane 0 finishes them.
            f"  __shared__ {A} sh[LANES][32 * VEC + 1];",
            "  #pragma unroll",
            "  for (u32 e = 0; e < VEC; ++e) sh[ty][tx * VEC + e] = v[e];",
            "  __syncthreads();",
            "  if (ty != 0 || b0 >= B) return;",
            "  #pragma unroll",
            "  for (u32 e = 0; e < VEC; ++e) {",
            "    for (u32 k = 1; k < LANES; ++k) v[e] = rt_comb(v[e], sh[k][tx * VEC + e]);",
            "    if (VEC == 1 || b0 + e < B) {",
        ]
        if kind == "final":
            body.append(f"      out[(u64)a * B + b0 + e] = {_final(op, out, 'v[e]', 'R')};")
        else:
            body.append("      pv[((u64)a * C + ck) * B + b0 + e] = v[e];")
        body += ["    }", "  }"]
        params = [dest, f"const {S}* __restrict__ x", "u32 A", "u32 R", "u32 B", "u32 off", "u32 sA", "u32 sR",
                  "u32 chunk", "u32 C", "u32 unused"]
        lines.append(f'extern "C" __global__ void {names[kind]}({", ".join(params)}) {{\n' + "\n".join(body) + "\n}")
    # combine: one thread per output, the C partials of a column read along b (coalesced).
    body = ["  const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;",
            "  if (i >= (u64)A * B) return;",
            "  const u64 a = i / B, b = i - a * B;",
            f"  {A} v = {ident};",
            "  for (u32 c = 0; c < C; ++c) v = rt_comb(v, pv[(a * C + c) * B + b]);",
            f"  out[i] = {_final(op, out, 'v', 'R')};"]
    params = [f"{out.c_storage}* __restrict__ out", f"const {A}* __restrict__ pv", "u32 A", "u32 B", "u32 C", "u32 R"]
    lines.append(f'extern "C" __global__ void {names["combine"]}({", ".join(params)}) {{\n' + "\n".join(body) + "\n}")
    return "\n".join(lines) + "\n"


# ---- numpy ------------------------------------------------------------------------------------

def _numpy(op, dt, out, names) -> dict:
    acc = acc_dtype(op, dt)

    def view(bindings, c):
        A, R, B, off, sA, sR = c[0], c[1], c[2], c[3], signed(c[4]), signed(c[5])
        x = strided_view(bindings[1], dt, (A, B, R), (sA, 1, sR), off)
        x = to_compute(x, dt)
        if dt is _dt.float16 and op in ("sum", "mean", "prod"):
            x = x.astype(np.float32)
        return x.reshape(A * B, R), A, R, B

    def final(wg, bindings, c):
        x, A, R, B = view(bindings, c)
        store(np.frombuffer(bindings[0], out.storage, A * B), np_reduce(op, x, dt, out), out)

    def part(wg, bindings, c):
        x, A, R, B = view(bindings, c)
        chunk, C = c[6], c[7]
        pv = np.frombuffer(bindings[0], acc.storage, A * C * B).reshape(A, C, B)
        with np.errstate(**ERRSTATE):
            for k in range(C):
                piece = x[:, k * chunk:(k + 1) * chunk]
                pv[:, k, :] = np_reduce("sum" if op == "mean" else op, piece, dt, out).astype(acc.storage) \
                    .reshape(A, B)

    def combine(wg, bindings, c):
        A, B, C, R = c
        pv = np.frombuffer(bindings[1], acc.storage, A * C * B).reshape(A, C, B)
        with np.errstate(**ERRSTATE):
            if op in ("sum", "mean"):
                r = pv.sum(axis=1, dtype=acc.storage)
                if op == "mean":
                    f = out.storage if out.is_float and out is not _dt.bfloat16 else np.dtype(np.float32)
                    r = r.astype(f) / f.type(R)
            elif op == "prod":
                r = pv.prod(axis=1, dtype=acc.storage)
            else:
                r = (np.maximum if op == "max" else np.minimum).reduce(pv, axis=1)
        store(np.frombuffer(bindings[0], out.storage, A * B), r.reshape(-1), out)

    return {names["final"]: final, names["part"]: part, names["combine"]: combine}


# ---- planning ---------------------------------------------------------------------------------

def plan(op: str, dt, out, kept: tuple, kept_strides: tuple, R: int, sR: int, offset: int):
    """Commands of the column reduction, or None where it does not apply: kept axes collapsed to
    `kept` (one or two dims, the last of unit stride), the reduced ones to one axis of R elements."""
    if (op not in OPS or dt.is_complex or not kept or len(kept) > 2 or kept_strides[-1] != 1
            or kept[-1] < MIN_COLUMNS or R == 0):
        return None
    B = kept[-1]
    A, sA = (kept[0], kept_strides[0]) if len(kept) == 2 else (1, 0)
    if A > 65535:
        return None
    vec = 4 if B % 4 == 0 and offset % 4 == 0 and sA % 4 == 0 and sR % 4 == 0 else 1
    tiles = -(-B // (32 * vec)) * A
    C = max(1, min(-(-TARGET_GROUPS // tiles), R // (8 * LANES)))
    chunk = -(-R // C)
    C = -(-R // chunk)
    src = columns_source(op, dt, out, vec)
    names = _names(op, dt, out, vec)
    consts = [A, R, B, offset, u32(sA), u32(sR), chunk, C, 0]
    grid = (-(-B // (32 * vec)), C, A)
    if C == 1:
        return [("dispatch", src, names["final"], grid, consts, [("out",), ("in", 0)])]
    return [("temps", [A * C * B * acc_dtype(op, dt).itemsize]),
            ("dispatch", src, names["part"], grid, consts, [("tmp", 0), ("in", 0)]),
            ("barrier",),
            ("dispatch", src, names["combine"], (-(-A * B // WORKGROUP), 1, 1), [A, B, C, R],
             [("out",), ("tmp", 0)])]
