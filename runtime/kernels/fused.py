"""Fused elementwise kernels: a chain of elementwise ops over one index space in one kernel.

A fused kernel computes several elementwise nodes of the same size per
element, keeping the values that nothing outside the group reads in
registers. Its inputs are read contiguously from an offset (`c`) or as one
broadcast element (`s`); it writes the members some other kernel or the
program reads. The description (`FusedSpec`) names ops and dtypes only, so one
compiled kernel serves every graph of the same shape of computation; offsets
and the element count are constants.

Only float32, int32 and bool values are fused: their storage holds the
compute value exactly, so keeping a value in a register gives the same result
as storing and reloading it (half-precision nodes run as their own kernels).
"""

from __future__ import annotations

import hashlib

import numpy as np

import hal

from .. import dtypes as _dt
from .cuda_common import convert, load_expr, store_expr, unrolled_elements, vector_width
from .elementwise import arity, c_expr, ew_source, export_name
from .source import WORKGROUP, KernelSource, grid_1d, source

FUSABLE_DTYPES = frozenset((_dt.float32, _dt.int32, _dt.bool_))
#: The most ops one generated kernel computes (a fused group's members, a row program's): a longer
#: chain is cut into kernels of this many, each cut value written and read once more. NVRTC's time
#: grows faster than the kernel: a chain of `sin(x) + 1` compiled (sm_90, on a CI-class CPU) in
#: 1.9 s at 32 ops, 5.1 s at 64, 14 s at 100 and 94 s at 400; the cut segments of a chain are
#: alike, so one kernel serves each of them.
MAX_OPS = 64
_COMPARE = frozenset(("eq", "ne", "lt", "le", "gt", "ge"))

#: Ops that take a long instruction sequence an element: library math, IEEE division and roots.
COSTLY_OPS = frozenset((
    "div", "pow", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "tanh", "sigmoid", "gelu",
    "gelu_grad", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh",
    "atan2", "hypot", "logaddexp", "remainder", "floor_divide", "reciprocal"))
#: A fused kernel with at least COSTLY_PER_ELEMENT costly ops runs at most LOOPING_GRID workgroups,
#: each thread looping over several vectors, rather than one vector a thread: on an H200 the
#: 8-op chain of the workload benchmark (a square root and a tanh) over 64M float32 took 132.7 us
#: with 16384 workgroups against 139.3 with 65536 (torch.compile 131.8, a copy of the same bytes
#: 128.5), 133.5 with 32768, 135.0 with 8192; kernels of one costly op or none ran 1-2% slower
#: so (an add 187.4 -> 189.4 us, exp 129.1 -> 131.9), hence the threshold.
COSTLY_PER_ELEMENT = 2
LOOPING_GRID = 16384


class FusedSpec:
    """What a fused kernel computes.

    inputs:  ((dtype, variant), ...) with variant "c" (contiguous) or "s" (one broadcast element)
    members: ((op, compute dtype, out dtype, operands), ...) in evaluation order; an operand is
             ("i", k) for input k or ("m", j) for the value of member j < this one
    outputs: member indices written to the output bindings, in binding order
    """

    __slots__ = ("inputs", "members", "outputs", "key", "name", "costly")

    def __init__(self, inputs: tuple, members: tuple, outputs: tuple) -> None:
        self.inputs = inputs
        self.members = members
        self.outputs = outputs
        self.costly = sum(op in COSTLY_OPS for op, *_ in members)  # (see plan)
        self.key = ("fused", tuple((d.name, v) for d, v in inputs),
                    tuple((op, c.name, o.name, ops) for op, c, o, ops in members), outputs)
        self.name = "fused_" + hashlib.sha1(repr(self.key).encode()).hexdigest()[:16]

    def operand_dtype(self, ref: tuple):
        kind, k = ref
        return self.inputs[k][0] if kind == "i" else self.members[k][2]


def fused_source(spec: FusedSpec) -> KernelSource:
    nb = len(spec.outputs) + len(spec.inputs)
    nconst = 1 + len(spec.inputs)
    export = hal.Export(spec.name, (WORKGROUP, 1, 1), nb, nconst)
    return source(spec.key, lambda: KernelSource(spec.key, [export], lambda: _cuda(spec),
                                                 lambda: {spec.name: _numpy(spec)}))


def plan(spec: FusedSpec, n: int, offsets: list) -> tuple:
    """(source, export name, workgroups, constants) of one fused dispatch over n elements."""
    consts = [n] + list(offsets)
    groups = grid_1d(-(-n // _width(spec)))  # (a vector a thread where aligned, else 4 a workgroup apart)
    if spec.costly >= COSTLY_PER_ELEMENT:
        groups = min(groups, LOOPING_GRID)
    return fused_source(spec), spec.name, (groups, 1, 1), consts


# ---- CUDA C -----------------------------------------------------------------------------------

def _member_lines(spec: FusedSpec, load) -> list:
    """Statements computing every member as v<j>; `load(k)` is the C expression of input k's element."""
    lines = []
    for k, (d, _) in enumerate(spec.inputs):
        lines.append(f"const {d.c_compute} x{k} = {load_expr(d, load(k))};")
    for j, (op, cdt, out, operands) in enumerate(spec.members):
        names = ["a"] if arity(op) == 1 else (["a", "b"] if arity(op) == 2 else ["c", "a", "b"])
        res = "bool" if op in _COMPARE else cdt.c_compute
        lines.append(f"{out.c_compute} v{j};")
        body = []
        for nm, ref in zip(names, operands):
            src_dt = spec.operand_dtype(ref)
            value = f"x{ref[1]}" if ref[0] == "i" else f"v{ref[1]}"
            target = "bool" if nm == "c" else cdt.c_compute
            body.append(f"const {target} {nm} = {convert(value, src_dt.c_compute, target)};")
        body.append(f"v{j} = {convert('(' + c_expr(op, cdt) + ')', res, out.c_compute)};")
        lines.append("{ " + " ".join(body) + " }")
    return lines


def _width(spec: FusedSpec) -> int:
    """Elements a thread moves as one vector (``cuda_common.vector_width``)."""
    return vector_width([d for d, v in spec.inputs if v == "c"] + [spec.members[j][2] for j in spec.outputs])


def _cuda(spec: FusedSpec) -> str:
    params = [f"{spec.members[j][2].c_storage}* __restrict__ out{k}" for k, j in enumerate(spec.outputs)]
    params += [f"const {d.c_storage}* __restrict__ in{k}" for k, (d, _) in enumerate(spec.inputs)]
    params.append("u32 n")
    params += [f"u32 o{k}" for k in range(len(spec.inputs))]
    contiguous = [k for k, (_, v) in enumerate(spec.inputs) if v == "c"]
    W = _width(spec)
    check = " | ".join(["n"] + [f"o{k}" for k in contiguous])
    body = [f"  if ((({check}) & {W - 1}u) == 0) {{",
            f"    const u64 nv = n / {W}u;",
            "    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < nv;"
            " j += (u64)blockDim.x * gridDim.x) {"]
    for k in contiguous:
        d = spec.inputs[k][0]
        body.append(f"      const rt_vec<{d.c_storage}, {W}> w{k} = "
                    f"reinterpret_cast<const rt_vec<{d.c_storage}, {W}>*>(in{k} + o{k})[j];")
    for k, j in enumerate(spec.outputs):
        body.append(f"      rt_vec<{spec.members[j][2].c_storage}, {W}> ov{k};")
    body.append("      #pragma unroll")
    body.append(f"      for (int e = 0; e < {W}; ++e) {{")
    vec_load = lambda k: f"w{k}.v[e]" if spec.inputs[k][1] == "c" else f"in{k}[o{k}]"  # noqa: E731
    body += ["        " + line for line in _member_lines(spec, vec_load)]
    for k, j in enumerate(spec.outputs):
        body.append(f"        ov{k}.v[e] = {store_expr(spec.members[j][2], f'v{j}')};")
    body.append("      }")
    for k, j in enumerate(spec.outputs):
        body.append(f"      reinterpret_cast<rt_vec<{spec.members[j][2].c_storage}, {W}>*>(out{k})[j] = ov{k};")
    body += ["    }", "    return;", "  }"]
    # Unaligned: 4 elements a thread, a workgroup's width apart (cuda_common.unrolled_elements).
    refs = [f"in{k}[o{k} + i]" if v == "c" else f"in{k}[o{k}]" for k, (_, v) in enumerate(spec.inputs)]

    def each(indent: str) -> list:
        return [indent + line for line in _member_lines(spec, lambda k: f"r{k}[e]")] + [
            f"{indent}out{k}[i] = {store_expr(spec.members[j][2], f'v{j}')};" for k, j in enumerate(spec.outputs)]

    body += unrolled_elements([d.c_storage for d, _ in spec.inputs], refs, lambda indent: [], each)
    return f'extern "C" __global__ void {spec.name}({", ".join(params)}) {{\n' + "\n".join(body) + "\n}\n"


# ---- numpy ------------------------------------------------------------------------------------

def _numpy(spec: FusedSpec):
    """Each member through its own elementwise numpy kernel, on temporaries (the same results)."""
    members = []
    for op, cdt, out, operands in spec.members:
        in_dts = tuple(spec.operand_dtype(ref) for ref in operands)
        members.append((ew_source(op, in_dts, out, cdt), op, in_dts, out, operands))
    n_out = len(spec.outputs)

    def run(workgroups, bindings, constants):
        n = constants[0]
        values = []  # per input: (array, is scalar)
        for k, (d, v) in enumerate(spec.inputs):
            off = constants[1 + k]
            count = n if v == "c" else 1
            values.append((np.frombuffer(bindings[n_out + k], d.storage, count, off * d.itemsize), v == "s"))
        results = []
        for src, op, in_dts, out, operands in members:
            args = [values[k] if kind == "i" else results[k] for kind, k in operands]
            variant = "".join("s" if scalar or n == 1 else "c" for _, scalar in args)
            result = np.empty(n, out.storage)
            fn = src.numpy_code()[export_name(op, in_dts, out, variant)]
            fn(None, [memoryview(result).cast("B")] + [memoryview(a).cast("B") for a, _ in args],
               [n] + [0] * len(args))
            results.append((result, n == 1))
        for k, j in enumerate(spec.outputs):
            out = spec.members[j][2]
            np.frombuffer(bindings[k], out.storage, n)[...] = results[j][0]
    return run
