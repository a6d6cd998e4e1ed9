"""Every kernel source the runtime can generate: what the GPU compile tests iterate."""

from __future__ import annotations

from .. import dtypes as _dt
from . import elementwise, matmul, pad, random, reduce


def _ew_combos():
    D = _dt.ALL
    for op in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
        for d in D:
            cdt = d
            if op == "div":
                cdt = d if d.is_float else _dt.float32
            elif op == "pow" and d is _dt.bool_:
                cdt = _dt.int32
            try:
                elementwise.c_expr(op, cdt)
            except Exception:  # noqa: BLE001 - unsupported combination (e.g. bool subtract)
                continue
            yield op, (d, d), cdt, cdt
    for op in ("eq", "ne", "lt", "le", "gt", "ge"):
        for d in D:
            yield op, (d, d), _dt.bool_, d
    for op in ("neg", "abs"):
        for d in D:
            if op == "neg" and d is _dt.bool_:
                continue
            yield op, (d,), d, d
    for op in ("exp", "log", "sqrt", "tanh", "sigmoid"):
        for d in D:
            out = _dt.float_result(d)
            yield op, (d,), out, out
    for src in D:
        for dst in D:
            if src is not dst:
                yield "cast", (src,), dst, dst
        yield "copy", (src,), src, src
        yield "where", (_dt.bool_, src, src), src, src


def all_sources() -> list:
    out = []
    for op, ins, out_dt, cdt in _ew_combos():
        out.append(elementwise.ew_source(op, ins, out_dt, cdt))
    for op in ("sum", "mean", "max", "min", "argmax", "argmin"):
        for d in _dt.ALL:
            out.append(reduce.reduce_source(op, d, _dt.reduction_result(op, d)))
    for d in _dt.ALL:
        out.append(matmul.matmul_source(d))
        out.append(pad.pad_source(d))
    for d in _dt.FLOATS:
        out.append(random.random_source("uniform", d))
        out.append(random.random_source("normal", d))
    out.append(random.random_source("bits", _dt.int32))
    return out
