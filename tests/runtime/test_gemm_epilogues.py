"""A training step whose element-wise work folds into its GEMMs (runtime/lowering/epilogues.py), on
every driver: the results are numpy's, and on a GPU with a GEMM library the epilogues ran.

On a CPU driver nothing folds (numpy's BLAS has no epilogues); on cuda the forward GEMM writes the
ReLU mask as bits and the backward GEMMs read it (cuBLASLt's RELU_AUX_BIAS, DRELU_BGRAD, BGRADA).
"""

from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime.device import context_for


def data(seed: int, batch: int, n_in: int, hidden: int, n_out: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    x[:2] = 0  # with the zeroed biases below: pre-activations of exactly 0 (ReLU's kink)
    b1 = (0.1 * rng.standard_normal(hidden)).astype(np.float32)
    b1[:4] = 0
    return [(rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32), b1,
            (rng.standard_normal((hidden, n_out)) / np.sqrt(hidden)).astype(np.float32),
            (0.1 * rng.standard_normal(n_out)).astype(np.float32), x,
            rng.standard_normal((batch, n_out)).astype(np.float32)]


def loss(w1, b1, w2, b2, x, y):
    h = rt.maximum(x @ w1 + b1, 0.0)
    d = h @ w2 + b2 - y
    return (d * d).mean()


def reference(w1, b1, w2, b2, x, y):
    """Loss and gradients in float64; maximum's derivative at 0 is 1 (the runtime's rule)."""
    w1, b1, w2, b2, x, y = (v.astype(np.float64) for v in (w1, b1, w2, b2, x, y))
    z = x @ w1 + b1
    h = np.maximum(z, 0)
    d = h @ w2 + b2 - y
    gd = 2 * d / d.size
    gz = (gd @ w2.T) * (z >= 0)
    return (d * d).mean(), [x.T @ gz, gz.sum(0), h.T @ gd, gd.sum(0)]


def epilogues_run(dev) -> set:
    return {key[1].epilogue for key in context_for(dev).executables if key[0] == "library"}


@pytest.mark.parametrize("shape", [(64, 32, 128, 16), (256, 128, 512, 64)])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_relu_layer_trains_with_its_work_in_the_gemms(dev, shape, compiled):
    arrays = data(1, *shape)
    args = [rt.array(v, device=dev) for v in arrays]
    value_and_grad = rt.value_and_grad(loss, argnums=(0, 1, 2, 3))
    step = rt.compile(value_and_grad) if compiled else value_and_grad
    for _ in range(3):  # fused kernels and folds come with a graph's repeats
        value, grads = step(*args)
        rt.eval(value, *grads)
    want_value, want = reference(*arrays)
    np.testing.assert_allclose(float(value), want_value, rtol=1e-4)
    for got, expected in zip(grads, want):
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-3, atol=1e-4 * scale)
    ctx = context_for(dev)
    if ctx.is_gpu and ctx.device.can_prepare("library"):
        assert {"bias_relu_aux", "drelu_bgrad", "bgrad_b"} <= epilogues_run(dev)
