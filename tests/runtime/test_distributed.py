"""rt.distributed on the CPU drivers' in-process channels: ranks as threads, one device each.

Collectives are lazy ops recorded with the computation around them; data-parallel training with
``average_gradients`` (eager and under rt.compile) equals the one-device step on the whole batch.
The same code runs on cuda with NCCL (scripts/gpu-check-multi).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hal
import runtime as rt

DRIVERS = ["local-sync", "local-task"]


def _cuda_ranks() -> list[tuple[str, int]]:
    """(cuda, n) for 1 .. the GPUs present (NCCL through the nccl extra), none without."""
    info = {d.name: d for d in hal.list_drivers()}.get("cuda")
    if info is None or not info.available:
        return []
    try:
        gpus = len(hal.get_driver("cuda").query_devices())
        from hal.drivers.cuda import nccl

        nccl.load()
    except Exception:
        return []
    return [("cuda", n) for n in range(1, min(gpus, 2) + 1)]


def make_device(driver: str, index: int) -> hal.Device:
    return hal.create_device(driver if driver != "cuda" else f"cuda://{index}")


def run_ranks(devices, fn):
    """fn(rank) on a thread per rank; the results in rank order (a rank's exception re-raised)."""
    results, errors = [None] * len(devices), []

    def work(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 (re-raised below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in range(len(devices))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    if errors:
        raise errors[0]
    return results


@pytest.fixture(params=[(d, n) for d in DRIVERS for n in (1, 2, 3)] + _cuda_ranks(),
                ids=lambda p: f"{p[0]}-{p[1]}ranks")
def ranks(request):
    driver, count = request.param
    devices = [make_device(driver, i) for i in range(count)]
    groups = rt.distributed.groups(devices)
    yield devices, groups
    for group in groups:
        group.close()
    for device in devices:
        device.close()


def test_collectives_as_lazy_ops(ranks):
    devices, groups = ranks
    n = len(devices)
    data = [np.random.default_rng(r).standard_normal((6, 4)).astype(np.float32) for r in range(n)]

    def rank_fn(r):
        g = groups[r]
        x = rt.array(data[r], device=devices[r])
        out = {"sum": rt.distributed.all_sum(x * 2, g), "mean": rt.distributed.all_mean(x, g),
               "max": rt.distributed.all_max(x, g), "min": rt.distributed.all_min(x[:, 1], g),
               "gather": rt.distributed.all_gather(x.T, g), "bcast": rt.distributed.broadcast(x + r, g, root=n - 1),
               "scatter": rt.distributed.reduce_scatter(rt.concat([x] * n), g),
               "ints": rt.distributed.all_sum(rt.arange(5, device=devices[r]) * (r + 1), g)}
        rt.eval(*out.values())
        return {k: v.numpy() for k, v in out.items()}

    results = run_ranks(devices, rank_fn)
    stacked = np.stack(data)
    for got in results:
        np.testing.assert_allclose(got["sum"], 2 * stacked.sum(0), rtol=1e-6)
        np.testing.assert_allclose(got["mean"], stacked.mean(0), rtol=1e-6)
        np.testing.assert_array_equal(got["max"], stacked.max(0))
        np.testing.assert_array_equal(got["min"], stacked[:, :, 1].min(0))
        np.testing.assert_array_equal(got["gather"], stacked.transpose(0, 2, 1))
        np.testing.assert_array_equal(got["bcast"], data[-1] + np.float32(n - 1))
        np.testing.assert_allclose(got["scatter"], stacked.sum(0), rtol=1e-6)
        np.testing.assert_array_equal(got["ints"], np.arange(5) * sum(range(1, n + 1)))


def loss(w1, b1, w2, b2, x, y):
    h = rt.nn.relu(x @ w1 + b1)
    d = h @ w2 + b2 - y
    return (d * d).mean()


value_and_grad = rt.value_and_grad(loss, argnums=(0, 1, 2, 3))


def params_and_data(batch):
    rng = np.random.default_rng(7)
    params = [rng.standard_normal((8, 16)).astype(np.float32) * 0.3, rng.standard_normal(16).astype(np.float32) * 0.1,
              rng.standard_normal((16, 4)).astype(np.float32) * 0.3, rng.standard_normal(4).astype(np.float32) * 0.1]
    x = rng.standard_normal((batch, 8)).astype(np.float32)
    return params, x, rng.standard_normal((batch, 4)).astype(np.float32)


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("bucket_bytes", [1, 600, 1 << 20])  # a bucket per gradient, mixed, one bucket
def test_data_parallel_training_equals_the_whole_batch_on_one_device(ranks, compiled, bucket_bytes):
    devices, groups = ranks
    n = len(devices)
    params, x, y = params_and_data(12 * n)

    def step(w1, b1, w2, b2, x, y, group):
        _, grads = value_and_grad(w1, b1, w2, b2, x, y)
        grads = rt.distributed.average_gradients(grads, group, bucket_bytes=bucket_bytes)
        return [p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grads)]

    def rank_fn(r):
        state = [rt.array(p, device=devices[r]) for p in params]
        xs = rt.array(x[12 * r:12 * (r + 1)], device=devices[r])
        ys = rt.array(y[12 * r:12 * (r + 1)], device=devices[r])
        run = rt.compile(lambda *a: step(*a, groups[r])) if compiled else (lambda *a: step(*a, groups[r]))
        for _ in range(3):
            state = run(*state, xs, ys)
            rt.eval(*state)
        return [s.numpy() for s in state]

    results = run_ranks(devices, rank_fn)
    want = _whole_batch(params, x, y)
    for got in results:
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    for got in results[1:]:  # every rank holds the same parameters
        for a, b in zip(got, results[0]):
            np.testing.assert_array_equal(a, b)


def _whole_batch(params, x, y, steps: int = 3) -> list[np.ndarray]:
    """The parameters after ``steps`` SGD steps on the whole batch, on one CPU device (numpy's
    products: as close to the GPU's as to another rank's)."""
    one = hal.create_device("local-sync")
    state = [rt.array(p, device=one) for p in params]
    X, Y = rt.array(x, device=one), rt.array(y, device=one)
    for _ in range(steps):
        _, grads = value_and_grad(*state, X, Y)
        state = [p - 0.1 * g for p, g in zip(state, grads)]
    return [s.numpy() for s in state]


def _fake_gpus(n: int, mode: str):
    """``n`` devices of one simulated GPU driver, lowered as GPUs (tests/drivers/fake_gpu.py), and its
    simulated NCCL."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from drivers.fake_gpu import FakeGpuDriver

    from runtime.device import context_for

    driver = FakeGpuDriver()
    devices = [driver.create_device(i, command_buffer=mode) for i in range(n)]
    for device in devices:
        context_for(device).is_gpu = True
    return driver, devices


@pytest.mark.parametrize("where", ["local-task", "fake-gpu-graph", "fake-gpu-stream"]
                         + ["cuda"] * (("cuda", 2) in _cuda_ranks()))
def test_overlapped_buckets_in_symmetric_memory_train_as_the_whole_batch(where):
    """``symmetric_bytes``: rt.compile places every bucket's all-reduce operands in the group's
    symmetric memory, the buckets before the last on the capped channel (``Group.overlapped``); the
    training equals the whole batch's on one device, and on the simulated NCCL every all-reduce of
    the step is the symmetric kind, the early buckets' on the capped communicator."""
    n = 2
    if where in ("local-task", "cuda"):
        driver, devices = None, [make_device(where, i) for i in range(n)]
    else:
        driver, devices = _fake_gpus(n, where.rpartition("-")[2])
    groups = rt.distributed.groups(devices, symmetric_bytes=1 << 16)
    assert all(g.overlapped.channel.max_blocks == rt.distributed.OVERLAP_BLOCKS for g in groups)
    assert all(g.arena.buffer.size == g.overlapped.arena.buffer.size == 1 << 16 for g in groups)
    params, x, y = params_and_data(12 * n)

    def step(w1, b1, w2, b2, x, y, group):
        _, grads = value_and_grad(w1, b1, w2, b2, x, y)
        grads = rt.distributed.average_gradients(grads, group, bucket_bytes=600)  # several buckets
        return [p - 0.1 * g for p, g in zip((w1, b1, w2, b2), grads)]

    def rank_fn(r):
        state = [rt.array(p, device=devices[r]) for p in params]
        xs = rt.array(x[12 * r:12 * (r + 1)], device=devices[r])
        ys = rt.array(y[12 * r:12 * (r + 1)], device=devices[r])
        run = rt.compile(lambda *a: step(*a, groups[r]))
        for _ in range(3):
            state = run(*state, xs, ys)
            rt.eval(*state)
        return [s.numpy() for s in state]

    try:
        results = run_ranks(devices, rank_fn)
        used = [(g.arena.used, g.overlapped.arena.used) for g in groups]
        assert all(a and b for a, b in used) and len(set(used)) == 1  # (every rank's pieces alike)
        want = _whole_batch(params, x, y)
        for got in results:
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
        if driver is not None:
            calls = driver.nccl.calls
            assert calls.get("symmetric all_reduce", 0) == calls["all_reduce"] - 2 * n  # (all but the warm-ups')
            capped = [g.overlapped.channel.comm for g in groups]
            assert all(c.max_blocks == rt.distributed.OVERLAP_BLOCKS and c.windows for c in capped)
    finally:
        for group in groups:
            group.close()
        if driver is not None:  # every arena deregistered and freed with its group
            calls = driver.nccl.calls
            assert calls["ncclMemFree"] == calls["ncclCommWindowDeregister"] == calls["ncclMemAlloc"] == 2 * n
        for device in devices:
            device.close()


def test_hostile_symmetric_sizes_are_refused_before_any_channel():
    device = hal.create_device("local-sync")
    for bad in (-1, 1.5, True, "1", None):
        with pytest.raises(rt.InvalidValueError):
            rt.distributed.groups([device], symmetric_bytes=bad)
        with pytest.raises(rt.InvalidValueError):
            rt.distributed.init(device, rank=0, size=1, symmetric_bytes=bad)
    group = rt.distributed.init(device, rank=0, size=1, symmetric_bytes=0)
    assert group.arena is None and group.overlapped is None
    group.close()
    device.close()


def test_an_arena_hands_out_aligned_pieces_in_order_and_never_takes_them_back():
    """Every rank must find its operands at the same offsets (NCCL's symmetric kernels address a
    peer's by the local offset): pieces go out in the order asked for, whatever was let go."""
    device = hal.create_device("local-sync")
    align = rt.distributed.Arena.ALIGN
    arena = rt.distributed.Arena(device.allocator.allocate(4 * align))
    a, b, c = arena.take(10), arena.take(align + 1), arena.take(1)
    assert [(x.offset, x.size) for x in (a, b, c)] == [(0, 10), (align, align + 1), (3 * align, 1)]
    assert arena.used == 4 * align
    del a, b
    assert arena.take(1) is None  # (full: nothing comes back)
    device.close()


def _layer_grads(device, widths):
    """The lazy gradients of a ReLU network's squared loss: (w1, b1, w2, b2, ...) for ``widths``."""
    rng = np.random.default_rng(3)
    params = []
    for fan_in, fan_out in zip(widths, widths[1:]):
        params += [rt.array(rng.standard_normal((fan_in, fan_out), dtype=np.float32) * 0.1, device=device),
                   rt.array(np.zeros(fan_out, np.float32), device=device)]
    x = rt.array(rng.standard_normal((4, widths[0]), dtype=np.float32), device=device)

    def loss(*ps):
        h = x
        for i in range(0, len(ps), 2):
            h = h @ ps[i] + ps[i + 1]
            if i + 2 < len(ps):
                h = rt.nn.relu(h)
        return (h * h).mean()

    return rt.grad(loss, argnums=tuple(range(len(params))))(*params)


def test_buckets_follow_the_backward_pass():
    device = hal.create_device("local-sync")
    grads = _layer_grads(device, [256, 1024, 512])  # w1 1 MiB, b1, w2 2 MiB, b2
    depth = rt.distributed.readiness(grads)
    assert depth[2] < depth[0] and depth[3] < depth[1]  # the output layer's come first
    # The output layer's bucket (over EARLY_BUCKET_BYTES) closes before the first layer's gradients
    # come: its all-reduce can run while they are computed.
    assert rt.distributed.buckets(grads) == [[3, 2], [1, 0]]
    # A bucket a gradient each, in the order they come out; one bucket when it cannot start early.
    assert rt.distributed.buckets(grads, bucket_bytes=1) == [[3], [2], [1], [0]]
    small = _layer_grads(device, [8, 16, 4])
    assert rt.distributed.buckets(small) == [[3, 2, 1, 0]]
    assert rt.distributed.buckets(small, bucket_bytes=600) == [[3, 2, 1], [0]]  # 336 bytes, then 512
    # Computed gradients (nothing pending) are all ready at once: the last first.
    rt.eval(*small)
    assert rt.distributed.readiness(small) == [0, 0, 0, 0]
    assert rt.distributed.buckets(small, bucket_bytes=600) == [[3, 2, 1], [0]]
    # hostile inputs: typed errors
    for bad in (True, 0, 2.5, np.int64(8), "8"):
        with pytest.raises(rt.errors.InvalidValueError, match="bucket_bytes"):
            rt.distributed.buckets(small, bucket_bytes=bad)
    with pytest.raises(rt.errors.InvalidTypeError, match="gradient 1"):
        rt.distributed.buckets([small[0], np.ones(3, np.float32)])
    with pytest.raises(rt.errors.InvalidTypeError, match="gradient 0"):
        rt.distributed.buckets([rt.arange(3, device=device)])
    with pytest.raises(rt.errors.InvalidTypeError, match="item 0"):
        rt.distributed.readiness([None])
    for group in (None, 1.5, "g", device):
        with pytest.raises(rt.errors.InvalidValueError, match="group"):
            rt.distributed.average_gradients(small, group)
    group = rt.distributed.init(device, rank=0, size=1)
    try:
        for grads in (None, 3, small[0]):
            with pytest.raises(rt.errors.InvalidTypeError):
                rt.distributed.average_gradients(grads, group)
    finally:
        group.close()
    device.close()


def test_a_bucket_is_reduced_where_it_lies_as_one_group():
    devices = [hal.create_device("local-sync") for _ in range(2)]
    groups = rt.distributed.groups(devices)
    grads = _layer_grads(devices[0], [256, 1024, 512])
    averaged = rt.distributed.average_gradients(grads, groups[0])
    for g, a in zip(grads, averaged):  # each gradient all-reduced itself: no concatenated copy
        assert a.op == "collective" and a.inputs[0] is g and a.shape == g.shape
    # The output layer's all-reduces wait for its whole bucket and nothing more: one level, one group,
    # ahead of the first layer's.
    assert {id(x) for x in averaged[3].inputs} == {id(x) for x in averaged[2].inputs} == {id(grads[2]), id(grads[3])}
    depth = rt.distributed.readiness(averaged)
    assert depth[3] == depth[2] < depth[1] == depth[0]
    for group in groups:
        group.close()
    for device in devices:
        device.close()


def test_gradients_flow_through_an_all_sum(ranks):
    devices, groups = ranks
    n = len(devices)

    def rank_fn(r):
        x = rt.array(np.arange(3, dtype=np.float32) + r, device=devices[r])
        g = rt.grad(lambda v: (rt.distributed.all_sum(v * v, groups[r]) * (r + 1)).sum())(x)
        return g.numpy()

    results = run_ranks(devices, rank_fn)
    weight = sum(range(1, n + 1))  # every rank's loss reads every rank's x
    for r, got in enumerate(results):
        np.testing.assert_allclose(got, 2 * (np.arange(3) + r) * weight)


def test_hostile_calls_are_typed_errors_before_any_work():
    devices = [hal.create_device("local-sync") for _ in range(2)]
    groups = rt.distributed.groups(devices)
    other = hal.create_device("local-sync")
    x = rt.array(np.ones(4, np.float32), device=devices[0])
    with pytest.raises(hal.InvalidArgumentError, match="group"):
        rt.distributed.all_sum(x, "not a group")
    with pytest.raises(hal.InvalidArgumentError, match="on"):
        rt.distributed.all_sum(rt.array(np.ones(4, np.float32), device=other), groups[0])
    with pytest.raises(hal.InvalidArgumentError):
        rt.distributed.all_sum(np.ones(4), groups[0])
    with pytest.raises(hal.InvalidArgumentError, match="split"):
        rt.distributed.reduce_scatter(rt.array(np.ones(3, np.float32), device=devices[0]), groups[0])
    for root in (2, -1, 1.0, True):
        with pytest.raises(hal.InvalidArgumentError, match="root"):
            rt.distributed.broadcast(x, groups[0], root=root)
    with pytest.raises(hal.InvalidArgumentError, match="float"):
        rt.distributed.all_mean(rt.arange(3, device=devices[0]), groups[0])
    with pytest.raises(hal.InvalidArgumentError, match="bucket_bytes"):
        rt.distributed.average_gradients([x], groups[0], bucket_bytes=0)
    with pytest.raises(hal.InvalidArgumentError, match="complex"):
        rt.distributed.all_sum(rt.array(np.ones(2, np.complex64), device=devices[0]), groups[0])
    groups[1].close()
    groups[0].close()
    with pytest.raises(hal.HalError):
        rt.distributed.all_sum(x, groups[0])
    assert (x + 1).numpy().tolist() == [2.0] * 4  # the device works on


def test_closing_a_group_releases_its_recordings(ranks):
    """A closed group's compiled steps raise a typed error instead of running its collectives."""
    devices, groups = ranks

    def rank_fn(r):
        f = rt.compile(lambda x: rt.distributed.all_sum(x, groups[r]) * 2)
        x = rt.array(np.ones(3, np.float32), device=devices[r])
        first = f(x).numpy()
        return f, x, first

    results = run_ranks(devices, rank_fn)
    for _f, _x, first in results:
        np.testing.assert_array_equal(first, np.full(3, 2.0 * len(devices)))
    for group in groups:
        group.close()
    for (f, x, _), device in zip(results, devices):
        with pytest.raises(hal.FailedPreconditionError):
            f(x).numpy()
        assert (rt.array(np.ones(2, np.float32), device=device) + 1).numpy().tolist() == [2.0, 2.0]


def test_gradients_of_a_parameter_tree_average_as_the_same_tree(ranks):
    """rt.grad of a dict/namedtuple of parameters is the same tree; average_gradients takes it and
    gives it back averaged, None kept where the parameters held no array; anything else refused."""
    import collections

    Layer = collections.namedtuple("Layer", "w b")
    devices, groups = ranks
    count = len(devices)

    def rank_step(rank):
        device, group = devices[rank], groups[rank]
        x = rt.array(np.full((2, 3), rank + 1, np.float32), device=device)
        params = {"layer": Layer(rt.ones((3, 4), device=device), rt.zeros((4,), device=device)), "name": "mlp"}
        grads = rt.grad(lambda p: (x @ p["layer"].w + p["layer"].b).sum())(params)
        averaged = rt.distributed.average_gradients(grads, group)
        assert type(averaged["layer"]) is Layer and averaged["name"] is None
        with pytest.raises(rt.errors.InvalidTypeError, match="str where a gradient"):
            rt.distributed.average_gradients({"g": grads["layer"].w, "name": "mlp"}, group)
        return averaged["layer"].w.numpy(), averaged["layer"].b.numpy()

    mean_rows = sum(2 * (r + 1) for r in range(count)) / count  # x's column sums, averaged over ranks
    for w, b in run_ranks(devices, rank_step):
        np.testing.assert_allclose(w, np.full((3, 4), mean_rows))
        np.testing.assert_allclose(b, np.full(4, 2.0))
