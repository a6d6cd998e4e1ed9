"""Channels: one rank of a communicator, and the collective operations command buffers record.

A ``hal.Channel`` is one participant of a group of devices that exchange data, as IREE's
``iree_hal_channel_t`` and an NCCL communicator are: it belongs to one device and knows its
``rank`` among ``count`` ranks. Collective operations are commands like any other: they are
recorded into a command buffer of the channel's device and run when it is submitted, in queue
order, between the commands around them::

    ch = hal.create_channel(dev)                      # rank, count and id from the launcher
    with cb.record():
        cb.all_reduce(ch, grads, grads, count=n, dtype="float32")   # in place, summed over ranks
    dev.queue_execute([cb], signal=[(sem, 1)])

Creating channels:

- ``create_channel(device, rank=, count=, id=, timeout=)``: one rank; what is not given comes from
  the launcher (``hal.channel_provider``: torchrun's ``RANK``/``WORLD_SIZE``, Open MPI's and
  MPICH's variables, or MPI itself through mpi4py), and rank 0 makes the communicator's id
  (``create_channel_id``) and shares it. Every rank of a communicator calls it.
- ``create_channels(devices)``: one process driving several devices makes every rank at once
  (NCCL's init-all), channel ``i`` on ``devices[i]``.
- ``channel.split(color, key, max_blocks=)`` / ``split_channels``: a channel of the ranks of one
  color. ``max_blocks`` caps the thread blocks (SMs) its collectives take on a GPU (NCCL's
  ``maxCTAs``), so that a collective runs beside compute that fills the rest of the GPU.

Symmetric memory: ``channel.allocate_symmetric(size)`` (``allocate_symmetric(channels, size)`` for
several ranks of this process) is a collective allocation: every rank allocates ``size`` bytes, in
the same order, and the library registers the memory of all ranks together (NCCL's
``ncclMemAlloc`` and ``ncclCommWindowRegister``). A collective whose operands all lie in such
buffers may then run the library's symmetric-memory kernels: lower latency, and few SMs (with
``max_blocks``, a bandwidth-bound all-reduce overlaps a GEMM that a plain one only waits behind).
NCCL registers them with ``NCCL_WIN_COLL_SYMMETRIC``: a collective's operands must lie at the same
offset of every rank's buffer (the kernels find a peer's operand at the local one's offset; other
offsets read the wrong bytes), and no rank may pass an ordinary buffer where the others pass
registered ones. Where ranks are compared (every rank in this process, or ``HAL_COLLECTIVE_CHECKS=1``)
both are part of the operation (``Collective.windows``): ranks that differ fail with
``CollectiveMismatchError``; operands through binding-table slots are not compared. The buffers
are ordinary device buffers otherwise (dispatches, copies, any channel's collectives);
``channel.symmetric_memory`` says whether the driver registers them (False: plain allocations).

Operations and their operands (``count`` elements of ``dtype``; ``n`` ranks; ``r`` this rank):

=================  ======================  ======================  ==================================
kind               send                    recv                    in place when
=================  ======================  ======================  ==================================
``all_reduce``     count                   count                   send and recv start together
``all_gather``     count                   count * n (rank order)  send starts at chunk r of recv
``reduce_scatter`` count * n               count (chunk r)         recv starts at chunk r of send
``all_to_all``     count * n (to rank i)   count * n (from i)      never (they must not overlap)
``broadcast``      count (root only)       count                   send and recv start together
``reduce``         count                   count (root only)       send and recv start together
``send``           count (to ``peer``)     none                    -
``recv``           none                    count (from ``peer``)   -
=================  ======================  ======================  ==================================

A range may be longer than the operation needs (only its first bytes are touched). Operand
ranges overlapping in any other way are refused. Reductions are ``sum``, ``prod``, ``min``,
``max`` and ``avg`` (floating-point types only) over the NCCL element types (``REDUCIBLE``);
``bool``, ``int16`` and ``uint16`` move data (gather, broadcast, send...) but are not reduced.

Collectives of one level (no barrier between them) run as one group, as ``ncclGroupStart`` /
``ncclGroupEnd`` make them: a ``send`` and the ``recv`` it pairs with on the same rank must be
recorded without a barrier between them. Every rank must run the same collectives in the same
order; the CPU drivers' reference channel checks that they do (``Channel.checks_matching``), as do
GPU channels whose every rank one process drives, and fails the submissions with
``CollectiveMismatchError`` otherwise (``MeetingOrder`` and ``mismatch`` are the rules).

Failures reach the semaphores the work would signal: a rank that does not arrive within the
channel's ``timeout`` (``DeadlineExceededError``), an ``abort()`` from any thread
(``AbortedError``), mismatched operations. The channel is unusable afterwards (as an NCCL
communicator after an error); the device stays usable.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hal.checks import check_int, check_sequence
from hal.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    OutOfRangeError,
    UnimplementedError,
)
from hal.pickling import not_picklable

if TYPE_CHECKING:
    from hal.buffer import Buffer
    from hal.device import Device

#: The collective operations, in the order of the table above.
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send", "recv")
#: The kinds that combine values (they take a reduction).
REDUCING = frozenset({"all_reduce", "reduce_scatter", "reduce"})
REDUCTIONS = ("sum", "prod", "min", "max", "avg")
#: The element types collectives move, and their sizes in bytes.
DTYPE_SIZES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
               "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
#: The element types reductions take (NCCL's and RCCL's).
REDUCIBLE = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
                       "float64"})
#: The element types ``avg`` takes.
AVERAGEABLE = frozenset({"float16", "bfloat16", "float32", "float64"})
#: Seconds a rank waits for the others (channel creation, each collective) unless told otherwise.
DEFAULT_TIMEOUT = 300.0
#: The largest block cap a channel takes (NCCL's most channels a collective runs on).
MAX_BLOCKS = 64


class CollectiveMismatchError(InvalidArgumentError):
    """The ranks of a channel asked for different collective operations (kind, element type, count,
    reduction, root or peer) at the same point of their sequences."""


@dataclasses.dataclass(frozen=True)
class Collective:
    """One checked collective operation, as one rank recorded it (see the module's table)."""

    kind: str
    dtype: str
    count: int
    reduction: str | None = None
    #: The root rank of ``broadcast`` and ``reduce``.
    root: int | None = None
    #: The other rank of ``send`` and ``recv``.
    peer: int | None = None
    #: Where an all-reduce's, all-gather's or reduce-scatter's operands lie in the channel's symmetric
    #: memory (``allocate_symmetric``): the (send, recv) offsets from their windows' starts, None for
    #: an operand outside them (and for the one of an in-place all-gather or reduce-scatter that sits
    #: at the rank's own place); None when neither is in one. NCCL's symmetric kernels find a peer's
    #: operand at the local operand's offset, and its registered buffers may not meet ordinary ones:
    #: ranks must agree on this too.
    windows: tuple[int | None, int | None] | None = None

    @property
    def element_size(self) -> int:
        return DTYPE_SIZES[self.dtype]

    def send_elements(self, rank: int, ranks: int) -> int:
        """Elements this rank's send operand holds (0: the operation reads none here)."""
        kind = self.kind
        if kind in ("reduce_scatter", "all_to_all"):
            return self.count * ranks
        if kind == "recv" or (kind == "broadcast" and rank != self.root):
            return 0
        return self.count

    def recv_elements(self, rank: int, ranks: int) -> int:
        """Elements this rank's recv operand receives (0: the operation writes none here)."""
        kind = self.kind
        if kind in ("all_gather", "all_to_all"):
            return self.count * ranks
        if kind == "send" or (kind == "reduce" and rank != self.root):
            return 0
        return self.count

    def needs_send(self, rank: int) -> bool:
        return self.kind != "recv" and not (self.kind == "broadcast" and rank != self.root)

    def needs_recv(self, rank: int) -> bool:
        return self.kind != "send" and not (self.kind == "reduce" and rank != self.root)

    def in_place_offset(self, rank: int) -> int | None:
        """Where recv starts relative to send (bytes, possibly negative) when the operation runs in
        place; None where no overlap is allowed."""
        if self.kind in ("all_reduce", "broadcast", "reduce"):
            return 0
        chunk = self.count * self.element_size * rank
        if self.kind == "all_gather":
            return -chunk
        if self.kind == "reduce_scatter":
            return chunk
        return None

    def matches(self, other: Collective) -> bool:
        """Whether two ranks asked for the same operation (``send`` pairs with ``recv``)."""
        if self.kind in ("send", "recv"):
            return other.kind in ("send", "recv") and other.kind != self.kind and \
                (self.dtype, self.count) == (other.dtype, other.count)
        return self == other

    def __str__(self) -> str:
        extra = "".join(f", {name}={value}" for name, value in
                        (("reduction", self.reduction), ("root", self.root), ("peer", self.peer),
                         ("windows", self.windows)) if value is not None)
        return f"{self.kind}({self.count} x {self.dtype}{extra})"


def dtype_name(dtype: object) -> str:
    """The collective element type named by a string or a numpy dtype (``"float32"``, ``np.int8``)."""
    if type(dtype) is str and dtype in DTYPE_SIZES:
        return dtype
    if isinstance(dtype, bool) or dtype is None:
        raise InvalidArgumentError(f"collective dtype must name an element type, got {dtype!r}")
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None)
    if not isinstance(name, str):
        import numpy as np

        try:
            name = np.dtype(dtype).name  # type: ignore[call-overload]
        except TypeError:
            name = None
    if name not in DTYPE_SIZES:
        raise InvalidArgumentError(f"collective dtype must be one of {sorted(DTYPE_SIZES)}, got {dtype!r}")
    return name  # type: ignore[return-value]


def check_collective(channel: Channel, kind: object, count: object, dtype: object, reduction: object,
                     root: object, peer: object) -> Collective:
    """The operation ``channel`` is asked for, checked (kind, count, element type, reduction, root,
    peer), before any operand is looked at."""
    if kind not in KINDS or type(kind) is not str:
        raise InvalidArgumentError(f"collective kind must be one of {KINDS}, got {kind!r}")
    count = check_int(count, f"{kind} count")
    dtype = dtype_name(dtype)
    if kind in REDUCING:
        reduction = "sum" if reduction is None else reduction
        if type(reduction) is not str or reduction not in REDUCTIONS:
            raise InvalidArgumentError(f"{kind} reduction must be one of {REDUCTIONS}, got {reduction!r}")
        if dtype not in REDUCIBLE:
            raise InvalidArgumentError(
                f"{kind} cannot reduce {dtype} elements (reductions take {sorted(REDUCIBLE)})")
        if reduction == "avg" and dtype not in AVERAGEABLE:
            raise InvalidArgumentError(f"{kind} avg takes floating-point elements, not {dtype}")
    elif reduction is not None:
        raise InvalidArgumentError(f"{kind} reduces nothing; got reduction {reduction!r}")
    ranks = channel.count
    if kind in ("broadcast", "reduce"):
        root = check_int(0 if root is None else root, f"{kind} root", maximum=ranks - 1)
    elif root is not None:
        raise InvalidArgumentError(f"{kind} has no root; got root {root!r}")
    if kind in ("send", "recv"):
        if peer is None:
            raise InvalidArgumentError(f"{kind} needs a peer rank")
        peer = check_int(peer, f"{kind} peer", maximum=ranks - 1)
    elif peer is not None:
        raise InvalidArgumentError(f"{kind} has no peer; got peer {peer!r}")
    return Collective(kind, dtype, count, reduction, root, peer)  # type: ignore[arg-type]


def check_operands(op: Collective, rank: int, ranks: int, send: tuple[Any, int, int] | None,
                   recv: tuple[Any, int, int] | None, where: str = "") -> None:
    """Operands resolved to (root buffer, offset in it, length) against what ``op`` needs of this
    rank: lengths, element alignment, and overlap only where the operation runs in place."""
    size = op.element_size
    needed = {}
    for name, operand, elements in (("send", send, op.send_elements(rank, ranks)),
                                    ("recv", recv, op.recv_elements(rank, ranks))):
        if operand is None:
            continue
        _, offset, length = operand
        if offset % size:
            raise InvalidArgumentError(
                f"{op.kind} {name} operand{where} at byte {offset} of its allocation is not aligned to its "
                f"{size}-byte {op.dtype} elements")
        if length < elements * size:
            raise OutOfRangeError(
                f"{op.kind} {name} operand{where} of {length} bytes is too short: rank {rank} of {ranks} "
                f"{'sends' if name == 'send' else 'receives'} {elements} {op.dtype} elements "
                f"({elements * size} bytes)")
        needed[name] = elements * size
    if send is None or recv is None or send[0] is not recv[0] or not needed["send"] or not needed["recv"]:
        return
    a, b = send[1], recv[1]
    if a < b + needed["recv"] and b < a + needed["send"]:
        shift = op.in_place_offset(rank)
        if shift is None or b - a != shift:
            expected = "never in place" if shift is None else f"in place only with recv at send {shift:+d} bytes"
            raise InvalidArgumentError(
                f"{op.kind} send [{a}, {a + needed['send']}) and recv [{b}, {b + needed['recv']}){where} overlap "
                f"in one allocation ({op.kind} runs {expected})")


class MeetingOrder:
    """Which meeting each collective of one rank is, in the order the rank runs them: the k-th
    collective meets the other ranks' k-th; the k-th ``send`` from rank a to rank b meets b's k-th
    ``recv`` from a. ``next(op)`` is the key of ``op``'s meeting (callers serialize the calls of
    one rank: their order is the rank's order)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._sequence = itertools.count()
        self._sends: dict[int, Iterator[int]] = {}
        self._recvs: dict[int, Iterator[int]] = {}

    def next(self, op: Collective) -> tuple:
        kind = op.kind
        if kind == "send":
            return ("p2p", self.rank, op.peer, next(self._sends.setdefault(op.peer, itertools.count())))  # type: ignore[arg-type]
        if kind == "recv":
            return ("p2p", op.peer, self.rank, next(self._recvs.setdefault(op.peer, itertools.count())))  # type: ignore[arg-type]
        return ("collective", next(self._sequence))


def meeting_size(key: tuple, count: int) -> int:
    """The ranks that meet at ``key`` (``MeetingOrder.next``) in a communicator of ``count``."""
    return 2 if key[0] == "p2p" else count


def mismatch(first_rank: int, first: Collective, rank: int, op: Collective) -> CollectiveMismatchError | None:
    """The error of two ranks meeting with operations that do not match, or None."""
    if first.matches(op):
        return None
    return CollectiveMismatchError(f"rank {first_rank} runs {first} where rank {rank} runs {op}")


class Channel:
    """One rank of a communicator on one device (see the module).

    Driver-facing: ``checks_matching`` (whether the ranks' operations are compared, as the CPU
    reference channel does), ``fail(cause)`` (the channel broke: a timeout or an abort) and
    ``check_usable(what)``; drivers implement ``_split``, ``_abort`` and ``_close``.
    """

    __reduce_ex__ = not_picklable("a hal.Channel", "create a channel in the other process (hal.create_channel)")

    #: Whether the driver compares every rank's operation and fails mismatches (the CPU reference
    #: channel; GPU channels whose every rank this process drives).
    checks_matching: bool = False

    #: Whether ``allocate_symmetric`` gives memory the library registers with the communicator
    #: (False: ordinary device buffers, which the collectives take all the same).
    symmetric_memory: bool = False

    def __init__(self, device: Device, rank: int, count: int, timeout: float | None,
                 max_blocks: int | None = None) -> None:
        self.device = device
        self.rank = rank
        self.count = count
        #: Seconds a rank waits for the others in a collective (None: without limit).
        self.timeout = timeout
        #: The most thread blocks a collective of this channel runs on a GPU (None: the library's choice).
        self.max_blocks = max_blocks
        self.closed = False
        #: Why the channel broke (a timeout, an abort, mismatched operations), or None.
        self.failure: BaseException | None = None
        self._lock = threading.Lock()

    # -- state ------------------------------------------------------------------------
    def check_usable(self, what: str) -> None:
        """FailedPreconditionError when the channel (or its device) is closed or the channel broke."""
        if self.closed:
            raise FailedPreconditionError(f"{what}: channel rank {self.rank} of {self.count} is closed")
        self.device.check_open()
        if self.failure is not None:
            raise FailedPreconditionError(
                f"{what}: channel rank {self.rank} of {self.count} broke ({self.failure}); create a new one")

    def fail(self, cause: BaseException) -> None:
        """Mark the channel broken by ``cause`` (the first cause stays)."""
        with self._lock:
            if self.failure is None:
                self.failure = cause

    # -- operations ---------------------------------------------------------------------
    def split(self, color: int | None, key: int = 0, *, max_blocks: int | None = None) -> Channel | None:
        """A new channel of the ranks passing the same ``color``, ordered by ``key`` then rank (None
        for ``color=None``: this rank joins no channel). Every rank of the channel calls it (one
        process driving several ranks: ``split_channels``). ``max_blocks``: the most thread blocks
        its collectives take on a GPU (see the module); every rank passes the same."""
        return split_channels([self], [color], [key], max_blocks=max_blocks)[0]

    def allocate_symmetric(self, size: int) -> Buffer:
        """``size`` bytes of device memory registered with the communicator (see the module): a
        collective call, every rank with the same size, in the same order (one process driving
        several ranks: ``hal.allocate_symmetric``). Release it as any buffer."""
        return allocate_symmetric([self], size)[0]

    def abort(self) -> None:
        """Fail every collective in flight or to come on this channel and its peers' (from any thread);
        their submissions' semaphores fail with ``AbortedError``. Idempotent."""
        self.fail(AbortedError(f"channel rank {self.rank} of {self.count} was aborted"))
        self._abort()

    def close(self) -> None:
        """Release the channel's resources; later recordings on it are refused. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- driver hooks ---------------------------------------------------------------------
    def _abort(self) -> None:
        pass

    def _close(self) -> None:
        pass

    def __repr__(self) -> str:
        state = " closed" if self.closed else (" broken" if self.failure is not None else "")
        return f"<hal.Channel rank {self.rank} of {self.count} on {self.device.info.uri}{state}>"


class ChannelFactory(Protocol):
    """What a device with collectives provides as ``device.collectives`` (driver-facing)."""

    #: The library behind the channels, for messages ("NCCL 2.28.9", "numpy reference").
    name: str
    #: (optional, default False) Whether several ranks may use devices of one physical device.
    ranks_share_devices: bool
    #: (optional, default False) Whether its channels have ``Channel.checks_matching`` (all of them, or
    #: those the driver can compare: a GPU channel whose every rank this process drives).
    checks_matching: bool
    #: (optional, default False) Whether its channels honour their timeout (creation and work in
    #: flight: ``DeadlineExceededError``) and ``abort()`` (the CTS's failure tests run where True).
    times_out: bool

    def new_id(self) -> bytes:
        """A new communicator id (rank 0 makes it, every rank passes it to ``create``)."""

    def create(self, device: Device, rank: int, count: int, id: bytes, timeout: float | None) -> Channel:
        """This rank's channel; returns once every rank joined (DeadlineExceededError after ``timeout``)."""

    def create_all(self, devices: Sequence[Device], timeout: float | None) -> list[Channel]:
        """One channel per device, rank ``i`` on ``devices[i]`` (one process driving them all)."""

    def split(self, channels: Sequence[Channel], colors: Sequence[int | None], keys: Sequence[int],
              max_blocks: int | None = None) -> list:
        """Split each of ``channels`` (ranks of one communicator driven by this thread); the new
        channels' collectives take at most ``max_blocks`` thread blocks where the device has them."""

    # (optional) allocate_symmetric(channels, size) -> list[Buffer]: each rank's buffer of ``size``
    # bytes registered with the communicator (see the module); without it, ordinary allocations.


def factory_of(device: object) -> ChannelFactory:
    """The channel factory of an open device; UnimplementedError for a device without collectives."""
    check_open = getattr(device, "check_open", None)
    if check_open is None or not hasattr(device, "allocator"):
        raise InvalidArgumentError(f"channels are created on a hal.Device, got {type(device).__name__}")
    check_open()
    factory = device.collectives
    if factory is None:
        raise UnimplementedError(f"device {device.info.uri} has no collective operations")  # type: ignore[attr-defined]
    return factory


def check_timeout(timeout: object) -> float | None:
    """A channel timeout: seconds > 0, or None / math.inf for no limit."""
    if timeout is None or (type(timeout) is float and math.isinf(timeout) and timeout > 0):
        return None
    if isinstance(timeout, (bool, str, bytes)) or type(timeout).__name__ == "bool_":
        raise InvalidArgumentError(f"channel timeout must be None or seconds > 0, got {timeout!r}")
    try:
        seconds = float(timeout)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"channel timeout must be None or seconds > 0, got {timeout!r}") from None
    if not seconds > 0:
        raise InvalidArgumentError(f"channel timeout must be None or seconds > 0, got {timeout!r}")
    return None if math.isinf(seconds) else seconds


def check_id(id: object) -> bytes:
    if isinstance(id, (bytes, bytearray, memoryview)) and len(id):
        return bytes(id)
    raise InvalidArgumentError(f"channel id must be non-empty bytes (hal.create_channel_id), got {id!r}")


def create_channel_id(device: Device) -> bytes:
    """A new communicator id for channels on ``device``'s driver: rank 0 makes it and every rank
    passes it to ``create_channel(id=...)`` (an NCCL unique id on CUDA)."""
    return factory_of(device).new_id()


def create_channel(device: Device, *, rank: int | None = None, count: int | None = None, id: bytes | None = None,
                   timeout: float | None = DEFAULT_TIMEOUT, provider: object = "auto") -> Channel:
    """This process's rank of a communicator on ``device``; every rank calls it.

    ``rank`` and ``count`` default to the launcher's (``provider``: ``"auto"``, ``"env"``,
    ``"mpi"`` or a ``hal.channel_provider.Provider``; without a launcher: rank 0 of 1). Without
    ``id``, rank 0 makes one and the provider shares it with the other ranks (over TCP at the
    launcher's master address, or an MPI broadcast). Returns once every rank joined;
    ``DeadlineExceededError`` after ``timeout`` seconds.
    """
    from hal import channel_provider

    factory = factory_of(device)
    timeout = check_timeout(timeout)
    source = None
    if rank is None or count is None or id is None:
        source = channel_provider.resolve(provider)
    if count is None:
        count = source.count if source is not None else 1
    count = check_int(count, "channel count", minimum=1)
    if rank is None:
        rank = source.rank if source is not None else 0
    rank = check_int(rank, "channel rank", maximum=count - 1)
    if source is not None and (rank, count) != (source.rank, source.count) and id is None and count > 1:
        raise InvalidArgumentError(
            f"rank {rank} of {count} differs from the launcher's rank {source.rank} of {source.count}: "
            "pass the channel id too")
    if id is None:
        id = factory.new_id() if count == 1 else source.share_id(factory.new_id, timeout)  # type: ignore[union-attr]
    return factory.create(device, rank, count, check_id(id), timeout)


def create_channels(devices: Sequence[Device], *, timeout: float | None = DEFAULT_TIMEOUT) -> list[Channel]:
    """One channel per device, rank ``i`` on ``devices[i]``, all of one communicator (one process
    driving several devices, as ``ncclCommInitAll``). The devices are distinct devices of one driver."""
    devices = list(check_sequence(devices, "create_channels devices", "hal.Device"))
    if not devices:
        raise InvalidArgumentError("create_channels needs at least one device")
    factories = [factory_of(device) for device in devices]
    if len({id(device) for device in devices}) != len(devices):
        raise InvalidArgumentError("create_channels: a device appears twice (one rank per device)")
    if any(type(f) is not type(factories[0]) for f in factories):
        raise InvalidArgumentError("create_channels: the devices' collectives come from different drivers")
    return factories[0].create_all(devices, check_timeout(timeout))


def check_max_blocks(max_blocks: object) -> int | None:
    """A channel's block cap: None, or an int from 1 to MAX_BLOCKS."""
    if max_blocks is None:
        return None
    return check_int(max_blocks, "max_blocks", minimum=1, maximum=MAX_BLOCKS)


def _check_channels(channels: Sequence[Channel], what: str) -> list[Channel]:
    """``channels`` as a list of usable hal.Channel objects (at least one)."""
    channels = list(check_sequence(channels, "channels", "hal.Channel"))
    if not channels:
        raise InvalidArgumentError(f"{what} needs at least one channel")
    for channel in channels:
        if not isinstance(channel, Channel):
            raise InvalidArgumentError(f"{what} takes hal.Channel objects, got {type(channel).__name__}")
        channel.check_usable(what)
    return channels


def allocate_symmetric(channels: Sequence[Channel], size: int) -> list[Buffer]:
    """``Channel.allocate_symmetric`` for several ranks of one communicator driven by this thread
    (registered together, as NCCL requires): a buffer of ``size`` bytes per channel, on its device."""
    size = check_int(size, "symmetric allocation size", minimum=0)
    channels = _check_channels(channels, "allocate_symmetric")
    devices = [channel.device for channel in channels]
    if len({id(device) for device in devices}) != len(devices):
        raise InvalidArgumentError("allocate_symmetric: two of the channels are on one device")
    factory = factory_of(devices[0])
    allocate = getattr(factory, "allocate_symmetric", None)
    if allocate is None:
        return [device.allocator.allocate(size) for device in devices]
    return allocate(channels, size)


def split_channels(channels: Sequence[Channel], colors: Sequence[int | None],
                   keys: Sequence[int] | None = None, *, max_blocks: int | None = None) -> list[Channel | None]:
    """``Channel.split`` for several ranks of one communicator driven by this thread (grouped as
    NCCL requires): rank ``channels[i]`` joins the channel of color ``colors[i]`` (None: none)."""
    max_blocks = check_max_blocks(max_blocks)
    channels = _check_channels(channels, "split")
    colors = list(check_sequence(colors, "split colors", "ints or None"))
    keys = [0] * len(channels) if keys is None else list(check_sequence(keys, "split keys", "ints"))
    if len(colors) != len(channels) or len(keys) != len(channels):
        raise InvalidArgumentError(
            f"split takes one color and key per channel: {len(channels)} channels, {len(colors)} colors, "
            f"{len(keys)} keys")
    colors = [None if c is None else check_int(c, "split color") for c in colors]
    keys = [check_int(k, "split key", minimum=-(1 << 31), maximum=(1 << 31) - 1) for k in keys]
    factory = factory_of(channels[0].device)
    return factory.split(channels, colors, keys, max_blocks)
