"""Bias adds folded into the GEMM that feeds them (the GEMM libraries' bias epilogue).

``x @ w + b`` is a matmul node read by one add node whose other operand is a vector broadcast
along the rows. On a GPU whose products run on its GEMM library, the scheduler computes the add's
value with one ``hal.Gemm(epilogue="bias")`` dispatch: the product is never written to memory and
read back (a pass over the output saved, one kernel less). The matmul node then has no unit and
no buffer of its own (``bias_folds`` finds them, ``plan_folded`` plans them).

A fold needs the product to be read by the add alone and not kept past the evaluation, the bias
to be ready before the product (computed earlier or an input), both of the product's dtype, and
the product to fit a library dispatch (``matmul.plan_library``).
"""

from __future__ import annotations

from ..kernels import matmul
from ..shapes import broadcast_strides, contiguous_strides


def bias_folds(ctx, order: list, index: dict, keep: int | None) -> dict:
    """matmul node index -> (add node index, the bias input) for each bias add to fold."""
    if keep is None or not ctx.is_gpu or not ctx.device.can_prepare("library"):
        return {}
    readers: dict = {}
    for i, node in enumerate(order):
        for inp in node.inputs:
            j = index.get(id(inp.root))
            if j is not None:
                readers.setdefault(j, set()).add(i)
    folds = {}
    for i, node in enumerate(order):
        if node.op != "add" or len(node.shape) != 2:
            continue
        for side in (0, 1):
            product, bias = node.inputs[side], node.inputs[1 - side]
            j = index.get(id(product.root))
            if j is None or j in folds or order[j].op != "matmul" or readers.get(j) != {i} or keep >> j & 1:
                continue
            if _reads_whole(product, order[j], node) and _row_vector(bias, node, index, j):
                folds[j] = (i, bias)
                break
    return folds


def _reads_whole(inp, producer, consumer) -> bool:
    """Whether the add reads the product element for element (same shape, no view in between)."""
    return (inp is producer or (inp.offset == 0 and inp.shape == producer.shape
                                and (inp.strides is None or inp.strides == contiguous_strides(inp.shape)))) \
        and producer.shape == consumer.shape and producer.dtype == consumer.dtype \
        and producer.dtype.name in matmul.LIBRARY_DTYPES


def _row_vector(bias, consumer, index: dict, product_index: int) -> bool:
    """Whether ``bias`` is one contiguous vector added to every row, ready before the product."""
    if bias.dtype != consumer.dtype:
        return False
    strides = bias.strides if bias.strides is not None else contiguous_strides(bias.shape)
    if broadcast_strides(bias.shape, strides, consumer.shape) != (0, 1) or consumer.shape[1] < 2:
        return False
    source = index.get(id(bias.root))
    return source is None or source < product_index


def plan_folded(ctx, product, layouts: list, add_index: int, bias) -> list | None:
    """The commands computing the add's value with the bias epilogue, or None when the product
    does not fit a library dispatch."""
    return matmul.plan_library(product, layouts, ctx, bias=(add_index, bias.root, bias.offset))
