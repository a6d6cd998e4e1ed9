"""rt.concat and rt.stack: one node, each input copied into its window (kernels/concat.py), against numpy.

Run on every runtime device and on a CPU device lowered as a GPU (the generated CUDA C compiled for
the CPU, and its numpy twin), so that every copy width of the kernel (16, 8, 4, 2 and 1 bytes a
thread) meets rows that allow it and rows that do not.
"""

from __future__ import annotations

import numpy as np
import pytest

import runtime as rt

CASES = [
    # (shapes, axis, dtype)
    ([(3, 4), (3, 2)], 1, np.float32),
    ([(3, 4), (5, 4), (1, 4)], 0, np.float32),
    ([(2, 3, 4), (2, 1, 4), (2, 5, 4)], 1, np.float64),
    ([(2, 3, 5), (2, 3, 1)], 2, np.int8),  # rows of 5 and 1 bytes: a byte a thread
    ([(4, 3), (4, 1)], 1, np.float16),  # 6 and 2 bytes: 2-byte units
    ([(2, 2), (2, 6)], 1, np.complex128),  # 32 and 96 bytes: 16-byte units
    ([(2, 3), (2, 0), (2, 2)], 1, np.int64),  # an empty input
    ([(3,), (4,), (5,)], 0, np.bool_),
    ([(2, 3), (2, 3)], None, np.uint16),
    ([(0, 3), (0, 2)], 1, np.float32),  # an empty result
]


def host(shape, dtype, rng):
    if dtype is np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-100 if np.issubdtype(dtype, np.signedinteger) else 0, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def check_cases(device):
    rng = np.random.default_rng(5)
    for shapes, axis, dtype in CASES:
        parts = [host(s, dtype, rng) for s in shapes]
        got = rt.concat([rt.array(p, device=device) for p in parts], axis=axis).numpy()
        want = np.concatenate(parts, axis=axis)
        assert got.dtype == want.dtype and got.shape == want.shape, (shapes, axis, dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"{shapes} axis {axis} {dtype}")


def check_views_and_pending_inputs(device):
    rng = np.random.default_rng(6)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    X = rt.array(x, device=device)
    # views (an offset slice, a transpose, a reversed axis) and pending computations as inputs
    got = rt.concat([X[2:4], X[1:3, ::-1], X * 2 + 1], axis=0).numpy()
    np.testing.assert_array_equal(got, np.concatenate([x[2:4], x[1:3, ::-1], x * 2 + 1], axis=0))
    got = rt.concat([X.T, X[:, :3].T], axis=0).numpy()
    np.testing.assert_array_equal(got, np.concatenate([x.T, x[:, :3].T], axis=0))
    # mixed dtypes promote; many inputs; stack is concat of expanded inputs
    ints = rt.array(np.arange(8, dtype=np.int32).reshape(1, 8), device=device)
    got = rt.concat([X, ints], axis=0).numpy()
    np.testing.assert_array_equal(got, np.concatenate([x, np.arange(8, dtype=np.int32).reshape(1, 8)], axis=0))
    many = [X[i:i + 1] for i in range(6)] * 3
    np.testing.assert_array_equal(rt.concat(many, axis=0).numpy(), np.concatenate([x[i:i + 1] for i in range(6)] * 3))
    got = rt.stack([X, X + 1, X[::-1]], axis=1).numpy()
    np.testing.assert_array_equal(got, np.stack([x, x + 1, x[::-1]], axis=1))
    # a concat read by later computation, and its gradient: each input's window of the cotangent
    y = rng.standard_normal((6, 3)).astype(np.float32)
    Y = rt.array(y, device=device)
    out = (rt.concat([X, Y * 3], axis=1) ** 2).sum(axis=1)
    np.testing.assert_allclose(out.numpy(), (np.concatenate([x, y * 3], axis=1) ** 2).sum(axis=1), rtol=1e-5)
    gx, gy = rt.grad(lambda a, b: (rt.concat([a, b * 3], axis=1) ** 2).sum(), argnums=(0, 1))(X, Y)
    np.testing.assert_allclose(gx.numpy(), 2 * x, rtol=1e-6)
    np.testing.assert_allclose(gy.numpy(), 18 * y, rtol=1e-6)


def test_concat_on_every_device(dev):
    check_cases(dev)
    check_views_and_pending_inputs(dev)


def test_concat_lowered_as_a_gpu(gpu_like):
    check_cases(gpu_like)
    check_views_and_pending_inputs(gpu_like)


def test_concat_is_one_node_of_its_dense_inputs(dev):
    x = rt.array(np.ones((2, 3), np.float32), device=dev)
    y = x + 1
    joined = rt.concat([x, y, x[:, :1]], axis=1)
    assert joined.op == "concat" and joined.params == (1,)
    assert joined.inputs[0] is x and joined.inputs[1] is y  # dense inputs read where they are
    assert joined.inputs[2].op == "copy"  # a view is made dense first


def test_bad_concats_are_typed_errors(dev):
    x = rt.array(np.ones((2, 3), np.float32), device=dev)
    with pytest.raises(rt.errors.InvalidValueError):
        rt.concat([], axis=0)
    with pytest.raises(rt.errors.InvalidValueError):
        rt.concat([x, rt.array(np.ones((3, 3), np.float32), device=dev)], axis=1)
    with pytest.raises(rt.errors.InvalidValueError):
        rt.concat([x, x[0]], axis=0)
    with pytest.raises(rt.errors.InvalidValueError):
        rt.concat([rt.array(np.float32(1), device=dev)] * 2, axis=0)
    assert (rt.concat([x, x], axis=1) + 0).numpy().shape == (2, 6)  # the device is usable after


def test_windows_past_4_gib_keep_every_bit_of_their_offsets():
    """The planned copies of a result over 4 GiB: byte counts and offsets as low and high words."""
    from types import SimpleNamespace

    from runtime import dtypes
    from runtime.kernels import concat

    part = SimpleNamespace(shape=(3, 1 << 30))
    node = SimpleNamespace(params=(1,), shape=(3, 3 << 30), dtype=dtypes.float32, inputs=[part] * 3)
    cmds = concat.plan(node, [((3, 1 << 30), (1 << 30, 1), 0)] * 3, None)
    assert len(cmds) == 3
    for k, cmd in enumerate(cmds):
        words = cmd[4]
        rows, row_bytes, pitch, out_offset, in_offset = (lo | hi << 32 for lo, hi in zip(words[::2], words[1::2]))
        assert all(w < 1 << 32 for w in words)
        assert (rows, row_bytes, pitch, in_offset) == (3, 4 << 30, 12 << 30, 0)
        assert out_offset == k * (4 << 30)
