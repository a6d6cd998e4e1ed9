"""rt.compile: trace a function once per input signature, then replay its recording.

The first call for a (shapes, dtypes, device) signature runs `fn` on
placeholder arrays, which builds the op graph, and records it into one
reusable command buffer. Later calls skip Python graph building: one
dictionary look-up, a binding table of the arguments' buffers (in argument
order, then captured arrays) and the outputs' buffers (values that never
leave the function live in buffers the recording owns), one submission
(`lowering.execute.submit`, shared with evals; while earlier work runs, replays are
queued and handed to the device several to a submission), and one Storage and
Array per output. A recording keeps the outputs of its last replay: when nothing
else references them any more (the usual `w, loss = step(w, ...)` loop), the
next replay writes the same buffers and hands out the same arrays again, with
no buffer-cache traffic and no new objects.
A signature keeps up to MAX_VARIANTS recordings, each replayed with its own
unchanged table: a loop `w = step(w)` alternates between two buffers, and
each recording sees the same two every time, so the driver launches its graph
without patching it.

A call whose arguments are being differentiated (value_and_grad's inputs, or
arrays computed from them) or traced (a compiled function called inside
another's trace) runs `fn` itself on them: its ops join the caller's graph, so
gradients flow through it, as jax.jit's functions are traced through by grad.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import ParamSpec, Protocol, TypeVar, cast

import hal
from hal import env, interrupts, tracing

from .array import Array
from .autodiff import GRAD, materialize, resolved
from .device import Storage
from .errors import InvalidTypeError
from .graph import PLACEHOLDER, merge_checks, new_evaluated, new_node
from .lowering.evaluate import evaluate
from .lowering.execute import MAX_VARIANTS, Variants, held_free, hold, replay_held, submit
from .lowering.key import collect, graph_key
from .lowering.record import record
from .ops import contiguous
from .trees import check_result, flatten, unflatten

#: Output bytes up to which a compiled function's recording keeps its outputs for its next replay
#: (lowering.execute.hold): a replay whose previous outputs were dropped then hands the same arrays out
#: again, without taking buffers from the cache, giving them back or making a Storage and an Array
#: each (~300 bytecodes a step of two outputs). The kept buffers stay out of the cache until the
#: next replay or until the function's cache is cleared; above this size the step's own work
#: dwarfs that bookkeeping.
HOLD_BYTES = env.integer("RUNTIME_COMPILE_HOLD_BYTES", 16 << 20, minimum=0)


class _Traced:
    """One signature's recordings and how to bind its inputs and make its outputs."""

    __slots__ = ("ctx", "variants", "order", "externals", "keep", "arg_index", "all_args", "captured",
                 "captured_buffers", "out_spec", "outputs", "made", "plain", "hold", "structure", "checked")

    def __init__(self, fn, args: list, kwargs: dict, ctx) -> None:
        self.ctx = ctx
        leaves: list = []
        spec_in = flatten((tuple(args), kwargs), leaves)
        placeholders = [new_node(PLACEHOLDER, (), i, a.shape, a.dtype, a.ctx) for i, a in enumerate(leaves)]
        t_args, t_kwargs = unflatten(spec_in, placeholders)
        result = fn(*t_args, **t_kwargs)
        out_leaves: list = []
        self.out_spec = flatten(result, out_leaves)
        check_result(self.out_spec)
        roots = [o.root for o in out_leaves if o.root.storage is None and o.root.op != PLACEHOLDER]
        order = collect(roots)
        grads = [n for n in order if n.op == GRAD]
        if grads:  # the trace is recorded once per binding-table variant: build backward graphs once
            materialize(grads)
            resolved(grads)
            roots = [o.root for o in out_leaves if o.root.storage is None and o.root.op != PLACEHOLDER]
            order = collect(roots)
        _, found, _ = graph_key(order)
        # Table order: the arguments the graph reads, in argument order, then captured arrays.
        args_read = sorted((r for r in found if r.op == PLACEHOLDER), key=lambda r: r.params)
        captured = [r for r in found if r.op != PLACEHOLDER]
        externals = args_read + captured
        self.arg_index = [r.params for r in args_read]
        self.all_args = self.arg_index == list(range(len(leaves)))
        self.captured = [r.storage for r in captured]  # (kept alive with the trace)
        self.captured_buffers = [st.buffer for st in self.captured]
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
            elif r.op == PLACEHOLDER:
                self.outputs.append(("arg", r.params, view))
            else:
                self.outputs.append(("const", o, None))
        # Outputs that depend on checked gathers (graph.Node.checks): their status words are outputs too,
        # handed to each replay's outputs as their checks; per output, (position, the status words: a
        # node index, or an evaluated array captured with its check).
        self.checked = []
        for pos, o in enumerate(out_leaves):
            if o.checks is not None:
                words = tuple(node_index.get(id(w), w) for w in o.checks)
                for w in words:
                    if type(w) is int:
                        keep |= 1 << w
                self.checked.append((pos, words))
        self.order, self.externals, self.keep = order, externals, keep
        self.variants = Variants(record(ctx, order, externals, keep, owned=True)) if order else None
        # Outputs that are each a distinct node's whole buffer (the usual case) are made straight
        # from the table: per output (table position, bucket, bytes, shape, dtype).
        nodes = [i for kind, i, _ in self.outputs if kind == "node"]
        self.plain = (self.variants is not None and not self.checked
                      and len(nodes) == len(self.outputs) == len(set(nodes))
                      and all(view is None for _, _, view in self.outputs))
        self.made = []
        if self.variants is not None:
            rec = self.variants.recs[0]
            pos_of = {i: (pos, bucket, nb) for pos, (i, bucket, nb) in enumerate(rec.fresh, rec.n_ext)}
            self.made = [(*pos_of[i], order[i].shape, order[i].dtype) for i in nodes] if self.plain else []
        # (Its recordings own every scratch buffer: the table holds inputs and outputs only.)
        self.hold = self.plain and sum(nb for _, _, nb, _, _ in self.made) <= HOLD_BYTES
        spec = self.out_spec
        # The result from the list of output leaves, as one call (C-level for a tuple or one leaf).
        if spec == 0:
            self.structure = itemgetter(0)
        elif isinstance(spec, tuple) and spec[0] == "t" and spec[1] == tuple(range(len(out_leaves))):
            self.structure = tuple
        else:
            self.structure = functools.partial(unflatten, spec)

    def release(self) -> None:
        if self.variants is not None:
            for rec in self.variants.recs:
                rec.release_scratch(self.ctx)
                rec.held = rec.held_outs = rec.held_storages = None
            self.variants = None

    def __del__(self) -> None:
        try:
            self.release()
        except KeyboardInterrupt:
            interrupts.redeliver()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def run(self, leaves):
        """Bind `leaves` (evaluated dense arrays) and replay; AttributeError if one is pending."""
        ctx = self.ctx
        if self.all_args:
            ext = list(map(_buffer_of, leaves))
        else:
            ext = [leaves[i].storage.buffer for i in self.arg_index]
        if self.captured_buffers:
            ext += self.captured_buffers
        checks = None  # arguments computed by checked gathers: every output depends on their checks
        for a in leaves:
            if a.checks is not None:
                checks = a.checks if checks is None else merge_checks(checks, a.checks)
        variants = self.variants
        if variants is None:  # nothing to compute: the outputs are arguments or constants
            return self.structure(self._outputs(leaves, {}, 0))
        # The usual call: the recording that last ran with these very buffers, its outputs dropped
        # since (the same arrays serve again), found with one look-up instead of `pick`.
        rec = variants.by_ext.get(tuple(ext))
        if rec is not None and rec.held is not None and rec.last_ext == ext and held_free(rec):
            return self._again(ctx, rec, ext, checks)
        rec = variants.pick(ext, MAX_VARIANTS, ctx.buffers)
        if rec is None:
            rec = record(ctx, self.order, self.externals, self.keep, owned=True)
            variants.recs.append(rec)
        try:
            held = rec.held
            if held is not None:
                if held_free(rec):
                    return self._again(ctx, rec, ext, checks)
                # Some are still in use: let go of them (those dropped give their buffers back to the
                # cache, where this submission takes them again).
                rec.held = rec.held_outs = rec.held_storages = None
            if tracing.ENABLED:
                table, value = tracing.call("rt.replay", submit, ctx, rec, ext, category="runtime",
                                            compiled=True)
            else:
                table, value = submit(ctx, rec, ext)
        finally:  # the recordings by the buffers they last ran with (only recordings still kept)
            variants.by_ext = {tuple(r.last_ext): r for r in variants.recs if r.last_ext is not None}
        if self.plain:
            outs = [new_evaluated(shape, dtype, ctx, Storage(table[pos], bucket, ctx, value, nb))
                    for pos, bucket, nb, shape, dtype in self.made]
            if self.hold:
                hold(rec, outs, table)
        else:
            roots = {}
            for pos, (i, bucket, nb) in enumerate(rec.fresh, rec.n_ext):
                node = self.order[i]
                roots[i] = new_evaluated(node.shape, node.dtype, ctx, Storage(table[pos], bucket, ctx, value, nb))
            outs = self._outputs(leaves, roots, value)
            for pos, words in self.checked:
                outs[pos].checks = tuple(roots[w] if type(w) is int else w for w in words)
        if checks is not None:
            for out in outs:
                out.checks = checks if out.checks is None else merge_checks(out.checks, checks)
        return self.structure(outs)

    def _again(self, ctx, rec, ext: list, checks: tuple | None):
        """Replay `rec` with its held outputs, which nothing else references (lowering.execute.held_free):
        the same arrays and buffers serve again, marked ready at the new value."""
        if tracing.ENABLED:
            value = tracing.call("rt.replay", replay_held, ctx, rec, ext, category="runtime", compiled=True)
        else:
            value = replay_held(ctx, rec, ext)
        sem = ctx.semaphore  # (a new timeline after a failure)
        for st in rec.held_storages:
            st.ready = value
            st.sem = sem
        outs = rec.held_outs
        if checks is not None or (outs and outs[0].checks is not None):  # (the last replay's are stale)
            for out in outs:
                out.checks = checks
        return self.structure(outs)

    def _outputs(self, leaves: list, roots: dict, value: int) -> list:
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
                v = new_evaluated(shape, dt, ctx)
                v.base = root
                v.strides = strides
                v.offset = offset
                outs.append(v)
        return outs


_signature = attrgetter("shape", "dtype", "ctx", "base")  # base: None for the dense roots the fast path takes
_buffer_of = attrgetter("storage.buffer")  # AttributeError for a pending argument (storage None)


P = ParamSpec("P")
R = TypeVar("R")


class Compiled(Protocol[P, R]):
    """What ``rt.compile(fn)`` returns: a function called as `fn` is, with ``stats`` (traces and calls
    counted) and ``cache_clear()`` (every traced signature dropped)."""

    stats: dict[str, int]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...

    def cache_clear(self) -> None: ...


def compile(fn: Callable[P, R]) -> Compiled[P, R]:  # noqa: A001 - mirrors mx.compile / jax.jit
    """Trace `fn` once per input signature into a reusable recording; later calls rebind and replay."""
    if not callable(fn):
        raise InvalidTypeError(f"rt.compile takes a function, got {type(fn).__name__}")
    traced: dict = {}
    stats = {"traces": 0, "calls": 0}

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        stats["calls"] += 1
        if not kwargs:
            # Fast path: positional evaluated dense arrays whose signature was traced before.
            try:
                entry = traced.get(tuple(map(_signature, args)))
            except (AttributeError, TypeError):  # not all arrays, or a view (unhashable key)
                entry = None
            if entry is not None:
                with entry.ctx.lock:
                    try:
                        return entry.run(args)
                    except AttributeError:  # an argument is still pending: the general path evaluates it
                        pass
        leaves: list = []
        spec = flatten((args, kwargs), leaves)
        ctx = None
        for a in leaves:
            if ctx is None:
                ctx = a.ctx
            elif a.ctx is not ctx:
                raise hal.InvalidArgumentError("rt.compile: all array arguments must be on one device")
        if ctx is None:
            raise hal.InvalidArgumentError("rt.compile: the function needs at least one array argument")
        if _traced_through(leaves):
            return fn(*args, **kwargs)
        pending = []
        for i, a in enumerate(leaves):
            if a.root is not a:
                a = leaves[i] = _dense(a)
            if a.storage is None:
                pending.append(a)
        if pending:
            evaluate(pending)
        if not kwargs and len(leaves) == len(args):
            key = tuple(map(_signature, leaves))
        else:
            key = (spec, *[(a.shape, a.dtype, a.ctx) for a in leaves])
        try:
            entry = traced.get(key)
        except TypeError:
            raise hal.InvalidArgumentError(
                "rt.compile: arguments other than arrays are part of the signature and must be hashable "
                "(pass numpy data through rt.array)") from None
        if entry is None:
            with ctx.lock:
                t_args, t_kwargs = unflatten(spec, leaves)
                entry = _Traced(fn, list(t_args), t_kwargs, ctx)
            traced[key] = entry
            stats["traces"] += 1
        with ctx.lock:
            return entry.run(leaves)

    wrapped.stats = stats  # type: ignore[attr-defined]
    wrapped.cache_clear = traced.clear  # type: ignore[attr-defined]
    return cast("Compiled[P, R]", wrapped)


def _traced_through(leaves: list) -> bool:
    """Whether an argument reads a differentiated input (an alias from value_and_grad, or a grad
    node) or a placeholder of an enclosing trace: then the call must stay part of that graph."""
    stack = [a for a in leaves if a.storage is None or a.base is not None]
    seen = set()
    while stack:
        a = stack.pop()
        if id(a) in seen:
            continue
        seen.add(id(a))
        if a.op in ("alias", GRAD, PLACEHOLDER):
            return True
        stack.extend(x for x in a.inputs if x.storage is None or x.base is not None)
    return False


def _dense(a: Array) -> Array:
    return contiguous(a)
