"""A training step whose element-wise work folds into its GEMMs (runtime/lowering/epilogues.py), on
every driver: the results are numpy's, and on a GPU with a GEMM library the epilogues ran.

On a CPU driver nothing folds (numpy's BLAS has no epilogues); on cuda the forward GEMM writes the
ReLU mask as bits and the backward GEMMs read it (cuBLASLt's RELU_AUX_BIAS, DRELU_BGRAD, BGRADA).
"""

from __future__ import annotations

import numpy as np
import pytest

import hal
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


C, K = np.sqrt(2 / np.pi), 0.044715


def gelu(z):
    return 0.5 * z * (1 + np.tanh(C * (z + K * z ** 3)))


def gelu_derivative(z):
    t = np.tanh(C * (z + K * z ** 3))
    return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * C * (1 + 3 * K * z * z)


ACTIVATIONS = {  # the runtime's, numpy's, its derivative's (maximum's at 0 is 1: the runtime's rule)
    "maximum": (lambda z: rt.maximum(z, 0.0), lambda z: np.maximum(z, 0), lambda z: z >= 0),
    "nn.relu": (rt.nn.relu, lambda z: np.maximum(z, 0), lambda z: z >= 0),
    "nn.gelu": (rt.nn.gelu, gelu, gelu_derivative),
}


def loss_of(activation):
    act = ACTIVATIONS[activation][0]

    def loss(w1, b1, w2, b2, x, y):
        h = act(x @ w1 + b1)
        d = h @ w2 + b2 - y
        return (d * d).mean()

    return loss


def reference(activation, w1, b1, w2, b2, x, y):
    """Loss and gradients in float64."""
    _, act, derivative = ACTIVATIONS[activation]
    w1, b1, w2, b2, x, y = (v.astype(np.float64) for v in (w1, b1, w2, b2, x, y))
    z = x @ w1 + b1
    h = act(z)
    d = h @ w2 + b2 - y
    gd = 2 * d / d.size
    gz = (gd @ w2.T) * derivative(z)
    return (d * d).mean(), [x.T @ gz, gz.sum(0), h.T @ gd, gd.sum(0)]


def epilogues_run(dev) -> set:
    """The epilogues of the GEMMs the device's context has loaded (its other library routines, the
    FFTs and solvers of tests run before on the same device, have none)."""
    return {key[1].epilogue for key in context_for(dev).executables
            if key[0] == "library" and isinstance(key[1], hal.Gemm)}


#: The epilogues a GPU with a GEMM library runs for a layer's training step.
FOLDED = {"maximum": {"bias_relu_aux", "drelu_bgrad", "bgrad_b"}, "nn.relu": {"bias_relu_aux", "drelu_bgrad"},
          "nn.gelu": {"bias_gelu_aux", "dgelu_bgrad", "bgrad_b"}}


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("shape", [(64, 32, 128, 16), (256, 128, 512, 64)])
@pytest.mark.parametrize("compiled", [False, True])
def test_a_layer_trains_with_its_work_in_the_gemms(dev, activation, shape, compiled):
    arrays = data(1, *shape)
    args = [rt.array(v, device=dev) for v in arrays]
    value_and_grad = rt.value_and_grad(loss_of(activation), argnums=(0, 1, 2, 3))
    step = rt.compile(value_and_grad) if compiled else value_and_grad
    for _ in range(3):  # fused kernels and folds come with a graph's repeats
        value, grads = step(*args)
        rt.eval(value, *grads)
    want_value, want = reference(activation, *arrays)
    np.testing.assert_allclose(float(value), want_value, rtol=1e-4)
    for got, expected in zip(grads, want):
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-3, atol=1e-4 * scale)
    ctx = context_for(dev)
    if ctx.is_gpu and ctx.device.can_prepare("library"):
        assert FOLDED[activation] <= epilogues_run(dev)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_nn_activations_and_their_gradients(dev, dtype):
    x = np.concatenate([np.linspace(-6, 6, 61), [0.0, -0.0, np.inf, -np.inf, 1e-30]]).astype(dtype)
    X = rt.array(x, device=dev)
    # (the tanh form cancels in the negative tail: float32 keeps about 1e-7 there, as cuBLASLt's does)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(rt.nn.gelu(X).numpy(), gelu(x.astype(np.float64)), rtol=1e-6,
                                   atol=3e-7 if dtype is np.float32 else 1e-15)
    np.testing.assert_array_equal(rt.nn.relu(X).numpy(), np.maximum(x, 0))
    finite = x[np.isfinite(x)]
    grad = rt.grad(lambda v: rt.nn.gelu(v).sum())(rt.array(finite, device=dev)).numpy()
    np.testing.assert_allclose(grad, gelu_derivative(finite.astype(np.float64)), rtol=1e-5,
                               atol=3e-6 if dtype is np.float32 else 1e-14)
    h = 1e-3 if dtype is np.float32 else 1e-6  # against central differences of the runtime's own gelu
    up = rt.nn.gelu(rt.array(finite + h, device=dev)).numpy().astype(np.float64)
    down = rt.nn.gelu(rt.array(finite - h, device=dev)).numpy().astype(np.float64)
    np.testing.assert_allclose(grad, (up - down) / (2 * h), rtol=2e-2 if dtype is np.float32 else 1e-6, atol=1e-3)
    assert rt.nn.gelu(rt.array([1, 2], device=dev)).dtype in (rt.float32, rt.float64)


def test_gelu_of_complex_values_is_refused(dev):
    import hal

    with pytest.raises(hal.InvalidArgumentError):
        rt.nn.gelu(rt.array(np.ones(3, np.complex64), device=dev))
