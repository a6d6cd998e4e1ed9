"""The GPU drivers' collectives without a GPU: the simulated NCCL behind the GPU-generic channels, and
the NCCL (nccl4py) and RCCL (hip-python) adapters over stand-ins of their bindings."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from threads import in_threads

import hal
from hal.drivers.cuda import nccl
from hal.drivers.gpu import channel as gpu_channel
from hal.drivers.hip import rccl

from .fake_gpu import FakeGpuDriver, run_conformance

Mode = hal.CommandBufferMode


@pytest.fixture(params=["stream", "graph"])
def ranks(request):
    driver = FakeGpuDriver()
    devices = [driver.create_device(i, command_buffer=request.param) for i in range(2)]
    channels = hal.create_channels(devices)
    yield driver, devices, channels
    for channel in channels:
        channel.close()
    for device in devices:
        device.close()


def _reusable_all_reduces(devices, channels, bufs) -> list:
    """Per rank, a reusable command buffer of one in-place all-reduce of 4 float32 of its buffer."""
    cbs = []
    for d, ch, buf in zip(devices, channels, bufs):
        cb = d.create_command_buffer(mode=Mode.REUSABLE)
        with cb.record():
            cb.all_reduce(ch, buf, buf, 4)
        cbs.append(cb)
    return cbs


def _slot_all_reduces(devices, channels) -> list:
    """Per rank, a reusable command buffer of one in-place all-reduce of 4 float32 through slot 0."""
    cbs = []
    for d, ch in zip(devices, channels):
        cb = d.create_command_buffer(mode=Mode.REUSABLE, binding_capacity=1)
        with cb.record():
            cb.all_reduce(ch, hal.Slot(0), hal.Slot(0), 4)
        cbs.append(cb)
    return cbs


def _two_operands(devices) -> tuple[list, list]:
    """Per rank, two buffers of 4 float32: rank r's first holds r + 1, its second 10 (r + 1)."""
    a = [d.allocator.allocate(16) for d in devices]
    b = [d.allocator.allocate(16) for d in devices]
    for r, d in enumerate(devices):
        d.write(a[r], np.full(4, r + 1, np.float32).tobytes())
        d.write(b[r], np.full(4, 10 * (r + 1), np.float32).tobytes())
    return a, b


@contextlib.contextmanager
def _timed_ranks(timeout: float):
    """(driver, devices, channels): two ranks of the simulated GPU whose channels time out."""
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        yield driver, devices, hal.create_channels(devices, timeout=timeout)
    finally:
        for d in devices:
            d.close()


def _run(devices, cbs, tables=None):
    sems = []
    for i, (device, cb) in enumerate(zip(devices, cbs)):
        sem = device.create_semaphore(0)
        device.queue_execute([cb], signal=[(sem, 1)], binding_tables=None if tables is None else [tables[i]])
        sems.append(sem)
    for sem in sems:
        sem.wait(1, timeout=30)


def test_importing_hal_and_using_a_device_loads_no_collective_library():
    code = ("import sys, hal\nwith hal.create_device('local-sync') as d: pass\n"
            "import hal.drivers.cuda.device, hal.drivers.hip.device\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('nccl', 'mpi4py') or m.endswith('rccl')"
            " and not m.startswith('hal')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_create_channels_warms_connections_up_in_one_group(ranks):
    driver, _, _ = ranks
    warm_up = driver.nccl.groups[0]
    assert warm_up == ["all_reduce", "send", "recv", "all_reduce", "send", "recv"]
    assert driver.nccl.calls["ncclCommInitRank"] == 2  # (in one group, as ncclCommInitAll makes them)
    assert driver.nccl.calls["ncclCommGetAsyncError"] >= 2  # (non-blocking: polled until made)


def test_collectives_are_issued_on_blocking_communicators_split_from_the_channels(ranks):
    """NCCL enqueues a non-blocking communicator's group on a thread it starts for it: only the
    creation's warm-up goes that way, every issue after it through the blocking split."""
    driver, devices, channels = ranks
    for channel in channels:
        assert channel.comm.blocking and not channel.base.blocking
        assert channel.comm.family is channel.base.family  # (sharing its resources: NCCL's splitShare)
    assert driver.nccl.calls["non-blocking group"] == 1  # the warm-up
    bufs = [d.allocator.allocate(16) for d in devices]
    for d, b in zip(devices, bufs):
        d.write(b, np.ones(4, np.float32).tobytes())
    for _ in range(3):
        cbs = []
        for d, ch, b in zip(devices, channels, bufs):
            cb = d.create_command_buffer()
            with cb.record():
                cb.all_reduce(ch, b, b, 4)
                cb.send(ch, b, 1, 1 - ch.rank)
                cb.recv(ch, b, 1, 1 - ch.rank)
            cbs.append(cb)
        _run(devices, cbs)
    assert driver.nccl.calls["non-blocking group"] == 1
    assert [np.frombuffer(d.read(b), np.float32).tolist() for d, b in zip(devices, bufs)] == [[8.0] * 4] * 2


def test_a_rank_per_thread_warms_up_and_splits_off_its_blocking_communicator():
    """``create_channel`` of one rank (a process of a launcher; threads here) makes its connections
    with its peers before it returns, bounded by the timeout."""
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(3)]
    id = hal.create_channel_id(devices[0])
    made: dict = {}

    def rank(r):
        made[r] = hal.create_channel(devices[r], rank=r, count=3, id=id, timeout=10)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    try:
        assert sorted(made) == [0, 1, 2]
        assert all(made[r].comm.blocking and made[r].comm.count == 3 for r in range(3))
        warm_ups = [g for g in driver.nccl.groups if g[0] == "all_reduce"]
        assert len(warm_ups) == 3 and all(g.count("send") == 2 for g in warm_ups)
        assert driver.nccl.calls["non-blocking group"] == 3
    finally:
        for d in devices:
            d.close()


def test_a_peer_that_joins_but_never_warms_up_times_the_creation_out_and_everything_is_aborted():
    """A rank that made its communicator and went away: the warm-up's kernels wait on the GPU for
    it, so the creation waits no longer than its timeout, aborts the communicator (the kernels
    return) before it frees their buffers, and leaves the device usable."""
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        id = hal.create_channel_id(devices[0])
        driver.nccl.init_rank(2, id, 1)  # rank 1 joins, and nothing more
        started = time.monotonic()
        with pytest.raises(hal.DeadlineExceededError, match="first collectives"):
            hal.create_channel(devices[0], rank=0, count=2, id=id, timeout=0.5)
        assert time.monotonic() - started < 10
        assert driver.nccl.calls["ncclCommAbort"] == 1  # (the communicator; no blocking one was split yet)
        _assert_usable(devices[:1])
    finally:
        for d in devices:
            d.close()


def test_splits_share_their_parents_resources_and_abort():
    """A split communicator shares its parent's abort flag (NCCL's splitShare): aborting the split
    breaks the channel it was split from as well, and no communicator is freed twice."""
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(4)]
    try:
        channels = hal.create_channels(devices, timeout=10)
        halves = hal.split_channels(channels, [r // 2 for r in range(4)], [0] * 4)
        assert [(h.rank, h.count) for h in halves] == [(0, 2), (1, 2)] * 2
        assert all(h.comm.blocking and h.comm.family is c.base.family for h, c in zip(halves, channels))
        halves[0].abort()
        for channel in channels + halves:
            assert channel.failure is not None
            with pytest.raises(hal.HalError):
                channel.device.queue_execute([_all_reduce_cb(channel)], wait=[], signal=[])
        assert driver.nccl.calls["ncclCommAbort"] == 16  # (4 ranks x 2 channels x 2 communicators, once each)
        _assert_usable(devices)
    finally:
        for d in devices:
            d.close()


def test_a_split_that_fails_breaks_the_channels_it_shares_an_abort_with(monkeypatch):
    """The new communicators of a failed split are aborted, and with them (one abort flag) their
    parents: the parents' channels fail too, and the devices stay usable."""
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        channels = hal.create_channels(devices, timeout=10)
        ready = driver.nccl.ready

        def failing(comm):
            if comm.members is None and not comm.blocking:  # (a split's new communicator)
                raise hal.InternalError("ncclCommGetAsyncError: ncclRemoteError")
            return ready(comm)

        monkeypatch.setattr(driver.nccl, "ready", failing)
        with pytest.raises(hal.InternalError, match="ncclRemoteError"):
            hal.split_channels(channels, [0, 0], [0, 1])
        assert all(isinstance(c.failure, hal.InternalError) for c in channels)
        assert all(c.comm is None and c.base is None for c in channels)
        _assert_usable(devices)
    finally:
        for d in devices:
            d.close()


def test_under_rccls_rules_a_rank_whose_split_fails_does_not_leave_the_others_waiting(monkeypatch):
    """RCCL's splits are blocking calls, a thread a rank (``split_each``): when one rank's split fails,
    the others, waiting for it, are ended by breaking the parent channels, and the failure is raised
    at once rather than after the library's own wait (FakeRccl.WAIT)."""
    monkeypatch.setenv("HAL_FAKE_COLLECTIVES", "rccl")
    driver = FakeGpuDriver()
    assert not driver.nccl.grouped_splits
    devices = [driver.create_device(i) for i in range(3)]
    try:
        channels = hal.create_channels(devices, timeout=10)
        halves = hal.split_channels(channels, [r % 2 for r in range(3)], [0] * 3)  # (the threaded path)
        assert [c.count for c in halves] == [2, 1, 2]
        for c in halves:
            c.close()
        split = driver.nccl.split

        def failing(comm, color, key, blocking=False, max_blocks=None):
            if comm.rank == 1:
                raise hal.InternalError("ncclCommSplit: ncclSystemError")
            return split(comm, color, key, blocking, max_blocks)

        monkeypatch.setattr(driver.nccl, "split", failing)
        started = time.monotonic()
        with pytest.raises(hal.InternalError, match="ncclSystemError"):
            hal.split_channels(channels, [0, 0, 0], [0, 1, 2])
        assert time.monotonic() - started < driver.nccl.WAIT / 3
        assert all(isinstance(c.failure, hal.InternalError) for c in channels)
        _assert_usable(devices)
    finally:
        for d in devices:
            d.close()


def test_under_rccls_rules_creation_waits_no_longer_than_the_timeout_for_a_rank_that_never_joins(monkeypatch):
    """RCCL's init is a blocking call that returns once every rank joined, and before it returns there
    is no communicator to abort: it waits on a thread of its own, the creation raises
    DeadlineExceededError at the channel's timeout, and the communicator the call makes once the
    missing rank comes after all is aborted, not leaked."""
    monkeypatch.setenv("HAL_FAKE_COLLECTIVES", "rccl")
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        id = hal.create_channel_id(devices[0])
        started = time.monotonic()
        with pytest.raises(hal.DeadlineExceededError, match="did not join"):
            hal.create_channel(devices[0], rank=0, count=2, id=id, timeout=0.3)
        assert time.monotonic() - started < driver.nccl.WAIT / 10
        assert driver.nccl.calls.get("ncclCommAbort", 0) == 0
        driver.nccl.init_rank(2, id, 1)  # the missing rank, late: rank 0's call returns now
        deadline = time.monotonic() + 10
        while driver.nccl.calls.get("ncclCommAbort", 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert driver.nccl.calls.get("ncclCommAbort", 0) == 1  # rank 0's late communicator
        _assert_usable(devices)
    finally:
        for d in devices:
            d.close()


def test_under_rccls_rules_a_split_that_a_peer_never_makes_times_out(monkeypatch):
    """A blocking split waits in its call for every rank of the parent: a rank of another process that
    never splits ends the others' splits at the channel's timeout (DeadlineExceededError; the
    parents break, which ends the calls), not at the library's own wait."""
    monkeypatch.setenv("HAL_FAKE_COLLECTIVES", "rccl")
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        id = hal.create_channel_id(devices[0])
        made: dict = {}
        in_threads([lambda r=r: made.__setitem__(r, hal.create_channel(devices[r], rank=r, count=2, id=id,
                                                                       timeout=0.5)) for r in range(2)],
                   reraise=True)
        started = time.monotonic()
        with pytest.raises(hal.DeadlineExceededError, match="split"):
            made[0].split(0, 0)  # rank 1, "in another process", never splits
        assert time.monotonic() - started < driver.nccl.WAIT / 10
        assert made[0].failure is not None
        _assert_usable(devices)
    finally:
        for d in devices:
            d.close()


def _assert_usable(devices) -> None:
    """Each device still writes and reads its memory."""
    for d in devices:
        buf = d.allocator.allocate(8)
        d.write(buf, b"12345678")
        assert d.read(buf) == b"12345678"


def _all_reduce_cb(channel):
    buf = channel.device.allocator.allocate(16)
    cb = channel.device.create_command_buffer()
    with cb.record():
        cb.all_reduce(channel, buf, buf, 4)
    return cb


def test_symmetric_buffers_are_registered_windows_that_collectives_run_in(ranks):
    """``allocate_symmetric``: NCCL's memory registered as a window of the communicator the channel
    issues on, every rank in one group; collectives whose operands all lie in windows are NCCL's
    symmetric kind (in stream and graph command buffers); a release deregisters and frees once the
    work before it is done."""
    driver, devices, channels = ranks
    calls = driver.nccl.calls
    assert all(c.symmetric_memory for c in channels)
    sym = hal.allocate_symmetric(channels, 16)
    assert (calls["ncclMemAlloc"], calls["ncclCommWindowRegister"], calls["ncclGroupEnd"] >= 1) == (2, 2, True)
    assert all(c.comm.windows == {b.device_address: 16} for c, b in zip(channels, sym))
    plain = [d.allocator.allocate(16) for d in devices]
    for r, (d, b) in enumerate(zip(devices, sym)):
        d.write(b, np.full(4, r + 1, np.float32).tobytes())
    cbs = []
    for d, ch, b, p in zip(devices, channels, sym, plain):
        cb = d.create_command_buffer()
        with cb.record():
            cb.all_reduce(ch, b, b, 4)
            cb.execution_barrier()
            cb.all_reduce(ch, b, p, 4)  # (an ordinary recv: not the symmetric kind)
        cbs.append(cb)
    _run(devices, cbs)
    assert calls["symmetric all_reduce"] == 2 and calls["all_reduce"] >= 4
    assert [np.frombuffer(d.read(p), np.float32).tolist() for d, p in zip(devices, plain)] == [[6.0] * 4] * 2
    for b in sym:
        b.release()
    for d in devices:
        d.wait_idle()
    assert (calls["ncclCommWindowDeregister"], calls["ncclMemFree"]) == (2, 2)
    assert all(c.comm.windows == {} for c in channels)


@pytest.mark.parametrize("case", ["offsets", "one rank ordinary"])
def test_ranks_whose_symmetric_operands_lie_apart_fail(ranks, case):
    """NCCL's symmetric kernels find a peer's operand at the local operand's offset in its window,
    and registered buffers may not meet ordinary ones: ranks that differ in either fail with
    CollectiveMismatchError, found before the later rank's call is made (the earlier rank's is
    aborted with the channel), and the devices stay usable."""
    driver, devices, channels = ranks
    sym = hal.allocate_symmetric(channels, 64)
    plain = devices[1].allocator.allocate(64)
    operands = [(sym[0], 0, 16), (sym[1], 16, 16) if case == "offsets" else (plain, 16, 16)]
    cbs = _record_each(devices, lambda cb, r: cb.all_reduce(channels[r], operands[r], operands[r], 4))
    called = driver.nccl.calls.get("all_reduce", 0)
    sems = _submit_each(devices, cbs)
    for sem in sems:
        error = _failure(sem)
        assert isinstance(error, hal.CollectiveMismatchError) and "windows" in str(error), error
    # Rank 1's all-reduce was never called (a graph replays the captures made while recording: none).
    issued_first = 1 if devices[0].command_buffer_mode == "stream" else 0
    assert driver.nccl.calls.get("all_reduce", 0) == called + issued_first
    assert all(isinstance(c.failure, hal.CollectiveMismatchError) for c in channels)
    _assert_usable(devices)


def test_symmetric_operands_in_place_at_each_ranks_own_place_meet(ranks):
    """An in-place all-gather and reduce-scatter read or write each rank's own place of the shared
    operand, which lies elsewhere on every rank: the windows compared are the whole operand's. Kinds
    without symmetric kernels (a broadcast) are not compared."""
    driver, devices, channels = ranks
    sym = hal.allocate_symmetric(channels, 32)
    for r, (d, b) in enumerate(zip(devices, sym)):
        d.write(b, np.full(8, r + 1, np.float32).tobytes())
    cbs = _record_each(devices, lambda cb, r: (
        cb.reduce_scatter(channels[r], sym[r], (sym[r], 16 * r, 16), 4), cb.execution_barrier(),
        cb.all_gather(channels[r], (sym[r], 16 * r, 16), sym[r], 4)))
    for sem in _submit_each(devices, cbs):
        sem.wait(1, timeout=30)
    assert [np.frombuffer(d.read(b), np.float32).tolist() for d, b in zip(devices, sym)] == [[3.0] * 8] * 2
    assert driver.nccl.calls["symmetric reduce_scatter"] == 2 and driver.nccl.calls["symmetric all_gather"] == 2
    # A broadcast's root reads where the others pass no send operand at all: not compared.
    cbs = _record_each(devices, lambda cb, r: cb.broadcast(channels[r], (sym[r], 16, 16) if r == 0 else None,
                                                           (sym[r], 0, 16), 4, root=0))
    for sem in _submit_each(devices, cbs):
        sem.wait(1, timeout=30)
    assert [np.frombuffer(d.read(b, 0, 16), np.float32).tolist() for d, b in zip(devices, sym)] == [[3.0] * 4] * 2


def test_a_block_cap_reaches_both_communicators_of_the_split():
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        channels = hal.create_channels(devices, timeout=10)
        capped = hal.split_channels(channels, [0, 0], max_blocks=4)
        assert all((c.max_blocks, c.comm.max_blocks, c.base.max_blocks) == (4, 4, 4) for c in capped)
        assert all((c.comm.max_blocks, c.base.max_blocks) == (None, None) for c in channels)
    finally:
        for d in devices:
            d.close()


def test_a_rank_that_never_allocates_its_symmetric_buffer_times_out_and_breaks_the_channel():
    """Registration waits for every rank: bounded by the channel's timeout, after which the channel's
    ranks break (their communicators aborted, which ends the wait) and the memory is freed."""
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        channels = hal.create_channels(devices, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(hal.DeadlineExceededError, match="allocate_symmetric"):
            channels[0].allocate_symmetric(64)  # rank 1 never comes
        assert time.monotonic() - started < 10
        assert all(c.failure is not None for c in channels)
        assert driver.nccl.calls["ncclMemFree"] == 1
        with pytest.raises(hal.FailedPreconditionError, match="broke"):
            channels[1].allocate_symmetric(64)
        _assert_usable(devices)
    finally:
        for d in devices:
            d.close()


def test_ranks_allocating_different_symmetric_sizes_fail_every_rank():
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        channels = hal.create_channels(devices, timeout=10)
        results = in_threads([lambda: channels[0].allocate_symmetric(64), lambda: channels[1].allocate_symmetric(32)])
        assert all(isinstance(r, hal.InvalidArgumentError) and "64" in str(r) for r in results), results
        assert driver.nccl.calls["ncclMemFree"] == 2
        _assert_usable(devices)
    finally:
        for d in devices:
            d.close()


def test_under_rccls_rules_symmetric_buffers_are_ordinary_allocations(monkeypatch):
    monkeypatch.setenv("HAL_FAKE_COLLECTIVES", "rccl")
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(2)]
    try:
        channels = hal.create_channels(devices, timeout=10)
        assert not any(c.symmetric_memory for c in channels)
        bufs = hal.allocate_symmetric(channels, 32)
        assert [b.size for b in bufs] == [32, 32] and "ncclMemAlloc" not in driver.nccl.calls
    finally:
        for d in devices:
            d.close()


def test_collectives_of_one_level_are_one_group_a_barrier_starts_another(ranks):
    driver, devices, channels = ranks
    bufs = [d.allocator.allocate(64) for d in devices]
    for d, b in zip(devices, bufs):
        d.write(b, np.ones(16, np.float32).tobytes())
    cbs = []
    before = len(driver.nccl.groups)  # (graph command buffers capture when recorded)
    for r, (d, ch) in enumerate(zip(devices, channels)):
        cb = d.create_command_buffer()
        with cb.record():
            cb.all_reduce(ch, (bufs[r], 0, 16), (bufs[r], 0, 16), 4)
            cb.send(ch, (bufs[r], 16, 16), 4, 1 - r)
            cb.recv(ch, (bufs[r], 32, 16), 4, 1 - r)
            cb.execution_barrier()
            cb.broadcast(ch, (bufs[r], 0, 16), (bufs[r], 48, 16), 4, root=1)
        cbs.append(cb)
    _run(devices, cbs)
    assert driver.nccl.groups[before:] == [["all_reduce", "send", "recv"], ["broadcast"]] * 2
    for d, b in zip(devices, bufs):
        assert np.frombuffer(d.read(b), np.float32).tolist() == [2] * 4 + [1] * 8 + [2] * 4


def test_moved_bytes_go_as_uint8_and_reductions_keep_their_type(ranks):
    driver, devices, channels = ranks
    bufs = [d.allocator.allocate(64) for d in devices]
    calls = []
    original = driver.nccl._add

    def spy(stream, comm, op, send, recv):
        calls.append((op.kind, op.dtype, op.count))
        original(stream, comm, op, send, recv)

    driver.nccl._add = spy
    cbs = []
    for r, (d, ch) in enumerate(zip(devices, channels)):
        cb = d.create_command_buffer()
        with cb.record():
            cb.all_gather(ch, (bufs[r], 0, 8), (bufs[r], 16, 16), 4, "int16")
            cb.execution_barrier()
            cb.all_reduce(ch, (bufs[r], 32, 8), (bufs[r], 32, 8), 4, "bfloat16", "max")
        cbs.append(cb)
    _run(devices, cbs)
    assert calls == [("all_gather", "uint8", 8), ("all_reduce", "bfloat16", 4)] * 2


def test_graph_command_buffers_capture_once_and_recapture_a_rebound_slot(ranks):
    driver, devices, channels = ranks
    if devices[0].command_buffer_mode != "graph":
        pytest.skip("graph command buffers only")
    a, b = _two_operands(devices)
    cbs = _slot_all_reduces(devices, channels)
    before = len(driver.nccl.groups)
    _run(devices, cbs, [[a[0]], [a[1]]])
    assert len(driver.nccl.groups) - before == 2  # one capture per rank
    _run(devices, cbs, [[a[0]], [a[1]]])  # a table that comes back: an executable graph of its own
    captured = len(driver.nccl.groups)
    _run(devices, cbs, [[a[0]], [a[1]]])
    assert len(driver.nccl.groups) == captured  # replayed, not captured again
    _run(devices, cbs, [[b[0]], [b[1]]])
    assert len(driver.nccl.groups) == captured + 2  # a new operand: captured again on each rank
    assert [np.frombuffer(d.read(x), np.float32)[0] for d, x in zip(devices, a)] == [12, 12]
    assert [np.frombuffer(d.read(x), np.float32)[0] for d, x in zip(devices, b)] == [30, 30]


def test_a_lone_collective_of_a_stream_command_buffer_is_bound_once_and_resolved_per_table(ranks, monkeypatch):
    """A stream command buffer of one collective issues it through its library call with every
    argument bound at the first submission (no capture, no graph); through a binding-table slot the
    operands are resolved again for each new table."""
    driver, devices, channels = ranks
    if devices[0].command_buffer_mode != "stream":
        pytest.skip("stream command buffers only (a graph captures the call)")
    a, b = _two_operands(devices)
    fixed = _reusable_all_reduces(devices, channels, a)
    slotted = _slot_all_reduces(devices, channels)
    binds = []
    bound_steps = gpu_channel.bound_steps
    monkeypatch.setattr(gpu_channel, "bound_steps", lambda *args: binds.append(args[1]) or bound_steps(*args))
    calls = driver.nccl.calls.get("all_reduce", 0)
    api_calls = driver.api.calls
    captures, launches = api_calls.get("cuStreamBeginCapture", 0), api_calls.get("cuGraphLaunch", 0)
    executions = [d.prepare([cb]) for d, cb in zip(devices, fixed)]
    for value in (1, 2, 3):
        sems = [d.create_semaphore(0) for d in devices]
        for execution, sem in zip(executions, sems):
            execution.submit(signal=[(sem, value)])
        for sem in sems:
            sem.wait(value, timeout=30)
    for table in ([[b[0]], [b[1]]], [[a[0]], [a[1]]], [[b[0]], [b[1]]]):
        _run(devices, slotted, table)
    assert driver.nccl.calls.get("all_reduce", 0) - calls == 12  # a call per rank and submission
    assert len(binds) == 2 + 6  # a rank's fixed operands once; its slot's at each new table
    assert api_calls.get("cuStreamBeginCapture", 0) == captures  # nothing captured
    assert api_calls.get("cuGraphLaunch", 0) == launches  # nor any graph launched
    # a: 1 + 2 = 3, doubled twice (12), then once through the table (24); b: 10 + 20 = 30, then 60
    assert [np.frombuffer(d.read(x), np.float32).tolist() for d, x in zip(devices, a)] == [[24.0] * 4] * 2
    assert [np.frombuffer(d.read(x), np.float32).tolist() for d, x in zip(devices, b)] == [[60.0] * 4] * 2


def test_a_machine_without_nccl_says_what_to_install():
    driver = FakeGpuDriver(nccl=False)
    with driver.create_device(0) as dev, pytest.raises(hal.UnavailableError, match="simulated NCCL"):
        hal.create_channels([dev])


def test_channels_on_the_hip_conventions_too():
    driver = FakeGpuDriver("hip")
    devices = [driver.create_device(i) for i in range(2)]
    try:
        channels = hal.create_channels(devices)
        bufs = [d.allocator.allocate(16) for d in devices]
        for r, (d, buf) in enumerate(zip(devices, bufs)):
            d.write(buf, np.array([r, 1], np.int64).tobytes())
        cbs = []
        for d, ch, buf in zip(devices, channels, bufs):
            cb = d.create_command_buffer()
            with cb.record():
                cb.all_reduce(ch, (buf, 0, 8), (buf, 0, 8), 1, "int64")
            cbs.append(cb)
        _run(devices, cbs)
        assert [np.frombuffer(d.read(b), np.int64)[0] for d, b in zip(devices, bufs)] == [1, 1]
    finally:
        for d in devices:
            d.close()


def test_closing_a_channel_destroys_its_communicators_once(ranks):
    """The blocking communicator it issues on first, then the non-blocking one it was split from."""
    driver, _, channels = ranks
    comm, base = channels[0].comm, channels[0].base
    assert comm is not base and comm.blocking and not base.blocking
    channels[0].close()
    channels[0].close()
    assert driver.nccl.calls.get("ncclCommDestroy") == 2
    assert comm.destroyed and base.destroyed
    assert channels[0].comm is None and channels[0].base is None


def test_closing_channels_whose_reusable_buffers_live_destroys_their_graphs_first(ranks):
    """NCCL's destroy, like its abort, waits for every graph holding the communicator's captured
    work: a close destroys them first, and the command buffers fail after it instead of replaying."""
    driver, devices, channels = ranks
    bufs = [d.allocator.allocate(16) for d in devices]
    cbs = _reusable_all_reduces(devices, channels, bufs)
    _run(devices, cbs)
    for channel in channels:
        channel.close()
    assert "ncclCommDestroy with captured graphs alive" not in driver.nccl.calls
    assert driver.nccl.calls["ncclCommDestroy"] == 4
    sem = devices[0].create_semaphore(0)
    with contextlib.suppress(hal.FailedPreconditionError):
        devices[0].queue_execute([cbs[0]], signal=[(sem, 1)])
        with pytest.raises(hal.HalError, match="closed|gone"):
            sem.wait(1, timeout=30)


def test_a_reusable_buffer_on_a_broken_channel_fails_its_submissions_without_replaying(ranks):
    """An aborted communicator is freed: a graph that captured its kernels must never run again."""
    driver, devices, channels = ranks
    bufs = [d.allocator.allocate(16) for d in devices]
    for d, buf in zip(devices, bufs):
        d.write(buf, np.ones(4, np.float32).tobytes())
    cbs = _reusable_all_reduces(devices, channels, bufs)
    executions = [d.prepare([cb]) for d, cb in zip(devices, cbs)]
    _run(devices, cbs)
    channels[0].abort()  # a process's ranks break together
    assert all(isinstance(c.failure, hal.AbortedError) for c in channels)
    assert all(c.comm is None for c in channels)
    calls = dict(driver.nccl.calls)
    for d, execution in zip(devices, executions):
        sem = d.create_semaphore(0)
        execution.submit(signal=[(sem, 1)])
        with pytest.raises(hal.AbortedError) as info:
            sem.wait(1, timeout=30)
        assert isinstance(info.value.__cause__, hal.AbortedError)
        assert "aborted" in str(info.value.__cause__)
    assert driver.nccl.calls == calls  # nothing issued on the aborted communicators
    # A graph command buffer's graphs held the captured collectives: they were destroyed before the
    # aborts (NCCL's abort waits for them), so none met a live one.
    assert "ncclCommAbort with captured graphs alive" not in calls
    for d, buf in zip(devices, bufs):
        assert np.frombuffer(d.read(buf), np.float32).tolist() == [2.0] * 4  # the device is usable
    assert driver.nccl.calls.get("ncclCommAbort") == 4  # (each rank's two communicators)


def test_work_in_flight_past_the_timeout_is_aborted_and_the_watch_list_stays_short():
    with _timed_ranks(0.3) as (driver, devices, channels):
        bufs = [d.allocator.allocate(16) for d in devices]
        cbs = _reusable_all_reduces(devices, channels, bufs)
        for _ in range(50):  # completed work is dropped from the watch as more is issued
            _run(devices, cbs)
        assert all(len(c.inflight) <= 2 for c in channels)
        sem = devices[0].create_semaphore(0)
        devices[0].queue_execute([cbs[0]], signal=[(sem, 1)])  # rank 1 never comes
        with pytest.raises(hal.AbortedError) as info:
            sem.wait(1, timeout=30)
        assert isinstance(info.value.__cause__, hal.DeadlineExceededError)
        assert isinstance(channels[1].failure, hal.DeadlineExceededError)
        assert "ncclCommAbort with captured graphs alive" not in driver.nccl.calls
        later = devices[0].create_semaphore(0)
        devices[0].queue_barrier(signal=[(later, 1)])
        later.wait(1, timeout=30)


def test_aborts_racing_from_threads_abort_each_communicator_once(ranks):
    driver, devices, channels = ranks
    bufs = [d.allocator.allocate(16) for d in devices]
    cbs = _reusable_all_reduces(devices, channels, bufs)
    sem = devices[0].create_semaphore(0)
    devices[0].queue_execute([cbs[0]], signal=[(sem, 1)])  # waits for rank 1, which never comes
    threads = [threading.Thread(target=channels[i % 2].abort) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    with pytest.raises(hal.AbortedError):
        sem.wait(1, timeout=30)
    assert driver.nccl.calls.get("ncclCommAbort") == 4  # (each rank's two communicators, once)
    assert "ncclCommAbort with captured graphs alive" not in driver.nccl.calls  # (destroyed first)
    for channel in channels:
        channel.close()  # (after a break: nothing left to destroy)
    assert driver.nccl.calls.get("ncclCommDestroy") is None


def test_work_that_completes_within_a_short_timeout_never_breaks_the_channel():
    with _timed_ranks(0.05) as (_, devices, channels):
        bufs = [d.allocator.allocate(16) for d in devices]
        cbs = _reusable_all_reduces(devices, channels, bufs)
        for _ in range(20):
            _run(devices, cbs)
        time.sleep(0.2)  # past every deadline: the watchdog finds the work complete
        assert all(c.failure is None for c in channels)


# -- the NCCL adapter over a stand-in of nccl.bindings.nccl -----------------------------------------
class NCCLError(Exception):
    def __init__(self, status):
        super().__init__(f"status {status}")
        self.status = status


def _bindings(log, statuses=None):
    statuses = [] if statuses is None else statuses

    def record(name, result=None):
        def call(*args):
            log.append((name, args))
            return result
        return call

    def failing(*args):
        raise NCCLError(4)

    class Config:
        configs = 0

        def __init__(self):
            self.blocking = 1
            self.split_share = 0
            self.max_ctas = self.cga_cluster_size = -(1 << 31)  # (NCCL's "undefined")
            self.ptr = 0xC0F + Config.configs
            Config.configs += 1

    return SimpleNamespace(
        get_version=lambda: 22809, get_unique_id=lambda: bytes(range(128)),
        comm_init_rank_config=record("init", "comm"), Config=Config, get_error_string=lambda status: f"error {status}",
        comm_get_async_error=lambda comm: statuses.pop(0) if statuses else 0, comm_finalize=record("finalize"),
        comm_split=record("split", 0), comm_count=lambda c: 2,
        comm_user_rank=lambda c: 1, group_start=record("group_start"), group_end=record("group_end"),
        comm_destroy=record("destroy"), comm_abort=record("abort"), all_reduce=record("all_reduce"),
        reduce_scatter=failing, reduce=record("reduce"), all_gather=record("all_gather"),
        broadcast=record("broadcast"), send=record("send"), recv=record("recv"),
        mem_alloc=record("mem_alloc", 0x7000), mem_free=record("mem_free"),
        comm_window_register=record("window_register", "window"), comm_window_deregister=record("window_deregister"),
        UniqueId=SimpleNamespace(from_buffer=lambda b: ("uid", bytes(b))))


class Stream:
    def __int__(self):
        return 0xABC


def test_the_nccl_adapter_passes_nccl_codes_and_stream_handles():
    log: list = []
    lib = nccl.Nccl(_bindings(log))
    assert lib.name == "NCCL 2.28.9"
    assert lib.new_id() == bytes(range(128))
    assert lib.init_rank(2, bytes(128), 1) == "comm"
    assert log[-1] == ("init", (2, ("uid", bytes(128)), 1, 0xC0F))  # non-blocking config, sharing with splits
    assert (lib._config.blocking, lib._config.split_share) == (0, 1)
    with pytest.raises(hal.InvalidArgumentError, match="128 bytes"):
        lib.init_rank(2, b"short", 1)
    lib.all_reduce(1, 2, 3, "bfloat16", "avg", "comm", Stream())
    assert log[-1] == ("all_reduce", (1, 2, 3, 9, 4, "comm", 0xABC))
    lib.send(5, 6, "uint8", 1, "comm", Stream())
    assert log[-1] == ("send", (5, 6, 1, 1, "comm", 0xABC))
    assert lib.split("comm", None, 0) is None
    assert log[-1] == ("split", ("comm", -1, 0, 0xC0F))
    lib.split("comm", 0, 1, blocking=True)
    assert log[-1] == ("split", ("comm", 0, 1, 0xC10)) and lib.config(True, None).blocking == 1
    lib.split("comm", 0, 1, blocking=True, max_blocks=4)  # a block cap: maxCTAs, clusters of one
    capped = lib.config(True, 4)
    assert log[-1] == ("split", ("comm", 0, 1, capped.ptr)) and capped.ptr not in (0xC0F, 0xC10)
    assert (capped.blocking, capped.max_ctas, capped.cga_cluster_size) == (1, 4, 1)
    assert lib.config(False, None).max_ctas < 0  # (uncapped: NCCL's default)
    assert lib.symmetric  # NCCL 2.28: symmetric memory windows
    assert lib.mem_alloc(64) == 0x7000
    assert lib.window_register("comm", 0x7000, 64) == "window"
    assert log[-1] == ("window_register", ("comm", 0x7000, 64, 1))  # NCCL_WIN_COLL_SYMMETRIC
    lib.window_deregister("comm", "window")
    lib.mem_free(0x7000)
    assert [name for name, _ in log[-3:]] == ["window_register", "window_deregister", "mem_free"]
    older = _bindings([])
    older.get_version = lambda: 22605
    assert not nccl.Nccl(older).symmetric
    assert lib.comm_rank("comm") == (1, 2)
    with pytest.raises(hal.InvalidArgumentError, match="ncclReduceScatter"):
        lib.reduce_scatter(1, 2, 3, "float32", "sum", "comm", Stream())
    assert isinstance(nccl.nccl_error("x", NCCLError(8)), hal.DeadlineExceededError)


def test_the_nccl_adapter_polls_non_blocking_communicators():
    log: list = []
    statuses = [7, 0, 7, 0]  # ncclInProgress, ncclSuccess, then the finalize: in progress, done
    lib = nccl.Nccl(_bindings(log, statuses))
    assert lib.ready("comm") is False
    assert lib.ready("comm") is True
    lib.destroy("comm")  # finalize, polled until done, then destroy
    assert [name for name, _ in log] == ["finalize", "destroy"]
    statuses[:] = [3]
    with pytest.raises(hal.InternalError, match="ncclCommGetAsyncError"):
        lib.ready("comm")
    assert isinstance(nccl.nccl_error("x", NCCLError(1)), hal.InternalError)
    assert isinstance(nccl.nccl_error("x", RuntimeError("?")), hal.InternalError)


def test_without_nccl4py_cuda_channels_are_unavailable_with_the_install_hint(monkeypatch):
    monkeypatch.setattr(nccl, "_library", None)
    monkeypatch.setitem(sys.modules, "nccl", None)
    monkeypatch.setitem(sys.modules, "nccl.bindings", None)
    with pytest.raises(hal.UnavailableError, match=r"nccl4py.*\[nccl\]"):
        nccl.load()


def test_without_rccl_hip_channels_are_unavailable(monkeypatch):
    monkeypatch.setattr(rccl, "_library", None)
    monkeypatch.setitem(sys.modules, "hip.rccl", None)
    with pytest.raises(hal.UnavailableError, match="RCCL"):
        rccl.load()


def test_the_rccl_adapter_checks_hip_python_results():
    class Enum(int):
        pass

    log: list = []

    def ok(name, *values):
        def call(*args):
            log.append((name, args))
            return (Enum(0), *values)
        return call

    bindings = SimpleNamespace(
        ncclGetVersion=ok("version", 22203), ncclAllReduce=ok("all_reduce"), ncclGroupStart=ok("group_start"),
        ncclDataType_t=lambda v: ("dtype", v), ncclRedOp_t=lambda v: ("op", v),
        ncclSend=lambda *a: (Enum(5),))
    lib = rccl.Rccl(bindings)
    assert lib.name == "RCCL 2.22.3"
    lib.all_reduce(1, 2, 3, "float32", "max", "comm", "stream")
    assert log[-1] == ("all_reduce", (1, 2, 3, ("dtype", 7), ("op", 2), "comm", "stream"))
    with pytest.raises(hal.InvalidArgumentError, match="ncclSend"):
        lib.send(1, 2, "uint8", 0, "comm", "stream")
    bindings.ncclGroupEnd = lambda: (Enum(7),)  # ncclInProgress: under way, not a failure
    lib.group_end()
    states = [7, 0, 3]

    def get_async_error(comm, result):  # (hip-python: the result goes into the caller's memory)
        result.value = states.pop(0)
        return (Enum(0),)

    bindings.ncclCommGetAsyncError = get_async_error
    assert lib.ready("comm") is False
    assert lib.ready("comm") is True
    with pytest.raises(hal.InternalError, match="ncclCommGetAsyncError"):
        lib.ready("comm")


def test_rccl_splits_are_made_within_their_call():
    """hip-python returns a split's communicator only when the call made it: a split that reports
    none for a rank with a color is an error, not a rank left out."""
    made = []
    bindings = SimpleNamespace(ncclGetVersion=lambda: (0, 22803),
                               ncclCommSplit=lambda comm, color, key, config: (0, made.pop(0) if made else None))
    lib = rccl.Rccl(bindings)
    assert (lib.nonblocking, lib.grouped_splits) == (False, False)
    made.append("new")
    assert lib.split("comm", 0, 1) == "new"
    assert lib.split("comm", None, 0) is None  # (no color: no communicator for this rank)
    with pytest.raises(hal.InternalError, match="no communicator"):
        lib.split("comm", 0, 1)


class _RcclWithoutLibrary:
    """hip-python's real RCCL bindings, but for the version (librccl is not loadable here): every other
    call converts its arguments by the binding's signature, then fails to open librccl."""

    def __init__(self, module) -> None:
        self.module = module

    def __getattr__(self, name):
        return getattr(self.module, name)

    @staticmethod
    def ncclGetVersion():
        return (0, 22803)


def test_the_rccl_adapter_calls_hip_pythons_bindings_by_their_signatures():
    """Each call the adapter makes passes hip-python's own argument checks (a wrong count or type
    would be a TypeError before the library is opened): without librccl every call ends in the
    library's absence, reported as a HAL error naming the call."""
    module = pytest.importorskip("rocm.bindings.rccl", reason="hip-python's RCCL bindings (hip-python[systems])")
    try:
        module.ncclGetVersion()
        pytest.skip("librccl is loadable here: the calls below would reach RCCL")
    except RuntimeError:
        pass
    lib = rccl.Rccl(_RcclWithoutLibrary(module))
    assert lib.name == "RCCL 2.28.3"
    calls = {
        "ncclGetUniqueId": lambda: lib.new_id(),
        "ncclCommInitRank": lambda: lib.init_rank(2, bytes(128), 1),
        "ncclCommGetAsyncError": lambda: lib.ready(None),
        "ncclCommSplit": lambda: lib.split(None, 0, 1),
        "ncclCommUserRank": lambda: lib.comm_rank(None),
        "ncclGroupStart": lib.group_start, "ncclGroupEnd": lib.group_end,
        "ncclCommDestroy": lambda: lib.destroy(None), "ncclCommAbort": lambda: lib.abort(None),
        "ncclAllReduce": lambda: lib.all_reduce(1, 2, 3, "bfloat16", "avg", None, 0),
        "ncclReduceScatter": lambda: lib.reduce_scatter(1, 2, 3, "float32", "sum", None, 0),
        "ncclReduce": lambda: lib.reduce(1, 2, 3, "int64", "min", 1, None, 0),
        "ncclAllGather": lambda: lib.all_gather(1, 2, 3, "uint8", None, 0),
        "ncclBroadcast": lambda: lib.broadcast(1, 2, 3, "float16", 0, None, 0),
        "ncclSend": lambda: lib.send(1, 3, "uint8", 1, None, 0),
        "ncclRecv": lambda: lib.recv(1, 3, "uint8", 1, None, 0),
    }
    for name, call in calls.items():
        with pytest.raises(hal.HalError, match=name) as info:
            call()
        assert "dlopen" in str(info.value), (name, info.value)
    with pytest.raises(hal.InvalidArgumentError, match="128 bytes"):
        lib.init_rank(2, bytes(64), 0)


def test_the_collective_suite_with_rccls_split_rules():
    """The collective conformance suite over a simulated library with RCCL's rules (``FakeRccl``:
    blocking communicators, each split a call of its own that waits for the other ranks, refused in
    a group), in both command-buffer modes: the channels split a rank per thread."""
    for mode in ("stream", "graph"):
        proc = run_conformance(["tests/cts/test_collectives.py"], [f"command_buffer={mode}"],
                               {"HAL_FAKE_COLLECTIVES": "rccl"})
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_a_channels_second_collective_of_a_level_starts_a_new_group():
    """NCCL may run one group's operations concurrently: a collective that may read what the one
    before it on the same channel wrote goes into the next group; sends and receives stay together."""
    from types import SimpleNamespace

    from hal.drivers.gpu.channel import batches

    a, b = object(), object()

    def part(channel, kind):
        return (channel, SimpleNamespace(kind=kind), None, None)

    parts = [part(a, "all_reduce"), part(b, "all_reduce"), part(a, "send"), part(a, "recv"), part(a, "all_reduce"),
             part(a, "broadcast"), part(b, "send")]
    kinds = [[(p[0] is a, p[1].kind) for p in batch] for batch in batches(parts)]
    assert kinds == [[(True, "all_reduce"), (False, "all_reduce"), (True, "send"), (True, "recv")],
                     [(True, "all_reduce")], [(True, "broadcast"), (False, "send")]]


# -- operations compared where this process drives every rank ------------------------------------------
def _failure(sem: hal.Semaphore) -> BaseException:
    with pytest.raises(hal.AbortedError) as info:
        sem.wait(1, timeout=30)
    return info.value.__cause__ or info.value


def _record_each(devices, record_rank) -> list:
    """Each rank's one-shot command buffer (``record_rank(cb, rank)``)."""
    cbs = []
    for r, d in enumerate(devices):
        cb = d.create_command_buffer()
        with cb.record():
            record_rank(cb, r)
        cbs.append(cb)
    return cbs


def _submit_each(devices, cbs) -> list:
    """The command buffers submitted in rank order; the semaphores."""
    sems = []
    for d, cb in zip(devices, cbs):
        sem = d.create_semaphore(0)
        d.queue_execute([cb], signal=[(sem, 1)])
        sems.append(sem)
    return sems


def test_mismatched_sends_and_recvs_fail_both_ranks_unissued(ranks):
    """The k-th send from a to b meets b's k-th recv from a: a recv of another length is a mismatch,
    found before the later rank's call is made (NCCL would wait or move the wrong bytes)."""
    driver, devices, channels = ranks
    assert all(c.checks_matching for c in channels)
    bufs = [d.allocator.allocate(64) for d in devices]
    cbs = _record_each(devices, lambda cb, r: cb.send(channels[0], bufs[0], 4, peer=1) if r == 0
                       else cb.recv(channels[1], bufs[1], 2, peer=0))
    calls = driver.nccl.calls.get("recv", 0)  # (a graph command buffer captured it while recording)
    sems = _submit_each(devices, cbs)
    for sem in sems:
        assert isinstance(_failure(sem), hal.CollectiveMismatchError)
    assert driver.nccl.calls.get("recv", 0) == calls  # the mismatched recv was never called
    assert all(isinstance(c.failure, hal.CollectiveMismatchError) for c in channels)
    _assert_usable(devices)


def test_matching_operations_run_in_any_issue_order_across_submissions(ranks):
    """Meetings count per kind: rank 1 issuing its two all-reduces before rank 0 issues any, and the
    sends of a ring, all meet their peers' (no false mismatch)."""
    driver, devices, channels = ranks
    bufs = [d.allocator.allocate(64) for d in devices]
    for d, b in zip(devices, bufs):
        d.write(b, np.ones(16, np.float32).tobytes())
    sems = []
    for r in (1, 0):
        for _ in range(2):
            cb = devices[r].create_command_buffer()
            with cb.record():
                cb.all_reduce(channels[r], bufs[r], bufs[r], 4)
                cb.send(channels[r], bufs[r], 2, peer=1 - r)
                cb.recv(channels[r], (bufs[r], 32, 8), 2, peer=1 - r)
            sem = devices[r].create_semaphore(0)
            devices[r].queue_execute([cb], signal=[(sem, 1)])
            sems.append(sem)
    for sem in sems:
        sem.wait(1, timeout=30)
    assert all(c.failure is None for c in channels)


def test_only_communicators_wholly_in_this_process_compare_operations():
    """A rank whose peers are elsewhere cannot compare (NCCL cannot tell): ``checks_matching`` is
    False there; splits of channels this process drives entirely compare within each color."""
    driver = FakeGpuDriver()
    devices = [driver.create_device(i) for i in range(4)]
    try:
        id = hal.create_channel_id(devices[0])
        made: dict = {}
        threads = [threading.Thread(target=lambda r=r: made.__setitem__(r, hal.create_channel(
            devices[r], rank=r, count=2, id=id, timeout=10))) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not made[0].checks_matching and not made[1].checks_matching
        for channel in made.values():
            channel.close()
        channels = hal.create_channels(devices, timeout=10)
        halves = hal.split_channels(channels, [r % 2 for r in range(4)], [0] * 4)
        assert all(h.checks_matching for h in halves)
        bufs = [d.allocator.allocate(64) for d in devices]
        # color 0 (devices 0 and 2) agrees; color 1 (devices 1 and 3) does not
        sems = _submit_each(devices, _record_each(
            devices, lambda cb, r: cb.all_reduce(halves[r], bufs[r], bufs[r], 4 if r != 3 else 2)))
        for r in (1, 3):
            assert isinstance(_failure(sems[r]), hal.CollectiveMismatchError)
        # (the splits share their parents' abort, as NCCL's splitShare makes them: the whole family breaks)
        assert all(isinstance(c.failure, hal.CollectiveMismatchError) for c in channels + halves)
    finally:
        for d in devices:
            d.close()


# -- ranks in other processes, compared with HAL_COLLECTIVE_CHECKS=1 ------------------------------------

@pytest.fixture(params=["stream", "graph"])
def apart(request, monkeypatch):
    """Two ranks made as processes of a launcher make theirs (``create_channel``, a thread each),
    with HAL_COLLECTIVE_CHECKS=1: (driver, devices, channels)."""
    monkeypatch.setenv("HAL_COLLECTIVE_CHECKS", "1")
    driver = FakeGpuDriver()
    devices = [driver.create_device(i, command_buffer=request.param) for i in range(2)]
    id = hal.create_channel_id(devices[0])
    made: dict = {}
    _in_threads(lambda r: made.__setitem__(r, hal.create_channel(devices[r], rank=r, count=2, id=id, timeout=2)))
    channels = [made[0], made[1]]
    yield driver, devices, channels
    for channel in channels:
        channel.close()
    for device in devices:
        device.close()


def _in_threads(work) -> None:
    """``work(rank)`` for ranks 0 and 1 at once, a thread each (as processes would)."""
    in_threads([lambda: work(0), lambda: work(1)], reraise=True)


def test_checks_compare_the_collectives_of_ranks_in_other_processes(apart):
    """Each submission's collectives are compared with the other ranks' before they are issued: equal
    ones run; an all-reduce of another length fails both ranks' submissions, the all-reduces never
    called, where NCCL would reduce the wrong bytes or wait for ever."""
    driver, devices, channels = apart
    assert all(c.checks_matching for c in channels)
    bufs = [d.allocator.allocate(64) for d in devices]
    for r, (d, b) in enumerate(zip(devices, bufs)):
        d.write(b, np.full(16, r + 1, np.float32).tobytes())
    sems = [d.create_semaphore(0) for d in devices]

    def submit(counts):
        cbs = _record_each(devices, lambda cb, r: cb.all_reduce(channels[r], bufs[r], bufs[r], counts[r]))
        calls = driver.nccl.calls.get("all_reduce", 0)  # (a graph command buffer captured them while recording)
        _in_threads(lambda r: devices[r].queue_execute([cbs[r]], signal=[(sems[r], 1)]))
        return calls

    submit([4, 4])
    for r in (0, 1):
        sems[r].wait(1, timeout=30)
        assert np.frombuffer(devices[r].read(bufs[r]), np.float32)[:4].tolist() == [3.0] * 4
    sems = [d.create_semaphore(0) for d in devices]
    reduces = submit([4, 2])
    for r in (0, 1):
        error = _failure(sems[r])
        assert isinstance(error, hal.CollectiveMismatchError), error
        assert "HAL_COLLECTIVE_CHECKS" in str(error)
        assert str(error).startswith(f"INVALID_ARGUMENT: rank {1 - r} submitted other collectives than rank {r}")
    assert driver.nccl.calls.get("all_reduce", 0) == reduces, "the mismatched all-reduces were never called"
    assert all(isinstance(c.failure, hal.CollectiveMismatchError) for c in channels)
    _assert_usable(devices)


def test_checks_time_out_where_a_peer_never_compares(apart):
    """A rank whose peer never submits: its comparison ends at the channel's timeout, its submission
    fails with DeadlineExceededError, and the device stays usable."""
    driver, devices, channels = apart
    buf = devices[0].allocator.allocate(64)
    cb = devices[0].create_command_buffer()
    with cb.record():
        cb.all_reduce(channels[0], buf, buf, 4)
    sem = devices[0].create_semaphore(0)
    devices[0].queue_execute([cb], signal=[(sem, 1)])
    assert isinstance(_failure(sem), hal.DeadlineExceededError)
    assert isinstance(channels[0].failure, hal.DeadlineExceededError)
    _assert_usable(devices)


def test_checks_leave_sends_and_receives_alone(apart):
    """A send pairs with the other rank's receive: a submission of nothing else exchanges nothing."""
    driver, devices, channels = apart
    bufs = [d.allocator.allocate(64) for d in devices]
    devices[0].write(bufs[0], np.arange(16, dtype=np.float32).tobytes())
    gathers = driver.nccl.calls.get("all_gather", 0)
    sems = [d.create_semaphore(0) for d in devices]
    cbs = _record_each(devices, lambda cb, r: cb.send(channels[0], bufs[0], 4, peer=1) if r == 0
                       else cb.recv(channels[1], bufs[1], 4, peer=0))
    _in_threads(lambda r: devices[r].queue_execute([cbs[r]], signal=[(sems[r], 1)]))
    for r in (0, 1):
        sems[r].wait(1, timeout=30)
    assert np.frombuffer(devices[1].read(bufs[1]), np.float32)[:4].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert driver.nccl.calls.get("all_gather", 0) == gathers


def test_a_bad_checks_switch_is_refused_before_a_communicator_is_made(monkeypatch):
    monkeypatch.setenv("HAL_COLLECTIVE_CHECKS", "fasle")
    driver = FakeGpuDriver()
    device = driver.create_device(0)
    try:
        inits = driver.nccl.calls.get("ncclCommInitRank", 0)
        with pytest.raises(hal.InvalidArgumentError, match="HAL_COLLECTIVE_CHECKS='fasle' is not a switch"):
            hal.create_channel(device, rank=0, count=2, id=hal.create_channel_id(device), timeout=1)
        assert driver.nccl.calls.get("ncclCommInitRank", 0) == inits
    finally:
        device.close()
