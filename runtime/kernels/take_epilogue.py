"""``take`` with an epilogue: a gather whose only reader is one elementwise op with one other operand,
computed in the gather's kernel (``lowering/gathers.py`` finds them): out = op(take(src, idx), other)
or op(other, take(src, idx)). The gathered values get no buffer and are not read back: an embedding
lookup plus positions moves the rows read, the positions and the output once each, where the take and
the add moved the output's bytes three times.

The take's index space is ``take.py``'s (outer, J, inner) and its indices are mapped by the same mode
(``take.index_lines``; the checked export sets the status word). The other operand is read through
strides over the output's collapsed shape (constants ``s0``.., ``ndim`` of them, strides ``p0``..,
``cuda_common.strided_positions``). Where the take moves 4 neighbours along inner as one vector (see
``take.py``), a thread computes those 4 from one set of coordinates: ``vec`` 1 reads the other's 4
neighbours (unit stride there: one vector where they are aligned, as rows of a wider array may not
be), 2 its one element for all 4 (stride 0 there); 0 is one element at a time. Long rows are mapped a
row at a time as the take's are (``take.launch``; an H200, 32768 rows of 1024 float32 plus positions:
79.6 us element by element, 69.0 a row at a time, the copy of the output 66.6). The op's arithmetic
is the elementwise kernel's (``elementwise.c_expr``, the same loads and stores), so the values are
those of the two kernels run one after the other.
"""

from __future__ import annotations

import numpy as np

import hal

from ..shapes import MAX_DIMS, collapse
from .cuda_common import convert, load_expr, store_expr, strided_positions
from .elementwise import c_expr, ew_source, export_name
from .numpy_util import signed, strided_view
from .source import KernelSource, source, u32
from .take import CLAMP, MODES, READ_ZERO, SOURCE_AT, THREADS, gather, index_lines, launch, row_loop, source_read

#: The elementwise ops folded into a take.
OPS = frozenset(("add", "sub", "mul", "div", "maximum", "minimum"))
#: total, J, inner, n, the index strides over (outer, J, inner), source offset, index offset, mode, the
#: other's offset, ndim, the collapsed shape, the other's strides over it, vec, chunks, the source's
#: outer and axis strides.
_NCONST = 10 + 2 + 2 * MAX_DIMS + 4


def _names(op: str, dt, side: int) -> tuple[str, str]:
    base = f"take_{op}_{side}_{dt.code}"
    return base, base.replace("take_", "take_checked_", 1)


def epilogue_source(op: str, dt, cdt, side: int) -> KernelSource:
    """The unchecked and checked exports of ``op`` with the take's value as operand ``side`` (0: a)."""
    key = ("take_epilogue", op, dt.name, cdt.name, side)
    name, checked = _names(op, dt, side)
    return source(key, lambda: KernelSource(
        key, [hal.Export(name, (THREADS, 1, 1), 4, _NCONST), hal.Export(checked, (THREADS, 1, 1), 5, _NCONST)],
        lambda: _cuda(op, dt, cdt, side, name, False) + _cuda(op, dt, cdt, side, checked, True),
        lambda: {name: _numpy_fn(op, dt, cdt, side, False), checked: _numpy_fn(op, dt, cdt, side, True)}))


def plan(take, take_layouts: list, user, out: int, side: int, other_layout: tuple) -> list | None:
    """The dispatch computing ``user`` (``op`` of the ``take`` node and another operand; node ``out``
    of the order, where the kernel is placed) in one kernel: roles the user's output, the roots of
    the take's inputs, the other's root and the checked form's status word. ``other_layout``: the
    other's strides over the user's shape, offset and root. None where its collapsed layout has more
    than MAX_DIMS dims."""
    mode, J, inner, n, strides, checked = take.params
    total = take.size
    soff, so, sn, ioff, vectors = source_read(take.params, take_layouts)
    other_strides, other_offset, other_root = other_layout
    shape, (pstrides,) = collapse(user.shape, [other_strides])
    if len(shape) > MAX_DIMS:
        return None
    vec = 0
    if total and vectors:
        last, step = (shape[-1], pstrides[-1]) if shape else (4, 0)
        if last % 4 == 0 and step == 1 and other_offset % 4 == 0:
            vec = 1
        elif last % 4 == 0 and step == 0:
            vec = 2
    chunks, workgroups = launch(total, inner, vec != 0)
    consts = [total, J, inner, n, *strides, soff, ioff, MODES[mode], u32(other_offset), len(shape),
              *shape, *[1] * (MAX_DIMS - len(shape)), *[u32(s) for s in pstrides], *[0] * (MAX_DIMS - len(shape)), vec,
              chunks, so, sn]
    name = _names(user.op, take.dtype, side)[1 if checked else 0]
    roles = [("out", out), ("root", take.inputs[0].root), ("root", take.inputs[1].root), ("root", other_root)]
    if checked:
        roles.append(("root", take.inputs[2].root))
    src = epilogue_source(user.op, take.dtype, user.params, side)
    return [("dispatch", src, name, (workgroups, 1, 1), consts, roles)]


# ---- CUDA C -----------------------------------------------------------------------------------

def _cuda(op: str, dt, cdt, side: int, name: str, checked: bool) -> str:
    t, c = dt.c_storage, cdt.c_compute
    status = "unsigned int* __restrict__ status, " if checked else ""
    params = (f"{t}* __restrict__ out, const {t}* __restrict__ src, const long long* __restrict__ idx, "
              f"const {t}* __restrict__ other, {status}u32 total, u32 J, u32 I, u32 n, u32 io, u32 ij, u32 ii, "
              "u32 soff, u32 ioff, u32 mode, u32 poff, u32 ndim, "
              + ", ".join(f"u32 s{d}" for d in range(MAX_DIMS)) + ", "
              + ", ".join(f"u32 p{d}" for d in range(MAX_DIMS)) + ", u32 vec, u32 chunks, u32 so, u32 sn")
    bad = READ_ZERO if checked else CLAMP

    def result(taken: str, other: str) -> str:
        a, b = (taken, other) if side == 0 else (other, taken)
        value = f"(({c_expr(op, cdt)}))"
        return (f"{{ const {c} a = {convert(load_expr(dt, a), dt.c_compute, c)}; "
                f"const {c} b = {convert(load_expr(dt, b), dt.c_compute, c)}; "
                f"res = {store_expr(dt, convert(value, c, dt.c_compute))}; }}")

    def position(indent: str) -> str:
        """Statements placing element e in the other operand (``at``)."""
        return "\n".join(strided_positions("e", [("at", "(i64)poff", "p")], MAX_DIMS, indent))

    def vector(indent: str) -> str:
        """Statements computing the 4 outputs from element e (row r's index v, position i in it)."""
        row = f"src + {SOURCE_AT}"
        return f"""{indent}const rt_vec4<{t}> w = *reinterpret_cast<const rt_vec4<{t}>*>({row});
{position(indent)}
{indent}rt_vec4<{t}> x;
{indent}if (vec == 1u && (at & 3) == 0) x = *reinterpret_cast<const rt_vec4<{t}>*>(other + at);
{indent}else if (vec == 1u) {{ for (int k = 0; k < 4; ++k) x.v[k] = other[at + k]; }}  // (rows of a wider array)
{indent}else {{ const {t} one = other[at]; for (int k = 0; k < 4; ++k) x.v[k] = one; }}
{indent}rt_vec4<{t}> ov;
{indent}#pragma unroll
{indent}for (int k = 0; k < 4; ++k) {{ {t} res; {result("w.v[k]", "x.v[k]")} ov.v[k] = res; }}
{indent}*reinterpret_cast<rt_vec4<{t}>*>(out + e) = ov;"""

    return f"""
extern "C" __global__ void {name}({params}) {{
  if (chunks != 0u) {{
{row_loop(bad, vector)}
    return;
  }}
  if (vec != 0u) {{
    for (u64 t4 = (u64)blockIdx.x * blockDim.x + threadIdx.x; t4 < (total >> 2); t4 += (u64)blockDim.x * gridDim.x) {{
      const u32 e = (u32)t4 << 2;
      const u32 r = e / I, i = e - r * I, o = r / J, j = r - o * J;
{index_lines(bad, "ioff + (u64)o * io + (u64)j * ij", "      ")}
{vector("      ")}
    }}
    return;
  }}
  for (u64 t1 = (u64)blockIdx.x * blockDim.x + threadIdx.x; t1 < total; t1 += (u64)blockDim.x * gridDim.x) {{
    const u32 e = (u32)t1;
    const u32 r = e / I, i = e - r * I, o = r / J, j = r - o * J;
{index_lines(bad, "ioff + (u64)o * io + (u64)j * ij + (u64)i * ii", "    ")}
{position("    ")}
    {t} res;
    {result(f"src[{SOURCE_AT}]", "other[at]")}
    out[e] = res;
  }}
}}
"""


# ---- numpy ------------------------------------------------------------------------------------

def _numpy_fn(op: str, dt, cdt, side: int, checked: bool):
    fn = ew_source(op, (dt, dt), dt, cdt).numpy_code()[export_name(op, (dt, dt), dt, "cc")]

    def run(workgroups, bindings, c):
        total, J, inner = c[:3]
        poff, ndim = c[10:12]
        if total == 0:
            return
        shape = tuple(c[12:12 + ndim])
        pstrides = tuple(signed(s) for s in c[12 + MAX_DIMS:12 + MAX_DIMS + ndim])
        taken = np.empty((total // (J * inner), J, inner), dt.storage)
        gather(dt, [bindings[0], bindings[1], bindings[2], bindings[4] if checked else None], c, checked, taken,
               c[-2:])
        other = np.ascontiguousarray(strided_view(bindings[3], dt, shape, pstrides, signed(poff)))
        args = (taken, other) if side == 0 else (other, taken)
        fn(None, [bindings[0]] + [memoryview(a.reshape(-1)).cast("B") for a in args], [total, 0, 0])
    return run
