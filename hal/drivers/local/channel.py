"""The CPU drivers' reference channel: the ranks of a communicator in one process meet in memory.

Each communicator is a ``Group`` of ranks (one channel per rank, each on its own CPU device or
not) keyed by its id. A collective that a submission reaches is posted to the group as an
``Arrival`` and the submission stops there (``hal.submission.Deferred``): no thread blocks, so
ranks driven by one thread (local-sync), by queue workers (local-task) or by a mix meet without
deadlock. The rank that arrives last computes the result for everyone with numpy, reducing in
rank order, and each rank's submission carries on, on its own queue.

Meetings are matched by order: the k-th collective each rank runs meets the others' k-th; the
k-th ``send`` from rank a to rank b meets b's k-th ``recv`` from a. The group checks that every
rank asked for the same operation (``CollectiveMismatchError`` otherwise). A meeting that does not
complete within the channel's timeout fails with ``DeadlineExceededError``; an ``abort()`` fails
everything in flight with ``AbortedError``. Either breaks the group: its later collectives fail
at once, as an NCCL communicator after an error. Channel creation waits, up to the timeout, for
every rank to join.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hal.channel import Channel, Collective, MeetingOrder, meeting_size, mismatch
from hal.errors import AbortedError, DeadlineExceededError, FailedPreconditionError, InvalidArgumentError
from hal.watchdog import WATCHDOG

if TYPE_CHECKING:
    from hal.device import Device

#: Called with None once the rank's part of the collective is done, or with the failure.
Done = Callable[[BaseException | None], None]
_NUMPY_DTYPES = {"bool": np.uint8, "bfloat16": np.uint16}


class Arrival:
    """One rank's part of a collective: its operation and its operand bytes (None: none here)."""

    __slots__ = ("rank", "op", "send", "recv", "done")

    def __init__(self, rank: int, op: Collective, send: np.ndarray | None, recv: np.ndarray | None,
                 done: Done) -> None:
        self.rank = rank
        self.op = op
        self.send = send
        self.recv = recv
        self.done = done


class Meeting:
    """The arrivals of one collective (or one send/recv pair) until all are there."""

    __slots__ = ("key", "expected", "arrivals", "deadline")

    def __init__(self, key: tuple, expected: int, deadline: float | None) -> None:
        self.key = key
        self.expected = expected
        self.arrivals: list[Arrival] = []
        self.deadline = deadline


class Group:
    """The ranks of one communicator in this process, where their collectives meet."""

    def __init__(self, key: object, count: int) -> None:
        self.key = key
        self.count = count
        self._lock = threading.Lock()
        self._joined = threading.Condition(self._lock)
        self.members: list[LocalChannel | None] = [None] * count
        self.failure: BaseException | None = None
        self._meetings: dict[tuple, Meeting] = {}
        #: Whether the watchdog holds an entry for this group (one at a time, at the earliest deadline).
        self._watched = False

    # -- membership --------------------------------------------------------------------
    def join(self, channel: LocalChannel, deadline: float | None) -> None:
        """Add ``channel`` as its rank; returns once every rank joined (DeadlineExceededError after the deadline)."""
        with self._lock:
            if self.members[channel.rank] is not None:
                raise InvalidArgumentError(f"rank {channel.rank} of channel group {self.key!r} already joined")
            self.members[channel.rank] = channel
            self._joined.notify_all()
            while any(member is None for member in self.members):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    self.members[channel.rank] = None
                    missing = [r for r, m in enumerate(self.members) if m is None]
                    raise DeadlineExceededError(
                        f"channel rank {channel.rank} of {self.count}: ranks {missing} did not join before the timeout "
                        "(the CPU drivers' channel connects ranks of one process: threads, or hal.create_channels)")
                self._joined.wait(left)

    def join_all(self, channels: Sequence[LocalChannel]) -> None:
        with self._lock:
            for channel in channels:
                self.members[channel.rank] = channel

    # -- collectives --------------------------------------------------------------------
    def post(self, key: tuple, expected: int, arrival: Arrival, timeout: float | None) -> None:
        """Add one rank's arrival; the last arrival runs the collective and tells every rank."""
        with self._lock:
            failure = self.failure
            if failure is None:
                meeting = self._meetings.get(key)
                if meeting is None:
                    deadline = None if timeout is None else time.monotonic() + timeout
                    meeting = self._meetings[key] = Meeting(key, expected, deadline)
                    if deadline is not None and not self._watched:
                        self._watched = True
                        WATCHDOG.watch(deadline, self)
                first = meeting.arrivals[0] if meeting.arrivals else None
                meeting.arrivals.append(arrival)
                failure = None if first is None else mismatch(first.rank, first.op, arrival.rank, arrival.op)
                if failure is None:
                    if len(meeting.arrivals) < meeting.expected:
                        return
                    del self._meetings[key]
        if failure is not None:
            if self.failure is failure:  # the group broke earlier: only this arrival fails
                arrival.done(failure)
            else:
                self.fail(failure)
            return
        try:
            run_collective(meeting.arrivals)
        except BaseException as exc:  # a numpy failure fails every rank of this collective
            for each in meeting.arrivals:
                each.done(exc)
            return
        for each in meeting.arrivals:
            each.done(None)

    def check_deadlines(self) -> None:
        """The watchdog: fail the group if an open meeting is past its deadline, else watch the next one."""
        with self._lock:
            deadlines = [(m.deadline, m.key) for m in self._meetings.values() if m.deadline is not None]
            if not deadlines:
                self._watched = False
                return
            deadline, key = min(deadlines)
            if deadline > time.monotonic():
                WATCHDOG.watch(deadline, self)
                return
            meeting = self._meetings[key]
            key = meeting.key
        arrived = sorted({a.rank for a in meeting.arrivals})
        missing = sorted(set(range(self.count)) - set(arrived)) if key[0] == "collective" else \
            [r for r in key[1:3] if r not in arrived] or list(key[1:3])
        self.fail(DeadlineExceededError(
            f"{meeting.arrivals[0].op}: ranks {arrived} waited for ranks {missing} beyond the channel timeout"))

    def fail(self, cause: BaseException) -> None:
        """Break the group: every open meeting and later collective fails with ``cause``."""
        with self._lock:
            if self.failure is None:
                self.failure = cause
            meetings, self._meetings = list(self._meetings.values()), {}
            members = [m for m in self.members if m is not None]
        for member in members:
            member.fail(cause)
        for meeting in meetings:
            for arrival in meeting.arrivals:
                arrival.done(cause)


class LocalChannel(Channel):
    """One rank of a ``Group`` (see the module)."""

    checks_matching = True

    def __init__(self, device: Device, rank: int, count: int, timeout: float | None, group: Group,
                 max_blocks: int | None = None) -> None:
        super().__init__(device, rank, count, timeout, max_blocks)  # (a CPU has no blocks to cap)
        self.group = group
        self.order = MeetingOrder(rank)
        self._order_lock = threading.Lock()  # (queue workers may start collectives of one rank at once)
        self._splits = itertools.count()

    def next_split(self) -> int:
        """The number of this rank's next split (every rank of the group splits in the same order)."""
        return next(self._splits)

    def start(self, op: Collective, send: np.ndarray | None, recv: np.ndarray | None, done: Done) -> None:
        """Post this rank's part of ``op`` (the next of its sequence); ``done`` is called once it completed."""
        failure = self.failure
        if failure is None and (self.closed or self.device.closed):
            failure = FailedPreconditionError(f"channel rank {self.rank} of {self.count} is closed")
        if failure is not None:
            done(failure)
            return
        with self._order_lock:
            key = self.order.next(op)
        self.group.post(key, meeting_size(key, self.count), Arrival(self.rank, op, send, recv, done), self.timeout)

    def _abort(self) -> None:
        self.group.fail(self.failure or AbortedError("channel aborted"))

    def _close(self) -> None:
        pass


def run_collective(arrivals: list[Arrival]) -> None:
    """Compute one collective over every rank's arrival (all present), reducing in rank order."""
    if arrivals[0].op.kind in ("send", "recv"):
        send = next(a for a in arrivals if a.op.kind == "send").send
        recv = next(a for a in arrivals if a.op.kind == "recv").recv
        recv[:] = send  # type: ignore[index]
        return
    by_rank = sorted(arrivals, key=lambda a: a.rank)
    op = by_rank[0].op
    chunk = op.count * op.element_size
    kind = op.kind
    if kind == "broadcast":
        data = by_rank[op.root].send.copy()  # type: ignore[index,union-attr]
        for a in by_rank:
            a.recv[:] = data  # type: ignore[index]
    elif kind == "all_gather":
        data = np.concatenate([a.send for a in by_rank])  # type: ignore[misc]
        for a in by_rank:
            a.recv[:] = data  # type: ignore[index]
    elif kind == "all_to_all":
        sends = [a.send.copy() for a in by_rank]  # type: ignore[union-attr]
        for r, a in enumerate(by_rank):
            a.recv[:] = np.concatenate([s[r * chunk:(r + 1) * chunk] for s in sends])  # type: ignore[index]
    else:
        reduced = reduce_in_rank_order(op, [a.send for a in by_rank])  # type: ignore[misc]
        if kind == "all_reduce":
            for a in by_rank:
                a.recv[:] = reduced  # type: ignore[index]
        elif kind == "reduce":
            by_rank[op.root].recv[:] = reduced  # type: ignore[index]
        else:  # reduce_scatter
            for r, a in enumerate(by_rank):
                a.recv[:] = reduced[r * chunk:(r + 1) * chunk]  # type: ignore[index]


def reduce_in_rank_order(op: Collective, sends: list[np.ndarray]) -> np.ndarray:
    """The bytes of ``sends`` (one array of bytes per rank) reduced element-wise, rank 0 first."""
    dtype = op.dtype
    values = [_elements(send, dtype) for send in sends]
    combine = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op.reduction]
    with np.errstate(all="ignore"):
        result = values[0].copy()
        for value in values[1:]:
            result = combine(result, value)
        if op.reduction == "avg":
            result = result / result.dtype.type(len(values))
    return _storage(result.astype(values[0].dtype, copy=False), dtype).view(np.uint8)


def _elements(data: np.ndarray, dtype: str) -> np.ndarray:
    """Bytes as elements to compute with (bfloat16 widened to float32)."""
    if dtype == "bfloat16":
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return data.view(_NUMPY_DTYPES.get(dtype, dtype))


def _storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """Computed elements in their storage format (float32 rounded to bfloat16, nearest even)."""
    if dtype != "bfloat16":
        return values
    bits = values.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


class LocalCollectives:
    """The ``device.collectives`` of the CPU drivers: groups of this process, by id."""

    name = "numpy reference (in-process)"
    #: Any number of ranks may use devices of one CPU (a GPU library wants one rank per GPU).
    ranks_share_devices = True
    #: Its channels compare the ranks' operations (``Channel.checks_matching``) and time out.
    checks_matching = True
    times_out = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: weakref.WeakValueDictionary[tuple, Group] = weakref.WeakValueDictionary()

    def new_id(self) -> bytes:
        return b"hal-local:" + uuid.uuid4().bytes

    def _group(self, id: bytes, count: int) -> Group:
        with self._lock:
            group = self._groups.get((id, count))
            if group is None or group.failure is not None:
                group = Group(id, count)
                self._groups[(id, count)] = group
            return group

    def create(self, device: Device, rank: int, count: int, id: bytes, timeout: float | None) -> Channel:
        group = self._group(id, count)
        channel = LocalChannel(device, rank, count, timeout, group)
        device.adopt_channel(channel)  # type: ignore[attr-defined]
        group.join(channel, None if timeout is None else time.monotonic() + timeout)
        return channel

    def create_all(self, devices: Sequence[Device], timeout: float | None) -> list[Channel]:
        group = Group(self.new_id(), len(devices))
        channels = [LocalChannel(device, rank, len(devices), timeout, group) for rank, device in enumerate(devices)]
        for device, channel in zip(devices, channels):
            device.adopt_channel(channel)  # type: ignore[attr-defined]
        group.join_all(channels)
        return channels  # type: ignore[return-value]

    def split(self, channels: Sequence[Channel], colors: Sequence[int | None], keys: Sequence[int],
              max_blocks: int | None = None) -> list:
        return split_local(channels, colors, keys, max_blocks)


class _Split:
    """The colors and keys of the ranks of one group's k-th split, until all are there."""

    def __init__(self) -> None:
        self.entries: dict[int, tuple[int | None, int, LocalChannel]] = {}
        self.result: dict[int, LocalChannel | None] | None = None


_splits: dict[tuple[int, int], _Split] = {}
_splits_cond = threading.Condition()


def split_local(channels: Sequence[Channel], colors: Sequence[int | None], keys: Sequence[int],
                max_blocks: int | None = None) -> list:
    """Split ranks of local groups: every rank of a group calls it (from threads, or all in one call)."""
    results = []
    pending = []
    with _splits_cond:
        for channel, color, key in zip(channels, colors, keys):
            if not isinstance(channel, LocalChannel):
                raise InvalidArgumentError("split: the channels belong to different drivers")
            group = channel.group
            number = channel.next_split()
            entry = _splits.setdefault((id(group), number), _Split())
            entry.entries[channel.rank] = (color, key, channel)
            pending.append((channel, group, number, entry))
            if len(entry.entries) == group.count:
                entry.result = _make_split(entry.entries, max_blocks)
                _splits_cond.notify_all()
        for channel, group, number, entry in pending:
            deadline = None if channel.timeout is None else time.monotonic() + channel.timeout
            while entry.result is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise DeadlineExceededError(
                        f"split of channel rank {channel.rank}: ranks "
                        f"{sorted(set(range(group.count)) - set(entry.entries))} did not split before the timeout")
                _splits_cond.wait(left)
            results.append(entry.result[channel.rank])
            entry.entries.pop(channel.rank, None)
            if not entry.entries:
                _splits.pop((id(group), number), None)
    return results


def _make_split(entries: dict[int, tuple[int | None, int, LocalChannel]],
                max_blocks: int | None) -> dict[int, LocalChannel | None]:
    result: dict[int, LocalChannel | None] = {}
    by_color: dict[int, list[tuple[int, int, LocalChannel]]] = {}
    for rank, (color, key, channel) in entries.items():
        if color is None:
            result[rank] = None
        else:
            by_color.setdefault(color, []).append((key, rank, channel))
    for members in by_color.values():
        members.sort()
        group = Group(uuid.uuid4().bytes, len(members))
        made = [LocalChannel(channel.device, new_rank, len(members), channel.timeout, group, max_blocks)
                for new_rank, (_, _, channel) in enumerate(members)]
        for channel in made:
            channel.device.adopt_channel(channel)  # type: ignore[attr-defined]
        group.join_all(made)
        for (_, rank, _), channel in zip(members, made):
            result[rank] = channel
    return result
