"""Activation functions of neural networks (``rt.nn``), as ``jax.nn`` and ``torch.nn.functional`` offer them.

Each is an element-wise op like the others (fused into its neighbours' kernels, differentiable);
after a product on a GPU with a GEMM library, they run inside the product's GEMM
(``runtime/lowering/epilogues.py``), forward and backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import ops

if TYPE_CHECKING:
    from .array import Array
    from .ops import ArrayLike

__all__ = ["gelu", "relu"]


def relu(x: ArrayLike) -> Array:
    """``maximum(x, 0)``; its derivative at 0 is 1 (the runtime's rule for ``maximum``)."""
    return ops.maximum(x, 0)


def gelu(x: ArrayLike) -> Array:
    """GELU in its tanh form, ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``: ``jax.nn.gelu``'s
    default and PyTorch's ``gelu(approximate="tanh")``, the form cuBLASLt's epilogues compute.
    Floating-point arrays only (an integer array is computed in the default float type)."""
    return ops.unary("gelu", x)
