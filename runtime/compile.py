"""rt.compile: trace a function once per input signature, then replay its recording.

The first call for a (shapes, dtypes, device) signature runs `fn` on
placeholder arrays, which builds the op graph, and records it into one
reusable command buffer. Later calls skip Python graph building: one
dictionary look-up, a binding table of the arguments' buffers and the
outputs' buffers (values that never leave the function live in buffers the
recording owns), one submission. On GPUs a signature keeps up to
MAX_VARIANTS recordings, each replayed with its own unchanged table: a loop
`w = step(w)` alternates between two buffers, and each recording sees the
same two every time, so the driver launches its graph without patching it.
"""

from __future__ import annotations

import functools

import hal

from .array import Array, new_evaluated, new_node
from .autodiff import GRAD, materialize, resolved
from .device import Storage
from .lowering import _PLACEHOLDER, MAX_VARIANTS, Variants, collect, graph_key, record


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
    """One signature's recordings and how to bind its inputs and rebuild its outputs."""

    __slots__ = ("ctx", "variants", "order", "externals", "keep", "n_ext", "template", "arg_slots",
                 "captured", "out_spec", "outputs", "node_meta", "plain")

    def __init__(self, fn, args: list, kwargs: dict, ctx) -> None:
        self.ctx = ctx
        leaves: list = []
        spec_in = _flatten((tuple(args), kwargs), leaves)
        placeholders = [new_node(_PLACEHOLDER, (), i, a.shape, a.dtype, a.ctx) for i, a in enumerate(leaves)]
        t_args, t_kwargs = _unflatten(spec_in, placeholders)
        result = fn(*t_args, **t_kwargs)
        out_leaves: list = []
        self.out_spec = _flatten(result, out_leaves)
        roots = [o.root for o in out_leaves if o.root.storage is None and o.root.op != _PLACEHOLDER]
        order = collect(roots)
        grads = [n for n in order if n.op == GRAD]
        if grads:  # the trace is recorded once per binding-table variant: build backward graphs once
            materialize(grads)
            resolved(grads)
            roots = [o.root for o in out_leaves if o.root.storage is None and o.root.op != _PLACEHOLDER]
            order = collect(roots)
        _, externals, _ = graph_key(order)
        node_index = {id(n): i for i, n in enumerate(order)}
        self.outputs = []
        keep = 0
        for o in out_leaves:
            strides, offset = o.layout()
            view = None if o.root is o else (o.shape, strides, offset, o.dtype)
            r = o.root
            if id(r) in node_index:
                i = node_index[id(r)]
                keep |= 1 << i
                self.outputs.append(("node", i, view))
            elif r.op == _PLACEHOLDER:
                self.outputs.append(("arg", r.params, view))
            else:
                self.outputs.append(("const", o, None))
        self.plain = all(kind == "node" and view is None for kind, _, view in self.outputs)
        self.order, self.externals, self.keep = order, externals, keep
        self.node_meta = [(n.shape, n.dtype) for n in order]
        # The binding table: the externals (arguments and captured arrays), then the outputs.
        self.captured = []
        self.arg_slots = []
        self.template = []
        for j, r in enumerate(externals):
            if r.op == _PLACEHOLDER:
                self.arg_slots.append((j, r.params))
                self.template.append(None)
            else:
                self.captured.append(r.storage)
                self.template.append(r.storage.buffer)
        self.n_ext = len(externals)
        self.variants = Variants(record(ctx, order, externals, keep, owned=True)) if order else None

    def release(self) -> None:
        if self.variants is not None:
            for rec in self.variants.recs:
                rec.release_scratch(self.ctx)
            self.variants = None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def run(self, leaves: list):
        ctx = self.ctx
        variants = self.variants
        if variants is None:  # nothing to compute: the outputs are arguments or constants
            return _unflatten(self.out_spec, self._outputs(leaves, {}))
        ext = self.template.copy()
        for j, a in self.arg_slots:
            ext[j] = leaves[a].storage.buffer
        rec = variants.pick(ext, MAX_VARIANTS if ctx.is_gpu else 1)
        if rec is None:
            rec = record(ctx, self.order, self.externals, self.keep, owned=True)
            variants.recs.append(rec)
        ctx.throttle()
        take = ctx.buffers.take
        last = rec.last_table
        table = ext + [None] * len(rec.fresh)
        pos = self.n_ext
        for _, bucket, _ in rec.fresh:
            table[pos] = take(bucket, last[pos] if last is not None else None)
            pos += 1
        value = ctx.submitted + 1
        sem = ctx.semaphore
        wait = [(sem, ctx.submitted)] if ctx.submitted > ctx.completed else []
        try:
            ctx.device.queue_execute([rec.cb], wait=wait, signal=[(sem, value)],
                                     binding_tables=[table if table else None])
        except BaseException:
            for (_, bucket, _), buf in zip(rec.fresh, table[self.n_ext:]):
                ctx.buffers.release(buf, bucket)
            raise
        rec.last_table = table
        rec.last_ext = ext
        ctx.submitted = value
        for a in leaves:
            a.storage.fence = value
        for st in self.captured:
            st.fence = value
        for st in rec.captured:
            st.fence = value
        meta = self.node_meta
        roots = {}
        pos = self.n_ext
        for i, bucket, nb in rec.fresh:
            shape, dtype = meta[i]
            roots[i] = new_evaluated(Storage(table[pos], bucket, ctx, value, nb), shape, dtype, ctx)
            pos += 1
        if self.plain:
            outs = [roots[i] for _, i, _ in self.outputs]
        else:
            outs = self._outputs(leaves, roots)
        return _unflatten(self.out_spec, outs)

    def _outputs(self, leaves: list, roots: dict) -> list:
        ctx = self.ctx
        outs = []
        for kind, idx, view in self.outputs:
            if kind == "const":
                outs.append(idx)
                continue
            root = roots[idx] if kind == "node" else leaves[idx]
            if view is None:
                outs.append(root)
            else:
                shape, strides, offset, dt = view
                v = new_evaluated(None, shape, dt, ctx)
                v.base = root
                v.strides = strides
                v.offset = offset
                outs.append(v)
        return outs


_POSITIONAL: dict = {}  # argument count -> the flattened structure of that many positional arrays


def compile(fn):  # noqa: A001 - mirrors mx.compile / jax.jit
    """Trace `fn` once per input signature into a reusable recording; later calls rebind and replay."""
    traced: dict = {}
    stats = {"traces": 0, "calls": 0}

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        stats["calls"] += 1
        if not kwargs:
            # Fast path: positional dense evaluated arrays on one device.
            ctx = None
            sig = []
            for a in args:
                if type(a) is not Array or a.base is not None or a.storage is None:
                    break
                if ctx is None:
                    ctx = a.ctx
                elif a.ctx is not ctx:
                    break
                sig.append(a.shape)
                sig.append(a.dtype)
            else:
                if ctx is not None:
                    entry = traced.get((len(args), id(ctx), *sig))
                    if entry is not None:
                        with ctx.lock:
                            return entry.run(args)
        leaves: list = []
        spec = _flatten((args, kwargs), leaves)
        ctx = None
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
        if ctx is None:
            raise hal.InvalidArgumentError("rt.compile: the function needs at least one array argument")
        if pending:
            from .lowering import evaluate
            evaluate(pending)
        positional = not kwargs and len(leaves) == len(args)
        if positional:
            spec = _POSITIONAL.setdefault(len(args), spec)
            key = (len(args), id(ctx), *[x for a in leaves for x in (a.shape, a.dtype)])
        else:
            key = (spec, id(ctx), *[(a.shape, a.dtype) for a in leaves])
        entry = traced.get(key)
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
