"""cumulative_sum's scan kernels (runtime/kernels/scan.py) against numpy's running sum, lowered as on
a GPU: the generated CUDA C compiled for the CPU, and the kernels' numpy forms."""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import DEVICES

import runtime as rt
from runtime.kernels import scan


@pytest.fixture
def small_tiles(monkeypatch):
    """The scan's sizes lowered (tiles of 256, 4 a thread, two warps; chunks of two tiles; rows few
    below 8), so that small arrays take every path."""
    monkeypatch.setattr(scan, "TILE", 256)
    monkeypatch.setattr(scan, "ITEMS", 4)
    monkeypatch.setattr(scan, "CHUNK_TILES", 2)
    monkeypatch.setattr(scan, "FEW_ROWS", 8)
    rt.clear_graph_cache()


@pytest.mark.parametrize("dtype", ["float32", "int64", "int8", "float16"])
def test_cumulative_sum_of_few_long_rows_in_chunks(gpu_like, small_tiles, dtype):
    """Few rows longer than a chunk (sizes lowered here: tiles of 256, 4 a thread, two warps; chunks
    of two tiles) are reduced then scanned: the chunks' totals, their running sum along each row (a
    long one itself for the longest row), each chunk's scan from the totals before it; each row's
    length a multiple of the chunk or not; many rows stay one workgroup's each; integers wrap as
    numpy's running sum."""
    rng = np.random.default_rng(14)
    for shape, axis in (((3, 1000), 1), ((1024,), 0), ((777, 2), 0), ((2, 5000), 1), ((200, 100), 1),
                        ((5, 500), 1), ((9, 700), 1), ((70000,), 0)):
        if dtype == "float16":  # steps of -1, 0, 1: the running sums stay small integers, exact in float16
            x = rng.integers(-1, 2, shape).astype(np.float32)
            X = rt.astype(rt.array(x, device=gpu_like), rt.float16)
        else:
            x = rng.integers(-100, 100, shape).astype(dtype)
            X = rt.array(x, device=gpu_like)
        got = rt.cumulative_sum(X, axis=axis)
        want = np.cumsum(x, axis=axis)
        if dtype == "float16":
            np.testing.assert_array_equal(got.astype(rt.float64).numpy(), want, err_msg=f"{shape}")
        else:
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{shape}")
    if dtype == "int8":
        y = rt.array(np.full((1, 300), 100, np.int8), device=gpu_like)
        np.testing.assert_array_equal(rt.cumulative_sum(y, axis=1, dtype=rt.int8).numpy(),
                                      np.cumsum(np.full((1, 300), 100, np.int8), axis=1, dtype=np.int8))


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "int8"])
def test_cumulative_prod_through_the_same_kernels(gpu_like, small_tiles, dtype):
    """cumulative_prod takes the scan kernels with a product (sizes lowered as above): rows a
    workgroup's each, and few long rows reduced then scanned in chunks; integers wrap as numpy's
    running product; the gradient is exact where the input holds zeros."""
    rng = np.random.default_rng(15)
    for shape, axis in (((3, 1000), 1), ((777, 2), 0), ((2, 5000), 1), ((200, 100), 1), ((5000,), 0)):
        if dtype in ("float32", "float64"):  # factors near one: the products stay in range
            x = rng.uniform(0.999, 1.001, shape).astype(dtype)
        else:
            x = rng.integers(-3, 4, shape).astype(dtype)
        got = rt.cumulative_prod(rt.array(x, device=gpu_like), axis=axis)
        want = np.cumprod(x, axis=axis)
        assert got.dtype == want.dtype
        if dtype in ("float32", "float64"):
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-5 if dtype == "float32" else 1e-12,
                                       err_msg=f"{shape}")
        else:
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{shape}")
    if dtype == "float32":
        x = np.array([[2.0, 0.0, 3.0, 4.0, 0.0, 5.0]], np.float32)
        w = np.array([[1.0, 2.0, -1.0, 0.5, 3.0, 1.0]], np.float32)
        g = rt.grad(lambda a: rt.sum(rt.cumulative_prod(a, axis=1) * rt.array(w, device=gpu_like)))(
            rt.array(x, device=gpu_like))
        want = [[sum(w[0, j] * np.prod(np.delete(x[0, :j + 1], i)) for j in range(i, 6)) for i in range(6)]]
        np.testing.assert_allclose(g.numpy(), np.array(want, np.float32), rtol=1e-6)


@pytest.mark.parametrize("uri", DEVICES)
def test_long_rows_agree_with_numpy_and_with_themselves(uri):
    """At the sizes the kernels are built with: a row of 2**21 float32 (512 chunks), three rows of
    300000 int64 and of float64, each against numpy; the same compiled scan run again gives the same
    bits (the chunks' totals are added in the same order at every run)."""
    rng = np.random.default_rng(16)
    cases = [rng.standard_normal(1 << 21).astype(np.float32),
             rng.integers(-1000, 1000, (3, 300000)).astype(np.int64),
             rng.standard_normal((3, 300000))]
    scan_last = rt.compile(lambda a: rt.cumulative_sum(a, axis=-1))
    for x in cases:
        a = rt.array(x, device=uri)
        first = scan_last(a).numpy().copy()
        again = scan_last(a).numpy()
        want = np.cumsum(x.astype(np.float64) if x.dtype.kind == "f" else x, axis=-1)
        if x.dtype.kind == "f":
            scale = np.abs(x).sum(axis=-1, keepdims=True)
            assert np.max(np.abs(first - want) / scale) < (1e-6 if x.dtype == np.float32 else 1e-14)
        else:
            np.testing.assert_array_equal(first, want)
        np.testing.assert_array_equal(again, first)
