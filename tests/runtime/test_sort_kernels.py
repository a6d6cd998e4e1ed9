"""sort, argsort and searchsorted on the device kernels (runtime/kernels/sort.py) against numpy's.

Run lowered as on a GPU (the generated CUDA C compiled for the CPU, and the kernels' numpy forms) with
the shared-memory tile shrunk, so that short rows already take the merge passes; every real dtype, NaNs,
signed zeros, infinities, the integers' extremes and many ties. (Every driver's own kernels:
test_sort_drivers.py, apart from this module's emulated kernels.)"""

from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime.kernels import radix
from runtime.kernels import sort as sort_kernels

REAL = ["float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
        "uint64", "bool"]


@pytest.fixture
def small_tiles(monkeypatch):
    """A tile of 64 elements (8 threads), so rows of a few hundred run several merge passes."""
    monkeypatch.setattr(sort_kernels, "TILE", 64)
    rt.clear_graph_cache()
    yield
    rt.clear_graph_cache()


def sample(rng, dtype: str, shape: tuple) -> np.ndarray:
    """Values with many ties and each dtype's special values (as float32 for bfloat16)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        pool = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1.5, 2.0, 1e-3, -7.25, 3.0],
                        np.float32 if dtype == "bfloat16" else dtype)
        x = np.where(rng.random(shape) < 0.5, rng.choice(pool, shape), rng.standard_normal(shape))
        return x.astype(pool.dtype)
    info = np.iinfo(dtype)
    pool = np.array([info.min, info.max, 0, 1, info.min + 1, info.max - 1], dtype)
    return np.where(rng.random(shape) < 0.3, rng.choice(pool, shape),
                    rng.integers(-5 if info.min else 0, 6, shape).astype(dtype))


def on_device(x: np.ndarray, dtype: str, device) -> tuple:
    """(the device array, its values as numpy holds them: float32 for bfloat16)."""
    X = rt.astype(rt.array(x, device=device), getattr(rt, dtype))
    return X, (X.astype(rt.float32).numpy() if dtype == "bfloat16" else x)


def np_argsort(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    if descending:  # stable: equal elements keep their order, NaNs first (the flipped ascending sort)
        n = x.shape[axis]
        return n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    return np.argsort(x, axis=axis, kind="stable")


def bits(x: np.ndarray) -> np.ndarray:
    """Values compared bit for bit (-0.0 apart from 0.0, NaNs by payload)."""
    return x.view(f"u{x.dtype.itemsize}") if x.dtype.kind == "f" else x


def check_sorts(X, host: np.ndarray, axis: int, where: str) -> None:
    for descending in (False, True):
        order = np_argsort(host, axis, descending)
        got = rt.argsort(X, axis=axis, descending=descending)
        assert got.dtype == rt.int64
        np.testing.assert_array_equal(got.numpy(), order, err_msg=f"argsort {where} descending={descending}")
        values = rt.sort(X, axis=axis, descending=descending)
        assert values.dtype == X.dtype
        have = values.astype(rt.float32).numpy() if X.dtype == rt.bfloat16 else values.numpy()
        np.testing.assert_array_equal(bits(have), bits(np.take_along_axis(host, order, axis)),
                                      err_msg=f"sort {where} descending={descending}")


SHAPES = [((5, 1), 1), ((3, 7), 1), ((4, 64), 1), ((3, 65), 1), ((2, 200), 1), ((2, 700), 1), ((300,), 0),
          ((40, 3), 0), ((3, 90, 2), 1), ((0, 5), 1), ((5, 0), 1), ((6, 130), -1)]


@pytest.mark.parametrize("dtype", REAL)
def test_sorts_every_real_dtype_like_numpy(gpu_like, small_tiles, dtype):
    rng = np.random.default_rng(31)
    for shape, axis in SHAPES:
        X, host = on_device(sample(rng, dtype, shape), dtype, gpu_like)
        check_sorts(X, host, axis, f"{dtype} {shape} axis {axis}")


@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_sorts_at_the_real_tile_size(gpu_like, dtype):
    """Rows at and around the 2048-element tile and many short rows in one tile."""
    rng = np.random.default_rng(32)
    for shape in ((3, 2048), (2, 2049), (1, 5000), (700, 5), (33, 64)):
        X, host = on_device(sample(rng, dtype, shape), dtype, gpu_like)
        check_sorts(X, host, 1, f"{dtype} {shape}")


@pytest.fixture
def small_radix(monkeypatch):
    """The radix sort from rows of 300 (one row), tiles of 256 elements (one a thread), at most 4
    workgroups (each walks several tiles)."""
    monkeypatch.setattr(radix, "MIN_N", 300)
    monkeypatch.setattr(radix, "ITEMS", 1)
    monkeypatch.setattr(radix, "BLOCKS", 4)
    rt.clear_graph_cache()
    yield
    rt.clear_graph_cache()


@pytest.mark.parametrize("dtype", REAL)
def test_radix_sorts_one_long_row_like_numpy(gpu_like, small_tiles, small_radix, dtype):
    """One row from MIN_N on: a pass a byte of the key (1 for bool and int8, 8 for int64), the row
    a whole number of tiles or not, fewer tiles than workgroups or more; stable, NaNs last (first
    descending), -0.0 and 0.0 in their order."""
    rng = np.random.default_rng(36)
    for n in (300, 512, 1000, 2345):
        X, host = on_device(sample(rng, dtype, (n,)), dtype, gpu_like)
        check_sorts(X, host, 0, f"{dtype} ({n},)")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_radix_sort_scans_many_workgroups_counts(gpu_like, small_tiles, small_radix, monkeypatch, dtype):
    """Past SERIAL_SCAN workgroups, a workgroup scans each digit's counts (and 40 workgroups of 2
    tiles each here)."""
    monkeypatch.setattr(radix, "BLOCKS", 40)
    rng = np.random.default_rng(38)
    X, host = on_device(sample(rng, dtype, (20000,)), dtype, gpu_like)
    check_sorts(X, host, 0, f"{dtype} (20000,)")


def test_radix_sort_traces_under_compile(gpu_like, small_tiles, small_radix):
    """A long row's passes are one node's dispatches: rt.compile replays them with new inputs."""
    rng = np.random.default_rng(37)
    f = rt.compile(lambda a: rt.argsort(a, descending=True))
    for _ in range(3):
        x = rng.integers(-50, 50, 900).astype(np.int32)
        np.testing.assert_array_equal(f(rt.array(x, device=gpu_like)).numpy(), np_argsort(x, 0, True))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int16", "uint32", "bool"])
def test_searchsorted_like_numpy(gpu_like, dtype):
    """Both sides, NaNs and ties in both arrays, a sorter, values of another dtype promoted."""
    rng = np.random.default_rng(34)
    a = sample(rng, dtype, (257,))
    A, host_a = on_device(a, dtype, gpu_like)
    V, host_v = on_device(sample(rng, dtype, (5, 40)), dtype, gpu_like)
    ordered = np.sort(host_a, kind="stable")
    S = rt.sort(A)
    for side in ("left", "right"):
        got = rt.searchsorted(S, V, side=side)
        assert got.dtype == rt.int64 and got.shape == (5, 40)
        np.testing.assert_array_equal(got.numpy(), np.searchsorted(ordered, host_v, side=side), err_msg=side)
        sorter = np.argsort(host_a, kind="stable")
        got = rt.searchsorted(A, V, side=side, sorter=rt.array(sorter, device=gpu_like))
        np.testing.assert_array_equal(got.numpy(), np.searchsorted(host_a, host_v, side=side, sorter=sorter))
    if dtype == "int16":  # promoted with float values: numpy's result type
        values = np.array([-2.5, 0.5, 3.0, np.nan], np.float64)
        got = rt.searchsorted(S, rt.array(values, device=gpu_like))
        np.testing.assert_array_equal(got.numpy(), np.searchsorted(ordered, values))


def test_sorts_run_under_compile_and_keep_the_gradient(gpu_like):
    """sort and argsort are device nodes, so rt.compile traces them; the gradient of sort still
    goes back to where each element came from."""
    rng = np.random.default_rng(35)
    x = rng.standard_normal((4, 300)).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    f = rt.compile(lambda a: rt.sort(a, axis=1, descending=True)[:, :5] + rt.argsort(a, axis=1)[:, :5])
    want = -np.sort(-x, axis=1)[:, :5] + np.argsort(x, axis=1, kind="stable")[:, :5]
    for _ in range(2):
        np.testing.assert_allclose(f(X).numpy(), want, rtol=1e-6)
    top = rt.grad(lambda a: rt.sort(a, axis=1, descending=True)[:, :3].sum())(X).numpy()
    mask = np.zeros_like(x)
    np.put_along_axis(mask, np.argsort(-x, axis=1, kind="stable")[:, :3], 1.0, axis=1)
    np.testing.assert_array_equal(top, mask)


def test_rows_past_the_kernels_limit_sort_on_the_host(gpu_like, monkeypatch):
    """Rows longer than the kernels' 32-bit positions allow (MAX_N, lowered here) are sorted and
    searched on the host, with the same results."""
    monkeypatch.setattr(sort_kernels, "MAX_N", 100)
    rng = np.random.default_rng(36)
    X, host = on_device(sample(rng, "float32", (2, 300)), "float32", gpu_like)
    check_sorts(X, host, 1, "past MAX_N")
    got = rt.argsort(X, axis=1)
    assert got.op is None  # (an uploaded host result, not a sort node)
    ordered = np.sort(host[0], kind="stable")
    np.testing.assert_array_equal(rt.searchsorted(rt.asarray(ordered, device=gpu_like), X[1]).numpy(),
                                  np.searchsorted(ordered, host[1]))


def test_repeat_with_counts_finds_its_indices_on_the_device(gpu_like, monkeypatch):
    """repeat with a count an element: each output's element found by searchsorted over the running
    counts (zero counts, every axis, counts given as a device array); differentiable; past MAX_N the
    indices are made on the host, with the same result."""
    rng = np.random.default_rng(37)
    x = rng.standard_normal((5, 300)).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    for axis, counts in ((0, [0, 3, 1, 0, 2]), (1, rng.integers(0, 4, 300)), (0, [0, 0, 0, 0, 0])):
        want = np.repeat(x, counts, axis=axis)
        np.testing.assert_array_equal(rt.repeat(X, counts, axis=axis).numpy(), want)
        np.testing.assert_array_equal(rt.repeat(X, rt.array(np.asarray(counts), device=gpu_like), axis=axis).numpy(),
                                      want)
    counts = [2, 0, 1, 3, 1]
    g = rt.grad(lambda a: (rt.repeat(a, counts, axis=0) * 2.0).sum())(rt.array(x[:, :4], device=gpu_like)).numpy()
    np.testing.assert_allclose(g, np.repeat(2.0 * np.asarray(counts, np.float32)[:, None], 4, axis=1))
    monkeypatch.setattr(sort_kernels, "MAX_N", 10)
    np.testing.assert_array_equal(rt.repeat(X, [0, 3, 1, 0, 9], axis=0).numpy(), np.repeat(x, [0, 3, 1, 0, 9], axis=0))
