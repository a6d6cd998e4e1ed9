"""nonzero and boolean-mask indexing on every driver's kernels against numpy's (the emulated kernels:
test_compact_kernels.py)."""

from __future__ import annotations

import numpy as np

import runtime as rt


def test_nonzero_and_masks_on_every_driver(device):
    rng = np.random.default_rng(43)
    for shape in ((1,), (2049,), (70000,), (3, 40, 50)):
        x = rng.standard_normal(shape).astype(np.float32)
        X = rt.asarray(x, device=device)
        for got, want in zip(rt.nonzero(X > 0.3), np.nonzero(x > 0.3)):
            np.testing.assert_array_equal(got.numpy(), want)
        np.testing.assert_array_equal(X[X > 0.3].numpy(), x[x > 0.3])
