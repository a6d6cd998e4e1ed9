"""Lowering an op graph to one HAL command buffer per eval, through the graph cache.

Nodes are ordered topologically and scheduled in levels (a unit's level is one
more than the deepest unit it reads from), so a barrier separates levels only:
a kernel never reads what another kernel of its level writes. On GPUs, chains
of elementwise nodes of one size become one fused kernel (`fusion.py`); the
members nothing else reads stay in registers and get no buffer.

Every buffer is bound through a `hal.Slot` of a reusable command buffer, so
the recording replays with any buffers. The binding table holds the graph's
external inputs, then the buffers of the nodes the submission materializes,
then kernel scratch; rt.compile's recordings own their internal buffers and
scratch instead, so their tables hold inputs and outputs only.
"""

from __future__ import annotations

from itertools import compress
from itertools import count as counter
from operator import attrgetter, sub
from sys import getrefcount
from weakref import getweakrefcount

import hal
from hal import env, tracing

from . import cpu_program, graph_cache
from .array import PLACEHOLDER, Array, new_node
from .autodiff import GRAD, expand_noting, protect, resolved
from .buffer_cache import BufferCache, bucket_size
from .cpu_program import binding_bucket, program_executable
from .device import MAX_IN_FLIGHT, SUBMIT_BATCH, DeviceContext, Storage
from .fusion import PLANNERS, schedule, want  # noqa: F401 - PLANNERS: the op -> planner table
from .kernels.source import executable
from .shapes import contiguous_strides

_storage_buffer = attrgetter("storage.buffer")
#: Recordings kept per graph key on GPUs, each replaying its own binding table unchanged (a step that
#: alternates between two buffers, as `w = step(w)` does, then never patches a graph).
MAX_VARIANTS = env.integer("RUNTIME_GRAPH_VARIANTS", 2, minimum=1)
#: CPU drivers keep one more: there an unchanged table also spares re-making the byte views and re-binding
#: the CPU program's kernels, and an eager step rotates three buffers of one size (w, its successor and
#: the gradient), which two recordings keep missing.
CPU_VARIANTS = MAX_VARIANTS + 1
#: Scratch bytes up to which a recording on a CPU device owns its scratch buffers (held while it is
#: cached) rather than taking them from the buffer cache at each submission.
CPU_OWNED_SCRATCH = env.integer("RUNTIME_CPU_OWNED_SCRATCH", 1 << 20, minimum=0)


#: RUNTIME_FUSION=0: every elementwise node its own kernel on GPUs. Read once, at import: every eval
#: asks (an environment look-up was a twentieth of a one-op eval's bytecodes).
FUSION = env.switch("RUNTIME_FUSION", True)


def fusion_enabled(ctx: DeviceContext) -> bool:
    return FUSION and ctx.is_gpu


class Recording:
    """A recorded reusable command buffer and what its binding table holds.

    Table layout: externals [0, n_ext), then one buffer per `fresh` node (acquired per
    submission and attached to the node), then per-submission scratch (`temps`, buckets).
    """

    __slots__ = ("cb", "n_ext", "fresh", "temps", "table_size", "footprint", "scratch", "levels",
                 "dispatches", "fused", "program", "last_table", "last_ext", "captured", "buckets",
                 "fresh_buckets", "moved", "no_prefer", "deferred", "guards", "owner", "tail", "held", "held_outs",
                 "held_storages", "held_buffers", "held_refs", "__weakref__")

    def __init__(self, cb, n_ext: int, fresh: list, temps: list, levels: int, dispatches: int) -> None:
        self.cb = cb
        self.n_ext = n_ext
        self.fresh = fresh  # [(node index, bucket, nbytes)] in table order after the externals
        self.temps = temps  # [bucket] of per-submission scratch, after the fresh buffers
        self.table_size = n_ext + len(fresh) + len(temps)
        self.buckets = [bucket for _, bucket, _ in fresh] + temps  # of the table after the externals
        self.fresh_buckets = self.buckets[:len(fresh)]
        self.moved = False  # a submission found a buffer of its last one still in use (pick checks)
        self.no_prefer = [None] * len(self.buckets)
        self.levels = levels
        self.dispatches = dispatches
        self.fused = 0  # fused kernels among the dispatches
        self.deferred: list = []  # keys of the fused kernels it runs without until they are due (fusion.py)
        self.captured: list = []  # storages of constants bound directly (their fences follow the submissions)
        self.scratch = None  # unified index -> (buffer, bucket) the recording owns (rt.compile, small CPU scratch)
        self.owner = None  # the context its owned scratch goes back to when it is dropped
        self.tail: list = []  # owned scratch bound through the table, after the fresh buffers (CPU evals)
        self.program = None  # (context, id) of the CPU program this recording runs
        self.last_table = None  # the buffers of the latest submission, preferred for the next one
        self.last_ext = None  # its external buffers, to pick the recording whose table is unchanged
        self.footprint = 512 + 256 * dispatches
        # (external slot, buffer, its storage): the constants the recorded backward graphs were built
        # for (autodiff folds and compares their values). It replays only with these bound there; the
        # storage, held, keeps the buffer from serving another value.
        self.guards: list = []
        # rt.compile: the output arrays of the latest submission (`held_outs`) and their storages,
        # kept so that the next replay can hand the same arrays out again once nothing else holds
        # them (`held_free`); `held`: both lists in one, None: none kept. `held_refs`: their
        # reference counts then, summed.
        self.held: list | None = None
        self.held_outs: list | None = None
        self.held_storages: list | None = None
        self.held_buffers: list = []  # their buffers, in table order
        self.held_refs = 0

    def drop(self) -> None:
        self.cb = None
        self.held = self.held_outs = self.held_storages = None
        if self.owner is not None:
            self.release_scratch(self.owner)
            self.owner = None

    def release_scratch(self, ctx: DeviceContext) -> None:
        scratch, self.scratch = self.scratch, None
        for buf, bucket in (scratch or {}).values():
            ctx.buffers.release(buf, bucket, ctx.submitted)

    def __del__(self) -> None:
        if self.program is not None:
            ctx, pid = self.program
            try:
                ctx.retire_program(pid)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


class Variants:
    """The recordings of one graph key (GPU: up to MAX_VARIANTS, each with its own binding table)."""

    __slots__ = ("recs", "dropped", "by_ext")

    def __init__(self, rec: Recording) -> None:
        self.recs = [rec]
        self.dropped = 0  # footprint of recordings pick() let go, for the graph cache's count
        self.by_ext: dict = {}  # rt.compile: tuple of a recording's last external buffers -> it

    @property
    def footprint(self) -> int:
        return sum(r.footprint for r in self.recs)

    def pick(self, ext: list, limit: int, buffers: BufferCache) -> Recording | None:
        """The recording to run with these external buffers; None: record another.

        Preferred: one that last ran with the same externals and whose buffers for the nodes it
        materializes are all free again (scratch goes back at each submission), so its binding
        table is unchanged and the driver replays it without patching or uploading anything. A
        result kept alive across evaluations (``c = a + b`` while the previous ``c`` is still
        held) takes the other buffer each time: each of two recordings then sees its own again.
        Only a recording that once found its buffers busy (``moved``) is checked.
        """
        recs = self.recs
        same_inputs = None
        for rec in recs:
            last = rec.last_ext
            if last is None:
                if rec.guards and not _guards_hold(rec.guards, ext):
                    continue
                return rec
            if last == ext:  # (so are the guarded constants)
                if not rec.moved or (held_free(rec) if rec.held is not None else
                                     buffers.all_free(rec.last_table, rec.n_ext, rec.fresh_buckets)):
                    return rec
                if same_inputs is None:
                    same_inputs = rec
        if len(recs) < limit:
            return None
        if same_inputs is not None:
            return same_inputs
        for i, rec in enumerate(recs):  # the least recently rebound whose constants are these
            if not rec.guards or _guards_hold(rec.guards, ext):
                recs.append(recs.pop(i))
                return rec
        rec = recs.pop(0)  # none was recorded for these constants: make room
        rec.drop()
        self.dropped += rec.footprint
        return None

    def drop(self) -> None:
        for rec in self.recs:
            rec.drop()


# What sum(map(getrefcount, ...)) counts for an object held by nothing but the list it is in.
_HELD_REFS = sum(map(getrefcount, [object()]))


def hold(rec: Recording, outs: list, table: list) -> None:
    """Keep `outs`, the arrays a submission of `rec` with `table` made of its fresh buffers, for
    the next replay (see ``held_free``). Only for recordings that own their scratch (rt.compile's):
    the table holds the externals, then those buffers."""
    storages = [a.storage for a in outs]
    rec.held = outs + storages
    rec.held_outs = outs
    rec.held_storages = storages
    rec.held_buffers = table[rec.n_ext:]
    # Referenced by nothing but the recording: an array by `held` and `held_outs`, its storage by
    # `held`, `held_storages` and the array.
    rec.held_refs = len(outs) * (2 * _HELD_REFS + 3)


def held_free(rec: Recording) -> bool:
    """Whether nothing but `rec` references the arrays it holds (no array, view, host view,
    pending node or weak reference): they are unobservable, and the next replay may write their
    buffers and hand out the same arrays with the new values, taking and making nothing. The
    counting runs in C; each count is at least its share of `held_refs`, so the sum is exact."""
    held = rec.held
    return sum(map(getrefcount, held)) == rec.held_refs and not any(map(getweakrefcount, held))


def replay_held(ctx: DeviceContext, rec: Recording, ext: list) -> int:
    """``submit(ctx, rec, ext, queue=True)`` for a compiled replay whose outputs are the arrays it
    holds (``held_free``): their buffers are bound again, nothing is taken or given back. Returns
    the timeline value; the caller marks the held storages ready at it."""
    return _issue(ctx, rec, ext, ext + rec.held_buffers, True)


def _guards_hold(guards: list, ext: list) -> bool:
    for slot, buf, _ in guards:
        if ext[slot] is not buf:
            return False
    return True


def collect(targets: list) -> list:
    """Pending root nodes reachable from targets, in dependency order (iterative DFS)."""
    order = []
    done = set()
    add = done.add
    stack = [(t, False) for t in reversed(targets)]
    push, pop = stack.append, stack.pop
    while stack:
        node, expanded = pop()
        nid = id(node)
        if expanded:
            if nid not in done:
                add(nid)
                order.append(node)
            continue
        if nid in done:
            continue
        push((node, True))
        for inp in reversed(node.inputs):
            r = inp.base
            if r is None:
                r = inp
            if r.storage is None and r.op != PLACEHOLDER and id(r) not in done:
                push((r, False))
    return order


def graph_key(order: list, direct: list | None = None):
    """(key, externals): the topology key of `order` and the external roots in slot order.

    With `direct` (a list of zeros, one per node), counts the references each node's
    consumers hold to it directly and returns the set of nodes read through views.
    """
    ext_index: dict = {}
    node_index: dict = {}
    externals: list = []
    parts = []
    viewed = set()
    for i, node in enumerate(order):
        node_index[id(node)] = i
        ins = []
        for inp in node.inputs:
            r = inp.base
            if r is None:
                r = inp
            rid = id(r)
            j = node_index.get(rid)
            if j is None:
                j = ext_index.get(rid)
                if j is None:
                    j = len(externals)
                    ext_index[rid] = j
                    externals.append(r)
                ins.append((-1 - j, r.dtype, inp.shape, inp.strides, inp.offset))
            else:
                ins.append((j, inp.shape, inp.strides, inp.offset))
                if direct is not None:
                    if r is inp:
                        direct[j] += 1
                    else:
                        viewed.add(j)
        parts.append((node.op, node.params, node.shape, node.dtype, tuple(ins)))
    return tuple(parts), externals, viewed


def _view_referrer(node_index: dict, ext_index: dict, externals: list, viewed: set, views: list):
    """The key walks' reference to an input read through a view: the chain of views from its root
    (each numbered once, as the walk meets it) and the root, a node's index or an external's slot."""
    view_index: dict = {}

    def root_ref(r):
        j = node_index.get(r)
        if j is not None:
            viewed.add(j)
            return j
        j = ext_index.get(r)
        if j is None:
            j = ext_index[r] = len(externals)
            externals.append(r)
        return (-1 - j, r.dtype, r.shape)

    def view_ref(v):
        chain = []
        while v.base is not None and v not in view_index:
            chain.append(v)
            v = v.inputs[0] if v.inputs else v.base
        src = ("v", view_index[v]) if v.base is not None else root_ref(v)
        for w in reversed(chain):
            view_index[w] = len(views)
            views.append((w.op, w.params, w.shape, w.strides, w.offset, src))
            src = ("v", len(views) - 1)
        return src

    return view_ref


class _TooDeep(Exception):
    """A graph deeper than _MAX_KEY_DEPTH: collect_key walks it with an explicit stack instead."""


#: Nesting the recursive key walk allows before it starts over with the iterative one (far below
#: the interpreter's recursion limit, also when the caller is deep in recursion itself).
_MAX_KEY_DEPTH = 200


def collect_key(targets: list, direct: list | None = None):
    """collect() and the graph key in one pass: (order, key, externals, nodes read through views).

    The key describes every pending node (op, params, shape, dtype, inputs) and every view
    an input is read through, view by view (op, params, layout, source), so that it also
    determines the backward graph of any grad node (which reads of a differentiated input
    go through its alias is part of the structure). With `direct` (an empty list), it
    receives per node the number of its consumers' direct references to it (see live_mask).
    Arrays are the dicts' keys themselves: they hash by identity and a dict tests identity
    before equality, so no id() call is needed (elementwise __eq__ is never reached).

    A recursive walk visits each node once and each input once (the explicit stack of the
    iterative walk visits each node twice and each input twice: about twice the bytecodes). Both
    number nodes in the same depth-first post-order; views and externals are numbered as the walk
    meets them, so the two walks may number a graph's views differently, each always the same way
    for the same structure: a key describes its graph completely either way, so equal keys are
    equal graphs with their externals in the same slots.
    """
    try:
        return _collect_key_recursive(targets, direct)
    except _TooDeep:
        if direct is not None:
            direct.clear()
        return _collect_key_iterative(targets, direct)


def _collect_key_recursive(targets: list, direct: list | None):
    order: list = []
    parts: list = []
    views: list = []
    externals: list = []
    node_index: dict = {}
    ext_index: dict = {}
    viewed = set()
    append, add_part = order.append, parts.append
    count = direct is not None

    view_ref = _view_referrer(node_index, ext_index, externals, viewed, views)

    def visit(node, depth):
        """Number `node` after every pending node it reads from; its index."""
        if depth > _MAX_KEY_DEPTH:
            raise _TooDeep
        ins = []
        for inp in node.inputs:
            r = inp.base
            if r is not None:  # a view: its root first, if pending
                if r.storage is None and r.op != PLACEHOLDER and r not in node_index:
                    visit(r, depth + 1)
                ins.append(view_ref(inp))
                continue
            j = node_index.get(inp)
            if j is None:
                if inp.storage is None and inp.op != PLACEHOLDER:
                    j = visit(inp, depth + 1)
                else:
                    j = ext_index.get(inp)
                    if j is None:
                        j = ext_index[inp] = len(externals)
                        externals.append(inp)
                    ins.append((-1 - j, inp.dtype, inp.shape))
                    continue
            ins.append(j)
            if count:
                direct[j] += 1
        j = len(order)
        node_index[node] = j
        append(node)
        add_part((node.op, node.params, node.shape, node.dtype, tuple(ins)))
        if count:
            direct.append(0)
        return j

    try:
        for target in targets:
            if target not in node_index:
                visit(target, 0)
    finally:
        # visit refers to itself through its closure cell: the cycle would keep every node of the
        # walk referenced (node_index) until the garbage collector ran, and live_mask would read
        # those references as consumers holding them.
        visit = None  # noqa: F841
    return order, (tuple(parts), tuple(views)), externals, viewed


def _collect_key_iterative(targets: list, direct: list | None = None):
    """collect_key with an explicit stack, for graphs deeper than _MAX_KEY_DEPTH."""
    order: list = []
    parts: list = []
    views: list = []
    externals: list = []
    node_index: dict = {}
    ext_index: dict = {}
    viewed = set()
    stack = [(t, False) for t in reversed(targets)]
    push, pop, append = stack.append, stack.pop, order.append
    count = direct is not None

    view_ref = _view_referrer(node_index, ext_index, externals, viewed, views)

    while stack:
        node, expanded = pop()
        if node in node_index:
            continue
        if not expanded:
            push((node, True))
            for inp in reversed(node.inputs):
                r = inp.base
                if r is None:
                    r = inp
                if r.storage is None and r.op != PLACEHOLDER and r not in node_index:
                    push((r, False))
            continue
        ins = []
        for inp in node.inputs:
            if inp.base is not None:
                ins.append(view_ref(inp))
                continue
            j = node_index.get(inp)
            if j is None:
                j = ext_index.get(inp)
                if j is None:
                    j = ext_index[inp] = len(externals)
                    externals.append(inp)
                ins.append((-1 - j, inp.dtype, inp.shape))
            else:
                ins.append(j)
                if count:
                    direct[j] += 1
        node_index[node] = len(order)
        append(node)
        parts.append((node.op, node.params, node.shape, node.dtype, tuple(ins)))
        if count:
            direct.append(0)
    return order, (tuple(parts), tuple(views)), externals, viewed


def _excess_refs(nodes: list, direct: list):
    """Per node, its reference count less its consumers' direct references (C-level maps)."""
    return map(sub, map(getrefcount, nodes), direct)


# What _excess_refs gives for an object held by nothing but the list it is in.
_BASE_REFS = next(_excess_refs([object()], [0]))


def live_mask(order: list, direct: list, viewed: set) -> int:
    """Bit i set: node i may be read after this eval.

    A node referenced by more than `order` and its consumers' input tuples is held by
    the program, by the list of targets being evaluated, or by nodes outside this eval;
    one read through a view counts as held too. A node that is not live may stay in the
    registers of a fused kernel: it keeps its inputs, so were it ever evaluated after
    all, it would be computed again (a miscount costs time, never a wrong value).
    The counting runs in C; Python loops over the live nodes only.
    """
    mask = 0
    for i in compress(counter(), map(_BASE_REFS.__lt__, _excess_refs(order, direct))):
        mask |= 1 << i
    for i in viewed:
        mask |= 1 << i
    return mask


def _eval_key_python(targets: list, live: bool) -> tuple:
    """eval_key by collect_key and live_mask."""
    if not live:
        order, key, externals, _ = collect_key(targets)
        return order, key, externals, None
    direct: list = []
    order, key, externals, viewed = collect_key(targets, direct)
    return order, key, externals, live_mask(order, direct, viewed) if order else None


eval_key = _eval_key_python


@tracing.traced("rt.record", "runtime")
def record(ctx: DeviceContext, order: list, externals: list, keep: int | None = None,
           owned: bool = False) -> Recording:
    """Schedule every node and record one reusable command buffer that binds only through slots.

    keep: bit i set when node i's value must be in a buffer afterwards (None: every node).
    Other nodes are fused away or get scratch buffers, per submission or, with owned
    (rt.compile), owned by the recording and bound directly, so that the table holds
    inputs and outputs only. A node that is not kept stays a pending node.
    """
    E = len(externals)
    fuse = keep is not None and fusion_enabled(ctx)
    attach = alias = None
    noted: list = []
    if any(n.op == GRAD for n in order):
        order, keep, attach, alias, noted = _expand_grads(order, keep)
    units, buffered, deferred = schedule(ctx, order, keep, fuse, alias, fuse_now=owned)
    N = len(order)
    keep_all = keep is None
    # Unified buffer indices: externals, the buffers of nodes attached to arrays of the eval,
    # then scratch (nodes of expanded backward graphs, kernels' temporaries), then constants
    # the backward graphs read (bound directly; they stay alive with the recording).
    index_of_node: dict = {}
    fresh = []
    scratch_nodes = []
    fixed: dict = {}
    k = E
    for i in range(N):
        if not buffered[i]:
            continue
        node = order[i]
        nb = max(1, node.size * node.dtype.itemsize)
        att = i if attach is None else attach[i]
        if att is None or not (keep_all or keep >> i & 1):  # read by nothing after the eval
            scratch_nodes.append((i, nb))
            continue
        index_of_node[i] = k
        fresh.append((att, bucket_size(nb), nb))
        k += 1
    temps = []
    temp_index = {}
    scratch = [(("node", i), nb) for i, nb in scratch_nodes]
    scratch += [(("tmp", id(unit), t), nb) for unit in units for t, nb in enumerate(unit.temps)]
    # CPU queues run one submission at a time, in order: a recording may own its (small) scratch, as
    # rt.compile's do, instead of taking and giving back a buffer per scratch value at each submission.
    # An eval's recording still binds them through its table (it replays with any buffers), after
    # the fresh ones: `tail`, the same buffers at every submission.
    own_tail = not owned and not ctx.is_gpu and sum(nb for _, nb in scratch) <= CPU_OWNED_SCRATCH
    tail: dict = {}
    for what, nb in scratch:
        if what[0] == "node":
            index_of_node[what[1]] = k
        else:
            temp_index[what[1:]] = k
        if owned:
            fixed[k] = ctx.buffers.acquire(nb, host=False)
        elif own_tail:
            tail[k] = ctx.buffers.acquire(nb, host=False)
        else:
            temps.append(bucket_size(nb))
        k += 1
    slot_of_root = {id(r): j for j, r in enumerate(externals)}
    for i, s in index_of_node.items():
        slot_of_root[id(order[i])] = s
    bound: dict = {}  # unified index -> buffer bound directly, not owned (constants)
    captured = []
    for node in order:
        for inp in node.inputs:
            r = inp.root
            if r.storage is not None and id(r) not in slot_of_root:
                slot_of_root[id(r)] = k
                bound[k] = r.storage.buffer
                captured.append(r.storage)
                k += 1
    if alias:
        for gid, root in alias.items():
            slot_of_root[gid] = slot_of_root[id(root)]
    total = k
    table_slots = [s for s in range(total) if s not in fixed and s not in bound]
    table_index = {s: t for t, s in enumerate(table_slots)}
    cb = ctx.device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE,
                                          binding_capacity=len(table_slots))

    def ref(s: int, offset: int = 0, length: int | None = None):
        t = table_index.get(s)
        if t is not None:
            return hal.Slot(t, offset, length)
        buf = fixed[s][0] if s in fixed else bound[s]
        return buf if offset == 0 and length is None else (buf, offset, length)

    program = None
    if not ctx.is_gpu and cpu_program.enabled() and binding_bucket(total) is not None:
        program = cpu_program.Program()
    dispatches = fused = levels = 0
    prev = None
    cb.begin()
    for unit in sorted(units, key=lambda u: (u.level, u.first)):
        if not unit.cmds:
            continue
        if prev is not None and unit.level != prev and program is None:
            cb.execution_barrier()
        if prev != unit.level:
            levels += 1
        prev = unit.level
        for cmd in unit.cmds:
            kind = cmd[0]
            if kind == "dispatch":
                _, src, name, wg, consts, roles = cmd
                slots = []
                offsets = None  # byte offsets into the bound buffers ("in_at" roles: library operands)
                for role in roles:
                    what = role[0]
                    if what == "out":
                        slots.append(index_of_node[role[1] if len(role) > 1 else unit.first])
                    elif what == "in":
                        slots.append(slot_of_root[id(unit.node.inputs[role[1]].root)])  # (grad nodes: aliased)
                    elif what == "in_at":
                        offsets = offsets or {}
                        offsets[len(slots)] = role[2]
                        slots.append(slot_of_root[id(unit.node.inputs[role[1]].root)])
                    elif what == "root_at":
                        offsets = offsets or {}
                        offsets[len(slots)] = role[2]
                        slots.append(slot_of_root[id(role[1])])
                    elif what == "root":
                        slots.append(slot_of_root[id(role[1])])
                    else:
                        slots.append(temp_index[(id(unit), role[1])])
                if program is not None:
                    program.add_dispatch(src.numpy_code()[name], tuple(slots), consts, wg)
                else:
                    bindings = [ref(s) for s in slots] if offsets is None else \
                        [ref(s, offsets.get(i, 0)) for i, s in enumerate(slots)]
                    cb.dispatch(executable(ctx, src), name, workgroups=wg, constants=consts, bindings=bindings)
                dispatches += 1
                fused += name.startswith("fused_")
            elif kind == "fill":
                node = unit.node
                nbytes = node.size * node.dtype.itemsize
                s = index_of_node[unit.first]
                if program is not None:
                    program.add_fill(s, nbytes, cmd[2], cmd[3])
                else:
                    cb.fill_buffer(ref(s, 0, nbytes), pattern=cmd[2], pattern_length=cmd[3])
                dispatches += 1
            elif kind == "barrier" and program is None:
                cb.execution_barrier()
                prev = unit.level + 1
    if program is not None and program.steps:
        nbind = binding_bucket(total)
        ctx.programs[program.pid] = program
        cb.dispatch(program_executable(ctx), f"program_{nbind}", workgroups=(1, 1, 1),
                    constants=[program.pid], bindings=[ref(min(s, total - 1)) for s in range(nbind)])
    cb.end()
    rec = Recording(cb, E, fresh, temps, levels, dispatches)
    rec.fused = fused
    rec.deferred = deferred
    rec.captured = captured
    if noted:
        slot = {id(r): j for j, r in enumerate(externals)}
        rec.guards = [(slot[id(r)], r.storage.buffer, r.storage) for r in noted if id(r) in slot]
    if fixed:
        rec.scratch = fixed
        rec.footprint += sum(bucket for _, bucket in fixed.values())
    if tail:
        rec.scratch = tail
        rec.tail = [buf for buf, _ in tail.values()]
        rec.table_size += len(tail)
        rec.owner = ctx
        rec.footprint += sum(bucket for _, bucket in tail.values())
    if program is not None:
        rec.program = (ctx, program.pid)
    return rec


def _expand_grads(order: list, keep: int | None) -> tuple:
    """Replace grad nodes by their backward graphs: (order, keep, attach, alias, noted).

    Each grad node's value is computed into a contiguous root of the backward graph (a copy
    when the gradient is a strided view or a node of the forward graph); `alias` maps the
    grad node to that root for its consumers, `attach[i]` is the index in the original order
    whose array receives node i's buffer (None: scratch of the recording); `noted`: the constants
    whose values the backward graphs depend on.
    """
    grads = [n for n in order if n.op == GRAD]
    results, noted = expand_noting(grads)
    resolved(grads)
    in_order = {id(n) for n in order}
    alias: dict = {}
    roots: dict = {}  # id(grad node) -> root
    claimed: set = set()
    for g in grads:
        r = results[id(g)]
        base = r.base if r.base is not None else r
        usable = (base.storage is None and id(base) not in in_order and id(base) not in claimed
                  and base.size == g.size and r.offset == 0
                  and (r.strides is None or r.strides == contiguous_strides(r.shape)))
        if not usable:
            base = new_node("copy", (r,), g.dtype, g.shape, g.dtype, g.ctx)
        claimed.add(id(base))
        roots[id(g)] = base
        alias[id(g)] = base
    # Each grad node's backward nodes go where it was: everything they read (its forward graph,
    # the differentiated inputs) comes before it, and whatever reads the gradient comes after.
    grad_index = {id(n): i for i, n in enumerate(order) if n.op == GRAD}
    root_owner = {id(root): grad_index[gid] for gid, root in roots.items()}
    placed = set(in_order)
    new_order: list = []
    attach: list = []
    for i, n in enumerate(order):
        if n.op != GRAD:
            new_order.append(n)
            attach.append(i)
            continue
        for x in _pending_after(roots[id(n)], placed):
            new_order.append(x)
            attach.append(root_owner.get(id(x)))
    new_keep = None
    if keep is not None:  # what was kept stays kept (a grad node's root: if the grad node was)
        new_keep = 0
        for j, att in enumerate(attach):
            if att is not None and keep >> att & 1:
                new_keep |= 1 << j
    return new_order, new_keep, attach, alias, noted


def _pending_after(root: Array, placed: set) -> list:
    """Pending nodes `root` depends on (itself included) not in `placed`, in dependency order;
    adds them to `placed`."""
    out = []
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in placed:
            continue
        if expanded:
            placed.add(id(node))
            out.append(node)
            continue
        stack.append((node, True))
        for inp in reversed(node.inputs):
            r = inp.root
            if r.storage is None and r.op != PLACEHOLDER and id(r) not in placed:
                stack.append((r, False))
    return out


def evaluate(arrays) -> None:
    """Evaluate the given arrays (and everything pending they depend on): one submission per device."""
    if len(arrays) == 1:  # the usual call, one array not yet computed, without the grouping below
        r = arrays[0]
        if type(r) is Array and r.storage is None and r.base is None and r.op != PLACEHOLDER:
            _evaluate_locked(r.ctx, [r])
            return
    by_ctx: dict = {}
    for a in arrays:
        if type(a) is not Array:
            continue
        r = a.base
        if r is None:
            r = a
        st = r.storage
        if st is None:
            if r.op == PLACEHOLDER:
                raise hal.FailedPreconditionError("cannot evaluate a traced placeholder outside rt.compile")
            by_ctx.setdefault(r.ctx, []).append(r)
        elif st.ctx is not None and st.ready > st.ctx.flushed:  # a queued replay computes it: start it now
            st.ctx.flush()
    for ctx, targets in by_ctx.items():
        _evaluate_locked(ctx, targets)


def _evaluate_locked(ctx: DeviceContext, targets: list) -> None:
    with ctx.lock:
        if tracing.ENABLED:
            tracing.call("rt.eval", _evaluate_on, ctx, targets, category="runtime", arrays=len(targets))
        else:
            _evaluate_on(ctx, targets)


def _evaluate_on(ctx: DeviceContext, targets: list) -> None:
    # Nodes nothing reads afterwards are fused away, or scratch (owned on CPUs): which ones is `keep`.
    live = not ctx.is_gpu or FUSION
    order, key, externals, keep = eval_key(targets, live)
    if not order:
        return
    if live:
        key = (key, keep)
    if ctx.completed < ctx.submitted or ctx.retired_programs:  # (else the timeline has nothing newer to say)
        ctx.refresh()
    protect(order)
    try:
        ext = list(map(_storage_buffer, externals))  # in C: ~9 bytecodes an input as a comprehension
    except AttributeError:  # a placeholder of a function rt.compile is tracing
        raise _tracing_error(targets) from None
    if not graph_cache.enabled():
        rec = record(ctx, order, externals, keep)
    else:
        entry = ctx.graphs.get(key)
        if entry is None:
            rec = record(ctx, order, externals, keep)
            ctx.graphs.put(key, Variants(rec))
        else:
            rec = entry.pick(ext, MAX_VARIANTS if ctx.is_gpu else CPU_VARIANTS, ctx.buffers)
            if rec is None:
                rec = record(ctx, order, externals, keep)
                entry.recs.append(rec)
                ctx.graphs.grow(rec.footprint - entry.dropped)
                entry.dropped = 0
            elif rec.deferred and want(ctx, rec.deferred):  # the graph repeats: record it fused
                fused = record(ctx, order, externals, keep)
                entry.recs[entry.recs.index(rec)] = fused
                ctx.graphs.grow(fused.footprint - rec.footprint)
                rec.drop()
                rec = fused
    if tracing.ENABLED:
        table, value = tracing.call("rt.replay", submit, ctx, rec, ext, category="runtime")
    else:
        table, value = submit(ctx, rec, ext)
    attach(ctx, rec, order, table, value)


def _tracing_error(targets: list) -> Exception:
    from .errors import TracingError
    ops = ", ".join(sorted({t.op for t in targets if t.op}))
    return TracingError(
        f"the value of {ops or 'an array'} is needed while rt.compile traces the function, but it depends on "
        "the function's inputs: Python control flow on array values (if, while, bool(), float(), .item(), "
        ".numpy()) cannot be compiled; compute both branches and select with rt.where")


def submit(ctx: DeviceContext, rec: Recording, ext: list, queue: bool = False) -> tuple[list, int]:
    """Execute a recording with `ext` bound to its externals: (binding table, timeline value).

    The one submission path of evals and rt.compile. Buffers for the nodes the recording
    materializes and its per-submission scratch are taken from the buffer cache next to the
    externals, preferring the ones of its last submission (an unchanged table is replayed
    without patching anything); scratch goes back at once (later submissions run after it).

    ``queue=True`` (rt.compile's replays): while work handed to the device earlier may still
    run, the replay is queued and handed over with the next submission, up to SUBMIT_BATCH
    replays in one (each is one more command buffer of it); a device known idle gets it at once
    (a closed one refuses it at once), and any wait for a queued value hands the queue over
    first (``DeviceContext.flush``).
    """
    last = rec.last_table
    if last is None:
        table = ext + list(map(ctx.buffers.take, rec.buckets, rec.no_prefer))
    else:
        own = last[rec.n_ext:rec.n_ext + len(rec.buckets)]
        fresh = list(map(ctx.buffers.take, rec.buckets, own))
        if fresh != own:
            rec.moved = True
        table = ext + fresh
    if rec.tail:
        table += rec.tail
    try:
        value = _issue(ctx, rec, ext, table, queue)
    except BaseException:
        release = ctx.buffers.release
        for bucket, buf in zip(rec.buckets, table[rec.n_ext:]):
            release(buf, bucket)
        raise
    if rec.temps:
        release = ctx.buffers.release
        for pos, bucket in enumerate(rec.temps, rec.n_ext + len(rec.fresh)):
            release(table[pos], bucket, value)
    return table, value


def _issue(ctx: DeviceContext, rec: Recording, ext: list, table: list, queue: bool) -> int:
    """Queue `rec` bound to `table` (``queue``: see ``submit``) or hand it to the device; the
    timeline value it signals."""
    value = ctx.submitted + 1
    queued = ctx.queued
    if queue and ctx.flushed > ctx.completed and len(queued) < SUBMIT_BATCH - 1 and not ctx.device.closed:
        queued.append((rec.cb, table))
    else:
        _hand_over(ctx, [rec.cb], [table], value)
    rec.last_table = table
    rec.last_ext = ext
    ctx.submitted = value
    return value


def submit_queued(ctx: DeviceContext) -> None:
    """Hand the queued replays to the device on their own (DeviceContext.flush)."""
    _hand_over(ctx, [], [], ctx.submitted)


def _hand_over(ctx: DeviceContext, command_buffers: list, tables: list, value: int) -> None:
    """One queue_execute of the queued replays, then `command_buffers`, signalling `value`; if the
    device refuses it, the queued replays fail with it (their arrays raise the error when read)."""
    if len(ctx.in_flight) >= MAX_IN_FLIGHT:  # (the usual case asked here, not in a call)
        ctx.throttle()
    queued = ctx.queued
    if queued:
        command_buffers = [cb for cb, _ in queued] + command_buffers
        tables = [table for _, table in queued] + tables
    sem = ctx.semaphore
    try:
        ctx.device.queue_execute(command_buffers, wait=[(sem, ctx.flushed)] if ctx.flushed > ctx.completed else (),
                                 signal=[(sem, value)], binding_tables=tables)
    except BaseException as exc:
        if queued:
            ctx.recover(exc)
        raise
    if queued:
        ctx.queued = []
    ctx.flushed = value
    ctx.in_flight.append(value)


def attach(ctx: DeviceContext, rec: Recording, order: list, table: list, value: int) -> None:
    """Hand the materialized nodes of an eval their buffers; nodes fused away keep their inputs
    (they are garbage unless referenced)."""
    for pos, (i, bucket, nb) in enumerate(rec.fresh, rec.n_ext):
        node = order[i]
        node.storage = Storage(table[pos], bucket, ctx, value, nb)
        node.op = None
        node.inputs = ()
        node.params = None

