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


def test_arrays_of_another_device_are_refused_before_any_work(device):
    """searchsorted's and take's arrays on two devices: the usual typed error at the call (not a binding
    error at submission), and both devices stay usable; host values go to x1's device."""
    import hal

    other = hal.create_device("local-sync")
    try:
        a = rt.asarray(np.arange(5.0, dtype=np.float32), device=device)
        b = rt.asarray(np.array([1.5, 3.0], np.float32), device=other)
        sorter = rt.asarray(np.arange(5), device=other)
        index = rt.asarray(np.array([0, 1]), device=other)
        for call in (lambda: rt.searchsorted(a, b), lambda: rt.searchsorted(a, a, sorter=sorter),
                     lambda: rt.take(a, index)):
            with pytest.raises(rt.errors.InvalidValueError, match="different devices"):
                call()
        np.testing.assert_array_equal(rt.searchsorted(a, rt.asarray(b.numpy(), device=device)).numpy(), [2, 3])
        np.testing.assert_array_equal(rt.sort(b).numpy(), [1.5, 3.0])
        # values and a sorter given on the host go to x1's device, whichever is the default
        np.testing.assert_array_equal(rt.searchsorted(b, 2.0).numpy(), 1)
        np.testing.assert_array_equal(rt.searchsorted(b, [1.5, 4.0], side="right", sorter=[0, 1]).numpy(), [1, 2])
    finally:
        other.close()
