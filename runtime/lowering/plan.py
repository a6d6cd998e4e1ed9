"""The plan stage: what a recording runs and where every value it reads and writes lives.

Grad nodes are replaced by their backward graphs (``expand_grads``), the nodes are scheduled into
kernels (``fusion.schedule``: levels, fused groups, library routines), and every buffer gets a
unified index: the graph's external inputs first, then one buffer per node the eval materializes
(``fresh``: taken at each submission and attached to the node), then scratch (values nothing reads
after the eval, and kernels' temporaries), then constants bound directly. Scratch is taken at each
submission (``temps``), or owned by the recording: bound directly for rt.compile's (``fixed``), and
through the table after the fresh buffers for an eval's up to OWNED_SCRATCH (``tail``). Scratch a
kernel needs zeroed before its first launch and leaves zeroed (``ZeroedScratch``) is always owned. The
submissions of a context run one after another, so a recording's next submission may write the
scratch its last one used, as the buffer cache hands a freed buffer to the next submission at once.
Everything but the scratch bound directly and the constants is bound through the binding table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hal import env

from ..autodiff import GRAD, expand_noting, resolved
from ..buffer_cache import bucket_size
from ..graph import PLACEHOLDER, new_node, root_of
from ..kernels.source import ZeroedScratch
from ..shapes import contiguous_strides
from . import fusion

if TYPE_CHECKING:
    from ..array import Array
    from ..device import DeviceContext

#: Scratch bytes up to which an eval's recording owns its scratch buffers (held while it is cached)
#: rather than taking them from the buffer cache and giving them back at each submission.
OWNED_SCRATCH = env.integer("RUNTIME_OWNED_SCRATCH", 1 << 20, minimum=0)


class Plan:
    """Units to record and the unified buffer index of every value (see the module)."""

    __slots__ = ("order", "units", "deferred", "noted", "n_ext", "fresh", "temps", "fixed", "tail", "bound",
                 "captured", "index_of_node", "temp_index", "slot_of_root", "total", "table_slots")

    def __init__(self) -> None:
        self.order: list = []  # the nodes, backward graphs expanded
        self.units: list = []  # fusion.Unit, in node order
        self.deferred: list = []  # keys of the fused kernels it runs without until they are due
        self.noted: list = []  # constants whose values shaped the backward graphs or a GEMM's epilogue
        self.n_ext = 0
        self.fresh: list = []  # (index in the eval's order, bucket, bytes) of each materialized node
        self.temps: list = []  # buckets of the scratch taken at each submission
        self.fixed: dict = {}  # unified index -> (buffer, bucket) owned and bound directly
        self.tail: dict = {}  # unified index -> (buffer, bucket) owned and bound through the table
        self.bound: dict = {}  # unified index -> buffer of a constant bound directly
        self.captured: list = []  # the storages of those constants
        self.index_of_node: dict = {}  # index in `order` -> unified index
        self.temp_index: dict = {}  # (id(unit), temporary) -> unified index
        self.slot_of_root: dict = {}  # id(root) -> unified index
        self.total = 0  # unified indices in all
        self.table_slots: list = []  # the unified indices bound through the table, in table order


def plan(ctx: DeviceContext, order: list, externals: list, keep: int | None, owned: bool) -> Plan:
    """The plan of `order` (see the module). keep: bit i set when node i's value must be in a buffer
    afterwards (None: every node); owned: rt.compile's recording, which owns its scratch."""
    p = Plan()
    E = p.n_ext = len(externals)
    fuse = keep is not None and fusion.enabled(ctx)
    attach = alias = None
    if any(n.op == GRAD for n in order):
        order, keep, attach, alias, p.noted = expand_grads(order, keep)
    p.order = order
    p.units, buffered, p.deferred, noted = fusion.schedule(ctx, order, keep, fuse, alias, fuse_now=owned)
    p.noted += [c for c in noted if all(c is not n for n in p.noted)]
    keep_all = keep is None
    index_of_node = p.index_of_node
    # A node whose buffer a later node's output takes over (fusion's accumulations) gets that one's.
    shared = {unit.inplace: unit.first for unit in p.units if unit.inplace is not None}
    scratch = []
    k = E
    for i, node in enumerate(order):
        if not buffered[i] or i in shared:
            continue
        nb = max(1, node.size * node.dtype.itemsize)
        att = i if attach is None else attach[i]
        if att is None or not (keep_all or keep >> i & 1):  # read by nothing after the eval
            scratch.append((("node", i), nb))
            continue
        index_of_node[i] = k
        p.fresh.append((att, bucket_size(nb), nb))
        k += 1
    temps = [(("tmp", id(unit), t), nb) for unit in p.units for t, nb in enumerate(unit.temps)]
    scratch += [entry for entry in temps if type(entry[1]) is not ZeroedScratch]
    own_tail = not owned and sum(nb for _, nb in scratch) <= OWNED_SCRATCH
    windowed = symmetric_operands(order, p.units, alias) if owned else None
    # Zeroed scratch last: owned whatever the rest, so its unified indices follow the scratch
    # taken at each submission, as the table places the owned after it.
    zeroed = [entry for entry in temps if type(entry[1]) is ZeroedScratch]
    for what, nb in scratch + zeroed:
        if what[0] == "node":
            index_of_node[what[1]] = k
        else:
            p.temp_index[what[1:]] = k
        arena = windowed.get(what[1]) if windowed and what[0] == "node" else None
        piece = arena.take(nb) if arena is not None else None
        if piece is not None:  # (bucket 0: the arena's for good, never the buffer cache's)
            p.fixed[k] = (piece, 0)
        elif type(nb) is ZeroedScratch:
            (p.fixed if owned else p.tail)[k] = zeroed_buffer(ctx, nb)
        elif owned:
            p.fixed[k] = ctx.buffers.acquire(nb, host=False)
        elif own_tail:
            p.tail[k] = ctx.buffers.acquire(nb, host=False)
        else:
            p.temps.append(bucket_size(nb))
        k += 1
    for a, i in shared.items():
        index_of_node[a] = index_of_node[i]
    slot_of_root = p.slot_of_root
    for j, r in enumerate(externals):
        slot_of_root[id(r)] = j
    for i, s in index_of_node.items():
        slot_of_root[id(order[i])] = s
    for node in order:
        for inp in node.inputs:
            r = root_of(inp)
            st = r.storage
            if st is not None and id(r) not in slot_of_root:
                slot_of_root[id(r)] = k
                p.bound[k] = st.buffer
                p.captured.append(st)
                k += 1
    if alias:
        for gid, root in alias.items():
            slot_of_root[gid] = slot_of_root[id(root)]
    p.total = k
    p.table_slots = [s for s in range(k) if s not in p.fixed and s not in p.bound]
    return p


def symmetric_operands(order: list, units: list, alias: dict | None) -> dict[int, Any]:
    """Index in ``order`` -> the arena of the group whose all-reduce reads or writes that node, for
    the groups with symmetric memory (runtime/distributed.py): rt.compile's recording places those
    operands there, so that NCCL's symmetric kernels reduce them. ``alias``: id(gradient node) -> the
    node its backward graph computes it as (``expand_grads``)."""
    windowed: dict[int, Any] = {}
    position: dict[int, int] | None = None
    for unit in units:
        for cmd in unit.cmds:
            if cmd[0] != "collective" or cmd[1] != "all_reduce":
                continue
            arena = getattr(cmd[2], "arena", None)
            if arena is None:
                continue
            if position is None:
                position = {id(node): i for i, node in enumerate(order)}
            windowed[unit.first] = arena
            source = root_of(unit.node.inputs[0])
            if alias:  # (a gradient: the root of its backward graph's result)
                source = alias.get(id(source), source)
            index = position.get(id(source))
            if index is not None:
                windowed[index] = arena
    return windowed


def zeroed_buffer(ctx: DeviceContext, nbytes: int) -> tuple:
    """(buffer, bucket) of at least `nbytes` holding zeros, idle (no submission still uses it)."""
    buf, bucket = ctx.buffers.acquire(nbytes)
    ctx.device.write(buf, bytes(nbytes))
    return buf, bucket


def expand_grads(order: list, keep: int | None) -> tuple:
    """Replace grad nodes by their backward graphs: (order, keep, attach, alias, noted).

    Each grad node's value is computed into a contiguous root of the backward graph (a copy
    when the gradient is a strided view or a node of the forward graph); `alias` maps the
    grad node to that root for its consumers, `attach[i]` is the index in the original order
    whose array receives node i's buffer (None: scratch of the recording); `noted`: the constants
    whose values the backward graphs depend on.
    """
    grads = [n for n in order if n.op == GRAD]
    results, noted = expand_noting(grads)
    resolved(grads)
    in_order = {id(n) for n in order}
    alias: dict = {}
    roots: dict = {}  # id(grad node) -> root
    claimed: set = set()
    for g in grads:
        r = results[id(g)]
        base = root_of(r)
        usable = (base.storage is None and id(base) not in in_order and id(base) not in claimed
                  and base.size == g.size and r.offset == 0
                  and (r.strides is None or r.strides == contiguous_strides(r.shape)))
        if not usable:
            base = new_node("copy", (r,), g.dtype, g.shape, g.dtype, g.ctx)
        claimed.add(id(base))
        roots[id(g)] = base
        alias[id(g)] = base
    # Each grad node's backward nodes go where it was: everything they read (its forward graph,
    # the differentiated inputs) comes before it, and whatever reads the gradient comes after.
    grad_index = {id(n): i for i, n in enumerate(order) if n.op == GRAD}
    root_owner = {id(root): grad_index[gid] for gid, root in roots.items()}
    placed = set(in_order)
    new_order: list = []
    attach: list = []
    for i, n in enumerate(order):
        if n.op != GRAD:
            new_order.append(n)
            attach.append(i)
            continue
        for x in _pending_after(roots[id(n)], placed):
            new_order.append(x)
            attach.append(root_owner.get(id(x)))
    new_keep = None
    if keep is not None:  # what was kept stays kept (a grad node's root: if the grad node was)
        new_keep = 0
        for j, att in enumerate(attach):
            if att is not None and keep >> att & 1:
                new_keep |= 1 << j
        count = len(new_order)
        new_order, new_keep, attach = _live(new_order, new_keep, attach, alias)
        if len(new_order) < count:  # (a gradient nothing keeps or reads went with its backward graph)
            live = {id(n) for n in new_order}
            alias = {gid: root for gid, root in alias.items() if id(root) in live}
    return new_order, new_keep, attach, alias, noted


def _live(order: list, keep: int, attach: list, alias: dict) -> tuple[list, int, list]:
    """(order, keep, attach) without the nodes neither kept nor read by a node that stays: the
    forward value a gradient was taken of, where nothing else wants it (``rt.grad`` drops it).
    ``alias``: id(grad node) -> the root holding its value, for the nodes that read the gradient."""
    index = {id(n): i for i, n in enumerate(order)}
    for gid, root in alias.items():
        index[gid] = index[id(root)]
    needed = [False] * len(order)
    for i in range(len(order) - 1, -1, -1):
        if not (needed[i] or keep >> i & 1):
            continue
        needed[i] = True
        for inp in order[i].inputs:
            j = index.get(id(root_of(inp)))
            if j is not None:
                needed[j] = True
    if all(needed):
        return order, keep, attach
    live_keep = 0
    k = 0
    for i, on in enumerate(needed):
        if on:
            if keep >> i & 1:
                live_keep |= 1 << k
            k += 1
    return ([n for n, on in zip(order, needed) if on], live_keep,
            [a for a, on in zip(attach, needed) if on])


def _pending_after(root: Array, placed: set) -> list:
    """Pending nodes `root` depends on (itself included) not in `placed`, in dependency order;
    adds them to `placed`."""
    out = []
    stack = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in placed:
            continue
        if expanded:
            placed.add(id(node))
            out.append(node)
            continue
        stack.append((node, True))
        for inp in reversed(node.inputs):
            r = root_of(inp)
            if r.storage is None and r.op != PLACEHOLDER and id(r) not in placed:
                stack.append((r, False))
    return out
