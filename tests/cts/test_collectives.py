"""Channels and collective commands (hal.channel), checked against numpy on every driver.

Each test makes one device per rank: on the CPU drivers any number of them (ranks 1-8 run here),
on GPU drivers the driver's distinct GPUs (tests needing more ranks than GPUs skip). Every kind,
reduction and element type, in-place variants, offsets, binding-table slots, reusable command
buffers, count 0, grouped send/recv, channels from threads and from splits; hostile arguments are
refused with typed errors before any device work. On drivers whose channels compare the ranks'
operations and time out (``Channel.checks_matching``, the CPU reference channel), mismatched
operations, a rank that never comes, ``abort()`` from another thread and a device closed under a
waiting rank fail the semaphores and leave the devices usable.
"""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest

import hal
from hal.channel import AVERAGEABLE, DTYPE_SIZES, REDUCIBLE

from .helpers import WAIT_TIMEOUT

Mode = hal.CommandBufferMode
#: Why every test here skips on a driver without collectives (a driver may have none).
NO_COLLECTIVES = "has no collective operations"
Slot = hal.Slot
NUMPY = {"bool": np.bool_, "bfloat16": np.float32}
RANK_COUNTS = (1, 2, 3, 4, 8)


def to_storage(values: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        bits = np.asarray(values, np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
    return np.asarray(values).astype(NUMPY.get(dtype, dtype)).tobytes()


def from_storage(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, NUMPY.get(dtype, dtype))


class Ranks:
    """The devices and channels of one communicator, and helpers to record and run on every rank."""

    def __init__(self, devices: list[hal.Device], channels: list[hal.Channel]) -> None:
        self.devices = devices
        self.channels = channels
        self.count = len(devices)

    def buffers(self, size: int, data=None, **kwargs) -> list[hal.Buffer]:
        """One buffer per rank; ``data(rank)`` gives its bytes (zeros otherwise)."""
        result = []
        for rank, device in enumerate(self.devices):
            buf = device.allocator.allocate(size, **kwargs)
            raw = bytes(size) if data is None else data(rank)
            device.write(buf, raw + bytes(size - len(raw)))
            result.append(buf)
        return result

    def record(self, body, mode: hal.CommandBufferMode = Mode.ONE_SHOT, capacity: int = 0) -> list:
        cbs = []
        for rank, device in enumerate(self.devices):
            cb = device.create_command_buffer(mode=mode, binding_capacity=capacity)
            with cb.record():
                body(cb, rank, self.channels[rank])
            cbs.append(cb)
        return cbs

    def submit(self, cbs, tables=None, ranks=None) -> list[hal.Semaphore]:
        sems = []
        for rank in (range(self.count) if ranks is None else ranks):
            device = self.devices[rank]
            sem = device.create_semaphore(0)
            device.queue_execute([cbs[rank]], signal=[(sem, 1)],
                                 binding_tables=None if tables is None else [tables[rank]])
            sems.append(sem)
        return sems

    def run(self, body, **kwargs) -> None:
        cbs = self.record(body, **{k: v for k, v in kwargs.items() if k in ("mode", "capacity")})
        for sem in self.submit(cbs, kwargs.get("tables")):
            sem.wait(1, timeout=WAIT_TIMEOUT)

    def read(self, buffers, dtype: str, offset: int = 0, length: int | None = None) -> list[np.ndarray]:
        return [from_storage(d.read(b, offset, length), dtype) for d, b in zip(self.devices, buffers)]


@pytest.fixture(scope="module")
def rank_cache(hal_driver):
    """Ranks kept for the module's tests (device and communicator creation is slow on GPUs), by rank count."""
    cache: dict[int, Ranks] = {}
    yield cache
    for ranks in cache.values():
        for channel in ranks.channels:
            channel.close()
        for device in ranks.devices:
            device.close()


def _usable(ranks: Ranks) -> bool:
    return all(not d.closed for d in ranks.devices) and all(not c.closed and c.failure is None for c in ranks.channels)


@pytest.fixture
def make_ranks(hal_driver, driver_uri, device_options, shared_device, rank_cache):
    """make_ranks(n, timeout=..., fresh=False): n devices of the driver under test and one channel each
    (create_channels); the module's ranks of that count are reused unless ``fresh`` or another timeout."""
    made: list[hal.Device] = []
    channels_made: list[hal.Channel] = []
    factory = getattr(shared_device, "collectives", None)
    if factory is None:
        pytest.skip(f"{shared_device.info.driver} {NO_COLLECTIVES}")

    def devices(n: int) -> list[hal.Device]:
        infos = hal_driver.query_devices()
        if driver_uri.partition("://")[2] == "" and len(infos) >= n:
            uris = [info.uri for info in infos[:n]]
        elif getattr(factory, "ranks_share_devices", False):
            uris = [driver_uri] * n
        else:
            pytest.skip(f"{n} ranks need {n} devices; {hal_driver.name} has {len(infos)}")
        result = [hal.create_device(uri, **device_options) for uri in uris]
        made.extend(result)
        return result

    def make(n: int, timeout: float | None = WAIT_TIMEOUT, fresh: bool = False) -> Ranks:
        shared = not fresh and timeout == WAIT_TIMEOUT
        if shared and n in rank_cache and _usable(rank_cache[n]):
            return rank_cache[n]
        devs = devices(n)
        try:
            channels = hal.create_channels(devs, timeout=timeout)
        except hal.UnavailableError as exc:
            pytest.skip(str(exc))
        ranks = Ranks(devs, channels)
        if shared:
            stale = rank_cache.pop(n, None)
            rank_cache[n] = ranks
            made[len(made) - n:] = []  # the cache closes them
            if stale is not None:
                channels_made.extend(stale.channels)
                made.extend(stale.devices)
        else:
            channels_made.extend(channels)
        return ranks

    make.devices = devices  # type: ignore[attr-defined]
    yield make
    for channel in channels_made:
        channel.close()
    for device in made:
        device.close()


def _values(rank: int, n: int, dtype: str, reduction: str = "sum") -> np.ndarray:
    """Small integers (exact in every type) that differ per rank and element."""
    base = np.arange(n) % 3 + 1 if reduction == "prod" else (np.arange(n) * 7 + rank * 5) % 11 + 1
    if dtype == "bool":
        return (base + rank) % 2 == 0
    if dtype.startswith("int") and reduction != "prod":
        base = base - 5
    return base


def _reduce(values: list[np.ndarray], reduction: str, dtype: str) -> np.ndarray:
    compute = np.float64 if dtype in AVERAGEABLE else np.int64
    stacked = np.stack([v.astype(compute) for v in values])
    if reduction in ("sum", "avg"):
        result = stacked.sum(axis=0)
        return result / len(values) if reduction == "avg" else result
    return {"prod": np.prod, "min": np.min, "max": np.max}[reduction](stacked, axis=0)


def _wrap(expected: np.ndarray, dtype: str) -> np.ndarray:
    """Integer results as the element type wraps them."""
    if dtype in AVERAGEABLE:
        return expected
    return expected.astype(np.int64).astype(NUMPY.get(dtype, dtype)).astype(np.int64)


def _check(actual: np.ndarray, expected: np.ndarray, dtype: str, reduction: str = "sum") -> None:
    if dtype in AVERAGEABLE and reduction == "avg":
        rtol = {"float16": 2e-3, "bfloat16": 1e-2}.get(dtype, 1e-6)
        np.testing.assert_allclose(actual.astype(np.float64), expected, rtol=rtol)
    else:
        np.testing.assert_array_equal(actual.astype(np.float64), _wrap(expected, dtype).astype(np.float64))


# -- channels ------------------------------------------------------------------------------------------
def test_a_device_without_collectives_refuses_channels(device):
    if getattr(device, "collectives", None) is not None:
        pytest.skip(f"{device.info.driver} has collective operations")
    with pytest.raises(hal.UnimplementedError, match="collective"):
        hal.create_channel(device, rank=0, count=1)
    with pytest.raises(hal.UnimplementedError, match="collective"):
        hal.create_channels([device])


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_create_channels_gives_each_device_its_rank(make_ranks, n):
    ranks = make_ranks(n)
    assert [(c.rank, c.count) for c in ranks.channels] == [(r, n) for r in range(n)]
    assert all(c.device is d for c, d in zip(ranks.channels, ranks.devices))
    assert all(not c.closed and c.failure is None for c in ranks.channels)
    assert "rank 0 of" in repr(ranks.channels[0])


def test_a_channel_of_one_rank_from_the_environment_defaults(device, monkeypatch):
    if getattr(device, "collectives", None) is None:
        pytest.skip(f"{device.info.driver} {NO_COLLECTIVES}")
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                 "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    try:
        channel = hal.create_channel(device)
    except hal.UnavailableError as exc:
        pytest.skip(str(exc))
    with channel:
        assert (channel.rank, channel.count) == (0, 1)
        buf = device.allocator.allocate(16)
        device.write(buf, np.arange(4, dtype=np.float32).tobytes())
        cb = device.create_command_buffer()
        with cb.record():
            cb.all_reduce(channel, buf, buf, 4)
        sem = device.create_semaphore(0)
        device.queue_execute([cb], signal=[(sem, 1)])
        sem.wait(1, timeout=WAIT_TIMEOUT)
        assert np.frombuffer(device.read(buf), np.float32).tolist() == [0, 1, 2, 3]
    assert channel.closed
    channel.close()  # idempotent


def test_channels_made_by_one_thread_per_rank_with_a_shared_id(make_ranks):
    devices = make_ranks.devices(2)
    try:
        channel_id = hal.create_channel_id(devices[0])
    except hal.UnavailableError as exc:
        pytest.skip(str(exc))
    channels: list = [None] * 2
    errors: list = []

    def rank_main(rank: int) -> None:
        try:
            channel = channels[rank] = hal.create_channel(devices[rank], rank=rank, count=2, id=channel_id,
                                                          timeout=WAIT_TIMEOUT)
            dev = devices[rank]
            buf = dev.allocator.allocate(8)
            for step in range(5):
                dev.write(buf, np.array([rank + step, 1], np.int32).tobytes())
                cb = dev.create_command_buffer()
                with cb.record():
                    cb.all_reduce(channel, buf, buf, 2, "int32")
                sem = dev.create_semaphore(0)
                dev.queue_execute([cb], signal=[(sem, 1)])
                sem.wait(1, timeout=WAIT_TIMEOUT)
                assert np.frombuffer(dev.read(buf), np.int32).tolist() == [1 + 2 * step, 2]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_TIMEOUT * 2)
    assert errors == []
    for channel in channels:
        channel.close()


# -- every kind against numpy ----------------------------------------------------------------------------
REDUCTION_CASES = [(dtype, reduction) for dtype in sorted(REDUCIBLE)
                   for reduction in ("sum", "prod", "min", "max", "avg") if reduction != "avg" or dtype in AVERAGEABLE]


@pytest.mark.parametrize(("dtype", "reduction"), REDUCTION_CASES)
def test_all_reduce_every_type_and_reduction(make_ranks, dtype, reduction):
    ranks = make_ranks(2)
    n = 37
    size = n * DTYPE_SIZES[dtype]
    inputs = [_values(r, n, dtype, reduction) for r in range(2)]
    send = ranks.buffers(size, lambda r: to_storage(inputs[r], dtype))
    recv = ranks.buffers(size)
    ranks.run(lambda cb, r, ch: cb.all_reduce(ch, send[r], recv[r], n, dtype, reduction))
    expected = _reduce(inputs, reduction, dtype)
    for actual in ranks.read(recv, dtype):
        _check(actual, expected, dtype, reduction)


@pytest.mark.parametrize("n", RANK_COUNTS)
def test_all_reduce_in_place_over_every_rank_count(make_ranks, n):
    ranks = make_ranks(n)
    count = 1000
    inputs = [np.arange(count, dtype=np.float32) * (r + 1) for r in range(n)]
    bufs = ranks.buffers(count * 4, lambda r: inputs[r].tobytes())
    ranks.run(lambda cb, r, ch: cb.all_reduce(ch, bufs[r], bufs[r], count))
    for actual in ranks.read(bufs, "float32"):
        np.testing.assert_array_equal(actual, np.arange(count, dtype=np.float32) * (n * (n + 1) // 2))


@pytest.mark.parametrize("n", RANK_COUNTS)
@pytest.mark.parametrize("dtype", ["float32", "int16", "bool", "bfloat16", "uint8", "float64"])
def test_all_gather_in_rank_order(make_ranks, n, dtype):
    ranks = make_ranks(n)
    count = 5
    size = count * DTYPE_SIZES[dtype]
    inputs = [_values(r, count, dtype) for r in range(n)]
    send = ranks.buffers(size, lambda r: to_storage(inputs[r], dtype))
    recv = ranks.buffers(size * n)
    ranks.run(lambda cb, r, ch: cb.all_gather(ch, send[r], recv[r], count, dtype))
    expected = np.concatenate([from_storage(to_storage(v, dtype), dtype) for v in inputs])
    for actual in ranks.read(recv, dtype):
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("n", (1, 2, 3, 4))
@pytest.mark.parametrize("reduction", ["sum", "max"])
def test_reduce_scatter_gives_each_rank_its_chunk(make_ranks, n, reduction):
    ranks = make_ranks(n)
    count = 6
    inputs = [_values(r, count * n, "int32") for r in range(n)]
    send = ranks.buffers(count * n * 4, lambda r: to_storage(inputs[r], "int32"))
    recv = ranks.buffers(count * 4)
    ranks.run(lambda cb, r, ch: cb.reduce_scatter(ch, send[r], recv[r], count, "int32", reduction))
    expected = _reduce(inputs, reduction, "int32")
    for r, actual in enumerate(ranks.read(recv, "int32")):
        np.testing.assert_array_equal(actual, expected[r * count:(r + 1) * count])


@pytest.mark.parametrize("n", (1, 2, 3, 4))
def test_all_to_all_exchanges_chunks(make_ranks, n):
    ranks = make_ranks(n)
    count = 3
    inputs = [np.arange(count * n, dtype=np.int64) + 100 * r for r in range(n)]
    send = ranks.buffers(count * n * 8, lambda r: inputs[r].tobytes())
    recv = ranks.buffers(count * n * 8)
    ranks.run(lambda cb, r, ch: cb.all_to_all(ch, send[r], recv[r], count, "int64"))
    for r, actual in enumerate(ranks.read(recv, "int64")):
        expected = np.concatenate([inputs[i][r * count:(r + 1) * count] for i in range(n)])
        np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("n", (1, 2, 3, 4))
def test_broadcast_from_every_root(make_ranks, n):
    ranks = make_ranks(n)
    count = 9
    inputs = [np.arange(count, dtype=np.float16) + 10 * r for r in range(n)]
    send = ranks.buffers(count * 2, lambda r: inputs[r].tobytes())
    recv = ranks.buffers(count * 2)
    for root in range(n):
        ranks.run(lambda cb, r, ch, root=root: cb.broadcast(ch, send[r] if r == root else None, recv[r], count,
                                                            "float16", root=root))
        for actual in ranks.read(recv, "float16"):
            np.testing.assert_array_equal(actual, inputs[root])


@pytest.mark.parametrize("n", (1, 2, 3, 4))
def test_reduce_to_every_root(make_ranks, n):
    ranks = make_ranks(n)
    count = 4
    inputs = [np.array([1, 2, 3, 4], np.uint32) * (r + 1) for r in range(n)]
    send = ranks.buffers(count * 4, lambda r: inputs[r].tobytes())
    for root in range(n):
        recv = ranks.buffers(count * 4)
        ranks.run(lambda cb, r, ch, root=root, recv=recv: cb.reduce(ch, send[r], recv[r] if r == root else None,
                                                                    count, "uint32", "sum", root=root))
        for r, actual in enumerate(ranks.read(recv, "uint32")):
            expected = sum(inputs) if r == root else np.zeros(count)
            np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("n", (1, 2, 3, 8))
def test_send_and_recv_around_a_ring_in_one_group(make_ranks, n):
    """Every rank sends first, then receives: grouped (no barrier between them), nothing waits forever."""
    ranks = make_ranks(n)
    count = 16
    send = ranks.buffers(count * 4, lambda r: np.full(count, r, np.int32).tobytes())
    recv = ranks.buffers(count * 4)

    def ring(cb, r, ch):
        cb.send(ch, send[r], count, (r + 1) % n, "int32")
        cb.recv(ch, recv[r], count, (r - 1) % n, "int32")

    ranks.run(ring)
    for r, actual in enumerate(ranks.read(recv, "int32")):
        assert actual.tolist() == [(r - 1) % n] * count


# -- in place, offsets, slots, reuse ----------------------------------------------------------------------
def test_in_place_variants(make_ranks):
    ranks = make_ranks(2)
    n, count = 2, 4
    gathered = ranks.buffers(count * n * 4, lambda r: np.concatenate(
        [np.full(count, r if i == r else -1, np.int32) for i in range(n)]).tobytes())
    ranks.run(lambda cb, r, ch: cb.all_gather(ch, (gathered[r], r * count * 4, count * 4), gathered[r], count, "int32"))
    for actual in ranks.read(gathered, "int32"):
        assert actual.tolist() == [i for i in range(n) for _ in range(count)]
    scattered = ranks.buffers(count * n * 4, lambda r: np.arange(count * n, dtype=np.int32).tobytes())
    ranks.run(lambda cb, r, ch: cb.reduce_scatter(ch, scattered[r], (scattered[r], r * count * 4, count * 4), count,
                                                  "int32"))
    for r, actual in enumerate(ranks.read(scattered, "int32")):
        assert actual[r * count:(r + 1) * count].tolist() == (np.arange(r * count, (r + 1) * count) * n).tolist()
    cast = ranks.buffers(8, lambda r: np.array([r, r], np.float32).tobytes())
    ranks.run(lambda cb, r, ch: cb.broadcast(ch, cast[r], cast[r], 2, root=1))
    assert all(a.tolist() == [1, 1] for a in ranks.read(cast, "float32"))


def test_operands_at_offsets_and_in_subspans_leave_the_rest_alone(make_ranks):
    ranks = make_ranks(2)
    count = 10
    send = ranks.buffers(4096, lambda r: np.full(1024, r + 1, np.float32).tobytes())
    recv = ranks.buffers(4096, lambda r: np.full(1024, -7, np.float32).tobytes())
    views = [b.subspan(1024, 1024) for b in recv]
    ranks.run(lambda cb, r, ch: cb.all_reduce(ch, (send[r], 256, count * 4), (views[r], 64), count))
    for actual in ranks.read(recv, "float32"):
        assert actual[256 + 16:256 + 16 + count].tolist() == [3.0] * count
        assert (actual[:256 + 16] == -7).all() and (actual[256 + 16 + count:] == -7).all()


def test_operands_through_binding_table_slots_rebind_per_submission(make_ranks):
    ranks = make_ranks(2)
    count = 8
    sends = [ranks.buffers(count * 4, lambda r, k=k: np.full(count, r + 10 * k, np.float32).tobytes())
             for k in range(2)]
    recv = ranks.buffers(count * 4)
    cbs = ranks.record(lambda cb, r, ch: cb.all_reduce(ch, Slot(0), Slot(1), count), mode=Mode.REUSABLE, capacity=2)
    for k in (0, 1, 0):
        for sem in ranks.submit(cbs, tables=[[sends[k][r], recv[r]] for r in range(2)]):
            sem.wait(1, timeout=WAIT_TIMEOUT)
        for actual in ranks.read(recv, "float32"):
            assert actual.tolist() == [1 + 20 * k] * count


def test_a_reusable_command_buffer_runs_its_collectives_every_time(make_ranks):
    ranks = make_ranks(2)
    bufs = ranks.buffers(16, lambda r: np.ones(4, np.float32).tobytes())
    cbs = ranks.record(lambda cb, r, ch: cb.all_reduce(ch, bufs[r], bufs[r], 4), mode=Mode.REUSABLE)
    for step in range(1, 4):
        for sem in ranks.submit(cbs):
            sem.wait(1, timeout=WAIT_TIMEOUT)
        assert all(a.tolist() == [2.0 ** step] * 4 for a in ranks.read(bufs, "float32"))


def test_collectives_between_other_commands_and_barriers(make_ranks, kernels):
    ranks = make_ranks(2)
    src = ranks.buffers(16, lambda r: np.arange(4, dtype=np.float32).tobytes())
    work = ranks.buffers(16)
    out = ranks.buffers(16)

    def body(cb, r, ch):
        cb.copy_buffer(src[r], work[r])
        cb.execution_barrier()
        cb.all_reduce(ch, work[r], work[r], 4)
        cb.all_reduce(ch, work[r], out[r], 4, reduction="max")
        cb.execution_barrier()
        cb.fill_buffer((work[r], 0, 4), 0, 4)

    ranks.run(body)
    assert all(a.tolist() == [0, 2, 4, 6] for a in ranks.read(out, "float32"))
    assert all(a.tolist() == [0, 2, 4, 6] for a in ranks.read(work, "float32"))


def test_later_submissions_on_the_queue_see_the_collective_done(make_ranks):
    """Queue order holds across a collective that waits for other ranks: a submission behind it runs after it."""
    ranks = make_ranks(2)
    bufs = ranks.buffers(16, lambda r: np.full(4, r + 1, np.float32).tobytes())
    copies = ranks.buffers(16)
    reduce_cbs = ranks.record(lambda cb, r, ch: cb.all_reduce(ch, bufs[r], bufs[r], 4))
    copy_cbs = ranks.record(lambda cb, r, ch: cb.copy_buffer(bufs[r], copies[r]))
    dev0, dev1 = ranks.devices
    sem0 = dev0.create_semaphore(0)
    dev0.queue_execute([reduce_cbs[0]])
    dev0.queue_execute([copy_cbs[0]], signal=[(sem0, 1)])
    time.sleep(0.05)
    sems = ranks.submit(reduce_cbs, ranks=[1])
    sem0.wait(1, timeout=WAIT_TIMEOUT)
    sems[0].wait(1, timeout=WAIT_TIMEOUT)
    assert ranks.read(copies, "float32")[0].tolist() == [3.0] * 4


def test_count_zero_runs_and_writes_nothing(make_ranks):
    ranks = make_ranks(2)
    bufs = ranks.buffers(8, lambda r: b"\x07" * 8)
    ranks.run(lambda cb, r, ch: (cb.all_reduce(ch, bufs[r], bufs[r], 0), cb.all_gather(ch, bufs[r], bufs[r], 0),
                                 cb.broadcast(ch, bufs[r], bufs[r], 0)))
    assert all(d.read(b) == b"\x07" * 8 for d, b in zip(ranks.devices, bufs))


def test_split_channels_into_colors(make_ranks):
    ranks = make_ranks(4)
    children = hal.split_channels(ranks.channels, [0, 1, 0, None], keys=[1, 0, 0, 0])
    assert children[3] is None
    assert [(c.rank, c.count) for c in children[:3]] == [(1, 2), (0, 1), (0, 2)]
    bufs = ranks.buffers(4, lambda r: np.array([r + 1], np.int32).tobytes())
    cbs = [None] * 3
    for r in range(3):
        dev = ranks.devices[r]
        cbs[r] = dev.create_command_buffer()
        with cbs[r].record():
            cbs[r].all_reduce(children[r], bufs[r], bufs[r], 1, "int32")
    sems = []
    for r in range(3):
        sem = ranks.devices[r].create_semaphore(0)
        ranks.devices[r].queue_execute([cbs[r]], signal=[(sem, 1)])
        sems.append(sem)
    for sem in sems:
        sem.wait(1, timeout=WAIT_TIMEOUT)
    assert [a.tolist() for a in ranks.read(bufs, "int32")] == [[4], [2], [4], [4]]
    for child in children[:3]:
        child.close()


@pytest.mark.parametrize("n", [1, 2, 4])
def test_symmetric_buffers_serve_collectives_and_every_other_command(make_ranks, n):
    ranks = make_ranks(n)
    count = 1000  # (not a multiple of any vector width)
    nbytes = 4 * count
    sends = hal.allocate_symmetric(ranks.channels, nbytes)
    recvs = hal.allocate_symmetric(ranks.channels, nbytes)
    plain = ranks.buffers(nbytes)
    assert [b.size for b in sends + recvs] == [nbytes] * 2 * n
    assert all(b.memory_type & hal.MemoryType.DEVICE_LOCAL for b in sends + recvs)
    values = [_values(r, count, "float32") for r in range(n)]
    for device, buf, v in zip(ranks.devices, sends, values):
        device.write(buf, to_storage(v, "float32"))

    def body(cb, rank, channel):
        cb.all_reduce(channel, sends[rank], recvs[rank], count)  # out of place, both symmetric
        cb.execution_barrier()
        cb.all_reduce(channel, recvs[rank], recvs[rank], count, reduction="max")  # in place
        cb.execution_barrier()
        cb.copy_buffer((recvs[rank], 0, nbytes), (plain[rank], 0, nbytes))
        cb.fill_buffer((sends[rank], 0, 8), 0x04030201, 4)

    ranks.run(body)
    total = _reduce(values, "sum", "float32")
    for got in ranks.read(recvs, "float32") + ranks.read(plain, "float32"):
        _check(got, total, "float32")
    for raw in (d.read(b, 0, 8) for d, b in zip(ranks.devices, sends)):
        assert raw == b"\x01\x02\x03\x04" * 2
    for buf in sends + recvs:
        buf.release()
    ranks.run(lambda cb, rank, channel: cb.all_reduce(channel, plain[rank], plain[rank], count))
    for got in ranks.read(plain, "float32"):
        _check(got, total * n, "float32")


def test_a_channel_allocates_its_own_symmetric_buffer(make_ranks):
    ranks = make_ranks(1)
    channel = ranks.channels[0]
    assert isinstance(channel.symmetric_memory, bool)
    buf = channel.allocate_symmetric(64)
    empty = channel.allocate_symmetric(0)
    assert (buf.size, empty.size) == (64, 0)
    ranks.devices[0].write(buf, bytes(range(64)))
    ranks.run(lambda cb, rank, ch: cb.all_reduce(ch, buf, buf, 16, "int32"))
    assert ranks.devices[0].read(buf) == bytes(range(64))
    buf.release()
    empty.release()


@pytest.mark.parametrize("size", [-1, 1.5, True, "8", None, np.float32(8)])
def test_hostile_symmetric_sizes_are_refused(make_ranks, size):
    ranks = make_ranks(2)
    with pytest.raises(hal.InvalidArgumentError):
        hal.allocate_symmetric(ranks.channels, size)
    with pytest.raises(hal.InvalidArgumentError):
        ranks.channels[0].allocate_symmetric(size)
    bufs = ranks.buffers(4)
    ranks.run(lambda cb, rank, ch: cb.all_reduce(ch, bufs[rank], bufs[rank], 1))  # the channels stay usable


def test_symmetric_allocation_refuses_odd_channel_lists_and_closed_channels(make_ranks):
    ranks = make_ranks(2)
    for channels in ([], [ranks.channels[0], ranks.channels[0]], ["channel"], ranks.channels[0]):
        with pytest.raises(hal.InvalidArgumentError):
            hal.allocate_symmetric(channels, 8)
    fresh = make_ranks(1, fresh=True)
    fresh.channels[0].close()
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        fresh.channels[0].allocate_symmetric(8)
    assert hal.allocate_symmetric(ranks.channels, np.int64(8))[0].size == 8


@pytest.mark.parametrize("n", [2, 4])
def test_a_split_with_a_block_cap_runs_its_collectives(make_ranks, n):
    ranks = make_ranks(n)
    capped = hal.split_channels(ranks.channels, [0] * n, max_blocks=np.int32(2))
    assert [(c.rank, c.count, c.max_blocks) for c in capped] == [(r, n, 2) for r in range(n)]
    assert all(c.max_blocks is None for c in ranks.channels)
    bufs = ranks.buffers(16, lambda r: to_storage(_values(r, 4, "float32"), "float32"))
    ranks.run(lambda cb, rank, ch: cb.all_reduce(capped[rank], bufs[rank], bufs[rank], 4))
    total = _reduce([_values(r, 4, "float32") for r in range(n)], "sum", "float32")
    for got in ranks.read(bufs, "float32"):
        _check(got, total, "float32")
    for channel in capped:
        channel.close()


@pytest.mark.parametrize("max_blocks", [0, -1, 65, True, 2.0, "4", np.float64(2)])
def test_hostile_block_caps_are_refused_before_any_split(make_ranks, max_blocks):
    ranks = make_ranks(2)
    with pytest.raises(hal.InvalidArgumentError, match="max_blocks"):
        hal.split_channels(ranks.channels, [0, 0], max_blocks=max_blocks)
    with pytest.raises(hal.InvalidArgumentError, match="max_blocks"):
        ranks.channels[0].split(0, max_blocks=max_blocks)
    children = hal.split_channels(ranks.channels, [0, 0])  # nothing was split: the next split pairs up
    assert [(c.rank, c.count) for c in children] == [(0, 2), (1, 2)]
    for child in children:
        child.close()


# -- hostile arguments: refused with typed errors while recording ---------------------------------------
def _recording(ranks: Ranks, rank: int = 0) -> hal.CommandBuffer:
    cb = ranks.devices[rank].create_command_buffer()
    cb.begin()
    return cb


@pytest.mark.parametrize(("call", "error"), [
    (lambda cb, ch, b: cb.collective("channel", "all_reduce", b, b, 1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.collective(ch, "allreduce", b, b, 1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.collective(ch, 3, b, b, 1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, -1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, True), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, np.bool_(True)), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 2.0), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, "4"), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, None), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, "float8"), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, None), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, True), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, np.complex64), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, "bool"), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, "int16"), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, "int32", "avg"), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, "float32", "mean"), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 1, "float32", None), None),  # None: the default sum
    (lambda cb, ch, b: cb.collective(ch, "all_gather", b, b, 1, reduction="sum"), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.collective(ch, "all_reduce", b, b, 1, root=0), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.collective(ch, "all_reduce", b, b, 1, peer=1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.broadcast(ch, b, b, 1, root=2), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.broadcast(ch, b, b, 1, root=-1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.broadcast(ch, b, b, 1, root=True), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.broadcast(ch, b, b, 1, root=np.int64(1)), None),
    (lambda cb, ch, b: cb.send(ch, b, 1, peer=2), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.send(ch, b, 1, peer=None), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.collective(ch, "send", b, b, 1, peer=1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.collective(ch, "recv", b, b, 1, peer=1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, None, b, 1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.all_reduce(ch, b, None, 1), hal.InvalidArgumentError),
    (lambda cb, ch, b: cb.broadcast(ch, None, b, 1, root=0), hal.InvalidArgumentError),  # rank 0 is the root
    (lambda cb, ch, b: cb.reduce(ch, b, None, 1, root=1), None),  # not the root: no recv needed
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 65), hal.OutOfRangeError),
    (lambda cb, ch, b: cb.all_reduce(ch, (b, 0, 8), (b, 8, 8), 3), hal.OutOfRangeError),
    (lambda cb, ch, b: cb.all_gather(ch, (b, 0, 8), (b, 128, 128), 4), hal.OutOfRangeError),
    (lambda cb, ch, b: cb.all_reduce(ch, (b, 2, 8), (b, 64, 8), 2), hal.InvalidArgumentError),  # misaligned
    (lambda cb, ch, b: cb.all_reduce(ch, (b, 0, 16), (b, 8, 16), 4), hal.InvalidArgumentError),  # overlap
    (lambda cb, ch, b: cb.all_to_all(ch, b, b, 2), hal.InvalidArgumentError),  # never in place
    (lambda cb, ch, b: cb.all_gather(ch, (b, 0, 8), (b, 0, 16), 2), None),  # rank 0's chunk starts recv
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, np.int32(4)), None),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 4, np.float32), None),
    (lambda cb, ch, b: cb.all_reduce(ch, b, b, 4, np.dtype("int8")), None),
    (lambda cb, ch, b: cb.all_reduce(ch, (b, 300), (b, 300), 1), hal.OutOfRangeError),
    (lambda cb, ch, b: cb.all_reduce(ch, Slot(0), Slot(1), 1), hal.InvalidArgumentError),  # capacity 0
    (lambda cb, ch, b: cb.all_reduce(ch, b"bytes", b, 1), hal.InvalidArgumentError),
])
def test_hostile_arguments_are_refused_while_recording(make_ranks, call, error):
    ranks = make_ranks(2)
    buf = ranks.devices[0].allocator.allocate(256)
    cb = _recording(ranks)
    if error is None:
        call(cb, ranks.channels[0], buf)
    else:
        with pytest.raises(error):
            call(cb, ranks.channels[0], buf)
    assert cb.state is hal.CommandBufferState.RECORDING  # nothing changed: recording goes on
    cb.end()


def test_all_gather_in_place_rule_follows_the_rank(make_ranks):
    ranks = make_ranks(2)
    buf = ranks.devices[1].allocator.allocate(64)
    cb = _recording(ranks, 1)
    with pytest.raises(hal.InvalidArgumentError, match="in place"):
        cb.all_gather(ranks.channels[1], (buf, 0, 8), (buf, 0, 16), 2)  # rank 1's chunk starts at 8
    cb.all_gather(ranks.channels[1], (buf, 8, 8), (buf, 0, 16), 2)
    cb.end()


def test_channel_of_another_device_and_closed_channels_are_refused(make_ranks):
    ranks = make_ranks(2)
    buf = ranks.devices[0].allocator.allocate(16)
    cb = _recording(ranks)
    with pytest.raises(hal.InvalidArgumentError, match="another device"):
        cb.all_reduce(ranks.channels[1], buf, buf, 1)
    other = make_ranks(2, fresh=True)
    with pytest.raises(hal.InvalidArgumentError, match="another device"):
        cb.all_reduce(other.channels[0], buf, buf, 1)
    other.channels[0].close()
    other.channels[0].close()
    mine = make_ranks(2, fresh=True)
    cb.end()
    cb = _recording(mine)
    mine.channels[0].close()
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        cb.all_reduce(mine.channels[0], mine.devices[0].allocator.allocate(16), buf, 1)
    assert cb.state is hal.CommandBufferState.RECORDING
    cb.end()


def test_a_buffer_without_dispatch_storage_usage_is_refused(make_ranks):
    ranks = make_ranks(2)
    buf = ranks.devices[0].allocator.allocate(16, usage=hal.BufferUsage.TRANSFER)
    cb = _recording(ranks)
    with pytest.raises(hal.FailedPreconditionError):
        cb.all_reduce(ranks.channels[0], buf, buf, 1)
    cb.end()


def test_slot_operands_are_checked_against_each_table_before_any_work(make_ranks):
    ranks = make_ranks(2)
    dev = ranks.devices[0]
    cb = dev.create_command_buffer(mode=Mode.REUSABLE, binding_capacity=2)
    with cb.record():
        cb.all_reduce(ranks.channels[0], Slot(0), Slot(1), 4)
    small, big = dev.allocator.allocate(8), dev.allocator.allocate(64)
    with pytest.raises(hal.OutOfRangeError):
        dev.queue_execute([cb], binding_tables=[[small, big]])
    with pytest.raises(hal.InvalidArgumentError, match="overlap"):
        dev.queue_execute([cb], binding_tables=[[(big, 0, 16), (big, 8, 16)]])
    with pytest.raises(hal.InvalidArgumentError, match="aligned"):
        dev.queue_execute([cb], binding_tables=[[(big, 2, 16), (big, 32, 16)]])


def test_creation_arguments_are_checked(make_ranks, device):
    devices = make_ranks.devices(2)
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channels([])
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channels([devices[0], devices[0]])
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channels("local-task")
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channels(devices, timeout=0)
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channels(devices, timeout="1")
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channel(object())
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channel(device, rank=2, count=2, id=b"x")
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channel(device, rank=0, count=0, id=b"x")
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channel(device, rank=True, count=1, id=b"x")
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channel(device, rank=0, count=1, id="text")
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_channel(device, rank=0, count=1, provider="smoke-signals")
    closed = make_ranks.devices(1)[0]
    closed.close()
    with pytest.raises(hal.FailedPreconditionError):
        hal.create_channel(closed, rank=0, count=1)
    with pytest.raises(hal.FailedPreconditionError):
        hal.create_channels([closed])


def test_recording_on_a_closed_device_is_refused(make_ranks):
    ranks = make_ranks(2, fresh=True)
    cb = _recording(ranks, 1)
    ranks.devices[1].close()
    with pytest.raises(hal.FailedPreconditionError):
        cb.all_reduce(ranks.channels[1], None, None, 1)


def test_channels_cannot_be_pickled(make_ranks):
    import pickle

    ranks = make_ranks(1)
    with pytest.raises(TypeError):
        pickle.dumps(ranks.channels[0])


# -- failures in flight (channels that compare operations and time out) -------------------------------------
def _skip_unless(shared_device: hal.Device, capability: str, what: str) -> None:
    if not getattr(getattr(shared_device, "collectives", None), capability, False):
        pytest.skip(f"the driver's channels do not {what}")


@pytest.fixture
def checking(make_ranks, shared_device):
    _skip_unless(shared_device, "checks_matching", "compare the ranks' operations")

    def make(n: int, timeout: float | None = WAIT_TIMEOUT) -> Ranks:
        ranks = make_ranks(n, timeout=timeout)
        assert ranks.channels[0].checks_matching
        return ranks

    return make


@pytest.fixture
def timing_out(make_ranks, shared_device):
    """``make_ranks``, for a driver whose channels time out and abort (``collectives.times_out``)."""
    _skip_unless(shared_device, "times_out", "time out nor abort")
    return make_ranks


def _failure_of(sem: hal.Semaphore) -> BaseException:
    with pytest.raises(hal.AbortedError) as info:
        sem.wait(1, timeout=WAIT_TIMEOUT)
    return info.value.__cause__ or info.value


def _assert_usable(ranks: Ranks) -> None:
    for device in ranks.devices:
        if device.closed:
            continue
        sem = device.create_semaphore(0)
        device.queue_barrier(signal=[(sem, 1)])
        sem.wait(1, timeout=WAIT_TIMEOUT)


_all_reduce = functools.partial(functools.partial, hal.CommandBuffer.all_reduce)


@pytest.mark.parametrize(("first", "second"), [
    (_all_reduce(count=4), _all_reduce(count=2)),
    (_all_reduce(count=2), _all_reduce(count=2, reduction="max")),
    (_all_reduce(count=2), _all_reduce(count=2, dtype="int32")),
    (_all_reduce(count=2), functools.partial(hal.CommandBuffer.all_gather, count=1)),
    (functools.partial(hal.CommandBuffer.broadcast, count=2, root=0),
     functools.partial(hal.CommandBuffer.broadcast, count=2, root=1)),
])
def test_mismatched_operations_fail_every_rank(checking, first, second):
    ranks = checking(2)
    bufs = ranks.buffers(32)
    outs = ranks.buffers(64)
    cbs = ranks.record(lambda cb, r, ch: (first if r == 0 else second)(cb, ch, bufs[r], outs[r]))
    for sem in ranks.submit(cbs):
        assert isinstance(_failure_of(sem), hal.CollectiveMismatchError)
    assert all(isinstance(c.failure, hal.CollectiveMismatchError) for c in ranks.channels)
    cb = _recording(ranks)
    with pytest.raises(hal.FailedPreconditionError, match="broke"):
        cb.all_reduce(ranks.channels[0], bufs[0], bufs[0], 1)
    _assert_usable(ranks)


@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_that_never_comes_times_out(timing_out, n):
    ranks = timing_out(n, timeout=0.3)
    bufs = ranks.buffers(16)
    cbs = ranks.record(lambda cb, r, ch: cb.all_reduce(ch, bufs[r], bufs[r], 4))
    started = time.monotonic()
    sems = ranks.submit(cbs, ranks=list(range(n - 1)))
    for sem in sems:
        assert isinstance(_failure_of(sem), hal.DeadlineExceededError)
    assert time.monotonic() - started < WAIT_TIMEOUT / 2
    late = ranks.submit(cbs, ranks=[n - 1])  # the group broke: the late rank fails at once
    assert isinstance(_failure_of(late[0]), hal.DeadlineExceededError)
    _assert_usable(ranks)
    fresh = timing_out(n)  # the devices make new channels
    assert fresh.channels[0].failure is None


def test_abort_from_another_thread_wakes_the_waiting_ranks(timing_out):
    ranks = timing_out(2, timeout=None)  # (no deadline: only the abort ends the wait)
    bufs = ranks.buffers(16)
    cbs = ranks.record(lambda cb, r, ch: cb.all_reduce(ch, bufs[r], bufs[r], 4))
    sems = ranks.submit(cbs, ranks=[0])
    threading.Timer(0.05, ranks.channels[1].abort).start()
    assert isinstance(_failure_of(sems[0]), hal.AbortedError)
    assert isinstance(ranks.channels[0].failure, hal.AbortedError)
    ranks.channels[1].abort()  # idempotent
    _assert_usable(ranks)


def test_closing_a_device_under_a_waiting_rank_fails_it_and_returns(timing_out):
    ranks = timing_out(2, timeout=None)
    bufs = ranks.buffers(16)
    cbs = ranks.record(lambda cb, r, ch: cb.all_reduce(ch, bufs[r], bufs[r], 4))
    sems = ranks.submit(cbs, ranks=[0])
    started = time.monotonic()
    ranks.devices[0].close()
    assert time.monotonic() - started < WAIT_TIMEOUT / 2
    assert isinstance(ranks.channels[1].failure, hal.FailedPreconditionError)
    with pytest.raises(hal.AbortedError):
        sems[0].wait(1, timeout=WAIT_TIMEOUT)


def test_channel_creation_times_out_when_ranks_are_missing(timing_out, make_ranks):
    devices = make_ranks.devices(2)
    started = time.monotonic()
    with pytest.raises(hal.DeadlineExceededError):
        hal.create_channel(devices[0], rank=0, count=2, id=hal.create_channel_id(devices[0]), timeout=0.2)
    assert time.monotonic() - started < WAIT_TIMEOUT / 2


# -- threads --------------------------------------------------------------------------------------------
def test_many_threads_record_and_submit_collectives(make_ranks):
    ranks = make_ranks(4)
    steps = 10
    bufs = ranks.buffers(16)
    errors: list = []

    def rank_main(r: int) -> None:
        try:
            dev, ch = ranks.devices[r], ranks.channels[r]
            for step in range(steps):
                dev.write(bufs[r], np.full(4, r + step, np.float32).tobytes())
                cb = dev.create_command_buffer()
                with cb.record():
                    cb.all_reduce(ch, bufs[r], bufs[r], 4)
                sem = dev.create_semaphore(0)
                dev.queue_execute([cb], signal=[(sem, 1)])
                sem.wait(1, timeout=WAIT_TIMEOUT)
                assert from_storage(dev.read(bufs[r]), "float32").tolist() == [6 + 4 * step] * 4
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_TIMEOUT * 2)
    assert errors == []
