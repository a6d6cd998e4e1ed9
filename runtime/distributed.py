"""Several devices working on one computation: process groups and collectives as lazy array ops.

A ``Group`` is this process's rank of a communicator (a ``hal.Channel``) on one device::

    group = rt.distributed.init("cuda")                  # ranks from torchrun's / MPI's environment
    groups = rt.distributed.groups(["cuda://0", "cuda://1"])   # one process, every local GPU

Its collectives are lazy ops like the others (``all_sum``, ``all_mean``, ``all_max``, ``all_min``,
``all_gather``, ``reduce_scatter``, ``broadcast``): they are recorded into the same command buffer
or graph as the computation around them, in dependency order, so a collective whose inputs are
ready runs beside the work that does not need it (a gradient's all-reduce beside the rest of the
backward pass in a graph command buffer). Every rank must build the same collectives in the same
order, as NCCL and MPI ask.

``average_gradients`` is data parallelism's step: the gradients averaged over the group in buckets
(last layer first, as they come out of the backward pass), one collective per bucket.
"""

from __future__ import annotations

import gc
import itertools
import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import hal

from . import dtypes as _dt
from . import ops
from .array_api import concat
from .device import context_for
from .errors import InvalidTypeError, InvalidValueError
from .graph import Node, new_node

if TYPE_CHECKING:
    from .array import Array

__all__ = ["Group", "all_gather", "all_max", "all_mean", "all_min", "all_sum", "average_gradients", "broadcast",
           "groups", "init", "reduce_scatter"]

#: Bucket size of ``average_gradients`` (PyTorch DDP's default).
BUCKET_BYTES = 25 << 20
#: Element types a collective moves (the HAL's channel types).
DTYPES = frozenset(("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                    "float16", "bfloat16", "float32", "float64"))

_ids = itertools.count(1)
_groups: dict[int, Group] = {}  # the collective nodes' params name their group by id (graph keys)
_lock = threading.Lock()


class Group:
    """This process's rank of a communicator on one device (``rank`` of ``size``)."""

    def __init__(self, channel: hal.Channel) -> None:
        self.channel = channel
        self.device = channel.device
        self.ctx = context_for(channel.device)
        self.rank = channel.rank
        self.size = channel.count
        #: The recordings holding this group's collectives (lowering/record.py adds them): released
        #: before the channel closes, as NCCL frees a communicator only once no graph holds its work.
        self.recordings: weakref.WeakSet = weakref.WeakSet()
        with _lock:
            self.id = next(_ids)
            _groups[self.id] = self

    def __repr__(self) -> str:
        return f"<rt.distributed.Group rank {self.rank} of {self.size} on {self.device.info.uri}>"

    def close(self) -> None:
        """Close the group: the recordings of its collectives are released (a compiled function or
        a cached evaluation using them raises ``FailedPreconditionError`` when called again), then
        the channel closes once the device is idle."""
        with _lock:
            _groups.pop(self.id, None)
        recordings = list(self.recordings)
        for rec in recordings:
            rec.drop()
        if recordings and self.ctx.is_gpu:
            self.ctx.forget_batches()
            gc.collect()  # command buffers in reference cycles: their graphs go now
        self.channel.close()


def init(device: Any = None, *, rank: int | None = None, size: int | None = None, id: bytes | None = None,
         timeout: float | None = hal.channel.DEFAULT_TIMEOUT) -> Group:
    """This process's group on ``device`` (a URI or a ``hal.Device``; None: the default device),
    rank and size from the launcher's environment unless given (``hal.create_channel``)."""
    ctx = context_for(device)
    return Group(hal.create_channel(ctx.device, rank=rank, count=size, id=id, timeout=timeout))


def groups(devices: Sequence[Any], *, timeout: float | None = hal.channel.DEFAULT_TIMEOUT) -> list[Group]:
    """One group per device, rank ``i`` on ``devices[i]``, all of one communicator: one process
    driving several devices (``hal.create_channels``)."""
    resolved = [context_for(d).device for d in devices]
    return [Group(channel) for channel in hal.create_channels(resolved, timeout=timeout)]


def group_of(group_id: int) -> Group:
    """The group a collective node names."""
    return _groups[group_id]


def _operand(x: Any, group: Group, name: str) -> Array:
    if not isinstance(group, Group):
        raise InvalidValueError(f"{name}: group must be an rt.distributed.Group, got {type(group).__name__}")
    if not isinstance(x, Node):
        raise InvalidTypeError(f"{name}: x must be an rt.Array, got {type(x).__name__}")
    if x.ctx is not group.ctx:
        raise InvalidValueError(f"{name}: the array is on {x.ctx.device.info.uri}, the group's rank on "
                                f"{group.device.info.uri}")
    if x.dtype.name not in DTYPES:
        raise InvalidTypeError(f"{name}: {x.dtype.name} arrays do not move through collectives "
                               f"(one of {', '.join(sorted(DTYPES))})")
    group.channel.check_usable(name)
    return ops.contiguous(x)


def _reduce(x: Any, group: Group, reduction: str, name: str) -> Array:
    x = _operand(x, group, name)
    if reduction in ("sum", "avg") and x.dtype is _dt.bool_:
        raise InvalidTypeError(f"{name} of a bool array: take any/all (all_max/all_min) or cast first")
    return new_node("collective", (x,), ("all_reduce", reduction, group.id, 0), x.shape, x.dtype, x.ctx)


def all_sum(x: Array, group: Group) -> Array:
    """x summed over every rank of ``group`` (each rank gets the sum)."""
    return _reduce(x, group, "sum", "all_sum")


def all_mean(x: Array, group: Group) -> Array:
    """x averaged over every rank of ``group`` (float types)."""
    if isinstance(x, Node) and not x.dtype.is_float:
        raise InvalidTypeError(f"all_mean of a {x.dtype.name} array: float types only (all_sum, then divide)")
    return _reduce(x, group, "avg", "all_mean")


def all_max(x: Array, group: Group) -> Array:
    """The element-wise maximum over every rank of ``group``."""
    return _reduce(x, group, "max", "all_max")


def all_min(x: Array, group: Group) -> Array:
    """The element-wise minimum over every rank of ``group``."""
    return _reduce(x, group, "min", "all_min")


def all_gather(x: Array, group: Group) -> Array:
    """Every rank's x stacked along a new first axis, in rank order: shape ``(size, *x.shape)``."""
    x = _operand(x, group, "all_gather")
    return new_node("collective", (x,), ("all_gather", None, group.id, 0), (group.size, *x.shape), x.dtype, x.ctx)


def reduce_scatter(x: Array, group: Group) -> Array:
    """x summed over every rank, then split along its first axis: rank r gets part r, of
    ``x.shape[0] // size`` rows (the first axis must divide evenly)."""
    x = _operand(x, group, "reduce_scatter")
    if x.ndim == 0 or x.shape[0] % group.size:
        raise InvalidValueError(f"reduce_scatter: the first axis of {x.shape} does not split into {group.size} parts")
    shape = (x.shape[0] // group.size, *x.shape[1:])
    return new_node("collective", (x,), ("reduce_scatter", "sum", group.id, 0), shape, x.dtype, x.ctx)


def broadcast(x: Array, group: Group, root: int = 0) -> Array:
    """The root rank's x on every rank (every rank passes an array of the same shape and type)."""
    x = _operand(x, group, "broadcast")
    if type(root) is not int or not 0 <= root < group.size:
        raise InvalidValueError(f"broadcast: root must be a rank in [0, {group.size}), got {root!r}")
    return new_node("collective", (x,), ("broadcast", None, group.id, root), x.shape, x.dtype, x.ctx)


def average_gradients(grads: Sequence[Array], group: Group, bucket_bytes: int = BUCKET_BYTES) -> list[Array]:
    """``grads`` averaged over ``group``: filled into buckets of up to ``bucket_bytes`` from the last
    gradient back (the order a backward pass makes them), one ``all_mean`` a bucket (a bucket of one
    gradient is reduced in place of a copy). Returns the averaged gradients in ``grads``' order."""
    grads = list(grads)
    if type(bucket_bytes) is not int or bucket_bytes < 1:
        raise InvalidValueError(f"average_gradients: bucket_bytes must be a positive int, got {bucket_bytes!r}")
    out: list = [None] * len(grads)
    bucket: list[int] = []
    size = 0

    def flush() -> None:
        if not bucket:
            return
        if len(bucket) == 1:
            out[bucket[0]] = all_mean(grads[bucket[0]], group)
        else:
            flat = concat([grads[i] for i in bucket], axis=None)
            averaged = all_mean(flat, group)
            start = 0
            for i in bucket:
                g = grads[i]
                out[i] = ops.reshape(averaged[start:start + g.size], g.shape)
                start += g.size
        bucket.clear()

    for i in reversed(range(len(grads))):
        g = grads[i]
        if not isinstance(g, Node) or not g.dtype.is_float:
            raise InvalidTypeError(f"average_gradients: gradient {i} is not a float rt.Array")
        nbytes = g.size * g.dtype.itemsize
        if bucket and (size + nbytes > bucket_bytes or g.dtype != grads[bucket[0]].dtype):
            flush()
            size = 0
        bucket.append(i)
        size += nbytes
    flush()
    return out
