"""Arrays no buffer of the device could hold are rejected when the op making them is built, with a typed
error, before any host or device work; other arrays (the same evaluation's included) are unaffected."""

from __future__ import annotations

import numpy as np
import pytest

import hal
import runtime as rt
from runtime.errors import ArrayTooLargeError

HUGE = 2**40  # elements: terabytes at any dtype, more than any device here holds


def too_large_ops(dev):
    one = rt.ones((1,), device=dev)
    column, row = rt.ones((2**31, 1), device=dev), rt.ones((1, 2**31), device=dev)
    return {
        "arange": lambda: rt.arange(0, HUGE, device=dev),
        "zeros": lambda: rt.zeros((HUGE,), device=dev),
        "full": lambda: rt.full((2**31, 2**31), 2.0, device=dev),
        "broadcast_to": lambda: rt.broadcast_to(one, (2**62,)),
        "broadcast_to then sum": lambda: rt.broadcast_to(one, (2**62,)).sum(),
        "broadcasting add": lambda: column + row,
        "outer product": lambda: column @ row,
        "where": lambda: rt.where(column > 0, row, 0.0),
        "random": lambda: rt.random.normal((HUGE,), key=rt.random.key(0, device=dev)),
        "eye": lambda: rt.eye(2**31, device=dev),
        "linspace": lambda: rt.linspace(0.0, 1.0, HUGE, device=dev),
        "advanced index": lambda: rt.arange(4, device=dev)[rt.zeros((2**21, 1), rt.int64, device=dev)
                                                            + rt.zeros((1, 2**21), rt.int64, device=dev)],
    }


@pytest.mark.parametrize("case", list(too_large_ops("local-task")))
def test_a_too_large_array_is_rejected_when_built(dev, case):
    with pytest.raises(ArrayTooLargeError, match="needs .* bytes, more than the largest allocation") as info:
        too_large_ops(dev)[case]()
    assert isinstance(info.value, hal.ResourceExhaustedError)
    np.testing.assert_array_equal((rt.arange(3, device=dev) + 1).numpy(), [1, 2, 3])


def test_a_rejected_array_leaves_the_evaluation_of_others_alone(dev):
    ok = rt.arange(4, device=dev) * 2
    with pytest.raises(ArrayTooLargeError):
        rt.broadcast_to(rt.ones((1,), device=dev), (2**62,)).sum()
    other = ok.sum()
    rt.eval(ok, other)
    np.testing.assert_array_equal(ok.numpy(), [0, 2, 4, 6])
    assert other.item() == 12


def test_arange_with_a_zero_step_is_a_value_error(dev):
    with pytest.raises(ValueError, match="arange"):
        rt.arange(0, 10, 0, device=dev)
    np.testing.assert_array_equal(rt.arange(5, 0, -2, device=dev).numpy(), np.arange(5, 0, -2))
    np.testing.assert_allclose(rt.arange(0.5, 3, device=dev).numpy(), np.arange(0.5, 3))
