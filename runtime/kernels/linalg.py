"""The lowering of runtime/linalg.py's decompositions: one HAL solver routine (``hal.solver``) a node.

A decomposition's node ("linalg") holds all of its routine's outputs in one byte buffer, one after
another at the offsets its params give: the routine writes each output that is read there (bound
at its offset), and those nobody reads to scratch. Each result the caller sees is a node of its
own ("linalg_get") copying its bytes out of that buffer in its dtype and shape, so a routine of
several outputs (eigenvalues and eigenvectors, an LU and its pivots) runs once however many of
them are read.

The routine is a ``library`` executable, as ``hal.Gemm`` is: the CPU drivers and the simulated GPU
run its numpy reference, the CUDA driver cuSOLVER, the HIP driver hipSOLVER (``loadable`` says
whether the device runs it).
"""

from __future__ import annotations

import numpy as np

import hal

from . import elementwise
from .complex import SOURCE as COMPLEX_SOURCE
from .matmul import LibrarySource
from .source import WORKGROUP, KernelSource, executable, grid_1d, source


def copy_groups(nbytes: int) -> int:
    """Workgroups of a copy of ``nbytes``: a thread per 16 bytes (unaligned ends loop over the rest)."""
    return grid_1d(-(-nbytes // 16))


def copy_source() -> KernelSource:
    key = ("linalg_copy",)
    return source(key, lambda: KernelSource(key, [hal.Export("copy_bytes", (WORKGROUP, 1, 1), 2, 3)],
                                            _cuda, _numpy))


def _cuda() -> str:
    # 16 bytes a thread where both ends are 16-byte aligned (a byte a thread takes sixteen times the
    # loads and stores), the bytes past the last whole vector one by one.
    return """
extern "C" __global__ void copy_bytes(unsigned char* __restrict__ out, const unsigned char* __restrict__ in,
                                      u32 n, u32 out_offset, u32 in_offset) {
  unsigned char* o = out + out_offset;
  const unsigned char* s = in + in_offset;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
  u64 done = 0;
  if ((((u64)o | (u64)s) & 15) == 0) {
    const u64 vectors = n / 16;
    for (u64 i = first; i < vectors; i += step)
      reinterpret_cast<rt_vec4<u32>*>(o)[i] = reinterpret_cast<const rt_vec4<u32>*>(s)[i];
    done = vectors * 16;
  }
  for (u64 i = done + first; i < n; i += step)
    o[i] = s[i];
}
"""


def _numpy() -> dict:
    def copy_bytes(wg, bindings, c) -> None:
        n, out_offset, in_offset = c
        out = memoryview(bindings[0]).cast("B")
        src = memoryview(bindings[1]).cast("B")
        out[out_offset:out_offset + n] = src[in_offset:in_offset + n]

    return {"copy_bytes": copy_bytes}


def routine_source(routine: hal.Routine) -> LibrarySource:
    """A solver routine as the lowering's kernel source (a ``library`` executable of one export)."""
    return source(("solver", routine), lambda: LibrarySource(routine))  # type: ignore[arg-type]


def loadable(ctx, routine: hal.Routine) -> str | None:
    """None when ctx's device runs ``routine``, else why not (the library format missing, or the
    routine refused: cuSOLVER not installed, say)."""
    if not ctx.device.can_prepare("library"):
        return f"device {ctx.device.info.uri} runs no library routines (no 'library' executable format)"
    src = routine_source(routine)
    try:
        executable(ctx, src)
    except (hal.UnimplementedError, hal.IncompatibleError) as exc:
        return str(exc)
    return None


def plan(node, layouts: list, ctx) -> list:
    """The routine, writing each output that is read at its place in the node's buffer (those nobody
    reads into scratch)."""
    routine, constants, outputs = node.params  # outputs: (byte offset in the node, bytes) per output binding
    src = routine_source(routine)
    extents = routine.call_of(constants).extents
    temps: list = []
    roles: list = []
    t = k = 0
    for i in range(routine.bindings):
        if i in routine.OUTPUTS:
            offset, kept = outputs[t]
            if kept:
                roles.append(("out_at", offset))
            else:
                roles.append(("tmp", len(temps)))
                temps.append(max(extents[i][1], 1))
            t += 1
        else:
            roles.append(("in", k))
            k += 1
    return [("temps", temps), ("dispatch", src, src.export, (1, 1, 1), list(constants), roles)]


def plan_get(node, layouts: list, ctx) -> list:
    """A result of a decomposition: its bytes copied out of the decomposition's buffer."""
    return _copy_out(node, node.params[0])


def plan_result(node, layouts: list, ctx) -> list:
    """A decomposition's result as the node its gradient rule belongs to: a copy of its value (read
    through its strides when it is a view, a transposed factor, say: one copy, not two), or, for a
    triangular factor (params ``("factor", ...)``), the factor finished from the decomposition's
    buffer by one kernel."""
    if len(node.params) > 2:
        return _plan_factor(node, node.params[2])
    value = node.inputs[0]
    if value.root is value:
        return _copy_out(node, 0)
    return elementwise.plan_copy(node, layouts[0], ctx)


# -- triangular factors -----------------------------------------------------------------------------
#: ``factor`` flags: the triangle is read transposed (the routine's upper triangle as a lower one),
#: and conjugated.
TRANSPOSED, CONJUGATED = 1, 2


def factor_params(raw_at: int, info_at: int, n: int, transposed: bool, conjugated: bool) -> tuple:
    """The ``factor`` spec of a ``linalg_result`` node: the n x n matrices at byte ``raw_at`` of the
    decomposition's buffer, their routine's info words at ``info_at``."""
    return ("factor", raw_at, info_at, n, (TRANSPOSED if transposed else 0) | (CONJUGATED if conjugated else 0))


def factor_source(dt) -> KernelSource:
    """out[b, r, c]: NaN where the routine's info for matrix b is not 0, else the upper triangle of
    the routine's matrix b (or its transpose's lower triangle), conjugated if asked, zeros elsewhere:
    the triangle's mask, the failure's NaNs and the transpose in one pass."""
    key = ("linalg_factor", dt.name)
    name = f"linalg_factor_{dt.code}"
    return source(key, lambda: KernelSource(key, [hal.Export(name, (WORKGROUP, 1, 1), 2, 5)],
                                            lambda: _factor_cuda(dt, name), lambda: {name: _factor_numpy(dt)}))


def _factor_cuda(dt, name: str) -> str:
    t = dt.c_storage
    nan = "__int_as_float(0x7fc00000)"  # (a float NaN, widened for double parts)
    conj = "if (flags & 2u) v = rt_conj(v);" if dt.is_complex else ""
    return (COMPLEX_SOURCE if dt.is_complex else "") + f"""
extern "C" __global__ void {name}({t}* __restrict__ out, const unsigned char* __restrict__ in, u32 total, u32 n,
                                  u32 raw_at, u32 info_at, u32 flags) {{
  const {t}* raw = reinterpret_cast<const {t}*>(in + raw_at);
  const int* info = reinterpret_cast<const int*>(in + info_at);
  const u32 nn = n * n;
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)blockDim.x * gridDim.x) {{
    const u32 b = (u32)(i / nn), e = (u32)(i - (u64)b * nn), r = e / n, c = e - r * n;
    {t} v;
    if (info[b] != 0) {{
      v = {t}({nan});
    }} else if ((flags & 1u) ? c > r : c < r) {{
      v = {t}(0);
    }} else {{
      v = (flags & 1u) ? raw[(u64)b * nn + (u64)c * n + r] : raw[i];
      {conj}
    }}
    out[i] = v;
  }}
}}
"""


def _factor_numpy(dt):
    def run(wg, bindings, c) -> None:
        total, n, raw_at, info_at, flags = c
        count = total // (n * n) if n else 0
        out = np.frombuffer(bindings[0], dtype=dt.storage, count=total).reshape(count, n, n)
        raw = np.frombuffer(bindings[1], dtype=dt.storage, count=total, offset=raw_at).reshape(count, n, n)
        info = np.frombuffer(bindings[1], dtype=np.int32, count=count, offset=info_at)
        value = raw.transpose(0, 2, 1) if flags & TRANSPOSED else raw
        if flags & CONJUGATED:
            value = np.conj(value)
        keep = np.tril(np.ones((n, n), bool)) if flags & TRANSPOSED else np.triu(np.ones((n, n), bool))
        np.copyto(out, np.where(keep, value, 0))
        out[info != 0] = np.nan
    return run


def _plan_factor(node, spec: tuple) -> list:
    _, raw_at, info_at, n, flags = spec
    total = node.size
    if total == 0:
        return []
    return [("dispatch", factor_source(node.dtype), f"linalg_factor_{node.dtype.code}", (grid_1d(total), 1, 1),
             [total, n, raw_at, info_at, flags], [("out",), ("in", 0)])]


def _copy_out(node, offset: int) -> list:
    nbytes = node.size * node.dtype.itemsize
    if nbytes == 0:
        return []
    return [("dispatch", copy_source(), "copy_bytes", (copy_groups(nbytes), 1, 1), [nbytes, 0, offset],
             [("out",), ("in", 0)])]


#: The lowering's planners of runtime/linalg.py's nodes.
PLANNERS = {"linalg": plan, "linalg_get": plan_get, "linalg_result": plan_result}
