"""Row programs: reductions over the last axes fused with the elementwise ops around them.

A row program computes a group of nodes over an (O, N) index space: O rows of
N elements. Its *full* members hold one value per element, its *row* members
one value per row (a reduction over the row's N elements, or an elementwise op
of such values). Softmax, log-softmax, layer and RMS norms and a mean-squared
error are each one such group: the input is read once and the outputs written
once, the values in between stay on chip.

A full member depends on row values that need the whole row reduced first, so
the program runs in phases: a member's *stage* counts the reductions on its
longest path from the inputs; phase s computes the full members of stage s and
accumulates the reductions over them, then a block-wide step finishes those
reductions and computes the row members that follow. One workgroup holds RPB
rows of T threads each. When a row fits (at most E elements a thread), each
thread keeps its elements of every full value in registers across phases
("register" mode: one read of the input, every input loaded in the first
phase); rows of up to 1024 x 32 elements fit so when the program's values are
32-bit and few (one workgroup of 1024 threads an SM); longer rows are streamed
again in every phase, recomputing what that phase needs ("loop" mode, one
kernel still); there a sum of exp(x - max(x)) is accumulated beside its
maximum (``online_sums``), so softmax and cross entropy read a long row once
less.
A group over few long rows splits each row into C chunks (the grid would
otherwise hold too few workgroups to fill the GPU): a dispatch a phase over
every chunk, each finishing the reductions of the phases before from every
chunk's partials, and a `combine` dispatch writing the row values.

Inputs are read per element as 2-D strided views, base + o*so + j*sn: "v"
(unit column stride: contiguous rows, a per-column vector such as a norm's
weight; moved as 4-element vectors when every row start is aligned), "e" (any
other column stride), "r" (one value per row, sn = 0) and "s" (one value).

Values of a narrow type kept on chip are rounded to their type as if stored
and loaded again, so a group gives exactly the results of its ops run one by
one (up to the order of a reduction's additions).
"""

from __future__ import annotations

import hashlib

import numpy as np

import hal

from .. import dtypes as _dt
from .cuda_common import convert, load_expr, round_expr, store_expr
from .elementwise import PREDICATES, arity, c_expr, ew_source, export_name
from .numpy_util import ERRSTATE, signed, store, strided_view, to_compute
from .reduce_ops import acc_dtype, c_combine, c_identity, np_reduce
from .source import KernelSource, row_chunks, source, u32

#: Elements a thread keeps of each full value in register mode, at most, as the mapping is chosen;
#: rows longer than 1024 threads x this many run in the long register mode below or in loop mode.
MAX_PER_THREAD = 16
#: Rows up to 1024 threads x LONG_PER_THREAD elements stay in register mode (1024 threads of that
#: many elements, one workgroup an SM) when the program's full values are 32-bit and take at most
#: LONG_REGISTER_BUDGET registers a thread (values x elements); otherwise they run in loop mode.
#: Loop mode reads a row again in every phase and a long row leaves the L2 before its next phase:
#: on an H200, float32 over 1024 rows of 32768, softmax took 116.8 us in loop mode and 82.7 in
#: register mode (torch.compile 100.3), layer norm 103.3 and 101.4 (90.3); over rows of 20000,
#: softmax 65.5 and 62.7, layer norm 74.2 and 68.3 (torch.compile 82.8 and 98.1).
LONG_PER_THREAD = 32
LONG_REGISTER_BUDGET = 256
#: Values (full inputs and members x elements a thread) a register-mode thread may hold before
#: the program streams its rows instead (beyond this the compiler spills to local memory).
REGISTER_BUDGET = 192
#: Rows whose full inputs are all 16-bit: a thread keeps up to this many elements (twice
#: MAX_PER_THREAD, so that its loads bring as many bytes as a 32-bit row's), in workgroups of
#: NARROW_WORKGROUP threads, where the register budget allows. On an H200, over 8192x4096 (256
#: threads of 16 elements before), with the loads issued first (``loads_first``), us: bfloat16
#: softmax 64.7 -> 50.7, float16 softmax 60.4 -> 48.1 (the copy 34.4; in workgroups of 256 threads,
#: two rows each, 52.9). A layer norm's eight values a thread exceed the budget at 32 elements: it
#: keeps 256 threads of 16 (55.9 us; 52.7-53.3 with 128 of 32 forced, spilling).
NARROW_PER_THREAD = 2 * MAX_PER_THREAD
NARROW_WORKGROUP = 128
#: Register mode loads the row's vectors of a pass before it uses any where a thread keeps at least
#: this many elements (see ``loads_first``).
PREFETCH_MIN_E = 32
#: Groups with fewer rows than this and rows at least SPLIT_MIN_N long split rows into chunks (those
#: of several phases only where their rows would stream anyway: see choose).
SPLIT_MAX_ROWS = 256
SPLIT_MIN_N = 16384
#: Elements a chunk of a split row holds at least.
SPLIT_CHUNK = 8192
#: Streamed rows at least this long accumulate their sums of exponentials online (``online_sums``).
#: Shorter rows are still in the L2 when the next phase reads them again (two workgroups of 1024
#: threads an SM hold 264 rows on an H200: 264 x 48K float32 fill its 50 MB), so the pass saved costs
#: little there, while the exponentials taken a phase earlier cost more than it. On an H200, compiled,
#: us, two passes against online: softmax over 512 rows of 65536 140.5 -> 122.4 and over 32 rows of
#: 2**20 (split) 150.7 -> 121.5; cross entropy over 2048 rows of 128256 479 -> 352 (PyTorch eager
#: 1034) and its gradient 1362 -> 1213; but its gradient over 4096 rows of 32000 610 -> 745. In
#: register mode it was slower at every size tried (softmax of 8192x4096 69 -> 88 us, cross entropy
#: over rows of 32000 244 -> 366): the rows are read once there anyway.
ONLINE_MIN_N = 49152


class Config:
    """How the program maps onto the GPU: T threads a row, RPB rows a workgroup, E elements a thread
    per pass, VEC elements a load (4 or 1), loop mode, C chunks a row (split when C > 1), and the
    inputs that register mode loads in the phase that first reads them (``late``) rather than with
    the row in the first phase."""

    __slots__ = ("T", "RPB", "E", "VEC", "loop", "C", "chunk", "late", "prefetch")

    def __init__(self, T: int, RPB: int, E: int, VEC: int, loop: bool, C: int = 1, chunk: int = 0,
                 late: tuple = (), prefetch: bool = False) -> None:
        self.T, self.RPB, self.E, self.VEC, self.loop, self.C, self.chunk = T, RPB, E, VEC, loop, C, chunk
        self.late = late
        #: Register mode loads the row's vectors of a pass before it uses any (``loads_first``).
        self.prefetch = prefetch

    def key(self) -> tuple:
        return (self.T, self.RPB, self.E, self.VEC, self.loop, self.C > 1, self.late, self.prefetch)


class RowSpec:
    """What a row program computes.

    inputs:  ((dtype, kind), ...) with kind "v", "e", "r" or "s" (see the module doc)
    members: in evaluation order, ("ew", op, compute dtype, out dtype, operands) or
             ("red", op, input dtype, out dtype, (operand,)); an operand is ("i", k) for input k or
             ("m", j) for member j < this one
    full:    per member, whether it holds a value per element (else per row)
    outputs: member indices written to the output bindings, in binding order
    """

    __slots__ = ("inputs", "members", "full", "outputs", "online", "live", "stage", "phases", "key")

    def __init__(self, inputs: tuple, members: tuple, full: tuple, outputs: tuple, online: bool = True) -> None:
        self.inputs = inputs
        self.members = members
        self.full = full
        self.outputs = outputs
        #: Online sums: member j (a sum of exp(x - max(x))) -> (the max's member, x), accumulated in
        #: the max's phase (see online_sums); none with ``online`` false.
        self.online = online_sums(members, full) if online else {}
        #: Whether a member is computed: an output, or read by one computed (an online sum reads x,
        #: not its exponentials).
        self.live = _live(members, outputs, self.online)
        stage: list = []
        for j, m in enumerate(members):
            if j in self.online:
                stage.append(stage[self.online[j][0]])
                continue
            s = max((stage[k] if kind == "m" else 0) for kind, k in m[4]) if m[4] else 0
            stage.append(s + 1 if m[0] == "red" else s)
        self.stage = tuple(stage)
        phases = 0  # phases with a loop over the row: one more than the last stage a full value has
        for j, m in enumerate(members):
            if not self.live[j]:
                continue
            if full[j]:
                phases = max(phases, stage[j] + 1)
            if m[0] == "red":
                phases = max(phases, stage[j])
        self.phases = max(phases, 1)
        self.key = ("rows", tuple((d.name, kind) for d, kind in inputs),
                    tuple((m[0], m[1], m[2].name, m[3].name, m[4]) for m in members), full, outputs,
                    bool(self.online))

    def red_operand(self, j: int) -> tuple:
        """What reduction j accumulates: its operand, or x for an online sum."""
        online = self.online.get(j)
        return self.members[j][4][0] if online is None else online[1]

    def input_full(self, k: int) -> bool:
        return self.inputs[k][1] in "ve"

    def operand_full(self, ref: tuple) -> bool:
        kind, k = ref
        return self.input_full(k) if kind == "i" else self.full[k]

    def operand_dtype(self, ref: tuple):
        kind, k = ref
        return self.inputs[k][0] if kind == "i" else self.members[k][3]

    def splittable(self) -> bool:
        """One stage: every reduction reads values of stage 0 and no full value comes after one."""
        return self.phases == 1

    def name(self, config: Config) -> str:
        digest = hashlib.sha1(repr((self.key, config.key())).encode()).hexdigest()[:16]
        return f"fused_rows_{digest}"


def online_sums(members: tuple, full: tuple) -> dict:
    """The sums of exponentials a row program accumulates with their maximum, in one pass: member j,
    sum(exp(x - m)) with m = max(x) over the same row (softmax's, log-softmax's and cross entropy's
    denominator), float32 throughout. A thread keeps a running maximum and the sum scaled to it,
    rescaled when the maximum grows (``_Gen.online_batch``), so the sum no longer waits for a phase
    of its own: softmax over rows runs two phases rather than three, and a row streamed in loop mode
    is read once less (``plan`` takes it for rows of at least ONLINE_MIN_N streamed, else the two
    passes). The exponentials' rounding differs from the two-pass sum's by the rescaling's (a few
    units in the last place); special values give what the two passes give: NaN where the row holds
    a NaN or +inf, or only -inf."""
    f32 = _dt.float32
    out: dict = {}
    for j, m in enumerate(members):
        if m[0] != "red" or m[1] != "sum" or m[2] is not f32 or m[3] is not f32 or m[4][0][0] != "m":
            continue
        e = m[4][0][1]
        exp = members[e]
        if not full[e] or exp[:4] != ("ew", "exp", f32, f32) or exp[4][0][0] != "m":
            continue
        d = exp[4][0][1]
        sub = members[d]
        if not full[d] or sub[:4] != ("ew", "sub", f32, f32) or sub[4][1][0] != "m":
            continue
        x, mx = sub[4][0], sub[4][1][1]
        top = members[mx]
        if top[0] == "red" and top[1] == "max" and top[4] == (x,) and acc_dtype("max", top[2]) is f32 \
                and top[3] is top[2]:
            out[j] = (mx, x)
    return out


def _live(members: tuple, outputs: tuple, online: dict) -> tuple:
    live = [False] * len(members)
    for j in outputs:
        live[j] = True
    for j in range(len(members) - 1, -1, -1):
        if live[j]:
            operands = (online[j][1], ("m", online[j][0])) if j in online else members[j][4]
            for kind, k in operands:
                if kind == "m":
                    live[k] = True
    return tuple(live)


def may_split(O: int, N: int) -> bool:  # noqa: E741
    """Whether a program over (O, N) may split its rows (its row values are then ready a level later)."""
    return O < SPLIT_MAX_ROWS and N >= SPLIT_MIN_N


# ---- configuration ----------------------------------------------------------------------------

def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def choose(spec: RowSpec, O: int, N: int, vec: bool, late: tuple = ()) -> Config:  # noqa: E741
    """The mapping of an (O, N) row program (see the module doc); `late`: the inputs register mode
    loads where they are first read (``Config``)."""
    VEC = 4 if vec and N % 4 == 0 else 1
    nfull = sum(f and v for f, v in zip(spec.full, spec.live)) + \
        sum(1 for k in range(len(spec.inputs)) if spec.input_full(k))
    if spec.splittable():
        split = _split(O, N, VEC)
        if split is not None:
            return split
    narrow = narrow_rows(spec)
    if N <= 1024 * MAX_PER_THREAD:
        T = min(1024, _pow2(-(-N // (NARROW_PER_THREAD if narrow else MAX_PER_THREAD))))
        E = max(VEC, _pow2(-(-N // T)))
        while nfull * E > REGISTER_BUDGET and T < 1024 and E > VEC:
            T, E = T * 2, E // 2
        if nfull * E <= REGISTER_BUDGET:
            if T == 1024 and 2 * E <= LONG_PER_THREAD and nfull * 2 * E <= LONG_REGISTER_BUDGET and \
                    values_32_bit(spec):
                # Two workgroups an SM rather than one, so that one's loads overlap the other's
                # reductions: rows of 16384 float32 on an H200, softmax 95.1 -> 73.1 us and layer norm
                # 100.1 -> 85.9 (torch.compile 84.8 and 83.0); bfloat16 layer norm 102.0 -> 68.7.
                return Config(512, 1, 2 * E, VEC, False, late=late)
            return Config(T, max(1, (NARROW_WORKGROUP if narrow else 256) // T), E, VEC, False, late=late)
    elif N <= 1024 * LONG_PER_THREAD and values_32_bit(spec):
        # (A wider value alone, 32 doubles, would take the 64 registers a thread of 1024 has: a
        # float64 softmax so spilled 1 KB a thread.)
        E = max(VEC, _pow2(-(-N // 1024)))
        if nfull * E <= LONG_REGISTER_BUDGET:
            return Config(1024, 1, E, VEC, False, late=late)
    # Streamed: few rows split too, each phase a dispatch over every chunk (8 rows of 4M float32 in
    # a softmax ran 1636 us on 8 workgroups of an H200, torch.compile 144).
    split = _split(O, N, VEC)
    return split if split is not None else Config(1024, 1, 8 if VEC == 4 else 4, VEC, True)


def _split(O: int, N: int, VEC: int) -> Config | None:  # noqa: E741
    """Loop mode over rows cut into C chunks of at least SPLIT_CHUNK elements, C workgroups a row
    (up to 1024 workgroups in all), where the rows are few and long (``may_split``); else None."""
    if not may_split(O, N):
        return None
    C, chunk = row_chunks(N, O, SPLIT_CHUNK, 1024)
    return Config(256, 1, 8 if VEC == 4 else 4, VEC, True, C, chunk) if C > 1 else None


def narrow_rows(spec: RowSpec) -> bool:
    """Whether the program reads full rows, each of a 16-bit type (see NARROW_PER_THREAD)."""
    sizes = [d.itemsize for k, (d, _) in enumerate(spec.inputs) if spec.input_full(k)]
    return bool(sizes) and all(size == 2 for size in sizes)


def loads_first(spec: RowSpec, config: Config) -> bool:
    """Whether register mode loads the row's vectors of a pass before it uses any (``Config.prefetch``).

    Where a thread keeps many elements: loads interleaved with the arithmetic on what they brought
    waited one after the other where the compiler kept that order. On an H200, float32 layer norm
    over 1024 rows of 32768 100.1 -> 84.9 us (torch.compile 90.4) and over 2048 rows of 16384 83.6
    -> 72.0; bfloat16 softmax over 8192x4096 in 128 threads of 32 elements 62.8 -> 50.7. Not with
    fewer elements a thread (layer norms over 8192x4096, 256 threads of 16: bfloat16 55.9 -> 60.0,
    float32 67.9 -> 68.8), nor for the vectors loaded late (a norm's weights, read from the L2 as
    they are used) or streamed rows: held as arrays there, they took registers the reductions needed
    (the float32 layer norm over rows of 32768 spilled: 100 -> 191 us). Nor in 16-bit programs that
    load vectors late: a bfloat16 layer norm over 2048 rows of 16384 (512 threads of 32) went 66.9 ->
    75.3 us, where its softmax went 76.9 -> 57.9.
    """
    return not config.loop and config.E >= PREFETCH_MIN_E and not (config.late and narrow_rows(spec))


#: Compute types held in one 32-bit register.
_ONE_REGISTER = frozenset(("float", "int", "unsigned int", "bool"))


def values_32_bit(spec: RowSpec) -> bool:
    """Whether every value a register-mode thread holds per element (each full input and full member,
    in its compute type) takes one 32-bit register."""
    types = [d for k, (d, _) in enumerate(spec.inputs) if spec.input_full(k)] + \
        [m[3] for j, m in enumerate(spec.members) if spec.full[j] and spec.live[j]]
    return all(d.c_compute in _ONE_REGISTER for d in types)


# ---- planning ---------------------------------------------------------------------------------

def plan(spec: RowSpec, O: int, N: int, layouts: list) -> tuple:  # noqa: E741
    """(source, commands, temps) of the program over (O, N); layouts: per input (offset, so, sn).

    Commands are ("dispatch", src, name, workgroups, constants, bindings) and ("barrier",); bindings
    are ("out", m) for output m, ("in", k) for input k and ("tmp", t) for scratch t of `temps` (bytes).
    """
    vec = all(off % 4 == 0 and so % 4 == 0 for (d, kind), (off, so, sn) in zip(spec.inputs, layouts)
              if kind == "v")
    # A vector the same for every row (a norm's weight, row stride 0) is read from L2 where it is
    # used: loaded with the row, it held a register per element across the reductions (a layer norm
    # of 8192x4096 float32 on an H200: 67.2 us so, 70.1 us loaded with the row; torch.compile 67.5).
    late = tuple(k for k, ((d, kind), (off, so, sn)) in enumerate(zip(spec.inputs, layouts))
                 if kind == "v" and so == 0)
    config = choose(spec, O, N, vec, late)
    if spec.online and not (config.loop and N >= ONLINE_MIN_N):  # (see ONLINE_MIN_N)
        spec = RowSpec(spec.inputs, spec.members, spec.full, spec.outputs, online=False)
        config = choose(spec, O, N, vec, late)
    config.prefetch = loads_first(spec, config)
    src = rows_source(spec, config)
    name = spec.name(config)
    consts = [O, N]
    for off, so, sn in layouts:
        consts += [u32(off), u32(so), u32(sn)]
    outs = [("out", m) for m in range(len(spec.outputs))]
    ins = [("in", k) for k in range(len(spec.inputs))]
    groups = (O + config.RPB - 1) // config.RPB
    if config.C == 1:
        return src, [("dispatch", src, name, (groups, 1, 1), consts, outs + ins)], []
    reds = [j for j, m in enumerate(spec.members) if m[0] == "red"]
    temps = [O * config.C * acc_dtype(spec.members[j][1], spec.members[j][2]).itemsize for j in reds]
    tmps = [("tmp", t) for t in range(len(reds))]
    split_consts = consts + [config.chunk, config.C]
    full_outs = [o for o, m in zip(outs, spec.outputs) if spec.full[m]]
    row_outs = [o for o, m in zip(outs, spec.outputs) if not spec.full[m]]
    cmds: list = []
    for p in range(spec.phases):  # each after every chunk's partials of the phases before
        if cmds:
            cmds.append(("barrier",))
        cmds.append(("dispatch", src, part_name(name, p), (O, config.C, 1), split_consts, full_outs + tmps + ins))
    if row_outs:
        cmds += [("barrier",), ("dispatch", src, name + "_c", (O, 1, 1), split_consts, row_outs + tmps + ins)]
    return src, cmds, temps


def part_name(name: str, p: int) -> str:
    """The export of a split program's phase p."""
    return f"{name}_p{p}"


#: Threads of a split row program's combine workgroup (one row each).
COMBINE_THREADS = 256


def block_size(config: Config, kind: str) -> int:
    """Threads of a workgroup of the program's kernel `kind` ("main", "part" or "comb")."""
    return {"main": config.T * config.RPB, "part": config.T, "comb": COMBINE_THREADS}[kind]


def rows_source(spec: RowSpec, config: Config) -> KernelSource:
    name = spec.name(config)
    key = ("rows", name)  # the name's digest covers the spec and the mapping
    nin = len(spec.inputs)
    nconst = 2 + 3 * nin
    if config.C == 1:
        exports = [hal.Export(name, (block_size(config, "main"), 1, 1), len(spec.outputs) + nin, nconst)]
    else:
        nred = sum(1 for m in spec.members if m[0] == "red")
        nfull_out = sum(1 for m in spec.outputs if spec.full[m])
        exports = [hal.Export(part_name(name, p), (block_size(config, "part"), 1, 1), nfull_out + nred + nin,
                              nconst + 2) for p in range(spec.phases)]
        if nfull_out < len(spec.outputs):
            exports.append(hal.Export(name + "_c", (block_size(config, "comb"), 1, 1),
                                      len(spec.outputs) - nfull_out + nred + nin, nconst + 2))
    return source(key, lambda: KernelSource(key, exports, lambda: _cuda(spec, config, name),
                                            lambda: _numpy(spec, config, name)))


# ---- CUDA C -----------------------------------------------------------------------------------

_NEG_INF = "(-__int_as_float(0x7f800000))"
_NAN = "__int_as_float(0x7fc00000)"


class _Gen:
    """Emits one kernel of a row program (main, split partial or split combine)."""

    def __init__(self, spec: RowSpec, config: Config, kind: str) -> None:
        self.spec, self.c, self.kind = spec, config, kind  # kind: "main", "part" or "comb"
        self.lines: list = []

    def emit(self, line: str) -> None:
        self.lines.append(line)

    # operand expressions ------------------------------------------------------------------
    def operand(self, ref: tuple, slot: str) -> str:
        kind, k = ref
        if kind == "i":
            return f"x{k}[{slot}]" if self.spec.input_full(k) else f"rx{k}"
        return f"v{k}[{slot}]" if self.spec.full[k] else f"r{k}"

    def ew_value(self, j: int, slot: str) -> str:
        """C statements computing element-wise member j into its variable."""
        _, op, cdt, out, operands = self.spec.members[j]
        names = ["a"] if arity(op) == 1 else (["a", "b"] if arity(op) == 2 else ["c", "a", "b"])
        res = "bool" if op in PREDICATES else cdt.c_compute
        body = []
        for nm, ref in zip(names, operands):
            src_dt = self.spec.operand_dtype(ref)
            target = "bool" if nm == "c" else cdt.c_compute
            body.append(f"const {target} {nm} = {convert(self.operand(ref, slot), src_dt.c_compute, target)};")
        value = round_expr(out, convert("(" + c_expr(op, cdt) + ")", res, out.c_compute))
        dest = f"v{j}[{slot}]" if self.spec.full[j] else f"r{j}"
        return "{ " + " ".join(body) + f" {dest} = {value}; }}"

    # pieces --------------------------------------------------------------------------------
    def signature(self, name: str) -> str:
        spec = self.spec
        params = []
        if self.kind == "main":
            outs = spec.outputs
        elif self.kind == "part":
            outs = [m for m in spec.outputs if spec.full[m]]
        else:
            outs = [m for m in spec.outputs if not spec.full[m]]
        params += [f"{spec.members[m][3].c_storage}* __restrict__ out{m}" for m in outs]
        if self.kind != "main":
            for j, m in enumerate(spec.members):
                if m[0] == "red":
                    params.append(f"{acc_dtype(m[1], m[2]).c_compute}* __restrict__ pv{j}")
        params += [f"const {d.c_storage}* __restrict__ in{k}" for k, (d, _) in enumerate(spec.inputs)]
        params += ["u32 O", "u32 N"]
        for k in range(len(spec.inputs)):
            params += [f"u32 off{k}", f"u32 so{k}", f"u32 sn{k}"]
        if self.kind != "main":
            params += ["u32 chunk", "u32 C"]
        # The launch bounds cap the registers a thread takes at what the workgroup's threads can share
        # (64 with 1024 threads): without them a float64 layer norm over rows of more than 16384
        # elements took 70, and a workgroup of 1024 threads of it could not launch.
        return (f'extern "C" __global__ void __launch_bounds__({block_size(self.c, self.kind)}) '
                f'{name}({", ".join(params)})')

    def prologue(self, T: int, RPB: int) -> None:
        spec = self.spec
        self.emit(f"  constexpr u32 T = {T}, RPB = {RPB}, SEG = T < RT_WARP ? T : RT_WARP;")
        self.emit("  const u32 t = threadIdx.x % T, rl = threadIdx.x / T;")
        self.emit("  const u32 o = blockIdx.x * RPB + rl;")
        self.emit("  const bool row_ok = o < O;")
        for k, (d, kind) in enumerate(spec.inputs):
            self.emit(f"  const i64 rb{k} = (i64)off{k} + (row_ok ? (i64)(int)so{k} * (i64)o : 0);")
            if kind in "rs":
                self.emit(f"  const {d.c_compute} rx{k} = row_ok ? {load_expr(d, f'in{k}[rb{k}]')} : "
                          f"({d.c_compute})0;")

    def reductions(self, stage: int) -> list:
        """The reductions a phase accumulates: those of ``stage`` (one more than the phase's)."""
        spec = self.spec
        return [j for j, m in enumerate(spec.members) if m[0] == "red" and spec.live[j] and spec.stage[j] == stage]

    def paired(self, reds: list) -> dict:
        """Of reductions ``reds``: each maximum accumulated with an online sum among them -> that sum."""
        online = self.spec.online
        return {online[j][0]: j for j in reds if j in online}

    def online_batch(self, j: int) -> list:
        """C statements adding this thread's elements of x in the pass (E of them, those in the row) to
        online sum j and its maximum (``online_sums``): the maximum of the batch first, the sum rescaled
        to it when it grew (NaN != NaN: a NaN stays), then the batch's exponentials, independent of
        one another (one element at a time, each waiting for the last, ran 1.6x slower)."""
        mx, x = self.spec.online[j]
        value = convert(self.operand(x, "s"), self.spec.operand_dtype(x).c_compute, "float")
        each = "for (u32 s = 0; s < E; ++s) if (row_ok && base + (s / VEC) * T + t < j1)"
        return [
            "  {",
            f"    float bm = a{mx};",
            "    #pragma unroll",
            f"    {each} bm = rt_comb{mx}(bm, {value});",
            f"    if (bm != a{mx}) a{j} *= expf(a{mx} - bm);",
            f"    if (bm != {_NEG_INF}) {{",
            "      #pragma unroll",
            f"      {each} a{j} += expf({value} - bm);",
            "    }",
            f"    a{mx} = bm;",
            "  }",
        ]

    def reduce_step(self, reds: list) -> None:
        """Finish the thread partials a<j> of reductions `reds` across their row (every thread gets the
        total). An online sum is combined with its maximum as a pair (``rt_pair<j>``)."""
        spec = self.spec
        pairs = self.paired(reds)
        mine = [j for j in reds if j not in spec.online]
        for j in mine:
            op, in_dt = spec.members[j][1], spec.members[j][2]
            acc = acc_dtype(op, in_dt)
            self.emit(f"  __shared__ {acc.c_compute} sh{j}[RPB * (T / SEG)];")
            if j in pairs:
                s = pairs[j]
                self.emit(f"  __shared__ float sh{s}[RPB * (T / SEG)];")
                self.emit(f"  for (u32 d = SEG / 2; d > 0; d /= 2) {{ const float om = RT_SHFL_DOWN(a{j}, d), "
                          f"os = RT_SHFL_DOWN(a{s}, d); rt_pair{s}(a{j}, a{s}, om, os); }}")
                self.emit(f"  if (threadIdx.x % SEG == 0) {{ sh{j}[threadIdx.x / SEG] = a{j}; "
                          f"sh{s}[threadIdx.x / SEG] = a{s}; }}")
                continue
            self.emit(f"  for (u32 d = SEG / 2; d > 0; d /= 2) a{j} = rt_comb{j}(a{j}, RT_SHFL_DOWN(a{j}, d));")
            self.emit(f"  if (threadIdx.x % SEG == 0) sh{j}[threadIdx.x / SEG] = a{j};")
        self.emit("  __syncthreads();")
        for j in mine:
            self.emit(f"  a{j} = sh{j}[rl * (T / SEG)];")
            if j in pairs:
                s = pairs[j]
                self.emit(f"  a{s} = sh{s}[rl * (T / SEG)];")
                self.emit(f"  for (u32 g = 1; g < T / SEG; ++g) rt_pair{s}(a{j}, a{s}, sh{j}[rl * (T / SEG) + g], "
                          f"sh{s}[rl * (T / SEG) + g]);")
            else:
                self.emit(f"  for (u32 g = 1; g < T / SEG; ++g) a{j} = rt_comb{j}(a{j}, sh{j}[rl * (T / SEG) + g]);")

    def finish_row_members(self, stage: int) -> None:
        """Declare and compute the row members of `stage`; write those that are outputs."""
        spec = self.spec
        for j, m in enumerate(spec.members):
            if spec.full[j] or not spec.live[j] or spec.stage[j] != stage:
                continue
            out = m[3]
            if m[0] == "red":
                acc = acc_dtype(m[1], m[2])
                value, typ = f"a{j}", acc.c_compute
                if j in spec.online:  # a row of -inf only: exp(-inf - -inf) is NaN in the two passes
                    value = f"((a{spec.online[j][0]} == {_NEG_INF} && N > 0u) ? {_NAN} : a{j})"
                if m[1] == "mean":
                    typ = out.c_compute if out.is_float else "double"
                    value = f"({typ})a{j} / ({typ})N"
                self.emit(f"  const {out.c_compute} r{j} = {round_expr(out, convert(value, typ, out.c_compute))};")
            else:
                self.emit(f"  {out.c_compute} r{j};")
                self.emit("  " + self.ew_value(j, ""))
            if j in spec.outputs and self.kind != "part":
                self.emit(f"  if (row_ok && t == 0) out{j}[o] = {store_expr(out, f'r{j}')};")

    def phase(self, p: int) -> list:
        """The loop of phase p over this thread's elements; returns the reductions it accumulates."""
        spec, c = self.spec, self.c
        V = c.VEC
        computed = [j for j in range(len(spec.members)) if spec.full[j] and spec.live[j] and spec.stage[j] == p]
        reds = self.reductions(p + 1)
        if c.loop:  # recompute every full value this phase reads
            need = set(computed) | {spec.red_operand(j)[1] for j in reds if spec.red_operand(j)[0] == "m"}
            todo = list(need)
            while todo:
                for kind, k in spec.members[todo.pop()][4]:
                    if kind == "m" and spec.full[k] and k not in need:
                        need.add(k)
                        todo.append(k)
            members = sorted(need)
            inputs = {k for j in members for kind, k in spec.members[j][4] if kind == "i" and spec.input_full(k)}
            inputs |= {spec.red_operand(j)[1] for j in reds if spec.red_operand(j)[0] == "i"}
        else:  # registers hold what earlier phases computed
            members = computed
            first = self._first_phase()
            # Every input of the row is loaded in the first phase, where its latency overlaps the
            # other loads and the first reduction rather than following the last one (a layer norm
            # with its weights loaded so: 0.8-1.4% faster on H100s), but those of ``late`` (the
            # vectors the same for every row: see plan). (Split rows stream: loop mode.)
            inputs = {k for k, ph in first.items() if (ph if k in c.late else 0) == p}
        for j in reds:
            m = spec.members[j]
            acc = acc_dtype(m[1], m[2])
            self.emit(f"  {acc.c_compute} a{j} = {c_identity(m[1], acc)};")
        if c.loop:
            self.emit("  for (u32 base = j0; base < j1; base += T * (E / VEC)) {")
            self._arrays(members, inputs, "    ")
        else:
            self.emit("  {")
            self.emit("    const u32 base = j0;")
        vectors = [k for k in sorted(inputs) if c.prefetch and V == 4 and spec.inputs[k][1] == "v"
                   and k not in c.late]
        if vectors:
            for k in vectors:
                self.emit(f"    rt_vec4<{spec.inputs[k][0].c_storage}> w{k}[E / VEC];")
            self.emit("    #pragma unroll")
            self.emit("    for (u32 q = 0; q < E / VEC; ++q) {")
            self.emit("      const u32 jv = base + q * T + t;")
            self.emit("      if (row_ok && jv < j1) {")
            for k in vectors:
                T_ = spec.inputs[k][0].c_storage
                self.emit(f"        w{k}[q] = reinterpret_cast<const rt_vec4<{T_}>*>(in{k} + rb{k})[jv];")
            self.emit("      }")
            self.emit("    }")
        self.emit("    #pragma unroll")
        self.emit("    for (u32 q = 0; q < E / VEC; ++q) {")
        self.emit("      const u32 jv = base + q * T + t;")
        self.emit("      if (row_ok && jv < j1) {")
        outs = [j for j in computed if j in spec.outputs]
        for k in sorted(inputs):
            d, kind = spec.inputs[k]
            if kind == "v" and V == 4 and k not in vectors:
                self.emit(f"        const rt_vec4<{d.c_storage}> w{k} = "
                          f"reinterpret_cast<const rt_vec4<{d.c_storage}>*>(in{k} + rb{k})[jv];")
        if V == 4:
            for j in outs:
                self.emit(f"        rt_vec4<{spec.members[j][3].c_storage}> ov{j};")
        self.emit("        #pragma unroll")
        self.emit("        for (u32 e = 0; e < VEC; ++e) {")
        self.emit("          const u32 s = q * VEC + e, jj = jv * VEC + e;")
        for k in sorted(inputs):
            d, kind = spec.inputs[k]
            if kind == "v":
                ref = (f"w{k}[q].v[e]" if k in vectors else f"w{k}.v[e]") if V == 4 else f"in{k}[rb{k} + jj]"
            else:
                ref = f"in{k}[rb{k} + (i64)(int)sn{k} * (i64)jj]"
            self.emit(f"          x{k}[s] = {load_expr(d, ref)};")
        for j in members:
            self.emit("          " + self.ew_value(j, "s"))
        paired = self.paired(reds)
        for j in reds:
            m = spec.members[j]
            acc = acc_dtype(m[1], m[2])
            if j not in spec.online and j not in paired:  # (online sums and their maxima: online_batch)
                self.emit(f"          a{j} = rt_comb{j}(a{j}, ({acc.c_compute})({self.operand(m[4][0], 's')}));")
        for j in outs:
            st = store_expr(spec.members[j][3], f"v{j}[s]")
            if V == 4:
                self.emit(f"          ov{j}.v[e] = {st};")
            else:
                self.emit(f"          out{j}[(u64)o * N + jj] = {st};")
        self.emit("        }")
        for j in outs:
            if V == 4:
                T_ = spec.members[j][3].c_storage
                self.emit(f"        reinterpret_cast<rt_vec4<{T_}>*>(out{j} + (u64)o * N)[jv] = ov{j};")
        self.emit("      }")
        self.emit("    }")
        for j in reds:
            if j in spec.online:
                self.lines += ["  " + line for line in self.online_batch(j)]
        self.emit("  }")
        return reds

    def _first_phase(self) -> dict:
        """Register mode: per full input, the phase that first reads it (where it is loaded)."""
        spec = self.spec
        first: dict = {}
        for j, m in enumerate(spec.members):
            if not spec.live[j] or (not spec.full[j] and m[0] != "red"):
                continue
            ph = spec.stage[j] if spec.full[j] else spec.stage[j] - 1
            for kind, k in (spec.red_operand(j),) if m[0] == "red" else m[4]:
                if kind == "i" and spec.input_full(k):
                    first[k] = min(first.get(k, ph), ph)
        return first

    def _arrays(self, members, inputs, indent: str) -> None:
        spec = self.spec
        for k in sorted(inputs):
            self.emit(f"{indent}{spec.inputs[k][0].c_compute} x{k}[E];")
        for j in members:
            self.emit(f"{indent}{spec.members[j][3].c_compute} v{j}[E];")

    def combiners(self) -> list:
        out = []
        for j, m in enumerate(self.spec.members):
            if m[0] == "red":
                acc = acc_dtype(m[1], m[2])
                A = acc.c_compute
                out.append(f"RT_DEV {A} rt_comb{j}({A} x, {A} y) {{ return {c_combine(m[1], acc)}; }}")
            if j in self.spec.online:  # (maximum m, sum s scaled to it) combined with another such pair
                mx = self.spec.online[j][0]
                out.append(f"RT_DEV void rt_pair{j}(float& m, float& s, float om, float os) {{ "
                           f"const float M = rt_comb{mx}(m, om); s = (m == {_NEG_INF} ? 0.0f : s * expf(m - M)) + "
                           f"(om == {_NEG_INF} ? 0.0f : os * expf(om - M)); m = M; }}")
        return out

    def main(self, name: str, part: int = 0) -> str:
        """The whole program (kind "main"), or phase `part` of a split program over one chunk of a row
        (kind "part"): the row values of the phases before from every chunk's partials, this phase's
        full outputs over the chunk and its partials of the reductions it accumulates."""
        spec, c = self.spec, self.c
        self.emit(self.signature(name) + " {")
        self.prologue(c.T, c.RPB)
        self.emit(f"  constexpr u32 E = {c.E}, VEC = {c.VEC};")
        if self.kind == "main":  # the row's vectors [j0, j1) this workgroup covers
            self.emit("  const u32 j0 = 0, j1 = N / VEC;")
        else:
            self.emit("  const u32 j0 = blockIdx.y * (chunk / VEC), j1e = j0 + chunk / VEC, jn = N / VEC;")
            self.emit("  const u32 j1 = j1e < jn ? j1e : jn;")
        if not c.loop:
            inputs = {k for k in range(len(spec.inputs)) if spec.input_full(k)}
            self._arrays([j for j in range(len(spec.members)) if spec.full[j] and spec.live[j]], inputs, "  ")
        self.finish_row_members(0)
        if self.kind == "part":
            for p in range(part):
                self.combine_partials(p)
            reds = self.phase(part)
            if reds:
                self.reduce_step(reds)
            for j in reds:
                self.emit(f"  if (row_ok && t == 0) pv{j}[(u64)o * C + blockIdx.y] = a{j};")
        else:
            for p in range(spec.phases):
                reds = self.phase(p)
                if reds:
                    self.reduce_step(reds)
                self.finish_row_members(p + 1)
        self.emit("}")
        return "\n".join(self.lines)

    def combine_partials(self, p: int) -> None:
        """The reductions phase p accumulates, finished from every chunk's partials (every thread gets
        the totals; each workgroup of a row adds them in the same order, so all get the same values),
        and the row members that follow."""
        spec = self.spec
        reds = self.reductions(p + 1)
        for j in reds:
            m = spec.members[j]
            acc = acc_dtype(m[1], m[2])
            self.emit(f"  {acc.c_compute} a{j} = {c_identity(m[1], acc)};")
        paired = self.paired(reds)
        for j in reds:
            if j in spec.online:  # each chunk's (maximum, sum scaled to it) as a pair
                mx = spec.online[j][0]
                self.emit(f"  for (u32 k = t; row_ok && k < C; k += T) rt_pair{j}(a{mx}, a{j}, "
                          f"pv{mx}[(u64)o * C + k], pv{j}[(u64)o * C + k]);")
            elif j not in paired:
                self.emit(f"  for (u32 k = t; row_ok && k < C; k += T) a{j} = rt_comb{j}(a{j}, pv{j}[(u64)o * C + k]);")
        if reds:
            self.reduce_step(reds)
        self.finish_row_members(p + 1)

    def combine(self, name: str) -> str:
        """Split rows: one workgroup a row finishes the reductions from the chunk partials, phase by
        phase, and writes the row values."""
        self.emit(self.signature(name) + " {")
        self.prologue(COMBINE_THREADS, 1)
        self.finish_row_members(0)
        for p in range(self.spec.phases):
            self.combine_partials(p)
        self.emit("}")
        return "\n".join(self.lines)


def _cuda(spec: RowSpec, config: Config, name: str) -> str:
    parts = _Gen(spec, config, "main").combiners()
    if config.C == 1:
        parts.append(_Gen(spec, config, "main").main(name))
    else:
        for p in range(spec.phases):
            parts.append(_Gen(spec, config, "part").main(part_name(name, p), p))
        if any(not spec.full[m] for m in spec.outputs):
            parts.append(_Gen(spec, config, "comb").combine(name + "_c"))
    return "\n".join(parts) + "\n"


# ---- numpy ------------------------------------------------------------------------------------

def _ew_numpy(op, in_dts, out, cdt, args: list, n: int) -> np.ndarray:
    """Elementwise member values through the op's own numpy kernel (contiguous operands of n elements)."""
    fn = ew_source(op, in_dts, out, cdt).numpy_code()[export_name(op, in_dts, out, "c" * len(in_dts))]
    result = np.empty(n, out.storage)
    fn(None, [memoryview(result).cast("B")] + [memoryview(np.ascontiguousarray(a)).cast("B") for a in args],
       [n] + [0] * len(args))
    return result


def _numpy(spec: RowSpec, config: Config, name: str) -> dict:
    """The program member by member with the ops' own numpy kernels (the same values, unfused)."""
    nin = len(spec.inputs)

    def evaluate(bindings_in: list, c: list) -> list:
        O, N = c[0], c[1]  # noqa: E741
        values = []  # storage-typed arrays of shape (O, N) (full) or (O,) (row)
        for k, (d, kind) in enumerate(spec.inputs):
            off, so, sn = c[2 + 3 * k], signed(c[3 + 3 * k]), signed(c[4 + 3 * k])
            if kind in "ve":
                values.append(strided_view(bindings_in[k], d, (O, N), (so, sn), off))
            else:
                values.append(strided_view(bindings_in[k], d, (O,), (so,), off))
        members: list = []
        for j, m in enumerate(spec.members):
            shape = (O, N) if spec.full[j] or m[0] == "red" else (O,)
            args = [values[k] if kind == "i" else members[k] for kind, k in m[4]]
            args = [np.broadcast_to(a if a.ndim == len(shape) else a.reshape(O, 1), shape) for a in args]
            if m[0] == "ew":
                _, op, cdt, out, _ = m
                in_dts = tuple(spec.operand_dtype(ref) for ref in m[4])
                n = O * N if spec.full[j] else O
                members.append(_ew_numpy(op, in_dts, out, cdt, args, n).reshape(shape))
            else:
                _, op, in_dt, out, _ = m
                x = to_compute(np.asarray(args[0]), in_dt)
                if in_dt is _dt.float16 and op in ("sum", "mean"):
                    x = x.astype(np.float32)
                with np.errstate(**ERRSTATE):
                    res = np_reduce(op, x, in_dt, out)
                r = np.empty(O, out.storage)
                store(r, res, out)
                members.append(r)
        return members

    def main(workgroups, bindings, c):
        nout = len(spec.outputs)
        members = evaluate(bindings[nout:nout + nin], c)
        for b, m in zip(bindings[:nout], spec.outputs):
            out = spec.members[m][3]
            np.frombuffer(b, out.storage, members[m].size)[...] = members[m].reshape(-1)

    if config.C == 1:
        return {name: main}
    full_outs = [m for m in spec.outputs if spec.full[m]]
    row_outs = [m for m in spec.outputs if not spec.full[m]]
    nred = sum(1 for m in spec.members if m[0] == "red")

    def split(outs):
        # A split program's first phase evaluates the whole group here and writes the full outputs,
        # its combine the row outputs; the later phases have nothing left to do (the partials are
        # the GPU's business only).
        def run(workgroups, bindings, c):
            first = len(outs) + nred
            members = evaluate(bindings[first:first + nin], c)
            for b, m in zip(bindings[:len(outs)], outs):
                out = spec.members[m][3]
                np.frombuffer(b, out.storage, members[m].size)[...] = members[m].reshape(-1)
        return run

    def nothing(workgroups, bindings, c):
        pass

    programs = {part_name(name, p): split(full_outs) if p == 0 else nothing for p in range(spec.phases)}
    if row_outs:
        programs[name + "_c"] = split(row_outs)
    return programs


# ---- examples (what the compile tests build) ----------------------------------------------------

def examples() -> list:
    """Sources of the programs the usual compositions make (softmax, layer norm, a mean-squared error)
    in every float type and every mapping: register mode (long rows too), loop mode, vector and scalar
    loads, split."""
    out = []
    for d in _dt.FLOATS:
        A = _dt.float32 if d is not _dt.float64 else d  # where a row value is computed in (the mean's type)
        softmax = RowSpec(((d, "v"),), (
            ("red", "max", d, d, (("i", 0),)),
            ("ew", "sub", A, d, (("i", 0), ("m", 0))),
            ("ew", "exp", A, d, (("m", 1),)),
            ("red", "sum", d, d, (("m", 2),)),
            ("ew", "div", A, d, (("m", 2), ("m", 3)))), (False, True, True, False, True), (4,))
        norm = RowSpec(((d, "e"), (d, "s"), (d, "v"), (d, "r")), (
            ("red", "mean", d, d, (("i", 0),)),
            ("ew", "sub", A, d, (("i", 0), ("m", 0))),
            ("ew", "square", A, d, (("m", 1),)),
            ("red", "mean", d, d, (("m", 2),)),
            ("ew", "add", A, d, (("m", 3), ("i", 1))),
            ("ew", "sqrt", A, d, (("m", 4),)),
            ("ew", "div", A, d, (("m", 1), ("m", 5))),
            ("ew", "mul", A, d, (("m", 6), ("i", 2))),
            ("ew", "add", A, d, (("m", 7), ("i", 3)))),
            (False, True, True, False, False, False, True, True, True), (0, 8))
        mse = RowSpec(((d, "v"), (d, "v")), (
            ("ew", "sub", A, d, (("i", 0), ("i", 1))),
            ("ew", "mul", A, d, (("m", 0), ("m", 0))),
            ("red", "mean", d, d, (("m", 1),))), (True, True, False), (0, 2))
        for spec in (softmax, norm, mse):
            for vec in (4, 1):
                out.append(rows_source(spec, Config(256, 1, 16, vec, False)))
                if spec is norm:  # its weight loaded where it is used
                    out.append(rows_source(spec, Config(256, 1, 16, vec, False, late=(2,))))
                out.append(rows_source(spec, Config(8, 32, 4, vec, False)))
                # a pass's vectors loaded first (16-bit rows, long rows)
                out.append(rows_source(spec, Config(128, 1, NARROW_PER_THREAD, vec, False, prefetch=True)))
                out.append(rows_source(spec, Config(1024, 1, 8 if vec == 4 else 4, vec, True)))
                if spec is not mse and d is not _dt.float64:  # long rows in registers
                    out.append(rows_source(spec, Config(1024, 1, LONG_PER_THREAD, vec, False,
                                                        late=(2,) if spec is norm else ())))
        for spec in (mse, softmax, norm):  # split: one phase, several
            out.append(rows_source(spec, Config(256, 1, 8, 4, True, 4, 8192)))
            out.append(rows_source(spec, Config(256, 1, 4, 1, True, 4, 8192)))
    return out
