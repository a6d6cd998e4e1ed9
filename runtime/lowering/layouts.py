"""How a kernel plan reads an operand: its element strides, and (shape, strides, offset) layouts."""

from __future__ import annotations

from ..shapes import contiguous_strides


def strides_of(inp) -> tuple:
    """The element strides of ``inp``: a view's own, else those of its dense shape."""
    return inp.strides if inp.strides is not None else contiguous_strides(inp.shape)


def input_layouts(node) -> list:
    """(shape, strides, offset) of each input of ``node``, as the kernels' plans take them."""
    return [(inp.shape, strides_of(inp), inp.offset) for inp in node.inputs]
