"""rt.fft (the array API's fft extension) against numpy.fft on every runtime device, its gradients
against finite differences, its argument checks, and the GPU lowering on the simulated GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from cts.helpers import random_array as draw

import hal
import runtime as rt
from runtime.errors import AxisError, InvalidTypeError, InvalidValueError

#: (rtol, atol relative to the largest magnitude) by the precision of the transform.
TOL = {"float32": 2e-5, "complex64": 2e-5, "float64": 1e-12, "complex128": 1e-12}
COMPLEX_OF = {"float32": "complex64", "float64": "complex128", "complex64": "complex64", "complex128": "complex128"}
REAL_OF = {"complex64": "float32", "complex128": "float64", "float32": "float32", "float64": "float64"}


def close(actual, expected, dtype) -> None:
    actual = actual.numpy() if hasattr(actual, "numpy") else np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tol = TOL[str(dtype)]
    scale = max(1.0, float(np.abs(expected).max())) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale)


NORMS = ["backward", "ortho", "forward"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("norm", NORMS)
def test_fft_and_ifft(dev, dtype, norm):
    x = draw((3, 10), dtype)
    a = rt.asarray(x, device=dev)
    y = rt.fft.fft(a, norm=norm)
    assert y.dtype == np.dtype(COMPLEX_OF[dtype])
    close(y, np.fft.fft(x, norm=norm).astype(COMPLEX_OF[dtype]), COMPLEX_OF[dtype])
    close(rt.fft.ifft(a, norm=norm), np.fft.ifft(x, norm=norm), COMPLEX_OF[dtype])


@pytest.mark.parametrize("n", [1, 4, 7, 9, 16])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_n_trims_or_pads_along_any_axis(dev, n, axis):
    x = draw((6, 7, 5), "complex64", seed=n)
    a = rt.asarray(x, device=dev)
    close(rt.fft.fft(a, n=n, axis=axis), np.fft.fft(x, n=n, axis=axis), "complex64")
    close(rt.fft.ifft(a, n=n, axis=axis, norm="ortho"), np.fft.ifft(x, n=n, axis=axis, norm="ortho"), "complex64")
    r = x.real.copy()
    close(rt.fft.rfft(rt.asarray(r, device=dev), n=n, axis=axis), np.fft.rfft(r, n=n, axis=axis), "complex64")
    close(rt.fft.irfft(a, n=n, axis=axis), np.fft.irfft(x, n=n, axis=axis), "float32")
    close(rt.fft.hfft(a, n=n, axis=axis), np.fft.hfft(x, n=n, axis=axis), "float32")
    close(rt.fft.ihfft(rt.asarray(r, device=dev), n=n, axis=axis), np.fft.ihfft(r, n=n, axis=axis), "complex64")


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("s,axes", [(None, None), (None, (0, 2)), (None, (2, 0)), ((4, 9), None), ((5, -1), (1, 0)),
                                    (None, (1,)), ((3, 4, 5, 6), (0, 1, 2, 3)), (None, ())])
def test_fftn_and_ifftn(dev, dtype, norm, s, axes):
    x = draw((4, 6, 5, 3), dtype)
    a = rt.asarray(x, device=dev)
    np_axes = axes if s is None or axes is not None else tuple(range(x.ndim - len(s), x.ndim))
    np_s = None if s is None else [x.shape[ax] if v == -1 else v for v, ax in zip(s, np_axes)]
    close(rt.fft.fftn(a, s=s, axes=axes, norm=norm), np.fft.fftn(x, s=np_s, axes=np_axes, norm=norm), dtype)
    close(rt.fft.ifftn(a, s=s, axes=axes, norm=norm), np.fft.ifftn(x, s=np_s, axes=np_axes, norm=norm), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("s,axes", [(None, None), (None, (0, 2)), (None, (2, 0)), ((4, 9), None), ((6, 7), (1, 0)),
                                    (None, (1,)), (None, (0, 1, 2, 3))])
def test_rfftn_and_irfftn(dev, dtype, norm, s, axes):
    x = draw((4, 6, 5, 3), dtype)
    a = rt.asarray(x, device=dev)
    np_axes = axes if s is None or axes is not None else tuple(range(x.ndim - len(s), x.ndim))
    close(rt.fft.rfftn(a, s=s, axes=axes, norm=norm), np.fft.rfftn(x, s=s, axes=np_axes, norm=norm),
          COMPLEX_OF[dtype])
    spectrum = np.fft.rfftn(x, axes=np_axes)  # Hermitian-consistent: what every library inverts alike
    y = rt.fft.irfftn(rt.asarray(spectrum, device=dev), s=s, axes=axes, norm=norm)
    assert y.dtype == np.dtype(dtype)
    close(y, np.fft.irfftn(spectrum, s=s, axes=np_axes, norm=norm), dtype)


@pytest.mark.parametrize("n", [5, 8])
def test_irfft_of_any_complex_input_is_numpys_on_the_cpu_drivers(dev, n):
    """numpy ignores the imaginary parts a real signal's spectrum cannot have (zero and Nyquist
    frequencies); so does the reference (on GPUs the vendor's C2R decides)."""
    if dev == "cuda":
        pytest.skip("cuFFT's C2R of a non-Hermitian spectrum is its own")
    x = draw((3, n // 2 + 1), "complex128")
    close(rt.fft.irfft(rt.asarray(x, device=dev), n=n), np.fft.irfft(x, n=n), "float64")


@pytest.mark.parametrize("n", [1, 2, 7, 8])
@pytest.mark.parametrize("dtype", [None, "float32", "float64"])
def test_fftfreq_and_rfftfreq(dev, n, dtype):
    f = rt.fft.fftfreq(n, d=0.25, dtype=dtype, device=dev)
    assert f.dtype == np.dtype(dtype or "float32") and f.device == rt.asarray(0.0, device=dev).device
    close(f, np.fft.fftfreq(n, 0.25).astype(dtype or "float32"), dtype or "float32")
    close(rt.fft.rfftfreq(n, d=2.0, dtype=dtype, device=dev), np.fft.rfftfreq(n, 2.0).astype(dtype or "float32"),
          dtype or "float32")


@pytest.mark.parametrize("axes", [None, 0, (1,), (0, 2), (-1, 0)])
def test_fftshift_and_ifftshift(dev, axes):
    x = draw((4, 7, 5), "float64")
    a = rt.asarray(x, device=dev)
    close(rt.fft.fftshift(a, axes=axes), np.fft.fftshift(x, axes=axes), "float64")
    close(rt.fft.ifftshift(a, axes=axes), np.fft.ifftshift(x, axes=axes), "float64")


def test_the_namespace_has_the_extension(dev):
    a = rt.asarray(draw((8,), "complex64"), device=dev)
    xp = a.__array_namespace__()
    assert xp.fft is rt.fft
    close(xp.fft.fft(a), np.fft.fft(a.numpy()), "complex64")


def test_numpys_fft_functions_stay_lazy_on_the_device(dev):
    """np.fft's functions called with runtime arrays (``__array_function__``) are rt.fft's."""
    x = draw((4, 6), "complex128")
    a = rt.asarray(x, device=dev)
    for call in (lambda v: np.fft.fft(v, n=8, norm="ortho"), lambda v: np.fft.ifft2(v),
                 lambda v: np.fft.irfft(v, axis=0), lambda v: np.fft.fftn(v, s=(3, 5), axes=(0, 1)),
                 lambda v: np.fft.fftshift(v, axes=1)):
        result = call(a)
        assert isinstance(result, rt.Array)
        close(result, call(x), "complex128")


def test_strided_views_and_lazy_inputs(dev):
    x = draw((6, 8), "complex128")
    a = rt.asarray(x, device=dev)
    close(rt.fft.fft(a.T[::2] * 2), np.fft.fft(x.T[::2] * 2), "complex128")
    close(rt.fft.fftn(rt.fft.ifftn(a)), x, "complex128")


def test_compiled_transforms_replay_with_new_inputs(dev):
    step = rt.compile(lambda a: rt.fft.irfft(rt.fft.rfft(a) * 2, n=a.shape[-1]))
    for seed in range(3):
        x = draw((4, 9), "float32", seed=seed)
        close(step(rt.asarray(x, device=dev)), 2 * x, "float32")


@pytest.mark.parametrize("call", [
    lambda a, r: rt.fft.fft(a, n=0),
    lambda a, r: rt.fft.ifft(a, n=-3),
    lambda a, r: rt.fft.rfft(r, n=0),
    lambda a, r: rt.fft.fftn(a, s=(0, 4)),
    lambda a, r: rt.fft.fftn(a, s=(4,), axes=(0, 1)),
    lambda a, r: rt.fft.fftn(a, axes=(0, 0)),
    lambda a, r: rt.fft.fft(a, norm="none"),
    lambda a, r: rt.fft.irfft(a[:, :1]),  # 2 * (1 - 1) = 0 output points
    lambda a, r: rt.fft.fft(a[:, :0]),
    lambda a, r: rt.fft.fftfreq(0),
    lambda a, r: rt.fft.rfftfreq(-1),
])
def test_invalid_values_raise(dev, call):
    a = rt.asarray(draw((4, 6), "complex64"), device=dev)
    r = rt.asarray(draw((4, 6), "float32"), device=dev)
    with pytest.raises(InvalidValueError):
        call(a, r)


def test_invalid_axes_and_types_raise(dev):
    a = rt.asarray(draw((4, 6), "complex64"), device=dev)
    for call in (lambda: rt.fft.fft(a, axis=2), lambda: rt.fft.fftn(a, axes=(-3,)),
                 lambda: rt.fft.fft(rt.asarray(1.0 + 0j, device=dev))):
        with pytest.raises(AxisError):
            call()
    ints = rt.asarray(np.arange(8, dtype=np.int32), device=dev)
    for fn in (rt.fft.fft, rt.fft.ifft, rt.fft.fftn, rt.fft.rfft, rt.fft.irfft, rt.fft.rfftn, rt.fft.hfft,
               rt.fft.ihfft):
        with pytest.raises(InvalidTypeError):
            fn(ints)
    with pytest.raises(InvalidTypeError):
        rt.fft.fft(rt.asarray(np.ones(4, bool), device=dev))
    for fn in (rt.fft.rfft, rt.fft.rfftn, rt.fft.ihfft):
        with pytest.raises(InvalidTypeError):
            fn(a)
    with pytest.raises(InvalidTypeError):
        rt.fft.fftfreq(8, dtype=rt.complex64)
    with pytest.raises(InvalidTypeError):
        rt.fft.fftfreq(8, dtype=rt.int32)
    assert isinstance(InvalidValueError("x"), hal.InvalidArgumentError)


def test_empty_batches_give_empty_results(dev):
    x = np.zeros((0, 8), np.complex64)
    a = rt.asarray(x, device=dev)
    close(rt.fft.fft(a), np.fft.fft(x), "complex64")
    close(rt.fft.irfft(a), np.fft.irfft(x), "float32")
    close(rt.fft.rfft(rt.asarray(np.zeros((3, 0, 8), np.float64), device=dev)),
          np.fft.rfft(np.zeros((3, 0, 8))), "complex128")


# ---- gradients against finite differences ----------------------------------------------------------

def finite_difference(loss, x0: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """JAX's convention for complex inputs: dL/dre - i dL/dim."""
    out = np.zeros_like(x0)
    for index in np.ndindex(*x0.shape):
        e = np.zeros_like(x0)
        e[index] = eps
        d_re = (loss(x0 + e) - loss(x0 - e)) / (2 * eps)
        if np.iscomplexobj(x0):
            d_im = (loss(x0 + 1j * e) - loss(x0 - 1j * e)) / (2 * eps)
            out[index] = d_re - 1j * d_im
        else:
            out[index] = d_re
    return out


GRADIENT_CASES = {
    "fft": (lambda x: rt.fft.fft(x, norm="ortho"), "complex128"),
    "fft_n": (lambda x: rt.fft.fft(x, n=8, axis=0), "complex128"),
    "fft_real": (lambda x: rt.fft.fft(x), "float64"),
    "ifft": (lambda x: rt.fft.ifft(x, n=4), "complex128"),
    "fftn": (lambda x: rt.fft.fftn(x), "complex128"),
    "ifftn": (lambda x: rt.fft.ifftn(x, axes=(0,), norm="forward"), "complex128"),
    "rfft": (lambda x: rt.fft.rfft(x, n=7), "float64"),
    "rfft_axis0": (lambda x: rt.fft.rfft(x, axis=0), "float64"),
    "rfftn": (lambda x: rt.fft.rfftn(x), "float64"),
    "irfft_even": (lambda x: rt.fft.irfft(x), "complex128"),
    "irfft_odd": (lambda x: rt.fft.irfft(x, n=9, norm="ortho"), "complex128"),
    "irfftn": (lambda x: rt.fft.irfftn(x, s=(4, 8)), "complex128"),
}


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_gradients_match_finite_differences(dev, case):
    fn, dtype = GRADIENT_CASES[case]
    x0 = draw((3, 5), dtype, seed=3)
    weights = draw(np.asarray(fn(rt.asarray(x0, device=dev)).numpy()).shape, "float64", seed=4)
    w = rt.asarray(weights, device=dev)

    def loss(x):
        y = fn(x)
        if y.dtype.kind == "c":
            return rt.sum(rt.real(y) * w) - 0.5 * rt.sum(rt.imag(y) * w)
        return rt.sum(y * w)

    g = rt.grad(loss)(rt.asarray(x0, device=dev)).numpy()
    expected = finite_difference(lambda v: float(loss(rt.asarray(v, device=dev)).numpy()), x0)
    np.testing.assert_allclose(g, expected, rtol=1e-6, atol=1e-6)


# ---- the GPU lowering on the simulated GPU ----------------------------------------------------------

@pytest.fixture(scope="module", params=["graph", "stream"])
def fake_gpu(request):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    fake = pytest.importorskip("drivers.fake_gpu")
    cuda_emu = pytest.importorskip("cuda_emu")
    if cuda_emu.GXX is None:
        pytest.skip("g++ is needed to emulate the CUDA kernels")
    from runtime.device import context_for

    device = fake.FakeGpuDriver(libraries=True).create_device(command_buffer=request.param)
    context_for(device).is_gpu = True
    try:
        with cuda_emu.emulated_kernels():
            yield device
    finally:
        device.close()


def test_gpu_lowering_records_fft_routines(fake_gpu):
    from runtime.device import context_for

    x = draw((4, 6, 5), "complex64")
    a = rt.asarray(x, device=fake_gpu)
    close(rt.fft.fftn(a, axes=(0, 2), norm="ortho"), np.fft.fftn(x, axes=(0, 2), norm="ortho"), "complex64")
    close(rt.fft.irfft(a, n=9, axis=1), np.fft.irfft(x, n=9, axis=1), "float32")
    close(rt.fft.rfft(rt.asarray(x.real.copy(), device=fake_gpu), axis=0), np.fft.rfft(x.real, axis=0), "complex64")
    routines = {key[1] for key in context_for(fake_gpu).executables if key and key[0] == "library"}
    assert {(r.transform, r.direction) for r in routines if isinstance(r, hal.Fft)} >= {
        ("c2c", "forward"), ("c2r", "inverse"), ("r2c", "forward")}


def test_gpu_lowering_of_fused_inputs_gradients_and_replays(fake_gpu):
    """Elementwise work before a transform (fused on GPUs) gets a buffer for it; the scaling after
    is fused with what reads it; gradients and compiled replays take the same routines."""
    x = draw((5, 8), "complex64", seed=1)
    a = rt.asarray(x, device=fake_gpu)
    close(rt.fft.ifft(a * 2 + 1, axis=0, norm="ortho") * 3, np.fft.ifft(x * 2 + 1, axis=0, norm="ortho") * 3,
          "complex64")
    w = rt.asarray(draw((5, 8), "float32", seed=2), device=fake_gpu)
    g = rt.grad(lambda v: rt.sum(rt.real(rt.fft.fft(v)) * w))(a).numpy()
    np.testing.assert_allclose(g, np.fft.fft(w.numpy()), rtol=1e-4, atol=1e-4)
    step = rt.compile(lambda v: rt.fft.irfft(rt.fft.rfft(v) * 2, n=8))
    for seed in range(3):
        r = draw((3, 8), "float32", seed=seed)
        close(step(rt.asarray(r, device=fake_gpu)), 2 * r, "float32")


def test_a_gpu_without_an_fft_library_refuses_when_the_op_is_built():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    fake = pytest.importorskip("drivers.fake_gpu")
    from runtime.device import context_for

    device = fake.FakeGpuDriver(libraries=False).create_device(command_buffer="graph")
    context_for(device).is_gpu = True
    try:
        a = rt.asarray(np.ones(8, np.complex64), device=device)
        with pytest.raises(hal.UnimplementedError, match="FFTs on fake-gpu://0 need"):
            rt.fft.fft(a)
    finally:
        device.close()
