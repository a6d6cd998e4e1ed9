"""The sort order the device kernels share (``sort.py``'s merge sort, ``radix.py``'s radix sort,
``searchsorted``): an order-preserving unsigned key made from an element's bits, and numpy's stable
order it reproduces (the CPU drivers' form)."""

from __future__ import annotations

import numpy as np

from .. import dtypes as _dt

_BITS_TYPE = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
#: (exponent mask, mantissa mask) of each float's bits.
_FLOAT_MASKS = {"float16": (0x7C00, 0x03FF), "bfloat16": (0x7F80, 0x007F), "float32": (0x7F800000, 0x007FFFFF),
                "float64": (0x7FF0000000000000, 0x000FFFFFFFFFFFFF)}


def key_c(dt) -> str:
    """C of ``rt_key(bits, desc)``: the order-preserving key of an element's bits (types ``sort_key``,
    the key, and ``sort_bits``, an element's bits). Integers have their sign bit flipped; floats are
    ordered by sign and magnitude, -0.0 as 0.0, every NaN above +inf; a descending key is inverted."""
    width = dt.itemsize * 8
    ones = f"(sort_key)0x{(1 << width) - 1:X}ull"
    sign = f"(sort_key)0x{1 << (width - 1):X}ull"
    if dt is _dt.bool_:
        body = "sort_key k = bits != 0;"
    elif dt.kind == "u":
        body = "sort_key k = (sort_key)bits;"
    elif dt.kind == "i":
        body = f"sort_key k = (sort_key)bits ^ {sign};"
    else:
        exp, mant = (f"(sort_key){m:#x}ull" for m in _FLOAT_MASKS[dt.name])
        body = f"""sort_key b = (sort_key)bits, k;
  if ((b & {exp}) == {exp} && (b & {mant})) k = {ones};  // NaN, whatever its sign
  else {{
    if (b == {sign}) b = 0;  // -0.0 sorts as 0.0
    k = (b & {sign}) ? (~b & {ones}) : (b | {sign});
  }}"""
    return f"""typedef {"u64" if width == 64 else "u32"} sort_key;
typedef {_BITS_TYPE[dt.itemsize]} sort_bits;
__device__ __forceinline__ sort_key rt_key(sort_bits bits, u32 desc) {{
  {body}
  return desc ? (sort_key)(k ^ {ones}) : k;
}}
"""


def stable_order(x: np.ndarray, desc: bool) -> np.ndarray:
    """The stable order of each row of x (2-D); descending keeps equal elements in order, NaNs first."""
    if desc:
        n = x.shape[1]
        return n - 1 - np.flip(np.argsort(np.flip(x, 1), axis=1, kind="stable"), 1)
    return np.argsort(x, axis=1, kind="stable")
