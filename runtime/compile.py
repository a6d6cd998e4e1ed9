"""rt.compile: trace a function once per input signature, then replay its recording.

The first call for a (shapes, dtypes, device) signature runs `fn` on
placeholder arrays, which builds the op graph, and records it into one
reusable command buffer. Later calls skip Python graph building: one
dictionary look-up, fresh buffers for the outputs bound through the binding
table next to the arguments' buffers and the recording's own scratch, one
submission.
"""

from __future__ import annotations

import functools

import hal

from .array import Array, new_evaluated, new_node
from .device import Storage
from .lowering import _PLACEHOLDER, collect, graph_key, record


def _flatten(tree, leaves: list):
    """Structure of nested tuples/lists/dicts with Array leaves replaced by their index."""
    if type(tree) is Array:
        leaves.append(tree)
        return len(leaves) - 1
    if isinstance(tree, tuple):
        return ("t", tuple(_flatten(t, leaves) for t in tree))
    if isinstance(tree, list):
        return ("l", tuple(_flatten(t, leaves) for t in tree))
    if isinstance(tree, dict):
        return ("d", tuple((k, _flatten(v, leaves)) for k, v in tree.items()))
    return ("c", tree)


def _unflatten(spec, leaves: list):
    if isinstance(spec, int):
        return leaves[spec]
    kind, body = spec
    if kind == "t":
        return tuple(_unflatten(s, leaves) for s in body)
    if kind == "l":
        return [_unflatten(s, leaves) for s in body]
    if kind == "d":
        return {k: _unflatten(s, leaves) for k, s in body}
    return body


class _Traced:
    """One signature's recording and how to bind and rebuild its inputs and outputs."""

    __slots__ = ("ctx", "rec", "table_plan", "out_spec", "out_nodes", "outputs", "scratch", "captured", "n_nodes")

    def __init__(self, fn, args: list, kwargs: dict, ctx) -> None:
        self.ctx = ctx
        leaves: list = []
        spec_in = _flatten((tuple(args), kwargs), leaves)
        placeholders = []
        for i, a in enumerate(leaves):
            placeholders.append(new_node(_PLACEHOLDER, (), i, a.shape, a.dtype, a.ctx))
        t_args, t_kwargs = _unflatten(spec_in, placeholders)
        result = fn(*t_args, **t_kwargs)
        out_leaves: list = []
        self.out_spec = _flatten(result, out_leaves)
        roots = [o.root for o in out_leaves if o.root.storage is None and o.root.op != _PLACEHOLDER]
        order = collect(roots)
        _, externals = graph_key(order)
        node_index = {id(n): i for i, n in enumerate(order)}
        self.outputs = []
        out_nodes = set()
        for o in out_leaves:
            strides, offset = o.layout()
            view = (o.shape, None if o.root is o else strides, offset, o.dtype)
            r = o.root
            if id(r) in node_index:
                i = node_index[id(r)]
                out_nodes.add(i)
                self.outputs.append(("node", i, r.shape, view))
            elif r.op == _PLACEHOLDER:
                self.outputs.append(("arg", r.params, r.shape, view))
            else:
                self.outputs.append(("const", o, None, None))
        self.out_nodes = sorted(out_nodes)
        # Values that never leave fn live in buffers the recording owns; only the arguments,
        # captured arrays and outputs go through the binding table.
        internal = {i for i in range(len(order)) if i not in out_nodes}
        self.rec = rec = record(ctx, order, externals, internal)
        self.n_nodes = len(order)
        self.captured = []
        ext_sources = []
        for r in externals:
            if r.op == _PLACEHOLDER:
                ext_sources.append(r.params)
            else:
                ext_sources.append(-1 - len(self.captured))
                self.captured.append(r.storage)
        # Each binding-table entry: ("arg", leaf index) | ("captured", index) | ("out", node index).
        E = rec.n_ext
        self.table_plan = []
        for slot in rec.table_slots:
            if slot < E:
                src = ext_sources[slot]
                self.table_plan.append(("arg", src) if src >= 0 else ("captured", -1 - src))
            else:
                self.table_plan.append(("out", slot - E))
        self.scratch = rec.scratch or {}

    def release(self) -> None:
        ctx = self.ctx
        for buf, bucket in self.scratch.values():
            ctx.buffers.release(buf, bucket, ctx.submitted, ctx.completed)
        self.scratch = {}

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def run(self, leaves: list):
        ctx = self.ctx
        rec = self.rec
        storages = [a.root.storage for a in leaves]
        ctx.throttle()
        acquire = ctx.buffers.acquire
        last = rec.last_table
        table = []
        fresh = {}
        for t, (kind, idx) in enumerate(self.table_plan):
            if kind == "arg":
                table.append(storages[idx].buffer)
            elif kind == "out":
                buf, bucket = acquire(rec.node_nbytes[idx], last[t] if last is not None else None)
                table.append(buf)
                fresh[idx] = (buf, bucket, rec.node_nbytes[idx])
            else:
                table.append(self.captured[idx].buffer)
        value = ctx.submitted + 1
        sem = ctx.semaphore
        wait = [(sem, ctx.submitted)] if ctx.submitted > ctx.completed else []
        ctx.device.queue_execute([rec.cb], wait=wait, signal=[(sem, value)],
                                 binding_tables=[table if table else None])
        rec.last_table = table
        ctx.submitted = value
        for st in storages:
            st.fence = value
        for st in self.captured:
            st.fence = value
        roots = {}
        for i, (buf, bucket, nb) in fresh.items():
            roots[i] = (Storage(buf, bucket, ctx, value, nb))
        outs = []
        cache: dict = {}
        for kind, idx, rshape, view in self.outputs:
            if kind == "const":
                outs.append(idx)
                continue
            if kind == "node":
                root = cache.get(idx)
                if root is None:
                    root = new_evaluated(roots[idx], rshape, view[3], ctx)
                    cache[idx] = root
            else:
                root = leaves[idx].root
            shape, strides, offset, dt = view
            if strides is None:
                outs.append(root)
            else:
                v = new_evaluated(None, shape, dt, ctx)
                v.base = root
                v.strides = strides
                v.offset = offset
                outs.append(v)
        return _unflatten(self.out_spec, outs)


def compile(fn):  # noqa: A001 - mirrors mx.compile / jax.jit
    """Trace `fn` once per input signature into a reusable recording; later calls rebind and replay."""
    traced: dict = {}
    stats = {"traces": 0, "calls": 0}

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        leaves: list = []
        spec = _flatten((args, kwargs), leaves)
        ctx = None
        sig = [spec]
        pending = []
        for i, a in enumerate(leaves):
            if ctx is None:
                ctx = a.ctx
            elif a.ctx is not ctx:
                raise hal.InvalidArgumentError("rt.compile: all array arguments must be on one device")
            if a.root is not a:
                a = leaves[i] = _dense(a)
            if a.storage is None:
                pending.append(a)
            sig.append((a.shape, a.dtype))
        if ctx is None:
            raise hal.InvalidArgumentError("rt.compile: the function needs at least one array argument")
        if pending:
            from .lowering import evaluate
            evaluate(pending)
        key = (tuple(sig), id(ctx))
        entry = traced.get(key)
        stats["calls"] += 1
        if entry is None:
            with ctx.lock:
                t_args, t_kwargs = _unflatten(spec, leaves)
                entry = _Traced(fn, list(t_args), t_kwargs, ctx)
            traced[key] = entry
            stats["traces"] += 1
        with ctx.lock:
            return entry.run(leaves)

    wrapped.stats = stats
    wrapped.cache_clear = traced.clear
    return wrapped


def _dense(a: Array) -> Array:
    from .ops import contiguous
    return contiguous(a)
