"""The key stage: the pending graph behind an eval's targets, in dependency order, and its key.

The key describes the graph's topology (ops, params, shapes, dtypes, the views inputs are read
through, which inputs are external) so that equal keys are equal graphs with their external inputs
in the same slots: the graph cache maps a key to the recordings that compute it. With the live
mask (``live_mask``), it also says which nodes may be read after the eval.
"""

from __future__ import annotations

from itertools import compress
from itertools import count as counter
from operator import sub
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


def eval_key(targets: list, live: bool) -> tuple:
    """(order, key, externals, keep) of the pending graph behind `targets`: collect_key's order, key and
    externals, and with `live` live_mask's bits (else None)."""
    if not live:
        order, key, externals, _ = collect_key(targets)
        return order, key, externals, None
    direct: list = []
    order, key, externals, viewed = collect_key(targets, direct)
    return order, key, externals, live_mask(order, direct, viewed) if order else None
