"""Elementwise work folded into the gather that feeds it (``kernels/take_epilogue.py``).

On a GPU, a ``take`` whose value is read by one elementwise op alone (``take_epilogue.OPS``), whole,
with one other operand of the same float dtype, is computed with that op in one kernel: an embedding
lookup plus positions (``rt.take(table, ids, axis=0) + pos``), gathered rows scaled or masked. The
take's value gets no buffer, as the product's of a GEMM epilogue (``epilogues.py``), whose ``Fold``
this is: placed where the op is (its product and out), computing the take too (placed with it, as
a GEMM's early nodes are), reading the take's inputs and the other operand.

Not folded: a take that is kept or read elsewhere (its values must exist), a broadcast of the take's
value (the op's shape must be the take's), and integer, bool or complex values.
"""

from __future__ import annotations

from hal import env

from ..kernels import take_epilogue
from ..shapes import broadcast_strides
from .epilogues import Fold, ReadGraph, reads_whole
from .layouts import input_layouts, strides_of

#: RUNTIME_GATHER_FOLDS=0: no folds, the take and the op each their own kernel (to measure what they save).
ENABLED = env.switch("RUNTIME_GATHER_FOLDS", True)


def find(ctx, order: list, index: dict, keep: int | None, taken: set) -> dict:
    """The folds of takes into their reader, by the reader's index. ``taken``: the nodes other folds
    compute, to which those of these folds are added."""
    if not ENABLED or keep is None or not ctx.is_gpu:
        return {}
    graph = ReadGraph(order, index, keep)
    folds: dict = {}
    for t, node in enumerate(order):
        if node.op != "take" or t in taken or graph.kept(t) or not node.dtype.is_float or node.dtype.is_complex:
            continue
        readers = graph.readers.get(t, ())
        if len(readers) != 1:
            continue
        (i,) = readers
        user = order[i]
        if user.op not in take_epilogue.OPS or len(user.inputs) != 2 or i in taken or user.dtype is not node.dtype:
            continue
        sides = [k for k, inp in enumerate(user.inputs) if graph.source(inp) == t]
        if len(sides) != 1 or not reads_whole(user.inputs[sides[0]], node, user):
            continue
        other = user.inputs[1 - sides[0]]
        if other.dtype is not node.dtype or user.params is not node.dtype:
            continue
        cmds = take_epilogue.plan(node, input_layouts(node), user, i, sides[0],
                                  (broadcast_strides(other.shape, strides_of(other), user.shape), other.offset,
                                   other.root))
        if cmds is None:
            continue
        fold = Fold(i, i, "take")
        fold.cmds = cmds
        fold.computed.append(t)
        fold.unwritten = [t]
        fold.reads = sorted({j for j in map(graph.source, (*node.inputs, other)) if j is not None})
        folds[i] = fold
        taken.update((t, i))
    return folds
