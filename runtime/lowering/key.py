"""The key stage: the pending graph behind an eval's targets, in dependency order, and its key.

The key describes the graph's topology (ops, params, shapes, dtypes, the views inputs are read
through, which inputs are external) so that equal keys are equal graphs with their external inputs
in the same slots: the graph cache maps a key to the recordings that compute it. With the live
mask (``live_mask``), it also says which nodes may be read after the eval.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import chain, compress, repeat
from itertools import count as counter
from operator import attrgetter, is_, is_not, itemgetter, sub
from sys import getrefcount

from ..graph import PLACEHOLDER


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


def collect_key(targets: list, direct: list | None = None) -> tuple[list, tuple, list, set]:
    """The pending graph behind `targets` and its key: (order, key, externals, nodes read through views).

    One walk numbers every pending root node in depth-first post-order (`order`), every external input
    (evaluated arrays and placeholders) in the order it meets them (their slots), and every view an
    input is read through, view by view from its root, all in one map of references: a node's index,
    an external's ``(-1 - slot, dtype, shape)``, a view's ``("v", number)``. The key holds each node's
    op, params, shape, dtype and its inputs' references, and the views (op, params, layout, source),
    so that it also determines the backward graph of any grad node (which reads of a differentiated
    input go through its alias is part of the structure). Equal keys are equal graphs with their
    externals in the same slots. With `direct` (an empty list), it receives per node how many of its
    consumers' inputs are the node itself (see live_mask). Arrays are the map's keys themselves: they
    hash by identity and a dict tests identity before equality (elementwise ``__eq__`` is never reached).

    The walk recurses (each node and each input visited once); a graph deeper than the interpreter's
    recursion allows is walked again with an explicit stack, which numbers nodes in the same order and
    views and externals as it meets them (always the same way for the same structure).
    """
    try:
        walk = _walk_recursive(targets)
    except RecursionError:
        walk = _walk_iterative(targets)
    if direct is not None:
        direct_reads(walk.parts, direct)
    return walk.order, (tuple(walk.parts), tuple(walk.views)), walk.externals, walk.viewed


_inputs_of_part = itemgetter(4)
#: Walks of at most this many nodes count their reads by scanning (quadratic, but all in C).
COUNT_BY_SCAN = 64


def direct_reads(parts: list, direct: list) -> None:
    """Append to `direct`, per node of a walk, how many of its consumers' inputs are the node itself:
    the int references in the parts' inputs (externals and views are tuples), counted in C."""
    n = len(parts)
    if n == 1:  # (one node: nothing in the walk reads it)
        direct.append(0)
        return
    refs = list(chain.from_iterable(map(_inputs_of_part, parts)))
    if n <= COUNT_BY_SCAN:  # a scan of the references per node, in C, costs less than a Counter's setup
        direct.extend(map(refs.count, range(n)))
    else:
        reads = Counter(refs)
        direct.extend(map(reads.__getitem__, range(n)))


class _Walk:
    """What a walk found so far (see collect_key)."""

    __slots__ = ("order", "parts", "refs", "externals", "views", "viewed")

    def __init__(self) -> None:
        self.order: list = []
        self.parts: list = []
        self.refs: dict = {}
        self.externals: list = []
        self.views: list = []
        self.viewed: set = set()

    def external(self, r) -> tuple:
        """The reference of an external input, numbered on first sight."""
        ref = self.refs.get(r)
        if ref is None:
            externals = self.externals
            ref = self.refs[r] = (-1 - len(externals), r.dtype, r.shape)
            externals.append(r)
        return ref

    def view(self, v, root_ref) -> tuple:
        """The reference of view `v`: the views from the root (whose reference is `root_ref`) to `v`,
        each numbered on first sight."""
        refs = self.refs
        chain = []
        while v.base is not None and v not in refs:
            chain.append(v)
            v = v.inputs[0] if v.inputs else v.base
        src = refs[v] if v.base is not None else root_ref
        if type(src) is int:
            self.viewed.add(src)
        views = self.views
        for w in reversed(chain):
            views.append((w.op, w.params, w.shape, w.strides, w.offset, src))
            src = refs[w] = ("v", len(views) - 1)
        return src


def _walk_recursive(targets: list) -> _Walk:
    walk = _Walk()
    order, parts, refs, externals = walk.order, walk.parts, walk.refs, walk.externals

    def visit(node):
        """Number `node` after every pending node it reads from; its index."""
        ins = []
        for inp in node.inputs:
            ref = refs.get(inp)
            if ref is None:
                r = inp.base
                if r is not None:  # a view: its root first, if pending
                    if r not in refs:
                        if r.storage is None and r.op != PLACEHOLDER:
                            visit(r)
                        else:
                            walk.external(r)
                    ins.append(walk.view(inp, refs[r]))
                    continue
                if inp.storage is not None or inp.op == PLACEHOLDER:  # (walk.external, without the call)
                    ref = refs[inp] = (-1 - len(externals), inp.dtype, inp.shape)
                    externals.append(inp)
                    ins.append(ref)
                    continue
                ref = visit(inp)
            ins.append(ref)
        j = refs[node] = len(order)
        order.append(node)
        parts.append((node.op, node.params, node.shape, node.dtype, tuple(ins)))
        return j

    try:
        for target in targets:
            if target not in refs:
                visit(target)
    finally:
        # visit refers to itself through its closure cell: the cycle would keep every node of the
        # walk referenced (refs) until the garbage collector ran, and live_mask would read those
        # references as consumers holding them.
        visit = None  # noqa: F841
    return walk


def _walk_iterative(targets: list) -> _Walk:
    """_walk_recursive with an explicit stack, for graphs deeper than recursion allows."""
    walk = _Walk()
    order, parts, refs = walk.order, walk.parts, walk.refs
    stack = [(t, False) for t in reversed(targets)]
    push, pop = stack.append, stack.pop
    while stack:
        node, expanded = pop()
        if node in refs:
            continue
        if not expanded:
            push((node, True))
            for inp in reversed(node.inputs):
                r = inp.base
                if r is None:
                    r = inp
                if r.storage is None and r.op != PLACEHOLDER and r not in refs:
                    push((r, False))
            continue
        ins = []
        for inp in node.inputs:  # every pending root it reads is numbered by now
            r = inp.base
            if r is None:
                ref = refs[inp] if inp in refs else walk.external(inp)
            else:
                ref = walk.view(inp, refs[r] if r in refs else walk.external(r))
            ins.append(ref)
        refs[node] = len(order)
        order.append(node)
        parts.append((node.op, node.params, node.shape, node.dtype, tuple(ins)))
    return walk


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


_base_of = attrgetter("base")
_storage_of = attrgetter("storage")
_dtype_of = attrgetter("dtype")
_shape_of = attrgetter("shape")


def one_node_key(node) -> tuple | None:
    """collect_key's (order, key, externals) of the graph of `node` alone, when every input of `node`
    is an external root (evaluated, or a placeholder) read as itself: an eager single op. None for
    any other graph (an input pending or read through a view), which the walk keys. The same key as
    the walk's, built without it: for one or two inputs (nearly every eager op) spelled out, for more
    its per-input work in C (no input's truth value or ``==`` is asked: arrays compare elementwise)."""
    inputs = node.inputs
    n = len(inputs)
    if n == 2:
        a, b = inputs
        if a.base is not None or b.base is not None or (a.storage is None and a.op != PLACEHOLDER) or \
                (b.storage is None and b.op != PLACEHOLDER):
            return None
        if a is b:
            ins: tuple = ((-1, a.dtype, a.shape), (-1, a.dtype, a.shape))
            externals = [a]
        else:
            ins = ((-1, a.dtype, a.shape), (-2, b.dtype, b.shape))
            externals = [a, b]
        return [node], (((node.op, node.params, node.shape, node.dtype, ins),), ()), externals
    if n == 1:
        a = inputs[0]
        if a.base is not None or (a.storage is None and a.op != PLACEHOLDER):
            return None
        return [node], (((node.op, node.params, node.shape, node.dtype, ((-1, a.dtype, a.shape),)),), ()), [a]
    if not all(map(is_, map(_base_of, inputs), repeat(None))):
        return None
    if not all(map(is_not, map(_storage_of, inputs), repeat(None))) and \
            any(inp.storage is None and inp.op != PLACEHOLDER for inp in inputs):
        return None  # (a pending input; placeholders are external)
    ids = list(map(id, inputs))
    if len(set(ids)) == len(ids):
        externals = list(inputs)
        slots: Iterable[int] = range(-1, -1 - len(ids), -1)
    else:  # an input read twice (a + a): one slot, numbered on first sight
        first: dict[int, int] = {}
        for i in ids:
            first.setdefault(i, len(first))
        externals = list({id(inp): inp for inp in inputs}.values())
        slots = [-1 - first[i] for i in ids]
    ins = tuple(zip(slots, map(_dtype_of, inputs), map(_shape_of, inputs)))
    return [node], (((node.op, node.params, node.shape, node.dtype, ins),), ()), externals


def eval_key(targets: list, live: bool) -> tuple:
    """(order, key, externals, keep) of the pending graph behind `targets`: collect_key's order, key and
    externals, and with `live` live_mask's bits (else None). One target whose inputs are all external
    (``one_node_key``) is keyed without the walk; it is live (the list of targets holds it)."""
    if len(targets) == 1:
        one = one_node_key(targets[0])
        if one is not None:
            return (*one, 1 if live else None)
    if not live:
        order, key, externals, _ = collect_key(targets)
        return order, key, externals, None
    direct: list = []
    order, key, externals, viewed = collect_key(targets, direct)
    return order, key, externals, live_mask(order, direct, viewed) if order else None
