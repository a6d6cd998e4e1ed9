"""Every kernel source the runtime can generate: what the GPU compile tests iterate."""

from __future__ import annotations

from .. import dtypes as _dt
from .. import ops
from . import (
    compact,
    concat,
    elementwise,
    gather,
    linalg,
    matmul,
    pad,
    radix,
    random,
    reduce,
    reduce_columns,
    rows,
    scan,
    scatter,
    sort,
    take,
    take_epilogue,
    tri,
)


def _signature(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - an unsupported combination (bool subtract, float bitwise, ...)
        return None


def _ew_combos():
    D = _dt.ALL
    for op in ops.ARITH + ops.BINARY_FLOAT + ops.BITWISE + ops.LOGICAL + ops.COMPARE:
        for d in D:
            sig = _signature(ops.binary_signature, op, d)
            if sig is not None:
                yield op, (d, d), sig[0], sig[1]
    for op in ops.UNARY_FLOAT + ops.UNARY_SAME + ops.UNARY_COMPLEX + ops.UNARY_PREDICATE:
        for d in D:
            sig = _signature(ops.unary_signature, op, d)
            if sig is not None:
                yield op, (d,), sig[0], sig[1]
    for src in D:
        for dst in D:
            if src is not dst and (not src.is_complex or dst.is_complex or dst is _dt.bool_):
                yield "cast", (src,), dst, dst
        yield "copy", (src,), src, src
        yield "where", (_dt.bool_, src, src), src, src


def all_sources() -> list:
    out = []
    for op, ins, out_dt, cdt in _ew_combos():
        out.append(elementwise.ew_source(op, ins, out_dt, cdt))
        # The tiled variants share one template, the op's expression the family's: every copy and
        # cast (each pair of element sizes and conversions), each other one-input op on float32 and
        # complex64 (real and complex results), each two-input op on float32 with a transposed
        # operand and a direct one, and additions of every dtype with each arrangement of the kinds.
        if len(ins) == 1 and (op in ("copy", "cast") or ins[0] in (_dt.float32, _dt.complex64)):
            out.append(elementwise.tiled_source(op, ins, "t", out_dt, cdt))
        if len(ins) == 2:
            arrangements = ("td", "dt", "tt", "ts") if op == "add" else ("td",) if ins[0] is _dt.float32 else ()
            out += [elementwise.tiled_source(op, ins, kinds, out_dt, cdt) for kinds in arrangements]
    for op in ("sum", "mean", "max", "min", "argmax", "argmin", "prod"):
        for d in _dt.ALL:
            if d.is_complex and op not in ("sum", "mean", "prod"):
                continue  # (complex numbers have no order)
            out.append(reduce.reduce_source(op, d, _dt.reduction_result(op, d)))
            if op in reduce_columns.OPS and not d.is_complex:
                for vec in (1, 4):
                    out.append(reduce_columns.columns_source(op, d, _dt.reduction_result(op, d), vec))
    for d in _dt.ALL:
        out.append(matmul.matmul_source(d))
        out.append(pad.pad_source(d))
        out.append(gather.gather_source(d))
        out.append(tri.tri_source(d))
        out.append(take.take_source(d))
        out.append(take.set_source(d))
    for d in scatter.DTYPES:
        out.append(scatter.scatter_source(d))
        out.append(take.add_source(d))  # (take_add adds in the same dtypes: ops.added_dtype)
    out.append(scatter.last_source())
    out.append(take.rank_source())
    for op, d, side in (("add", _dt.float32, 0), ("mul", _dt.bfloat16, 1), ("div", _dt.float16, 0),
                        ("maximum", _dt.float64, 1)):  # (the folds of a take into its reader: each form)
        out.append(take_epilogue.epilogue_source(op, d, d, side))
    for d in scan.DTYPES:
        out.append(scan.scan_source(d))
        out.append(scan.scan_source(d, "cumprod"))
    for d in sort.DTYPES:
        out.append(sort.sort_source(d))
        out.append(radix.radix_source(d))
    out.append(compact.compact_source())
    for d in _dt.FLOATS:
        out.append(random.random_source("uniform", d))
        out.append(random.random_source("normal", d))
    out.append(random.random_source("bits", _dt.int32))
    out.append(linalg.copy_source())
    out.append(concat.concat_source())
    for d in (_dt.float32, _dt.float64, _dt.complex64, _dt.complex128):  # (the solver routines' dtypes)
        out.append(linalg.factor_source(d))
    out += rows.examples()
    return out
