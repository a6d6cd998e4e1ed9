"""Graph command buffer: every command a graph node, instantiated once, re-executed by graph launch.

The model is IREE's: commands recorded between two barriers have no edges among
them (they may run concurrently) and a barrier is a join that every command of
the previous level precedes and every command of the next level follows
(``RecordingCommandBuffer.levels``). How a join becomes graph structure is
a measured choice (DESIGN.md, "Graph launch host cost"):

- ``empty``: one empty node depending on the whole previous level (the model's
  own shape; launch cost grows steeply when it joins several branches);
- ``edges``: every node of the next level depends directly on every node of
  the previous one (a*b edges; cheapest to launch for the usual widths);
- ``kernel``: a no-op kernel node as the join (a+b edges, ~0.7 µs of GPU time).

``choose_join`` picks per barrier from the widths it joins, unless the device
option ``barrier_lowering`` forces one.

Rebinding: a reusable buffer recorded with ``hal.Slot`` references is built and
instantiated with the first submission's binding table; the executable graph is
then reused for every table, two ways:

- indirect bindings (dispatches of kernels whose source the driver compiles, with
  the ``indirect_bindings`` device option on; with "auto", the default, for graphs of
  many slot-bound dispatches and for any graph rebound with new tables
  ``INDIRECT_AFTER_REBINDS`` times): the node runs a
  variant of the kernel that reads its binding addresses from a small device
  table owned by the command buffer (dispatches binding the same ranges share
  one run of entries). A submission whose table resolves to new addresses
  copies the new table image (one ``memcpy_htod_async`` from pinned staging,
  stream-ordered before the graph launch); nodes are never touched, so the
  cost does not grow with the number of dispatches. A table that comes back
  (the other half of a double-buffered pair, say) gets an executable graph of
  its own, instantiated once from the same graph with its indirect dispatches
  pointed at a device table holding that table's image: switching to it is
  launching that executable graph, no copy at all (``TABLE_EXECS`` at most,
  the oldest dropped first). A prepared execution hands the same table object in
  at every submission: one switched back to is known by identity
  (``_launch_known``), its addresses not computed again;
- node updates (everything else: fills, copies, updates, precompiled kernels):
  each used slot's (address, size) is compared with what the executable graph
  holds and only the nodes reading a changed slot are updated in place
  (``exec_set_{kernel,memset,memcpy}_params``): O(changed bindings),
  O(slots) for the same table.

Library routines (``hal.library``, cuBLASLt or hipBLASLt calls) are captured on the device's
capture stream into a child-graph node; a new table changing one of their operands captures the
call again and sets the new child graph on the executable graph in place
(``exec_set_child_graph``), as the node updates above. A command buffer holding a library call that
cannot be captured (``LibraryCall.capturable``: a solver that reads its own results on the host
while it runs, cuSOLVER's ``gesvdj`` and ``syevd``) builds no graph: its commands are issued on the
stream one by one, as a stream command buffer's are (``StreamIssue``). So does one whose call's
capture a child-graph node refuses (the library allocated memory while captured, as cuSOLVER's
``getrs`` did): the routine is then streamed on that device from the start (``Capturer.refuse``).
Library calls of one level that share a handle's state (``LibraryCall.serial_key``) are chained.

A command buffer of one kernel launch and nothing else builds no graph either (``_one_kernel``):
launched on the stream, the kernel starts sooner on the device than a graph's node would (about
1 us, 1% of a softmax or a layer norm over 8192x4096 floats on an H100: a runtime eval of one fused
kernel, the usual eager case; docs/performance.md), for about the same host cost (the launch, and
for a new table the kernel's arguments patched where the graph would update its node or copy a
table). A lone library call stays a graph: its call through the library's bindings costs the host
several times the launch of the graph replaying its capture.

The graph is re-instantiated only when the driver rejects an in-place update of
a memset/memcpy node (a different kind of allocation, a length change to or
from zero), counted in ``reinstantiations``.

A submission with the binding table of the previous one (the core hands out the
same resolved table when the entries are unchanged) skips all of this: it is
one ``graph_launch``.
"""

from __future__ import annotations

import ctypes
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hal import interrupts
from hal.command_buffer import Binding
from hal.drivers.gpu.kernel_args import ArgArena
from hal.drivers.gpu.library import LibraryCall
from hal.drivers.gpu.recording import (
    Command,
    Copy,
    DirectDispatch,
    Fill,
    RecordingCommandBuffer,
    SlotDispatch,
    slot_address,
)
from hal.drivers.gpu.stream_issue import StreamIssue
from hal.errors import UnimplementedError

JOIN_KINDS = ("empty", "edges", "kernel")
#: With indirect_bindings="auto", a graph rebound with new tables this many times through node
#: updates is rebuilt with indirect bindings: a rebind then costs one table copy whatever the size.
INDIRECT_AFTER_REBINDS = 4
#: Binding tables whose packed device-table images a command buffer keeps.
IMAGE_MEMO = 4
#: Tables that came back and got an executable graph of their own (beside the main one, whose
#: device table takes the copies of other tables), per command buffer.
TABLE_EXECS = 3
#: A join of a*b <= EDGE_LIMIT node pairs becomes direct edges (10x10 levels: 13 µs launch
#: with edges against 95 µs with empty nodes on an H100); wider joins use a no-op kernel.
EDGE_LIMIT = 256


def choose_join(before: int, after: int, policy: str = "auto") -> str:
    """How to lower a barrier between a level of ``before`` nodes and one of ``after`` nodes."""
    if policy in JOIN_KINDS:
        return policy
    if before <= 1 or after <= 1 or before * after <= EDGE_LIMIT:
        return "edges"
    return "kernel"


class _Node:
    """A graph node made from one command, with the parameters the executable graph holds."""

    __slots__ = ("command", "handle", "params", "kind", "enabled")

    def __init__(self, command: Command, handle: Any, params: Any, kind: str, enabled: bool = True) -> None:
        self.command = command
        self.handle = handle
        self.params = params
        self.kind = kind
        self.enabled = enabled


class _GraphResources:
    """What a graph command buffer owns on the device, released when it is garbage."""

    def __init__(self, device) -> None:
        self.device = device
        self.graph: Any = None
        self.graph_exec: Any = None
        self.staging: Any = None  # device Allocation holding update payloads
        self.image: Any = None  # device Allocation holding the indirect binding table
        #: Slot addresses -> _TableExec: recurring tables' own executable graphs (see TABLE_EXECS).
        self.table_execs: dict[tuple, _TableExec] = {}

    def release(self) -> None:
        api = self.device.api
        graph_exec, graph, staging, image = self.graph_exec, self.graph, self.staging, self.image
        self.graph_exec = self.graph = self.staging = self.image = None
        table_execs, self.table_execs = self.table_execs, {}
        if image is not None:
            self.device.allocator.free_now(image)
        if graph_exec is not None:
            api.graph_exec_destroy(graph_exec)
        if graph is not None:
            api.graph_destroy(graph)
        if staging is not None:
            self.device.allocator.free_now(staging)
        for table_exec in table_execs.values():  # (executable graphs outlive the graph they came from)
            table_exec.release(self.device)


class _TableExec:
    """An executable graph of one recurring binding table: its own device table, holding that
    table's image, read by its indirect dispatches (their argument slots point there)."""

    __slots__ = ("graph_exec", "image", "args")

    def __init__(self, graph_exec: Any, image: Any, args: ArgArena) -> None:
        self.graph_exec = graph_exec
        self.image = image
        self.args = args  # the dispatches' argument values (kept with the graph that was given them)

    def release(self, device) -> None:
        device.api.graph_exec_destroy(self.graph_exec)
        if self.image is not None:
            device.allocator.free_now(self.image)


class GraphCommandBuffer(RecordingCommandBuffer):
    kind = "graph"

    def __init__(self, device, mode, binding_capacity: int) -> None:
        super().__init__(device, mode, binding_capacity)
        self._resources = _GraphResources(device)
        device.graph_resources.add(self._resources)
        self._finalizer = interrupts.finalize(self, device.release_later, self._resources.release)
        self._nodes: list[_Node] = []
        #: Per used slot: indices into _nodes of the nodes reading it.
        self._slot_nodes: dict[int, list[int]] = {}
        self._applied: dict[int, tuple[int, int]] = {}
        self.joins: list[str] = []
        self.node_count = 0
        self.reinstantiations = 0
        #: Submissions that brought a new binding table (counted while nodes are updated in place).
        self.rebinds = 0
        self.updated_nodes = 0
        #: Library nodes captured again for a new table and set in place.
        self.library_recaptures = 0
        self.image_uploads = 0
        #: Executable graphs made for recurring tables (see TABLE_EXECS).
        self.table_execs_made = 0
        #: The resolved binding table the graph and the device table were last brought up to date with.
        self._bound_table: Sequence[Binding] | None = None
        #: id(table) -> (table, its table_execs key or None, the executable graph launched for it, the
        #: main device table's image addresses then or None), for tables that change nothing but the
        #: device table: a prepared execution hands its table object in at every submission, so
        #: switching back to it is a look-up by identity, with no addresses computed again.
        self._table_launches: dict[int, tuple] = {}
        #: Set when bringing the graph up to date with a table was cut short: it is built again.
        self._damaged = False
        # Indirect bindings: per dispatch using them, (function, first table entry); the table layout.
        self._indirect: dict[int, tuple[Any, int]] = {}
        self._indirect_args = ArgArena()
        #: The binding-table slots the device table reads (None when no dispatch uses indirect bindings).
        self._image_slots: list[int] | None = None
        #: Per device-table entry: index into the slot bases (the last one is 0, for fixed addresses), offset.
        self._image_base_index: np.ndarray | None = None
        self._image_offsets: np.ndarray | None = None
        self._image_bases: np.ndarray | None = None
        self._image_memo: dict[tuple, tuple] = {}
        #: The slot addresses of the image last copied to the device table (None: copy it again).
        self._image_addresses: tuple | None = None
        #: Per indirect dispatch: (command, function, first device-table entry), in argument order.
        self._indirect_plan: list[tuple[Command, Any, int]] = []
        #: Whether a table changes nothing but the device table (every slot read is indirect), so
        #: a recurring table can get an executable graph of its own.
        self._table_execs_allowed = False
        #: The executable graph the next launch runs: the main one, or a recurring table's.
        self._launch_exec: Any = None
        #: Whether recurring tables of a graph with slot-bound library calls get executable graphs
        #: of their own (see _recurring), and the slot addresses of tables seen once.
        self._recurring_allowed = False
        self._seen_tables: dict[tuple, None] = {}
        #: The slots a table's key reads (see _table_key), fixed when the graph is built.
        self._key_slots: list[int] = []
        #: Set at ``end()`` when a library call cannot be captured: the commands are issued on the stream.
        self._streamed: StreamIssue | None = None

    def release_captures(self) -> None:
        self._resources.release()  # (in-flight launches complete first: CUDA defers the free)

    # -- recording -----------------------------------------------------------------
    def _pack_staging(self) -> None:
        if not self.staging_size:
            return
        payload = self.staging_payload()
        device = self.device
        staging = device.allocate_staging(len(payload))
        device.api.memcpy_htod(staging.ptr, _address_of(payload), len(payload))
        self._resources.staging = staging

    def _recorded(self) -> None:
        capturer = self.device.capturer
        if self._one_kernel() or not all(call.capturable and capturer.holds(call) for call in self.library_calls):
            self._issue_on_the_stream()
        elif not self.uses_slots:
            try:
                self._build(None)
            except _StreamInstead:
                self._issue_on_the_stream()

    def _one_kernel(self) -> bool:
        """Whether the recording is one kernel launch and nothing else (issued on the stream: see the
        module)."""
        commands = [command for level in self.levels for command in level]  # (collectives are library calls)
        return len(commands) == 1 and type(commands[0]) in (DirectDispatch, SlotDispatch)

    def _issue_on_the_stream(self) -> None:
        """Give up the graph: every submission issues the commands in order on the queue's stream."""
        if self._resources.graph is not None:
            self._drop_graph()
        staging = self._resources.staging
        self._streamed = StreamIssue(self.device, 0 if staging is None else staging.ptr, staging_on_device=True)

    # -- building ----------------------------------------------------------------------
    def _build(self, table: Sequence[Binding] | None) -> None:
        """Create the graph from the levels (addresses from ``table``) and instantiate it."""
        device = self.device
        api = device.api
        device.make_current()
        self._drop_table_execs()  # instantiated from the graph being replaced
        if self.slot_dispatches:
            self.patch_slot_args(table)
        self._plan_indirect()
        graph = api.graph_create()
        self._resources.graph = graph
        self._nodes = []
        self._slot_nodes = {}
        self.joins = []
        policy = device.barrier_lowering
        previous: list[Any] = []
        for level in self.levels:
            if not level:
                continue
            if not previous:
                deps: list[Any] = []
            else:
                join = choose_join(len(previous), len(level), policy)
                self.joins.append(join)
                if join == "edges":
                    deps = previous
                elif join == "empty":
                    deps = [api.graph_add_empty_node(graph, previous)]
                else:
                    deps = [api.graph_add_kernel_node(graph, previous, device.join_kernel_params())]
            previous = self._add_level(graph, level, deps, table)
        self.node_count = len(self._nodes)
        self._resources.graph_exec = self._launch_exec = api.graph_instantiate(graph) if self._nodes else None
        self._applied = {slot: slot_address(table[slot]) for slot in self._slot_nodes}  # type: ignore[index]
        self._image_addresses = None  # a new graph: upload the table image again
        self._table_execs_allowed = self._image_slots is not None and not self._slot_nodes
        # A library call reading a slot is captured again for every new table (tens of µs): a
        # table that comes back gets an executable graph of its own, every node set for it once.
        self._recurring_allowed = device.queue_count == 1 and any(
            self._nodes[i].kind == "library" for nodes in self._slot_nodes.values() for i in nodes)
        self._seen_tables = {}
        self._key_slots = sorted(set(self._slot_nodes) | set(self._image_slots or ()))

    def _add_level(self, graph: Any, level: list[Command], deps: list[Any],
                   table: Sequence[Binding] | None) -> list[Any]:
        """The nodes of one level, each after ``deps``; library calls sharing a handle's state
        (``LibraryCall.serial_key``) also each after the one recorded before it."""
        nodes = []
        last_of: dict[Any, Any] = {}
        for command in level:
            key = command.serial_key if type(command) is LibraryCall else None
            before = None if key is None else last_of.get(key)
            node = self._add_node(graph, command, deps if before is None else [*deps, before], table)
            if key is not None:
                last_of[key] = node
            nodes.append(node)
        return nodes

    def _add_node(self, graph: Any, command: Command, deps: list[Any], table: Sequence[Binding] | None) -> Any:
        device = self.device
        api = device.api
        kind = type(command)
        index = len(self._nodes)
        if kind is SlotDispatch and id(command) in self._indirect:
            params = self._indirect_params(command, self._indirect_args)
            node = _Node(command, api.graph_add_kernel_node(graph, deps, params), params, "indirect")
            slots = set()  # rebinding rewrites the device table, not the node
        elif kind is DirectDispatch:
            function, grid, block, start, count = command  # type: ignore[misc]
            params = api.kernel_node_params(function, grid, block, self.args.params_address(start, count))
            node = _Node(command, api.graph_add_kernel_node(graph, deps, params), params, "kernel")
            slots = set()
        elif kind is SlotDispatch:
            params = api.kernel_node_params(command.function, command.grid, command.block,
                                            self.args.params_address(command.arg_start, command.arg_count))
            node = _Node(command, api.graph_add_kernel_node(graph, deps, params), params, "kernel")
            slots = {slot for _, slot, _ in command.slot_args}
        elif kind is LibraryCall:
            node = self._library_node(graph, command, deps, table)
            slots = command.slots
        elif kind is Fill:
            ptr, length = command.target.resolve(table)
            size = command.element_size
            if length:
                params = api.memset_node_params(ptr, command.value, size, length // size)
                node = _Node(command, api.graph_add_memset_node(graph, deps, params), params, "memset")
            else:  # nothing to fill with this table: a placeholder (a new table rebuilds)
                node = _Node(command, api.graph_add_empty_node(graph, deps), None, "memset", enabled=False)
            slots = {command.target.slot} - {None}
        else:
            dst, length = command.target.resolve(table)
            if kind is Copy:
                src, src_length = command.source.resolve(table)
                length = min(length, src_length)
                slots = {command.source.slot, command.target.slot} - {None}
            else:
                src = self._resources.staging.ptr + command.staging_offset  # type: ignore[union-attr]
                length = command.length
                slots = {command.target.slot} - {None}
            if length:
                params = api.memcpy_node_params(dst, src, length)
                node = _Node(command, api.graph_add_memcpy_node(graph, deps, params), params, "memcpy")
            else:
                node = _Node(command, api.graph_add_empty_node(graph, deps), None, "memcpy", enabled=False)
        self._nodes.append(node)
        for slot in slots:
            self._slot_nodes.setdefault(slot, []).append(index)  # type: ignore[arg-type]
        return node.handle

    def _library_node(self, graph: Any, call: LibraryCall, deps: list[Any], table: Sequence[Binding] | None) -> _Node:
        """A child-graph node holding the library call captured with ``table``'s operands."""
        api = self.device.api
        if call.empty:  # writes nothing, whatever the table
            return _Node(call, api.graph_add_empty_node(graph, deps), None, "library", enabled=False)
        capturer = self.device.capturer
        child = capturer.capture(self.device, call, table)
        try:
            handle = api.graph_add_child_graph_node(graph, deps, child)  # (the node holds a copy)
        except UnimplementedError:
            # The library allocated memory while captured (cuSOLVER's getrs did, in a process whose
            # other devices had used the handle first): a child graph may not hold allocation nodes.
            capturer.refuse(call)
            raise _StreamInstead from None
        finally:
            api.graph_destroy(child)
        return _Node(call, handle, None, "library")

    def _plan_indirect(self) -> None:
        """Lay out the device binding table of the dispatches that can read their bindings from it.

        Each dispatch reads its bindings from a run of consecutive entries; dispatches binding
        the same ranges (slot and offset, or fixed address) share a run, so the table, and the
        copy a new binding table costs, grows with the distinct bindings, not the dispatches.
        """
        device = self.device
        self._indirect = {}
        self._indirect_plan = []
        self._image_slots = None
        if not device.use_indirect_bindings(len(self.slot_dispatches), self.rebinds):
            return
        layout: list[tuple[int | None, int]] = []  # (slot, offset) or (None, fixed address)
        runs: dict[tuple, int] = {}
        chosen = []
        for command in self.slot_dispatches:
            function = device.indirect_function(command.executable, command.ordinal)
            if function is None:
                continue
            key = tuple((target.slot, target.offset) if target.slot is not None else (None, target.ptr)
                        for target in command.bindings)
            start = runs.get(key)
            if start is None:
                start = runs[key] = len(layout)
                layout.extend(key)
            chosen.append((command, function, start))
        if not chosen:
            return
        resources = self._resources
        size = 8 * len(layout)
        if resources.image is None or resources.image.size != size:
            if resources.image is not None:
                old, resources.image = resources.image, None
                device.defer(lambda: device.allocator.free_now(old))
            resources.image = device.allocate_staging(size)
        table_ptr = resources.image.ptr
        self._indirect_plan = chosen
        self._indirect_args, firsts = self._indirect_arena(table_ptr)
        for (command, function, _), first in zip(chosen, firsts):
            self._indirect[id(command)] = (function, first)
        slots = sorted({slot for slot, _ in layout if slot is not None})
        position = {slot: i for i, slot in enumerate(slots)}
        fixed = len(slots)  # the base of fixed entries: 0
        self._image_base_index = np.array([fixed if slot is None else position[slot] for slot, _ in layout],
                                          dtype=np.intp)
        self._image_offsets = np.array([offset for _, offset in layout], dtype=np.uint64)
        self._image_bases = np.zeros(len(slots) + 1, dtype=np.uint64)
        self._image_slots = slots
        self._image_entries = entries_getter(slots)
        self._image_addresses = None
        #: slot addresses -> (their packed image, the image's address) for the last few tables (a
        #: double-buffered table alternates between two): packed once, copied many times.
        self._image_memo: dict[tuple, tuple] = {}

    def _bind_image(self, table: Sequence[Binding] | None, queue) -> None:
        """Make the next launch read ``table``'s addresses: the executable graph of a recurring table,
        or the main one, its device table copied (stream-ordered) when the addresses changed (the
        pinned block copied from goes back once the submission being issued retires)."""
        addresses = self._addresses_of(table)
        if addresses == self._image_addresses:
            self._launch_exec = self._resources.graph_exec
            return
        memo = self._image_memo
        packed = memo.get(addresses)
        recurring = packed is not None  # a table seen before: it may get an executable graph of its own
        if packed is None:
            if len(memo) >= IMAGE_MEMO:
                del memo[next(iter(memo))]
            image = self._image_for(addresses)
            packed = memo[addresses] = (image, image.ctypes.data)
        image, image_address = packed
        if self._table_execs_allowed:
            table_exec = self._resources.table_execs.get(addresses)
            if table_exec is None and recurring:
                table_exec = self._add_table_exec(addresses, image, image_address)
            if table_exec is not None:
                self._launch_exec = table_exec.graph_exec
                return
        self._launch_exec = self._resources.graph_exec
        size = image.nbytes
        device = self.device
        staging = device.staging
        host, capacity = staging.acquire(size)
        # Held first: the block goes back once the submission retires, which (failed or interrupted
        # as well) is never before the stream passed the copy.
        queue.issuing.hold(functools.partial(staging.release, host, capacity))
        ctypes.memmove(host, image_address, size)
        device.api.memcpy_htod_async(self._resources.image.ptr, host, size, queue.stream)
        self._image_addresses = addresses
        self.image_uploads += 1

    def _image_of(self, table: Sequence[Binding] | None) -> tuple[tuple, np.ndarray]:
        """(the slot addresses, the packed device-table image) of ``table``."""
        addresses = self._addresses_of(table)
        return addresses, self._image_for(addresses)

    def _addresses_of(self, table: Sequence[Binding] | None) -> tuple:
        """The device addresses of ``table``'s entries the device table holds."""
        return tuple([buffer.allocation.ptr + buffer.offset + base  # slot_address, inlined: per slot
                      for buffer, base, _ in self._image_entries(table)])

    def _image_for(self, addresses: tuple) -> np.ndarray:
        """The packed device-table image of these slot addresses."""
        bases = self._image_bases
        bases[:-1] = addresses  # type: ignore[index]
        return np.add(bases[self._image_base_index], self._image_offsets)  # type: ignore[index]

    def _indirect_arena(self, table_ptr: int) -> tuple[ArgArena, list[int]]:
        """The indirect dispatches' argument slots, reading a device table at ``table_ptr``, and
        each dispatch's first slot (the same for every table pointer)."""
        args = ArgArena()
        firsts = [args.add([table_ptr + 8 * start], command.constants) for command, _, start in self._indirect_plan]
        args.pack()
        return args, firsts

    def _indirect_params(self, command: SlotDispatch, args: ArgArena) -> Any:
        """Kernel-node parameters of an indirect dispatch whose argument slots are in ``args``."""
        function, first = self._indirect[id(command)]
        return self.device.api.kernel_node_params(function, command.grid, command.block,
                                                  args.params_address(first, 1 + len(command.constants)))

    def _add_table_exec(self, addresses: tuple, image: np.ndarray, image_address: int) -> _TableExec:
        """Instantiate the graph again for a recurring table: its indirect dispatches read a device
        table of their own, filled once with the table's image (nothing else depends on a table)."""
        device = self.device
        api = device.api
        resources = self._resources
        table_execs = self._room_for_table_exec()
        own_image = device.allocate_staging(image.nbytes)
        graph_exec = None
        try:
            api.memcpy_htod(own_image.ptr, image_address, image.nbytes)  # a new allocation: nothing reads it yet
            graph_exec = api.graph_instantiate(resources.graph)
            args, _ = self._indirect_arena(own_image.ptr)
            for node in self._nodes:
                if node.kind == "indirect":
                    api.exec_set_kernel_params(graph_exec, node.handle, self._indirect_params(node.command, args))
        except BaseException:
            if graph_exec is not None:
                api.graph_exec_destroy(graph_exec)
            device.allocator.free_now(own_image)
            raise
        table_exec = table_execs[addresses] = _TableExec(graph_exec, own_image, args)
        self.table_execs_made += 1
        return table_exec

    def _table_key(self, table: Sequence[Binding] | None) -> tuple:
        """What a table changes in the graph: (address, size) of every slot a node or the device table reads."""
        return tuple(slot_address(table[slot]) for slot in self._key_slots)  # type: ignore[index]

    def _recurring(self, table: Sequence[Binding] | None) -> bool:
        """Launch the executable graph of ``table`` if it is a table seen before (made now, the
        second time): False for a table seen for the first time, which the main graph takes."""
        key = self._table_key(table)
        table_exec = self._resources.table_execs.get(key)
        if table_exec is None:
            if key not in self._seen_tables:
                if len(self._seen_tables) >= 4 * TABLE_EXECS:
                    del self._seen_tables[next(iter(self._seen_tables))]
                self._seen_tables[key] = None
                return False
            table_exec = self._add_recurring_exec(table, key)
            if table_exec is None:
                return False
        self._launch_exec = table_exec.graph_exec
        return True

    def _add_recurring_exec(self, table: Sequence[Binding] | None, key: tuple) -> _TableExec | None:
        """Instantiate the graph again with every slot-bound node set for ``table`` (library calls
        captured for it, its own device table for indirect dispatches); None if the driver refuses
        a change in place (the main graph then takes the table)."""
        device = self.device
        api = device.api
        resources = self._resources
        table_execs = self._room_for_table_exec()
        graph_exec = own_image = None
        args = self._indirect_args
        try:
            graph_exec = api.graph_instantiate(resources.graph)
            if self._image_slots is not None:
                _, image = self._image_of(table)
                own_image = device.allocate_staging(image.nbytes)
                api.memcpy_htod(own_image.ptr, image.ctypes.data, image.nbytes)  # nothing reads it yet
                args, _ = self._indirect_arena(own_image.ptr)
                for node in self._nodes:
                    if node.kind == "indirect":
                        api.exec_set_kernel_params(graph_exec, node.handle, self._indirect_params(node.command, args))
            for index in sorted({i for nodes in self._slot_nodes.values() for i in nodes}):
                self._update_node(self._nodes[index], table, graph_exec)
        except _RebuildNeeded:
            self._destroy_partial(graph_exec, own_image)
            return None
        except BaseException:
            self._destroy_partial(graph_exec, own_image)
            raise
        # (The main graph keeps what it was set to: node parameters are copied when they are set.)
        table_exec = table_execs[key] = _TableExec(graph_exec, own_image, args)
        self.table_execs_made += 1
        return table_exec

    def _destroy_partial(self, graph_exec: Any, image: Any) -> None:
        if graph_exec is not None:
            self.device.api.graph_exec_destroy(graph_exec)
        if image is not None:
            self.device.allocator.free_now(image)

    def _room_for_table_exec(self) -> dict:
        """The table executable graphs, the oldest dropped if there are TABLE_EXECS already."""
        table_execs = self._resources.table_execs
        if len(table_execs) >= TABLE_EXECS:
            oldest = table_execs.pop(next(iter(table_execs)))
            device = self.device
            device.defer(functools.partial(oldest.release, device))  # a launch of it may still run
        return table_execs

    def _drop_table_execs(self) -> None:
        table_execs, self._resources.table_execs = self._resources.table_execs, {}
        device = self.device
        for table_exec in table_execs.values():
            device.defer(functools.partial(table_exec.release, device))

    # -- submission ----------------------------------------------------------------------
    def issuer(self, queue, table: Sequence[Binding] | None) -> Callable[[], None] | None:
        """What issues this command buffer on ``queue`` with ``table`` (called once per submission,
        with the queue's lock held; None: nothing to launch). A graph without binding-table slots
        was instantiated at ``end()`` and never changes: its launch is the shim's ``graph_launch``
        with the executable graph and the stream bound."""
        if self._streamed is not None:
            return self._streamed.issuer(self, queue, table)
        if not self.uses_slots:
            graph_exec = self._resources.graph_exec
            return None if graph_exec is None else functools.partial(self.device.api.graph_launch, graph_exec,
                                                                      queue.stream)
        return self.serialized(functools.partial(self._issue_with_table, queue, table))

    def _issue_with_table(self, queue, table: Sequence[Binding] | None) -> None:
        if self._streamed is not None:  # (a capture refused at an earlier submission)
            self._streamed.issue(self, queue, table)
            return
        if table is not self._bound_table and not self._launch_known(table):
            try:
                self._bind(table, queue)
            except _StreamInstead:
                self._bound_table = None
                self._issue_on_the_stream()
                self._streamed.issue(self, queue, table)  # type: ignore[union-attr]
                return
            except BaseException:
                # Cut short part way (an API error, a KeyboardInterrupt): the graph may match no
                # table any more. The next submission builds it again.
                self._bound_table = None
                self._damaged = True
                raise
            self._remember_launch(table)
        self._bound_table = table
        if self._launch_exec is not None:
            self.device.api.graph_launch(self._launch_exec, queue.stream)

    def _launch_known(self, table: Sequence[Binding] | None) -> bool:
        """Whether ``table`` is launched as it was last time and nothing it needs changed since: its
        own executable graph (a recurring table's) is still there, or the main one's device table
        still holds its image. The next launch then runs that executable graph (``_remember_launch``)."""
        known = self._table_launches.get(id(table))
        if known is None or known[0] is not table or self._damaged:
            return False
        _, key, graph_exec, image_addresses = known
        if image_addresses is None:  # its own executable graph: unless replaced, or the graph rebuilt
            table_exec = self._resources.table_execs.get(key)
            if table_exec is None or table_exec.graph_exec is not graph_exec:
                return False
        elif self._resources.graph_exec is not graph_exec or self._image_addresses is not image_addresses:
            return False
        self._launch_exec = graph_exec
        return True

    def _remember_launch(self, table: Sequence[Binding] | None) -> None:
        """After ``_bind``: remember how ``table`` is launched where a table changes nothing but the
        device table (then the executable graph launched and the image it reads say it all)."""
        if not self._table_execs_allowed:
            return
        launch = self._launch_exec
        if launch is self._resources.graph_exec:
            known = (table, None, launch, self._image_addresses)
        else:
            key = next((k for k, t in self._resources.table_execs.items() if t.graph_exec is launch), None)
            if key is None:
                return
            known = (table, key, launch, None)
        launches = self._table_launches
        if id(table) not in launches and len(launches) > TABLE_EXECS:
            del launches[next(iter(launches))]
        launches[id(table)] = known

    def _bind(self, table: Sequence[Binding] | None, queue) -> None:
        """Bring the graph (or the executable graph launched next) up to date with ``table``."""
        resources = self._resources
        if self._damaged:
            self._damaged = False
            self._drop_graph()
        if resources.graph is None:
            self._build(table)
            if self._recurring_allowed:
                self._seen_tables[self._table_key(table)] = None
            if self._image_slots is not None:
                self._bind_image(table, queue)
        elif not (self._recurring_allowed and self._recurring(table)):
            self._launch_exec = resources.graph_exec
            if self._slot_nodes:  # (none: every slot is read from the device table)
                self._rebind(table)
            if self._image_slots is not None:
                self._bind_image(table, queue)

    def _rebind(self, table: Sequence[Binding] | None) -> None:
        applied = self._applied
        dirty: set[int] = set()
        changed = {}
        for slot, nodes in self._slot_nodes.items():
            key = slot_address(table[slot])  # type: ignore[index]
            if key != applied[slot]:
                changed[slot] = key
                dirty.update(nodes)
        if not dirty:
            return
        self.rebinds += 1
        if self.rebinds == INDIRECT_AFTER_REBINDS and self._image_slots is None \
                and self.device.indirect_bindings == "auto" and self.slot_dispatches:
            self._rebuild(table)  # rebound often: from now on one table copy per new table
            return
        try:
            for index in sorted(dirty):
                self._update_node(self._nodes[index], table)
        except _RebuildNeeded:
            self._reinstantiate(table)
            return
        applied.update(changed)

    def _update_node(self, node: _Node, table: Sequence[Binding] | None, graph_exec: Any = None) -> None:
        """Set ``node`` for ``table`` on an executable graph (the main one by default)."""
        api = self.device.api
        if graph_exec is None:
            graph_exec = self._resources.graph_exec
        command = node.command
        self.updated_nodes += 1
        if node.kind == "kernel":
            self.patch_dispatch(command, table)  # type: ignore[arg-type]
            api.exec_set_kernel_params(graph_exec, node.handle, node.params)
            return
        if node.kind == "library":
            if node.enabled:
                self._recapture(graph_exec, node, table)
            return
        if node.params is None:
            raise _RebuildNeeded
        if node.kind == "memset":
            ptr, length = command.target.resolve(table)  # type: ignore[union-attr]
            if not length:
                raise _RebuildNeeded
            api.set_memset_node_target(node.params, ptr, length // command.element_size)  # type: ignore[union-attr]
            setter = api.exec_set_memset_params
        else:
            dst, length = command.target.resolve(table)  # type: ignore[union-attr]
            if type(command) is Copy:
                src, src_length = command.source.resolve(table)
                length = min(length, src_length)
            else:
                src = self._resources.staging.ptr + command.staging_offset  # type: ignore[union-attr]
            if not length:
                raise _RebuildNeeded
            api.set_memcpy_node_target(node.params, dst, src, length)
            setter = api.exec_set_memcpy_params
        if not setter(graph_exec, node.handle, node.params):
            raise _RebuildNeeded  # the driver refused this change in place

    def _recapture(self, graph_exec: Any, node: _Node, table: Sequence[Binding] | None) -> None:
        """Capture a library call again with the new operands and set it on its node in place."""
        api = self.device.api
        capturer = self.device.capturer
        child = capturer.capture(self.device, node.command, table)  # type: ignore[arg-type]
        try:
            updated = api.exec_set_child_graph(graph_exec, node.handle, child)
        except UnimplementedError:  # (as in _library_node: memory allocated while captured)
            capturer.refuse(node.command)  # type: ignore[arg-type]
            raise _StreamInstead from None
        finally:
            api.graph_destroy(child)
        if not updated:
            raise _RebuildNeeded  # another plan (other alignment) changed the captured graph's shape
        self.library_recaptures += 1

    def _reinstantiate(self, table: Sequence[Binding] | None) -> None:
        """Rebuild the graph for ``table`` after the driver refused an update in place."""
        self.reinstantiations += 1
        self._rebuild(table)

    def _rebuild(self, table: Sequence[Binding] | None) -> None:
        """Build the graph again for ``table``."""
        self._drop_graph()
        self._build(table)

    def _drop_graph(self) -> None:
        """Forget the graph and its executable graph; that one may still be running: free them later."""
        resources = self._resources
        old_exec, old_graph = resources.graph_exec, resources.graph
        resources.graph_exec = resources.graph = None
        self._launch_exec = None
        api = self.device.api
        self.device.defer(lambda: (old_exec is not None and api.graph_exec_destroy(old_exec),
                                   old_graph is not None and api.graph_destroy(old_graph)))

    def retired(self) -> None:
        super().retired()
        self._finalizer()


def entries_getter(slots: list[int]):
    """A function giving a binding table's entries of ``slots`` as a tuple, in one C call."""
    getter = operator.itemgetter(*slots)
    if len(slots) > 1:
        return getter
    return lambda table: (getter(table),)


class _RebuildNeeded(Exception):
    pass


class _StreamInstead(Exception):
    """A library call's capture cannot be a child-graph node: issue the buffer on the stream."""


def _address_of(data: bytes) -> int:
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8).ctypes.data
