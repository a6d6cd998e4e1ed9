"""`concat`: each input copied into its window of the result, one pass over the bytes.

Joining along an axis, every input is `outer` rows (the result's extent before the axis) of
`row_bytes` contiguous bytes (its extent along the axis and after it), which land `pitch` bytes
apart in the result (the result's row), starting at the input's place along the axis. One
dispatch an input copies those rows: 16 bytes a thread where every address and length allows
it, down to a byte a thread where none does. The result is read and written once, whatever the
number of inputs (a chain of padded inputs and selects read it once per input).
"""

from __future__ import annotations

import numpy as np

import hal

from ..shapes import size_of
from .source import WORKGROUP, KernelSource, grid_1d, source

#: rows, row_bytes, pitch, out_offset, in_offset (bytes), each as its low and high 32-bit words:
#: a result may pass 4 GiB.
_FIELDS = ("rows", "row_bytes", "pitch", "out_offset", "in_offset")
_NCONST = 2 * len(_FIELDS)


def concat_source() -> KernelSource:
    key = ("concat_rows",)
    return source(key, lambda: KernelSource(key, [hal.Export("concat_rows", (WORKGROUP, 1, 1), 2, _NCONST)],
                                            _cuda, _numpy))


def _cuda() -> str:
    # The widest unit dividing every address, length and pitch; a thread per unit, the unit's row
    # and column from one division (32-bit where the counts allow: a copy is bound by memory, not
    # by the division).
    copies = "\n".join(f"""    case {unit}: {{
      const u64 per_row = row_bytes / {unit}, units = rows * per_row;
      for (u64 i = first; i < units; i += step) {{
        u64 r, c;
        if (narrow) {{ r = (u32)i / (u32)per_row; c = (u32)i - (u32)r * (u32)per_row; }}
        else {{ r = i / per_row; c = i - r * per_row; }}
        *reinterpret_cast<{ctype}*>(o + r * pitch + c * {unit}) =
            *reinterpret_cast<const {ctype}*>(s + r * row_bytes + c * {unit});
      }}
      break;
    }}""" for unit, ctype in ((16, "rt_vec4<u32>"), (8, "u64"), (4, "u32"), (2, "unsigned short"),
                              (1, "unsigned char")))
    params = ", ".join(f"u32 {name}_lo, u32 {name}_hi" for name in _FIELDS)
    fields = "\n".join(f"  const u64 {name} = ((u64){name}_hi << 32) | {name}_lo;" for name in _FIELDS)
    return f"""
extern "C" __global__ void concat_rows(unsigned char* __restrict__ out, const unsigned char* __restrict__ in,
                                       {params}) {{
{fields}
  unsigned char* o = out + out_offset;
  const unsigned char* s = in + in_offset;
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
  const u64 bits = (u64)o | (u64)s | row_bytes | pitch;
  const u32 unit = (bits & 15) == 0 ? 16 : (bits & 7) == 0 ? 8 : (bits & 3) == 0 ? 4 : (bits & 1) == 0 ? 2 : 1;
  const bool narrow = rows * row_bytes < (1ull << 32);  // (every unit index and count fits 32 bits)
  switch (unit) {{
{copies}
  }}
}}
"""


def _numpy() -> dict:
    def concat_rows(wg, bindings, c) -> None:
        rows, row_bytes, pitch, out_offset, in_offset = (lo | hi << 32 for lo, hi in zip(c[::2], c[1::2]))
        out = np.frombuffer(bindings[0], dtype=np.uint8)
        src = np.frombuffer(bindings[1], dtype=np.uint8)
        window = np.lib.stride_tricks.as_strided(out[out_offset:], (rows, row_bytes), (pitch, 1))
        window[...] = src[in_offset:in_offset + rows * row_bytes].reshape(rows, row_bytes)

    return {"concat_rows": concat_rows}


def plan(node, layouts: list, ctx) -> list:
    """One ``concat_rows`` dispatch per non-empty input (each dense from its offset: ``ops.dense``)."""
    (axis,) = node.params
    shape = node.shape
    itemsize = node.dtype.itemsize
    outer = size_of(shape[:axis])
    inner = size_of(shape[axis + 1:]) * itemsize
    pitch = shape[axis] * inner
    if outer * pitch == 0:
        return []
    src = concat_source()
    cmds = []
    start = 0
    for k, (inp, (in_shape, _, offset)) in enumerate(zip(node.inputs, layouts)):
        row_bytes = in_shape[axis] * inner
        if row_bytes:
            consts = [word for value in (outer, row_bytes, pitch, start * inner, offset * itemsize)
                      for word in (value & 0xFFFFFFFF, value >> 32)]
            units = -(-outer * row_bytes // 16)
            cmds.append(("dispatch", src, "concat_rows", (grid_1d(units), 1, 1), consts, [("out",), ("in", k)]))
        start += inp.shape[axis]
    return cmds
