"""nonzero and boolean-mask indexing compacted on the device (runtime/kernels/compact.py) against numpy's,
lowered as on a GPU (the generated CUDA C compiled for the CPU, and the kernels' numpy forms): masks of
one tile and of several, empty and full ones, every way a mask enters an index."""

from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime import indexing
from runtime.kernels import compact, radix
from runtime.kernels import sort as sort_kernels


@pytest.mark.parametrize("n", [1, 7, 2047, 2048, 2049, 10000])
def test_nonzero_of_masks_of_every_density(gpu_like, n):
    rng = np.random.default_rng(n)
    for density in (0.0, 0.01, 0.5, 1.0):
        mask = rng.random(n) < density
        got, = rt.nonzero(rt.array(mask, device=gpu_like))
        assert got.dtype == rt.int64
        np.testing.assert_array_equal(got.numpy(), np.nonzero(mask)[0], err_msg=f"{n} {density}")


def test_nonzero_of_nd_arrays_of_every_dtype(gpu_like):
    rng = np.random.default_rng(40)
    for dtype in ("float32", "int8", "uint64", "bool", "complex64", "bfloat16"):
        x = rng.integers(-1, 2, (3, 50, 70))
        if dtype == "complex64":
            host = (x + 1j * (rng.random(x.shape) < 0.1)).astype(np.complex64)
        else:
            host = x.astype(np.float32 if dtype == "bfloat16" else dtype)
        X = rt.array(host, device=gpu_like)
        if dtype == "bfloat16":
            X = rt.astype(X, rt.bfloat16)
        got = rt.nonzero(X)
        assert len(got) == 3
        for g, w in zip(got, np.nonzero(host)):
            np.testing.assert_array_equal(g.numpy(), w, err_msg=dtype)
    assert [a.shape for a in rt.nonzero(rt.zeros((0, 4), device=gpu_like))] == [(0,), (0,)]
    with pytest.raises(rt.errors.InvalidValueError, match="0-d"):
        rt.nonzero(rt.asarray(1.0, device=gpu_like))


def test_boolean_masks_index_on_the_device(gpu_like):
    """Whole-array, leading-axes and mixed masks; the mask computed on the device; the gradient
    through the selection; x.at[mask].add."""
    rng = np.random.default_rng(41)
    x = rng.standard_normal((6, 500, 3)).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    np.testing.assert_array_equal(X[X > 0.5].numpy(), x[x > 0.5])
    lead = rng.random((6, 500)) < 0.3
    np.testing.assert_array_equal(X[rt.array(lead, device=gpu_like)].numpy(), x[lead])
    np.testing.assert_array_equal(X[rt.array(lead, device=gpu_like), 1:].numpy(), x[lead, 1:])
    rows = rng.random(500) < 0.5
    np.testing.assert_array_equal(X[:, rt.array(rows, device=gpu_like), 2].numpy(), x[:, rows, 2])
    np.testing.assert_array_equal(X[X > 100].numpy(), x[x > 100])  # nothing selected
    small = x[:2, :40]  # (a sum short enough for one workgroup: the numpy forms split no reduction)
    g = rt.grad(lambda a: (a[a > 0] ** 2).sum())(rt.array(small, device=gpu_like)).numpy()
    np.testing.assert_allclose(g, np.where(small > 0, 2 * small, 0), rtol=1e-6)
    added = X.at[X < 0].add(1.0).numpy()
    np.testing.assert_allclose(added, np.where(x < 0, x + 1, x), rtol=1e-6)
    with pytest.raises(rt.errors.InvalidIndexError, match="does not match"):
        X[rt.array(rng.random((5, 500)) < 0.5, device=gpu_like)]
    np.testing.assert_array_equal(X[X > 0].numpy(), x[x > 0])  # still usable


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "uint64"])
def test_integer_at_add_scatters_on_the_device_and_wraps_as_numpy(gpu_like, monkeypatch, dtype):
    """x.at[indices].add(v) of integers: added in uint64 on the device (repeated indices add up),
    wrapping in the dtype as numpy's add.at does; a mask's positions and indices computed on the device
    (checked there: one out of range raises IndexError when the result is read). Nothing goes through
    the host."""

    def no_host(*args):
        raise AssertionError("x.at[...].add of integers went through the host")

    monkeypatch.setattr(indexing._At, "_update_on_host", no_host)
    rng = np.random.default_rng(46)
    info = np.iinfo(dtype)
    x = rng.integers(info.min // 2 if info.min else 0, info.max // 2, (6, 70)).astype(dtype)
    idx = rng.integers(0, 6, 300)
    value = rng.integers(-3 if info.min else 0, 100, (300, 70)).astype(dtype)
    X = rt.array(x, device=gpu_like)
    want = x.copy()
    np.add.at(want, idx, value)
    got = X.at[rt.array(idx, device=gpu_like)].add(rt.array(value, device=gpu_like))
    assert got.dtype == X.dtype
    np.testing.assert_array_equal(got.numpy(), want)
    want = x.copy()
    np.add.at(want, x > 3, np.array(5, dtype))
    np.testing.assert_array_equal(X.at[X > 3].add(5).numpy(), want)
    with pytest.raises(IndexError):
        X.at[rt.array(np.array([1, 6]), device=gpu_like)].add(1).numpy()
    np.testing.assert_array_equal(X.at[[0, 0]].add(1).numpy()[0], x[0] + np.array(2, dtype))  # still usable


@pytest.mark.parametrize("dtype", ["float32", "int16", "bool", "complex64"])
def test_at_set_with_array_indices_on_the_device(gpu_like, monkeypatch, dtype):
    """x.at[indices].set(v) of every kind of dtype on the device (nothing through the host): where
    indices repeat the last value stays, as numpy's indexed assignment leaves it; masks; an index
    computed on the device out of range raises IndexError when the result is read."""

    def no_host(*args):
        raise AssertionError("x.at[...].set went through the host")

    monkeypatch.setattr(indexing._At, "_update_on_host", no_host)
    rng = np.random.default_rng(47)
    x = (rng.standard_normal((40, 30)) * 10).astype(dtype)
    idx = rng.integers(0, 40, 700)  # every row named many times
    value = (rng.standard_normal((700, 30)) * 10).astype(dtype)
    X = rt.array(x, device=gpu_like)
    want = x.copy()
    want[idx] = value
    got = X.at[rt.array(idx, device=gpu_like)].set(rt.array(value, device=gpu_like))
    assert got.dtype == X.dtype
    np.testing.assert_array_equal(got.numpy(), want)
    want = x.copy()
    want[:, [3, 3, 7]] = value[:40, :3]
    np.testing.assert_array_equal(X.at[:, np.array([3, 3, 7])].set(rt.array(value[:40, :3], device=gpu_like)).numpy(),
                                  want)
    mask = rng.random((40, 30)) < 0.3
    want = x.copy()
    want[mask] = value[0, 0]
    np.testing.assert_array_equal(X.at[rt.array(mask, device=gpu_like)].set(value[0, 0]).numpy(), want)
    with pytest.raises(IndexError):
        X.at[rt.array(np.array([1, 40]), device=gpu_like)].set(value[0]).numpy()
    np.testing.assert_array_equal(X.at[[0]].set(value[0]).numpy()[0], value[0])  # still usable


def test_masks_past_the_kernels_limit_compact_on_the_host(gpu_like, monkeypatch):
    monkeypatch.setattr(compact, "MAX_N", 100)
    mask = np.random.default_rng(42).random(300) < 0.5
    got, = rt.nonzero(rt.array(mask, device=gpu_like))
    assert got.op is None  # (an uploaded host result)
    np.testing.assert_array_equal(got.numpy(), np.nonzero(mask)[0])


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "int16", "uint8", "bool", "complex64"])
def test_unique_functions_on_the_device(gpu_like, dtype):
    """unique_all's four results against numpy's (every NaN its own value, -0.0 equal to 0.0, first
    occurrences as indices), over several tiles and for an empty array; complex values on the host."""
    rng = np.random.default_rng(44)
    if dtype == "bool":
        x = rng.random((40, 90)) < 0.3
    elif dtype == "complex64":
        x = (rng.integers(0, 4, (40, 90)) + 1j * rng.integers(0, 2, (40, 90))).astype(np.complex64)
    elif dtype in ("float32", "float64", "bfloat16"):
        pool = np.array([np.nan, 0.0, -0.0, 1.5, -2.0, np.inf, 3.0, 0.25], np.float32)
        x = rng.choice(pool, (40, 90)).astype(np.float64 if dtype == "float64" else np.float32)
    else:
        x = rng.integers(0, 50, (40, 90)).astype(dtype)
    X = rt.array(x, device=gpu_like)
    if dtype == "bfloat16":
        X = rt.astype(X, rt.bfloat16)
    values, index, inverse, counts = np.unique(x.reshape(-1), return_index=True, return_inverse=True,
                                               return_counts=True, equal_nan=False)
    got = rt.unique_all(X)
    have = got.values.astype(rt.float32).numpy() if dtype == "bfloat16" else got.values.numpy()
    np.testing.assert_array_equal(have, values)
    np.testing.assert_array_equal(got.indices.numpy(), index)
    np.testing.assert_array_equal(got.inverse_indices.numpy(), inverse.reshape(x.shape))
    np.testing.assert_array_equal(got.counts.numpy(), counts)
    np.testing.assert_array_equal(rt.unique_counts(X).counts.numpy(), counts)
    np.testing.assert_array_equal(rt.unique_inverse(X).inverse_indices.numpy(), inverse.reshape(x.shape))
    empty = rt.unique_all(rt.zeros((0, 3), dtype=X.dtype, device=gpu_like))
    assert [a.shape for a in empty] == [(0,), (0,), (0, 3), (0,)]


def test_unique_of_a_long_array_through_the_radix_sort(gpu_like, monkeypatch):
    """A flattened array long enough for the radix sort (bounds lowered here): the four results as
    numpy's, the inverse put back in x's order by the scatter through the sort's order."""
    monkeypatch.setattr(radix, "MIN_N", 300)
    monkeypatch.setattr(radix, "ITEMS", 1)
    monkeypatch.setattr(radix, "BLOCKS", 4)
    monkeypatch.setattr(sort_kernels, "TILE", 64)
    rt.clear_graph_cache()
    x = np.random.default_rng(45).integers(-30, 30, (25, 41)).astype(np.int16)
    values, index, inverse, counts = np.unique(x.reshape(-1), return_index=True, return_inverse=True,
                                               return_counts=True)
    got = rt.unique_all(rt.array(x, device=gpu_like))
    for have, want in zip(got, (values, index, inverse.reshape(x.shape), counts)):
        np.testing.assert_array_equal(have.numpy(), want)
    rt.clear_graph_cache()


def test_selections_of_data_dependent_shape_refuse_to_be_traced(gpu_like):
    """Under rt.compile a mask's count cannot be read: a TracingError names the functions and what to
    do; masks on another device are read through the host; the device stays usable."""
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    X = rt.array(x, device=gpu_like)
    for fn in (lambda v: v[v > 3], rt.nonzero, lambda v: rt.unique_values(v)):
        with pytest.raises(rt.errors.TracingError, match="depends on the data"):
            rt.compile(fn)(X)
    other = rt.array(x > 4, device="local-task")
    np.testing.assert_array_equal(X[other].numpy(), x[x > 4])
    np.testing.assert_array_equal(X[rt.array(x[:, 0] > 2, device="local-task"), 1:].numpy(), x[x[:, 0] > 2, 1:])
    np.testing.assert_array_equal(X[X > 3].numpy(), x[x > 3])
