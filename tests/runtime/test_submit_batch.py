"""Evaluations and replays of compiled functions queued while earlier work runs, handed to the device
several to a submission (their executions joined): results match numpy whatever forces the queue
out (a read, an eval, a wait, another thread), a batch never exceeds SUBMIT_BATCH command buffers,
and a refused batch fails its arrays instead of leaving them waiting."""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
from rt_helpers import counting_prepares, failures_in_threads

import hal
import runtime as rt
from runtime import device as runtime_device
from runtime.device import context_for


def affine(w, b):
    return w * 0.5 + b


def reference(w: np.ndarray, b: np.ndarray, steps: int) -> list[np.ndarray]:
    out = []
    for _ in range(steps):
        w = (w * np.float32(0.5) + b).astype(np.float32)
        out.append(w)
    return out


@pytest.fixture
def submissions(dev, monkeypatch):
    """The command-buffer count of each submission the runtime makes on `dev` (its executions' submits)."""
    device = context_for(dev).device
    counts: list[int] = []
    real = hal.Execution.submit

    def spy(execution, *args, **kwargs):
        if execution.device is device:
            counts.append(len(execution.command_buffers))
        return real(execution, *args, **kwargs)

    monkeypatch.setattr(hal.Execution, "submit", spy)
    return counts


def _inputs(dev, n=257, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    return w, b, rt.array(w, device=dev), rt.array(b, device=dev)


def test_replays_are_batched_while_work_runs_and_match_numpy(dev, submissions):
    w_np, b_np, w, b = _inputs(dev)
    step = rt.compile(affine)
    rt.synchronize(dev)
    submissions.clear()
    steps = 40
    for _ in range(steps):
        w = step(w, b)
    np.testing.assert_allclose(w.numpy(), reference(w_np, b_np, steps)[-1], rtol=1e-5, atol=1e-6)
    assert sum(submissions) == steps  # every replay ran exactly once
    assert max(submissions) <= runtime_device.SUBMIT_BATCH
    assert len(submissions) <= steps // 2, submissions  # the first after a wait goes alone, later ones batch


def test_batch_of_one_submits_every_replay_alone(dev, submissions, monkeypatch):
    monkeypatch.setattr(runtime_device, "SUBMIT_BATCH", 1)
    w_np, b_np, w, b = _inputs(dev, seed=1)
    step = rt.compile(affine)
    rt.synchronize(dev)
    submissions.clear()
    for _ in range(10):
        w = step(w, b)
    np.testing.assert_allclose(w.numpy(), reference(w_np, b_np, 10)[-1], rtol=1e-5, atol=1e-6)
    assert submissions == [1] * 10


def test_batches_are_cut_where_the_work_they_move_would_pass_submit_batch_bytes(dev, submissions, monkeypatch):
    """A replay whose work would take the queue past SUBMIT_BATCH_BYTES is handed over at once with
    the queue before it: three replays' work fit, the fourth goes with them (each replay moves its two
    inputs and its output, 3 x 257 float32, and the constant 0.5)."""
    work = 3 * 257 * 4 + 4
    monkeypatch.setattr(runtime_device, "SUBMIT_BATCH_BYTES", 3 * work + 100)
    w_np, b_np, w, b = _inputs(dev, seed=11)
    step = rt.compile(affine)
    w = step(w, b)
    rt.eval(w)  # the timeline is busy from here on
    submissions.clear()
    steps = 40
    for _ in range(steps):
        w = step(w, b)
    np.testing.assert_allclose(w.numpy(), reference(w_np, b_np, steps + 1)[-1], rtol=1e-5, atol=1e-6)
    assert sum(submissions) == steps
    assert max(submissions) == 4, submissions  # up to SUBMIT_BATCH (8) by count, 4 by bytes
    assert len(submissions) < steps // 2, submissions  # still batched


@pytest.mark.parametrize("how", ["compiled", "eager"])
def test_work_larger_than_submit_batch_bytes_is_handed_over_at_once(dev, submissions, monkeypatch, how):
    """Work that moves more than SUBMIT_BATCH_BYTES is never held back (holding back work that keeps
    the device busy only leaves it idle until the batch is full), replays and eager evals alike."""
    monkeypatch.setattr(runtime_device, "SUBMIT_BATCH_BYTES", 1000)  # (less than any call here moves)
    w_np, b_np, w, b = _inputs(dev, seed=12)
    step = rt.compile(affine) if how == "compiled" else affine
    w = step(w, b)
    rt.eval(w)
    submissions.clear()
    for _ in range(10):
        w = step(w, b)
        if how == "eager":
            rt.eval(w)  # (a compiled call evaluates its outputs itself)
    np.testing.assert_allclose(w.numpy(), reference(w_np, b_np, 11)[-1], rtol=1e-5, atol=1e-6)
    assert submissions == [1] * 10, submissions


def test_one_queued_replay_handed_over_alone_is_submitted_as_prepared(dev, submissions, monkeypatch):
    """A hand-over of a single queued replay submits the replay's own execution: a batch of one is
    prepared for nothing."""
    prepared = counting_prepares(monkeypatch, context_for(dev).device)
    w_np, b_np, w, b = _inputs(dev, seed=7)
    step = rt.compile(affine)
    w = step(w, b)
    rt.eval(w)  # the timeline is busy from here on: each next replay queues, and its eval hands it over
    submissions.clear()
    for _ in range(8):
        w = step(w, b)
        rt.eval(w)
    np.testing.assert_allclose(w.numpy(), reference(w_np, b_np, 9)[-1], rtol=1e-5, atol=1e-6)
    assert submissions == [1] * 8, submissions
    assert len(prepared) <= 3, prepared  # the recordings' tables (w alternates between two buffers)


def test_every_queued_output_reads_its_own_value(dev):
    w_np, b_np, w, b = _inputs(dev, seed=2)
    step = rt.compile(affine)
    outs = []
    for _ in range(20):
        w = step(w, b)
        outs.append(w)
    expected = reference(w_np, b_np, 20)
    for i in (5, 3, 19, 0, 11):  # out of order: a read hands over the queue it is in, once
        np.testing.assert_allclose(outs[i].numpy(), expected[i], rtol=1e-5, atol=1e-6)
    more = step(outs[19], b)
    np.testing.assert_allclose(np.asarray(more), reference(expected[19], b_np, 1)[0], rtol=1e-5, atol=1e-6)


def test_an_eager_eval_queues_behind_the_replays_and_a_read_hands_them_over(dev, submissions):
    w_np, b_np, w, b = _inputs(dev, seed=3)
    step = rt.compile(affine)
    rt.synchronize(dev)
    w = step(w, b)
    rt.eval(w)  # the timeline is busy from here on: the next replays and evals queue
    submissions.clear()
    for _ in range(3):
        w = step(w, b)
    total = (w * 2.0).sum()
    rt.eval(total)
    assert submissions == []  # nothing handed over yet: the eval's command buffer joined the queue
    expected = reference(w_np, b_np, 4)[-1]
    np.testing.assert_allclose(float(total), float((expected * 2).sum()), rtol=1e-4)
    assert submissions == [4]  # the read handed the three replays and the eval over as one submission


def test_eager_evals_queue_and_their_batches_are_joined_not_validated_again(dev, submissions, monkeypatch):
    """A loop of eager evals of ops that do not repeat in step with the batches (13 inputs, 4 ops; the
    results kept, so each eval binds a new output): the batches are new tuples of executions, joined
    without validating their tables again (only each eval's own new table is)."""
    xs_np = [np.arange(16 + k, dtype=np.float32) for k in range(13)]
    xs = [rt.array(x, device=dev) for x in xs_np]
    ops = [(lambda x: x + 1.0, lambda x: x + 1), (lambda x: x * 2.0, lambda x: x * 2),
           (rt.exp, np.exp), (lambda x: x.sum(), lambda x: x.sum())]
    ctx = context_for(dev)
    for k in range(60):  # (the recordings made and settled)
        rt.eval(ops[k % 4][0](xs[k % 13]))
    rt.synchronize(dev)
    prepared = counting_prepares(monkeypatch, ctx.device)
    joined: list[int] = []
    real_join = type(ctx.device).join

    def join_spy(device, executions):
        joined.append(len(executions))
        return real_join(device, executions)

    monkeypatch.setattr(type(ctx.device), "join", join_spy)
    submissions.clear()
    results = []
    for k in range(60, 160):
        y = ops[k % 4][0](xs[k % 13])
        rt.eval(y)
        results.append((y, ops[k % 4][1](xs_np[k % 13])))
    rt.synchronize(dev)
    assert all(n == 1 for n in prepared), prepared  # an eval's own execution, never a batch
    assert sum(submissions) == 100 and max(submissions) <= runtime_device.SUBMIT_BATCH
    assert len(submissions) < 100 and joined and all(n > 1 for n in joined)
    for y, want in results:
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)


def test_eval_and_synchronize_hand_over_queued_replays(dev, submissions):
    w_np, b_np, w, b = _inputs(dev, seed=4)
    step = rt.compile(affine)
    w = step(w, b)
    rt.eval(w)
    submissions.clear()
    w = step(w, b)
    w = step(w, b)
    rt.eval(w)  # already evaluated by the replay, but queued: eval starts it
    assert sum(submissions) == 2
    ctx = context_for(dev)
    assert ctx.flushed == ctx.submitted
    w = step(w, b)
    rt.synchronize(dev)
    assert sum(submissions) == 3 and ctx.completed == ctx.submitted
    np.testing.assert_allclose(w.numpy(), reference(w_np, b_np, 4)[-1], rtol=1e-5, atol=1e-6)


def test_another_thread_reads_outputs_while_replays_queue(dev):
    w_np, b_np, w, b = _inputs(dev, seed=5)
    step = rt.compile(affine)
    handed: queue.Queue = queue.Queue()
    expected = reference(w_np, b_np, 60)
    problems: list = []

    def reader():
        while True:
            item = handed.get()
            if item is None:
                return
            i, arr = item
            try:
                np.testing.assert_allclose(arr.numpy(), expected[i], rtol=1e-5, atol=1e-6)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                problems.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(60):
            w = step(w, b)
            handed.put((i, w))
    finally:
        handed.put(None)
        thread.join(60)
    assert not thread.is_alive()
    assert not problems, problems[:3]


def test_threads_evaluating_eagerly_on_one_device_each_read_their_own_results(dev):
    """Eager evals from several threads queue into the same batches (one context, one lock): every
    thread's chain of results matches numpy, whatever thread's read or eval hands a batch over."""
    start = threading.Barrier(4)

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        x_np = rng.standard_normal(300).astype(np.float32)
        x = rt.array(x_np, device=dev)
        start.wait()
        ys = []
        for k in range(40):
            x = x * 0.5 + float(k)
            x_np = (x_np * np.float32(0.5) + np.float32(k)).astype(np.float32)
            rt.eval(x)
            ys.append((x, x_np.copy()))
            if k % 13 == 12:  # a read now and then hands over whatever is queued, any thread's
                np.testing.assert_allclose(ys[-1][0].numpy(), ys[-1][1], rtol=1e-5, atol=1e-5)
        for y, want in ys:
            np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)

    problems = failures_in_threads(work, 4, timeout=120)
    assert not problems, problems[:3]


@pytest.mark.parametrize("uri", ["local-task", "local-sync"])
def test_queued_evals_of_a_closed_device_fail_instead_of_waiting(uri):
    device = hal.create_device(uri)
    ctx = context_for(device)
    x = rt.array(np.ones(64, np.float32), device=device)
    outs = [x * 2.0]
    rt.eval(outs[0])
    for _ in range(3):
        outs.append(outs[-1] + 1.0)
        rt.eval(outs[-1])
    assert ctx.queued, "the evals after the first should be queued"
    device.close()
    with pytest.raises(hal.HalError):  # refused, not left waiting
        outs[-1].numpy()
    assert not ctx.queued
    with pytest.raises(hal.HalError):  # an eval after the close is refused at once, not queued
        rt.eval(x * 3.0)
    assert not ctx.queued


@pytest.mark.parametrize("uri", ["local-task", "local-sync"])
def test_queued_replays_of_a_closed_device_fail_instead_of_waiting(uri):
    device = hal.create_device(uri)
    ctx = context_for(device)
    w_np, b_np = np.ones(64, np.float32), np.full(64, 2.0, np.float32)
    w, b = rt.array(w_np, device=device), rt.array(b_np, device=device)
    step = rt.compile(affine)
    first = step(w, b)
    rt.eval(first)
    outs = [first]
    for _ in range(3):
        outs.append(step(outs[-1], b))
    assert ctx.queued, "the replays after the first should be queued"
    device.close()
    outcome: list = []

    def read():
        try:
            outs[-1].numpy()
        except hal.HalError as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "reading a refused replay's output must not wait forever"
    assert isinstance(outcome[0], hal.HalError), outcome
    assert not ctx.queued
    with pytest.raises(hal.HalError):  # a call after the close is refused at once, not queued
        step(first, b)
    assert not ctx.queued


def test_a_full_buffer_cache_frees_no_buffer_a_queued_replay_binds(dev, submissions, monkeypatch):
    """A buffer given back beyond the cache's limit went to the device at once, though a replay
    queued in the runtime still bound it: handing the batch over then raised that a binding-table
    buffer had been released. It now waits in the cache until its replay was handed over."""
    cache = context_for(dev).buffers
    monkeypatch.setattr(cache, "limit_bytes", 0)  # RUNTIME_BUFFER_CACHE_BYTES=0: nothing stays cached
    w_np, b_np, w, b = _inputs(dev, seed=4)
    step = rt.compile(affine)
    rt.synchronize(dev)
    submissions.clear()
    # Each argument is an eager array that dies as the call returns, while the replay reading it
    # waits in the queue (the eager evaluation keeps the device busy).
    outs = [step(w + float(k), b) for k in range(12)]
    for k, out in enumerate(outs):
        np.testing.assert_allclose(out.numpy(), reference(w_np + np.float32(k), b_np, 1)[0], rtol=1e-5, atol=1e-6)
    assert max(submissions) > 1  # replays were queued and batched
    rt.synchronize(dev)
    cache.trim(0)
    assert cache.free_bytes == 0  # once handed over, every buffer kept beyond the limit goes back
