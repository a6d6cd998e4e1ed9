"""Element-wise work folded into the GEMM that feeds it (the GEMM libraries' epilogues).

On a GPU whose products run on its GEMM library, one ``hal.Gemm`` dispatch of a matmul node may
compute the values of the nodes around it; those cost no kernel of their own and no pass over
memory, and the values only the dispatch used (the product, a pre-activation) get no buffer:

- ``x @ w + b``, b a vector added to every row: the add (epilogue ``bias``);
- ``maximum(x @ w [+ b], 0)``: the maximum (``relu`` / ``bias_relu``). Where the backward pass
  masks a gradient with ``pre >= 0`` (autodiff's rule for maximum), the dispatch also writes that
  mask, as the library's bits, into the buffer of the mask node (``relu_aux``): the mask node is
  then read by nothing but the folds below;
- ``where(mask, g @ w.T, 0)`` with such a mask: the where (``drelu``), and with the bias
  gradient ``sum(.., axis=0, keepdims=True)`` of it, that sum too (``drelu_bgrad``);
- ``rt.nn.gelu(x @ w [+ b])``: the GELU (``gelu`` / ``bias_gelu``); where the backward pass needs
  the pre-activation (``gelu_grad(g, pre)``), the dispatch also writes it (``gelu_aux``) into the
  pre-activation's own buffer;
- ``gelu_grad(g @ w.T, pre)`` with any such pre-activation: the gradient (``dgelu``), and with its
  column sums, those too (``dgelu_bgrad``);
- ``x.T @ g`` beside ``sum(g, axis=0, keepdims=True)``: the sum (``bgrad_b``), a layer's bias
  gradient computed with its weight gradient.

A fold needs the nodes it swallows to be read by nothing else and not kept past the evaluation,
every operand of the product's dtype, and the product to fit a library dispatch
(``matmul.plan_library``) with the epilogue the device runs: what does not fit keeps its kernels.
A relu fold relies on the value of a constant (the 0), which the recording then guards (``noted``).
"""

from __future__ import annotations

import numpy as np

import hal
from hal import env

from ..kernels import matmul
from ..shapes import broadcast_strides, contiguous_strides
from .layouts import input_layouts

#: RUNTIME_GEMM_EPILOGUES=0: no folds, every node its own kernel (to measure what they save).
ENABLED = env.switch("RUNTIME_GEMM_EPILOGUES", True)


class Fold:
    """One GEMM dispatch computing the values of several nodes.

    product: the matmul node's index (where the dispatch is scheduled); out: the node whose value
    is the GEMM's result; computed: every node whose value the dispatch gives (out included);
    unwritten: the nodes it makes needless (no buffer); reads: nodes it reads besides the
    product's operands (ready before it); noted: the constants it relies on; cmds: its commands.
    """

    __slots__ = ("product", "out", "epilogue", "extra", "computed", "unwritten", "reads", "noted", "mask", "cmds")

    def __init__(self, product: int, out: int, epilogue: str) -> None:
        self.product, self.out, self.epilogue = product, out, epilogue
        self.extra: list = []  # roles after C, A, B: the bias or bias gradient, then the aux
        self.computed: list = [out]
        self.unwritten: list = [product]
        self.reads: list = []
        self.noted: list = []
        self.mask: int | None = None  # the relu mask written (forward) or read (backward)
        self.cmds: list | None = None


class ReadGraph:
    """Who reads whom in the order, and what must outlive the evaluation."""

    def __init__(self, order: list, index: dict, keep: int) -> None:
        self.order, self.index, self.keep = order, index, keep
        self.readers: dict = {}
        for i, node in enumerate(order):
            for inp in node.inputs:
                j = index.get(id(inp.root))
                if j is not None:
                    self.readers.setdefault(j, set()).add(i)

    def kept(self, i: int) -> bool:
        return bool(self.keep >> i & 1)

    def source(self, inp) -> int | None:
        return self.index.get(id(inp.root))


def find(ctx, order: list, index: dict, keep: int | None) -> dict:
    """The folds of an order, by product index, each planned (see the module doc)."""
    if not ENABLED or keep is None or not ctx.is_gpu or not ctx.device.can_prepare("library"):
        return {}
    graph = ReadGraph(order, index, keep)
    forward: dict = {}  # product -> [the fold to try first, its fallback, ...]
    backward: dict = {}  # ReLU's: on a mask a forward fold writes
    gelu_backward: dict = {}  # GELU's: on a pre-activation in memory either way
    for j, node in enumerate(order):
        if node.op == "matmul" and len(node.shape) == 2 and node.dtype.name in matmul.EPILOGUE_DTYPES \
                and not graph.kept(j):
            options = _forward(graph, j)
            if options:
                forward[j] = options
            else:
                fold = _drelu(graph, j)
                if fold is not None:
                    backward[j] = fold
                else:
                    fold = _dgelu(graph, j)
                    if fold is not None:
                        gelu_backward[j] = fold
    # A mask is written as bits only where every reader is a backward fold that runs, and a
    # backward fold runs only on a mask some forward fold writes: settle both together.
    while True:
        written = {options[0].mask: j for j, options in forward.items() if options[0].mask is not None}
        backward = {j: f for j, f in backward.items() if f.mask in written and _planned(ctx, graph, f)}
        folded_readers: dict = {}
        for fold in backward.values():
            folded_readers.setdefault(fold.mask, set()).add(fold.out)
        unread = [j for mask, j in written.items() if graph.readers.get(mask, set()) != folded_readers.get(mask)]
        unplanned = [j for j, options in forward.items() if not _planned(ctx, graph, options[0])]
        if not unread and not unplanned:
            break
        for j in set(unread) | set(unplanned):
            forward[j] = forward[j][1:]
            if not forward[j]:
                del forward[j]
    folds = {j: options[0] for j, options in forward.items()}
    folds.update(backward)
    folds.update((j, fold) for j, fold in gelu_backward.items() if _planned(ctx, graph, fold))
    taken = {i for fold in folds.values() for i in fold.computed}
    for j, node in enumerate(order):
        if j not in folds and node.op == "matmul" and len(node.shape) == 2:  # (its product is its result)
            fold = _bias_gradient_of_b(graph, j, taken)
            if fold is not None and _planned(ctx, graph, fold):
                folds[j] = fold
                taken.update(fold.computed)
    return folds


def _planned(ctx, graph: ReadGraph, fold: Fold) -> bool:
    """Plan ``fold``'s dispatch (once); whether the product fits one with its epilogue."""
    if fold.cmds is None:
        node = graph.order[fold.product]
        fold.cmds = matmul.plan_library(node, input_layouts(node), ctx, epilogue=fold.epilogue, out=fold.out,
                                        extra_roles=fold.extra) or []
    return bool(fold.cmds)


# ---- patterns -----------------------------------------------------------------------------------

def reads_whole(inp, producer, consumer=None) -> bool:
    """Whether ``inp`` reads ``producer`` element for element (same shape, no view in between)."""
    whole = inp is producer or (inp.offset == 0 and inp.shape == producer.shape
                                and (inp.strides is None or inp.strides == contiguous_strides(inp.shape)))
    return whole and (consumer is None or (producer.shape == consumer.shape and producer.dtype == consumer.dtype))


def _zero(inp) -> bool:
    """Whether ``inp`` is a scalar constant equal to 0 (a weak scalar operand's array)."""
    root = inp.root
    value = root.params
    return inp.shape == () and root.storage is not None and isinstance(value, np.ndarray) \
        and value.shape == () and value == 0


def _forward(graph: ReadGraph, j: int) -> list:
    """The folds of product ``j`` and what follows it, the most folded first."""
    order = graph.order
    product = order[j]
    readers = graph.readers.get(j, set())
    pre, pre_index, bias_roles, bias_reads = product, j, [], []
    if len(readers) == 1:
        (i,) = readers
        add = order[i]
        if add.op == "add" and len(add.shape) == 2:
            for side in (0, 1):
                operand, bias = add.inputs[side], add.inputs[1 - side]
                if graph.source(operand) == j and reads_whole(operand, product, add) \
                        and _row_vector(graph, bias, add, j):
                    pre, pre_index = add, i
                    bias_roles = [("root_at", bias.root, bias.offset * add.dtype.itemsize)]
                    source = graph.source(bias)
                    bias_reads = [source] if source is not None else []
                    break
    options = []
    gelu = _gelu_after(graph, pre, pre_index)
    if gelu is not None:
        h, needed = gelu
        prefix = "bias_" if bias_roles else ""
        if needed:  # the backward pass reads the pre-activation: the dispatch writes it too
            fold = Fold(j, h, prefix + "gelu_aux")
            fold.extra = [*bias_roles, ("out", pre_index)]
            fold.computed = [h, pre_index] if pre_index != j else [h]
            fold.unwritten = [] if pre_index == j else [j]
            fold.reads = list(bias_reads)
            options.append(fold)
        else:
            fold = Fold(j, h, prefix + "gelu")
            fold.extra = list(bias_roles)
            if pre_index != j:
                fold.unwritten.append(pre_index)
                fold.computed.append(pre_index)
            fold.reads = list(bias_reads)
            options.append(fold)
    relu = _relu_after(graph, pre, pre_index)
    if relu is not None:
        h, mask, zero = relu
        prefix = "bias_" if bias_roles else ""
        if mask is not None:
            fold = Fold(j, h, prefix + "relu_aux")
            fold.extra = [*bias_roles, ("out", mask)]
            fold.computed, fold.mask = [h, mask], mask
            options.append(_finish(fold, pre_index, bias_reads, zero))
        elif graph.readers.get(pre_index) == {h}:
            options.append(_finish(Fold(j, h, prefix + "relu"), pre_index, bias_reads, zero, bias_roles))
    if bias_roles:
        fold = Fold(j, pre_index, "bias")
        fold.extra, fold.reads = list(bias_roles), list(bias_reads)
        options.append(fold)
    return options


def _finish(fold: Fold, pre_index: int, bias_reads: list, zero, bias_roles: list | None = None) -> Fold:
    if bias_roles is not None:
        fold.extra = list(bias_roles)
    if pre_index != fold.product:
        fold.unwritten.append(pre_index)
        fold.computed.append(pre_index)
    fold.reads = list(bias_reads)
    fold.noted = [zero]
    return fold


def _relu_after(graph: ReadGraph, pre, pre_index: int) -> tuple | None:
    """(the maximum node, the mask node or None, the 0 constant) where ``pre`` feeds
    ``maximum(pre, 0)`` and at most one mask ``pre >= 0`` of its gradient, and nothing else."""
    if graph.kept(pre_index) or pre.dtype.name not in matmul.EPILOGUE_DTYPES:
        return None
    order = graph.order
    h = mask = zero = None
    for i in graph.readers.get(pre_index, ()):
        node = order[i]
        if node.op not in ("maximum", "ge") or len(node.inputs) != 2 or not _zero(node.inputs[1]) \
                or graph.source(node.inputs[0]) != pre_index or not reads_whole(node.inputs[0], pre):
            return None
        if zero is not None and node.inputs[1].root is not zero:
            return None
        zero = node.inputs[1].root
        if node.op == "maximum" and h is None and node.shape == pre.shape and node.dtype == pre.dtype:
            h = i
        elif node.op == "ge" and mask is None and node.shape == pre.shape and not graph.kept(i):
            mask = i
        else:
            return None
    if h is None:
        return None
    if mask is not None:
        m, n = pre.shape
        if hal.Gemm.relu_mask_bytes(m, n) > m * n:  # the bits must fit the mask node's own buffer
            return None
    return h, mask, zero


def _gelu_after(graph: ReadGraph, pre, pre_index: int) -> tuple | None:
    """(the gelu node, whether gradients read ``pre``) where ``pre`` feeds ``gelu(pre)`` and
    otherwise only ``gelu_grad(g, pre)`` nodes."""
    if pre.dtype.name not in matmul.LIBRARY_DTYPES:
        return None
    order = graph.order
    h = None
    needed = graph.kept(pre_index)
    for i in graph.readers.get(pre_index, ()):
        node = order[i]
        if node.op == "gelu" and h is None and reads_whole(node.inputs[0], pre, node):
            h = i
        elif node.op == "gelu_grad" and graph.source(node.inputs[1]) == pre_index \
                and reads_whole(node.inputs[1], pre) and graph.source(node.inputs[0]) != pre_index:
            needed = True
        else:
            return None
    return (h, needed) if h is not None else None


def _dgelu(graph: ReadGraph, j: int) -> Fold | None:
    """``gelu_grad(product, pre)`` [and the column sums of it] of product ``j``: the pre-activation
    is any value of the order in the product's shape (a forward GEMM's aux, or computed)."""
    order = graph.order
    product = order[j]
    readers = graph.readers.get(j, set())
    if len(readers) != 1:
        return None
    (w,) = readers
    node = order[w]
    if node.op != "gelu_grad" or node.shape != product.shape or node.dtype != product.dtype:
        return None
    value, pre = node.inputs
    source = graph.source(pre)
    if graph.source(value) != j or not reads_whole(value, product) or source is None or source == j \
            or not reads_whole(pre, order[source]) or pre.shape != node.shape or pre.dtype != node.dtype:
        return None
    fold = Fold(j, w, "dgelu")
    fold.reads = [source]
    column_sum = _column_sum(graph, w, node)
    if column_sum is not None:
        fold.epilogue = "dgelu_bgrad"
        fold.extra = [("out", column_sum)]
        fold.computed.append(column_sum)
    fold.extra.append(("root", order[source]))
    return fold


def _drelu(graph: ReadGraph, j: int) -> Fold | None:
    """``where(mask, product, 0)`` [and the column sums of it] of product ``j``, the mask one a
    forward fold may write."""
    order = graph.order
    product = order[j]
    readers = graph.readers.get(j, set())
    if len(readers) != 1:
        return None
    (w,) = readers
    node = order[w]
    if node.op != "where" or graph.kept(j) or node.shape != product.shape or node.dtype != product.dtype:
        return None
    cond, value, other = node.inputs
    mask = graph.source(cond)
    if mask is None or order[mask].op != "ge" or not reads_whole(cond, order[mask]) or cond.shape != node.shape \
            or graph.source(value) != j or not reads_whole(value, product) or not _zero(other):
        return None
    fold = Fold(j, w, "drelu")
    fold.mask = mask
    fold.reads = [mask]
    fold.noted = [other.root]
    column_sum = _column_sum(graph, w, node)
    if column_sum is not None:
        fold.epilogue = "drelu_bgrad"
        fold.extra = [("out", column_sum)]
        fold.computed.append(column_sum)
    fold.extra.append(("root", order[mask]))
    return fold


def _column_sum(graph: ReadGraph, i: int, matrix, taken: set = frozenset()) -> int | None:
    """A node summing ``matrix`` (node ``i``) over its rows, keeping the axis, in its dtype."""
    for r in sorted(graph.readers.get(i, ())):
        node = graph.order[r]
        if node.op == "sum" and node.params == ((0,), True) and node.dtype == matrix.dtype and r not in taken \
                and node.shape == (1, matrix.shape[1]) and reads_whole(node.inputs[0], matrix):
            return r
    return None


def _bias_gradient_of_b(graph: ReadGraph, j: int, taken: set) -> Fold | None:
    """``x.T @ g`` of product ``j`` beside the column sums of g (a node of the order read whole as B)."""
    product = graph.order[j]
    b = product.inputs[1]
    g = graph.source(b)
    if g is None or not reads_whole(b, graph.order[g]) or graph.order[g].dtype != product.dtype \
            or len(b.shape) != 2:
        return None
    column_sum = _column_sum(graph, g, graph.order[g], taken)
    if column_sum is None or any(r < j for r in graph.readers.get(column_sum, ())):
        return None  # (a sum before the product in the order is placed with it: nothing may read it before)
    fold = Fold(j, j, "bgrad_b")
    fold.unwritten = []
    fold.extra = [("out", column_sum)]
    fold.computed = [j, column_sum]
    return fold


def _row_vector(graph: ReadGraph, bias, consumer, product_index: int) -> bool:
    """Whether ``bias`` is one contiguous vector added to every row, ready before the product."""
    if bias.dtype != consumer.dtype:
        return False
    strides = bias.strides if bias.strides is not None else contiguous_strides(bias.shape)
    if broadcast_strides(bias.shape, strides, consumer.shape) != (0, 1) or consumer.shape[1] < 2:
        return False
    source = graph.source(bias)
    return source is None or source < product_index
