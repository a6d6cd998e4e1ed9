"""The per-signature memos of the op constructors (matmul's shapes, reductions' shapes and dtypes,
Python scalar operands' constants): the second call with the same signature gives what the first
did, failures are never memoized, and values that compare equal but differ stay apart."""

from __future__ import annotations

import numpy as np
import pytest

import runtime as rt
from runtime.errors import InvalidValueError


@pytest.mark.parametrize("sa,sb", [((3, 4), (4,)), ((4,), (4, 5)), ((4,), (4,)), ((2, 3, 4), (4, 5)),
                                   ((3, 4), (2, 4, 5)), ((1, 3, 4), (2, 4, 5))])
def test_matmul_twice_matches_numpy(dev, sa, sb):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    for _ in range(2):
        got = rt.array(a, device=dev) @ rt.array(b, device=dev)
        assert got.shape == (a @ b).shape
        np.testing.assert_allclose(got.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_matmul_shape_errors_raise_every_time(dev):
    for _ in range(2):
        with pytest.raises(InvalidValueError):
            rt.ones((3, 4), device=dev) @ rt.ones((5,), device=dev)
        with pytest.raises(InvalidValueError):
            rt.matmul(rt.ones((), device=dev), rt.ones((3,), device=dev))


@pytest.mark.parametrize("axis,keepdims", [(None, False), (None, True), (0, False), (-1, True), ((0, 2), False)])
def test_reductions_twice_match_numpy(dev, axis, keepdims):
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    for _ in range(2):
        for op in ("sum", "mean", "max"):
            got = getattr(rt, op)(rt.array(x, device=dev), axis=axis, keepdims=keepdims)
            want = getattr(np, op)(x, axis=axis, keepdims=keepdims)
            assert got.shape == want.shape and got.dtype == want.dtype, (op, got.dtype, want.dtype)
            np.testing.assert_allclose(got.numpy(), want)


def test_reduction_errors_raise_every_time(dev):
    empty = rt.zeros((0, 3), device=dev)
    for _ in range(2):
        with pytest.raises(InvalidValueError):
            rt.max(empty, axis=0)
        with pytest.raises((InvalidValueError, IndexError, ValueError)):
            rt.sum(rt.ones((2,), device=dev), axis=3)


def test_scalar_operands_keep_signed_zeros_types_and_nans_apart(dev):
    x = rt.array(np.array([1.0, -2.0], np.float32), device=dev)
    for _ in range(2):
        np.testing.assert_array_equal(np.signbit((x * 0.0).numpy()), [False, True])
        np.testing.assert_array_equal(np.signbit((x * -0.0).numpy()), [True, False])
        assert np.isnan((x + float("nan")).numpy()).all()
    i = rt.array(np.array([3, 4], np.int16), device=dev)
    for _ in range(2):
        assert (i + 1).dtype == rt.int16
        assert (i + 1.0).dtype == rt.float64
        assert (i + True).dtype == rt.int16
        assert (rt.array(np.array([True]), device=dev) + 1).dtype == rt.int64
        np.testing.assert_array_equal((i * 2).numpy(), [6, 8])
        np.testing.assert_array_equal((i + True).numpy(), [4, 5])
    f16 = rt.array(np.array([1.5], np.float16), device=dev)
    for _ in range(2):
        assert (f16 + 1).dtype == rt.float16 and (x + 1).dtype == rt.float32
