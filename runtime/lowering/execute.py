"""The execute stage: picking the recording of a graph to run, its binding table, its execution.

A graph key keeps up to MAX_VARIANTS recordings (one more on CPU drivers), each replayed with its own
binding table: the graph's external inputs, then the buffers of the nodes the eval materializes,
taken from the buffer cache preferring the ones of the recording's last submission, then scratch.
A recording holds the prepared execution (``hal.Execution``) of its latest table: an unchanged
table, the usual case, is submitted again with no validation and replayed by the driver without
patching anything. ``DeviceContext.submit`` hands it to the device on the context's timeline.
"""

from __future__ import annotations

from sys import getrefcount
from typing import TYPE_CHECKING
from weakref import getweakrefcount

import hal
from hal import env

from ..device import Storage
from ..graph import DIFFERENTIATING, keeps_graph
from .record import Recording

if TYPE_CHECKING:
    from ..buffer_cache import BufferCache
    from ..device import DeviceContext

#: Recordings kept per graph key on GPUs, each replaying its own binding table unchanged (a step that
#: alternates between two buffers, as `w = step(w)` does, then never patches a graph).
MAX_VARIANTS = env.integer("RUNTIME_GRAPH_VARIANTS", 2, minimum=1)
#: CPU drivers keep one more: there an unchanged table also spares re-making the byte views and re-binding
#: the CPU program's kernels, and an eager step rotates three buffers of one size (w, its successor and
#: the gradient), which two recordings keep missing.
CPU_VARIANTS = MAX_VARIANTS + 1


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

        With every recording made and none of these externals free, the busy one of these
        externals used to take other buffers at every call while the others were never chosen
        again: a loop of ``y = f(x)`` that came back to ``x`` after calls with other inputs, or
        that kept one result alive, prepared and uploaded a new table every call (64 MB lookups
        on an H200: 40 -> 100 us a call). The recordings now take turns (below).
        """
        recs = self.recs
        for rec in recs:
            last = rec.last_ext
            if last is None:
                if rec.guards and not _guards_hold(rec.guards, ext):
                    continue
                return rec
            if last == ext:  # (so are the guarded constants)
                if not rec.moved or _buffers_free(rec, buffers):
                    return rec
        if len(recs) < limit:
            return None
        # Every recording is made and none of these externals has its buffers free. One whose
        # buffers are free takes these externals (a new table, once); else the least recently
        # rebound, so that the recordings, taken in turn, each settle on the buffers free at its
        # turn (one whose buffer a result kept alive holds gets its turn too, and lets it go).
        turn = None
        for i, rec in enumerate(recs):
            if not rec.guards or _guards_hold(rec.guards, ext):
                if _buffers_free(rec, buffers):
                    turn = i
                    break
                if turn is None:
                    turn = i
        if turn is not None:
            rec = recs.pop(turn)
            recs.append(rec)
            return rec
        rec = recs.pop(0)  # none was recorded for these constants: make room
        rec.drop()
        self.dropped += rec.footprint
        return None

    def drop(self) -> None:
        for rec in self.recs:
            rec.drop()


def _buffers_free(rec: Recording, buffers: BufferCache) -> bool:
    """Whether the buffers ``rec``'s last submission materialized its nodes in are free again (its
    table's own part would be the same)."""
    if rec.held is not None:
        return held_free(rec)
    return buffers.all_free(rec.last_table, rec.n_ext, rec.fresh_buckets)


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
    """``submit(ctx, rec, ext)`` for a compiled replay whose outputs are the arrays it
    holds (``held_free``): their buffers are bound again, nothing is taken or given back. Returns
    the timeline value; the caller marks the held storages ready at it."""
    return _execute(ctx, rec, ext, ext + rec.held_buffers)


def _guards_hold(guards: list, ext: list) -> bool:
    for slot, buf, _ in guards:
        if ext[slot] is not buf:
            return False
    return True


def submit(ctx: DeviceContext, rec: Recording, ext: list) -> tuple[list, int]:
    """Execute a recording with `ext` bound to its externals: (binding table, timeline value).

    The one submission path of evals and rt.compile. Buffers for the nodes the recording
    materializes and its per-submission scratch are taken from the buffer cache next to the
    externals, preferring the ones of its last submission (an unchanged table is replayed
    without validating or patching anything); scratch goes back at once (later submissions run
    after it). While earlier work may still run, the execution is queued (``DeviceContext.submit``),
    unless it holds collectives.
    """
    last = rec.last_table
    take = ctx.buffers.take
    if last is None:
        table = ext + list(map(take, rec.buckets, rec.no_prefer))
    else:
        n_ext = rec.n_ext
        own = last[n_ext:n_ext + len(rec.buckets)]
        fresh = list(map(take, rec.buckets, own))
        if fresh != own:
            rec.moved = True
        table = ext + fresh
    if rec.tail:
        table += rec.tail
    try:
        value = _execute(ctx, rec, ext, table)
    except BaseException:
        release = ctx.buffers.release
        for bucket, buf in zip(rec.buckets, table[rec.n_ext:]):
            release(buf, bucket, ctx.submitted)  # (a replay queued earlier may bind a buffer taken again)
        raise
    if rec.temps:
        release = ctx.buffers.release
        for pos, bucket in enumerate(rec.temps, rec.n_ext + len(rec.fresh)):
            release(table[pos], bucket, value)
    return table, value


def _execute(ctx: DeviceContext, rec: Recording, ext: list, table: list) -> int:
    """Submit `rec` bound to `table` through its execution (prepared again for a new table): the
    timeline value it signals."""
    execution = rec.execution
    if execution is None or table != rec.last_table:
        if rec.cb is None:
            raise hal.FailedPreconditionError("this computation's recording was released: the process group of "
                                              "its collectives is closed")
        rec.execution = None
        execution = ctx.device.prepare([rec.cb], [table])
        rec.execution = execution
        rec.last_table = table
    value = ctx.submit(execution, not rec.collectives, rec.work_bytes)
    rec.last_ext = ext
    return value


def attach(ctx: DeviceContext, rec: Recording, order: list, table: list, value: int) -> None:
    """Hand the materialized nodes of an eval their buffers; nodes fused away keep their inputs
    (they are garbage unless referenced). While a differentiated function runs on this thread
    (``DIFFERENTIATING``) the materialized nodes keep theirs too: the gradient is taken through them afterwards."""
    if DIFFERENTIATING and keeps_graph():
        for pos, (i, bucket, nb) in enumerate(rec.fresh, rec.n_ext):
            order[i].storage = Storage(table[pos], bucket, ctx, value, nb)
        return
    for pos, (i, bucket, nb) in enumerate(rec.fresh, rec.n_ext):
        node = order[i]
        node.storage = Storage(table[pos], bucket, ctx, value, nb)
        node.op = None
        node.inputs = ()
        node.params = None
