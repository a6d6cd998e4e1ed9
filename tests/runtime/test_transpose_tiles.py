"""One-input ops of a transposed view (copies, casts, unary ops): the tiled variant on GPUs
(shared-memory tiles, both sides coalesced), checked against numpy on a GPU-lowered device running
the generated CUDA C (cuda_emu) and the kernels' numpy implementations, and the plan that picks it."""

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


@pytest.mark.parametrize("shape", [(50, 66), (64, 96)])  # 32x32 tiles; 64x64 vectors
def test_casts_and_unary_ops_through_the_tiles(gpu_like, shape):
    """Casts and unary ops of a transposed view: real, predicate, integer and complex results, and
    a two-input op beside them (which reads the transposed operand strided)."""
    x = host(shape, np.float32)
    a = rt.array(x, device=gpu_like)
    np.testing.assert_array_equal(a.T.astype(rt.float16).numpy(), x.T.astype(np.float16))
    np.testing.assert_array_equal(a.T.astype(rt.int32).numpy(), x.T.astype(np.int32))
    np.testing.assert_array_equal(a.T.astype(rt.complex64).numpy(), x.T.astype(np.complex64))
    np.testing.assert_allclose(rt.exp(a.T).numpy(), np.exp(x.T), rtol=1e-6)
    np.testing.assert_allclose(rt.tanh(a.T).numpy(), np.tanh(x.T), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal((-a.T).numpy(), -x.T)
    np.testing.assert_array_equal(rt.isnan(a.T).numpy(), np.isnan(x.T))
    np.testing.assert_array_equal(rt.floor(a.T * 10).numpy(), np.floor(x.T * np.float32(10)))
    i = rt.array((x * 100).astype(np.int32), device=gpu_like)
    np.testing.assert_array_equal(abs(i.T).numpy(), np.abs((x * 100).astype(np.int32)).T)
    z = host((20, 30), np.complex64)
    np.testing.assert_allclose(abs(rt.array(z, device=gpu_like).T).numpy(), np.abs(z.T), rtol=1e-6)
    np.testing.assert_allclose(rt.exp(rt.array(z, device=gpu_like).T).numpy(), np.exp(z.T), rtol=1e-5)


@pytest.mark.parametrize("shape", [(50, 66), (64, 96), (3, 40, 52)])  # 32x32 tiles; 64x64 vectors; a batch
def test_two_input_ops_with_a_transposed_operand(gpu_like, shape):
    """A transposed operand with a direct one (either side), two transposed ones, a scalar, a row
    broadcast down the output's rows, mixed dtypes and comparisons: each against numpy."""
    x = host(shape, np.float32, seed=8)
    y = host(shape, np.float32, seed=9)
    a, b = rt.array(x, device=gpu_like), rt.array(y, device=gpu_like)
    t = (0, 2, 1) if len(shape) == 3 else (1, 0)
    aT, bT, xT, yT = a.transpose(*t), b.transpose(*t), x.transpose(*t), y.transpose(*t)
    direct = rt.array(np.ascontiguousarray(yT), device=gpu_like)
    np.testing.assert_array_equal((aT + direct).numpy(), xT + yT)
    np.testing.assert_array_equal((direct - aT).numpy(), yT - xT)
    np.testing.assert_array_equal((aT * bT).numpy(), xT * yT)
    np.testing.assert_array_equal((aT * 3).numpy(), xT * np.float32(3))
    v = host(xT.shape[-1:], np.float32, seed=10)  # one row, broadcast down the output's rows
    np.testing.assert_array_equal((aT + rt.array(v, device=gpu_like)).numpy(), xT + v)
    np.testing.assert_array_equal(rt.maximum(aT, direct).numpy(), np.maximum(xT, yT))
    np.testing.assert_array_equal((aT > direct).numpy(), xT > yT)
    half = rt.array(np.ascontiguousarray(yT).astype(np.float16), device=gpu_like)
    np.testing.assert_array_equal((aT + half).numpy(), xT + np.ascontiguousarray(yT).astype(np.float16))


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


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (100, 72), (36, 44), (4, 8), (132, 200), (40, 56),
                                   (200, 136)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8", "int32"])
def test_aligned_transposes_move_vectors(gpu_like, shape, dtype):
    """Rows, columns and strides that are multiples of the vectors (4 elements of 4 bytes, 8 of 2 or
    1 byte; other layouts of the same dtypes take 32x32 tiles): the 64x64 tiles move a vector an
    access on both sides (whole tiles, tiles cut at the edges, layouts smaller than one tile)."""
    x = host(shape, dtype, seed=3)
    got = rt.array(x, device=gpu_like).T.copy()
    np.testing.assert_array_equal(got.numpy(), x.T)


def test_aligned_casts_batches_and_offsets_through_the_vectors(gpu_like):
    """Casts between 1-, 2- and 4-byte types, a batch of aligned transposes, and views whose offset
    is a multiple of 4 (vectors) beside ones whose offset or column stride is not (one element an
    access): each against numpy."""
    x = host((96, 120), np.float32, seed=4)
    a = rt.array(x, device=gpu_like)
    np.testing.assert_array_equal(a.T.astype(rt.float16).numpy(), x.T.astype(np.float16))
    np.testing.assert_array_equal(a.T.astype(rt.int32).numpy(), x.T.astype(np.int32))
    # (negative floats to uint8: the runtime's own cast of the untransposed array is the reference)
    np.testing.assert_array_equal(a.T.astype(rt.uint8).numpy(), a.astype(rt.uint8).numpy().T)
    np.testing.assert_array_equal(a.T.astype(rt.bool).numpy(), x.T.astype(bool))
    h = a.astype(rt.float16)
    np.testing.assert_array_equal(h.T.astype(rt.float32).numpy(), x.astype(np.float16).T.astype(np.float32))
    np.testing.assert_array_equal(a.astype(rt.bfloat16).T.astype(rt.float32).numpy(),
                                  a.astype(rt.bfloat16).astype(rt.float32).numpy().T)
    batch = host((3, 40, 52), np.float32, seed=5)
    np.testing.assert_array_equal(rt.array(batch, device=gpu_like).transpose(0, 2, 1).copy().numpy(),
                                  batch.transpose(0, 2, 1))
    w = host((70, 96), np.float32, seed=6)
    b = rt.array(w, device=gpu_like)
    for view, want in ((b[4:60, 8:88], w[4:60, 8:88]),  # offset 392, column stride 96: vectors
                       (b[4:60, 9:89], w[4:60, 9:89])):  # offset 393: one at a time
        np.testing.assert_array_equal(view.T.copy().numpy(), want.T)
    odd = rt.array(host((64, 90), np.float32, seed=7), device=gpu_like)  # column stride 90
    np.testing.assert_array_equal(odd[:, :64].T.copy().numpy(), odd.numpy()[:, :64].T)


def test_wide_tiles_for_small_elements_in_aligned_layouts():
    f32, f16, f64, c128 = rt.float32, rt.float16, rt.float64, rt.complex128
    aligned, offset_by_one, odd_rows = (1, 64, 128, 0, 64, 0), (1, 64, 128, 1, 64, 0), (2, 62, 128, 0, 64, 8192)
    assert elementwise.wide_tiles((f32, f32), aligned) and elementwise.wide_tiles((f16, rt.uint8), aligned)
    assert not elementwise.wide_tiles((f32, f64), aligned) and not elementwise.wide_tiles((c128, c128), aligned)
    assert not elementwise.wide_tiles((f32, f32), offset_by_one) and not elementwise.wide_tiles((f32, f32), odd_rows)
    for in_dt, out_dt in ((f32, f32), (f16, f32), (f64, f64), (c128, c128), (rt.bool, f32)):
        text = elementwise._tiled_cuda("cast", (in_dt,), "t", out_dt, out_dt, "a", out_dt.c_compute)
        small = max(in_dt.itemsize, out_dt.itemsize) <= 4
        assert ("tile0[64][65]" in text) == small and ("tile0[32][33]" in text) != small
        assert (f"rt_vec<{in_dt.c_storage}, {elementwise.tile_vector(in_dt, out_dt)}>" in text) == small, \
            "vectors in the wide tiles only"
    # vectors of 16 bytes at most, 8 elements at most; none for elements of 8 bytes
    assert [elementwise.tile_vector(a, b) for a, b in ((f32, f32), (f16, f16), (rt.uint8, rt.uint8), (f32, f16),
                                                       (f16, f64))] == [4, 8, 8, 4, 1]
    rows_of_four = (1, 64, 132, 0, 64, 0)  # a multiple of 4 columns, not of 8
    assert elementwise.wide_tiles((f32, f32), rows_of_four) and not elementwise.wide_tiles((f16, f16), rows_of_four)


@pytest.mark.parametrize("shape", [(3, 129, 65), (3, 128, 68)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool", "complex64"])
def test_transposes_on_every_device(dev, dtype, shape):
    """The same on every driver (the GPUs' tiles on cuda, vectors where the layout is aligned to
    them; numpy's strides on the CPU drivers)."""
    x = host(shape, dtype, seed=2)
    a = rt.array(x, device=dev)
    np.testing.assert_array_equal(a.transpose(0, 2, 1).copy().numpy(), x.transpose(0, 2, 1))
    np.testing.assert_array_equal(a[2].T.copy().numpy(), x[2].T)
    np.testing.assert_array_equal(a[:, 1:, 2:].transpose(2, 1, 0).copy().numpy(), x[:, 1:, 2:].transpose(2, 1, 0))


@pytest.mark.parametrize("shape", [(3, 129, 65), (3, 128, 68)])
def test_two_input_ops_of_transposes_on_every_device(dev, shape):
    """A transposed operand beside a direct one, two transposed ones and a scalar, on every driver."""
    x, y = host(shape, "float32", seed=12), host(shape, "float32", seed=13)
    a, b = rt.array(x, device=dev), rt.array(y, device=dev)
    direct = rt.array(np.ascontiguousarray(y.transpose(0, 2, 1)), device=dev)
    np.testing.assert_array_equal((a.transpose(0, 2, 1) + direct).numpy(), x.transpose(0, 2, 1) + y.transpose(0, 2, 1))
    np.testing.assert_array_equal((a.transpose(0, 2, 1) * b.transpose(0, 2, 1) - 1).numpy(),
                                  x.transpose(0, 2, 1) * y.transpose(0, 2, 1) - np.float32(1))


def _plan_of_copy(view, ctx):
    node = view.copy()
    return elementwise.plan_copy(node, (view.shape, view.strides, view.offset), ctx)


def test_a_transposed_view_plans_the_tiled_variant_on_gpus_only(gpu_like):
    x = host((100, 70), np.float32)
    a = rt.array(x, device=gpu_like)
    ((kind, _, name, grid, consts, _),) = _plan_of_copy(a.T, context_for(gpu_like))
    assert kind == "dispatch" and name.endswith("_t")
    assert grid == ((100 + 31) // 32, (70 + 31) // 32, 1)  # column tiles, row tiles, batches
    # one batch of 70 rows, 100 columns, each column 70 apart; 70 rows are no multiple of 4: 32x32 tiles
    assert consts == [1, 70, 100, 0, 70, 0, 0]
    aligned = rt.array(host((100, 72), np.float32), device=gpu_like)
    ((_, _, name, grid, consts, _),) = _plan_of_copy(aligned.T, context_for(gpu_like))
    assert grid == ((100 + 63) // 64, (72 + 63) // 64, 1) and consts == [1, 72, 100, 0, 72, 0, 1], "64x64 vectors"
    wide = rt.array(host((100, 72), np.float64), device=gpu_like)
    ((_, _, name, grid, consts, _),) = _plan_of_copy(wide.T, context_for(gpu_like))
    assert name.endswith("_t") and grid == ((100 + 31) // 32, (72 + 31) // 32, 1), "8-byte elements: 32x32 tiles"
    assert consts[-1] == 0
    cpu = rt.array(x, device="local-sync")
    ((_, _, name, _, _, _),) = _plan_of_copy(cpu.T, context_for("local-sync"))
    assert name.endswith("_g"), "a CPU device reads strides with numpy: no tiles"
    batched = rt.array(host((4, 30, 20), np.float32), device=gpu_like).transpose(0, 2, 1)
    ((_, _, name, grid, consts, _),) = _plan_of_copy(batched, context_for(gpu_like))
    assert name.endswith("_t") and grid == (1, 1, 4) and consts == [4, 20, 30, 0, 20, 600, 0]  # (30 columns: not wide)
    ((_, _, name, _, _, _),) = _plan_of_copy(a[:, ::2].T, context_for(gpu_like))
    assert name.endswith("_g"), "rows read 2 apart: no unit-stride dim to tile along"
    view = a.T
    cast = view.astype(rt.float16)
    ((_, _, name, _, _, _),) = elementwise.plan(cast, [(view.shape, view.strides, view.offset)], context_for(gpu_like))
    assert name.endswith("_t"), "a cast takes the tiles"
    exp = rt.exp(view)
    ((_, src, name, _, _, _),) = elementwise.plan(exp, [(view.shape, view.strides, view.offset)],
                                                  context_for(gpu_like))
    assert name.endswith("_t") and src.key[0] == "ew_t", "unary ops take the tiles too, from a source of their own"
    assert all(not e.name.endswith("_t") for e in elementwise.ew_source("exp", (rt.float32,), rt.float32,
                                                                          rt.float32).exports)
    total = rt.array(host((70, 100), np.float32), device=gpu_like)
    add = view + total
    plans = elementwise.plan(add, [(view.shape, view.strides, view.offset), (total.shape, (100, 1), 0)],
                             context_for(gpu_like))
    assert plans[0][2].endswith("_ttd") and plans[0][1].key[0] == "ew_t", "a transposed operand and a direct one"
    where = rt.where(view > 0, view, total)
    layouts = [(view.shape, view.strides, view.offset)] * 2 + [(total.shape, (100, 1), 0)]
    assert elementwise.plan(where, layouts, context_for(gpu_like))[0][2].endswith("_g"), "three inputs: strided"
