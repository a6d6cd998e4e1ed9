"""Where channels get their rank, count and id: the launchers' environments, the TCP id exchange, MPI."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from threads import in_threads

import hal
from hal import channel_provider
from hal.channel_provider import EnvironmentProvider, LaunchEnvironment, MpiProvider, launch_environment, resolve


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("environ", "expected"), [
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0",
      "MASTER_PORT": "29500"}, ("torchrun", 1, 4, 1, 2, "node0", 29500)),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, ("openmpi", 3, 8, 1, 4, None, None)),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
     ("mpich", 0, 2, 0, 2, None, None)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2(x3)"},
     ("slurm", 5, 6, 1, 2, None, None)),
    ({"RANK": "0", "WORLD_SIZE": "1"}, ("torchrun", 0, 1, 0, 1, None, None)),
])
def test_launch_environments(environ, expected):
    env = launch_environment(environ)
    assert (env.launcher, env.rank, env.count, env.local_rank, env.local_count, env.master_addr,
            env.master_port) == expected


def test_no_launcher_and_malformed_variables():
    assert launch_environment({}) is None
    assert resolve("auto", {}) is None
    with pytest.raises(hal.InvalidArgumentError, match="RANK"):
        launch_environment({"RANK": "two", "WORLD_SIZE": "4"})
    with pytest.raises(hal.InvalidArgumentError, match="not a rank"):
        launch_environment({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(hal.InvalidArgumentError, match="no launcher"):
        resolve("env", {})
    with pytest.raises(hal.InvalidArgumentError):
        resolve("carrier-pigeon", {})
    with pytest.raises(hal.InvalidArgumentError):
        resolve(42, {})


def test_the_port_comes_from_hal_channel_port_or_next_to_the_master_port():
    env = launch_environment({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29500"})
    assert EnvironmentProvider(env, environ={}).port == 29501
    assert EnvironmentProvider(env, environ={"HAL_CHANNEL_PORT": "4242"}).port == 4242
    no_port = EnvironmentProvider(launch_environment({"RANK": "0", "WORLD_SIZE": "2"}), environ={})
    with pytest.raises(hal.InvalidArgumentError, match="MASTER_PORT"):
        no_port.share_id(lambda: b"id", 1.0)
    alone = EnvironmentProvider(launch_environment({"RANK": "0", "WORLD_SIZE": "1"}), environ={})
    assert alone.share_id(lambda: b"only", 1.0) == b"only"


def test_a_port_outside_tcps_range_is_refused_when_the_provider_is_made():
    """MASTER_PORT=70000 (or 65535, whose next port is the channel's) ended in socket's untyped
    OverflowError at the rank-0 bind."""
    for master, source in (("70000", "MASTER_PORT"), ("65535", "MASTER_PORT"), ("-3", "MASTER_PORT")):
        env = launch_environment({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": master})
        with pytest.raises(hal.InvalidArgumentError, match=source):
            EnvironmentProvider(env, environ={})
    env = launch_environment({"RANK": "0", "WORLD_SIZE": "2"})
    for value in ("0", "65536"):
        with pytest.raises(hal.InvalidArgumentError, match="HAL_CHANNEL_PORT"):
            EnvironmentProvider(env, environ={"HAL_CHANNEL_PORT": value})
    for port in (True, 2.5, 0, 1 << 16):
        with pytest.raises(hal.InvalidArgumentError, match="port argument"):
            EnvironmentProvider(env, port=port, environ={})
    assert EnvironmentProvider(env, environ={"HAL_CHANNEL_PORT": "65535"}).port == 65535


def _providers(count: int, port: int) -> list[EnvironmentProvider]:
    return [EnvironmentProvider(LaunchEnvironment("test", rank, count, rank, count, "127.0.0.1", None), port=port)
            for rank in range(count)]


def test_rank_0_serves_the_id_to_every_rank_one_exchange_after_another():
    providers = _providers(4, free_port())
    for exchange in range(3):
        ids = in_threads([lambda p=p, e=exchange: p.share_id(lambda: f"id-{e}".encode(), 10.0) for p in providers])
        assert ids == [f"id-{exchange}".encode()] * 4


def test_ranks_starting_before_rank_0_wait_for_it():
    providers = _providers(3, free_port())

    def late_rank_0():
        time.sleep(0.3)
        return providers[0].share_id(lambda: b"late", 10.0)

    ids = in_threads([late_rank_0, lambda: providers[1].share_id(lambda: b"x", 10.0),
                       lambda: providers[2].share_id(lambda: b"x", 10.0)])
    assert ids == [b"late"] * 3


def test_the_exchange_is_bounded_by_the_timeout():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(hal.DeadlineExceededError, match="rank 0"):
        channel_provider.fetch_id("127.0.0.1", port, 0, time.monotonic() + 0.3)
    with pytest.raises(hal.DeadlineExceededError, match="1 of 2"):
        providers = _providers(3, port)
        results = in_threads([lambda: providers[0].share_id(lambda: b"id", 0.5),
                               lambda: providers[1].share_id(lambda: b"x", 0.5)])
        assert results[1] == b"id"
        raise results[0]
    assert time.monotonic() - started < 10


def test_mpi_provider_broadcasts_from_rank_0():
    class Comm:
        def __init__(self, rank):
            self.rank = rank

        def Get_rank(self):  # noqa: N802 - mpi4py's names
            return self.rank

        def Get_size(self):  # noqa: N802
            return 2

        def bcast(self, value, root=0):
            return value if self.rank == root else b"from-root"

    assert MpiProvider(Comm(0)).share_id(lambda: b"made", None) == b"made"
    assert MpiProvider(Comm(1)).share_id(lambda: pytest.fail("only rank 0 makes the id"), None) == b"from-root"
    assert (MpiProvider(Comm(1)).rank, MpiProvider(Comm(1)).count) == (1, 2)


def test_mpi_without_mpi4py_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(hal.UnavailableError, match="mpi4py"):
        resolve("mpi", {})
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}
    assert isinstance(resolve("auto", env), EnvironmentProvider)  # falls back to the environment


def test_cpu_channels_from_providersin_threads():
    port = free_port()
    providers = _providers(2, port)
    devices = [hal.create_device("local-task") for _ in range(2)]
    try:
        channels = in_threads([lambda r=r: hal.create_channel(devices[r], provider=providers[r], timeout=10)
                                for r in range(2)])
        assert [(c.rank, c.count) for c in channels] == [(0, 2), (1, 2)]
        bufs = []
        for r, dev in enumerate(devices):
            buf = dev.allocator.allocate(8)
            dev.write(buf, np.array([r, 10], np.float32).tobytes())
            bufs.append(buf)
        sems = []
        for r, dev in enumerate(devices):
            cb = dev.create_command_buffer()
            with cb.record():
                cb.all_reduce(channels[r], bufs[r], bufs[r], 2)
            sem = dev.create_semaphore(0)
            dev.queue_execute([cb], signal=[(sem, 1)])
            sems.append(sem)
        for sem in sems:
            sem.wait(1, timeout=10)
        assert [np.frombuffer(d.read(b), np.float32).tolist() for d, b in zip(devices, bufs)] == [[1, 20]] * 2
    finally:
        for dev in devices:
            dev.close()


def test_explicit_rank_and_count_differing_from_the_launcher_need_an_id(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    with hal.create_device("local-sync") as dev:
        with pytest.raises(hal.InvalidArgumentError, match="channel id"):
            hal.create_channel(dev, rank=1, count=3)


def test_processes_launched_torchrun_style_share_the_id(tmp_path):
    """Two processes with torchrun's variables: rank 0 serves the id, rank 1 fetches it. The CPU channel
    connects ranks of one process only, so each process's rank waits alone and times out, saying so."""
    port = free_port()
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent("""
        import hal
        from hal import channel_provider
        provider = channel_provider.resolve("auto")
        print(provider.rank, provider.count, provider.share_id(lambda: b"the-id", 20).decode(), flush=True)
        try:
            hal.create_channel(hal.create_device("local-sync"), id=b"the-id", timeout=0.2)
        except hal.DeadlineExceededError as exc:
            print("one process" in str(exc))
    """))
    procs = []
    for rank in range(2):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1),
               "PATH": "/usr/bin:/bin"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=60)[0].split() for p in procs]
    assert outputs == [["0", "2", "the-id", "True"], ["1", "2", "the-id", "True"]]
