"""Reductions (sum, mean, max, min, argmax, argmin) over arbitrary axes.

The input view is permuted so the reduced axes come last and read as an
(O, R) matrix. Each workgroup reduces one chunk of one row with warp shuffles
and a shared-memory block step; long rows with few outputs are split into C
chunks, and the last of a row's workgroups to finish reduces the row's C
partials (one kernel: a second `combine` kernel cost the H100 about 3 us more).
It counts the finished workgroups of its row in a ticket (``ZeroedScratch``: zero
before the first launch, set back to zero by the last workgroup).
"""

from __future__ import annotations

import functools

import numpy as np

import hal

from .. import dtypes as _dt
from ..shapes import MAX_DIMS, collapse, contiguous_strides, size_of
from . import reduce_columns
from .complex import SOURCE as COMPLEX_SOURCE
from .complex import needs_source as needs_complex
from .complex import shfl_down
from .cuda_common import load_expr, store_expr, strided_positions
from .numpy_util import compute_np, signed, store, strided_view, to_compute
from .reduce_ops import acc_dtype, c_combine, c_identity, np_reduce
from .source import WORKGROUP, KernelSource, ZeroedScratch, row_chunks, source, u32

_ARG = ("argmax", "argmin")


def _names(op, dt, out):
    base = f"{op}_{dt.code}_{out.code}"
    return {"c": base + "_c", "g": base + "_g", "pc": base + "_pc", "pg": base + "_pg"}


_NCONST_C = 5  # O, R, chunk, offset, C
_NCONST_G = 5 + 1 + 2 * MAX_DIMS  # + ndim, shape, strides
#: Rows too few to fill the GPU are split into chunks of at least MIN_CHUNK elements, about
#: SPLIT_WORKGROUPS workgroups in all: on the H100 the sum of 64M float32 took 88 us with 1024
#: workgroups, 89-90.5 with 2048, 2112 or 4224; on an H200, 64.4 us with 512 (or 528), 65.2 with
#: 1024 or 1056, 65.9-67.4 with 2048-4096 (torch.sum 69.7, in the same process).
SPLIT_WORKGROUPS = 512
MIN_CHUNK = 2048

#: The last workgroup of a row to finish: each adds one to the row's ticket after writing its
#: partial (made visible first); the one that brings it to C sets it back to zero for the next
#: launch and, after a fence, reads every partial of the row from the L2.
_LAST_OF_ROW = """
RT_DEV bool rt_last_of_row(u32* ticket, u32 C) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(ticket, 1u) == C - 1u;
    if (last) *ticket = 0u;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}
"""


def reduce_source(op: str, dt, out) -> KernelSource:
    key = ("reduce", op, dt.name, out.name)
    return source(key, lambda: _build(op, dt, out, key))


def _build(op, dt, out, key):
    names = _names(op, dt, out)
    arg = op in _ARG
    nb_final = 2
    nb_part = 5 if arg else 4  # out, partial values (and indices), input, the rows' tickets
    exports = [
        hal.Export(names["c"], (WORKGROUP, 1, 1), nb_final, _NCONST_C),
        hal.Export(names["g"], (WORKGROUP, 1, 1), nb_final, _NCONST_G),
        hal.Export(names["pc"], (WORKGROUP, 1, 1), nb_part, _NCONST_C),
        hal.Export(names["pg"], (WORKGROUP, 1, 1), nb_part, _NCONST_G),
    ]
    return KernelSource(key, exports, lambda: _cuda(op, dt, out, names), lambda: _numpy(op, dt, out, names))


# ---- CUDA C -----------------------------------------------------------------------------------

def _cuda(op, dt, out, names) -> str:
    acc = acc_dtype(op, dt)
    A = acc.c_compute
    arg = op in _ARG
    ident = c_identity(op, acc)
    lines = [COMPLEX_SOURCE] if needs_complex(dt, out) else []
    if arg:
        better = ">" if op == "argmax" else "<"
        lines.append(f"""
RT_DEV bool rt_better({A} a, u32 ia, {A} b, u32 ib) {{
  const bool na = a != a, nb = b != b;
  if (na || nb) return na && (!nb || ia < ib);
  return a {better} b || (a == b && ia < ib);
}}
RT_DEV void rt_block_reduce({A}& v, u32& iv) {{
  __shared__ {A} sv[{WORKGROUP} / RT_WARP];
  __shared__ u32 si[{WORKGROUP} / RT_WARP];
  for (int o = RT_WARP / 2; o > 0; o /= 2) {{
    {A} w = RT_SHFL_DOWN(v, o); u32 iw = RT_SHFL_DOWN(iv, o);
    if (rt_better(w, iw, v, iv)) {{ v = w; iv = iw; }}
  }}
  const u32 lane = threadIdx.x % RT_WARP, warp = threadIdx.x / RT_WARP;
  if (lane == 0) {{ sv[warp] = v; si[warp] = iv; }}
  __syncthreads();
  if (warp == 0) {{
    v = lane < blockDim.x / RT_WARP ? sv[lane] : {ident};
    iv = lane < blockDim.x / RT_WARP ? si[lane] : 0xffffffffu;
    for (int o = RT_WARP / 2; o > 0; o /= 2) {{
      {A} w = RT_SHFL_DOWN(v, o); u32 iw = RT_SHFL_DOWN(iv, o);
      if (rt_better(w, iw, v, iv)) {{ v = w; iv = iw; }}
    }}
  }}
}}
""")
    else:
        comb = c_combine(op, acc)
        shfl = shfl_down(acc, "v", "o")
        lines.append(f"""
RT_DEV {A} rt_comb({A} x, {A} y) {{ return {comb}; }}
RT_DEV {A} rt_block_reduce({A} v) {{
  __shared__ {A} sv[{WORKGROUP} / RT_WARP];
  for (int o = RT_WARP / 2; o > 0; o /= 2) v = rt_comb(v, {shfl});
  const u32 lane = threadIdx.x % RT_WARP, warp = threadIdx.x / RT_WARP;
  if (lane == 0) sv[warp] = v;
  __syncthreads();
  if (warp == 0) {{
    v = lane < blockDim.x / RT_WARP ? sv[lane] : ({A}){ident};
    for (int o = RT_WARP / 2; o > 0; o /= 2) v = rt_comb(v, {shfl});
  }}
  return v;
}}
""")
    lines.append(_LAST_OF_ROW)
    load = load_expr(dt, "x[pos]")
    for variant in ("c", "g", "pc", "pg"):
        partial = variant.startswith("p")
        strided = variant.endswith("g")
        params = [f"{out.c_storage}* __restrict__ out"]
        if partial:  # (written and read back by other workgroups: not restrict)
            params.append(f"{A}* pv")
            if arg:
                params.append("u32* pi")
        params.append(f"const {dt.c_storage}* __restrict__ x")
        if partial:
            params.append("u32* __restrict__ tickets")
        params += ["u32 O", "u32 R", "u32 chunk", "u32 off", "u32 C"]
        if strided:
            params.append("u32 ndim")
            params += [f"u32 s{d}" for d in range(MAX_DIMS)]
            params += [f"u32 t{d}" for d in range(MAX_DIMS)]
        body = ["  const u32 o = blockIdx.x, ck = blockIdx.y;",
                "  const u64 r0 = (u64)ck * chunk;",
                "  const u64 r1 = r0 + chunk < R ? r0 + chunk : R;"]
        body.append(f"  {A} v = {ident};")
        if arg:
            body.append("  u32 iv = 0xffffffffu;")
        if not arg and not strided:
            # Contiguous rows: the row's 4-element vectors, from its first aligned element, dealt
            # out to its C chunks in turn (chunk ck reads vectors ck*B.. ck*B+B-1 of every C*B), four
            # in flight per thread, each read once (rt_load_once); chunk 0 also takes the
            # unaligned head and tail one by one. On the H100 this read 64M float32 in 88 us,
            # contiguous chunks with plain loads in 90.
            T = dt.c_storage
            lv = lambda w: load_expr(dt, f"{w}.v[e]")  # noqa: E731
            body += [f"  {A} v1 = {ident}, v2 = {ident}, v3 = {ident};", *_row_vectors(T),
                     "  for (; q + 3u * S < qe; q += 4u * S) {",
                     f"    const rt_vec4<{T}> w0 = rt_load_once(x4 + q), w1 = rt_load_once(x4 + q + S);",
                     f"    const rt_vec4<{T}> w2 = rt_load_once(x4 + q + 2u * S), w3 = rt_load_once(x4 + q + 3u * S);",
                     "    #pragma unroll",
                     "    for (int e = 0; e < 4; ++e) {",
                     f"      v = rt_comb(v, ({A})({lv('w0')})); v1 = rt_comb(v1, ({A})({lv('w1')}));",
                     f"      v2 = rt_comb(v2, ({A})({lv('w2')})); v3 = rt_comb(v3, ({A})({lv('w3')}));",
                     "    }",
                     "  }",
                     "  for (; q < qe; q += S) {",
                     f"    const rt_vec4<{T}> w0 = rt_load_once(x4 + q);",
                     "    #pragma unroll",
                     f"    for (int e = 0; e < 4; ++e) v = rt_comb(v, ({A})({lv('w0')}));",
                     "  }",
                     "  v = rt_comb(rt_comb(v, v1), rt_comb(v2, v3));",
                     "  const u64 h1 = ck == 0 ? a0 : e0, t0 = ck == 0 ? a1 : e1;",
                     f"  for (u64 pos = e0 + threadIdx.x; pos < h1; pos += blockDim.x) v = rt_comb(v, ({A})({load}));",
                     "  for (u64 pos = t0 + threadIdx.x; pos < e1; pos += blockDim.x) {"]
        elif arg and not strided:
            # The same vectors of the row, each element ranked with its index (rt_better keeps the
            # first of equal values whatever the order they are met in), two vectors in flight a
            # thread; then the head and tail one by one. One element a thread an iteration read
            # 2**24 float32 in twice PyTorch's time on an H200.
            T = dt.c_storage
            lv = lambda w: load_expr(dt, f"{w}.v[e]")  # noqa: E731
            rank = "if (rt_better({e}, {r}, {v}, {i})) {{ {v} = {e}; {i} = {r}; }}"
            body += [f"  {A} v1 = {ident}; u32 iv1 = 0xffffffffu;", *_row_vectors(T),
                     "  for (; q + S < qe; q += 2u * S) {",
                     f"    const rt_vec4<{T}> w0 = rt_load_once(x4 + q), w1 = rt_load_once(x4 + q + S);",
                     "    const u32 ra = (u32)((q << 2) - e0), rb = (u32)(((q + S) << 2) - e0);",
                     "    #pragma unroll",
                     "    for (int e = 0; e < 4; ++e) {",
                     f"      const {A} x0 = ({A})({lv('w0')}), x1 = ({A})({lv('w1')});",
                     "      " + rank.format(e="x0", r="ra + e", v="v", i="iv"),
                     "      " + rank.format(e="x1", r="rb + e", v="v1", i="iv1"),
                     "    }",
                     "  }",
                     "  for (; q < qe; q += S) {",
                     f"    const rt_vec4<{T}> w0 = rt_load_once(x4 + q);",
                     "    const u32 ra = (u32)((q << 2) - e0);",
                     "    #pragma unroll",
                     "    for (int e = 0; e < 4; ++e) {",
                     f"      const {A} x0 = ({A})({lv('w0')});",
                     "      " + rank.format(e="x0", r="ra + e", v="v", i="iv"),
                     "    }",
                     "  }",
                     "  " + rank.format(e="v1", r="iv1", v="v", i="iv"),
                     "  const u64 h1 = ck == 0 ? a0 : e0, t0 = ck == 0 ? a1 : e1;",
                     "  for (u64 pos = e0 + threadIdx.x; pos < h1; pos += blockDim.x) {",
                     f"    const {A} x0 = ({A})({load}); const u32 r = (u32)(pos - e0);",
                     "    " + rank.format(e="x0", r="r", v="v", i="iv"),
                     "  }",
                     "  for (u64 pos = t0 + threadIdx.x; pos < e1; pos += blockDim.x) {",
                     "    const u64 r = pos - e0;"]
        else:
            body.append("  for (u64 r = r0 + threadIdx.x; r < r1; r += blockDim.x) {")
        if strided:
            body += strided_positions("(u32)((u64)o * R + r)", [("pos", "off", "t")], MAX_DIMS, "    ")

        body.append(f"    const {A} e = ({A})({load});")
        if arg:
            body.append("    if (rt_better(e, (u32)r, v, iv)) { v = e; iv = (u32)r; }")
        else:
            body.append("    v = rt_comb(v, e);")
        body.append("  }")
        if arg:
            body.append("  rt_block_reduce(v, iv);")
        else:
            body.append("  v = rt_block_reduce(v);")
        final = "(iv == 0xffffffffu ? 0u : iv)" if arg else _mean(out) if op == "mean" else "v"
        if partial:
            body += ["  if (threadIdx.x == 0) {",
                     "    pv[(u64)o * C + ck] = v;"]
            if arg:
                body.append("    pi[(u64)o * C + ck] = iv;")
            body += ["  }",
                     "  if (!rt_last_of_row(tickets + o, C)) return;",
                     f"  v = {ident};"]
            if arg:
                body += ["  iv = 0xffffffffu;",
                         "  for (u32 c = threadIdx.x; c < C; c += blockDim.x) {",
                         f"    const {A} w = rt_load_l2(pv + (u64)o * C + c);",
                         "    const u32 iw = rt_load_l2(pi + (u64)o * C + c);",
                         "    if (rt_better(w, iw, v, iv)) { v = w; iv = iw; }",
                         "  }",
                         "  rt_block_reduce(v, iv);"]
            else:
                body += ["  for (u32 c = threadIdx.x; c < C; c += blockDim.x)",
                         "    v = rt_comb(v, rt_load_l2(pv + (u64)o * C + c));",
                         "  v = rt_block_reduce(v);"]
        body.append(f"  if (threadIdx.x == 0) out[o] = {store_expr(out, final)};")
        name = names[variant]
        lines.append(f'extern "C" __global__ void {name}({", ".join(params)}) {{\n' + "\n".join(body) + "\n}\n")
    return "\n".join(lines)


def _row_vectors(T: str) -> list:
    """The contiguous row o's bounds (elements [e0, e1)), its aligned middle [a0, a1) as 4-element
    vectors x4[q] up to qe, and this thread's first vector q of chunk ck, S vectors apart."""
    return ["  const u64 e0 = (u64)off + (u64)o * R, e1 = e0 + R;",
            "  u64 a0 = (e0 + 3u) & ~(u64)3;",
            "  if (a0 > e1) a0 = e1;",
            "  const u64 a1 = a0 + ((e1 - a0) & ~(u64)3), qe = a1 >> 2, S = (u64)C * blockDim.x;",
            f"  const rt_vec4<{T}>* x4 = reinterpret_cast<const rt_vec4<{T}>*>(x);",
            "  u64 q = (a0 >> 2) + (u64)ck * blockDim.x + threadIdx.x;"]


def _mean(out) -> str:
    f = out.c_compute if out.is_float or out.is_complex else "double"
    return f"({f})v / ({f})R"


# ---- numpy ------------------------------------------------------------------------------------

def _numpy(op, dt, out, names) -> dict:
    def run(bindings, c, strided):
        n_out, R, off = c[0], c[1], c[3]
        if strided:
            ndim = c[5]
            shape = tuple(c[6:6 + ndim])
            strides = tuple(signed(s) for s in c[6 + MAX_DIMS:6 + MAX_DIMS + ndim])
            x = strided_view(bindings[1], dt, shape, strides, off).reshape(n_out, R)
        else:
            x = np.frombuffer(bindings[1], dtype=dt.storage)[off:off + n_out * R].reshape(n_out, R)
        x = to_compute(x, dt)
        if dt is _dt.float16 and op in ("sum", "mean", "prod"):
            x = x.astype(np.float32)
        res = np_reduce(op, x, dt, out)
        o = np.frombuffer(bindings[0], dtype=out.storage, count=n_out)
        store(o, res, out)

    def final_c(wg, bindings, c):
        run(bindings, c, False)

    if dt is _dt.float32 and out is _dt.float32 and op in ("sum", "mean", "max", "min"):
        def prepare(wg, bindings, c):
            """The reduction bound once to its views, written straight into the output (see cpu_program)."""
            n_out, R, off = c[0], c[1], c[3]
            if R == 0:
                return None
            x = np.frombuffer(bindings[1], dtype=np.float32, count=n_out * R, offset=off * 4)
            o = np.frombuffer(bindings[0], dtype=np.float32, count=n_out)
            if n_out == 1:  # a full reduction: the flat row into a 0-d output (~0.15 us less than (1, R))
                o = o.reshape(())
            else:
                x = x.reshape(n_out, R)
            ufunc = np.maximum if op == "max" else np.minimum if op == "min" else np.add
            # reduce(array, axis, dtype, out) positionally: no keyword dict merged per call
            reduce = functools.partial(ufunc.reduce, x, x.ndim - 1, None, o)
            if op != "mean":
                return reduce
            # The division as its own C-level call after the sum (as numpy's mean divides; a Python
            # closure making both calls cost ~0.5 us more), by a 0-d array: a numpy scalar operand
            # is converted at every call (~0.15 us).
            return reduce, functools.partial(np.divide, o, np.array(R, np.float32), o)

        final_c.prepare = prepare

    def final_g(wg, bindings, c):
        run(bindings, c, True)

    def unsupported(wg, bindings, c):
        raise hal.UnimplementedError("split reductions are planned for GPU devices only")

    return {names["c"]: final_c, names["g"]: final_g, names["pc"]: unsupported,
            names["pg"]: unsupported}


# ---- planning ---------------------------------------------------------------------------------

def plan(node, layouts: list, ctx) -> list:
    (shape, strides, offset), = layouts
    op = node.op
    dt = node.inputs[0].dtype
    out = node.dtype
    axes = node.params[0]
    kept = [i for i in range(len(shape)) if i not in axes]
    order = kept + list(axes)
    O = size_of(tuple(shape[i] for i in kept))  # noqa: E741 - rows of the (O, R) view
    R = size_of(tuple(shape[i] for i in axes))
    src = reduce_source(op, dt, out)
    names = _names(op, dt, out)
    if O == 0:
        return []
    pshape = tuple(shape[i] for i in order)
    pstrides = tuple(strides[i] for i in order)
    if ctx.is_gpu and op not in _ARG:  # kept axes innermost in memory: read along them (reduce_columns.py)
        kshape, (kstr,) = collapse(pshape[:len(kept)], [pstrides[:len(kept)]])
        rshape, (rstr,) = collapse(pshape[len(kept):], [pstrides[len(kept):]])
        if len(rshape) == 1:
            cmds = reduce_columns.plan(op, dt, out, kshape, kstr, rshape[0], rstr[0], offset)
            if cmds is not None:
                return cmds
    if op in _ARG:
        # Indices count along the reduced axis in logical order: no dim collapsing across it.
        cshape, cstr = pshape, pstrides
        cshape = tuple(d for d in cshape)
        contiguous = pstrides[-1:] == (1,) and len(axes) == 1 and all(
            s == cs or d == 1 for s, cs, d in zip(pstrides, contiguous_strides(pshape), pshape))
        if len(cshape) > MAX_DIMS:
            raise hal.InvalidArgumentError("too many dimensions")
    else:
        cshape, (cstr,) = collapse(pshape, [pstrides])
        contiguous = all(s == cs for s, cs in zip(cstr, contiguous_strides(cshape)))
    # Chunking: split long rows when there are too few rows to fill the GPU, into chunks of at least
    # MIN_CHUNK elements, about SPLIT_WORKGROUPS workgroups in all.
    C, chunk = row_chunks(R, O, MIN_CHUNK, SPLIT_WORKGROUPS) if ctx.is_gpu and R > 4096 and O < 512 \
        else (1, R or 1)
    consts = [O, R, chunk, offset, C]
    if not contiguous:
        consts += [len(cshape)] + list(cshape) + [0] * (MAX_DIMS - len(cshape))
        consts += [u32(s) for s in cstr] + [0] * (MAX_DIMS - len(cstr))
    v = "c" if contiguous else "g"
    if C == 1:
        return [("dispatch", src, names[v], (O, 1, 1), consts, [("out",), ("in", 0)])]
    acc = acc_dtype(op, dt)
    temps = [O * C * acc.itemsize] + ([O * C * 4] if op in _ARG else []) + [ZeroedScratch(O * 4)]
    part_bind = [("out",), ("tmp", 0)] + ([("tmp", 1)] if op in _ARG else []) + [("in", 0), ("tmp", len(temps) - 1)]
    return [("temps", temps), ("dispatch", src, names["p" + v], (O, C, 1), consts, part_bind)]


_ = compute_np
