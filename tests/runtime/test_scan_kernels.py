"""cumulative_sum's scan kernels (runtime/kernels/scan.py) against numpy's running sum, lowered as on
a GPU: the generated CUDA C compiled for the CPU, and the kernels' numpy forms."""

from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime.kernels import scan


@pytest.mark.parametrize("dtype", ["float32", "int64", "int8", "float16"])
def test_cumulative_sum_of_few_long_rows_in_chunks(gpu_like, monkeypatch, dtype):
    """Few rows longer than a chunk (sizes lowered here: tiles of 256, 4 a thread, two warps; chunks
    of two tiles) are reduced then scanned: the chunks' totals, their running sum along each row (a
    long one itself for the longest row), each chunk's scan from the totals before it; each row's
    length a multiple of the chunk or not; many rows stay one workgroup's each; integers wrap as
    numpy's running sum."""
    monkeypatch.setattr(scan, "TILE", 256)
    monkeypatch.setattr(scan, "ITEMS", 4)
    monkeypatch.setattr(scan, "CHUNK_TILES", 2)
    monkeypatch.setattr(scan, "FEW_ROWS", 8)
    rt.clear_graph_cache()
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
