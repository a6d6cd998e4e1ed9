"""runtime.shapes.broadcast_shapes against numpy's, remembered answers included: the same result the
second time, plain ints for numpy integers, and a refusal every time for shapes that do not broadcast."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import runtime as rt
from runtime import shapes

SHAPES = [(), (1,), (3,), (2, 1), (1, 3), (2, 3), (4, 1, 3), (0,), (0, 3), (2, 0, 1)]


def test_every_pair_and_triple_broadcasts_as_numpys_twice():
    for combo in itertools.chain(itertools.product(SHAPES, repeat=2), itertools.product(SHAPES[:6], repeat=3)):
        try:
            expected = np.broadcast_shapes(*combo)
        except ValueError:
            for _ in range(2):  # refused each time, never remembered
                with pytest.raises(rt.InvalidValueError, match="cannot be broadcast"):
                    shapes.broadcast_shapes(*combo)
            continue
        assert shapes.broadcast_shapes(*combo) == expected
        assert shapes.broadcast_shapes(*combo) == expected


def test_numpy_integer_dimensions_give_ints():
    first = shapes.broadcast_shapes((np.int64(5), 1), (np.int32(1), 7))
    assert first == (5, 7) and all(type(d) is int for d in first)
    again = shapes.broadcast_shapes((5, 1), (1, 7))  # equal keys: the remembered answer
    assert again == (5, 7) and all(type(d) is int for d in again)


def test_the_memo_stays_bounded(monkeypatch):
    monkeypatch.setattr(shapes, "BROADCASTS_KEPT", 8)
    for n in range(1, 40):
        assert shapes.broadcast_shapes((n, 1), (1, 2)) == (n, 2)
    assert len(shapes._BROADCASTS) <= 8
