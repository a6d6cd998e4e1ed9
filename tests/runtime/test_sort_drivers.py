"""sort, argsort and searchsorted on every driver's kernels (on GPUs, rows past the shared-memory tile take
the merge passes) against numpy's; the cases of test_sort_kernels.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_sort_kernels import SHAPES, check_sorts, on_device, sample

import runtime as rt


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint64", "bfloat16"])
def test_sorts_on_every_driver(device, dtype):
    rng = np.random.default_rng(33)
    for shape, axis in [*SHAPES, ((2, 5000), 1), ((1, 70000), 1), ((3000, 3), 0)]:
        X, host = on_device(sample(rng, dtype, shape), dtype, device)
        check_sorts(X, host, axis, f"{dtype} {shape} axis {axis}")



def test_searchsorted_refuses_bad_arguments(device):
    a = rt.asarray(np.arange(5.0, dtype=np.float32), device=device)
    with pytest.raises(rt.errors.InvalidValueError, match="1-D"):
        rt.searchsorted(rt.reshape(a, (5, 1)), a)
    with pytest.raises(rt.errors.InvalidValueError, match="side"):
        rt.searchsorted(a, a, side="middle")
    with pytest.raises(rt.errors.InvalidValueError, match="sorter"):
        rt.searchsorted(a, a, sorter=rt.asarray(np.arange(4), device=device))
    with pytest.raises(rt.errors.InvalidValueError, match="sorter"):
        rt.searchsorted(a, a, sorter=a)
    np.testing.assert_array_equal(rt.searchsorted(a, a).numpy(), np.arange(5))  # still usable
