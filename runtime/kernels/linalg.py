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

import hal

from . import elementwise
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
    through its strides when it is a view, a transposed factor, say: one copy, not two)."""
    value = node.inputs[0]
    if value.root is value:
        return _copy_out(node, 0)
    return elementwise.plan_copy(node, layouts[0], ctx)


def _copy_out(node, offset: int) -> list:
    nbytes = node.size * node.dtype.itemsize
    if nbytes == 0:
        return []
    return [("dispatch", copy_source(), "copy_bytes", (copy_groups(nbytes), 1, 1), [nbytes, 0, offset],
             [("out",), ("in", 0)])]


#: The lowering's planners of runtime/linalg.py's nodes.
PLANNERS = {"linalg": plan, "linalg_get": plan_get, "linalg_result": plan_result}
