"""Scheduling an op graph into kernels: levels, and on GPUs fused elementwise groups.

Every node becomes a unit at a level one more than the deepest unit it reads
from. On GPUs an elementwise node joins the fused group of a node it reads
element for element (same size, contiguous, no offset) when everything else it
reads is ready before that group runs; the group is then one kernel
(`kernels/fused.py`) at the group's level. A member gets a buffer only when
something outside the group reads it or it must survive the eval (`keep`).
Fewer kernels mean fewer levels to launch and wait for, fewer buffers to bind
and fewer nodes to submit.

A fused kernel not yet loaded on the device costs a compile (NVRTC: about
100 ms), more than a novel graph gains from it. So fusion pays only for what
repeats: a recording fuses a group whose kernel is loaded already, or one
wanted by RUNTIME_FUSE_AFTER (2) recordings or evaluations (`want`); until then the graph
runs on the library kernels, compiled once per op and dtypes, and the
recording lists the fused kernels it deferred (the lowering counts the
graph's later evaluations towards them and records it again, fused, once they
are due). rt.compile's traces fuse at once: they are recorded to repeat.

Reductions over the last axes take the elementwise nodes around them into row
groups first (`row_groups.py`): each group is one row program
(`kernels/rows.py`), a fused kernel like the others for this policy.

An add of a ``take_add`` (a scatter into zeros) is the scatter into the sum's
buffer, which first holds the other operand: written there by that operand's
own kernel where nothing else reads it, else copied (`_accumulations`).
"""

from __future__ import annotations

import hal
from hal import env

from .. import distributed
from ..kernels import (
    compact,
    concat,
    elementwise,
    fft,
    gather,
    linalg,
    matmul,
    pad,
    random,
    reduce,
    scan,
    scatter,
    sort,
    take,
    tri,
)
from ..kernels import fused as fused_kernels
from ..kernels import rows as row_kernels
from ..kernels.fused import FUSABLE_DTYPES, FusedSpec
from ..kernels.fused import plan as plan_fused
from ..ops import ELEMENTWISE, REDUCTIONS
from . import epilogues, gathers, row_groups
from .layouts import input_layouts

#: RUNTIME_FUSION=0: every elementwise node its own kernel on GPUs. Read once, at import: every eval
#: asks (an environment look-up was a twentieth of a one-op eval's bytecodes).
ENABLED = env.switch("RUNTIME_FUSION", True)


def enabled(ctx) -> bool:
    """Whether a recording on `ctx` fuses elementwise nodes (GPUs, unless RUNTIME_FUSION=0)."""
    return ENABLED and ctx.is_gpu


def _plan_full(node, layouts, ctx) -> list:
    if node.size == 0:
        return []
    bits, length = node.params  # the element's bit pattern (ops.full)
    return [("fill", ("out",), bits, length)]


PLANNERS = {"matmul": matmul.plan, "random": random.plan, "pad": pad.plan, "full": _plan_full,
            "gather": gather.plan, "scatter_add": scatter.plan, "cumsum": scan.plan, "cumprod": scan.plan,
            "fft": fft.plan,
            "scatter_last": scatter.plan_last, "tri": tri.plan, "take": take.plan,
            "take_add": take.plan_add, "take_set": take.plan_set,
            "concat": concat.plan, "sort": sort.plan, "argsort": sort.plan, "searchsorted": sort.plan_searchsorted,
            "mask_count": compact.plan_count, "compact": compact.plan_compact}
PLANNERS.update({op: elementwise.plan for op in ELEMENTWISE})
PLANNERS.update({op: reduce.plan for op in REDUCTIONS})
PLANNERS.update(linalg.PLANNERS)


def _plan_collective(node, layouts, ctx) -> list:
    """A collective of runtime/distributed.py: its group, the HAL's count and arguments."""
    what, reduction, group_id, root = node.params
    group = distributed.group_of(group_id)
    source = node.inputs[0]
    count = node.size if what in ("all_reduce", "broadcast", "reduce_scatter") else source.size
    return [("collective", what, group, count, node.dtype.name, reduction, root if what == "broadcast" else None)]


PLANNERS["collective"] = _plan_collective


def _plan_alias(node, layouts, ctx) -> list:
    """A gradient that rt.compile's trace turned into a view of its backward graph
    (``autodiff.materialize``) after a view of it was made (``grad.reshape(-1)``): that view reads
    it as a whole array of its own, so it is computed into one (a copy of its values)."""
    return elementwise.plan_copy(node, layouts[0], ctx)


PLANNERS["alias"] = _plan_alias


class Unit:
    """One scheduled piece of work: a node's commands, or a fused group's single dispatch."""

    __slots__ = ("level", "first", "node", "cmds", "temps", "members", "size", "rows", "inplace")

    def __init__(self, level: int, first: int, node, cmds: list, temps: list) -> None:
        self.level = level
        self.first = first  # index of its first node (orders units of one level)
        self.node = node
        self.cmds = cmds
        self.temps = temps  # scratch bytes its commands use (roles ("tmp", t))
        self.members: list | None = None  # fused groups: node indices in evaluation order
        self.size = 0
        self.rows = None  # a row group's RowGroup (row_groups.py)
        self.inplace: int | None = None  # the node whose buffer its output takes over (_accumulations)


def _plan(node, layouts, ctx) -> tuple[list, list]:
    planner = PLANNERS.get(node.op)
    if planner is None:
        raise hal.UnimplementedError(f"no kernel for op {node.op!r}")
    cmds = planner(node, layouts, ctx)
    if cmds and cmds[0][0] == "temps":
        return cmds[1:], list(cmds[0][1])
    return cmds, []


def _fusable(node) -> bool:
    if node.op not in ELEMENTWISE or node.size == 0:
        return False
    if node.dtype not in FUSABLE_DTYPES or node.params not in FUSABLE_DTYPES:
        return False
    return all(inp.dtype in FUSABLE_DTYPES for inp in node.inputs)


def fuse_after() -> int:
    """Recordings or evaluations that must want a fused kernel before it is compiled (RUNTIME_FUSE_AFTER)."""
    return env.integer("RUNTIME_FUSE_AFTER", 2)


#: Fused kernels whose wants a context counts at most (the oldest counted first forgotten).
WANTS_KEPT = 4096


def want(ctx, keys) -> bool:
    """Count one more want of each fused kernel; whether all of them are now due for a compile."""
    wanted = ctx.fusion_wanted
    threshold = fuse_after()
    due = True
    for key in keys:
        n = wanted.get(key, 0) + 1
        while n == 1 and len(wanted) >= WANTS_KEPT:  # the oldest counts go (bounded for any number of graphs)
            del wanted[next(iter(wanted))]
        wanted[key] = n
        if n < threshold:
            due = False
    return due


def schedule(ctx, order: list, keep: int | None, fuse: bool, alias: dict | None = None,
             fuse_now: bool = False) -> tuple[list, list, list, list]:
    """(units, buffered, deferred, noted): the units in node order, per node whether it gets a
    buffer, the keys of the fused kernels this schedule would need but runs without (see the module
    doc), and the constants whose values its GEMM epilogues rely on (``epilogues.py``).

    alias: id(array) -> the node of `order` holding its value (expanded grad nodes).
    fuse_now: compile whatever fused kernels it needs (rt.compile).
    """
    units, buffered, noted = _schedule(ctx, order, keep, fuse, alias)
    if not fuse or fuse_now:
        return units, buffered, [], noted
    loaded = ctx.executables
    new = [u.cmds[0][1].key for u in units if u.members is not None and u.cmds[0][1].key not in loaded]
    if not new or want(ctx, new):
        return units, buffered, [], noted
    units, buffered, noted = _schedule(ctx, order, keep, False, alias)
    return units, buffered, new, noted


def _accumulations(order: list, index: dict, keep: int) -> dict:
    """i -> (k, t, a) for each node i = x + t where t is a ``take_add`` (a scatter of values into zeros:
    a take's transpose, ``x.at[idx].add(v)``'s second term, a gradient's contribution through a take)
    read by i alone and not kept, and x (i's input k) an array of i's shape and type: i is then the
    scatter of t's values into i's buffer, which first holds x. Where x is a node computed in this
    evaluation (index a), read by i alone and not kept, x's kernel writes i's buffer itself (a = None
    otherwise: a copy of x). No zeros are written, and no pass reads them and x back: cross
    entropy's gradient over rows of 32000 wrote and read 524 MB twice more so."""
    readers = [0] * len(order)
    for node in order:
        for inp in node.inputs:
            j = index.get(id(inp.root))
            if j is not None:
                readers[j] += 1
    found = {}
    for i, node in enumerate(order):
        if node.op != "add" or len(node.inputs) != 2:
            continue
        for k in (0, 1):
            x, taken = node.inputs[k], node.inputs[1 - k]
            t = index.get(id(taken.root)) if taken.base is None else None
            if t is None or order[t].op != "take_add" or taken.dtype != node.dtype or taken.shape != node.shape \
                    or readers[t] != 1 or keep >> t & 1 or x.dtype != node.dtype or x.shape != node.shape:
                continue
            a = index.get(id(x.root)) if x.base is None else None
            found[i] = (k, t, a if a is not None and readers[a] == 1 and not keep >> a & 1 else None)
            break
    return found


def _schedule(ctx, order: list, keep: int | None, fuse: bool, alias: dict | None) -> tuple[list, list, list]:
    N = len(order)
    index = {id(n): i for i, n in enumerate(order)}
    if alias:
        for aid, root in alias.items():
            index[aid] = index[id(root)]
    ready = [0] * N  # level of the unit computing node i
    unit_of: list = [None] * N
    units: list = []
    groups: dict = {}  # element count -> fused groups of that size
    folds = epilogues.find(ctx, order, index, keep) if fuse else {}
    folded = {i for fold in folds.values() for i in (fold.product, *fold.computed)}
    if fuse:  # (a take read by one elementwise op: the op in the take's kernel; adds to folded)
        folds.update(gathers.find(ctx, order, index, keep, folded))
    folded_into: dict = {}  # node index -> the unit of the product whose GEMM computes its value
    unwritten = {i for fold in folds.values() for i in fold.unwritten}
    accumulations = {i: at for i, at in _accumulations(order, index, keep).items()
                     if i not in folded and at[2] not in folded
                     and index.get(id(order[i].inputs[at[0]].root)) not in unwritten} \
        if fuse and keep is not None else {}
    scattered = {t: i for i, (_, t, _) in accumulations.items()}  # take_add -> the add that scatters it
    # Row groups first: the nodes a GEMM's epilogue computes stay with the GEMM library.
    rows = row_groups.find(order, index, {*folded, *accumulations, *scattered}) if fuse else {}
    # Nodes a GEMM computes that come before its product in the order (a bias gradient beside its
    # weight gradient): placed with the product (nothing reads them before it, epilogues.py).
    early = {i for fold in folds.values() for i in fold.computed if i < fold.product}

    def _place(i: int) -> None:
        node = order[i]
        if i in early:
            return
        group = rows.get(i)
        if group is not None:  # a row program's member (its whole group is one unit)
            if group.unit is None:
                lv = max((ready[j] + 1 for j in group.ext), default=0)  # externals are placed before it
                group.unit = Unit(lv, i, None, [], [])
                group.unit.members = group.members
                group.unit.rows = group
                units.append(group.unit)
            unit_of[i] = group.unit
            ready[i] = group.unit.level + (1 if row_kernels.may_split(group.O, group.N) else 0)
            return
        layouts = input_layouts(node)
        srcs = [index.get(id(inp.root)) for inp in node.inputs]
        lv = 0
        for j in srcs:
            if j is not None and ready[j] + 1 > lv and j not in early:  # (an early node: placed with i)
                lv = ready[j] + 1
        if i in scattered:  # (its add scatters its values: ready when they are)
            ready[i] = lv - 1
            return
        if i in accumulations:
            k, t, a = accumulations[i]
            taken = order[t]
            roots = [inp.root for inp in taken.inputs]
            cmds = [_rooted(cmd, roots) for cmd in PLANNERS["take_add"](taken, input_layouts(taken), ctx)
                    if cmd[0] == "dispatch"]
            if a is None:  # the buffer holds a copy of x first
                copy = elementwise.plan_copy(node, layouts[k], ctx)
                cmds = [_rooted(cmd, [node.inputs[k].root]) if cmd[0] == "dispatch" else cmd
                        for cmd in copy] + [("barrier",)] + cmds
            unit = Unit(lv, i, node, cmds, [])
            unit.inplace = a
            units.append(unit)
            unit_of[i] = unit_of[t] = unit
            ready[i] = lv if a is not None else lv + 1
            return
        fold = folds.get(i)
        if fold is not None:  # a product with the nodes its GEMM's epilogue computes (epilogues.py)
            for j in fold.reads:  # a bias computed earlier, a mask written by another GEMM
                producer = folded_into.get(j)
                level = producer.level if producer is not None else ready[j]
                if level + 1 > lv:
                    lv = level + 1
            unit = Unit(lv, i, node, fold.cmds, [])
            units.append(unit)
            unit_of[i] = unit
            ready[i] = lv
            for j in fold.computed:
                folded_into[j] = unit
                if j in early:
                    unit_of[j], ready[j] = unit, lv
            return
        unit = folded_into.get(i)
        if unit is not None:  # a node a GEMM's epilogue computes
            unit_of[i] = unit
            ready[i] = unit.level
            return
        if fuse and _fusable(node):
            variants = elementwise.input_variants(node.shape, layouts)[0]
            if "g" not in variants:
                n = node.size
                joined = _pick_group(groups.get(n, ()), node, srcs, variants, order, unit_of, ready, n)
                if joined is None:
                    joined = Unit(lv, i, None, [], [])
                    joined.members = []
                    joined.size = n
                    units.append(joined)
                    groups.setdefault(n, []).append(joined)
                joined.members.append(i)
                unit_of[i] = joined
                ready[i] = joined.level
                return
        cmds, temps = _plan(node, layouts, ctx)
        unit = Unit(lv, i, node, cmds, temps)
        units.append(unit)
        unit_of[i] = unit
        ready[i] = lv + 1 if any(c[0] == "barrier" for c in cmds) else lv

    placed = [False] * N
    for first in range(N):
        if placed[first]:
            continue
        group = rows.get(first)
        # A row group waits for its externals: those after its first member are placed first.
        todo = [*(j for j in group.late if not placed[j]), first] if group is not None and group.unit is None \
            else (first,)
        for i in todo:
            placed[i] = True
            _place(i)
    # Which members leave their group: read by another unit, or kept.
    leaves = [keep is None or bool(keep >> i & 1) for i in range(N)]
    for i, node in enumerate(order):
        for inp in node.inputs:
            j = index.get(id(inp.root))
            if j is not None and unit_of[j] is not unit_of[i]:
                leaves[j] = True
    buffered = [True] * N
    for fold in folds.values():  # the product, the pre-activation: never written
        for i in fold.unwritten:
            buffered[i] = False
    for t in scattered:
        buffered[t] = False
    for k, unit in enumerate(units):
        if unit.members is None:
            continue
        if unit.rows is not None:
            for i in unit.members:
                buffered[i] = leaves[i]
            unit.cmds, unit.temps = row_groups.dispatch(order, index, unit.rows, leaves)
            continue
        if len(unit.members) == 1:  # nothing to fuse: the op's own kernel
            i = unit.members[0]
            node = order[i]
            cmds, temps = _plan(node, input_layouts(node), ctx)
            single = Unit(unit.level, i, node, cmds, temps)
            units[k] = single
            unit_of[i] = single
            continue
        for i in unit.members:
            buffered[i] = leaves[i]
        unit.cmds = [_fused_dispatch(order, index, unit, leaves)]
    return units, buffered, [c for fold in folds.values() for c in fold.noted]


def _rooted(cmd: tuple, roots: list) -> tuple:
    """A dispatch planned for another node, its ("in", k) bindings bound to ``roots[k]`` instead."""
    return cmd[:5] + ([role if role[0] != "in" else ("root", roots[role[1]]) for role in cmd[5]],)


def _pick_group(candidates, node, srcs: list, variants: list, order: list, unit_of: list, ready: list,
                n: int) -> Unit | None:
    """A fused group of n elements `node` can join without running later than the group does (and
    with room: ``kernels.fused.MAX_OPS``).

    Every input that is not a member read element for element must be ready before the
    group's level. Groups `node` reads element for element come first (their values stay
    in registers); otherwise the node joins a group it is independent of (one launch less).
    """
    best = None
    for group in candidates:
        if len(group.members) >= fused_kernels.MAX_OPS:
            continue
        ext = 0
        connected = False
        for inp, j, v in zip(node.inputs, srcs, variants):
            if j is None:
                continue
            if unit_of[j] is group and _identity(inp, order[j], v, n):
                connected = True
                continue
            if ready[j] + 1 > ext:
                ext = ready[j] + 1
        if ext > group.level:
            continue
        if connected:
            return group
        if best is None:
            best = group
    return best


def _identity(inp, producer, variant: str, n: int) -> bool:
    """Whether `inp` reads `producer`'s element i at element i of an n-element consumer."""
    if inp.offset != 0 or producer.size != n:
        return False
    return variant == "c" or n == 1


def _fused_dispatch(order: list, index: dict, unit: Unit, leaves: list) -> tuple:
    members = unit.members
    n = unit.size
    position = {i: m for m, i in enumerate(members)}
    inputs: list = []  # (dtype, variant)
    offsets: list = []
    roots: list = []
    input_of: dict = {}
    spec_members = []
    for i in members:
        node = order[i]
        variants = elementwise.input_variants(node.shape, input_layouts(node))[0]
        operands = []
        for inp, v in zip(node.inputs, variants):
            root = inp.root
            j = index.get(id(root))
            if j is not None and j in position and _identity(inp, order[j], v, n):
                operands.append(("m", position[j]))
                continue
            if n == 1:
                v = "s"
            key = (id(root), v, inp.offset)
            k = input_of.get(key)
            if k is None:
                k = input_of[key] = len(inputs)
                inputs.append((inp.dtype, v))
                offsets.append(inp.offset)
                roots.append(root)
            operands.append(("i", k))
        spec_members.append((node.op, node.params, node.dtype, tuple(operands)))
    outs = [m for m, i in enumerate(members) if leaves[i]]
    spec = FusedSpec(tuple(inputs), tuple(spec_members), tuple(outs))
    src, name, wg, consts = plan_fused(spec, n, offsets)
    roles = [("out", members[m]) for m in outs] + [("root", r) for r in roots]
    return ("dispatch", src, name, wg, consts, roles)
