"""The record stage: a plan's units recorded into one reusable command buffer that binds through slots.

Every buffer reference is a ``hal.Slot`` of the binding table (the plan says which values are bound
directly instead: the scratch rt.compile's recordings own, constants), so one recording replays with
any buffers. A barrier separates kernel levels only. On CPU drivers the kernels run inside one
dispatch of a small "program" executable (``cpu_program.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import hal
from hal import interrupts, tracing

from ..graph import root_of
from ..kernels.source import executable
from . import cpu_program
from .cpu_program import binding_bucket, program_executable
from .plan import plan

if TYPE_CHECKING:
    from ..device import DeviceContext


class Recording:
    """A recorded reusable command buffer and what its binding table holds.

    Table layout: externals [0, n_ext), then one buffer per `fresh` node (acquired per
    submission and attached to the node), then per-submission scratch (`temps`, buckets).
    """

    __slots__ = ("cb", "n_ext", "fresh", "temps", "table_size", "footprint", "scratch", "levels",
                 "dispatches", "fused", "program", "last_table", "last_ext", "captured", "buckets",
                 "fresh_buckets", "moved", "no_prefer", "deferred", "guards", "owner", "tail", "held", "held_outs",
                 "held_storages", "held_buffers", "held_refs", "execution", "collectives", "work_bytes", "__weakref__")

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
        #: Whether it records collectives: handed to the device at once, never queued with later replays
        #: (another rank's work may wait for this one before this process asks for anything).
        self.collectives = False
        #: What its work moves at least once: its external inputs and the arrays it writes (a context's
        #: queue holds back at most SUBMIT_BATCH_BYTES of work: DeviceContext.submit).
        self.work_bytes = 0
        self.captured: list = []  # storages of constants bound directly (their fences follow the submissions)
        self.scratch = None  # unified index -> (buffer, bucket) the recording owns (rt.compile, small CPU scratch)
        self.owner = None  # the context its owned scratch goes back to when it is dropped
        self.tail: list = []  # owned scratch bound through the table, after the fresh buffers (evals)
        self.program = None  # (context, id) of the CPU program this recording runs
        self.last_table = None  # the buffers of the latest submission, preferred for the next one
        self.last_ext = None  # its external buffers, to pick the recording whose table is unchanged
        #: The prepared execution of the command buffer with `last_table` (None: none prepared).
        self.execution: hal.Execution | None = None
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
        self.cb = self.execution = None
        self.held = self.held_outs = self.held_storages = None
        if self.owner is not None:
            self.release_scratch(self.owner)
            self.owner = None

    def release_scratch(self, ctx: DeviceContext) -> None:
        scratch, self.scratch = self.scratch, None
        for buf, bucket in (scratch or {}).values():
            if bucket:  # (bucket 0: a piece of a group's symmetric memory, kept by the group: distributed.Arena)
                ctx.buffers.release(buf, bucket, ctx.submitted)

    def __del__(self) -> None:
        if self.program is not None:
            ctx, pid = self.program
            try:
                ctx.retire_program(pid)
            except KeyboardInterrupt:
                interrupts.redeliver()
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


@tracing.traced("rt.record", "runtime")
def record(ctx: DeviceContext, order: list, externals: list, keep: int | None = None,
           owned: bool = False) -> Recording:
    """Plan every node and record one reusable command buffer that binds only through slots.

    keep: bit i set when node i's value must be in a buffer afterwards (None: every node).
    Other nodes are fused away or get scratch buffers, per submission or, with owned
    (rt.compile), owned by the recording and bound directly, so that the table holds
    inputs and outputs only. A node that is not kept stays a pending node.
    """
    p = plan(ctx, order, externals, keep, owned)
    units, index_of_node, slot_of_root, temp_index = p.units, p.index_of_node, p.slot_of_root, p.temp_index
    fixed, bound, total = p.fixed, p.bound, p.total
    table_index = {s: t for t, s in enumerate(p.table_slots)}
    cb = ctx.device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE,
                                          binding_capacity=len(table_index))

    def ref(s: int, offset: int = 0, length: int | None = None):
        t = table_index.get(s)
        if t is not None:
            return hal.Slot(t, offset, length)
        buf = fixed[s][0] if s in fixed else bound[s]
        return buf if offset == 0 and length is None else (buf, offset, length)

    program = None
    if not ctx.is_gpu and cpu_program.enabled() and binding_bucket(total) is not None \
            and not any(cmd[0] == "collective" for unit in units for cmd in unit.cmds):  # (they wait for other ranks)
        program = cpu_program.Program()
    dispatches = fused = levels = 0
    groups: list = []  # the process groups whose collectives it records (runtime/distributed.py)
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
                        slots.append(slot_of_root[id(root_of(unit.node.inputs[role[1]]))])  # (grad nodes: aliased)
                    elif what == "out_at":  # (a library routine writing its output into the node's buffer)
                        offsets = offsets or {}
                        offsets[len(slots)] = role[1]
                        slots.append(index_of_node[unit.first])
                    elif what == "in_at":
                        offsets = offsets or {}
                        offsets[len(slots)] = role[2]
                        slots.append(slot_of_root[id(root_of(unit.node.inputs[role[1]]))])
                    elif what == "root_at":
                        offsets = offsets or {}
                        offsets[len(slots)] = role[2]
                        slots.append(slot_of_root[id(role[1])])
                    elif what == "root":
                        slots.append(slot_of_root[id(role[1])])
                    else:
                        slots.append(temp_index[(id(unit), role[1])])
                if program is not None:
                    program.add_dispatch(src.numpy_code()[name], tuple(slots), consts, wg, offsets)
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
            elif kind == "collective":  # (runtime/distributed.py)
                _, what, group, count, dtype, reduction, root = cmd
                groups.append(group)
                node = unit.node
                source = node.inputs[0]
                send = ref(slot_of_root[id(root_of(source))], 0, source.size * source.dtype.itemsize)
                recv = ref(index_of_node[unit.first], 0, node.size * node.dtype.itemsize)
                cb.collective(group.channel, what, send, recv, count, dtype=dtype, reduction=reduction, root=root)
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
    rec = Recording(cb, p.n_ext, p.fresh, p.temps, levels, dispatches)
    rec.work_bytes = sum(r.size * r.dtype.itemsize for r in externals) + sum(nb for _, _, nb in p.fresh)
    rec.fused = fused
    rec.deferred = p.deferred
    rec.collectives = bool(groups)
    for group in groups:
        group.recordings.add(rec)
    rec.captured = p.captured
    if p.noted:
        slot = {id(r): j for j, r in enumerate(externals)}
        rec.guards = [(slot[id(r)], r.storage.buffer, r.storage) for r in p.noted if id(r) in slot]
    if fixed:
        rec.scratch = fixed
        rec.footprint += sum(bucket for _, bucket in fixed.values())
    tail = p.tail
    if tail:
        rec.scratch = tail
        rec.tail = [buf for buf, _ in tail.values()]
        rec.table_size += len(tail)
        rec.owner = ctx
        rec.footprint += sum(bucket for _, bucket in tail.values())
    if program is not None:
        rec.program = (ctx, program.pid)
    return rec
