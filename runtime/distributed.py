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
filled in the order the backward pass makes them (read off the pending graph), one NCCL group of
all-reduces a bucket, so that the buckets of the last layers start while the first layers'
gradients are computed.

Overlap: on GPUs a bandwidth-bound all-reduce beside a GEMM that fills the GPU in one wave only
waits for the GEMM's blocks to retire. ``init(..., symmetric_bytes=n)`` (or ``groups``) gives the
group ``n`` bytes of symmetric memory (``hal.allocate_symmetric``) and a second channel capped at
``OVERLAP_BLOCKS`` thread blocks, with ``n`` bytes of its own (``Group.overlapped``). Under
``rt.compile``, the operands of every bucket's all-reduce are then placed in that memory, and every
bucket but the last is reduced on the capped channel: NCCL's symmetric-memory kernels move it on a
few SMs beside the GEMMs of the rest of the backward pass; the last bucket, with nothing left to run
beside it, takes the whole GPU. Operands that do not fit go to ordinary memory, where the
collectives run as they would without it; the memory is not reused before the group closes
(``Arena``), so a step compiled again takes more of it.
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
from .autodiff import GRAD
from .device import context_for
from .errors import InvalidTypeError, InvalidValueError
from .graph import PLACEHOLDER, Node, new_node
from .lowering.key import collect
from .shapes import sequence_of
from .trees import constants, flatten, unflatten

if TYPE_CHECKING:
    from .array import Array

__all__ = ["Group", "all_gather", "all_max", "all_mean", "all_min", "all_sum", "average_gradients", "broadcast",
           "buckets", "groups", "init", "reduce_scatter"]

#: Bucket size of ``average_gradients`` (PyTorch DDP's default).
BUCKET_BYTES = 25 << 20
#: A bucket holding at least this much is closed when the next gradient comes later in the backward
#: pass than all of its own: its all-reduce then starts beside the computation of the later ones
#: (smaller buckets wait for more: a collective of a few kilobytes costs its latency whatever it holds).
EARLY_BUCKET_BYTES = 1 << 20
#: Thread blocks of ``Group.overlapped``'s channel: four blocks of one SM fit beside a GEMM of 128
#: blocks on a GPU of 132 SMs (H100, H200), and NCCL's symmetric kernels move 16 MB in about 107 us
#: on them, against 72 us on the whole GPU (docs/distributed.md).
OVERLAP_BLOCKS = 4
#: Element types a collective moves (the HAL's channel types).
DTYPES = frozenset(("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                    "float16", "bfloat16", "float32", "float64"))

_ids = itertools.count(1)
_groups: dict[int, Group] = {}  # the collective nodes' params name their group by id (graph keys)
_lock = threading.Lock()


class Arena:
    """A group's symmetric memory, handed out in aligned pieces from its start (``take``), never
    taken back before the group closes. NCCL's symmetric kernels find a peer's operand at the
    local operand's offset in the peer's window, so every rank's pieces must lie alike: every rank
    plans the same graphs in the same order, and so takes the same pieces, while reusing a piece
    would follow when each rank's Python let go of a recording. A piece that does not fit is None
    (the operand goes to ordinary memory)."""

    ALIGN = 4096

    def __init__(self, buffer: hal.Buffer) -> None:
        self.buffer = buffer
        self.used = 0  # bytes handed out, from the start
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> hal.Buffer | None:
        """The next piece of ``nbytes`` (aligned), or None when the rest does not hold it."""
        length = -(-nbytes // self.ALIGN) * self.ALIGN
        with self._lock:
            offset = self.used
            if offset + length > self.buffer.size:
                return None
            self.used = offset + length
        return self.buffer.subspan(offset, nbytes)


class Group:
    """This process's rank of a communicator on one device (``rank`` of ``size``).

    ``arena``: its symmetric memory (None without ``symmetric_bytes``); ``overlapped``: the group of
    the same ranks on a channel capped at ``OVERLAP_BLOCKS`` blocks, with an arena of its own (see
    the module), or None."""

    def __init__(self, channel: hal.Channel, arena: Arena | None = None) -> None:
        self.channel = channel
        self.arena = arena
        self.overlapped: Group | None = None
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
        if self.overlapped is not None:
            self.overlapped.close()
        with _lock:
            _groups.pop(self.id, None)
        recordings = list(self.recordings)
        for rec in recordings:
            rec.drop()
        if recordings and self.ctx.is_gpu:
            self.ctx.forget_batches()
            gc.collect()  # command buffers in reference cycles: their graphs go now
        if self.arena is not None:
            self.arena.buffer.release()  # (its window is deregistered once the work before is done)
        self.channel.close()


def init(device: Any = None, *, rank: int | None = None, size: int | None = None, id: bytes | None = None,
         timeout: float | None = hal.channel.DEFAULT_TIMEOUT, symmetric_bytes: int = 0) -> Group:
    """This process's group on ``device`` (a URI or a ``hal.Device``; None: the default device),
    rank and size from the launcher's environment unless given (``hal.create_channel``).
    ``symmetric_bytes``: symmetric memory for overlapped gradient buckets (see the module)."""
    ctx = context_for(device)
    symmetric_bytes = _check_symmetric_bytes(symmetric_bytes)
    channel = hal.create_channel(ctx.device, rank=rank, count=size, id=id, timeout=timeout)
    return _with_overlap([channel], symmetric_bytes)[0]


def groups(devices: Sequence[Any], *, timeout: float | None = hal.channel.DEFAULT_TIMEOUT,
           symmetric_bytes: int = 0) -> list[Group]:
    """One group per device, rank ``i`` on ``devices[i]``, all of one communicator: one process
    driving several devices (``hal.create_channels``). ``symmetric_bytes``: as ``init``'s."""
    symmetric_bytes = _check_symmetric_bytes(symmetric_bytes)
    resolved = [context_for(d).device for d in devices]
    return _with_overlap(hal.create_channels(resolved, timeout=timeout), symmetric_bytes)


def _check_symmetric_bytes(symmetric_bytes: object) -> int:
    try:
        return hal.checks.check_int(symmetric_bytes, "symmetric_bytes")
    except hal.InvalidArgumentError as exc:
        raise InvalidValueError(str(exc.message)) from None


def _with_overlap(channels: list[hal.Channel], symmetric_bytes: int) -> list[Group]:
    """Groups of ``channels`` (this process's ranks of one communicator); with ``symmetric_bytes``,
    each with its arena and its overlapped group (every rank makes them together). On failure the
    channels made here are closed."""
    if not symmetric_bytes:
        return [Group(channel) for channel in channels]
    made = list(channels)
    try:
        arenas = hal.allocate_symmetric(channels, symmetric_bytes)
        capped = hal.split_channels(channels, [0] * len(channels), [c.rank for c in channels],
                                    max_blocks=OVERLAP_BLOCKS)
        made += capped  # type: ignore[arg-type]
        capped_arenas = hal.allocate_symmetric(capped, symmetric_bytes)  # type: ignore[arg-type]
    except BaseException:
        for channel in made:
            channel.close()  # (their buffers go with their devices' memory)
        raise
    result = []
    for channel, arena, sub, sub_arena in zip(channels, arenas, capped, capped_arenas):
        group = Group(channel, Arena(arena))
        group.overlapped = Group(sub, Arena(sub_arena))  # type: ignore[arg-type]
        result.append(group)
    return result


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


def _reduce(x: Any, group: Group, reduction: str, name: str, after: tuple = ()) -> Array:
    """The all-reduce node of ``x``. ``after``: arrays it waits for without reading them (inputs
    past the first), so that collectives waiting for the same arrays share a dependency level and
    go out as one NCCL group (``average_gradients``' buckets)."""
    x = _operand(x, group, name)
    if reduction in ("sum", "avg") and x.dtype is _dt.bool_:
        raise InvalidTypeError(f"{name} of a bool array: take any/all (all_max/all_min) or cast first")
    return new_node("collective", (x, *after), ("all_reduce", reduction, group.id, 0), x.shape, x.dtype, x.ctx)


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


def average_gradients(grads: Any, group: Group, bucket_bytes: int = BUCKET_BYTES) -> Any:
    """``grads`` averaged over ``group``: one NCCL group of all-reduces a bucket. ``grads`` is a list
    of gradients, or any tree of them (``rt.grad``'s gradient of a dict or namedtuple of parameters,
    None where the parameters held no array); the result has the same structure.

    Buckets hold up to ``bucket_bytes`` of one element type, filled in the order the gradients
    become ready (``readiness``: their depth in the pending graph; the last gradient first among
    equals, as a backward pass makes them). A bucket of at least ``EARLY_BUCKET_BYTES`` closes where
    the next gradient is deeper, so that its all-reduce runs beside the rest of the backward pass (as
    PyTorch DDP's buckets, rebuilt in the order its hooks saw the gradients). Every rank builds the
    same graph, so every rank makes the same buckets.

    A bucket is not copied into one buffer (a concatenation moves every byte twice more: into the
    bucket, and out of it into each gradient's own array): each gradient is reduced where it is, by its own
    all-reduce waiting for the whole bucket, so that the bucket's all-reduces share a dependency
    level and go out as one group, which NCCL runs as one launch (PyTorch's coalesced collectives)."""
    if not isinstance(group, Group):  # (checked before the buckets: each gradient's reduce checks it again)
        raise InvalidValueError(f"average_gradients: group must be an rt.distributed.Group, got {type(group).__name__}")
    if isinstance(grads, Node):
        raise InvalidTypeError("average_gradients takes a sequence of gradients, not one array")
    if isinstance(grads, (list, tuple, dict)):
        grads_given: list = []
        structure = flatten(grads, grads_given)
        grads = grads_given
        for value in constants(structure):  # (None: a parameter tree's place without an array)
            if value is not None:
                raise InvalidTypeError(f"average_gradients: a {type(value).__name__} where a gradient (a float "
                                       "rt.Array) or None was expected")
    else:
        structure = None
        grads = list(sequence_of(grads, "average_gradients' grads"))
    out: list = [None] * len(grads)
    made = _buckets(grads, bucket_bytes, "average_gradients")
    for number, bucket in enumerate(made):
        # (every bucket but the last on the capped channel, where the group has one: see the module)
        on = group.overlapped if group.overlapped is not None and number < len(made) - 1 else group
        for i in bucket:
            others = tuple(grads[j] for j in bucket if j != i)
            if on.arena is None:
                out[i] = _reduce(grads[i], on, "avg", "average_gradients", after=others)
            else:  # NCCL's symmetric kernels sum but do not average: the division fuses into the consumer
                out[i] = _reduce(grads[i], on, "sum", "average_gradients", after=others) / on.size
    return out if structure is None else unflatten(structure, out)


def buckets(grads: Sequence[Array], bucket_bytes: int = BUCKET_BYTES) -> list[list[int]]:
    """The buckets ``average_gradients`` makes of ``grads``: lists of indices into ``grads``."""
    return _buckets(list(grads), bucket_bytes, "buckets")


def _buckets(grads: list, bucket_bytes: int, name: str) -> list[list[int]]:
    if type(bucket_bytes) is not int or bucket_bytes < 1:
        raise InvalidValueError(f"{name}: bucket_bytes must be a positive int, got {bucket_bytes!r}")
    for i, g in enumerate(grads):
        if not isinstance(g, Node) or not g.dtype.is_float:
            raise InvalidTypeError(f"{name}: gradient {i} is not a float rt.Array")
    depth = readiness(grads)
    order = sorted(range(len(grads)), key=lambda i: (depth[i], -i))
    out: list[list[int]] = []
    bucket: list[int] = []
    size = 0
    for i in order:
        g = grads[i]
        nbytes = g.size * g.dtype.itemsize
        if bucket and (size + nbytes > bucket_bytes or g.dtype != grads[bucket[0]].dtype
                       or (size >= EARLY_BUCKET_BYTES and depth[i] > depth[bucket[-1]])):
            out.append(bucket)
            bucket, size = [], 0
        bucket.append(i)
        size += nbytes
    if bucket:
        out.append(bucket)
    return out


def readiness(arrays: Sequence[Array]) -> list[int]:
    """Per array, the dependency level a schedule by levels computes it at: 0 when computed (or a
    traced input), else one more than the deepest pending array it reads. A pending gradient
    (``rt.grad``'s lazy node, whose backward graph is built only when an evaluation records it)
    comes as far after its value as its input lies from the value: the backward pass reaches an
    input one step per forward op on the longest path between them."""
    arrays = list(arrays)
    for i, a in enumerate(arrays):
        if not isinstance(a, Node):
            raise InvalidTypeError(f"readiness: item {i} is not an rt.Array, got {type(a).__name__}")
    roots = [a.base if a.base is not None else a for a in arrays]
    depth: dict[int, int] = {}  # id(pending root) -> its level; computed arrays and inputs are 0
    distances: dict[int, dict[int, int]] = {}  # id(value) -> the longest paths up to it (_distances)
    for node in collect(roots):  # every pending root after those it reads
        if node.storage is not None or node.op == PLACEHOLDER:
            continue
        if node.op == GRAD:  # reached from its value, not from the inputs it lists
            value, wrt = node.inputs[0], node.inputs[1 + node.params[0]]
            value = value.base if value.base is not None else value
            far = distances.get(id(value))
            if far is None:
                far = distances[id(value)] = _distances(value)
            depth[id(node)] = depth.get(id(value), 0) + far.get(id(wrt), 0) + 1
        else:
            depth[id(node)] = 1 + max((depth.get(id(inp.base if inp.base is not None else inp), 0)
                                       for inp in node.inputs), default=0)
    return [depth.get(id(root), 0) for root in roots]


def _distances(value: Node) -> dict[int, int]:
    """id(node) -> the ops on the longest path from it up to ``value`` in the pending forward graph
    (the arrays as ops read them, views included, as the gradient rules walk them)."""
    order: list = []  # post-order: every node after the nodes it reads
    seen: set[int] = set()
    stack = [(value, False)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            order.append(n)
            continue
        if id(n) in seen:
            continue
        seen.add(id(n))
        stack.append((n, True))
        if n.storage is None and n.op is not None and n.op != PLACEHOLDER:
            stack.extend((inp, False) for inp in n.inputs if id(inp) not in seen)
    far = {id(value): 0}
    for n in reversed(order):  # consumers before what they read
        d = far.get(id(n))
        if d is None or n.storage is not None or n.op is None or n.op == PLACEHOLDER:
            continue
        for inp in n.inputs:
            if far.get(id(inp), -1) < d + 1:
                far[id(inp)] = d + 1
    return far
