"""A take read by one elementwise op alone, folded into one kernel on a GPU (lowering/gathers.py,
kernels/take_epilogue.py): the GPU lowering (numpy kernels, and the generated CUDA C built for the CPU)
and real GPUs against the CPU driver, whose lowering has no such fold."""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import DEVICES

import runtime as rt
from runtime.lowering import gathers

GPUS = [uri for uri in DEVICES if not uri.startswith("local-")]

pytest.importorskip("cuda_emu")


@pytest.fixture(autouse=True)
def fuse_at_once(monkeypatch):
    monkeypatch.setenv("RUNTIME_FUSE_AFTER", "1")


def _inputs(dtype: str):
    rng = np.random.default_rng(3)
    table = rng.standard_normal((50, 16)).astype(np.float32)
    table[[3, 7, 11], [0, 5, 9]] = np.nan, np.inf, -np.inf  # (maximum and minimum of NaN: the op's own rule)
    ids = rng.integers(0, 50, (3, 5))
    ids[0, :3] = 3, 7, 11  # (the rows holding them)
    pos = rng.standard_normal((5, 16)).astype(np.float32)
    wide = rng.standard_normal((3, 5, 16)).astype(np.float32) + 3.0
    return table, ids, pos, wide


#: name -> (the composition, whether the take folds into its reader)
CASES = {
    "embedding plus positions": (lambda t, i, p, w: rt.take(t, i, axis=0) + p, True),
    "positions plus embedding": (lambda t, i, p, w: p + rt.take(t, i, axis=0), True),
    "scaled (other first)": (lambda t, i, p, w: p[0] * rt.take(t, i, axis=0), True),
    "minus a Python scalar": (lambda t, i, p, w: rt.take(t, i, axis=0) - 2.0, True),
    "a scalar minus it": (lambda t, i, p, w: 2.0 - rt.take(t, i, axis=0), True),
    "divided by a full operand": (lambda t, i, p, w: rt.take(t, i, axis=0) / w, True),
    "maximum with a transposed view": (lambda t, i, p, w: rt.maximum(rt.take(t[:, :5], i, axis=0), p.T[:5, :]), True),
    "minimum with a reversed view": (lambda t, i, p, w: rt.minimum(rt.take(t, i, axis=0), p[:, ::-1]), True),
    "odd rows (one element a thread)": (lambda t, i, p, w: rt.take(t[:, 1:], i, axis=0) + p[:, 1:], True),
    "along an axis": (lambda t, i, p, w: rt.take_along_axis(t[:3], i[:, :3] % 16, axis=1) * p[:3, :3], True),
    "wrapped": (lambda t, i, p, w: rt.take(t, i * 7 - 100, axis=0, mode="wrap") + p, True),
    "clipped": (lambda t, i, p, w: rt.take(t, i * 2 - 30, axis=0, mode="clip") + p, True),
    "rows of a wider array": (lambda t, i, p, w: rt.take(t, i, axis=0) + rt.concat([p, p[:, :2]], axis=1)[:, :16],
                              True),
    "positions computed after the take": (lambda t, i, p, w: rt.take(t, i, axis=0) + p * 2.0, True),
    "the other from the table's own rows": (lambda t, i, p, w: rt.take(t, i, axis=0) * rt.exp(t[:5] * 0.1), True),
    "rows of 640 (a row at a time)": (lambda t, i, p, w: rt.take(rt.concat([t] * 40, axis=1), i, axis=0)
                                      + rt.concat([p] * 40, axis=1), True),
    "rows of 4096 (a row in 4 chunks) and a column": (
        lambda t, i, p, w: rt.take(rt.concat([t] * 256, axis=1), i, axis=0) - p[:, :1], True),
    "kept": (lambda t, i, p, w: (lambda g: (g, g + p))(rt.take(t, i, axis=0)), False),
    "rows of 2048 kept (the take's own kernel, a row at a time)": (
        lambda t, i, p, w: (lambda g: (g, g * 2.0))(rt.take(rt.concat([t] * 128, axis=1), i, axis=0)), False),
    "read twice": (lambda t, i, p, w: (lambda g: g + g * p)(rt.take(t, i, axis=0)), False),
}


def _run(where, case: str, dtype: str, recordings=None):
    """The case's values as float32 numpy arrays, and (``recordings``) the recording evaluating them."""
    table, ids, pos, wide = _inputs(dtype)
    arrays = [rt.array(a, device=where).astype(dtype) if a.dtype == np.float32 else rt.array(a, device=where)
              for a in (table, ids, pos, wide)]
    rt.eval(*arrays)
    out = CASES[case][0](*arrays)
    out = out if isinstance(out, tuple) else (out,)
    if recordings is not None:
        rt.clear_graph_cache()  # (recorded anew: a cached graph of the other setting would replay)
        recordings.clear()
    rt.eval(*out)
    rec = recordings[-1] if recordings else None
    return [o.astype(rt.float32).numpy() for o in out], rec


def _check(where, case: str, dtype: str, recordings=None):
    got, rec = _run(where, case, dtype, recordings)
    want, _ = _run("local-sync", case, dtype)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)  # (the same arithmetic in the same type)
    return rec


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_folds_give_the_two_kernels_values(gpu_like, recordings, monkeypatch, case, dtype):
    """The values of the take and the op run one after the other, in one dispatch less (a checked
    take's status word is zeroed by a fill either way)."""
    folded = _check(gpu_like, case, dtype, recordings).dispatches
    monkeypatch.setattr(gathers, "ENABLED", False)
    apart = _check(gpu_like, case, dtype, recordings).dispatches
    assert folded == apart - (1 if CASES[case][1] else 0)


def test_out_of_range_device_indices_still_raise(gpu_like):
    """A checked take (indices computed on the device) sets the status word in the folded kernel too;
    the device works on afterwards."""
    table, ids, pos, _ = _inputs("float32")
    t, p = rt.array(table, device=gpu_like), rt.array(pos, device=gpu_like)
    bad = rt.array(ids, device=gpu_like) * 2  # up to 98: out of range of 50 rows
    with pytest.raises(IndexError):
        (rt.take(t, bad, axis=0) + p).numpy()
    good = rt.array(ids, device=gpu_like) // 2
    np.testing.assert_array_equal((rt.take(t, good, axis=0) + p).numpy(), table[ids // 2] + pos)


def test_gradients_through_a_folded_take(gpu_like):
    """The embedding's gradient (a take_add of the cotangent) with the forward folded."""
    table, ids, pos, _ = _inputs("float32")

    def loss(t, p):
        return rt.sum((rt.take(t, rt.array(ids, device=t.device), axis=0) + p) ** 2)

    got = rt.grad(loss, argnums=(0, 1))(rt.array(table, device=gpu_like), rt.array(pos, device=gpu_like))
    want = rt.grad(loss, argnums=(0, 1))(rt.array(table, device="local-sync"), rt.array(pos, device="local-sync"))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("uri", GPUS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_folds_on_a_gpu(uri, case, monkeypatch):
    """Bit for bit what the same GPU gives with the fold off; within a relative 1e-6 of the CPU driver
    (the GPU's exp is not numpy's: an ulp apart at times)."""
    for dtype in ["float32", "bfloat16"] if case == "embedding plus positions" else ["float32"]:
        # (one narrow case: each compiles kernels of its own)
        monkeypatch.setattr(gathers, "ENABLED", True)
        rt.clear_graph_cache()
        folded, _ = _run(uri, case, dtype)
        monkeypatch.setattr(gathers, "ENABLED", False)
        rt.clear_graph_cache()  # (recorded anew: the cached folded graph would replay)
        apart, _ = _run(uri, case, dtype)
        want, _ = _run("local-sync", case, dtype)
        for f, a, w in zip(folded, apart, want):
            np.testing.assert_array_equal(f, a)
            np.testing.assert_allclose(f, w, rtol=1e-6, atol=0)
