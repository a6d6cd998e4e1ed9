"""Lowering an op graph to one HAL command buffer per eval, through the graph cache.

Nodes are ordered topologically and grouped in levels (a node's level is one
more than its deepest producer), so a barrier separates levels only: a node
never reads what another node of its level writes. Every buffer is bound
through a `hal.Slot` of a reusable command buffer, so the recording replays
with any buffers: slots [0, E) are the graph's external inputs, [E, E+N) the
node outputs, then scratch.
"""

from __future__ import annotations

import hal

from . import cpu_program, graph_cache
from .array import Array
from .cpu_program import binding_bucket, program_executable
from .device import DeviceContext, Storage
from .kernels import elementwise, matmul, pad, random, reduce
from .kernels.source import executable
from .ops import ELEMENTWISE, REDUCTIONS
from .shapes import contiguous_strides

_PLACEHOLDER = "placeholder"


def _plan_full(node, layouts, ctx) -> list:
    if node.size == 0:
        return []
    dt = node.dtype
    value = node.params
    import numpy as np
    if dt.code == "bf16":
        from .dtypes import to_bfloat16_bits
        bits = int(to_bfloat16_bits(np.array([value], np.float32))[0])
    else:
        bits = int(np.array([value], dtype=dt.storage).view({1: np.uint8, 2: np.uint16, 4: np.uint32}[dt.itemsize])[0])
    return [("fill", ("out",), bits, dt.itemsize)]


PLANNERS = {"matmul": matmul.plan, "random": random.plan, "pad": pad.plan, "full": _plan_full}
PLANNERS.update({op: elementwise.plan for op in ELEMENTWISE})
PLANNERS.update({op: reduce.plan for op in REDUCTIONS})


class Recording:
    """A recorded reusable command buffer and what its slots hold."""

    __slots__ = ("cb", "n_ext", "node_nbytes", "temp_nbytes", "footprint", "scratch", "levels", "dispatches",
                 "program", "last_table", "table_slots")

    def __init__(self, cb, n_ext: int, node_nbytes: list, temp_nbytes: list, levels: int, dispatches: int) -> None:
        self.cb = cb
        self.n_ext = n_ext
        self.node_nbytes = node_nbytes
        self.temp_nbytes = temp_nbytes
        self.levels = levels
        self.dispatches = dispatches
        self.scratch = None  # slot -> (buffer, bucket) the recording owns (rt.compile's internal values)
        self.program = None  # (context, id) of the CPU program this recording runs
        self.last_table = None  # the buffers of the latest submission, preferred for the next one
        self.table_slots = None  # binding-table entry -> slot (all slots unless some are owned)
        self.footprint = 512 + 256 * dispatches

    def drop(self) -> None:
        self.cb = None

    def __del__(self) -> None:
        if self.program is not None:
            ctx, pid = self.program
            try:
                ctx.retire_program(pid)
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


def collect(targets: list) -> list:
    """Pending root nodes reachable from targets, in dependency order (iterative DFS)."""
    order = []
    done = set()
    stack = [(t, False) for t in reversed(targets)]
    while stack:
        node, expanded = stack.pop()
        nid = id(node)
        if nid in done:
            continue
        if expanded:
            done.add(nid)
            order.append(node)
            continue
        stack.append((node, True))
        for inp in reversed(node.inputs):
            r = inp.base
            if r is None:
                r = inp
            if r.storage is None and r.op != _PLACEHOLDER and id(r) not in done:
                stack.append((r, False))
    return order


def graph_key(order: list):
    """(key, externals): the topology key of `order` and the external roots in slot order."""
    ext_index: dict = {}
    node_index: dict = {}
    externals: list = []
    parts = []
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
        parts.append((node.op, node.params, node.shape, node.dtype, tuple(ins)))
    return tuple(parts), externals


def record(ctx: DeviceContext, order: list, externals: list, internal: set | None = None) -> Recording:
    """Plan every node and record one reusable command buffer that binds only through slots.

    `internal` (rt.compile): indices of nodes whose values never leave the recording. Their
    buffers and the kernels' scratch are allocated here, once, and referenced directly, so
    the binding table holds only the inputs and the outputs.
    """
    E = len(externals)
    N = len(order)
    slot_of = {id(r): j for j, r in enumerate(externals)}
    for i, node in enumerate(order):
        slot_of[id(node)] = E + i
    level = {}
    plans = []
    temp_nbytes: list = []
    temp_base = []
    for i, node in enumerate(order):
        lv = 0
        layouts = []
        for inp in node.inputs:
            r = inp.root
            pl = level.get(id(r))
            if pl is not None and pl + 1 > lv:
                lv = pl + 1
            strides = inp.strides if inp.strides is not None else contiguous_strides(inp.shape)
            layouts.append((inp.shape, strides, inp.offset))
        planner = PLANNERS.get(node.op)
        if planner is None:
            raise hal.UnimplementedError(f"no kernel for op {node.op!r}")
        cmds = planner(node, layouts, ctx)
        temp_base.append(len(temp_nbytes))
        if cmds and cmds[0][0] == "temps":
            temp_nbytes.extend(cmds[0][1])
            cmds = cmds[1:]
        if any(c[0] == "barrier" for c in cmds):
            lv_end = lv + 1  # a node with an internal barrier occupies two levels
        else:
            lv_end = lv
        level[id(node)] = lv_end
        plans.append((lv, i, cmds))
    plans.sort(key=lambda p: (p[0], p[1]))
    T = len(temp_nbytes)
    node_nbytes = [max(1, node.size * node.dtype.itemsize) for node in order]
    fixed: dict = {}  # slot -> (buffer, bucket) owned by the recording
    if internal is not None:
        for i in internal:
            fixed[E + i] = ctx.buffers.acquire(node_nbytes[i])
        for t, nb in enumerate(temp_nbytes):
            fixed[E + N + t] = ctx.buffers.acquire(nb)
    table_slots = [k for k in range(E + N + T) if k not in fixed]
    table_index = {k: t for t, k in enumerate(table_slots)}
    cb = ctx.device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE,
                                          binding_capacity=len(table_slots))

    def ref(k: int, offset: int = 0, length: int | None = None):
        t = table_index.get(k)
        if t is not None:
            return hal.Slot(t, offset, length)
        buf = fixed[k][0]
        return buf if offset == 0 and length is None else (buf, offset, length)

    dispatches = 0
    levels = 0
    program = None
    if not ctx.is_gpu and cpu_program.enabled() and binding_bucket(E + N + T) is not None:
        program = cpu_program.Program()
    cb.begin()
    prev = None
    for lv, i, cmds in plans:
        if not cmds:
            continue
        if prev is not None and lv != prev and program is None:
            cb.execution_barrier()
        if prev != lv:
            levels += 1
        prev = lv
        node = order[i]
        for cmd in cmds:
            kind = cmd[0]
            if kind == "dispatch":
                _, src, name, wg, consts, roles = cmd
                slots = []
                for role in roles:
                    if role[0] == "out":
                        slots.append(E + i)
                    elif role[0] == "in":
                        slots.append(slot_of[id(node.inputs[role[1]].root)])
                    else:
                        slots.append(E + N + temp_base[i] + role[1])
                if program is not None:
                    program.add_dispatch(src.numpy_code()[name], tuple(slots), consts, wg)
                else:
                    cb.dispatch(executable(ctx, src), name, workgroups=wg, constants=consts,
                                bindings=[ref(s) for s in slots])
                dispatches += 1
            elif kind == "fill":
                nbytes = node.size * node.dtype.itemsize
                if program is not None:
                    program.add_fill(E + i, nbytes, cmd[2], cmd[3])
                else:
                    cb.fill_buffer(ref(E + i, 0, nbytes), pattern=cmd[2], pattern_length=cmd[3])
                dispatches += 1
            elif kind == "barrier" and program is None:
                cb.execution_barrier()
                prev = lv + 1
    if program is not None and program.steps:
        nbind = binding_bucket(E + N + T)
        S = E + N + T
        ctx.programs[program.pid] = program
        cb.dispatch(program_executable(ctx), f"program_{nbind}", workgroups=(1, 1, 1),
                    constants=[program.pid], bindings=[ref(min(k, S - 1)) for k in range(nbind)])
    cb.end()
    rec = Recording(cb, E, node_nbytes, temp_nbytes, levels, dispatches)
    rec.table_slots = table_slots
    if fixed:
        rec.scratch = fixed
        rec.footprint += sum(bucket for _, bucket in fixed.values())
    if program is not None:
        rec.program = (ctx, program.pid)
    return rec


def evaluate(arrays) -> None:
    """Evaluate the given arrays (and everything pending they depend on): one submission per device."""
    by_ctx: dict = {}
    for a in arrays:
        if type(a) is not Array:
            continue
        r = a.root
        if r.storage is None:
            if r.op == _PLACEHOLDER:
                raise hal.FailedPreconditionError("cannot evaluate a traced placeholder outside rt.compile")
            by_ctx.setdefault(r.ctx, []).append(r)
    for ctx, targets in by_ctx.items():
        with ctx.lock:
            _evaluate_on(ctx, targets)


def _evaluate_on(ctx: DeviceContext, targets: list) -> None:
    order = collect(targets)
    if not order:
        return
    ctx.refresh()
    key, externals = graph_key(order)
    use_cache = graph_cache.enabled()
    rec = ctx.graphs.get(key) if use_cache else None
    if rec is None:
        rec = record(ctx, order, externals)
        if use_cache:
            ctx.graphs.put(key, rec)
    submit(ctx, rec, order, externals)


def submit(ctx: DeviceContext, rec: Recording, order: list, externals: list) -> int:
    """Bind fresh output buffers and the externals' buffers, execute, attach storage."""
    E = rec.n_ext
    table = [None] * (E + len(rec.node_nbytes) + len(rec.temp_nbytes))
    for j, r in enumerate(externals):
        table[j] = r.storage.buffer
    ctx.throttle()
    acquire = ctx.buffers.acquire
    last = rec.last_table
    outs = []
    for i, nb in enumerate(rec.node_nbytes):
        buf, bucket = acquire(nb, last[E + i] if last is not None else None)
        table[E + i] = buf
        outs.append((buf, bucket, nb))
    temps = []
    base = E + len(rec.node_nbytes)
    for t, nb in enumerate(rec.temp_nbytes):
        buf, bucket = acquire(nb, last[base + t] if last is not None else None)
        table[base + t] = buf
        temps.append((buf, bucket))
    rec.last_table = table
    value = ctx.submitted + 1
    sem = ctx.semaphore
    wait = [(sem, ctx.submitted)] if ctx.submitted > ctx.completed else []
    try:
        ctx.device.queue_execute([rec.cb], wait=wait, signal=[(sem, value)], binding_tables=[table])
    except BaseException:
        for buf, bucket, _ in outs:
            ctx.buffers.release(buf, bucket, 0, 0)
        for buf, bucket in temps:
            ctx.buffers.release(buf, bucket, 0, 0)
        raise
    ctx.submitted = value
    for node, (buf, bucket, nb) in zip(order, outs):
        node.storage = Storage(buf, bucket, ctx, value, nb)
        node.op = None
        node.inputs = ()
        node.params = None
    for r in externals:
        r.storage.fence = value
    completed = ctx.completed
    for buf, bucket in temps:
        ctx.buffers.release(buf, bucket, value, completed)
    return value
