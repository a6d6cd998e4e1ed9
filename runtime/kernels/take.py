"""``take``: elements picked along one axis, out[o, j, i] = src[o, v, i] with v the index at
(o, j, i) of an int64 index array, mapped in the kernel by numpy's mode.

The output is seen as (outer, J, inner) and the source as (outer, n, inner) around the axis of n
elements, read through two strides (constants ``so``, ``sn``: a view whose inner elements lie in
order and whose outer dims collapse to one, such as columns of a table, is read in place,
``source_strides``); the index array is read through strides over the output's three dims (0, 1, 0 for
``take``'s J indices shared by every outer and inner position; J * inner, inner, 1 for
``take_along_axis``'s indices of the output's shape). This replaces a gather through flat
indices of the output's size, which the runtime made by broadcasting aranges (eight bytes an
output element written and read again: a lookup of 65536 rows of 256 floats ran at 0.08x
PyTorch's on an H200).

Modes (constant ``mode``): 0 "raise" (a negative index counts from the end; past either end is an
error: the checked export sets the status word, as the flat gather does, the unchecked one clamps
indices checked on the host already), 1 "wrap" (modulo n), 2 "clip" (to 0 .. n - 1). Where inner
is a multiple of 4, the source's offset too and every inner position shares its index, a thread
moves 4 neighbours along inner as one vector; rows of at least ROW_MAPPED_VECTORS such vectors (an
embedding's) are mapped a row at a time (``chunks`` workgroups a row, ``row_loop``): a thread maps the
row's index once and moves two or more vectors of it, where an element-wise mapping divides its
position by the row length and the index count for each vector (an H200, 32768 rows of 1024 float32
plus positions, the folded form: 77.7 us element by element, 70.1 a row at a time; a copy of the
output's bytes 66.6).
"""

from __future__ import annotations

import math

import numpy as np

import hal

from ..shapes import single_stride
from . import elementwise
from .complex import SOURCE as COMPLEX_SOURCE
from .source import MAX_WORKGROUPS, WORKGROUP, KernelSource, checked_pair, checked_pair_dispatch, grid_1d, source

#: total, J, inner, n, the index strides over (outer, J, inner), source offset, index offset, mode
_NCONST = 10
MODES = {"raise": 0, "wrap": 1, "clip": 2}
#: Threads of a take's workgroup: a row of 1024 float32 is 256 vectors, two a thread (one vector a
#: thread of a row ran at 3.7 TB/s on an H200, two at 3.95).
THREADS = 128
#: Rows of at least this many vectors are mapped a row at a time (shorter ones would idle threads).
ROW_MAPPED_VECTORS = THREADS
#: Vectors a thread of a row-mapped workgroup moves, at least, where the row has that many.
ROW_VECTORS_A_THREAD = 2


def take_source(dt) -> KernelSource:
    """The take's two exports; constants ``_NCONST``, ``chunks`` (``launch``) and the source's strides."""
    return checked_pair("take", dt, _NCONST + 3, _cuda, _numpy_fn, THREADS)


def source_strides(shape: tuple, strides: tuple, inner: int, n: int) -> tuple[int, int] | None:
    """(outer stride, axis stride) in elements of a take's source of ``shape`` and element ``strides``
    read as (outer, n, inner) around its axis of ``n`` (the dims after it ``inner`` elements): None
    unless the inner elements lie in order, the outer dims collapse to one stride, and no stride is
    negative (such a source is copied first)."""
    axis = next((k for k in range(len(shape) - 1, -1, -1) if shape[k] == n and math.prod(shape[k + 1:]) == inner),
                None)
    if axis is None or (inner != 1 and single_stride(shape[axis + 1:], strides[axis + 1:]) != 1):
        return None  # (the inner elements not in order)
    so = single_stride(shape[:axis], strides[:axis])  # (0: one outer position, never stepped)
    sn = strides[axis] if n > 1 else inner
    return (so, sn) if so is not None and so >= 0 and sn >= 0 else None


def source_read(params: tuple, layouts: list) -> tuple[int, int, int, int, bool]:
    """How a take node's kernel (``params`` and its input ``layouts``) reads: (source offset, outer and
    axis strides, index offset, whether a thread moves 4 neighbours along inner as one vector, which
    needs the row, the source's offset and strides in multiples of 4 and one index shared along it)."""
    _, _, inner, n, strides, _ = params
    (shape, sstrides, soff), (_, _, ioff) = layouts[:2]
    so, sn = source_strides(shape, sstrides, inner, n)  # (checked when the node was made)
    return soff, so, sn, ioff, (inner | soff | so | sn) % 4 == 0 and strides[2] == 0


def reads_in_place(shape: tuple, strides: tuple, offset: int, inner: int, n: int, taken: int) -> bool:
    """Whether a take of ``taken`` elements reads a view of ``shape``, element ``strides`` and
    ``offset`` in place: its layout is one ``source_strides`` reads, and it keeps the 4-element
    vectors its dense copy would be read in, or gathers no more elements than the view holds (a view
    off by one, gathered into many more rows than it has, would read element by element more than
    the copy costs; a table's few looked-up rows cost less than copying the table)."""
    read = source_strides(shape, strides, inner, n)
    if read is None:
        return False
    return inner % 4 != 0 or (read[0] | read[1] | offset) % 4 == 0 or taken <= math.prod(shape)


def launch(total: int, inner: int, vectors: bool) -> tuple[int, int]:
    """(chunks, workgroups) of a take's kernel over ``total`` elements in rows of ``inner``, moved 4 a
    thread where ``vectors``: chunks 0 maps them element by element (a vector at a time), else each
    row is taken by ``chunks`` workgroups of THREADS (``row_loop``)."""
    if vectors and inner // 4 >= ROW_MAPPED_VECTORS:
        chunks = max(1, inner // 4 // (THREADS * ROW_VECTORS_A_THREAD))
        return chunks, min(total // inner * chunks, MAX_WORKGROUPS)
    return 0, grid_1d(total // 4 if vectors else total, THREADS)


def row_loop(bad: str, body) -> str:
    """C of the row-mapped loop (``launch``'s chunks > 0): workgroup b takes chunk b % chunks of row
    b / chunks, maps the row's index into ``v`` once (``bad`` as ``index_lines``'s), and runs
    ``body(indent)`` for each of its threads' vectors, element ``e`` (``i`` in the row ``r``)."""
    return f"""    const u32 groups = total / I * chunks;
    for (u32 b = blockIdx.x; b < groups; b += gridDim.x) {{
      const u32 r = b / chunks, c = b - r * chunks, o = r / J, j = r - o * J;
{index_lines(bad, "ioff + (u64)o * io + (u64)j * ij", "      ")}
      for (u32 i = (c * blockDim.x + threadIdx.x) << 2; i < I; i += (chunks * blockDim.x) << 2) {{
        const u32 e = r * I + i;
{body("        ")}
      }}
    }}"""


#: What a kernel does with an index out of range under "raise" (``_index``): a checked take sets the
#: status word and reads element 0, a checked add or rank sets it and skips the element, the set's
#: write skips it (its rank set the word), an unchecked kernel clamps (indices checked on the host).
READ_ZERO, SKIP, SKIP_QUIETLY, CLAMP = ("status[0] = 1u; v = 0;", "status[0] = 1u; continue;", "continue;",
                                        "v = v < 0 ? 0 : (long long)n - 1;")


def index_lines(bad: str, at: str, indent: str) -> str:
    """C statements mapping the int64 index at ``at`` into ``v`` (0 .. n - 1) by the mode; ``bad``:
    the statements for an index out of range under "raise" (READ_ZERO, SKIP, SKIP_QUIETLY, CLAMP)."""
    return "\n".join(indent + line for line in (
        f"long long v = idx[{at}];",
        "if (mode == 1u) { v %= (long long)n; if (v < 0) v += n; }",
        "else if (mode == 2u) { v = v < 0 ? 0 : (v >= (long long)n ? (long long)n - 1 : v); }",
        "else {",
        "  if (v < 0) v += n;",
        f"  if (v < 0 || v >= (long long)n) {{ {bad} }}",
        "}"))


#: Where a take's kernel reads element (o, v, i) of its source.
SOURCE_AT = "soff + (u64)o * so + (u64)v * sn + i"


def _signature(dt, name: str, checked: bool, values: str, offset: str, extra: str = "") -> str:
    """The C signature of a take's or a take_add's kernel: the output, the values read (`values`,
    from `offset`), the indices, the checked form's status word and the constants (``extra``: the
    take's own, after the shared ones)."""
    t = dt.c_storage
    status = "unsigned int* __restrict__ status, " if checked else ""
    return (f'extern "C" __global__ void {name}({t}* __restrict__ out, const {t}* __restrict__ {values},\n'
            f"    const long long* __restrict__ idx, {status}u32 total, u32 J, u32 I, u32 n, u32 io, u32 ij, u32 ii,\n"
            f"    u32 {offset}, u32 ioff, u32 mode{extra})")


def _kernel(dt, name: str, checked: bool) -> str:
    t = dt.c_storage
    return f"""
{_signature(dt, name, checked, "src", "soff", ", u32 chunks, u32 so, u32 sn")} {{
  if (chunks != 0u) {{
{row_loop(READ_ZERO if checked else CLAMP, lambda indent: (
    f"{indent}*reinterpret_cast<rt_vec4<{t}>*>(out + e) ="
    f" *reinterpret_cast<const rt_vec4<{t}>*>(src + {SOURCE_AT});"))}
    return;
  }}
  if (((I | soff | so | sn) & 3u) == 0 && ii == 0) {{
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < (total >> 2); t += (u64)blockDim.x * gridDim.x) {{
      const u32 e = (u32)t << 2;
      const u32 r = e / I, i = e - r * I, o = r / J, j = r - o * J;
{index_lines(READ_ZERO if checked else CLAMP, "ioff + (u64)o * io + (u64)j * ij", "      ")}
      reinterpret_cast<rt_vec4<{t}>*>(out)[t] =
          *reinterpret_cast<const rt_vec4<{t}>*>(src + {SOURCE_AT});
    }}
    return;
  }}
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)blockDim.x * gridDim.x) {{
    const u32 r = (u32)e / I, i = (u32)e - r * I, o = r / J, j = r - o * J;
{index_lines(READ_ZERO if checked else CLAMP, "ioff + (u64)o * io + (u64)j * ij + (u64)i * ii", "    ")}
    out[e] = src[{SOURCE_AT}];
  }}
}}
"""


def _cuda(dt, name: str, checked_name: str) -> str:
    return (COMPLEX_SOURCE if dt.is_complex else "") + _kernel(dt, name, False) + _kernel(dt, checked_name, True)


def _numpy_fn(dt, checked: bool):
    def run(workgroups, bindings, c):
        total, J, inner = c[:3]  # (chunks maps threads only)
        gather(dt, bindings, c, checked, np.frombuffer(bindings[0], dt.storage, total).reshape(-1, J, inner),
               c[-2:])
    return run


def gather(dt, bindings: list, c: list, checked: bool, out: np.ndarray, source_strides: list) -> None:
    """A take's values, (outer, J, inner), into ``out``: bindings (output, source, indices, the checked
    form's status word), the constants of the take's dispatch and the source's (so, sn) (the numpy
    form of its kernel)."""
    total, J, inner, n, io, ij, ii, soff, ioff, mode = c[:_NCONST]
    outer = total // (J * inner)
    so, sn = source_strides
    reach = (outer - 1) * so + (n - 1) * sn + inner
    flat = np.frombuffer(bindings[1], dt.storage, reach, soff * dt.itemsize)
    size = dt.itemsize
    src = np.lib.stride_tricks.as_strided(flat, (outer, n, inner), (so * size, sn * size, size), writeable=False)
    v = _mapped(bindings, outer, J, inner, n, io, ij, ii, ioff, mode, checked)
    if io == 0 and ii == 0:
        np.take(src, v[0, :, 0], axis=1, out=out)
    else:
        out[...] = np.take_along_axis(src, v, axis=1)


# ---- take_add: the transpose of a take --------------------------------------------------------

def add_source(dt) -> KernelSource:
    """``take_add``: zeros of the source's shape with each value added where a take with the same
    indices would have read it (atomically: indices may repeat), the values of the take's output
    shape. The gradient of a take, and ``x.at[indices].add(values)`` through one index array."""
    return checked_pair("take_add", dt, _NCONST, _add_cuda, _add_numpy_fn)


def _add_kernel(dt, name: str, checked: bool) -> str:
    return f"""
{_signature(dt, name, checked, "g", "goff")} {{
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)blockDim.x * gridDim.x) {{
    const u32 r = (u32)e / I, i = (u32)e - r * I, o = r / J, j = r - o * J;
{index_lines(SKIP if checked else CLAMP, "ioff + (u64)o * io + (u64)j * ij + (u64)i * ii", "    ")}
    atomicAdd(out + ((u64)o * n + (u64)v) * I + i, g[goff + e]);
  }}
}}
"""


def _add_cuda(dt, name: str, checked_name: str) -> str:
    return _add_kernel(dt, name, False) + _add_kernel(dt, checked_name, True)


def _add_numpy_fn(dt, checked: bool):
    def run(workgroups, bindings, c):
        total, J, inner, n, io, ij, ii, goff, ioff, mode = c
        outer = total // (J * inner)
        out = np.frombuffer(bindings[0], dt.storage, outer * n * inner).reshape(outer, n, inner)
        g = np.frombuffer(bindings[1], dt.storage, total, goff * dt.itemsize).reshape(outer, J, inner)
        v = _mapped(bindings, outer, J, inner, n, io, ij, ii, ioff, mode, checked, drop=True)
        o, _, i = np.ogrid[:outer, :1, :inner]
        keep = v >= 0
        o, v, i = np.broadcast_arrays(o, v, i)
        with np.errstate(over="ignore"):
            np.add.at(out, (o[keep], v[keep], i[keep]), g[keep])
    return run


def _mapped(bindings, outer, J, inner, n, io, ij, ii, ioff, mode, checked, drop=False):
    """The indices (outer, J, inner) mapped by the mode: an index out of range under "raise" sets
    the status word (checked) and becomes 0, or -1 where ``drop``; unchecked ones are clamped."""
    reach = (outer - 1) * io + (J - 1) * ij + (inner - 1) * ii + 1
    flat = np.frombuffer(bindings[2], np.int64, reach, ioff * 8)
    v = np.lib.stride_tricks.as_strided(flat, (outer, J, inner), (io * 8, ij * 8, ii * 8)).copy()
    if mode == 1:
        v %= n
    elif mode == 2:
        np.clip(v, 0, n - 1, out=v)
    else:
        v[v < 0] += n
        bad = (v < 0) | (v >= n)
        if bad.any():
            if checked:
                np.frombuffer(bindings[3], np.uint32, 1)[0] = 1
                v[bad] = -1 if drop else 0
            else:
                np.clip(v, 0, n - 1, out=v)
    return v


def plan_add(node, layouts: list, ctx) -> list:
    """Zero the output, then one dispatch over the values; ``node.params`` as ``take``'s."""
    if node.size == 0:
        return []
    mode, J, inner, n, strides, checked = node.params
    total = node.inputs[0].size
    fill = ("fill", ("out",), 0, 4)  # (zero is all-zero bits in every dtype it adds in)
    if total == 0:
        return [fill]
    (_, _, goff), (_, _, ioff) = layouts[:2]
    return [fill, ("barrier",), checked_pair_dispatch(add_source(node.dtype), "take_add", node.dtype, checked, total,
                                                      [total, J, inner, n, *strides, goff, ioff, MODES[mode]])]


def plan(node, layouts: list, ctx) -> list:
    """One dispatch over the output; ``node.params`` = (mode, J, inner, n, index strides, checked)."""
    total = node.size
    if total == 0:
        return []
    mode, J, inner, n, strides, checked = node.params
    soff, so, sn, ioff, vectors = source_read(node.params, layouts)
    chunks, workgroups = launch(total, inner, vectors)
    dispatch = checked_pair_dispatch(take_source(node.dtype), "take", node.dtype, checked, total,
                                     [total, J, inner, n, *strides, soff, ioff, MODES[mode], chunks, so, sn],
                                     workgroups)
    return [dispatch]


# ---- take_set: x with the values a take would read replaced -----------------------------------

def set_source(dt) -> KernelSource:
    """``take_set``: a copy of x (the node's first input) whose elements a take with shared indices
    (strides 0, 1, 0) reads are replaced by the values (of the take's output shape), the last value
    where indices repeat, as numpy's indexed assignment leaves it. ``take_rank`` finds each
    position's last writer over the n positions of the axis (an atomic max of j + 1, after
    ``take_clear``), then ``take_set_<code>`` writes each value whose index is its position's last
    writer: the array is read and written once, only the indexed rows besides."""
    key = ("take_set", dt.name)
    name = f"take_set_{dt.code}"
    return source(key, lambda: KernelSource(key, [hal.Export(name, (WORKGROUP, 1, 1), 4, 7)],
                                            lambda: _set_cuda(dt, name), lambda: {name: _set_numpy_fn(dt)}))


def rank_source() -> KernelSource:
    key = ("take_rank",)
    exports = [hal.Export("take_clear", (WORKGROUP, 1, 1), 1, 1), hal.Export("take_rank", (WORKGROUP, 1, 1), 2, 4),
               hal.Export("take_rank_checked", (WORKGROUP, 1, 1), 3, 4)]
    return source(key, lambda: KernelSource(key, exports, _rank_cuda, _rank_numpy_fns))


def _rank_cuda() -> str:
    loop = "for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < J; j += (u64)blockDim.x * gridDim.x)"
    return f"""
extern "C" __global__ void take_clear(u32* __restrict__ winner, u32 n) {{
  for (u64 v = (u64)blockIdx.x * blockDim.x + threadIdx.x; v < n; v += (u64)blockDim.x * gridDim.x) winner[v] = 0u;
}}

extern "C" __global__ void take_rank(u32* __restrict__ winner, const long long* __restrict__ idx, u32 J, u32 n,
                                     u32 ioff, u32 mode) {{
  {loop} {{
{index_lines(CLAMP, "ioff + j", "    ")}
    atomicMax(winner + v, (u32)j + 1u);
  }}
}}

extern "C" __global__ void take_rank_checked(u32* __restrict__ winner, const long long* __restrict__ idx,
                                             unsigned int* __restrict__ status, u32 J, u32 n, u32 ioff, u32 mode) {{
  {loop} {{
{index_lines(SKIP, "ioff + j", "    ")}
    atomicMax(winner + v, (u32)j + 1u);
  }}
}}
"""


def _set_cuda(dt, name: str) -> str:
    t = dt.c_storage
    return (COMPLEX_SOURCE if dt.is_complex else "") + f"""
extern "C" __global__ void {name}({t}* __restrict__ out, const {t}* __restrict__ vals,
    const long long* __restrict__ idx, const u32* __restrict__ winner, u32 total, u32 J, u32 I, u32 n, u32 voff,
    u32 ioff, u32 mode) {{
  for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)blockDim.x * gridDim.x) {{
    const u32 r = (u32)e / I, i = (u32)e - r * I, o = r / J, j = r - o * J;
{index_lines(SKIP_QUIETLY, "ioff + j", "    ")}
    if (winner[v] == j + 1u) out[((u64)o * n + (u64)v) * I + i] = vals[voff + e];
  }}
}}
"""


def _rank_numpy_fns() -> dict:
    def clear(workgroups, bindings, c):
        np.frombuffer(bindings[0], np.uint32, c[0])[:] = 0

    def rank(checked: bool):
        def run(workgroups, bindings, c):
            J, n, ioff, mode = c
            v = _mapped(bindings[:1] + [None] + bindings[1:], 1, J, 1, n, 0, 1, 0, ioff, mode, checked,
                               drop=True)
            v = v.reshape(-1)
            keep = v >= 0
            np.maximum.at(np.frombuffer(bindings[0], np.uint32, n), v[keep],
                          np.arange(1, J + 1, dtype=np.uint32)[keep])
        return run

    return {"take_clear": clear, "take_rank": rank(False), "take_rank_checked": rank(True)}


def _set_numpy_fn(dt):
    def run(workgroups, bindings, c):
        total, J, inner, n, voff, ioff, mode = c
        outer = total // (J * inner)
        out = np.frombuffer(bindings[0], dt.storage, outer * n * inner).reshape(outer, n, inner)
        vals = np.frombuffer(bindings[1], dt.storage, total, voff * dt.itemsize).reshape(outer, J, inner)
        v = _mapped([None, None, bindings[2]], 1, J, 1, n, 0, 1, 0, ioff, mode, False, drop=True).reshape(-1)
        if mode == 0:  # (out of range: the rank skipped it, and so does the write)
            raw = np.frombuffer(bindings[2], np.int64, J, ioff * 8)
            v = np.where((raw < -n) | (raw >= n), -1, v)
        winner = np.frombuffer(bindings[3], np.uint32, n)
        won = (v >= 0) & (winner[np.clip(v, 0, n - 1)] == np.arange(1, J + 1))
        out[:, v[won], :] = vals[:, won, :]
    return run


def plan_set(node, layouts: list, ctx) -> list:
    """A ``take_set`` node (inputs x, the values, int64 indices, the checked form's status word;
    params as ``take``'s with shared indices): x copied, the axis' positions ranked, the winners
    written."""
    if node.size == 0:
        return []
    mode, J, inner, n, _, checked = node.params
    total = node.inputs[1].size
    cmds = elementwise.plan_copy(node, layouts[0], ctx)
    if total == 0:
        return cmds
    (_, _, voff), (_, _, ioff) = layouts[1:3]
    ranks = rank_source()
    rank_roles = [("tmp", 0), ("in", 2)] + ([("in", 3)] if checked else [])
    return [("temps", [n * 4]),
            ("dispatch", ranks, "take_clear", (grid_1d(n), 1, 1), [n], [("tmp", 0)]),
            *cmds,
            ("barrier",),
            ("dispatch", ranks, "take_rank_checked" if checked else "take_rank", (grid_1d(J), 1, 1),
             [J, n, ioff, MODES[mode]], rank_roles),
            ("barrier",),
            ("dispatch", set_source(node.dtype), f"take_set_{node.dtype.code}", (grid_1d(total), 1, 1),
             [total, J, inner, n, voff, ioff, MODES[mode]], [("out",), ("in", 1), ("in", 2), ("tmp", 0)])]
