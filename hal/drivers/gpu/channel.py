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
a child-graph node in graph command buffers. A group binds its library calls once, every argument
included, for the operands and the stream of its last issue (re-issued alike, it resolves nothing
again). Operands through binding-table slots are resolved at each issue with a new table; in a
graph, a new address captures the group again and sets the child graph in place (tens of
microseconds, as for other library calls); a table that comes back gets an executable graph of its
own. Every rank must run the same kind of command buffer (captured or not) for the same
collectives: NCCL cannot check that.

One process driving several GPUs (``create_channels``): the HAL issues each device's collectives as
that device's submission runs, one device after another from one thread, where NCCL asks for one
group over every rank. What an ungrouped call can wait for is a connection that a rank issued later
would complete; the connections made at creation (below) leave nothing to wait for.

Failures: NCCL's communicators are made non-blocking (its ``blocking=0`` config; RCCL's through
hip-python stay blocking, each split a call of its own: ``CollectiveLibrary.grouped_splits``), so
nothing waits for a rank without limit: creating and splitting poll the communicators (``CollectiveLibrary.ready``)
up to the channel's timeout, and abort them at the deadline. But NCCL enqueues each group of a
non-blocking communicator on a thread it starts for it (about 230 us to an 8-byte all-reduce on
an H200, against 20 us blocking), so a channel issues its collectives on a blocking communicator
split from its own, sharing its resources (NCCL's ``splitShare``): nothing of a blocking call
waits for a peer once every connection is made, and every connection is made while the channel
is created (``NCCL_RUNTIME_CONNECT=0`` unless set, so NCCL connects every algorithm at init, and a
warm-up of a small all-reduce and a send/recv with every peer on the non-blocking communicator,
since point-to-point connections are always made at first use). Splits of a channel share its
resources and its abort too: they join its ``LocalRanks``. An issued submission with
collectives is watched (``hal.watchdog``): still in flight ``timeout`` seconds after its issue
(PyTorch's NCCL watchdog counts from the enqueue too), its channels break with
``DeadlineExceededError`` and their communicators are aborted, which ends the NCCL kernels
waiting for the missing rank; the stream goes on and the device stays usable. ``abort()``, a
timeout and a close of the device break every rank this process drives of that communicator
(``LocalRanks``): each one's work waits for the others. Work on a broken channel that was not
retired yet fails with the channel's failure (``broken``: ``Completion.finish``), and so does any
later issue of a command buffer recording collectives on it (``queue.issue``): a captured graph
would replay NCCL kernels of a freed communicator.
"""

from __future__ import annotations

import collections
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hal.channel import Channel, Collective, CollectiveMismatchError, MeetingOrder, meeting_size, mismatch
from hal.drivers.gpu import exchange
from hal.drivers.gpu.exchange import Exchanges
from hal.drivers.gpu.library import LibraryCall
from hal.errors import DeadlineExceededError, FailedPreconditionError, HalError, InvalidArgumentError
from hal.log import driver_logger
from hal.watchdog import WATCHDOG

if TYPE_CHECKING:
    from hal.drivers.gpu.device import GpuDevice
    from hal.drivers.gpu.recording import Target
    from hal.drivers.gpu.submission import Submission

#: The kinds that only move bytes: issued on bytes (uint8), whatever the element type.
MOVING = frozenset({"all_gather", "all_to_all", "broadcast", "send", "recv"})


class CollectiveLibrary(Protocol):
    """A vendor's collective library, with NCCL's calling conventions (RCCL shares them): pointers
    are device addresses, ``stream`` the GPU API's stream object, ``dtype`` an element type name of
    ``hal.channel.DTYPE_SIZES`` (``uint8`` for moved bytes) and ``op`` a reduction name."""

    #: Name and version, for messages ("NCCL 2.28.9").
    name: str
    #: Whether ``init_rank`` and ``split`` make non-blocking communicators sharing their resources
    #: with their splits; channels then issue on a blocking split (see the module). False: every
    #: communicator is blocking, and channels issue on theirs.
    nonblocking: bool
    #: Whether ``split`` may be called between ``group_start`` and ``group_end``, its new communicator
    #: filled in once the group completes (nccl4py). False: the bindings return a split's communicator
    #: only from a call that completes it (hip-python's RCCL), so each rank's split is a blocking call of
    #: its own, outside any group, on a thread of its own where this process splits several ranks
    #: (``split_each``).
    grouped_splits: bool
    #: Whether ``mem_alloc`` and ``window_register`` give symmetric memory (NCCL 2.27 and later):
    #: False, and channels allocate ordinary buffers for ``allocate_symmetric``.
    symmetric: bool

    def new_id(self) -> bytes: ...

    def init_rank(self, count: int, id: bytes, rank: int) -> Any:
        """This rank's communicator on the current device, at once: ``ready`` tells when every rank
        joined (calls for several ranks go between ``group_start`` and ``group_end``)."""

    def ready(self, comm: Any) -> bool:
        """Whether the communicator's last operation (creation, split, a group of calls) is done:
        False while in progress; raises its asynchronous error."""

    def split(self, comm: Any, color: int | None, key: int, blocking: bool = False,
              max_blocks: int | None = None) -> Any:
        """A communicator of the ranks of ``color`` (None: no communicator for this rank), usable
        once ``comm`` is ready again (the split completes with it); ``blocking``: a blocking one;
        ``max_blocks``: its collectives' most thread blocks (NCCL's ``maxCTAs``, in clusters of one)."""

    def comm_rank(self, comm: Any) -> tuple[int, int]:
        """(rank, count) of a communicator."""

    def group_start(self) -> None: ...

    def group_end(self) -> None: ...

    def destroy(self, comm: Any) -> None:
        """Free a communicator whose work is complete."""

    def abort(self, comm: Any) -> None:
        """Free a communicator at once: its kernels still waiting for peers return."""

    def mem_alloc(self, size: int) -> int:
        """Device memory on the current device that ``window_register`` takes (``symmetric`` only)."""

    def mem_free(self, ptr: int) -> None: ...

    def window_register(self, comm: Any, ptr: int, size: int) -> Any:
        """Register ``mem_alloc``'s memory as a symmetric window of ``comm``: a collective call (in a
        group for several ranks of this process); its handle is valid once the group completed."""

    def window_deregister(self, comm: Any, window: Any) -> None:
        """Deregister a window (local to the rank; no operation may still use it)."""

    def all_reduce(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any, stream: Any) -> None: ...

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any,
                       stream: Any) -> None: ...

    def reduce(self, send: int, recv: int, count: int, dtype: str, op: str, root: int, comm: Any,
               stream: Any) -> None: ...

    def all_gather(self, send: int, recv: int, count: int, dtype: str, comm: Any, stream: Any) -> None: ...

    def broadcast(self, send: int, recv: int, count: int, dtype: str, root: int, comm: Any, stream: Any) -> None: ...

    def send(self, buffer: int, count: int, dtype: str, peer: int, comm: Any, stream: Any) -> None: ...

    def recv(self, buffer: int, count: int, dtype: str, peer: int, comm: Any, stream: Any) -> None: ...


#: One library call of a collective, made once per recorded part (``steps``): (library method, index of
#: its first operand's target or None (address 0), byte offset into it, the same for a second operand
#: (None: the method takes one address), the arguments after the addresses, the channel whose
#: communicator comes after them). Called as ``method(a, [b,] *args, channel.comm, stream)``.
Step = tuple


def steps(channel: GpuChannel, op: Collective, send: int | None, recv: int | None) -> list[Step]:
    """The library calls of one collective (inside the caller's group); data movement goes as bytes.
    ``send``/``recv``: its operands' target indices (an absent one stands for the other: in place)."""
    library, rank, kind = channel.library, channel.rank, op.kind
    send, recv = (recv if send is None else send), (send if recv is None else recv)
    if kind in MOVING:
        size = op.count * op.element_size
        if kind == "all_gather":
            return [(library.all_gather, send, 0, recv, 0, (size, "uint8"), channel)]
        if kind == "broadcast":
            return [(library.broadcast, send if rank == op.root else recv, 0, recv, 0, (size, "uint8", op.root),
                     channel)]
        if kind == "send":
            return [(library.send, send, 0, None, 0, (size, "uint8", op.peer), channel)]
        if kind == "recv":
            return [(library.recv, recv, 0, None, 0, (size, "uint8", op.peer), channel)]
        # all_to_all: chunk i to and from rank i
        return [step for peer in range(channel.count)
                for step in ((library.send, send, peer * size, None, 0, (size, "uint8", peer), channel),
                             (library.recv, recv, peer * size, None, 0, (size, "uint8", peer), channel))]
    args = (op.count, op.dtype, op.reduction)
    if kind == "all_reduce":
        return [(library.all_reduce, send, 0, recv, 0, args, channel)]
    if kind == "reduce_scatter":
        return [(library.reduce_scatter, send, 0, recv, 0, args, channel)]
    # reduce: the other ranks' recv is never written
    return [(library.reduce, send, 0, recv if rank == op.root else send, 0, args + (op.root,), channel)]


def bound_steps(batch: Sequence[Step], pointers: Sequence[int], stream: Any) -> list[Callable[[], None]]:
    """The batch's library calls with every argument bound: operands at ``pointers``, on ``stream``.
    (The communicators are bound too: a channel only ever loses its communicator, and an issue
    checks that first, with COMM_LOCK held.)"""
    calls = []
    for method, a, a_offset, b, b_offset, args, channel in batch:
        address = 0 if a is None else pointers[a] + a_offset
        if b is None:
            calls.append(functools.partial(method, address, *args, channel.comm, stream))
        else:
            calls.append(functools.partial(method, address, pointers[b] + b_offset, *args, channel.comm, stream))
    return calls


def _issue_batches(library: CollectiveLibrary, batches: list[tuple[bool, list[Callable[[], None]]]]) -> None:
    for grouped, calls in batches:
        if not grouped:
            for call in calls:
                call()
            continue
        library.group_start()
        try:
            for call in calls:
                call()
        finally:
            library.group_end()


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
        #: ``_make_plan``'s, made at the first issue (the parts are recorded by then).
        self._plan: tuple[list[GpuChannel], CollectiveLibrary, list[tuple[bool, list[Step]]]] | None = None
        #: ``_bind``'s for the last issue: re-issued with the same operands on the same stream (a prepared
        #: execution's usual submission hands the call the same list of addresses), nothing is resolved again.
        self._bound: tuple[Sequence[int], Any, list[GpuChannel], Callable[[], None]] | None = None

    def add(self, part: tuple[GpuChannel, Collective, int | None, int | None]) -> None:
        self.parts.append(part)
        self._plan = self._bound = None

    def enqueue(self, pointers: Sequence[int], stream: Any) -> None:
        """Issue the parts in order on ``stream``, each batch of them between group_start and
        group_end (a batch of one call alone: NCCL groups each call by itself). The communicators
        issued on are blocking: each call returns once enqueued."""
        bound = self._bound
        if bound is None or bound[0] is not pointers or bound[1] is not stream:
            bound = self._bind(pointers, stream)
        with COMM_LOCK:  # (no abort frees a communicator between the check and the calls)
            check_channels(bound[2])
            bound[3]()

    def _bind(self, pointers: Sequence[int], stream: Any) -> tuple:
        """(pointers, stream, channels, what issues the parts with every argument bound: the one
        library call itself, when that is all)."""
        plan = self._plan
        if plan is None:
            plan = self._plan = self._make_plan()
        channels, library, plan_batches = plan
        batches = [(grouped, bound_steps(batch, pointers, stream)) for grouped, batch in plan_batches]
        if len(batches) == 1 and len(batches[0][1]) == 1:
            issue = batches[0][1][0]
        else:
            issue = functools.partial(_issue_batches, library, batches)
        bound = self._bound = (pointers, stream, channels, issue)
        return bound

    def _make_plan(self) -> tuple[list[GpuChannel], CollectiveLibrary, list[tuple[bool, list[Step]]]]:
        """(channels, their library, [(whether grouped, the batch's steps)]) of the parts."""
        channels = list({id(channel): channel for channel, _, _, _ in self.parts}.values())
        made = []
        for batch in batches(self.parts):
            batch_steps = [step for part in batch for step in steps(*part)]
            made.append((len(batch_steps) > 1, batch_steps))
        return channels, channels[0].library, made

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


#: The collectives NCCL runs in symmetric memory (its symmetric kernels, NCCL 2.27-2.28).
SYMMETRIC_KINDS = ("all_reduce", "all_gather", "reduce_scatter")


def window_offsets(channel: GpuChannel, op: Collective, send: Target | None,
                   recv: Target | None) -> tuple[int | None, int | None] | None:
    """``Collective.windows`` of ``op`` with these operands on ``channel``: where each lies in the
    channel's symmetric memory (an operand through a binding-table slot is not known before it is
    issued: not compared), for the kinds NCCL runs in symmetric memory (all-reduce, all-gather,
    reduce-scatter: every rank passes both operands; None for the others). The in-place operand at
    the rank's own place (all-gather's send, reduce-scatter's recv) lies at an offset that differs
    from rank to rank by design: left out."""
    if not channel.windows or op.kind not in SYMMETRIC_KINDS:
        return None
    windows = tuple(channel.windows.items())  # (a release on another thread may change the dict)

    def offset(target: Target | None) -> int | None:
        if target is None or target.slot is not None:
            return None
        for start, size in windows:
            if start <= target.ptr < start + size:
                return target.ptr - start
        return None

    send_at, recv_at = offset(send), offset(recv)
    if send is not None and recv is not None and send_at is not None and recv_at is not None and \
            recv.ptr - send.ptr == op.in_place_offset(channel.rank):
        if op.kind == "all_gather":
            send_at = None
        elif op.kind == "reduce_scatter":
            recv_at = None
    return None if send_at is None and recv_at is None else (send_at, recv_at)


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
    indices: list[int | None] = []
    for target in (send, recv):
        if target is None:
            indices.append(None)
        else:
            indices.append(len(targets))
            targets.append(target)
    call.routine.add((channel, op, indices[0], indices[1]))  # type: ignore[attr-defined]
    if op.count:
        call.empty = False


#: Held around every call that uses or frees a communicator (enqueues, aborts, destroys): an abort
#: from another thread (the watchdog's, a user's) never frees one under a call using it.
COMM_LOCK = threading.RLock()
#: Polls of a communicator in progress: back to back for SPIN_SECONDS, then sleeping from the first of
#: _POLL_SLEEPS, doubling up to the last (a creation waits for the other ranks' processes). NCCL's
#: asynchronous work (a split, a warm-up) often completes within a few hundred microseconds.
SPIN_SECONDS = 2e-3
_POLL_SLEEPS = (50e-6, 5e-3)


def copy_of(failure: BaseException) -> BaseException:
    """A new exception like the channel's failure (each submission fails with its own instance)."""
    try:
        copy = type(failure)(failure.message if isinstance(failure, HalError) else str(failure))
    except Exception:
        return failure
    copy.__cause__ = failure.__cause__
    return copy


def check_channels(channels: Sequence[GpuChannel]) -> None:
    """Raise the failure of the first broken channel (a copy), or FailedPreconditionError for a closed one."""
    for channel in channels:
        if channel.failure is not None:
            raise copy_of(channel.failure)
        if channel.comm is None or channel.device.closed:
            channel.check_usable("issuing a collective")
            raise FailedPreconditionError("issuing a collective: the channel's communicator is gone")


def broken(channels: Sequence[GpuChannel]) -> BaseException | None:
    """What work on ``channels`` that retires now fails with: the first broken channel's failure."""
    for channel in channels:
        if channel.failure is not None:
            return copy_of(channel.failure)
    return None


def poll_ready(library: CollectiveLibrary, comms: Sequence[Any], deadline: float | None,
               failed: Callable[[], BaseException | None], what: str) -> None:
    """Return once every communicator is ready; raise its error, ``failed()``'s failure, or
    DeadlineExceededError at the deadline (the caller aborts what it made)."""
    poll_until(lambda: all(library.ready(comm) for comm in comms), deadline, failed, what)


def poll_until(done: Callable[[], bool], deadline: float | None, failed: Callable[[], BaseException | None],
               what: str) -> None:
    """Return once ``done()``; raise ``failed()``'s failure, or DeadlineExceededError at the deadline."""
    sleep = _POLL_SLEEPS[0]
    spin_until = time.monotonic() + SPIN_SECONDS
    while True:
        if done():
            return
        if time.monotonic() < spin_until:
            continue
        failure = failed()
        if failure is not None:
            raise copy_of(failure)
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceededError(f"{what}: the other ranks did not take part within the channel's timeout")
        time.sleep(sleep)
        sleep = min(sleep * 2, _POLL_SLEEPS[1])


class LocalRanks:
    """The ranks of one communicator that this process drives: one channel, or every channel of one
    ``create_channels``, with the channels split from them where splits share their parent's
    resources (a non-blocking library's). Their collectives wait for each other, so one's failure
    is every one's."""

    def __init__(self) -> None:
        self.members: list[GpuChannel] = []

    def break_with(self, cause: BaseException) -> None:
        """Fail every member with ``cause`` (each keeps its first failure) at once, then abort their
        communicators. Before an abort, the graphs that captured the members' collectives are
        destroyed (``_release_captures``)."""
        members = list(self.members)
        for member in members:
            member.fail(cause)  # (first: issues see it)
        _abort_members(members)


class Meetings:
    """The operations of one communicator whose every rank this process drives, compared as each
    rank issues them (``meet``): mismatched operations fail every rank with
    ``CollectiveMismatchError`` before the later rank's call is made, where NCCL would wait for
    ever or reduce the wrong bytes. A channel with peers in other processes has none: it compares
    nothing (``checks_matching`` is False), or exchanges digests with them (``Exchanges``, with
    HAL_COLLECTIVE_CHECKS=1)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._lock = threading.Lock()
        #: Meeting key (``MeetingOrder.next``) -> [first rank, its operation, ranks arrived so far].
        self._open: dict[tuple, list] = {}

    def meet(self, rank: int, order: MeetingOrder, ops: Sequence[Collective], api: Any = None,
             stream: Any = None) -> CollectiveMismatchError | None:
        """Record ``rank``'s ``ops``, the next of its order (``order``: its keys, taken under this
        lock); the first that does not match the first rank's at its meeting, as an error. (``api``
        and ``stream``, where the submission is issued, serve ``Exchanges``.)"""
        count = self.count
        opened = self._open
        with self._lock:
            for op in ops:
                key = order.next(op)
                entry = opened.get(key)
                if entry is None:
                    opened[key] = [rank, op, 1]
                    continue
                error = mismatch(entry[0], entry[1], rank, op)
                if error is not None:
                    return error
                entry[2] += 1
                if entry[2] == meeting_size(key, count):
                    del opened[key]
        return None

    def release(self, device: Any) -> None:
        """(Nothing on the device: see ``Exchanges.release``.)"""


#: What a submission compares per channel: (the channel, its Meetings or Exchanges, its MeetingOrder, its
#: rank, its collectives of the submission in order).
MeetingParts = list[tuple["GpuChannel", "Meetings | Exchanges", MeetingOrder, int, list[Collective]]]


def meeting_parts(parts: Sequence[tuple[Channel, Collective]]) -> MeetingParts | None:
    """The collectives (each with its channel, in issue order) that ``meet`` compares, by channel:
    those of channels with peers to compare with (``Meetings`` or ``Exchanges`` of two ranks or more);
    None if none."""
    by_channel: dict[int, tuple] = {}
    for channel, op in parts:
        meetings = getattr(channel, "meetings", None)
        if meetings is None or meetings.count < 2:
            continue
        entry = by_channel.get(id(channel))
        if entry is None:
            entry = by_channel[id(channel)] = (channel, meetings, channel.order, channel.rank, [])  # type: ignore[attr-defined]
        entry[4].append(op)
    return list(by_channel.values()) or None


def meet(parts: MeetingParts, api: Any, stream: Any) -> tuple[GpuChannel, HalError] | None:
    """Before issuing on ``stream`` (in issue order: under the queue's lock), each collective of a
    submission meets its peers' (see ``Meetings``; ``Exchanges`` for peers in other processes): None,
    or the first mismatch (or an exchange's timeout) and its channel. Then the submission fails with
    it, unissued, and the caller breaks the channel's ranks with it once the queue's lock is released
    (``LocalRanks.break_with`` takes the queues' locks): the ranks issued before are aborted and
    their submissions fail with it too."""
    for channel, meetings, order, rank, ops in parts:
        error = meetings.meet(rank, order, ops, api, stream)
        if error is not None:
            return channel, error
    return None


def _snapshot(items: weakref.WeakSet) -> list:
    """The members of a weak set another thread may add to meanwhile (iteration then raises)."""
    while True:
        try:
            return list(items)
        except RuntimeError:  # changed size during the copy: copy again
            continue


def _release_captures(channel: GpuChannel) -> None:
    """Destroy the graphs that captured ``channel``'s collectives: NCCL's abort and destroy of a
    communicator wait until every graph holding its persistent plans is gone (alive, they hang, even
    never launched), and none may replay a freed communicator anyway."""
    for cb in _snapshot(channel.recorders):
        queues = cb.device.queues  # (their locks: no issue of the command buffer runs meanwhile)
        for queue in queues:
            queue.lock.acquire()
        try:
            cb.release_captures()
        except HalError:
            pass
        finally:
            for queue in queues:
                queue.lock.release()


def _abort_members(members: list[GpuChannel]) -> None:
    for member in members:
        _release_captures(member)
    with COMM_LOCK:
        for member in members:
            member.abort_comm()


class GpuChannel(Channel):
    """One rank's communicator of the device's collective library."""

    def __init__(self, device: GpuDevice, rank: int, count: int, timeout: float | None, library: CollectiveLibrary,
                 comm: Any, ranks: LocalRanks | None = None, base: Any = None, max_blocks: int | None = None) -> None:
        super().__init__(device, rank, count, timeout, max_blocks)
        self.library = library
        #: The communicator its collectives are issued on, and the one it was made as (which splits
        #: split; ``comm`` is a blocking split of it where the library's are non-blocking).
        self.comm = comm
        self.base = comm if base is None else base
        #: The ranks of this communicator this process drives (see LocalRanks).
        self.ranks = LocalRanks() if ranks is None else ranks
        #: Which meeting each of its collectives is, and where they are compared: ``Meetings`` when
        #: every rank is in this process, ``Exchanges`` with HAL_COLLECTIVE_CHECKS=1, else None.
        self.order = MeetingOrder(rank)
        self.meetings: Meetings | Exchanges | None = None
        #: The command buffers recording its collectives (a break destroys their captured graphs).
        self.recorders: weakref.WeakSet = weakref.WeakSet()
        self.ranks.members.append(self)
        #: (deadline, submission) of the issued work with collectives on it, oldest first (see watch).
        self.inflight: collections.deque[tuple[float, Submission]] = collections.deque()
        self._watch_lock = threading.Lock()
        self._watched = False
        #: Its symmetric memory: each registered window's start and size (see ``window_offsets``).
        self.windows: dict[int, int] = {}

    @property
    def checks_matching(self) -> bool:  # type: ignore[override]
        return self.meetings is not None

    @property
    def symmetric_memory(self) -> bool:  # type: ignore[override]
        return self.library.symmetric

    # -- failures ---------------------------------------------------------------------------
    def _abort(self) -> None:
        self.ranks.break_with(self.failure or FailedPreconditionError("channel aborted"))

    def _take_comms(self) -> list[Any]:
        """Its communicators (none once taken), the issuing one first."""
        comms = [comm for comm in (self.comm, self.base) if comm is not None]
        self.comm = self.base = None
        return comms[:1] if len(comms) == 2 and comms[0] is comms[1] else comms

    def abort_comm(self) -> None:
        """Abort the communicators now (with COMM_LOCK held), if it still has them."""
        for comm in self._take_comms():
            try:
                self.library.abort(comm)
            except HalError as exc:  # the channel is broken either way; say why the abort failed
                driver_logger(self.device.info.driver).warning("aborting %r: %s", self, exc)

    def watch(self, sub: Submission) -> None:
        """Break the channel if ``sub`` (issued now, with collectives on it) is still in flight after
        ``timeout`` seconds (called only with a timeout)."""
        deadline = time.monotonic() + self.timeout  # type: ignore[operator]
        with self._watch_lock:
            inflight = self.inflight
            while inflight and inflight[0][1].retired:  # (retirement is in issue order: the list stays short)
                inflight.popleft()
            inflight.append((deadline, sub))
            if self._watched:
                return
            self._watched = True
        WATCHDOG.watch(deadline, self)

    def check_deadlines(self) -> None:
        """The watchdog's call: break the channel if its oldest work in flight is past its deadline
        and not complete, else watch the next deadline."""
        with self._watch_lock:
            inflight = self.inflight
            while inflight and _done(inflight[0][1]):
                inflight.popleft()
            if not inflight or self.failure is not None:
                inflight.clear()
                self._watched = False
                return
            deadline = inflight[0][0]
            if deadline > time.monotonic():
                WATCHDOG.watch(deadline, self)
                return
            inflight.clear()
            self._watched = False
        self.ranks.break_with(DeadlineExceededError(
            f"channel rank {self.rank} of {self.count}: collectives issued {self.timeout} s ago did not complete "
            "(a rank did not take part within the channel's timeout); the channel is aborted"))

    def _close(self) -> None:
        device = self.device
        if not device.closed and self.failure is None:
            try:
                device.wait_idle()  # the communicator must outlive the work that uses it
            except Exception:  # failed work does not keep the communicator alive
                pass
        _release_captures(self)
        with COMM_LOCK:
            comms = self._take_comms()
            if device.closed:  # (its context is gone with what the communicators had on it)
                return
            if comms:
                device.make_current()  # type: ignore[attr-defined]
            for comm in comms:
                if self.failure is not None:
                    self.library.abort(comm)
                else:
                    self.library.destroy(comm)
            if self.meetings is not None:  # (after the communicators: nothing writes its memory now)
                self.meetings.release(device)


def _done(sub: Submission) -> bool:
    """Whether ``sub``'s work completed (retired, or its event reached)."""
    if sub.retired:
        return True
    event = sub.event
    if event is None:
        return False
    queue = sub.queue
    try:
        queue.context.make_current()
        return bool(queue.api.event_query(event))
    except HalError:  # a fault: the retirement reports it
        return True


class GpuCollectives:
    """``device.collectives`` of a GPU device: channels over the library ``load()`` gives (loaded
    at the first use; ``load`` raises UnavailableError with what to install)."""

    #: Its channels time out and abort (``hal.channel.ChannelFactory.times_out``).
    times_out = True
    #: Its channels compare the ranks' operations where this process drives every rank (``Meetings``).
    checks_matching = True

    def __init__(self, device: GpuDevice, load: Callable[[], CollectiveLibrary]) -> None:
        self.device = device
        self._load = load
        self._library: CollectiveLibrary | None = None
        self._lock = threading.Lock()
        #: The device's open channels (a close of the device breaks them: see ``device_closing``).
        self.channels: weakref.WeakSet[GpuChannel] = weakref.WeakSet()

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

    def _adopt(self, channel: GpuChannel) -> GpuChannel:
        collectives = channel.device.collectives
        if isinstance(collectives, GpuCollectives):
            collectives.channels.add(channel)
        return channel

    def _own(self, channels: Sequence[Channel], what: str) -> list[GpuChannel]:
        """``channels`` as channels of this library; InvalidArgumentError for any other."""
        library = self.library
        for channel in channels:
            if not isinstance(channel, GpuChannel) or channel.library is not library:
                raise InvalidArgumentError(f"{what}: the channels belong to different drivers")
        return list(channels)  # type: ignore[arg-type]

    def device_closing(self) -> None:
        """The device closes: its channels break (their peers in this process too) and their
        communicators are aborted, so no NCCL kernel keeps its streams waiting."""
        uri = self.device.info.uri
        for channel in _snapshot(self.channels):
            if not channel.closed and channel.comm is not None:
                channel.ranks.break_with(FailedPreconditionError(
                    f"device {uri} of channel rank {channel.rank} of {channel.count} was closed"))

    def _made(self, library: CollectiveLibrary, comms: list[Any], deadline: float | None, what: str) -> None:
        """Wait for the communicators just made; abort them all on failure or at the deadline."""
        try:
            poll_ready(library, comms, deadline, lambda: None, what)
        except BaseException:
            _abort_all(library, comms)
            raise

    def _open(self, library: CollectiveLibrary, devices: Sequence[GpuDevice], bases: list[Any],
              deadline: float | None, timeouts: Sequence[float | None], ranks: Sequence[LocalRanks],
              what: str, max_blocks: int | None = None) -> list[GpuChannel]:
        """Channels of this process's ranks over communicators just made and ready (``bases``, one per
        device, each channel with its timeout and ``LocalRanks``): their connections made (``warm_up``:
        all in one group, since every rank of every communicator must take part) and, for a
        non-blocking library, the blocking communicators they issue on split off (see the module).
        On failure everything is aborted."""
        if not bases:
            return []
        positions = [library.comm_rank(base) for base in bases]
        siblings: list[Any] = []
        alive = list(bases)  # (aborted once: by the warm-up, or below)

        def abort() -> None:
            _abort_all(library, siblings + alive)
            alive.clear()
            siblings.clear()

        try:
            warm_up(library, devices, bases, positions, deadline, what, abort)
            if library.nonblocking:
                split = split_each(library, devices, bases, [0] * len(bases), [rank for rank, _ in positions],
                                   lambda exc: abort(), blocking=True, max_blocks=max_blocks)
                # (a non-blocking split's handles are set once the parents are ready again)
                poll_ready(library, bases, deadline, lambda: None, f"{what}: its blocking communicators")
                siblings = split
        except BaseException:
            abort()
            raise
        channels = []
        for device, base, comm, (rank, count), timeout, local in zip(devices, bases, siblings or bases, positions,
                                                                      timeouts, ranks):
            channels.append(self._adopt(GpuChannel(device, rank, count, timeout, library, comm, local, base,
                                                   max_blocks)))
        return channels

    def create(self, device: GpuDevice, rank: int, count: int, id: bytes, timeout: float | None) -> Channel:
        compared = exchange.enabled()  # (a bad value raises before anything is made)
        library = self.library
        connect_at_init()
        deadline = None if timeout is None else time.monotonic() + timeout
        what = f"channel rank {rank} of {count}"
        comm = init_rank(library, device, count, id, rank, deadline, what)
        self._made(library, [comm], deadline, what)
        (channel,) = self._open(library, [device], [comm], deadline, [timeout], [LocalRanks()], what)
        if count == 1:  # (every rank of it is here)
            channel.meetings = Meetings(1)
        elif compared:
            channel.meetings = Exchanges(channel)
        return channel

    def create_all(self, devices: Sequence[GpuDevice], timeout: float | None) -> list[Channel]:
        library = self.library
        ordinals = [device.info.ordinal for device in devices]
        if len(set(ordinals)) != len(ordinals):
            raise InvalidArgumentError(f"create_channels: devices {ordinals} share a GPU (one rank per GPU)")
        connect_at_init()
        deadline = None if timeout is None else time.monotonic() + timeout
        id = library.new_id()
        comms = []
        library.group_start()  # (NCCL's init-all: every rank's init in one group)
        try:
            for rank, device in enumerate(devices):
                device.make_current()
                comms.append(library.init_rank(len(devices), id, rank))
        finally:
            library.group_end()
        what = f"create_channels of {len(devices)} ranks"
        self._made(library, comms, deadline, what)
        local = LocalRanks()
        channels = self._open(library, devices, comms, deadline, [timeout] * len(comms), [local] * len(comms), what)
        meetings = Meetings(len(channels))
        for channel in channels:
            channel.meetings = meetings
        return channels  # type: ignore[return-value]

    def split(self, channels: Sequence[Channel], colors: Sequence[int | None], keys: Sequence[int],
              max_blocks: int | None = None) -> list:
        library = self.library
        gpu_channels = self._own(channels, "split")

        def break_parents(exc: BaseException) -> None:  # (a split that fails leaves them mid-operation)
            for channel in gpu_channels:
                channel.ranks.break_with(exc)

        deadline = earliest_deadline(gpu_channels)
        comms = split_each(library, [channel.device for channel in gpu_channels],  # type: ignore[misc]
                           [channel.base for channel in gpu_channels], colors, keys, break_parents,
                           max_blocks=max_blocks, deadline=deadline)
        # A non-blocking split completes with its parent: the new communicators' handles are set
        # once the parents are ready again (nccl4py fills them in then), so the parents are polled
        # first. A split that does not complete leaves the parents mid-operation: they break.
        try:
            poll_ready(library, [channel.base for channel in gpu_channels], deadline, lambda: None, "split")
        except HalError as exc:
            for channel in gpu_channels:
                channel.ranks.break_with(exc)
            raise
        made = [comm for comm in comms if comm is not None]
        parents = [channel for channel, comm in zip(gpu_channels, comms) if comm is not None]
        # Splits of a non-blocking library share their parent's resources and abort: its LocalRanks
        # (and an abort of a split that failed aborts its parents too: they break with it).
        by_color: dict[Any, LocalRanks] = {}
        ranks = [channel.ranks if library.nonblocking else by_color.setdefault(color, LocalRanks())
                 for channel, color, comm in zip(gpu_channels, colors, comms) if comm is not None]
        try:
            self._made(library, made, deadline, "split")
            opened = iter(self._open(library, [channel.device for channel in parents], made,  # type: ignore[misc]
                                     deadline, [channel.timeout for channel in parents], ranks, "split",
                                     max_blocks))
        except HalError as exc:
            if library.nonblocking:
                for channel in gpu_channels:
                    channel.ranks.break_with(exc)
            raise
        result: list[GpuChannel | None] = [None if comm is None else next(opened) for comm in comms]
        # Where this process drives every rank of the parents, it drives every rank of each split.
        parents_meet = gpu_channels[0].meetings
        if parents_meet is not None and parents_meet.count == len(gpu_channels) and \
                all(parent.meetings is parents_meet for parent in gpu_channels):
            new_meetings: dict[Any, Meetings] = {}
            for made_channel, color in zip(result, colors):
                if made_channel is not None:
                    made_channel.meetings = new_meetings.setdefault(color, Meetings(made_channel.count))
        elif all(isinstance(parent.meetings, Exchanges) for parent in gpu_channels):
            for made_channel in result:
                if made_channel is not None and made_channel.count > 1:
                    made_channel.meetings = Exchanges(made_channel)
        return result

    def allocate_symmetric(self, channels: Sequence[Channel], size: int) -> list:
        """Each channel's buffer of ``size`` bytes: ``mem_alloc``'s memory registered as a window of
        the communicator its collectives are issued on, every rank of this process in one group
        (``register_windows``); ordinary buffers where the library has no symmetric memory. A
        buffer's release deregisters its window and frees the memory once the work before the
        release is done (nothing to deregister once the communicator is gone)."""
        library = self.library
        gpu_channels = self._own(channels, "allocate_symmetric")
        if not library.symmetric:
            return [channel.device.allocator.allocate(size) for channel in gpu_channels]
        nbytes = max(size, 1)  # (as any allocation: an empty buffer still has an address)
        pointers: list[int] = []
        try:
            for channel in gpu_channels:
                channel.device.make_current()
                pointers.append(library.mem_alloc(nbytes))
            windows = register_windows(library, gpu_channels, pointers, nbytes)
        except BaseException:
            for channel, ptr in zip(gpu_channels, pointers):
                channel.device.make_current()
                library.mem_free(ptr)
            raise
        for channel, ptr in zip(gpu_channels, pointers):
            channel.windows[ptr] = nbytes
        return [channel.device.allocator.adopt(ptr, size, functools.partial(_release_window, channel, ptr, window))
                for channel, ptr, window in zip(gpu_channels, pointers, windows)]


def init_rank(library: CollectiveLibrary, device: GpuDevice, count: int, id: bytes, rank: int,
              deadline: float | None, what: str) -> Any:
    """This rank's communicator. A non-blocking library's returns at once (``_made`` waits for it);
    a blocking one's init returns once every rank joined, so it runs on a thread of its own and
    DeadlineExceededError ends the wait at the deadline. Nothing can end the call itself (there is
    no communicator to abort yet): the thread is left to it, and aborts what it makes too late.
    (The bound holds where the library's bindings let go of the interpreter while they wait.)"""
    if library.nonblocking or deadline is None:
        device.make_current()
        return library.init_rank(count, id, rank)
    lock = threading.Lock()
    made: list[Any] = []
    abandoned = [False]

    def init() -> None:
        device.make_current()
        comm = library.init_rank(count, id, rank)
        with lock:
            if not abandoned[0]:
                made.append(comm)
                return
        _abort_all(library, [comm])  # (made after the caller gave up on it: nobody uses it)

    failures, _ = on_threads([init], "hal-channel-init", deadline=deadline)
    with lock:
        if made:  # (made as the deadline passed, or before)
            return made[0]
        abandoned[0] = True
    if failures:
        raise failures[0]
    raise DeadlineExceededError(f"{what}: the other ranks did not join within the channel's timeout")


def register_windows(library: CollectiveLibrary, channels: Sequence[GpuChannel], pointers: Sequence[int],
                     nbytes: int) -> list[Any]:
    """The windows of ``pointers`` on the channels' issuing communicators, registered in one group.
    Registration waits for every rank (the communicators are blocking), so it runs on a thread of its
    own, bounded by the channels' shortest timeout: at the deadline their ranks break (the abort ends
    the call, as it ends NCCL kernels waiting for a peer) and DeadlineExceededError is raised.
    COMM_LOCK is not held while it waits: other ranks of this process register meanwhile."""
    windows: list[Any] = []

    def register() -> None:
        library.group_start()
        try:
            for channel, ptr in zip(channels, pointers):
                channel.device.make_current()
                windows.append(library.window_register(channel.comm, ptr, nbytes))
        finally:
            library.group_end()

    timeout = DeadlineExceededError("allocate_symmetric: the other ranks did not take part within the channel's "
                                    "timeout")

    def expired() -> None:
        for channel in channels:
            channel.ranks.break_with(timeout)

    with COMM_LOCK:
        check_channels(channels)
    failures, late = on_threads([register], "hal-register-windows",
                                deadline=earliest_deadline(channels), expired=expired)
    if late:
        raise timeout
    if failures:
        raise failures[0]
    return windows


def _release_window(channel: GpuChannel, ptr: int, window: Any) -> None:
    """A symmetric buffer's release, once the work before it is done (its device's context current)."""
    library = channel.library
    channel.windows.pop(ptr, None)
    with COMM_LOCK:
        if channel.comm is not None:  # (an aborted or destroyed communicator took its windows along)
            library.window_deregister(channel.comm, window)
        library.mem_free(ptr)


def earliest_deadline(channels: Sequence[GpuChannel]) -> float | None:
    """When work waiting for every rank of ``channels`` gives up: their shortest timeout from now
    (None where none has one)."""
    timeouts = [channel.timeout for channel in channels if channel.timeout is not None]
    return time.monotonic() + min(timeouts) if timeouts else None


#: How often a thread waiting for library calls on helper threads looks for a failure or the deadline.
_POLL_SECONDS = 0.01


def on_threads(tasks: Sequence[Callable[[], None]], name: str, deadline: float | None = None,
               failed: Callable[[BaseException], None] | None = None,
               expired: Callable[[], None] | None = None) -> tuple[list[BaseException], bool]:
    """Run each task on a thread of its own (one task without a deadline on this thread) and wait for
    them all: (the failures, in the order they came; whether ``deadline`` passed before any failure
    came). Library calls that wait for other ranks run so: ``failed(exc)`` is called at the first
    failure and ``expired()`` at the deadline, each once, and must end the others' waits (an abort
    of their communicators). Without ``expired`` (a wait nothing can end: no communicator to abort
    yet), the deadline returns at once and the threads are left to finish on their own."""
    failures: list[BaseException] = []

    def guarded(task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:  # noqa: BLE001 - the caller raises it on its own thread
            failures.append(exc)

    if len(tasks) == 1 and deadline is None:
        guarded(tasks[0])
        return failures, False
    threads = [threading.Thread(target=guarded, args=(task,), name=f"{name}-{i}", daemon=True)
               for i, task in enumerate(tasks)]
    for thread in threads:
        thread.start()
    told = late = False
    for thread in threads:
        while thread.is_alive():
            if failures and not told and failed is not None:
                told = True
                failed(failures[0])
            if not late and not failures and deadline is not None and time.monotonic() >= deadline:
                late = True
                if expired is None:
                    return failures, late
                expired()
            thread.join(_POLL_SECONDS)
    return failures, late


def split_each(library: CollectiveLibrary, devices: Sequence[GpuDevice], parents: Sequence[Any],
               colors: Sequence[int | None], keys: Sequence[int], failed: Callable[[BaseException], None],
               blocking: bool = False, max_blocks: int | None = None, deadline: float | None = None) -> list[Any]:
    """Each rank's split of its parent communicator (on its device; None where its color is None),
    as the library takes them (``grouped_splits``): in one group, or one call per rank, each on a
    thread of its own when there are several (a blocking split returns once every rank of the parent
    split, so one thread calling them in turn would wait for itself). A rank's split that fails
    leaves the others waiting for it: ``failed(exc)`` is called at once (it aborts the parents, which
    ends their splits), and the first failure is raised once every thread returned; so does
    ``deadline`` (DeadlineExceededError), for splits that wait in their call (a blocking library's:
    a rank of another process that never splits). COMM_LOCK is held throughout (it is re-entrant): no
    abort from elsewhere frees a parent under a split."""
    with COMM_LOCK:
        if library.grouped_splits:
            made = []
            library.group_start()
            try:
                for device, parent, color, key in zip(devices, parents, colors, keys):
                    device.make_current()
                    made.append(library.split(parent, color, key, blocking=blocking, max_blocks=max_blocks))
            finally:
                library.group_end()
            return made
        results: list[Any] = [None] * len(parents)

        def split_one(i: int) -> None:
            devices[i].make_current()
            results[i] = library.split(parents[i], colors[i], keys[i], blocking=blocking, max_blocks=max_blocks)

        timeout = DeadlineExceededError("split: the other ranks did not split within the channel's timeout")
        failures, late = on_threads([functools.partial(split_one, i) for i in range(len(parents))], "hal-split",
                                    deadline=deadline, failed=failed, expired=lambda: failed(timeout))
        if failures or late:
            made = [comm for comm in results if comm is not None]
            _abort_all(library, made)
            raise timeout if late else failures[0]
        return results


def connect_at_init() -> None:
    """Have NCCL connect every algorithm when a communicator is made, unless the user said otherwise
    (``NCCL_RUNTIME_CONNECT``; NCCL reads it once, at its first communicator): see the module."""
    os.environ.setdefault("NCCL_RUNTIME_CONNECT", "0")


def _abort_all(library: CollectiveLibrary, comms: Sequence[Any]) -> None:
    with COMM_LOCK:
        for comm in comms:
            try:
                library.abort(comm)
            except HalError:
                pass


def warm_up(library: CollectiveLibrary, devices: Sequence[GpuDevice], comms: Sequence[Any],
            ranks: Sequence[tuple[int, int]], deadline: float | None, what: str, abort: Callable[[], None]) -> None:
    """Make every connection of ``comms`` (this process's ranks, each on its device, each's (rank,
    count) in ``ranks``) while all ranks take part: one grouped all-reduce and send/recv with every
    peer, enqueued and run within the deadline (see the module). If they are not, or anything
    fails once they may be enqueued, ``abort()`` aborts the communicators first: their kernels
    return before the work's buffers are freed."""
    if all(count < 2 for _, count in ranks):
        return
    work = []
    enqueued = False
    try:
        for device, (_, count) in zip(devices, ranks):
            device.make_current()
            api = device.api  # type: ignore[attr-defined]
            buffer = device.allocator.allocate(8 * 2 * count)
            work.append((device, api, api.stream_create(), api.event_create(), buffer, buffer.device_address))
        with COMM_LOCK:
            enqueued = True
            library.group_start()
            try:
                for (_, _, stream, _, _, ptr), comm, (rank, count) in zip(work, comms, ranks):
                    library.all_reduce(ptr, ptr, 1, "float32", "sum", comm, stream)
                    for peer in range(count):
                        if peer != rank:
                            library.send(ptr + 8 * peer, 8, "uint8", peer, comm, stream)
                            library.recv(ptr + 8 * (count + peer), 8, "uint8", peer, comm, stream)
            finally:
                library.group_end()
        poll_ready(library, comms, deadline, lambda: None, f"{what}: its first collectives")
        for device, api, stream, event, _, _ in work:
            device.make_current()
            api.event_record(event, stream)

        def complete() -> bool:
            for device, api, _, event, _, _ in work:
                device.make_current()
                if not api.event_query(event):
                    return False
            return True

        # (the kernels wait on the GPU for the other ranks' warm-up: bounded like the rest)
        poll_until(complete, deadline, lambda: None, f"{what}: its first collectives")
    except BaseException:
        if enqueued:
            abort()
        raise
    finally:
        for device, api, stream, event, buffer, _ in work:
            device.make_current()
            api.stream_synchronize(stream)  # (complete, or ended by the abort)
            api.stream_destroy(stream)
            api.event_destroy(event)
            buffer.release()
