"""The GPU API the GPU-generic driver logic is written against.

Everything in ``hal/drivers/gpu`` reaches the vendor library only through an
object implementing ``GpuApi``: the CUDA driver's shim (``hal/drivers/cuda/api.py``,
over ``cuda.bindings``), the HIP driver's (over ``hip-python``), and the simulated
GPU of the tests (``tests/drivers/fake_gpu.py``). The protocol lists every call
the generic code makes, with its contract; a shim implements exactly these
(the driver's own probing and device enumeration are its ``driver.py``'s business).

Conventions every implementation keeps:

- **Status.** A method returns its result (an address, a handle, a bool) or
  ``None``; it never returns a status code. A failing call raises the ``HalError``
  subclass its result code maps to (the driver's ``status.py``, built on
  ``hal.drivers.gpu.status.StatusTable``), with ``api_function`` (the vendor
  function that failed) and ``api_code`` (the code's name) set on the error.
  Out of memory is ``ResourceExhaustedError``; a sticky fault that leaves the
  context unusable (illegal address, launch failure, ...) is ``DeviceLostError``,
  which the device turns into "device lost". The generic code never looks at
  codes or error strings.
- **Context.** Calls act on the context made current on the calling thread by
  ``activate``; the generic code activates its device's context before any
  other call on a thread (``GpuDevice.make_current``). Calls that a vendor API
  wants an explicit context for (CUDA's memset/memcpy graph nodes) take it from
  the thread's current one inside the shim.
- **Handles.** Streams, events, graphs, graph nodes, executable graphs, modules,
  functions and node parameter records are opaque objects, only handed back to
  the same shim. Device and host addresses are plain ``int`` (the generic code
  does address arithmetic on them).
- **Threads.** Any method may be called from any thread. The generic code
  serialises the calls on one stream (a queue lock); the shim needs no lock
  of its own for them.
- **Ordering.** ``*_async`` calls, launches, ``event_record`` and
  ``stream_wait_event`` are enqueued on the stream and return at once, as the
  vendor's stream semantics define (an event captures the work enqueued on its
  stream before ``event_record``; ``stream_wait_event`` waits for the state of
  the event at the time of the call). Kernel parameters, node parameters and
  host memory passed to ``memcpy_htod_async`` are read when the call returns
  for parameters (the caller may reuse the parameter memory at once), and when
  the copy runs for host memory (the caller keeps it until the work completed).
- **Graph update rejected.** ``exec_set_memset_params`` and
  ``exec_set_memcpy_params`` return ``False`` when the vendor refuses to make
  the change in place (a different kind of allocation, a size change it does
  not allow); the generic code then re-instantiates the graph. Other failures
  raise as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

#: Opaque handles (see "Handles" above); named for documentation only.
Stream = Any
Event = Any
Graph = Any
GraphNode = Any
GraphExec = Any
Module = Any
Function = Any
NodeParams = Any
#: A call prepared once (its function and complete arguments) and issued many times by ``run_prepared``.
PreparedCall = Any


@runtime_checkable
class GpuApi(Protocol):
    """The calls of the GPU-generic driver logic (see the module docstring for the conventions)."""

    #: The API's short name ("cuda", "hip"), for messages and thread names.
    name: str

    # -- context ------------------------------------------------------------------------
    def activate(self, context: Any) -> None:
        """Make ``context`` current on the calling thread. Called before every batch of other
        calls, so it must cost one comparison when the context is already current."""

    # -- streams and events -----------------------------------------------------------------
    def stream_create(self) -> Stream:
        """A stream that does not synchronise with the legacy default stream."""

    def stream_destroy(self, stream: Stream) -> None:
        """Destroy a stream (after ``stream_synchronize``: no work of it may still run)."""

    def stream_synchronize(self, stream: Stream) -> None:
        """Block until the work enqueued on ``stream`` so far completed."""

    def stream_wait_event(self, stream: Stream, event: Event) -> None:
        """Make later work on ``stream`` wait for the work ``event`` captured (device-side)."""

    def event_create(self) -> Event:
        """An event without timing (recording it costs the least)."""

    def event_destroy(self, event: Event) -> None:
        """Destroy an event nothing will record, query or wait on again."""

    def event_record(self, event: Event, stream: Stream) -> None:
        """Capture the work enqueued on ``stream`` so far in ``event`` (re-recording replaces it)."""

    def event_query(self, event: Event) -> bool:
        """True once the captured work completed, False while it runs (never raises for "not ready");
        raises for a fault of the captured work."""

    def event_synchronize(self, event: Event) -> None:
        """Block until the captured work completed; raises for its fault."""

    def timing_event_create(self) -> Event:
        """An event that also records when the captured work completed (used only while tracing)."""

    def event_elapsed_ms(self, start: Event, end: Event) -> float:
        """Milliseconds of device time between two completed timing events."""

    # -- memory ---------------------------------------------------------------------------------
    def mem_alloc(self, size: int) -> int:
        """Device-local memory of ``size`` bytes (``size`` > 0): its device address."""

    def mem_free(self, ptr: int) -> None:
        """Free ``mem_alloc`` memory (no work using it may still run)."""

    def mem_alloc_async(self, size: int, stream: Stream) -> int:
        """Stream-ordered device memory from the device's memory pool: its device address."""

    def mem_free_async(self, ptr: int, stream: Stream) -> None:
        """Free ``mem_alloc_async`` memory after the work enqueued on ``stream`` so far."""

    def configure_memory_pool(self, device: Any, release_threshold: int) -> None:
        """Let the device's default memory pool keep ``release_threshold`` bytes reserved
        instead of returning freed memory to the system at each synchronisation."""

    def host_alloc(self, size: int) -> int:
        """Pinned host memory mapped into the device's address space: its host address."""

    def host_free(self, ptr: int) -> None:
        """Free ``host_alloc`` memory."""

    def host_device_pointer(self, ptr: int) -> int:
        """The device address of pinned host memory at host address ``ptr``."""

    def memset_async(self, ptr: int, value: int, element_size: int, count: int, stream: Stream) -> None:
        """Fill ``count`` elements of ``element_size`` (1, 2 or 4) bytes at ``ptr`` with ``value``."""

    def memcpy_dtod_async(self, dst: int, src: int, size: int, stream: Stream) -> None:
        """Copy ``size`` bytes between device addresses."""

    def memcpy_htod_async(self, dst: int, host: int, size: int, stream: Stream) -> None:
        """Copy ``size`` bytes from pinned host memory to a device address."""

    def memcpy_htod(self, dst: int, host: int, size: int) -> None:
        """Copy host memory (pageable or pinned) to a device address and wait for the copy."""

    def memcpy_dtoh(self, host: int, src: int, size: int) -> None:
        """Copy from a device address to host memory and wait for the copy."""

    # -- modules ---------------------------------------------------------------------------------
    def module_load(self, image: bytes) -> Module:
        """Load a code object (cubin, NUL-terminated PTX, hsaco) into the current context."""

    def module_unload(self, module: Module) -> None:
        """Unload a module none of whose functions will run again."""

    def module_function(self, module: Module, name: str) -> Function:
        """The kernel ``name`` of ``module``; ``NotFoundError`` when it has none of that name."""

    def function_max_threads(self, function: Function) -> int:
        """The most threads per block a launch of ``function`` may use."""

    # -- prepared calls (the stream command buffer's issue loop) ------------------------------------
    def prepare_launch(
        self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int], stream: Stream, params: int
    ) -> PreparedCall:
        """A kernel launch; ``params`` is the address of a packed ``void**`` array (0: no parameters).
        The array is read at each ``run_prepared``, so patching its values changes later launches."""

    def prepare_memset(self, ptr: int, value: int, element_size: int, count: int, stream: Stream) -> PreparedCall:
        """A ``memset_async`` call."""

    def prepare_copy(self, dst: int, src: int, size: int, stream: Stream) -> PreparedCall:
        """A ``memcpy_dtod_async`` call."""

    def prepare_upload(self, dst: int, host: int, size: int, stream: Stream) -> PreparedCall:
        """A ``memcpy_htod_async`` call from pinned host memory."""

    def run_prepared(self, calls: Sequence[PreparedCall]) -> None:
        """Issue prepared calls in order; raise the HalError of the first failing one (the later
        ones are not issued)."""

    # -- graphs ----------------------------------------------------------------------------------
    def graph_create(self) -> Graph:
        """An empty graph."""

    def graph_destroy(self, graph: Graph) -> None:
        """Destroy a graph (its executable graphs stay valid)."""

    def kernel_node_params(
        self, function: Function, grid: tuple[int, int, int], block: tuple[int, int, int], params: int
    ) -> NodeParams:
        """Parameters of a kernel node (``params`` as for ``prepare_launch``, read when the node is
        added or an executable graph's node is set)."""

    def memset_node_params(self, ptr: int, value: int, element_size: int, count: int) -> NodeParams:
        """Parameters of a 1-D memset node."""

    def set_memset_node_target(self, params: NodeParams, ptr: int, count: int) -> None:
        """Point memset parameters at another range (host-side; apply with ``exec_set_memset_params``)."""

    def memcpy_node_params(self, dst: int, src: int, size: int) -> NodeParams:
        """Parameters of a 1-D copy node between device addresses."""

    def set_memcpy_node_target(self, params: NodeParams, dst: int, src: int, size: int) -> None:
        """Point copy parameters at other ranges (host-side; apply with ``exec_set_memcpy_params``)."""

    def graph_add_kernel_node(self, graph: Graph, deps: list[GraphNode], params: NodeParams) -> GraphNode:
        """Add a kernel node depending on ``deps`` (nodes of the same graph)."""

    def graph_add_memset_node(self, graph: Graph, deps: list[GraphNode], params: NodeParams) -> GraphNode:
        """Add a memset node depending on ``deps``."""

    def graph_add_memcpy_node(self, graph: Graph, deps: list[GraphNode], params: NodeParams) -> GraphNode:
        """Add a copy node depending on ``deps``."""

    def graph_add_empty_node(self, graph: Graph, deps: list[GraphNode]) -> GraphNode:
        """Add an empty node depending on ``deps`` (a join)."""

    def graph_instantiate(self, graph: Graph) -> GraphExec:
        """Instantiate ``graph`` into an executable graph."""

    def graph_exec_destroy(self, graph_exec: GraphExec) -> None:
        """Destroy an executable graph (no launch of it may still run)."""

    def graph_launch(self, graph_exec: GraphExec, stream: Stream) -> None:
        """Enqueue one run of the executable graph on ``stream``."""

    def stream_begin_capture(self, stream: Stream) -> None:
        """Start capturing the work enqueued on ``stream`` into a graph instead of running it
        (thread-local capture mode: other threads' calls are unaffected)."""

    def stream_end_capture(self, stream: Stream) -> Graph:
        """End the capture begun on ``stream``: the graph of the captured work (the caller destroys it)."""

    def graph_add_child_graph_node(self, graph: Graph, deps: list[GraphNode], child: Graph) -> GraphNode:
        """Add a node running a copy of graph ``child`` depending on ``deps``."""

    def exec_set_child_graph(self, graph_exec: GraphExec, node: GraphNode, child: Graph) -> bool:
        """Replace a child-graph node's graph in place with ``child`` (of the same shape): True if
        done, False if refused (as ``exec_set_memset_params``)."""

    def exec_set_kernel_params(self, graph_exec: GraphExec, node: GraphNode, params: NodeParams) -> None:
        """Change a kernel node of the executable graph in place (later launches only)."""

    def exec_set_memset_params(self, graph_exec: GraphExec, node: GraphNode, params: NodeParams) -> bool:
        """Change a memset node in place: True if done, False if the vendor refused the change
        in place (the caller re-instantiates the graph)."""

    def exec_set_memcpy_params(self, graph_exec: GraphExec, node: GraphNode, params: NodeParams) -> bool:
        """Change a copy node in place: True if done, False if refused (as ``exec_set_memset_params``)."""


def missing_members(api: object) -> list[str]:
    """The ``GpuApi`` members ``api`` (an instance or a class) lacks: [] for a complete shim."""
    return sorted(name for name in protocol_members() if not hasattr(api, name))


def protocol_members() -> list[str]:
    """The names every ``GpuApi`` implementation defines."""
    names = set(GpuApi.__annotations__)
    names.update(name for name, value in vars(GpuApi).items() if callable(value) and not name.startswith("_"))
    return sorted(names)
