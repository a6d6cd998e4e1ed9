"""A take from a strided view (columns of a table, every other row, a window of a 3-D array) reads
the view in place through its outer and axis strides (kernels/take.py ``source_strides``,
``reads_in_place``); a view its kernel cannot read so (reversed, transposed), or would read without
the vectors its copy keeps, is copied first. Every driver, the GPU lowering
(numpy kernels and the CUDA C emulated), folded epilogues and gradients, against numpy."""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import DEVICES

import runtime as rt
from runtime.kernels.take import reads_in_place, source_strides

#: name -> (the view of x (a numpy-style function), axis, whether it is read in place)
VIEWS = {
    "columns": (lambda x: x[:, 2:14], 0, True),
    "every other row": (lambda x: x[::2], 0, True),
    "a window, along its columns": (lambda x: x[1:40:3, 1:13], 1, True),
    "wide columns (a row at a time)": (lambda x: x[:, :768], 0, True),
    "wide columns, off by one (element by element)": (lambda x: x[:, 1:769], 0, True),
    "odd columns (element by element either way)": (lambda x: x[:, 1:8], 0, True),
    "a few columns off by two, gathered into more rows than they have (copied: its copy keeps the vectors)": (
        lambda x: x[:4, 2:10], 0, False),
    "a 3-D window, along its middle axis": (lambda x: x.reshape(8, 6, 1024)[:, 1:5, 8:520], 1, True),
    "one row broadcast (a stride of 0 at the axis)": (
        lambda x: (np if isinstance(x, np.ndarray) else rt).broadcast_to(x[3], (48, 1024)), 0, True),
    "reversed rows": (lambda x: x[::-1], 0, False),
    "transposed": (lambda x: x.T, 0, False),
}


def _table(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(5)
    return (rng.standard_normal((48, 1024)) * 4).astype(dtype)


def _source_of(taken):
    """The take node's source (the node itself, or what a reshape of it views)."""
    node = taken.base if taken.base is not None else taken
    assert node.op == "take"
    return node.inputs[0]


def _check(device, name: str, dtype: str) -> None:
    view, axis, in_place = VIEWS[name]
    x = _table(dtype)
    xv = view(x)
    n = xv.shape[axis]
    idx = np.random.default_rng(1).integers(-n, n, (3, 5))
    got = rt.take(view(rt.array(x, device=device)), rt.array(idx, device=device), axis=axis)
    assert (_source_of(got).op != "copy") == in_place
    np.testing.assert_array_equal(got.numpy(), np.take(xv, idx, axis=axis))
    along = np.random.default_rng(2).integers(0, n, tuple(3 if a == axis else d for a, d in enumerate(xv.shape)))
    got = rt.take_along_axis(view(rt.array(x, device=device)), rt.array(along, device=device), axis=axis)
    np.testing.assert_array_equal(got.numpy(), np.take_along_axis(xv, along, axis))


@pytest.mark.parametrize("uri", DEVICES)
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_takes_from_views_on_every_driver(uri, name):
    _check(uri, name, "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "complex64"])
@pytest.mark.parametrize("name", sorted(VIEWS))
def test_takes_from_views_lowered_for_a_gpu(gpu_like, name, dtype):
    _check(gpu_like, name, dtype)


@pytest.mark.parametrize("name", ["columns", "wide columns (a row at a time)",
                                  "wide columns, off by one (element by element)"])
def test_a_folded_take_from_a_view(gpu_like, monkeypatch, name):
    """The take's epilogue kernel reads the view too: bit for bit what the two kernels give."""
    monkeypatch.setenv("RUNTIME_FUSE_AFTER", "1")
    view, axis, _ = VIEWS[name]
    x = _table("float32")
    xv = view(x)
    pos = np.random.default_rng(3).standard_normal((5, xv.shape[1])).astype(np.float32)
    idx = np.random.default_rng(4).integers(0, xv.shape[0], (3, 5))
    got = rt.take(view(rt.array(x, device=gpu_like)), rt.array(idx, device=gpu_like), axis=0) + rt.array(
        pos, device=gpu_like)
    np.testing.assert_array_equal(got.numpy(), xv[idx] + pos)


@pytest.mark.parametrize("uri", [*DEVICES[:1]])
def test_gradients_through_a_take_from_a_view(uri):
    """The gradient lands in the viewed columns (zeros elsewhere), repeated indices summed."""
    x = _table("float32")[:10]
    idx = np.array([[1, 3, 3], [0, 9, 1]])
    g = rt.grad(lambda a: rt.sum(rt.take(a[:, 2:14], rt.array(idx, device=uri), axis=0) ** 2))(rt.array(x, device=uri))
    want = np.zeros_like(x)
    np.add.at(want[:, 2:14], idx.reshape(-1), 2 * x[:, 2:14][idx.reshape(-1)])
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-6)


def test_views_read_in_place_unless_their_copy_is_cheaper():
    assert reads_in_place((48, 768), (1024, 1), 0, 768, 48, 15 * 768)
    assert reads_in_place((48, 768), (1024, 1), 1, 768, 48, 15 * 768)  # off by one, a few rows looked up
    assert not reads_in_place((48, 768), (1024, 1), 1, 768, 48, 100 * 768)  # more rows than it has: copied
    assert not reads_in_place((48, 768), (1025, 1), 0, 768, 48, 100 * 768)  # rows off by one, likewise
    assert reads_in_place((48, 7), (1024, 1), 1, 7, 48, 100 * 7)  # no vectors either way
    assert not reads_in_place((48, 8), (-1024, 1), 0, 8, 48, 8)  # reversed


def test_source_strides_rules():
    assert source_strides((50000, 512), (1024, 1), 512, 50000) == (0, 1024)
    assert source_strides((3, 4, 5), (40, 5, 1), 5, 4) == (40, 5)
    assert source_strides((3, 4, 5), (40, 10, 2), 5, 4) is None  # inner elements not in order
    assert source_strides((2, 3, 4, 5), (120, 40, 5, 1), 5, 4) == (40, 5)  # outer dims collapse
    assert source_strides((2, 3, 4, 5), (200, 40, 5, 1), 5, 4) is None  # they do not
    assert source_strides((4, 5), (-5, 1), 5, 4) is None  # reversed
    assert source_strides((1, 4, 1, 5), (7, 5, 99, 1), 5, 4) == (0, 5)  # size-1 dims ignored
