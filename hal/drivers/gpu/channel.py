"""Collectives on a GPU: channels over a vendor communication library (NCCL, RCCL), recorded as library calls.

The vendor driver gives its devices a ``GpuCollectives`` (``device.collectives``) with a loader of
its ``CollectiveLibrary`` (``hal/drivers/cuda/nccl.py``: NCCL through nccl4py; HIP: RCCL through
hip-python). The library is loaded when the first channel is made, never at import; a missing one
is an ``UnavailableError`` saying what to install.

Recording: consecutive collectives of one command-buffer level become one ``LibraryCall``
(``hal/drivers/gpu/library.py``) whose routine is a ``CollectiveGroup``: the call issues its
collectives between ``group_start`` and ``group_end``, as NCCL requires of a send and the recv it
pairs with, and as batches them into one launch. So collectives go wherever library routines go:
issued on the queue's stream in stream command buffers, captured on the device's capture stream into
a child-graph node in graph command buffers. Operands through binding-table slots are resolved at
each issue; in a graph, a new address captures the group again and sets the child graph in place
(tens of microseconds, as for other library calls); a table that comes back gets an executable
graph of its own. Every rank must run the same kind of command buffer (captured or not) for the same
collectives: NCCL cannot check that.

One process driving several GPUs (``create_channels``): the HAL issues each device's collectives as
that device's submission runs, one device after another from one thread, where NCCL asks for one
group over every rank. What an ungrouped call can wait for is a connection that a rank issued later
would complete; so every connection is made while all ranks take part: ``NCCL_RUNTIME_CONNECT=0``
(unless set; NCCL then connects every algorithm at ``init_all``) and one grouped warm-up (a small
all-reduce and a send/recv with every peer, whose connections are always made at first use).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hal.channel import Channel, Collective
from hal.drivers.gpu.library import LibraryCall
from hal.errors import FailedPreconditionError, InvalidArgumentError
from hal.log import driver_logger

if TYPE_CHECKING:
    from hal.drivers.gpu.device import GpuDevice
    from hal.drivers.gpu.recording import Target

#: The kinds that only move bytes: issued on bytes (uint8), whatever the element type.
MOVING = frozenset({"all_gather", "all_to_all", "broadcast", "send", "recv"})


class CollectiveLibrary(Protocol):
    """A vendor's collective library, with NCCL's calling conventions (RCCL shares them): pointers
    are device addresses, ``stream`` the GPU API's stream object, ``dtype`` an element type name of
    ``hal.channel.DTYPE_SIZES`` (``uint8`` for moved bytes) and ``op`` a reduction name."""

    #: Name and version, for messages ("NCCL 2.28.9").
    name: str

    def new_id(self) -> bytes: ...

    def init_rank(self, count: int, id: bytes, rank: int) -> Any:
        """This rank's communicator on the current device (returns once every rank joined)."""

    def init_all(self, ordinals: Sequence[int]) -> list[Any]: ...

    def split(self, comm: Any, color: int | None, key: int) -> Any:
        """A communicator of the ranks of ``color`` (None: no communicator for this rank)."""

    def comm_rank(self, comm: Any) -> tuple[int, int]:
        """(rank, count) of a communicator."""

    def group_start(self) -> None: ...

    def group_end(self) -> None: ...

    def destroy(self, comm: Any) -> None: ...

    def abort(self, comm: Any) -> None: ...

    def all_reduce(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any, stream: Any) -> None: ...

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any,
                       stream: Any) -> None: ...

    def reduce(self, send: int, recv: int, count: int, dtype: str, op: str, root: int, comm: Any,
               stream: Any) -> None: ...

    def all_gather(self, send: int, recv: int, count: int, dtype: str, comm: Any, stream: Any) -> None: ...

    def broadcast(self, send: int, recv: int, count: int, dtype: str, root: int, comm: Any, stream: Any) -> None: ...

    def send(self, buffer: int, count: int, dtype: str, peer: int, comm: Any, stream: Any) -> None: ...

    def recv(self, buffer: int, count: int, dtype: str, peer: int, comm: Any, stream: Any) -> None: ...


def enqueue(library: CollectiveLibrary, op: Collective, comm: Any, rank: int, ranks: int, send: int, recv: int,
            stream: Any) -> None:
    """Enqueue one collective (inside the caller's group); data movement goes as bytes."""
    kind = op.kind
    size = op.element_size
    if kind in MOVING:
        count = op.count * size
        if kind == "all_gather":
            library.all_gather(send, recv, count, "uint8", comm, stream)
        elif kind == "broadcast":
            library.broadcast(send if rank == op.root else recv, recv, count, "uint8", op.root, comm, stream)
        elif kind == "send":
            library.send(send, count, "uint8", op.peer, comm, stream)
        elif kind == "recv":
            library.recv(recv, count, "uint8", op.peer, comm, stream)
        else:  # all_to_all: chunk i to and from rank i
            for peer in range(ranks):
                library.send(send + peer * count, count, "uint8", peer, comm, stream)
                library.recv(recv + peer * count, count, "uint8", peer, comm, stream)
        return
    if kind == "all_reduce":
        library.all_reduce(send, recv, op.count, op.dtype, op.reduction, comm, stream)
    elif kind == "reduce_scatter":
        library.reduce_scatter(send, recv, op.count, op.dtype, op.reduction, comm, stream)
    else:  # reduce: the other ranks' recv is never written
        library.reduce(send, recv if rank == op.root else send, op.count, op.dtype, op.reduction, op.root, comm,
                       stream)


#: Point-to-point kinds: a send and the recv it pairs with must share one NCCL group.
_PEER_KINDS = frozenset(("send", "recv"))


def batches(parts: list) -> list[list]:
    """The parts in issue order, cut into the batches one NCCL group may hold: sends and receives
    join any batch, but a second collective of a channel starts a new one, since NCCL may run the
    operations of one group concurrently and a collective of a channel may read what the one
    before it wrote (the channel's collectives run in queue order)."""
    out: list[list] = [[]]
    busy: set[int] = set()  # channels with a collective in the current batch
    for part in parts:
        channel, op = part[0], part[1]
        if op.kind not in _PEER_KINDS:
            if id(channel) in busy:
                out.append([])
                busy = set()
            busy.add(id(channel))
        out[-1].append(part)
    return out


class CollectiveGroup:
    """The routine of a ``LibraryCall`` holding collectives of one level: each part is (channel,
    operation, index of its send target, index of its recv target) into the call's targets."""

    #: What ``LibraryCall.prepare`` allocates: collectives need no workspace (NCCL has its own).
    workspace_size = 0
    kind = "collectives"

    def __init__(self) -> None:
        self.parts: list[tuple[GpuChannel, Collective, int | None, int | None]] = []

    def enqueue(self, pointers: Sequence[int], stream: Any) -> None:
        """Issue the parts in order on ``stream``, each batch of them between group_start and
        group_end (a batch of one alone: NCCL groups each call by itself)."""
        parts = self.parts
        for channel, _, _, _ in parts:
            if channel.comm is None or channel.failure is not None or channel.device.closed:
                channel.check_usable("issuing a collective")
                raise FailedPreconditionError("issuing a collective: the channel's communicator is gone")
        library = parts[0][0].library
        for batch in batches(parts):
            if len(batch) == 1 and batch[0][1].kind != "all_to_all":  # (all_to_all is a group of sends and recvs)
                channel, op, send, recv = batch[0]
                send_ptr = 0 if send is None else pointers[send]
                recv_ptr = 0 if recv is None else pointers[recv]
                enqueue(library, op, channel.comm, channel.rank, channel.count, send_ptr or recv_ptr,
                        recv_ptr or send_ptr, stream)
                continue
            library.group_start()
            try:
                for channel, op, send, recv in batch:
                    send_ptr = 0 if send is None else pointers[send]
                    recv_ptr = 0 if recv is None else pointers[recv]
                    enqueue(library, op, channel.comm, channel.rank, channel.count, send_ptr or recv_ptr,
                            recv_ptr or send_ptr, stream)
            finally:
                library.group_end()

    def __repr__(self) -> str:
        return f"<collectives {', '.join(str(op) for _, op, _, _ in self.parts)}>"


class CollectiveBackend:
    """The ``LibraryBackend`` of collective calls: the plan is the group itself (nothing to plan)."""

    name = "collectives"

    def supports(self, routine: Any) -> str | None:
        return None

    def plan(self, routine: CollectiveGroup, checked: Any, pointers: Sequence[int]) -> CollectiveGroup:
        return routine

    def capturable(self, routine: CollectiveGroup, checked: Any) -> bool:
        return True  # (NCCL and RCCL calls capture into graphs)

    def serial_key(self, routine: CollectiveGroup, checked: Any) -> None:
        return None  # (a level's collectives are one call, ordered within as ``batches`` says)

    def enqueue(self, plan: CollectiveGroup, constants: tuple[int, ...], pointers: Sequence[int], workspace: int,
                workspace_size: int, stream: Any) -> None:
        plan.enqueue(pointers, stream)


BACKEND = CollectiveBackend()


def record(level: list, channel: GpuChannel, op: Collective, send: Target | None, recv: Target | None) -> None:
    """Append a collective to a command-buffer level: into the level's last command when that is a
    collective group (no other command between them), else as a new one."""
    last = level[-1] if level else None
    if type(last) is LibraryCall and type(last.routine) is CollectiveGroup:
        call = last
    else:
        call = LibraryCall(BACKEND, CollectiveGroup(), None, (), [], empty=True)  # type: ignore[arg-type]
        level.append(call)
    targets = call.targets
    indices = []
    for target in (send, recv):
        if target is None:
            indices.append(None)
        else:
            indices.append(len(targets))
            targets.append(target)
    call.routine.parts.append((channel, op, indices[0], indices[1]))  # type: ignore[attr-defined]
    if op.count:
        call.empty = False


class GpuChannel(Channel):
    """One rank's communicator of the device's collective library."""

    def __init__(self, device: GpuDevice, rank: int, count: int, timeout: float | None, library: CollectiveLibrary,
                 comm: Any) -> None:
        super().__init__(device, rank, count, timeout)
        self.library = library
        self.comm = comm
        self._comm_lock = threading.Lock()

    def _abort(self) -> None:
        with self._comm_lock:
            comm, self.comm = self.comm, None
        if comm is not None:
            self.library.abort(comm)

    def _close(self) -> None:
        device = self.device
        if not device.closed:
            try:
                device.wait_idle()  # the communicator must outlive the work that uses it
            except Exception:  # failed work does not keep the communicator alive
                pass
        with self._comm_lock:
            comm, self.comm = self.comm, None
        if comm is not None:
            if not device.closed:
                device.make_current()  # type: ignore[attr-defined]
            self.library.destroy(comm)


class GpuCollectives:
    """``device.collectives`` of a GPU device: channels over the library ``load()`` gives (loaded
    at the first use; ``load`` raises UnavailableError with what to install)."""

    def __init__(self, device: GpuDevice, load: Callable[[], CollectiveLibrary]) -> None:
        self.device = device
        self._load = load
        self._library: CollectiveLibrary | None = None
        self._lock = threading.Lock()

    @property
    def library(self) -> CollectiveLibrary:
        with self._lock:
            if self._library is None:
                self._library = self._load()
                driver_logger(self.device.info.driver).debug("collectives through %s", self._library.name)
            return self._library

    @property
    def name(self) -> str:
        return self.library.name

    def new_id(self) -> bytes:
        return self.library.new_id()

    def create(self, device: GpuDevice, rank: int, count: int, id: bytes, timeout: float | None) -> Channel:
        library = self.library
        device.make_current()
        comm = library.init_rank(count, id, rank)
        return GpuChannel(device, rank, count, timeout, library, comm)

    def create_all(self, devices: Sequence[GpuDevice], timeout: float | None) -> list[Channel]:
        library = self.library
        ordinals = [device.info.ordinal for device in devices]
        if len(set(ordinals)) != len(ordinals):
            raise InvalidArgumentError(f"create_channels: devices {ordinals} share a GPU (one rank per GPU)")
        # Every connection made at init, while all ranks take part (NCCL reads it once, at its first communicator).
        os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")
        comms = library.init_all(ordinals)
        channels = [GpuChannel(device, rank, len(devices), timeout, library, comm)
                    for rank, (device, comm) in enumerate(zip(devices, comms))]
        warm_up(channels)
        return channels  # type: ignore[return-value]

    def split(self, channels: Sequence[Channel], colors: Sequence[int | None], keys: Sequence[int]) -> list:
        library = self.library
        for channel in channels:
            if not isinstance(channel, GpuChannel) or channel.library is not library:
                raise InvalidArgumentError("split: the channels belong to different drivers")
        comms = []
        library.group_start()
        try:
            for channel, color, key in zip(channels, colors, keys):
                channel.device.make_current()  # type: ignore[attr-defined]
                comms.append(library.split(channel.comm, color, key))
        finally:
            library.group_end()
        result: list[Channel | None] = []
        for channel, comm in zip(channels, comms):
            if comm is None:
                result.append(None)
                continue
            rank, count = library.comm_rank(comm)
            result.append(GpuChannel(channel.device, rank, count, channel.timeout, library, comm))  # type: ignore[arg-type]
        return result


def warm_up(channels: Sequence[GpuChannel]) -> None:
    """One grouped all-reduce and send/recv with every peer on every rank (see the module), synchronized."""
    if len(channels) < 2:
        return
    library = channels[0].library
    count = len(channels)
    work = []
    for channel in channels:
        device = channel.device
        device.make_current()  # type: ignore[attr-defined]
        api = device.api  # type: ignore[attr-defined]
        buffer = device.allocator.allocate(8 * 2 * count)
        work.append((channel, api, api.stream_create(), buffer, buffer.device_address))
    try:
        library.group_start()
        try:
            for channel, _, stream, _, ptr in work:
                library.all_reduce(ptr, ptr, 1, "float32", "sum", channel.comm, stream)
                for peer in range(count):
                    if peer != channel.rank:
                        library.send(ptr + 8 * peer, 8, "uint8", peer, channel.comm, stream)
                        library.recv(ptr + 8 * (count + peer), 8, "uint8", peer, channel.comm, stream)
        finally:
            library.group_end()
        for channel, api, stream, _, _ in work:
            channel.device.make_current()  # type: ignore[attr-defined]
            api.stream_synchronize(stream)
    finally:
        for channel, api, stream, buffer, _ in work:
            channel.device.make_current()  # type: ignore[attr-defined]
            api.stream_destroy(stream)
            buffer.release()

