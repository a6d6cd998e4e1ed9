"""The part of a ``GpuApi`` shim that vendor bindings of one style share.

It lives beside the drivers, not in ``hal/drivers/gpu``: the GPU-generic code
knows no vendor calling convention, and status tuples are one.

cuda.bindings and hip-python both return ``(status, values...)`` tuples, and
their stream, event, memory, module and graph functions take the same
arguments in the same order. ``BindingsShim`` implements those calls once;
a vendor shim (``hal/drivers/cuda/api.py``, ``hal/drivers/hip/api.py``)
subclasses it, sets the vendor's functions, flags and status table in the
attributes listed on the class, and adds what differs: context activation,
graph copy/memset nodes, kernel node records and launch argument forms.

A failing status becomes the vendor table's ``HalError`` naming the vendor
function that failed (its ``__name__``). Prepared calls are ``(function,
arguments)`` pairs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from hal.drivers import native_calls
from hal.drivers.gpu.status import StatusTable


def _native_failure(status: StatusTable, status_of: Callable[[int], Any],
                    functions: dict[str, Any]) -> Callable[[int, str], NoReturn]:
    """The handler the native calls call with a failing raw status and the call's name: raises the
    HalError the bindings call ``functions[name]`` would have (it holds no reference to the shim,
    which holds the native calls)."""
    names = {call: getattr(function, "__name__", str(function)) for call, function in functions.items()}

    def fail(code: int, call: str) -> NoReturn:
        raise status.error(status_of(code), names[call], "")

    return fail


class BindingsShim:
    """Calls of ``GpuApi`` common to tuple-returning bindings (see the module docstring).

    Built from the vendor's functions for the shared calls (its column of ``FUNCTIONS``;
    ``make_current`` makes a context current on the calling thread) and its ``VALUES``:
    ``status`` (a ``StatusTable``), ``not_ready`` (the status ``event_query`` reads as "still
    running"), ``update_rejected`` (statuses refusing a graph node update in place), the flags
    of new streams (not synchronising with the legacy stream), events (no timing), timing events
    (used only while tracing) and host memory (pinned, portable, mapped), ``max_threads_attribute``
    (the function attribute of the most threads per block) and ``memset_params_type`` (the
    memset node record: fields dst, value, elementSize, width, height, pitch) and ``capture_mode``
    (the thread-local stream capture mode).
    """

    def __init__(self, bindings: Any, vendor: str, values: dict[str, Any]) -> None:
        """``bindings``: the vendor's module; ``vendor``: its column of ``FUNCTIONS``; ``values``: ``VALUES``."""
        missing = set(VALUES) - set(values)
        if missing:
            raise TypeError(f"vendor values missing: {sorted(missing)}")
        self.vendor = vendor
        column = VENDORS.index(vendor)
        f = {key: getattr(bindings, names[column]) for key, names in FUNCTIONS.items()}
        self.status: StatusTable = values["status"]
        self.not_ready = values["not_ready"]
        self.update_rejected: tuple[Any, ...] = values["update_rejected"]
        self.stream_flags, self.event_flags = values["stream_flags"], values["event_flags"]
        self.timing_event_flags = values["timing_event_flags"]
        self.host_flags, self.max_threads_attribute = values["host_flags"], values["max_threads_attribute"]
        self.memset_params_type: Callable[[], Any] = values["memset_params_type"]
        self._make_current = f["make_current"]
        self._stream_create, self._stream_destroy = f["stream_create"], f["stream_destroy"]
        self._stream_synchronize, self._stream_wait = f["stream_synchronize"], f["stream_wait_event"]
        self._event_create, self._event_destroy = f["event_create"], f["event_destroy"]
        self._event_record, self._event_query = f["event_record"], f["event_query"]
        self._event_sync, self._event_elapsed = f["event_synchronize"], f["event_elapsed_time"]
        self._mem_alloc, self._mem_free = f["mem_alloc"], f["mem_free"]
        self._mem_alloc_async, self._mem_free_async = f["mem_alloc_async"], f["mem_free_async"]
        self._host_alloc, self._host_free = f["host_alloc"], f["host_free"]
        self._host_device_pointer = f["host_device_pointer"]
        self._memset = {1: f["memset_d8_async"], 2: f["memset_d16_async"], 4: f["memset_d32_async"]}
        self._memcpy_dtod_async, self._memcpy_htod_async = f["memcpy_dtod_async"], f["memcpy_htod_async"]
        self._memcpy_htod, self._memcpy_dtoh = f["memcpy_htod"], f["memcpy_dtoh"]
        self._module_load, self._module_unload = f["module_load"], f["module_unload"]
        self._module_function, self._function_attribute = f["module_function"], f["function_attribute"]
        self._graph_create, self._graph_destroy = f["graph_create"], f["graph_destroy"]
        self._graph_add_kernel, self._graph_add_empty = f["graph_add_kernel_node"], f["graph_add_empty_node"]
        self._graph_instantiate, self._graph_exec_destroy = f["graph_instantiate"], f["graph_exec_destroy"]
        self._graph_launch, self._exec_kernel = f["graph_launch"], f["exec_set_kernel_params"]
        self._begin_capture, self._end_capture = f["stream_begin_capture"], f["stream_end_capture"]
        self._add_child, self._exec_child = f["graph_add_child_graph_node"], f["exec_set_child_graph"]
        self.capture_mode = values["capture_mode"]
        #: Per thread: the context made current last (``activate``).
        self._current = threading.local()
        #: The hot calls made from C (``use_native``), or None: the bindings make every call.
        self.native: Any = None

    # -- native calls ----------------------------------------------------------------------------
    def use_native(self, library: str, launch: str) -> None:
        """Make the calls of every submission (launches, graph launch, event record / query /
        synchronize, stream wait) through ``hal.drivers._native`` from the loaded ``library``
        (``launch``: its kernel launch function) where the extension loads (``native_calls``).
        Handles go to it as integers; a failing status raises the same HalError as through
        the bindings."""
        column = VENDORS.index(self.vendor)
        names = {name: FUNCTIONS[name][column] for name in native_calls.CALLS if name != "launch"}
        calls = native_calls.load(library, {**names, "launch": launch})
        if calls is None:
            return
        from hal.drivers._native import pack_launch

        self.native = calls
        #: A kernel launch as the packed fields ``run_prepared`` launches from C (handles as ints).
        self.pack_launch = pack_launch
        self._status_of = type(self.not_ready)  # a raw status back to the vendor's enum, for errors
        self._launch_name = launch
        # The hot calls are the extension's own methods, bound here: no Python frame around them.
        # A failing status calls back into Python (the handler raises the bindings' HalError).
        calls.set_failure(_native_failure(self.status, self._status_of, {
            "graph_launch": self._graph_launch, "event_record": self._event_record,
            "event_query": self._event_query, "event_synchronize": self._event_sync,
            "stream_wait_event": self._stream_wait}), int(self.not_ready))
        self.stream_create = self._native_stream_create  # type: ignore[method-assign]
        self.event_create = self._native_event_create  # type: ignore[method-assign]
        self.timing_event_create = self._native_timing_event_create  # type: ignore[method-assign]
        self.graph_instantiate = self._native_graph_instantiate  # type: ignore[method-assign]
        self.module_function = self._native_module_function  # type: ignore[method-assign]
        self.run_prepared = self._native_run_prepared  # type: ignore[method-assign]
        self.graph_launch = calls.checked_graph_launch  # type: ignore[method-assign]
        self.event_record = calls.checked_event_record  # type: ignore[method-assign]
        self.event_query = calls.checked_event_query  # type: ignore[method-assign]
        self.event_synchronize = calls.checked_event_synchronize  # type: ignore[method-assign]
        wait = calls.checked_stream_wait_event
        self.stream_wait_event = lambda stream, event: wait(stream, event, 0)  # type: ignore[method-assign]
        # The per-thread check of activate in C; a switch still runs the method below (which records
        # the context for the calls that take it explicitly).
        calls.set_activate(self.activate)
        self.activate = calls.activate  # type: ignore[method-assign]

    def _native_fail(self, status: int, function: Any) -> NoReturn:
        self.fail(self._status_of(status), function)

    # Handles made while the native calls serve are plain ints (the bindings take ints for every
    # handle too): the hot calls then pass them on with no conversion.
    def _native_stream_create(self) -> int:
        return int(self.call(self._stream_create, self.stream_flags))

    def _native_event_create(self) -> int:
        return int(self.call(self._event_create, self.event_flags))

    def _native_timing_event_create(self) -> int:
        return int(self.call(self._event_create, self.timing_event_flags))

    def _native_graph_instantiate(self, graph: Any) -> int:
        return int(self.call(self._graph_instantiate, graph, 0))

    def _native_module_function(self, module: Any, name: str) -> int:
        # an int: each launch a stream command buffer prepares packs it with no conversion
        return int(BindingsShim.module_function(self, module, name))

    def _native_run_prepared(self, calls: Sequence[Any]) -> None:
        failed = self.native.run(calls)
        if failed is not None:
            index, err = failed
            call = calls[index]
            if type(call) is bytes:  # a packed launch: a raw status
                self._native_fail(err, self._launch_name)
            self.fail(err, call[0])

    # -- status ----------------------------------------------------------------------------------
    def fail(self, code: Any, function: Any, detail: str = "") -> NoReturn:
        """Raise the HalError of a failing status of ``function`` (a vendor function or its name)."""
        raise self.status.error(code, getattr(function, "__name__", str(function)), detail)

    def call(self, function: Callable[..., tuple], *args: Any) -> Any:
        """``function(*args)``; raises for a failing status; its single value (None if it has none)."""
        result = function(*args)
        if result[0]:
            self.fail(result[0], function)
        return result[1] if len(result) > 1 else None

    def node_list(self, deps: list) -> Any:
        """Dependencies as the vendor's node-array argument (a list where the bindings accept one)."""
        return deps

    # -- context ---------------------------------------------------------------------------------
    def activate(self, context: Any) -> None:
        current = self._current
        if getattr(current, "context", None) is not context:
            err = self._make_current(context)[0]
            if err:
                self.fail(err, self._make_current)
            current.context = context

    # -- streams and events ------------------------------------------------------------------------
    def stream_create(self) -> Any:
        return self.call(self._stream_create, self.stream_flags)

    def stream_destroy(self, stream: Any) -> None:
        self.call(self._stream_destroy, stream)

    def stream_synchronize(self, stream: Any) -> None:
        self.call(self._stream_synchronize, stream)

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        err = self._stream_wait(stream, event, 0)[0]
        if err:
            self.fail(err, self._stream_wait)

    def event_create(self) -> Any:
        return self.call(self._event_create, self.event_flags)

    def event_destroy(self, event: Any) -> None:
        self.call(self._event_destroy, event)

    def event_record(self, event: Any, stream: Any) -> None:
        err = self._event_record(event, stream)[0]
        if err:
            self.fail(err, self._event_record)

    def event_query(self, event: Any) -> bool:
        err = self._event_query(event)[0]
        if not err:
            return True
        if err == self.not_ready:
            return False
        self.fail(err, self._event_query)

    def event_synchronize(self, event: Any) -> None:
        err = self._event_sync(event)[0]
        if err:
            self.fail(err, self._event_sync)

    def timing_event_create(self) -> Any:
        return self.call(self._event_create, self.timing_event_flags)

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self.call(self._event_elapsed, start, end))

    # -- memory ------------------------------------------------------------------------------------
    def mem_alloc(self, size: int) -> int:
        return int(self.call(self._mem_alloc, size))

    def mem_free(self, ptr: int) -> None:
        self.call(self._mem_free, ptr)

    def mem_alloc_async(self, size: int, stream: Any) -> int:
        return int(self.call(self._mem_alloc_async, size, stream))

    def mem_free_async(self, ptr: int, stream: Any) -> None:
        self.call(self._mem_free_async, ptr, stream)

    def host_alloc(self, size: int) -> int:
        return int(self.call(self._host_alloc, size, self.host_flags))

    def host_free(self, ptr: int) -> None:
        self.call(self._host_free, ptr)

    def host_device_pointer(self, ptr: int) -> int:
        return int(self.call(self._host_device_pointer, ptr, 0))

    def memset_async(self, ptr: int, value: int, element_size: int, count: int, stream: Any) -> None:
        function = self._memset[element_size]
        err = function(ptr, value, count, stream)[0]
        if err:
            self.fail(err, function)

    def memcpy_dtod_async(self, dst: int, src: int, size: int, stream: Any) -> None:
        err = self._memcpy_dtod_async(dst, src, size, stream)[0]
        if err:
            self.fail(err, self._memcpy_dtod_async)

    def memcpy_htod_async(self, dst: int, host: int, size: int, stream: Any) -> None:
        err = self._memcpy_htod_async(dst, host, size, stream)[0]
        if err:
            self.fail(err, self._memcpy_htod_async)

    def memcpy_htod(self, dst: int, host: int, size: int) -> None:
        self.call(self._memcpy_htod, dst, host, size)

    def memcpy_dtoh(self, host: int, src: int, size: int) -> None:
        self.call(self._memcpy_dtoh, host, src, size)

    # -- modules -----------------------------------------------------------------------------------
    def module_load(self, image: bytes) -> Any:
        return self.call(self._module_load, image)

    def module_unload(self, module: Any) -> None:
        self.call(self._module_unload, module)

    def module_function(self, module: Any, name: str) -> Any:
        err, *value = self._module_function(module, name.encode())
        if err:
            self.fail(err, self._module_function, f"no kernel {name!r}")
        return value[0]

    def function_max_threads(self, function: Any) -> int:
        return int(self.call(self._function_attribute, self.max_threads_attribute, function))

    # -- prepared calls --------------------------------------------------------------------------------
    def prepare_memset(self, ptr: int, value: int, element_size: int, count: int, stream: Any) -> tuple:
        return (self._memset[element_size], (ptr, value, count, stream))

    def prepare_copy(self, dst: int, src: int, size: int, stream: Any) -> tuple:
        return (self._memcpy_dtod_async, (dst, src, size, stream))

    def prepare_upload(self, dst: int, host: int, size: int, stream: Any) -> tuple:
        return (self._memcpy_htod_async, (dst, host, size, stream))

    def run_prepared(self, calls: Sequence[tuple[Callable[..., tuple], tuple]]) -> None:
        for function, args in calls:
            err = function(*args)[0]
            if err:
                self.fail(err, function)

    # -- graphs --------------------------------------------------------------------------------------
    def graph_create(self) -> Any:
        return self.call(self._graph_create, 0)

    def graph_destroy(self, graph: Any) -> None:
        self.call(self._graph_destroy, graph)

    def memset_node_params(self, ptr: int, value: int, element_size: int, count: int) -> Any:
        p = self.memset_params_type()
        p.dst = ptr
        p.value = value
        p.elementSize = element_size
        p.width = count
        p.height = 1
        p.pitch = 0
        return p

    def set_memset_node_target(self, params: Any, ptr: int, count: int) -> None:
        params.dst = ptr
        params.width = count

    def graph_add_kernel_node(self, graph: Any, deps: list, params: Any) -> Any:
        return self.call(self._graph_add_kernel, graph, self.node_list(deps), len(deps), params)

    def graph_add_empty_node(self, graph: Any, deps: list) -> Any:
        return self.call(self._graph_add_empty, graph, self.node_list(deps), len(deps))

    def graph_instantiate(self, graph: Any) -> Any:
        return self.call(self._graph_instantiate, graph, 0)

    def graph_exec_destroy(self, graph_exec: Any) -> None:
        self.call(self._graph_exec_destroy, graph_exec)

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        err = self._graph_launch(graph_exec, stream)[0]
        if err:
            self.fail(err, self._graph_launch)

    def exec_set_kernel_params(self, graph_exec: Any, node: Any, params: Any) -> None:
        err = self._exec_kernel(graph_exec, node, params)[0]
        if err:
            self.fail(err, self._exec_kernel)

    def stream_begin_capture(self, stream: Any) -> None:
        self.call(self._begin_capture, stream, self.capture_mode)

    def stream_end_capture(self, stream: Any) -> Any:
        return self.call(self._end_capture, stream)

    def graph_add_child_graph_node(self, graph: Any, deps: list, child: Any) -> Any:
        return self.call(self._add_child, graph, self.node_list(deps), len(deps), child)

    def exec_set_child_graph(self, graph_exec: Any, node: Any, child: Any) -> bool:
        return self.updated(self._exec_child(graph_exec, node, child)[0], self._exec_child)

    def updated(self, err: Any, function: Any) -> bool:
        """A graph node update's status: True for success, False for a change refused in place;
        raises for other failures."""
        if not err:
            return True
        if err in self.update_rejected:
            return False
        self.fail(err, function)


#: The vendors whose bindings take the shared calls' arguments alike: the columns of ``FUNCTIONS``.
VENDORS = ("cuda", "hip")

#: Per shared call: the CUDA driver API function and the HIP runtime function that make it.
FUNCTIONS = {
    "make_current": ("cuCtxSetCurrent", "hipSetDevice"),
    "stream_create": ("cuStreamCreate", "hipStreamCreateWithFlags"),
    "stream_destroy": ("cuStreamDestroy", "hipStreamDestroy"),
    "stream_synchronize": ("cuStreamSynchronize", "hipStreamSynchronize"),
    "stream_wait_event": ("cuStreamWaitEvent", "hipStreamWaitEvent"),
    "event_create": ("cuEventCreate", "hipEventCreateWithFlags"),
    "event_destroy": ("cuEventDestroy", "hipEventDestroy"),
    "event_record": ("cuEventRecord", "hipEventRecord"),
    "event_query": ("cuEventQuery", "hipEventQuery"),
    "event_synchronize": ("cuEventSynchronize", "hipEventSynchronize"),
    "event_elapsed_time": ("cuEventElapsedTime", "hipEventElapsedTime"),
    "mem_alloc": ("cuMemAlloc", "hipMalloc"),
    "mem_free": ("cuMemFree", "hipFree"),
    "mem_alloc_async": ("cuMemAllocAsync", "hipMallocAsync"),
    "mem_free_async": ("cuMemFreeAsync", "hipFreeAsync"),
    "host_alloc": ("cuMemHostAlloc", "hipHostMalloc"),
    "host_free": ("cuMemFreeHost", "hipHostFree"),
    "host_device_pointer": ("cuMemHostGetDevicePointer", "hipHostGetDevicePointer"),
    "memset_d8_async": ("cuMemsetD8Async", "hipMemsetD8Async"),
    "memset_d16_async": ("cuMemsetD16Async", "hipMemsetD16Async"),
    "memset_d32_async": ("cuMemsetD32Async", "hipMemsetD32Async"),
    "memcpy_dtod_async": ("cuMemcpyDtoDAsync", "hipMemcpyDtoDAsync"),
    "memcpy_htod_async": ("cuMemcpyHtoDAsync", "hipMemcpyHtoDAsync"),
    "memcpy_htod": ("cuMemcpyHtoD", "hipMemcpyHtoD"),
    "memcpy_dtoh": ("cuMemcpyDtoH", "hipMemcpyDtoH"),
    "module_load": ("cuModuleLoadData", "hipModuleLoadData"),
    "module_unload": ("cuModuleUnload", "hipModuleUnload"),
    "module_function": ("cuModuleGetFunction", "hipModuleGetFunction"),
    "function_attribute": ("cuFuncGetAttribute", "hipFuncGetAttribute"),
    "graph_create": ("cuGraphCreate", "hipGraphCreate"),
    "graph_destroy": ("cuGraphDestroy", "hipGraphDestroy"),
    "graph_add_kernel_node": ("cuGraphAddKernelNode", "hipGraphAddKernelNode"),
    "graph_add_empty_node": ("cuGraphAddEmptyNode", "hipGraphAddEmptyNode"),
    "graph_instantiate": ("cuGraphInstantiate", "hipGraphInstantiateWithFlags"),
    "graph_exec_destroy": ("cuGraphExecDestroy", "hipGraphExecDestroy"),
    "graph_launch": ("cuGraphLaunch", "hipGraphLaunch"),
    "exec_set_kernel_params": ("cuGraphExecKernelNodeSetParams", "hipGraphExecKernelNodeSetParams"),
    "stream_begin_capture": ("cuStreamBeginCapture", "hipStreamBeginCapture"),
    "stream_end_capture": ("cuStreamEndCapture", "hipStreamEndCapture"),
    "graph_add_child_graph_node": ("cuGraphAddChildGraphNode", "hipGraphAddChildGraphNode"),
    "exec_set_child_graph": ("cuGraphExecChildGraphNodeSetParams", "hipGraphExecChildGraphNodeSetParams"),
}

#: The vendor values a shim is built with (see ``BindingsShim``).
VALUES = (
    "status", "not_ready", "update_rejected", "stream_flags", "event_flags", "timing_event_flags", "host_flags",
    "max_threads_attribute", "memset_params_type", "capture_mode",
)  # fmt: skip


def check(table: StatusTable, result: tuple, function: str, detail: str = "") -> Any:
    """Raise ``table``'s HalError for a failing status tuple; else its single value, the tuple of its
    values, or None."""
    if result[0]:
        raise table.error(result[0], function, detail)
    if len(result) == 2:
        return result[1]
    return result[1:] or None


def process_wide(factory: Callable[[], Any]) -> Callable[[], Any]:
    """A getter making ``factory()`` once per process, on first use (thread-safe)."""
    lock = threading.Lock()
    made: list[Any] = []

    def get() -> Any:
        with lock:
            if not made:
                made.append(factory())
            return made[0]

    return get
