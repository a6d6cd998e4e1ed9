"""An eval, stage by stage: key the pending graph, find or record its recording, execute it, attach.

The graph cache (``GraphCache``) maps a graph key to the recordings of that graph (``Variants``); a
miss plans and records a new one. On GPUs, a recording that runs without fused kernels it wants
(``fusion.py``: compiled only once wanted RUNTIME_FUSE_AFTER times) is recorded again, fused, once
they are due.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING

from hal import tracing

from .. import graph_cache
from ..autodiff import protect
from ..errors import TracingError
from ..graph import PLACEHOLDER, Node
from . import fusion
from .execute import CPU_VARIANTS, MAX_VARIANTS, Variants, attach, submit
from .key import eval_key
from .record import record

if TYPE_CHECKING:
    from ..device import DeviceContext

_storage_buffer = attrgetter("storage.buffer")


def evaluate(arrays: tuple | list) -> None:
    """Evaluate the given arrays (and everything pending they depend on): one command buffer per device,
    submitted or queued (``DeviceContext.submit``)."""
    if len(arrays) == 1:  # the usual call, one array not yet computed, without the grouping below
        r = arrays[0]
        if isinstance(r, Node) and r.storage is None and r.base is None and r.op != PLACEHOLDER:
            _evaluate_locked(r.ctx, [r])
            return
    by_ctx: dict = {}
    for a in arrays:
        if not isinstance(a, Node):
            continue
        r = a.base
        if r is None:
            r = a
        st = r.storage
        if st is None:
            if r.op == PLACEHOLDER:
                raise TracingError(  # (a FailedPreconditionError too)
                    "this array stands for an argument of a function rt.compile traces: its value is not known "
                    "while tracing (Python control flow on array values, bool(), float(), .item(), .numpy(), "
                    "cannot be compiled; select with rt.where), nor after the trace (each call has its own)")
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
    live = not ctx.is_gpu or fusion.ENABLED
    order, key, externals, keep = eval_key(targets, live)
    if not order:
        return
    if live:
        key = (key, keep)
    if ctx.semaphore.failure is not None:  # (a failure already recorded: go on on a fresh timeline first)
        ctx.refresh()
    protect(order)
    try:
        ext = list(map(_storage_buffer, externals))
    except AttributeError:  # a placeholder of a function rt.compile is tracing
        raise _tracing_error(targets) from None
    if not graph_cache.ENABLED:
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
            elif rec.deferred and fusion.want(ctx, rec.deferred):  # the graph repeats: record it fused
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
    ops = ", ".join(sorted({t.op for t in targets if t.op}))
    return TracingError(
        f"the value of {ops or 'an array'} is needed while rt.compile traces the function, but it depends on "
        "the function's inputs: Python control flow on array values (if, while, bool(), float(), .item(), "
        ".numpy()) cannot be compiled; compute both branches and select with rt.where")
