"""Finding row groups in an op graph: reductions over the last axes with the elementwise ops around them.

A row group is a set of nodes over one (O, N) index space that one row program
(`kernels/rows.py`) computes: reductions over the trailing axes of an O*N-element
value (sum, mean, max, min of floats), the elementwise nodes of O*N elements that
feed them or read their results broadcast along the rows (prologue and epilogue),
and elementwise nodes over the O per-row values. Several reductions over the same
rows join one group, so they share one pass (softmax's max and sum, layer norm's
mean and variance).

The search runs over the graph in topological order:
- a reduction joins the group of the value it reduces, or starts a group, which
  then takes in the elementwise nodes producing its operand (its prologue, found
  backwards);
- an elementwise node joins the group whose members it reads (merging the groups
  of one space it reads) when every operand is readable in the program: a member
  element for element or broadcast along the rows, or anything else as a 2-D
  strided view (inputs, other kernels' results); a full one then takes in the
  elementwise nodes producing its other full operands, as a reduction does.

A group must be computable by one kernel at one level: no path may leave the
group and come back. A node outside the group that a member reads either comes
before the group's first member in the order, or comes after it (a backward
pass's order interleaves the rows' work with small independent ops, such as the
cotangent's negation or a padded row vector) and then neither it nor what it
reads after the first member belongs to a row group or a GEMM's epilogue: the
scheduler places those nodes (``RowGroup.late``) before the group. Members
nothing outside the group reads stay on chip; the others are the program's
outputs.
"""

from __future__ import annotations

from .. import dtypes as _dt
from ..kernels import fused, rows
from ..ops import ELEMENTWISE
from ..shapes import broadcast_strides, single_stride, size_of
from .layouts import strides_of

REDUCE_OPS = frozenset(("sum", "mean", "max", "min"))
#: Nodes a group's externals after its first member may span (``_Search.late``): past it, the group
#: gives up the member it was adding (a bound on the walk in graphs of thousands of nodes).
LATE_NODES = 64
#: Types a member may have (its value and its compute type) and an input may be read as.
DTYPES = frozenset((_dt.float16, _dt.bfloat16, _dt.float32, _dt.float64, _dt.int32, _dt.bool_))


class RowGroup:
    """Nodes (indices into the order) computed by one row program over O rows of N elements."""

    __slots__ = ("O", "N", "full", "ext", "late", "unit")

    def __init__(self, O: int, N: int) -> None:  # noqa: E741
        self.O, self.N = O, N
        self.full: dict = {}  # member index -> whether it holds a value per element
        self.ext: dict = {}  # index of a node outside the group a member reads -> readers
        self.late: list = []  # nodes after the first member the group waits for, in order (_Search.late)
        self.unit = None  # the scheduler's unit for the group

    @property
    def members(self) -> list:
        return sorted(self.full)

    def first(self) -> int:
        return min(self.full)


# ---- how an operand is read ---------------------------------------------------------------------

def _layout(inp, consumer_shape: tuple, O: int, N: int, full: bool):  # noqa: E741
    """(offset, so, sn) reading `inp` at element (o, n) of a full consumer of `consumer_shape` (or at
    row o of a row consumer): offset + o*so + n*sn; None when the view has no such form."""
    bstr = broadcast_strides(inp.shape, strides_of(inp), consumer_shape)
    if not full:
        so = single_stride(consumer_shape, bstr)
        return None if so is None else (inp.offset, so if O > 1 else 0, 0)
    prod = 1
    for k in range(len(consumer_shape) + 1):
        if prod == O and size_of(consumer_shape[k:]) == N:
            so = single_stride(consumer_shape[:k], bstr[:k])
            sn = single_stride(consumer_shape[k:], bstr[k:])
            if so is None or sn is None:
                return None
            return inp.offset, so if O > 1 else 0, sn
        if k < len(consumer_shape):
            prod *= consumer_shape[k]
    return None


def _kind(so: int, sn: int, full: bool) -> str:
    if not full:
        return "r" if so else "s"
    if sn == 0:
        return "r" if so else "s"
    return "v" if sn == 1 else "e"


class _Search:
    def __init__(self, order: list, index: dict, skip) -> None:
        self.order, self.index, self.skip = order, index, skip
        self.group_of: dict = {}

    def operands(self, i: int, G: RowGroup, full: bool):
        """Per input of node i as a member of G: ("m", j) or ("x", layout, producer); None if unreadable."""
        node = self.order[i]
        out = []
        if node.op in REDUCE_OPS:
            inp = node.inputs[0]
            layout = _layout(inp, inp.shape, G.O, G.N, True)
            if layout is None:
                return None
            j = self.index.get(id(inp.root))
            if j is not None and j in G.full:
                if not (G.full[j] and _identity(layout, G)):
                    return None
                return [("m", j)]
            return [("x", layout, j)]
        for inp in node.inputs:
            if inp.dtype not in DTYPES:
                return None
            layout = _layout(inp, node.shape, G.O, G.N, full)
            if layout is None:
                return None
            j = self.index.get(id(inp.root))
            if j is not None and j in G.full:
                if G.full[j] and not (full and _identity(layout, G)):
                    return None
                if not G.full[j] and not _row_broadcast(layout, G):
                    return None
                out.append(("m", j))
            else:
                out.append(("x", layout, j))
        return out

    def add(self, G: RowGroup, i: int, full: bool) -> bool:
        """Add node i to G if it is readable there, G has room (``kernels.fused.MAX_OPS``) and stays valid."""
        if len(G.full) >= fused.MAX_OPS:
            return False
        ops = self.operands(i, G, full)
        if ops is None:
            return False
        G.full[i] = full
        added = []
        for op in ops:
            if op[0] == "x" and op[2] is not None:
                G.ext[op[2]] = G.ext.get(op[2], 0) + 1
                added.append(op[2])
        moved = G.ext.pop(i, None)
        # Members that read i as an external (a producer pulled in after its readers) must read it as
        # a member can be read: element for element, or a row value along the rows (not reversed,
        # transposed or offset, which only an external's strided view allows).
        if (moved is None or self.readable_by_members(G, i)) and self.late(G) is not None:
            return True
        del G.full[i]  # undo
        for j in added:
            G.ext[j] -= 1
            if not G.ext[j]:
                del G.ext[j]
        if moved is not None:
            G.ext[i] = moved
        return False

    def readable_by_members(self, G: RowGroup, i: int) -> bool:
        """Whether every member of G reading node i (now a member) reads it as a member."""
        node = self.order[i]
        return all(self.operands(m, G, G.full[m]) is not None for m in G.full
                   if m != i and any(inp.root is node for inp in self.order[m].inputs))

    def pull(self, G: RowGroup, j) -> None:
        """Take the elementwise node j producing a full operand of G into G, then its own producers,
        depth first (a stack, not recursion: a chain of thousands of ops raised RecursionError)."""
        stack = [j]
        while stack:
            j = stack.pop()
            if j is None or j in self.skip or j in self.group_of or j in G.full:
                continue
            node = self.order[j]
            if not _elementwise(node) or node.size != G.O * G.N:
                continue
            # Only a producer read element for element by its reader in G joins (checked where pushed).
            if not self.add(G, j, True):
                continue
            producers = []
            for inp in node.inputs:
                p = self.index.get(id(inp.root))
                if p is None or p in G.full:
                    continue
                producer = self.order[p]
                layout = _layout(inp, node.shape, G.O, G.N, True)
                if layout is not None and producer.size == G.O * G.N and _identity(layout, G):
                    producers.append(p)
            stack.extend(reversed(producers))  # the first input's producers first, as recursion would

    def merge(self, groups: list):
        """One group of every group in `groups` (of one space), or None if they cannot be one."""
        G = groups[0]
        if any((H.O, H.N) != (G.O, G.N) for H in groups[1:]) or sum(len(H.full) for H in groups) > fused.MAX_OPS:
            return None
        M = RowGroup(G.O, G.N)
        for H in groups:
            M.full.update(H.full)
        for H in groups:
            for j, n in H.ext.items():
                if j not in M.full:
                    M.ext[j] = M.ext.get(j, 0) + n
        if not all(self.operands(m, M, M.full[m]) is not None for m in M.full):
            return None  # (a member reading another group's member through a view no member allows)
        return M if self.late(M) is not None else None

    def late(self, G: RowGroup) -> list | None:
        """The nodes after G's first member that G's externals are or read, in order; None when G
        cannot be one kernel: one of them is G's member, a row group's or a GEMM epilogue's (or they
        span more than LATE_NODES nodes)."""
        first = G.first()
        stack = [j for j in G.ext if j > first]
        if not stack:
            return []
        seen: set = set()
        order, index, group_of, skip = self.order, self.index, self.group_of, self.skip
        while stack:
            j = stack.pop()
            if j in seen:
                continue
            if j in G.full or j in group_of or j in skip or len(seen) >= LATE_NODES:
                return None
            seen.add(j)
            for inp in order[j].inputs:
                p = index.get(id(inp.root))
                if p is None:
                    continue
                if p in G.full or p in skip:  # (G's first member; a GEMM's, placed with it, maybe later)
                    return None
                if p > first and p not in seen:
                    stack.append(p)
        return sorted(seen)

    def register(self, G: RowGroup) -> None:
        for j in G.full:
            self.group_of[j] = G

    def run(self) -> dict:
        order, index = self.order, self.index
        for i, node in enumerate(order):
            if i in self.skip:
                continue
            if _reduction(node):
                inp = node.inputs[0]
                O = size_of(node.shape)  # noqa: E741
                N = size_of(inp.shape) // max(O, 1)
                if O == 0 or N <= 1:
                    continue
                j = index.get(id(inp.root))
                G = self.group_of.get(j) if j is not None else None
                if G is not None and (G.O, G.N) == (O, N) and self.add(G, i, False):
                    self.group_of[i] = G
                    continue
                G = RowGroup(O, N)
                if self.add(G, i, False):
                    if j is not None and order[j].size == O * N:
                        layout = _layout(inp, inp.shape, O, N, True)
                        if layout is not None and _identity(layout, G):
                            self.pull(G, j)
                    self.register(G)
                continue
            if not _elementwise(node):
                continue
            read = []
            for inp in node.inputs:
                j = index.get(id(inp.root))
                G = self.group_of.get(j) if j is not None else None
                if G is not None and G not in read:
                    read.append(G)
            if not read:
                continue
            G = read[0] if len(read) == 1 else self.merge(read)
            if G is None:
                continue
            if node.size == G.O * G.N:
                full = True
            elif node.size == G.O:
                full = False
            else:
                continue
            if self.add(G, i, full):
                if full:  # its other full operands' elementwise producers too (a backward pass's
                    for inp in node.inputs:  # cotangent, scaled, negated: made before the rows' work)
                        j = index.get(id(inp.root))
                        if j is not None and j not in G.full and order[j].size == G.O * G.N:
                            layout = _layout(inp, node.shape, G.O, G.N, True)
                            if layout is not None and _identity(layout, G):
                                self.pull(G, j)
                self.register(G)
        # What a group waits for after its first member, now that every group is whole (a node pulled
        # into a group after another group found it plain makes that group two kernels: it goes).
        late: dict = {}
        for G in self.group_of.values():
            if len(G.full) > 1 and id(G) not in late:
                late[id(G)] = G.late = self.late(G)
        return {i: G for i, G in self.group_of.items() if late.get(id(G)) is not None}


def _identity(layout, G: RowGroup) -> bool:
    """Whether a layout reads element (o, n) of a full member at the consumer's (o, n)."""
    off, so, sn = layout
    return off == 0 and (G.O == 1 or so == G.N) and sn == 1


def _row_broadcast(layout, G: RowGroup) -> bool:
    """Whether a layout reads row o of a row member at every element of the consumer's row o."""
    off, so, sn = layout
    return off == 0 and so == (1 if G.O > 1 else 0) and sn == 0


def _reduction(node) -> bool:
    if node.op not in REDUCE_OPS or node.size == 0:
        return False
    inp = node.inputs[0]
    if inp.dtype not in DTYPES or not inp.dtype.is_float or node.dtype not in DTYPES:
        return False
    axes = node.params[0]
    nd = len(inp.shape)
    return tuple(axes) == tuple(range(nd - len(axes), nd))


def _elementwise(node) -> bool:
    return (node.op in ELEMENTWISE and node.size > 0 and node.dtype in DTYPES and node.params in DTYPES
            and all(inp.dtype in DTYPES for inp in node.inputs))


def find(order: list, index: dict, skip=frozenset()) -> dict:
    """node index -> its RowGroup, for every group of two nodes or more (see the module doc)."""
    return _Search(order, index, skip).run()


# ---- the group's program --------------------------------------------------------------------------

def dispatch(order: list, index: dict, G: RowGroup, leaves: list) -> tuple:
    """(commands, temps) of the program computing G; members with `leaves` set are written out."""
    members = G.members
    position = {i: m for m, i in enumerate(members)}
    search = _Search(order, index, frozenset())
    inputs: list = []  # (dtype, kind)
    layouts: list = []
    roots: list = []
    input_of: dict = {}
    spec_members = []
    for i in members:
        node = order[i]
        full = G.full[i]
        operands = []
        for ref in search.operands(i, G, full):
            if ref[0] == "m":
                operands.append(("m", position[ref[1]]))
                continue
            _, (off, so, sn), _ = ref
            inp_shape_full = full or node.op in REDUCE_OPS
            kind = _kind(so, sn, inp_shape_full)
            if kind in "rs":
                sn = 0
            if kind == "s":
                so = 0
            root = _operand_root(node, len(operands))
            dt = _operand_dtype(node, len(operands))
            key = (id(root), kind, off, so, sn)
            k = input_of.get(key)
            if k is None:
                k = input_of[key] = len(inputs)
                inputs.append((dt, kind))
                layouts.append((off, so, sn))
                roots.append(root)
            operands.append(("i", k))
        if node.op in REDUCE_OPS:
            spec_members.append(("red", node.op, node.inputs[0].dtype, node.dtype, tuple(operands)))
        else:
            spec_members.append(("ew", node.op, node.params, node.dtype, tuple(operands)))
    full = tuple(G.full[i] for i in members)
    outs = tuple(m for m, i in enumerate(members) if leaves[i])
    spec = rows.RowSpec(tuple(inputs), tuple(spec_members), full, outs)
    _, cmds, temps = rows.plan(spec, G.O, G.N, layouts)
    resolved = []
    for cmd in cmds:
        if cmd[0] != "dispatch":
            resolved.append(cmd)
            continue
        roles = []
        for role in cmd[5]:
            if role[0] == "out":
                roles.append(("out", members[outs[role[1]]]))
            elif role[0] == "in":
                roles.append(("root", roots[role[1]]))
            else:
                roles.append(role)
        resolved.append(cmd[:5] + (roles,))
    return resolved, temps


def _operand_root(node, k: int):
    return node.inputs[k].root


def _operand_dtype(node, k: int):
    return node.inputs[k].dtype
