"""The runtime's matmul on a GPU's GEMM library (hal.Gemm dispatches), and on its own kernels without one.

Runs the GPU path on the simulated GPU (tests/drivers/fake_gpu.py: library routines through their
numpy references) with the runtime's other CUDA C kernels emulated on the CPU (cuda_emu).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

cuda_emu = pytest.importorskip("cuda_emu")
if cuda_emu.GXX is None:
    pytest.skip("g++ is needed to emulate the CUDA kernels", allow_module_level=True)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
fake_gpu = pytest.importorskip("drivers.fake_gpu")

import hal  # noqa: E402
import runtime as rt  # noqa: E402
from runtime.device import context_for  # noqa: E402


def gpu_device(mode: str, libraries: bool):
    device = fake_gpu.FakeGpuDriver(libraries=libraries).create_device(command_buffer=mode)
    context_for(device).is_gpu = True  # lower as for a GPU
    return device


@pytest.fixture(scope="module", params=["graph", "stream"])
def gpu(request):
    device = gpu_device(request.param, libraries=True)
    try:
        with cuda_emu.emulated_kernels():
            yield device
    finally:
        device.close()


@pytest.fixture(scope="module")
def gpu_without_library():
    device = gpu_device("graph", libraries=False)
    try:
        with cuda_emu.emulated_kernels():
            yield device
    finally:
        device.close()


def loaded(device) -> set:
    """The kinds of executables the runtime loaded on ``device`` ("library" or a kernel family)."""
    return {key[0] for key in context_for(device).executables}


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("case", ["plain", "a_transposed", "b_transposed", "both_transposed", "sliced", "batched",
                                  "broadcast_batch", "vector", "row"])
def test_products_of_every_layout_run_on_the_library(gpu, case):
    a, b = rand(24, 40, seed=1), rand(40, 16, seed=2)
    A, B = rt.array(a, device=gpu), rt.array(b, device=gpu)
    if case == "plain":
        got, want = A @ B, a @ b
    elif case == "a_transposed":
        got, want = rt.array(a.T.copy(), device=gpu).T @ B, a @ b
    elif case == "b_transposed":
        got, want = A @ rt.array(b.T.copy(), device=gpu).T, a @ b
    elif case == "both_transposed":
        got, want = B.T @ A.T, b.T @ a.T
    elif case == "sliced":  # an offset and a row stride longer than the row
        got, want = A[3:, 5:21] @ B[4:20, :], a[3:, 5:21] @ b[4:20, :]
    elif case == "batched":
        x, y = rand(5, 24, 40, seed=3), rand(5, 40, 16, seed=4)
        got, want = rt.array(x, device=gpu) @ rt.array(y, device=gpu), x @ y
    elif case == "broadcast_batch":
        x = rand(5, 24, 40, seed=3)
        got, want = rt.array(x, device=gpu) @ B, x @ b
    elif case == "vector":
        got, want = A @ B[:, 0], a @ b[:, 0]
    else:
        got, want = A[0] @ B, a[0] @ b
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    assert "library" in loaded(gpu)
    assert "matmul" not in loaded(gpu), "a product that fits a library routine ran on the runtime's kernel"


@pytest.mark.parametrize("dtype", [rt.float16, rt.bfloat16, rt.float64])
def test_other_float_dtypes_run_on_the_library(gpu, dtype):
    a, b = rand(16, 32, seed=5), rand(32, 8, seed=6)
    got = (rt.array(a, device=gpu).astype(dtype) @ rt.array(b, device=gpu).astype(dtype)).astype(rt.float64)
    tolerance = 1e-12 if dtype is rt.float64 else 5e-2
    np.testing.assert_allclose(got.numpy(), a.astype(np.float64) @ b, rtol=tolerance, atol=tolerance * 8)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_complex_products_run_on_the_library_without_epilogues(gpu, dtype):
    """Complex products take the library's complex GEMM; a bias add after one is not folded (complex
    Gemms have no epilogues), and vecdot's conjugated operand is an ordinary input of it."""
    rng = np.random.default_rng(40)
    def draw(*shape):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    x, w, b = draw(3, 16, 12), draw(12, 8), draw(8)
    X, W, B = (rt.array(v, device=gpu) for v in (x, w, b))
    tolerance = 1e-5 if dtype is np.complex64 else 1e-12
    np.testing.assert_allclose((X @ W).numpy(), x @ w, rtol=tolerance, atol=tolerance * 10)
    np.testing.assert_allclose((X[0] @ W + B).numpy(), x[0] @ w + b, rtol=tolerance, atol=tolerance * 10)
    np.testing.assert_allclose(rt.vecdot(X, X).numpy(), np.vecdot(x, x), rtol=tolerance, atol=tolerance * 10)
    routines = {key[1] for key in context_for(gpu).executables if key[0] == "library"}
    assert hal.Gemm(np.dtype(dtype).name) in routines
    assert not any(r.dtype == np.dtype(dtype).name and r.epilogue != "none" for r in routines)


def test_strided_operands_and_integers_take_the_runtime_kernels(gpu):
    a, b = rand(16, 32, seed=7), rand(32, 8, seed=8)
    A, B = rt.array(a, device=gpu), rt.array(b, device=gpu)
    np.testing.assert_allclose((A[:, ::2] @ B[::2]).numpy(), a[:, ::2] @ b[::2], rtol=1e-4, atol=1e-4)
    ints = np.arange(12, dtype=np.int32).reshape(3, 4)
    np.testing.assert_array_equal((rt.array(ints, device=gpu) @ rt.array(ints.T.copy(), device=gpu)).numpy(),
                                  ints @ ints.T)
    assert "matmul" in loaded(gpu)


def test_without_a_library_every_product_runs_on_the_runtime_kernels(gpu_without_library):
    dev = gpu_without_library
    assert not dev.can_prepare("library")
    a, b = rand(24, 40, seed=9), rand(40, 16, seed=10)
    A, B = rt.array(a, device=dev), rt.array(b, device=dev)
    np.testing.assert_allclose((A @ B).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose((A.T.T @ B + 1).numpy(), a @ b + 1, rtol=1e-4, atol=1e-4)
    assert "library" not in loaded(dev) and "matmul" in loaded(dev)


def test_a_compiled_training_step_rebinds_its_library_products(gpu):
    x, y = rand(32, 16, seed=12), rand(32, 8, seed=13)
    w1, w2 = rand(16, 24, seed=11) * 0.1, rand(24, 8, seed=14) * 0.1
    b1 = np.zeros(24, np.float32)

    def loss_fn(w1, b1, w2, x, y):
        h = rt.maximum(x @ w1 + b1, 0.0)
        return ((h @ w2 - y) ** 2).mean()

    grad = rt.value_and_grad(loss_fn, argnums=(0, 1, 2))

    def step(w1, b1, w2, x, y):
        loss, (g1, gb, g2) = grad(w1, b1, w2, x, y)
        return w1 - 0.1 * g1, b1 - 0.1 * gb, w2 - 0.1 * g2, loss

    def numpy_step(w1, b1, w2):
        z = x @ w1 + b1
        h = np.maximum(z, 0)
        d = 2 * (h @ w2 - y) / y.size
        g2 = h.T @ d
        dz = (d @ w2.T) * (z > 0)
        return w1 - 0.1 * (x.T @ dz), b1 - 0.1 * dz.sum(0), w2 - 0.1 * g2

    compiled = rt.compile(step)
    state = [rt.array(v, device=gpu) for v in (w1, b1, w2)]
    X, Y = rt.array(x, device=gpu), rt.array(y, device=gpu)
    want = (w1, b1, w2)
    for _ in range(4):  # new parameter buffers every step: the products are rebound each time
        *state, loss = compiled(*state, X, Y)
        want = numpy_step(*want)
        for got, expected in zip(state, want):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-5)
    assert "library" in loaded(gpu)


def test_float32_precision_is_ieee_unless_asked_and_part_of_the_graph_key(gpu):
    assert rt.get_float32_matmul_precision() == "highest"
    a, b = rand(8, 8, seed=14), rand(8, 8, seed=15)
    A, B = rt.array(a, device=gpu), rt.array(b, device=gpu)
    assert (A @ B).root.params is None
    rt.set_float32_matmul_precision("high")
    try:
        product = A @ B
        assert product.root.params == "tf32"
        np.testing.assert_allclose(product.numpy(), a @ b, rtol=1e-4, atol=1e-4)
        assert any(key[0] == "library" and key[1].precision == "tf32" for key in context_for(gpu).executables)
        assert (A.astype(rt.float64) @ B.astype(rt.float64)).root.params is None  # float32 only
    finally:
        rt.set_float32_matmul_precision("highest")
    with pytest.raises(ValueError, match="precision"):
        rt.set_float32_matmul_precision("fast")


def library_routines(device) -> set:
    return {key[1].epilogue for key in context_for(device).executables if key[0] == "library"}


@pytest.mark.parametrize("order", ["product_first", "bias_first"])
def test_a_bias_add_folds_into_the_product(gpu, order):
    x, w, b = rand(32, 16, seed=20), rand(16, 24, seed=21), rand(24, seed=22)
    X, W, B = (rt.array(v, device=gpu) for v in (x, w, b))
    y = X @ W + B if order == "product_first" else B + X @ W
    np.testing.assert_allclose(y.numpy(), x @ w + b, rtol=1e-5, atol=1e-5)
    assert "bias" in library_routines(gpu)
    z = rt.maximum(X @ W + B[None, :], 0.0) * 2  # a (1, N) bias, consumers after it
    np.testing.assert_allclose(z.numpy(), np.maximum(x @ w + b, 0) * 2, rtol=1e-5, atol=1e-5)


def test_no_fold_where_the_product_is_wanted_or_the_bias_is_not_a_row_vector(gpu):
    x, w = rand(32, 16, seed=23), rand(16, 24, seed=24)
    X, W = rt.array(x, device=gpu), rt.array(w, device=gpu)
    col = rand(32, 1, seed=25)
    product = X @ W
    total = product + rt.array(col, device=gpu)  # a column: added to every column, not a bias epilogue
    rt.eval(product, total)  # the product is kept as well
    np.testing.assert_allclose(total.numpy(), x @ w + col, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(product.numpy(), x @ w, rtol=1e-5, atol=1e-5)
    full = rand(32, 24, seed=26)
    np.testing.assert_allclose((X @ W + rt.array(full, device=gpu)).numpy(), x @ w + full, rtol=1e-5, atol=1e-5)


def test_a_routine_the_library_refuses_runs_on_the_runtime_kernels():
    device = gpu_device("graph", libraries=True)
    device.executables.libraries.supports = lambda routine: "no float64 GEMM" if routine.dtype == "float64" else None
    try:
        with cuda_emu.emulated_kernels():
            a, b = rand(8, 12, seed=30).astype(np.float64), rand(12, 4, seed=31).astype(np.float64)
            got = rt.array(a, device=device) @ rt.array(b, device=device)
            np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-12)
            assert ("refused", "library", hal.Gemm("float64")) in context_for(device).executables
            assert "matmul" in loaded(device)
            x = rand(8, 12, seed=32)
            np.testing.assert_allclose((rt.array(x, device=device) @ rt.array(b.astype(np.float32), device=device))
                                       .numpy(), x @ b.astype(np.float32), rtol=1e-5, atol=1e-5)
            assert "library" in loaded(device)
    finally:
        device.close()


def mlp_loss(w1, b1, w2, b2, x, y):
    h = rt.maximum(x @ w1 + b1, 0.0)
    d = h @ w2 + b2 - y
    return (d * d).mean()


def numpy_mlp_grads(w1, b1, w2, b2, x, y):
    """The loss and gradients with the runtime's rule for maximum: the derivative at 0 is 1."""
    z = x.astype(np.float64) @ w1 + b1
    h = np.maximum(z, 0)
    d = h @ w2 + b2 - y
    gd = 2 * d / d.size
    gz = (gd @ w2.T) * (z >= 0)
    return (d * d).mean(), [x.T @ gz, gz.sum(0), h.T @ gd, gd.sum(0)]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_training_step_folds_relu_and_the_bias_gradients_into_its_gemms(gpu, compiled):
    """Forward: bias and ReLU in the first GEMM, which also writes the ReLU mask as bits; backward:
    the mask and the first bias gradient in the GEMM of the hidden gradient, the second bias
    gradient in the GEMM of the second weight gradient. Rows of zeros put pre-activations exactly
    on ReLU's kink."""
    x, y = rand(40, 16, seed=30), rand(40, 8, seed=31)
    x[:3] = 0
    w1, w2 = rand(16, 32, seed=32) * 0.3, rand(32, 8, seed=33) * 0.3
    b1, b2 = rand(32, seed=34) * 0.1, rand(8, seed=35) * 0.1
    b1[:5] = 0  # with the zero rows of x: pre-activations of exactly 0, whose gradient passes
    args = [rt.array(v, device=gpu) for v in (w1, b1, w2, b2, x, y)]
    grad = rt.value_and_grad(mlp_loss, argnums=(0, 1, 2, 3))
    context_for(gpu).executables.clear()
    for _ in range(3):  # the fused kernels (and so the folds) come with the graph's repeats
        if compiled:
            loss, grads = rt.compile(grad)(*args)
        else:
            loss, grads = grad(*args)
            rt.eval(loss, *grads)
    want_loss, want = numpy_mlp_grads(w1, b1, w2, b2, x, y)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    for got, expected in zip(grads, want):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-6)
    assert {"bias_relu_aux", "drelu_bgrad", "bgrad_b", "bias"} <= library_routines(gpu)


def test_relu_after_a_product_folds_only_with_a_zero(gpu):
    x, w, b = rand(24, 16, seed=36), rand(16, 40, seed=37), rand(40, seed=38)
    X, W, B = (rt.array(v, device=gpu) for v in (x, w, b))
    context_for(gpu).executables.clear()
    for floor in (0.0, 0.5, 0.0):  # one graph key: the folded recording must not serve 0.5
        for _ in range(3):
            got = rt.maximum(X @ W + B, floor).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ w + b, floor), rtol=1e-5, atol=1e-5)
    assert "bias_relu" in library_routines(gpu)
    np.testing.assert_allclose(rt.maximum(X @ W, 0.0).numpy(), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    for _ in range(2):
        rt.maximum(X @ W, 0.0).numpy()
    assert "relu" in library_routines(gpu)


def test_no_relu_fold_where_its_input_or_mask_is_wanted(gpu):
    x, w = rand(24, 16, seed=39), rand(16, 40, seed=40)
    X, W = rt.array(x, device=gpu), rt.array(w, device=gpu)
    context_for(gpu).executables.clear()
    for _ in range(3):
        pre = X @ W
        mask = pre >= 0
        h = rt.maximum(pre, 0.0)
        rt.eval(h, mask)  # the mask is wanted as booleans: no bits in its buffer
    np.testing.assert_array_equal(mask.numpy(), x @ w >= 0)
    np.testing.assert_allclose(h.numpy(), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    assert not {"relu", "relu_aux"} & library_routines(gpu)
    for _ in range(3):
        pre = X @ W
        h = rt.maximum(pre, 0.0)
        rt.eval(h, pre)  # the pre-activation is wanted
    np.testing.assert_allclose(pre.numpy(), x @ w, rtol=1e-5, atol=1e-5)
    assert not {"relu", "relu_aux"} & library_routines(gpu)


@pytest.mark.parametrize("with_bias", [True, False])
def test_a_gelu_layer_folds_forward_and_backward(gpu, with_bias):
    """rt.nn.gelu after a product: the forward GEMM writes the GELU and the pre-activation the
    backward GEMM multiplies by GELU's derivative (gelu_aux / dgelu_bgrad); inference alone runs
    the plain GELU epilogue."""
    x, y = rand(40, 16, seed=41), rand(40, 8, seed=42)
    w1, w2 = rand(16, 32, seed=43) * 0.3, rand(32, 8, seed=44) * 0.3
    b1 = rand(32, seed=45) * 0.1 if with_bias else np.zeros(32, np.float32)
    X, Y, W1, B1, W2 = (rt.array(v, device=gpu) for v in (x, y, w1, b1, w2))

    def loss(w1, b1, w2):
        pre = X @ w1 + b1 if with_bias else X @ w1
        return ((rt.nn.gelu(pre) @ w2 - Y) ** 2).mean()

    c, k = np.sqrt(2 / np.pi), 0.044715
    z = x.astype(np.float64) @ w1 + b1
    t = np.tanh(c * (z + k * z ** 3))
    h = 0.5 * z * (1 + t)
    gd = 2 * (h @ w2 - y) / y.size
    gz = (gd @ w2.T) * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * k * z * z))
    context_for(gpu).executables.clear()
    grad = rt.value_and_grad(loss, argnums=(0, 1, 2))
    for _ in range(3):
        value, grads = grad(W1, B1, W2)
        rt.eval(value, *grads)
    for got, expected in zip(grads, (x.T @ gz, gz.sum(0) if with_bias else 0 * b1, h.T @ gd)):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-6)
    prefix = "bias_" if with_bias else ""
    assert {prefix + "gelu_aux", "dgelu_bgrad" if with_bias else "dgelu"} <= library_routines(gpu)
    for _ in range(3):
        out = rt.nn.gelu(X @ W1 + B1 if with_bias else X @ W1).numpy()
    np.testing.assert_allclose(out, h, rtol=1e-5, atol=1e-6)
    assert prefix + "gelu" in library_routines(gpu)
