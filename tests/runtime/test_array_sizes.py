"""Arrays no buffer of the device could hold, or of more elements than the kernels address, are rejected
when the op making them is built, with a typed error, before any host or device work; other arrays (the
same evaluation's included) are unaffected."""

from __future__ import annotations

import numpy as np
import pytest

import hal
import runtime as rt
from runtime.device import MAX_ELEMENTS
from runtime.errors import ArrayTooLargeError

HUGE = 2**40  # elements: terabytes at any dtype, more than any device here holds


def too_large_ops(dev):
    one = rt.ones((1,), device=dev)
    column, row = rt.ones((2**30, 1), device=dev), rt.ones((1, 2**30), device=dev)
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
    with pytest.raises(ArrayTooLargeError, match="more than the largest allocation|the runtime's kernels address") \
            as info:
        too_large_ops(dev)[case]()
    assert isinstance(info.value, hal.ResourceExhaustedError)
    np.testing.assert_array_equal((rt.arange(3, device=dev) + 1).numpy(), [1, 2, 3])


def test_more_elements_than_the_kernels_address_are_rejected_before_any_copy(dev):
    # A (2, 2**31 + 16) array's column had a stride the kernels' 32-bit constants wrapped: the
    # read went outside the buffer and crashed the process (on a GPU: an illegal address).
    host = np.broadcast_to(np.zeros(1, np.uint8), (2, 2**31 + 16))  # (no memory: a broadcast view)
    with pytest.raises(ArrayTooLargeError, match=r"4294967328 elements, more than the 2147483647 \(2\*\*31 - 1\)"):
        rt.asarray(host, device=dev)
    with pytest.raises(ArrayTooLargeError, match="kernels address"):
        rt.from_dlpack(host)
    with pytest.raises(ArrayTooLargeError, match="kernels address"):
        rt.ones((1, 2**31 - 16), dtype=rt.uint8, device=dev) + rt.zeros((2, 1), rt.uint8, device=dev)
    # The largest array the kernels address is built (lazily: nothing is allocated).
    largest = rt.zeros((MAX_ELEMENTS,), dtype=rt.uint8, device=dev)
    assert largest.shape == (MAX_ELEMENTS,)
    with pytest.raises(ArrayTooLargeError, match="kernels address"):
        rt.concat([largest, rt.zeros((1,), rt.uint8, device=dev)])
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
