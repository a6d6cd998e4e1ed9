"""rt.linalg (the array API's linalg extension) against numpy on every runtime device and on the
simulated GPU (its library routines through their numpy references, the byte copies as generated
CUDA C): batched and single matrices, float32/float64/complex, failures as NaNs, hostile inputs,
and gradients against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from cts.helpers import random_array as rand
from rt_helpers import DEVICES, simulated_gpu

import hal
import runtime as rt

DTYPES = ["float32", "float64", "complex64", "complex128"]
TOL = {"float32": 2e-4, "float64": 1e-10, "complex64": 2e-4, "complex128": 1e-10}


@pytest.fixture(scope="module", params=[*DEVICES, "simulated-cuda"])
def dev(request):
    if request.param != "simulated-cuda":
        rt.set_default_device(request.param)
        yield request.param
        return
    device, emulated = simulated_gpu(libraries=True)
    try:
        with emulated:
            yield device
    finally:
        device.close()


def hpd(shape, dtype, seed=0) -> np.ndarray:
    a = rand(shape, dtype, seed)
    n = shape[-1]
    return (a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)).astype(dtype)


def close(actual, expected, dtype, scale=1.0):
    actual = np.asarray(actual)
    tol = TOL[dtype] * scale
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * max(1.0, float(np.abs(expected).max(initial=0))))


SHAPES = [(4, 4), (3, 5, 5), (2, 2, 3, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_cholesky_inv_det_slogdet_solve(dev, dtype, shape):
    a = hpd(shape, dtype)
    x = rt.asarray(a, device=dev)
    close(rt.linalg.cholesky(x).numpy(), np.linalg.cholesky(a), dtype)
    close(rt.linalg.cholesky(x, upper=True).numpy(), np.conj(np.swapaxes(np.linalg.cholesky(a), -1, -2)), dtype)
    g = rand(shape, dtype, 1)
    y = rt.asarray(g, device=dev)
    close(rt.linalg.inv(y).numpy(), np.linalg.inv(g), dtype, 10)
    close(rt.linalg.det(y).numpy(), np.linalg.det(g), dtype, 10)
    sign, logabs = rt.linalg.slogdet(y)
    s2, l2 = np.linalg.slogdet(g)
    close(sign.numpy(), s2, dtype, 10)
    close(logabs.numpy(), l2, dtype, 10)
    b = rand(shape[:-1] + (2,), dtype, 2)
    close(rt.linalg.solve(y, rt.asarray(b, device=dev)).numpy(), np.linalg.solve(g, b), dtype, 100)
    v = rand(shape[-1:], dtype, 3)
    close(rt.linalg.solve(y, rt.asarray(v, device=dev)).numpy(),
          np.linalg.solve(g, np.broadcast_to(v[..., None], shape[:-1] + (1,)))[..., 0], dtype, 100)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_eigh_and_eigvalsh(dev, dtype, shape):
    a = hpd(shape, dtype)
    x = rt.asarray(a, device=dev)
    w, v = rt.linalg.eigh(x)
    w2, _ = np.linalg.eigh(a)
    close(w.numpy(), w2, dtype, 10)
    vn = v.numpy()
    close(vn @ (w.numpy()[..., :, None] * np.conj(np.swapaxes(vn, -1, -2))), a, dtype, 10)
    close(rt.linalg.eigvalsh(x).numpy(), w2, dtype, 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4), (2, 3, 6, 2)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_svdvals_and_norms(dev, dtype, shape, full):
    a = rand(shape, dtype)
    x = rt.asarray(a, device=dev)
    u, s, vh = rt.linalg.svd(x, full_matrices=full)
    u2, s2, vh2 = np.linalg.svd(a, full_matrices=full)
    assert u.shape == u2.shape and s.shape == s2.shape and vh.shape == vh2.shape
    close(s.numpy(), s2, dtype, 10)
    k = min(shape[-2:])
    un, vhn = u.numpy(), vh.numpy()
    close((un[..., :, :k] * s.numpy()[..., None, :]) @ vhn[..., :k, :], a, dtype, 10)
    eye = np.broadcast_to(np.eye(un.shape[-1]), un.shape[:-2] + (un.shape[-1],) * 2)
    close(np.conj(np.swapaxes(un, -1, -2)) @ un, eye, dtype, 10)
    close(rt.linalg.svdvals(x).numpy(), s2, dtype, 10)
    for order in ("fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf):
        close(rt.linalg.matrix_norm(x, ord=order).numpy(), np.linalg.norm(a, ord=order, axis=(-2, -1)), dtype, 10)
    close(rt.linalg.pinv(x).numpy(), np.linalg.pinv(a), dtype, 100)
    np.testing.assert_array_equal(rt.linalg.matrix_rank(x).numpy(), np.linalg.matrix_rank(a))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (4, 4), (2, 6, 3)])
@pytest.mark.parametrize("mode", ["reduced", "complete"])
def test_qr(dev, dtype, shape, mode):
    a = rand(shape, dtype)
    q, r = rt.linalg.qr(rt.asarray(a, device=dev), mode=mode)
    q2, r2 = np.linalg.qr(a, mode=mode)
    assert q.shape == q2.shape and r.shape == r2.shape
    close(q.numpy(), q2, dtype, 10)  # (the same Householder reflections as LAPACK's)
    close(r.numpy(), r2, dtype, 10)
    close(q.numpy() @ r.numpy(), a, dtype, 10)


@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_compositions(dev, dtype):
    a, b = rand((2, 3, 4), dtype), rand((2, 4, 3), dtype, 1)
    x, y = rt.asarray(a, device=dev), rt.asarray(b, device=dev)
    close(rt.linalg.matmul(x, y).numpy(), a @ b, dtype)
    close(rt.linalg.matrix_transpose(x).numpy(), np.swapaxes(a, -1, -2), dtype)
    close(rt.linalg.tensordot(x, y, axes=([1, 2], [2, 1])).numpy(), np.tensordot(a, b, axes=([1, 2], [2, 1])), dtype)
    close(rt.linalg.vecdot(x, x).numpy(), np.sum(np.conj(a) * a, axis=-1), dtype)
    for offset in (-2, -1, 0, 1, 3, 5):
        close(rt.linalg.diagonal(x, offset=offset).numpy(), np.diagonal(a, offset, -2, -1), dtype)
        close(rt.linalg.trace(x, offset=offset).numpy(), np.trace(a, offset, -2, -1), dtype)
    v, w = rand((4,), dtype), rand((3,), dtype, 1)
    close(rt.linalg.outer(rt.asarray(v, device=dev), rt.asarray(w, device=dev)).numpy(), np.outer(v, w), dtype)
    c1, c2 = rand((2, 3), dtype), rand((3,), dtype, 1)
    close(rt.linalg.cross(rt.asarray(c1, device=dev), rt.asarray(c2, device=dev)).numpy(), np.cross(c1, c2), dtype)
    c3 = rand((3, 2), dtype, 2)
    close(rt.linalg.cross(rt.asarray(c3, device=dev), rt.asarray(c3[::-1].copy(), device=dev), axis=-2).numpy(),
          np.cross(c3, c3[::-1], axis=-2), dtype)
    for order in (2, 1, np.inf, -np.inf, 0, 3):
        close(rt.linalg.vector_norm(x, ord=order).numpy(), np.linalg.norm(a.ravel(), ord=order), dtype)
        close(rt.linalg.vector_norm(x, axis=(0, 2), keepdims=True, ord=order).numpy(),
              _vector_norm(a, order, (0, 2)), dtype)
    m = rand((2, 3, 3), dtype)
    for power in (0, 1, 2, 3, 5, -1, -2):
        close(rt.linalg.matrix_power(rt.asarray(m, device=dev), power).numpy(), np.linalg.matrix_power(m, power),
              dtype, 100)


def _vector_norm(a, order, axis):
    absolute = np.abs(a)
    if order == np.inf:
        return absolute.max(axis=axis, keepdims=True)
    if order == -np.inf:
        return absolute.min(axis=axis, keepdims=True)
    if order == 0:
        return (absolute != 0).sum(axis=axis, keepdims=True).astype(absolute.dtype)
    return (absolute ** order).sum(axis=axis, keepdims=True) ** (1 / order)


def test_the_namespace_has_linalg(dev):
    x = rt.asarray(np.eye(3, dtype=np.float32), device=dev)
    xp = x.__array_namespace__()
    assert xp.linalg is rt.linalg
    np.testing.assert_allclose(xp.linalg.inv(x * 2).numpy(), np.eye(3) / 2)


@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_failures_give_nans_in_their_batch_entry_only(dev, dtype):
    good = hpd((3, 3), dtype)
    bad = np.array([[1, 2, 0], [2, 1, 0], [0, 0, 1]], dtype)  # indefinite
    # Singular with an exactly zero pivot however the LU rounds, for A and for A^T (the runtime factors
    # the column-major reading): every multiplier is a power of two. ([[1, 2, 3], [2, 4, 6], [0, 1, 1]]
    # leaves cuSOLVER a pivot of 1e-7 where LAPACK's rounding gives 0.)
    singular = np.array([[1, 2, 4], [2, 4, 8], [1, 1, 1]], dtype)
    x = rt.asarray(np.stack([good, bad]), device=dev)
    factor = rt.linalg.cholesky(x).numpy()
    close(factor[0], np.linalg.cholesky(good), dtype)
    assert np.isnan(factor[1]).all()
    y = rt.asarray(np.stack([good, singular]), device=dev)
    inverse = rt.linalg.inv(y).numpy()
    close(inverse[0], np.linalg.inv(good), dtype, 10)
    assert np.isnan(inverse[1]).all()
    assert np.isnan(rt.linalg.solve(y, rt.asarray(np.ones(3, dtype), device=dev)).numpy()[1]).all()
    d = rt.linalg.det(y).numpy()
    assert d[1] == 0
    sign, logabs = rt.linalg.slogdet(y)
    assert sign.numpy()[1] == 0 and logabs.numpy()[1] == -np.inf


def test_empty_matrices(dev):
    for shape in [(0, 0), (2, 0, 0), (0, 3, 3)]:
        x = rt.asarray(np.zeros(shape, np.float32), device=dev)
        assert rt.linalg.cholesky(x).shape == shape
        assert rt.linalg.inv(x).shape == shape
        np.testing.assert_array_equal(rt.linalg.det(x).numpy(), np.linalg.det(np.zeros(shape, np.float32)))
        w, v = rt.linalg.eigh(x)
        assert w.shape == shape[:-1] and v.shape == shape
    u, s, vh = rt.linalg.svd(rt.asarray(np.zeros((2, 0, 3), np.float32), device=dev))
    assert (u.shape, s.shape, vh.shape) == ((2, 0, 0), (2, 0), (2, 3, 3))
    q, r = rt.linalg.qr(rt.asarray(np.zeros((0, 3), np.float32), device=dev))
    assert (q.shape, r.shape) == ((0, 0), (0, 3))


def test_hostile_inputs_raise_typed_errors(dev):
    ints = rt.asarray(np.eye(3, dtype=np.int32), device=dev)
    for fn in (rt.linalg.cholesky, rt.linalg.inv, rt.linalg.det, rt.linalg.eigh, rt.linalg.svd, rt.linalg.qr,
               rt.linalg.slogdet, rt.linalg.pinv, rt.linalg.matrix_norm):
        with pytest.raises(TypeError):
            fn(ints)
    with pytest.raises(TypeError):
        rt.linalg.solve(ints, ints)
    vector = rt.asarray(np.ones(3, np.float32), device=dev)
    wide = rt.asarray(np.ones((2, 3), np.float32), device=dev)
    for fn in (rt.linalg.cholesky, rt.linalg.inv, rt.linalg.det, rt.linalg.eigh, rt.linalg.slogdet):
        with pytest.raises(ValueError):
            fn(vector)
        with pytest.raises(ValueError):
            fn(wide)
    with pytest.raises(ValueError):
        rt.linalg.svd(vector)
    with pytest.raises(ValueError):
        rt.linalg.solve(rt.asarray(np.eye(3, dtype=np.float32), device=dev),
                        rt.asarray(np.ones(4, np.float32), device=dev))
    with pytest.raises(ValueError):
        rt.linalg.qr(wide, mode="r")
    with pytest.raises(ValueError):
        rt.linalg.cross(vector, rt.asarray(np.ones(4, np.float32), device=dev))
    with pytest.raises(ValueError):
        rt.linalg.outer(wide, vector)
    with pytest.raises(ValueError):
        rt.linalg.matrix_norm(wide, ord=3)
    with pytest.raises(TypeError):
        rt.linalg.matrix_power(rt.asarray(np.eye(2, dtype=np.float32), device=dev), 1.5)


def test_a_gpu_without_its_solver_library_raises_a_typed_error():
    device, emulated = simulated_gpu(libraries=False)
    try:
        with emulated:
            x = rt.asarray(np.eye(3, dtype=np.float32), device=device)
            with pytest.raises(hal.UnimplementedError, match="Cholesky"):
                rt.linalg.cholesky(x)
            np.testing.assert_allclose(rt.linalg.matrix_norm(x).numpy(), np.sqrt(3), rtol=1e-6)  # compositions run
    finally:
        device.close()


def test_decompositions_in_compiled_steps(dev):
    a = hpd((4, 3, 3), "float64")

    @rt.compile
    def step(x):
        return rt.linalg.cholesky(x), rt.linalg.det(x)

    for seed in range(3):
        a = hpd((4, 3, 3), "float64", seed)
        factor, d = step(rt.asarray(a, device=dev))
        close(factor.numpy(), np.linalg.cholesky(a), "float64")
        close(d.numpy(), np.linalg.det(a), "float64", 100)


# -- gradients ------------------------------------------------------------------------------------

def numeric_grad(f, a: np.ndarray, eps=1e-6) -> np.ndarray:
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        up, down = a.copy(), a.copy()
        up[i] += eps
        down[i] -= eps
        g[i] = (f(up) - f(down)) / (2 * eps)
    return g


def check_grad(dev, loss_rt, loss_np, a: np.ndarray, tol=1e-5):
    grad = rt.grad(lambda x: loss_rt(x))(rt.asarray(a, device=dev)).numpy()
    np.testing.assert_allclose(grad, numeric_grad(loss_np, a), rtol=tol, atol=tol)


def _weights(shape, seed=5):
    return np.random.default_rng(seed).standard_normal(shape)


def test_gradients_of_inv_solve_det_slogdet(dev):
    a = rand((2, 3, 3), "float64") + 3 * np.eye(3)
    w = _weights((2, 3, 3))
    check_grad(dev, lambda x: rt.sum(rt.linalg.inv(x) * rt.asarray(w, device=dev)),
               lambda x: np.sum(np.linalg.inv(x) * w), a)
    b = rand((2, 3, 2), "float64", 1)
    wb = _weights((2, 3, 2))
    check_grad(dev, lambda x: rt.sum(rt.linalg.solve(x, rt.asarray(b, device=dev)) * rt.asarray(wb, device=dev)),
               lambda x: np.sum(np.linalg.solve(x, b) * wb), a)
    check_grad(dev, lambda y: rt.sum(rt.linalg.solve(rt.asarray(a, device=dev), y) * rt.asarray(wb, device=dev)),
               lambda y: np.sum(np.linalg.solve(a, y) * wb), b)
    check_grad(dev, lambda x: rt.sum(rt.linalg.det(x) * rt.asarray([1.0, -2.0], device=dev)),
               lambda x: np.sum(np.linalg.det(x) * [1.0, -2.0]), a)
    check_grad(dev, lambda x: rt.sum(rt.linalg.slogdet(x).logabsdet), lambda x: np.sum(np.linalg.slogdet(x)[1]), a)


def test_gradients_of_cholesky_and_eigh(dev):
    m = rand((2, 3, 3), "float64")
    w = _weights((2, 3, 3))

    def spd_np(x):
        return x @ np.swapaxes(x, -1, -2) + 3 * np.eye(3)

    def spd_rt(x):
        return rt.matmul(x, rt.matrix_transpose(x)) + rt.asarray(3 * np.eye(3), device=dev)

    check_grad(dev, lambda x: rt.sum(rt.linalg.cholesky(spd_rt(x)) * rt.asarray(w, device=dev)),
               lambda x: np.sum(np.linalg.cholesky(spd_np(x)) * w), m)
    wv = _weights((2, 3))
    check_grad(dev, lambda x: rt.sum(rt.linalg.eigvalsh(spd_rt(x)) * rt.asarray(wv, device=dev)),
               lambda x: np.sum(np.linalg.eigvalsh(spd_np(x)) * wv), m)

    def vectors_np(x):  # a loss that does not depend on the eigenvectors' signs
        _, v = np.linalg.eigh(spd_np(x))
        return np.sum((v * v) * w)

    def vectors_rt(x):
        v = rt.linalg.eigh(spd_rt(x)).eigenvectors
        return rt.sum((v * v) * rt.asarray(w, device=dev))

    check_grad(dev, vectors_rt, vectors_np, m)


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (3, 4)])
def test_gradients_of_svd(dev, shape):
    a = rand(shape, "float64")
    ws = _weights(shape[:-2] + (min(shape),))
    check_grad(dev, lambda x: rt.sum(rt.linalg.svdvals(x) * rt.asarray(ws, device=dev)),
               lambda x: np.sum(np.linalg.svd(x, compute_uv=False) * ws), a)
    k = min(shape)
    wu, wv = _weights((shape[0], k), 6), _weights((k, shape[1]), 7)

    def uv_np(x):  # sign-invariant: u_i v_i^T products
        u, _, vh = np.linalg.svd(x, full_matrices=False)
        return np.sum((u * u) * wu) + np.sum((vh * vh) * wv)

    def uv_rt(x):
        u, _, vh = rt.linalg.svd(x, full_matrices=False)
        return rt.sum((u * u) * rt.asarray(wu, device=dev)) + rt.sum((vh * vh) * rt.asarray(wv, device=dev))

    check_grad(dev, uv_rt, uv_np, a, tol=1e-4)


@pytest.mark.parametrize("shape", [(4, 3), (3, 3)])
def test_gradients_of_qr(dev, shape):
    a = rand(shape, "float64")
    wq, wr = _weights(shape), _weights((shape[1], shape[1]), 6)
    check_grad(dev, lambda x: rt.sum(rt.linalg.qr(x).Q * rt.asarray(wq, device=dev)),
               lambda x: np.sum(np.linalg.qr(x)[0] * wq), a)
    check_grad(dev, lambda x: rt.sum(rt.linalg.qr(x).R * rt.asarray(wr, device=dev)),
               lambda x: np.sum(np.linalg.qr(x)[1] * wr), a)


def complex_numeric_grad(f, a: np.ndarray, eps=1e-6) -> np.ndarray:
    """df/dx - i df/dy of a real function of complex entries (JAX's convention)."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        for unit, weight in ((1, 1), (1j, -1j)):
            up, down = a.copy(), a.copy()
            up[i] += eps * unit
            down[i] -= eps * unit
            g[i] += (f(up) - f(down)) / (2 * eps) * weight
    return g


def test_gradients_of_complex_matrices(dev):
    m = rand((2, 3, 3), "complex128")
    a = m + 3 * np.eye(3)
    b = rand((2, 3, 2), "complex128", 7)
    w = _weights((2, 3, 3))
    wv = _weights((2, 3), 6)

    def hpd_np(x):
        return x @ np.conj(np.swapaxes(x, -1, -2)) + 3 * np.eye(3)

    def hpd_rt(x):
        return rt.matmul(x, rt.conj(rt.matrix_transpose(x))) + rt.asarray(3 * np.eye(3), device=dev)

    def weights():
        return rt.asarray(w, device=dev)

    cases = [
        (lambda x: rt.sum(rt.real(rt.linalg.inv(x)) * weights()), lambda x: np.sum(np.real(np.linalg.inv(x)) * w), a),
        (lambda x: rt.sum(rt.imag(rt.linalg.det(x))), lambda x: np.sum(np.imag(np.linalg.det(x))), a),
        (lambda x: rt.sum(rt.linalg.slogdet(x).logabsdet), lambda x: np.sum(np.linalg.slogdet(x)[1]), a),
        (lambda x: rt.sum(rt.abs(rt.linalg.solve(x, rt.asarray(b, device=dev)))),
         lambda x: np.sum(np.abs(np.linalg.solve(x, b))), a),
        (lambda x: rt.sum(rt.imag(rt.linalg.cholesky(hpd_rt(x))) * weights()),
         lambda x: np.sum(np.imag(np.linalg.cholesky(hpd_np(x))) * w), m),
        (lambda x: rt.sum(rt.real(rt.linalg.cholesky(hpd_rt(x), upper=True)) * weights()),
         lambda x: np.sum(np.real(np.conj(np.swapaxes(np.linalg.cholesky(hpd_np(x)), -1, -2))) * w), m),
        (lambda x: rt.sum(rt.linalg.eigvalsh(hpd_rt(x)) * rt.asarray(wv, device=dev)),
         lambda x: np.sum(np.linalg.eigvalsh(hpd_np(x)) * wv), m),
        (lambda x: rt.sum(rt.abs(rt.linalg.eigh(hpd_rt(x)).eigenvectors) ** 2 * weights()),  # phase-invariant
         lambda x: np.sum(np.abs(np.linalg.eigh(hpd_np(x))[1]) ** 2 * w), m),
    ]
    for loss_rt, loss_np, x in cases:
        grad = rt.grad(loss_rt)(rt.asarray(x, device=dev)).numpy()
        np.testing.assert_allclose(grad, complex_numeric_grad(loss_np, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (3, 4)])
def test_gradients_of_complex_svd_and_qr(dev, shape):
    a = rand(shape, "complex128")
    k = min(shape)
    ws, wu, wv = _weights((k,)), _weights((shape[0], k), 6), _weights((k, shape[1]), 7)

    def svd_rt(x):  # phase-invariant: |U|^2 and |Vh|^2
        u, s, vh = rt.linalg.svd(x, full_matrices=False)
        return (rt.sum(s * rt.asarray(ws, device=dev)) + rt.sum(rt.abs(u) ** 2 * rt.asarray(wu, device=dev))
                + rt.sum(rt.abs(vh) ** 2 * rt.asarray(wv, device=dev)))

    def svd_np(x):
        u, s, vh = np.linalg.svd(x, full_matrices=False)
        return np.sum(s * ws) + np.sum(np.abs(u) ** 2 * wu) + np.sum(np.abs(vh) ** 2 * wv)

    grad = rt.grad(svd_rt)(rt.asarray(a, device=dev)).numpy()
    np.testing.assert_allclose(grad, complex_numeric_grad(svd_np, a), rtol=1e-5, atol=1e-5)
    if shape[0] < shape[1]:
        return
    wq, wr = _weights(shape, 8), _weights((shape[1], shape[1]), 9)

    def qr_rt(x):
        q, r = rt.linalg.qr(x)
        return rt.sum(rt.real(q) * rt.asarray(wq, device=dev)) + rt.sum(rt.imag(r) * rt.asarray(wr, device=dev))

    def qr_np(x):
        q, r = np.linalg.qr(x)
        return np.sum(np.real(q) * wq) + np.sum(np.imag(r) * wr)

    grad = rt.grad(qr_rt)(rt.asarray(a, device=dev)).numpy()
    np.testing.assert_allclose(grad, complex_numeric_grad(qr_np, a), rtol=1e-5, atol=1e-5)


def test_decompositions_that_cannot_be_captured_run_on_the_stream_eagerly_and_compiled():
    """cuSOLVER's syevd and gesvdj wait on the device while they are enqueued (a CUDA graph cannot
    hold them): on the simulated GPU with Eigh and Svd marked so, an eval holding one is issued on
    the stream, eagerly, under rt.compile with new inputs each call, and beside a GEMM and fused
    elementwise work, with the results numpy gives."""
    device, emulated = simulated_gpu(libraries=True)
    device.executables.libraries.uncapturable.update({"eigh", "svd"})
    try:
        with emulated:
            a = hpd((3, 6, 6), "float32")
            x = rt.asarray(a, device=device)
            w, v = rt.linalg.eigh(x)
            close(w.numpy(), np.linalg.eigh(a)[0], "float32", 10)

            @rt.compile
            def step(m, n):
                s = rt.linalg.svdvals(m @ n)
                return rt.linalg.eigvalsh(m) * 2 + 1, s.sum(axis=-1)

            for seed in range(3):
                m, n = hpd((2, 5, 5), "float32", seed), rand((2, 5, 5), "float32", seed + 7)
                got_w, got_s = step(rt.asarray(m, device=device), rt.asarray(n, device=device))
                close(got_w.numpy(), np.linalg.eigvalsh(m) * 2 + 1, "float32", 10)
                close(got_s.numpy(), np.linalg.svd(m @ n, compute_uv=False).sum(axis=-1), "float32", 10)
    finally:
        device.close()


@pytest.mark.parametrize("n,out_offset,in_offset", [(0, 0, 0), (5, 0, 0), (64, 0, 0), (67, 16, 32), (100, 3, 0),
                                                    (100, 16, 5), (1000, 256, 512), (4099, 1, 2)])
def test_the_byte_copy_kernel_moves_exactly_its_bytes(n, out_offset, in_offset):
    """copy_bytes (the decompositions' packing) as CUDA C: 16 bytes a thread where both ends are
    aligned, byte by byte otherwise and past the last whole vector; nothing outside the range."""
    cuda_emu = pytest.importorskip("cuda_emu")
    if cuda_emu.GXX is None:
        pytest.skip("g++ is needed to emulate the CUDA kernels")
    from runtime.kernels import linalg as linalg_kernels

    copy = cuda_emu.emulated_code(linalg_kernels.copy_source())["copy_bytes"]
    source = np.random.default_rng(n).integers(0, 256, in_offset + n + 40, dtype=np.uint8)
    out = np.full(out_offset + n + 40, 0xEE, np.uint8)
    copy((max(linalg_kernels.copy_groups(n), 1), 1, 1), [memoryview(out), memoryview(source)], [n, out_offset,
                                                                                              in_offset])
    expected = np.full_like(out, 0xEE)
    expected[out_offset:out_offset + n] = source[in_offset:in_offset + n]
    np.testing.assert_array_equal(out, expected)


def test_results_of_4_gib_or_more_are_refused_when_the_op_is_built(dev):
    """The kernels that read a decomposition's buffer take 32-bit offsets: a batch whose results
    need 4 GiB or more is refused with a typed error before anything is allocated or run."""
    x = rt.broadcast_to(rt.asarray(np.eye(4, dtype=np.float32), device=dev), (1 << 26, 4, 4))
    with pytest.raises(hal.HalError, match="4 GiB|needs"):
        rt.linalg.cholesky(x)
    np.testing.assert_allclose(rt.linalg.cholesky(rt.asarray(np.eye(3, dtype=np.float32), device=dev)).numpy(),
                               np.eye(3))
