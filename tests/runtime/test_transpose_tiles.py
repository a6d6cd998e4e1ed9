"""Copies and casts of a transposed view: the tiled variant on GPUs (shared-memory tiles, both sides
coalesced), checked against numpy on a GPU-lowered device running the generated CUDA C (cuda_emu)
and the kernels' numpy implementations, and the plan that picks it."""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import rand

import runtime as rt
from runtime.device import context_for
from runtime.kernels import elementwise


def host(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "c":  # (rt_helpers.rand makes real data only)
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rand(shape, np.dtype(dtype).name, rng)


@pytest.mark.parametrize("shape", [(33, 70), (64, 32), (2, 2), (1, 45), (45, 1), (200, 3)])
def test_transposed_copies_of_any_shape(gpu_like, shape):
    """Tiles cut at the edges (sizes not multiples of 32), rows or columns of one element (the
    strided variant takes those: nothing to tile)."""
    x = host(shape, np.float32)
    got = rt.array(x, device=gpu_like).T.copy()
    np.testing.assert_array_equal(got.numpy(), x.T)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "int64", "uint8", "bool", "complex64",
                                   "complex128"])
def test_transposed_copies_of_every_dtype(gpu_like, dtype):
    x = host((37, 41), dtype)
    got = rt.array(x, device=gpu_like).T.copy()
    np.testing.assert_array_equal(got.numpy(), x.T)


def test_bfloat16_transposed(gpu_like):
    x = host((40, 35), np.float32)
    b = rt.array(x, device=gpu_like).astype(rt.bfloat16)
    want = b.astype(rt.float32).numpy().T
    np.testing.assert_array_equal(b.T.copy().astype(rt.float32).numpy(), want)
    np.testing.assert_array_equal(b.T.astype(rt.float32).numpy(), want)  # a cast through the tiles


def test_casts_through_the_tiles_and_other_ops_beside_them(gpu_like):
    """Casts take the tiles; other one-input ops of a transposed view keep the strided variant."""
    x = host((50, 66), np.float32)
    a = rt.array(x, device=gpu_like)
    np.testing.assert_array_equal(a.T.astype(rt.float16).numpy(), x.T.astype(np.float16))
    np.testing.assert_array_equal(a.T.astype(rt.int32).numpy(), x.T.astype(np.int32))
    np.testing.assert_array_equal(a.T.astype(rt.complex64).numpy(), x.T.astype(np.complex64))
    np.testing.assert_allclose(rt.exp(a.T).numpy(), np.exp(x.T), rtol=1e-6)
    np.testing.assert_array_equal((-a.T).numpy(), -x.T)
    np.testing.assert_array_equal(rt.isnan(a.T).numpy(), np.isnan(x.T))
    z = host((20, 30), np.complex64)
    np.testing.assert_allclose(abs(rt.array(z, device=gpu_like).T).numpy(), np.abs(z.T), rtol=1e-6)


def test_batched_sliced_and_offset_transposes(gpu_like):
    """A batch of transposes (the batch stride is the input's), views at an offset, a column stride
    larger than the rows (a slice of a wider array), and a layout that is no transpose (row stride 2)."""
    x = host((3, 40, 50), np.float32)
    a = rt.array(x, device=gpu_like)
    np.testing.assert_array_equal(a.transpose(0, 2, 1).copy().numpy(), x.transpose(0, 2, 1))
    np.testing.assert_array_equal(a[1:, 5:, 3:].transpose(0, 2, 1).copy().numpy(), x[1:, 5:, 3:].transpose(0, 2, 1))
    w = host((70, 90), np.float32)
    b = rt.array(w, device=gpu_like)
    np.testing.assert_array_equal(b[7:60, 11:80].T.copy().numpy(), w[7:60, 11:80].T)
    np.testing.assert_array_equal(b[:, ::2].T.copy().numpy(), w[:, ::2].T)
    np.testing.assert_array_equal(b[::3].T.copy().numpy(), w[::3].T)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool", "complex64"])
def test_transposes_on_every_device(dev, dtype):
    """The same on every driver (the GPUs' tiles on cuda; numpy's strides on the CPU drivers)."""
    x = host((3, 129, 65), dtype, seed=2)
    a = rt.array(x, device=dev)
    np.testing.assert_array_equal(a.transpose(0, 2, 1).copy().numpy(), x.transpose(0, 2, 1))
    np.testing.assert_array_equal(a[2].T.copy().numpy(), x[2].T)
    np.testing.assert_array_equal(a[:, 1:, 2:].transpose(2, 1, 0).copy().numpy(), x[:, 1:, 2:].transpose(2, 1, 0))


def _plan_of_copy(view, ctx):
    node = view.copy()
    return elementwise.plan_copy(node, (view.shape, view.strides, view.offset), ctx)


def test_a_transposed_view_plans_the_tiled_variant_on_gpus_only(gpu_like):
    x = host((100, 70), np.float32)
    a = rt.array(x, device=gpu_like)
    ((kind, _, name, grid, consts, _),) = _plan_of_copy(a.T, context_for(gpu_like))
    assert kind == "dispatch" and name.endswith("_t")
    assert grid == ((100 + 31) // 32, (70 + 31) // 32, 1)  # column tiles, row tiles, batches
    assert consts == [1, 70, 100, 0, 70, 0]  # one batch of 70 rows, 100 columns, each column 70 apart
    cpu = rt.array(x, device="local-sync")
    ((_, _, name, _, _, _),) = _plan_of_copy(cpu.T, context_for("local-sync"))
    assert name.endswith("_g"), "a CPU device reads strides with numpy: no tiles"
    batched = rt.array(host((4, 30, 20), np.float32), device=gpu_like).transpose(0, 2, 1)
    ((_, _, name, grid, consts, _),) = _plan_of_copy(batched, context_for(gpu_like))
    assert name.endswith("_t") and grid == (1, 1, 4) and consts == [4, 20, 30, 0, 20, 600]
    ((_, _, name, _, _, _),) = _plan_of_copy(a[:, ::2].T, context_for(gpu_like))
    assert name.endswith("_g"), "rows read 2 apart: no unit-stride dim to tile along"
    view = a.T
    cast = view.astype(rt.float16)
    ((_, _, name, _, _, _),) = elementwise.plan(cast, [(view.shape, view.strides, view.offset)], context_for(gpu_like))
    assert name.endswith("_t"), "a cast takes the tiles"
    exp = rt.exp(view)
    ((_, _, name, _, _, _),) = elementwise.plan(exp, [(view.shape, view.strides, view.offset)], context_for(gpu_like))
    assert name.endswith("_g"), "other ops read the transposed view strided"
