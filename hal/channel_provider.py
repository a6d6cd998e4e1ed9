"""Where a channel's rank, count and id come from when ``hal.create_channel`` is not told: the launcher.

``launch_environment()`` reads the variables the usual launchers set, first found wins:

=========  ========================  ==========================  ================================
launcher   rank / count              local rank / local count    set by
=========  ========================  ==========================  ================================
torchrun   RANK, WORLD_SIZE          LOCAL_RANK, LOCAL_WORLD_SIZE  torchrun, torch.distributed.run
openmpi    OMPI_COMM_WORLD_RANK,     OMPI_COMM_WORLD_LOCAL_RANK,   Open MPI's mpirun
           OMPI_COMM_WORLD_SIZE      OMPI_COMM_WORLD_LOCAL_SIZE
mpich      PMI_RANK, PMI_SIZE        MPI_LOCALRANKID,              MPICH / Intel MPI (Hydra)
                                     MPI_LOCALNRANKS
slurm      SLURM_PROCID,             SLURM_LOCALID                 srun
           SLURM_NTASKS
=========  ========================  ==========================  ================================

A provider shares the communicator id that rank 0 makes with the other ranks:

- ``EnvironmentProvider``: rank 0 serves the id over TCP and the others fetch it from
  ``MASTER_ADDR`` (default 127.0.0.1) at port ``HAL_CHANNEL_PORT``, else ``MASTER_PORT + 1``
  (torchrun's own store listens on ``MASTER_PORT``), within the channel's timeout. Channels made
  one after another exchange their ids in turn: every rank creates its channels in the same order.
- ``MpiProvider``: an MPI broadcast through mpi4py (imported only then; it initializes MPI).

``resolve("auto")`` takes MPI when the job runs under an MPI launcher and mpi4py imports, else the
environment, else None (a communicator of one rank needs no provider).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from hal.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError

#: (launcher, rank, count, local rank, local count) variables, in the order they are looked for.
LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
)
MPI_LAUNCHERS = ("openmpi", "mpich")
DEFAULT_MASTER_ADDR = "127.0.0.1"
_REQUEST = b"hal-channel-id %d\n"
_RETRY_S = 0.05


@dataclasses.dataclass(frozen=True)
class LaunchEnvironment:
    """What the launcher told this process (``launch_environment``)."""

    launcher: str
    rank: int
    count: int
    local_rank: int
    local_count: int
    master_addr: str | None
    master_port: int | None


def _int_variable(environ: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    text = environ.get(name)
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        if default is not None:  # a local count like Slurm's "2(x3)": not a plain count
            return default
        raise InvalidArgumentError(f"environment variable {name}={text!r} is not an integer") from None


def launch_environment(environ: Mapping[str, str] | None = None) -> LaunchEnvironment | None:
    """The launcher's rank, count, local rank and master address, or None outside a launcher."""
    environ = os.environ if environ is None else environ
    for launcher, rank_name, count_name, local_name, local_count_name in LAUNCHERS:
        if rank_name not in environ or count_name not in environ:
            continue
        rank = _int_variable(environ, rank_name)
        count = _int_variable(environ, count_name)
        if count is None or count < 1 or rank is None or not 0 <= rank < count:
            raise InvalidArgumentError(
                f"{launcher} environment: {rank_name}={environ.get(rank_name)!r} is not a rank of "
                f"{count_name}={environ.get(count_name)!r}")
        local_rank = _int_variable(environ, local_name, 0)
        local_count = _int_variable(environ, local_count_name, 1)
        port = _int_variable(environ, "MASTER_PORT")
        return LaunchEnvironment(launcher, rank, count, local_rank or 0, max(local_count or 1, (local_rank or 0) + 1),
                                 environ.get("MASTER_ADDR"), port)
    return None


class Provider(Protocol):
    """A source of this process's rank and count, and of the communicator id rank 0 makes."""

    rank: int
    count: int

    def share_id(self, make_id: Callable[[], bytes], timeout: float | None) -> bytes:
        """Rank 0 calls ``make_id`` and every rank returns its result (DeadlineExceededError after ``timeout``)."""


class EnvironmentProvider:
    """The launcher's rank and count; the id served by rank 0 over TCP (see the module)."""

    def __init__(self, environment: LaunchEnvironment, port: int | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.environment = environment
        self.rank = environment.rank
        self.count = environment.count
        self.address = environment.master_addr or DEFAULT_MASTER_ADDR
        source = "the port argument"
        if port is None:
            port, source = _int_variable(environ, "HAL_CHANNEL_PORT"), "HAL_CHANNEL_PORT"
        if port is None and environment.master_port is not None:
            port, source = environment.master_port + 1, "MASTER_PORT + 1"
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
            raise InvalidArgumentError(f"{source} = {port!r} is not a TCP port (1-65535): the channel id is served "
                                       "there (set HAL_CHANNEL_PORT)")
        self.port = port

    def share_id(self, make_id: Callable[[], bytes], timeout: float | None) -> bytes:
        if self.count == 1:
            return make_id()
        if self.port is None:
            raise InvalidArgumentError(
                f"{self.count} ranks need a place to share their channel id: set MASTER_ADDR and MASTER_PORT "
                "(or HAL_CHANNEL_PORT), or run under MPI with mpi4py installed")
        deadline = None if timeout is None else time.monotonic() + timeout
        sequence = _next_exchange(self.address, self.port, self.rank)
        if self.rank == 0:
            channel_id = make_id()
            serve_id(channel_id, self.port, self.count - 1, sequence, deadline)
            return channel_id
        return fetch_id(self.address, self.port, sequence, deadline)


class MpiProvider:
    """Rank and count of an MPI communicator (default ``COMM_WORLD``); the id by MPI broadcast."""

    def __init__(self, comm: object = None) -> None:
        if comm is None:
            try:
                from mpi4py import MPI
            except ImportError as exc:
                raise UnavailableError(
                    f"MPI channels need mpi4py (pip install mpi4py): {exc}") from exc
            comm = MPI.COMM_WORLD
        self.comm = comm
        self.rank = comm.Get_rank()  # type: ignore[attr-defined]
        self.count = comm.Get_size()  # type: ignore[attr-defined]

    def share_id(self, make_id: Callable[[], bytes], timeout: float | None) -> bytes:
        value = make_id() if self.rank == 0 else None
        return self.comm.bcast(value, root=0)  # type: ignore[attr-defined]


def resolve(provider: object = "auto", environ: Mapping[str, str] | None = None) -> Provider | None:
    """The provider ``create_channel`` uses (see the module); None without a launcher under "auto"."""
    if provider == "mpi":
        return MpiProvider()
    environment = launch_environment(environ)
    if provider == "env":
        if environment is None:
            raise InvalidArgumentError(
                "no launcher environment: none of " + ", ".join(f"{r}/{c}" for _, r, c, _, _ in LAUNCHERS) + " is set")
        return EnvironmentProvider(environment, environ=environ)
    if provider == "auto":
        if environment is None:
            return None
        if environment.launcher in MPI_LAUNCHERS and not environment.master_addr:
            try:
                return MpiProvider()
            except UnavailableError:
                pass
        return EnvironmentProvider(environment, environ=environ)
    if isinstance(provider, str) or not all(hasattr(provider, name) for name in ("rank", "count", "share_id")):
        raise InvalidArgumentError(f"channel provider must be 'auto', 'env', 'mpi' or a Provider, got {provider!r}")
    return provider  # type: ignore[return-value]


# -- the TCP exchange ------------------------------------------------------------------------------------
_exchanges: dict[tuple[str, int, int], int] = {}
_exchanges_lock = threading.Lock()


def _next_exchange(address: str, port: int, rank: int) -> int:
    """The number of ``rank``'s next id exchange at ``address:port`` (every rank counts alike)."""
    with _exchanges_lock:
        number = _exchanges.get((address, port, rank), 0)
        _exchanges[(address, port, rank)] = number + 1
        return number


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _read_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def serve_id(channel_id: bytes, port: int, clients: int, sequence: int, deadline: float | None) -> None:
    """Rank 0: hand ``channel_id`` to ``clients`` ranks asking for exchange ``sequence`` (others are
    told to retry), then stop listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(("", port))
        except OSError as exc:
            raise UnavailableError(f"rank 0 cannot serve the channel id on port {port}: {exc} "
                                   "(set HAL_CHANNEL_PORT to a free port on every rank)") from exc
        server.listen(max(clients, 16))
        served = 0
        reply = b"ID" + struct.pack("!I", len(channel_id)) + channel_id
        while served < clients:
            left = _left(deadline)
            if left == 0.0:
                raise DeadlineExceededError(
                    f"rank 0 gave the channel id to {served} of {clients} ranks before the timeout")
            server.settimeout(left)
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5.0)
                try:
                    request = conn.recv(64)
                    if request == _REQUEST % sequence:
                        conn.sendall(reply)
                        served += 1
                    else:
                        conn.sendall(b"RETRY\n")
                except OSError:
                    continue  # a client that went away asks again


def fetch_id(address: str, port: int, sequence: int, deadline: float | None) -> bytes:
    """Ranks but 0: ask rank 0 at ``address:port`` for exchange ``sequence``'s id until it answers."""
    last_error: object = None
    while True:
        left = _left(deadline)
        if left == 0.0:
            raise DeadlineExceededError(
                f"no channel id from rank 0 at {address}:{port} before the timeout (last: {last_error})")
        try:
            with socket.create_connection((address, port), timeout=min(left or 5.0, 5.0)) as conn:
                conn.sendall(_REQUEST % sequence)
                head = _read_exactly(conn, 2)
                if head == b"ID":
                    (size,) = struct.unpack("!I", _read_exactly(conn, 4))
                    return _read_exactly(conn, size)
                last_error = "rank 0 is serving another channel's id"
        except OSError as exc:
            last_error = exc
        time.sleep(_RETRY_S)
