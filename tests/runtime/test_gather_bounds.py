"""Out-of-range integer-array indices raise IndexError as numpy does (or clip / wrap with rt.take's mode),
on every driver: the CPU drivers, and the GPU-generic driver over the simulated GPU API with the CUDA C
gather kernel emulated (its device-side range check and status word)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from rt_helpers import DEVICES, failures_in_threads

import hal
import runtime as rt
from runtime import graph
from runtime.device import context_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@pytest.fixture(scope="module", params=[*DEVICES, "fake-gpu-graph", "fake-gpu-stream"])
def device(request):
    if not request.param.startswith("fake-gpu"):
        yield context_for(request.param).device
        return
    cuda_emu = pytest.importorskip("cuda_emu")
    if cuda_emu.GXX is None:
        pytest.skip("g++ is needed to emulate the CUDA kernels")
    fake_gpu = pytest.importorskip("drivers.fake_gpu")
    dev = fake_gpu.FakeGpuDriver().create_device(command_buffer=request.param.rsplit("-", 1)[1])
    context_for(dev).is_gpu = True
    try:
        with cuda_emu.emulated_kernels():
            yield dev
    finally:
        dev.close()


def _numpy_raises(fn) -> None:
    with pytest.raises(IndexError):
        fn()


@pytest.mark.parametrize("index", [[20], [10], [-11], [-20], [3, 100], [[1, 2], [2, 10]]])
def test_out_of_range_device_indices_raise(device, index):
    a_np = np.arange(10)
    a = rt.arange(10, device=device)
    _numpy_raises(lambda: a_np[np.array(index)])
    _numpy_raises(lambda: np.take(a_np, np.array(index)))
    idx = rt.array(np.array(index), device=device)
    with pytest.raises(IndexError) as info:
        a[idx].numpy()
    assert isinstance(info.value, hal.InvalidArgumentError)  # the runtime's typed index error
    with pytest.raises(IndexError):
        rt.take(a, idx).numpy()
    with pytest.raises(IndexError):
        rt.take(a, index)  # known on the host: at once, as numpy
    with pytest.raises(IndexError):  # .at[] checks indices computed on the device there too
        a.at[idx].set(0).numpy()
    with pytest.raises(IndexError):
        a.at[idx].add(1).numpy()
    # the device works on, and in-range indices wrap as numpy's do
    ok = np.array([-1, 0, 9, -10, 3])
    np.testing.assert_array_equal(a[rt.array(ok, device=device)].numpy(), a_np[ok])
    np.testing.assert_array_equal(rt.take(a, rt.array(ok, device=device)).numpy(), np.take(a_np, ok))


def test_indices_computed_on_the_device(device):
    a_np = np.arange(10) * 3
    a = rt.array(a_np, device=device)
    idx = rt.arange(4, device=device) * 4  # 0, 4, 8, 12: the last is out of range
    with pytest.raises(IndexError):
        a[idx].numpy()
    np.testing.assert_array_equal(a[idx // 2].numpy(), a_np[np.arange(4) * 2])


def test_each_axis_is_checked(device):
    """An index out of range for its axis raises even where the flat element it names would exist."""
    b_np = np.arange(12).reshape(3, 4)
    b = rt.array(b_np, device=device)
    rows, cols = np.array([0, 2]), np.array([1, 4])
    _numpy_raises(lambda: b_np[rows, cols])
    with pytest.raises(IndexError):
        b[rt.array(rows, device=device), rt.array(cols, device=device)].numpy()
    with pytest.raises(IndexError):
        b[:, rt.array(cols, device=device)].numpy()
    with pytest.raises(IndexError):
        b[rt.array(np.array([3]), device=device)].numpy()
    with pytest.raises(IndexError):
        rt.take(b, rt.array(cols, device=device), axis=1).numpy()
    with pytest.raises(IndexError):
        rt.take_along_axis(b, rt.array(np.array([[0], [4], [1]]), device=device), axis=1).numpy()
    with pytest.raises(IndexError):  # known on the host: at once, as numpy
        rt.take_along_axis(b, np.array([[0], [4], [1]]), axis=1)
    _numpy_raises(lambda: np.take_along_axis(b_np, np.array([[0], [4], [1]]), axis=1))
    along = np.array([[0], [-4], [3]])
    np.testing.assert_array_equal(rt.take_along_axis(b, along, axis=1).numpy(),
                                  np.take_along_axis(b_np, along, axis=1))
    np.testing.assert_array_equal(rt.take_along_axis(b, rt.array(along, device=device), axis=1).numpy(),
                                  np.take_along_axis(b_np, along, axis=1))
    good = np.array([1, -1])
    np.testing.assert_array_equal(b[rt.array(rows, device=device), rt.array(good, device=device)].numpy(),
                                  b_np[rows, good])
    np.testing.assert_array_equal(rt.take(b, rt.array(good, device=device), axis=1).numpy(),
                                  np.take(b_np, good, axis=1))
    np.testing.assert_array_equal(b[:, rt.array(good, device=device)].numpy(), b_np[:, good])


def test_the_error_follows_the_values_not_the_evaluation(device):
    """Arrays made from a bad gather raise when read; others evaluated in the same rt.eval do not."""
    a_np = np.arange(10, dtype=np.float32)
    a = rt.array(a_np, device=device)
    bad = a[rt.array(np.array([20]), device=device)]
    derived = (bad * 2).sum()
    view = bad[0]
    fine = a * 2 + 1
    good = a[rt.array(np.array([2, 3]), device=device)] + 1
    rt.eval(bad, derived, fine, good, view)
    np.testing.assert_array_equal(fine.numpy(), a_np * 2 + 1)
    np.testing.assert_array_equal(good.numpy(), a_np[[2, 3]] + 1)
    for arr in (bad, derived, view, bad + 1):
        with pytest.raises(IndexError):
            arr.numpy()
    with pytest.raises(IndexError):
        float(derived)
    with pytest.raises(IndexError):  # again: the error stays
        bad.numpy()
    np.testing.assert_array_equal((a + 1).numpy(), a_np + 1)  # the device is usable


@pytest.mark.parametrize("mode", ["clip", "wrap", "raise"])
def test_take_modes(device, mode):
    a_np = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = rt.array(a_np, device=device)
    index = np.array([[-9, -1, 0], [3, 4, 11]])
    if mode == "raise":
        index = np.array([[-3, -1, 0], [2, 2, 1]])
    for axis in (0, 1):
        want = np.take(a_np, index, axis=axis, mode=mode)
        on_device = rt.take(a, rt.array(index, device=device), axis=axis, mode=mode)
        np.testing.assert_array_equal(on_device.numpy(), want)
        np.testing.assert_array_equal(rt.take(a, index, axis=axis, mode=mode).numpy(), want)
        np.testing.assert_array_equal(np.take(a, index, axis=axis, mode=mode).numpy(), want)
    flat = np.array([-30, 5, 40])
    if mode != "raise":
        np.testing.assert_array_equal(rt.take(a.reshape(-1), rt.array(flat, device=device), mode=mode).numpy(),
                                      np.take(a_np.reshape(-1), flat, mode=mode))


def test_bad_take_mode_is_a_typed_error_before_any_work(device):
    a = rt.arange(5, device=device)
    ctx = context_for(device)
    submitted = ctx.submitted
    with pytest.raises(ValueError) as info:
        rt.take(a, rt.array(np.array([1]), device=device), mode="nearest")
    assert isinstance(info.value, hal.InvalidArgumentError)
    with pytest.raises(ValueError):
        np.take(np.arange(5), [1], mode="nearest")
    assert ctx.submitted == submitted


def test_a_checked_gather_replays_from_the_graph_cache(device):
    """The status word is per evaluation: a good evaluation of a graph after a bad one reads clean."""
    a_np = np.arange(8, dtype=np.float32)
    a = rt.array(a_np, device=device)
    for index, ok in (([1, 2], True), ([1, 9], False), ([7, 0], True), ([-9, 0], False), ([-8, 3], True)):
        out = a[rt.array(np.array(index), device=device)] * 2
        if ok:
            np.testing.assert_array_equal(out.numpy(), a_np[index] * 2)
        else:
            with pytest.raises(IndexError):
                out.numpy()


def test_compiled_function_with_a_gather(device):
    a_np = np.arange(6, dtype=np.float32)
    a = rt.array(a_np, device=device)

    @rt.compile
    def pick(idx):
        return a[idx] + 1

    np.testing.assert_array_equal(pick(rt.array(np.array([0, 5]), device=device)).numpy(), a_np[[0, 5]] + 1)
    np.testing.assert_array_equal(pick(rt.array(np.array([-1, 2]), device=device)).numpy(), a_np[[-1, 2]] + 1)
    with pytest.raises(IndexError):
        pick(rt.array(np.array([6, 2]), device=device)).numpy()
    np.testing.assert_array_equal(pick(rt.array(np.array([1, 1]), device=device)).numpy(), a_np[[1, 1]] + 1)

    @rt.compile
    def double(x):
        return x * 2

    for _ in range(3):  # the first trace, a replay, a replay handing out the same arrays again
        bad = a[rt.array(np.array([9, 0]), device=device)]
        with pytest.raises(IndexError):
            double(bad).numpy()
        good = a[rt.array(np.array([5, 0]), device=device)]
        np.testing.assert_array_equal(double(good).numpy(), a_np[[5, 0]] * 2)


def test_dlpack_export_of_a_bad_gather_raises(device):
    if context_for(device).is_gpu:
        pytest.skip("DLPack export of the simulated GPU's memory")
    a = rt.arange(4, device=device)
    with pytest.raises(IndexError):
        np.from_dlpack(a[rt.array(np.array([4]), device=device)])


def test_a_loop_of_checked_gathers_carries_a_bounded_number_of_checks(device):
    """`s = s + a[i]` step after step: the checks of the steps the device has run are read and dropped, and a
    bad step still raises when the result is read."""
    a_np = np.arange(10)
    a = rt.array(a_np, device=device)
    s = rt.zeros((1,), dtype=rt.int64, device=device)
    lengths = []
    for i in range(40):
        s = s + a[rt.array(np.array([i % 10]), device=device)]
        rt.eval(s)
        if i % 10 == 9:
            context_for(device).wait(context_for(device).submitted)
        lengths.append(len(s.checks or ()))
    assert max(lengths[20:]) <= 2 * graph.MAX_CHECKS, lengths
    np.testing.assert_array_equal(s.numpy(), [sum(i % 10 for i in range(40))])
    s = s + a[rt.array(np.array([10]), device=device)]
    for _ in range(2 * graph.MAX_CHECKS):
        s = s + a[rt.array(np.array([1]), device=device)]
        rt.eval(s)
    with pytest.raises(IndexError):
        s.numpy()


def test_takes_and_indexed_adds_along_one_axis_from_threads(device):
    """take, take_along_axis and x.at[i].add through one index array (kernels/take.py), with
    hostile inputs typed before any work and eight threads taking at once."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    X = rt.array(x, device=device)
    for bad in ([0.5], np.array([True, False]), rt.array(np.array([1.0]), device=device)):
        with pytest.raises(hal.InvalidArgumentError):
            rt.take(X, bad, axis=0)
    with pytest.raises(IndexError):
        rt.take(X, [9], axis=0)
    along = rt.array(np.array([[0], [4], [9], [1], [2], [3]]), device=device)
    result = rt.take_along_axis(X, along, axis=1)
    with pytest.raises(IndexError):
        result.numpy()
    with pytest.raises(hal.InvalidArgumentError):
        rt.take_along_axis(X, rt.array(np.zeros((2, 1), np.int64), device=device), axis=1)
    with pytest.raises(hal.InvalidArgumentError):
        X.at[np.array([0, 1])].add(rt.ones((3, 3), device=device))
    want = x.copy()
    np.add.at(want, np.array([5, 5, -1]), np.float32(2))
    np.testing.assert_allclose(X.at[np.array([5, 5, -1])].add(np.float32(2)).numpy(), want, rtol=1e-6)
    task = context_for("local-task").device
    elsewhere = rt.array(np.array([0, 1]), device=task if device is not task else context_for("local-sync").device)
    for update in (lambda: X.at[elsewhere].add(1.0), lambda: X.at[elsewhere].set(1.0), lambda: X[elsewhere]):
        with pytest.raises(hal.InvalidArgumentError):
            update()
    np.testing.assert_array_equal(rt.tril(X, k=np.int64(-1)).numpy(), np.tril(x, -1))
    with pytest.raises(hal.InvalidArgumentError):
        rt.triu(X, k=0.5)

    def work(seed: int) -> None:
        idx = np.random.default_rng(seed).integers(-6, 6, 40)
        for _ in range(5):
            got = rt.take(X, rt.array(idx, device=device), axis=0).numpy()
            np.testing.assert_array_equal(got, np.take(x, idx, axis=0))

    failures = failures_in_threads(work, 8)
    assert not failures, failures[0]
