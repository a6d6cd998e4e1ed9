"""Collectives compared across processes (``HAL_COLLECTIVE_CHECKS=1``): a debugging aid.

A channel whose every rank this process drives compares its ranks' operations as each rank issues
them (``Meetings``, channel.py). Ranks in other processes are out of that sight: NCCL itself cannot
tell that two ranks asked for different operations, and waits for ever or reduces the wrong bytes.
With ``HAL_COLLECTIVE_CHECKS=1`` in every rank's environment when its channels are made, each
submission's collectives are compared with the other ranks' before they are issued
(``Exchanges``): every rank all-gathers a digest of them (kinds, element types, counts, reductions
and roots, in order) on the channel's own communicator and the issuing stream, waits for it within
the channel's timeout, and issues its collectives only if every rank's digest is its own. A
mismatch fails the submission with ``CollectiveMismatchError`` on every rank, nothing of it issued;
a rank that never takes part ends the others' checks with ``DeadlineExceededError``.

It costs a small collective and a host wait per submission, as PyTorch's
``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does: for finding which operation differs, not for production.
Sends and receives pair different operations on their two ranks and are not compared; a
submission with nothing else exchanges nothing.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hal import env
from hal.channel import Collective, CollectiveMismatchError, MeetingOrder
from hal.drivers.gpu.event_pool import poll_event
from hal.errors import DeadlineExceededError, HalError

#: The environment switch that turns the comparison on for the channels made afterwards.
SWITCH = "HAL_COLLECTIVE_CHECKS"
#: Bytes each rank contributes: its digest of the submission's collectives, and their number.
ENTRY = 16


def enabled() -> bool:
    """Whether channels made now compare their collectives with other processes' ranks."""
    return env.switch(SWITCH, False)


def digest(ops: Sequence[Collective]) -> np.ndarray:
    """A rank's entry: a digest of ``ops`` (the same in every process, unlike ``hash``) and their number."""
    text = "|".join(map(str, ops)).encode()
    value = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
    return np.array([value, len(ops)], np.uint64)


class Exchanges:
    """The comparison of one channel's collectives with its peers' in other processes (see the module):
    the ``meetings`` of such a channel. Its device memory (each rank's entry, then every rank's) is
    made at the first comparison and freed by ``release`` when the channel closes, after its
    communicator (an exchange cut short by the timeout may still write it until then)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel  # the GpuChannel (its communicator, library, device and timeout)
        self.count = channel.count
        self._lock = threading.Lock()
        self._memory: int | None = None

    def meet(self, rank: int, order: MeetingOrder, ops: Sequence[Collective], api: Any,
             stream: Any) -> HalError | None:
        """Compare ``ops``, this rank's collectives of a submission being issued on ``stream`` (with
        the queue's lock held), with every other rank's: None, or the error the submission fails with."""
        checked = [op for op in ops if op.kind not in ("send", "recv")]
        if not checked:
            return None
        channel = self.channel
        count = self.count
        mine = digest(checked)
        entries = np.zeros((count, 2), np.uint64)
        with self._lock:
            if self._memory is None:
                self._memory = api.mem_alloc(ENTRY * (count + 1))
            memory = self._memory
            event = api.event_create()
            try:
                api.memcpy_htod(memory, mine.ctypes.data, ENTRY)
                channel.library.all_gather(memory, memory + ENTRY, ENTRY, "uint8", channel.comm, stream)
                api.event_record(event, stream)
                deadline = None if channel.timeout is None else time.monotonic() + channel.timeout
                if not poll_event(api, event, deadline):
                    return DeadlineExceededError(
                        f"comparing collectives ({SWITCH}): the other ranks of channel rank {rank} of {count} did "
                        "not compare theirs within the channel's timeout")
                api.memcpy_dtoh(entries.ctypes.data, memory + ENTRY, ENTRY * count)
            finally:
                api.event_destroy(event)
        for other, entry in enumerate(entries):
            if other != rank and (entry != mine).any():
                ran = ", ".join(map(str, checked))
                return CollectiveMismatchError(
                    f"rank {other} submitted other collectives than rank {rank}, which runs {ran} ({SWITCH})")
        return None

    def release(self, device: Any) -> None:
        """Free its device memory (the channel's communicator is gone: nothing writes it any more)."""
        memory, self._memory = self._memory, None
        if memory is not None:
            try:
                device.make_current()
                device.api.mem_free(memory)
            except HalError:  # a lost context took it with it
                pass
