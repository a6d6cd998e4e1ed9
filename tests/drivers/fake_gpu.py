"""A simulated GPU API for testing the GPU-generic driver logic on a machine without a GPU.

``FakeGpuApi`` implements the declared GPU API (``hal.drivers.gpu.api.GpuApi``)
with host memory and one worker thread per stream, keeping the CUDA semantics the
generic code relies on: stream order, events that capture the work recorded
before them, ``cuStreamWaitEvent`` capturing the event's state at call time,
kernel parameters copied at launch / node creation / exec update time, graph
nodes run in dependency order, updates affecting later launches only, and
sticky faults (a raising kernel makes every later call fail). Kernels are
numpy callables (the CTS's ``numpy`` format). A call on a destroyed stream or
event (a crash on a real GPU) is recorded in ``use_after_destroy`` and raises,
so tests catch it without hardware. Failures are reported with CUDA's or HIP's
status conventions (``VENDORS``), as the vendor's shim would.

``fake-gpu`` registers as a HAL driver (``HAL_PLUGINS=tests.drivers.fake_gpu``)
so the conformance suite runs the generic GPU driver end to end:
``pytest tests/cts --driver fake-gpu [--driver-option command_buffer=graph]``.

``FakeNccl`` stands for NCCL behind the driver's channels: calls between ``group_start`` and
``group_end`` become one piece of stream work per stream (captured like any other while the
stream captures) that meets the other ranks' work and computes the result in host memory with
the CPU drivers' reference (``hal.drivers.local.channel``); a piece of work whose peers never come
returns once its communicator is aborted (as NCCL's kernels do: the HAL's watchdog aborts it at the
channel's timeout) and faults its stream after ``FakeNccl.TIMEOUT`` seconds otherwise.
``FakeRccl`` (``HAL_FAKE_COLLECTIVES=rccl``) is the same as the HIP driver's RCCL adapter presents
it: blocking communicators, and splits that must complete within their call, outside any group.
"""

from __future__ import annotations

import bisect
import ctypes
import enum
import functools
import gc
import itertools
import os
import queue
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

from hal.channel import Collective
from hal.driver import DeviceInfo, Driver
from hal.drivers.cuda.status import CUDA
from hal.drivers.gpu.channel import GpuCollectives
from hal.drivers.gpu.device import GpuDevice
from hal.drivers.gpu.executable_cache import ExecutableCache, GpuExecutable
from hal.drivers.gpu.status import StatusTable
from hal.drivers.hip.status import HIP
from hal.drivers.local.channel import Arrival, Group
from hal.drivers.local.executable import NumpyExecutable
from hal.errors import AbortedError, FailedPreconditionError, InternalError, InvalidArgumentError, UnimplementedError
from hal.registry import DriverFactory, hookimpl


class FakeResult(enum.IntEnum):
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_LAUNCH_FAILED = 719
    CUDA_ERROR_NOT_SUPPORTED = 801


class FakeHipResult(enum.IntEnum):
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorInvalidHandle = 400
    hipErrorLaunchFailure = 719
    hipErrorNotSupported = 801


class Conventions(NamedTuple):
    """What a vendor's shim stands for: its status table and codes (invalid value, out of memory,
    invalid handle, a sticky launch failure, an operation not supported) and the device context it
    is handed (CUDA: a context object; HIP: the device ordinal, 0 for the first device)."""

    status: StatusTable
    invalid_value: enum.IntEnum
    out_of_memory: enum.IntEnum
    invalid_handle: enum.IntEnum
    launch_failed: enum.IntEnum
    not_supported: enum.IntEnum
    context: Any


def ALLOCATION() -> None:
    """Captured work standing for a memory allocation node (it does nothing when run)."""


VENDORS = {
    "cuda": Conventions(CUDA, *FakeResult, context=1),
    "hip": Conventions(HIP, *FakeHipResult, context=0),
}


class FakeModule:
    """A loaded module of the simulated GPU: the spec it was made from (for what a test reports)."""

    def __init__(self, spec) -> None:
        self.spec = spec


class FakeFunction:
    def __init__(self, fn, bindings: int, constants: int) -> None:
        self.fn = fn
        self.bindings = bindings
        self.constants = constants

    def read_args(self, params: int) -> tuple[list[int], list[int]]:
        count = self.bindings + self.constants
        if not count:
            return [], []
        slots = (ctypes.c_uint64 * count).from_address(params)
        pointers = [ctypes.c_uint64.from_address(slots[i]).value for i in range(self.bindings)]
        constants = [ctypes.c_uint32.from_address(slots[self.bindings + i]).value for i in range(self.constants)]
        return pointers, constants


class FakeIndirectFunction(FakeFunction):
    """An export's indirect-binding variant: parameter 0 is the address of a table of binding addresses."""

    def read_args(self, params: int):
        slots = (ctypes.c_uint64 * (1 + self.constants)).from_address(params)
        table = ctypes.c_uint64.from_address(slots[0]).value
        constants = [ctypes.c_uint32.from_address(slots[1 + i]).value for i in range(self.constants)]
        return _TableRef(table, self.bindings), constants


class _TableRef:
    """Binding addresses read from device memory when the kernel runs, as the real variant does."""

    def __init__(self, address: int, count: int) -> None:
        self.address = address
        self.count = count

    def read(self) -> list[int]:
        return list((ctypes.c_uint64 * self.count).from_address(self.address))


class _Event:
    def __init__(self) -> None:
        self.destroyed = False
        self.recorded = 0
        self.completed = 0
        self.completed_at = 0.0  # perf_counter when the stream reached it (timing events)
        self.cond = threading.Condition()


class _Stream:
    def __init__(self, api: FakeGpuApi) -> None:
        self.api = api
        self.destroyed = False
        #: While capturing (stream_begin_capture): the work enqueued since, instead of run.
        self.capture: list | None = None
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True, name="fake-gpu-stream")
        self.thread.start()

    def _run(self) -> None:
        while True:
            work = self.inbox.get()
            if work is None:
                return
            if self.api.fault is None:
                try:
                    work()
                except Exception as exc:  # a kernel fault: sticky, like CUDA_ERROR_LAUNCH_FAILED
                    self.api.fault = exc
            elif getattr(work, "always", False):
                work()


class FakeGpuApi:
    name = "fake"

    def __init__(self, vendor: str = "cuda") -> None:
        #: Whose status conventions the simulated failures follow (``VENDORS``).
        self.conventions = VENDORS[vendor]
        self.fault: BaseException | None = None
        #: When set, exec_set_memset_params / exec_set_memcpy_params refuse every change in place.
        self.reject_updates = False
        #: Calls made on destroyed streams or events ("function: handle"), each a crash on a real GPU.
        self.use_after_destroy: list[str] = []
        self._memory: dict[int, np.ndarray] = {}
        self._bases: list[int] = []
        # Re-entrant: objects made under it (a view's memoryview) may start the cycle collector, whose
        # finalizers free memory (mem_free) on this same thread; a real driver runs no Python inside.
        self._lock = threading.RLock()
        self.calls: dict[str, int] = {}
        #: The modules loaded and not unloaded (``load_numpy_module``), by id.
        self.modules: dict[int, FakeModule] = {}

    def _destroyed(self, function: str, handle: object) -> None:
        self.use_after_destroy.append(f"{function}: {handle!r}")
        self._raise(self.conventions.invalid_handle, function)

    def _check(self, function: str) -> None:
        self.calls[function] = self.calls.get(function, 0) + 1
        if self.fault is not None:
            self._raise(self.conventions.launch_failed, function)

    def _raise(self, code: enum.IntEnum, function: str) -> None:
        raise self.conventions.status.error(code, function)

    # -- memory -------------------------------------------------------------------------
    def _allocate(self, size: int) -> int:
        if size > 1 << 34:
            self._raise(self.conventions.out_of_memory, "cuMemAlloc")
        array = np.zeros(size + 8, dtype=np.uint8)
        ptr = array.ctypes.data
        with self._lock:
            self._memory[ptr] = array
            bisect.insort(self._bases, ptr)
        return ptr

    def _release(self, ptr: int) -> None:
        with self._lock:
            if ptr not in self._memory:
                self._raise(self.conventions.invalid_value, "cuMemFree")
            del self._memory[ptr]
            self._bases.remove(ptr)

    def view(self, ptr: int) -> memoryview:
        """Bytes from ``ptr`` to the end of its allocation (what a kernel may touch)."""
        with self._lock:
            index = bisect.bisect_right(self._bases, ptr) - 1
            if index < 0:
                raise RuntimeError(f"illegal address 0x{ptr:x}")
            base = self._bases[index]
            array = self._memory[base]
            if ptr - base > len(array) - 8:
                raise RuntimeError(f"illegal address 0x{ptr:x}")
            return memoryview(array[ptr - base:len(array) - 8])

    @property
    def live_allocations(self) -> int:
        return len(self._memory)

    def mem_alloc(self, size: int) -> int:
        self._check("cuMemAlloc")
        return self._allocate(size)

    def mem_free(self, ptr: int) -> None:
        self._check("cuMemFree")
        self._release(ptr)

    def mem_alloc_async(self, size: int, stream: _Stream) -> int:
        if stream.destroyed:
            self._destroyed("cuMemAllocAsync", stream)
        self._check("cuMemAllocAsync")
        return self._allocate(size)

    def mem_free_async(self, ptr: int, stream: _Stream) -> None:
        if stream.destroyed:
            self._destroyed("cuMemFreeAsync", stream)
        self._check("cuMemFreeAsync")
        stream.inbox.put(lambda: self._release(ptr))

    def host_alloc(self, size: int) -> int:
        self._check("cuMemHostAlloc")
        return self._allocate(size)

    def host_free(self, ptr: int) -> None:
        self._check("cuMemFreeHost")
        self._release(ptr)

    def host_device_pointer(self, ptr: int) -> int:
        return ptr

    def configure_memory_pool(self, device: Any, release_threshold: int) -> None:
        pass

    @staticmethod
    def _memset(ptr: int, value: int, element_size: int, count: int) -> None:
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[element_size]
        np.frombuffer((ctypes.c_ubyte * (count * element_size)).from_address(ptr), dtype=dtype)[:] = value

    def memset_async(self, ptr: int, value: int, element_size: int, count: int, stream: _Stream) -> None:
        if stream.destroyed:
            self._destroyed("cuMemsetAsync", stream)
        self._check("cuMemsetAsync")
        stream.inbox.put(lambda: self._memset(ptr, value, element_size, count))

    def memcpy_dtod_async(self, dst: int, src: int, size: int, stream: _Stream) -> None:
        if stream.destroyed:
            self._destroyed("cuMemcpyDtoDAsync", stream)
        self._check("cuMemcpyDtoDAsync")
        work = lambda: ctypes.memmove(dst, src, size)  # noqa: E731
        if stream.capture is not None:  # (a library call's copy, captured with it)
            stream.capture.append(work)
        else:
            stream.inbox.put(work)

    def memcpy_htod_async(self, dst: int, host: int, size: int, stream: _Stream) -> None:
        if stream.destroyed:
            self._destroyed("cuMemcpyHtoDAsync", stream)
        self._check("cuMemcpyHtoDAsync")
        stream.inbox.put(lambda: ctypes.memmove(dst, host, size))

    def memcpy_htod(self, dst: int, host: int, size: int) -> None:
        self._check("cuMemcpyHtoD")
        ctypes.memmove(dst, host, size)

    def memcpy_dtoh(self, host: int, src: int, size: int) -> None:
        self._check("cuMemcpyDtoH")
        ctypes.memmove(host, src, size)

    # -- contexts, streams, events ------------------------------------------------------------
    def activate(self, context: Any) -> None:
        pass

    def stream_create(self) -> _Stream:
        self._check("cuStreamCreate")
        return _Stream(self)

    def stream_destroy(self, stream: _Stream) -> None:
        if stream.destroyed:
            self._destroyed("cuStreamDestroy", stream)
        stream.destroyed = True
        stream.inbox.put(None)

    def stream_synchronize(self, stream: _Stream) -> None:
        if stream.destroyed:
            self._destroyed("cuStreamSynchronize", stream)
        event = self.event_create()
        try:
            self.event_record(event, stream)
            self.event_synchronize(event)
        finally:
            self.event_destroy(event)

    def event_create(self) -> _Event:
        self._check("cuEventCreate")
        return _Event()

    def event_destroy(self, event: _Event) -> None:
        if event.destroyed:
            self._destroyed("cuEventDestroy", event)
        event.destroyed = True

    def event_record(self, event: _Event, stream: _Stream) -> None:
        if event.destroyed:
            self._destroyed("cuEventRecord", event)
        if stream.destroyed:
            self._destroyed("cuEventRecord", stream)
        self._check("cuEventRecord")
        with event.cond:
            event.recorded += 1
            generation = event.recorded

        def complete() -> None:
            with event.cond:
                event.completed = max(event.completed, generation)
                event.completed_at = time.perf_counter()
                event.cond.notify_all()

        complete.always = True  # type: ignore[attr-defined]
        stream.inbox.put(complete)

    def event_query(self, event: _Event) -> bool:
        if event.destroyed:
            self._destroyed("cuEventQuery", event)
        self._check("cuEventQuery")
        return event.completed >= event.recorded

    def event_synchronize(self, event: _Event) -> None:
        if event.destroyed:
            self._destroyed("cuEventSynchronize", event)
        with event.cond:
            target = event.recorded
            while event.completed < target:
                event.cond.wait()
        self._check("cuEventSynchronize")

    def timing_event_create(self) -> _Event:
        return self.event_create()

    def event_elapsed_ms(self, start: _Event, end: _Event) -> float:
        self._check("cuEventElapsedTime")
        if start.completed < start.recorded or end.completed < end.recorded:
            raise FailedPreconditionError("cuEventElapsedTime: an event has not completed")
        return (end.completed_at - start.completed_at) * 1000.0

    def stream_wait_event(self, stream: _Stream, event: _Event) -> None:
        if stream.destroyed:
            self._destroyed("cuStreamWaitEvent", stream)
        if event.destroyed:
            self._destroyed("cuStreamWaitEvent", event)
        self._check("cuStreamWaitEvent")
        target = event.recorded

        def wait() -> None:
            with event.cond:
                while event.completed < target:
                    event.cond.wait()

        wait.always = True  # type: ignore[attr-defined]
        stream.inbox.put(wait)

    # -- kernels --------------------------------------------------------------------------------
    def _run_kernel(self, function: FakeFunction, grid, pointers, constants: list[int]) -> None:
        if isinstance(pointers, _TableRef):
            pointers = pointers.read()
        views = [self.view(p) for p in pointers]
        function.fn(tuple(grid), views, constants)

    def launch_kernel(self, func: FakeFunction, gx, gy, gz, bx, by, bz, stream: _Stream, params: int) -> None:
        """cuLaunchKernel (the raw baseline of the benchmarks; the driver launches through prepare_launch)."""
        if stream.destroyed:
            self._destroyed("cuLaunchKernel", stream)
        self._check("cuLaunchKernel")
        pointers, constants = func.read_args(params)  # copied now, as cuLaunchKernel does
        stream.inbox.put(lambda: self._run_kernel(func, (gx, gy, gz), pointers, constants))

    def prepare_launch(self, func, grid, block, stream, params):
        return (self.launch_kernel, (func, *grid, *block, stream, params))

    def prepare_memset(self, ptr, value, element_size, count, stream):
        return (self.memset_async, (ptr, value, element_size, count, stream))

    def prepare_copy(self, dst, src, size, stream):
        return (self.memcpy_dtod_async, (dst, src, size, stream))

    def prepare_upload(self, dst, host, size, stream):
        return (self.memcpy_htod_async, (dst, host, size, stream))

    def run_prepared(self, calls) -> None:
        for call, args in calls:
            call(*args)

    def module_load(self, image: bytes) -> Any:
        raise UnimplementedError("the simulated GPU runs numpy executables only (no code objects)")

    def module_function(self, module: Any, name: str) -> Any:
        raise UnimplementedError("the simulated GPU runs numpy executables only (no code objects)")

    def function_max_threads(self, func: Any) -> int:
        return 1024

    def load_numpy_module(self, spec) -> FakeModule:
        """The simulated module of a numpy executable (what ``module_load`` is for a code object)."""
        self._check("cuModuleLoadData")
        module = FakeModule(spec)
        with self._lock:
            self.modules[id(module)] = module
        return module

    def module_unload(self, module: Any) -> None:
        self.calls["cuModuleUnload"] = self.calls.get("cuModuleUnload", 0) + 1  # (never fails, as a real unload)
        if isinstance(module, FakeModule):
            with self._lock:
                if self.modules.pop(id(module), None) is None:
                    self._destroyed("cuModuleUnload", module)

    # -- graphs -----------------------------------------------------------------------------------
    def graph_create(self) -> list:
        self._check("cuGraphCreate")
        return []

    def graph_destroy(self, graph: list) -> None:
        for node in graph:  # (its work is freed: what captured work holds goes with it)
            node["work"] = None
        graph.clear()

    def kernel_node_params(self, func, grid, block, params: int) -> SimpleNamespace:
        return SimpleNamespace(func=func, grid=tuple(grid), params=params)

    def memset_node_params(self, ptr: int, value: int, element_size: int, count: int) -> SimpleNamespace:
        return SimpleNamespace(dst=ptr, value=value, element_size=element_size, count=count)

    def set_memset_node_target(self, params: SimpleNamespace, ptr: int, count: int) -> None:
        params.dst, params.count = ptr, count

    def memcpy_node_params(self, dst: int, src: int, size: int) -> SimpleNamespace:
        return SimpleNamespace(dst=dst, src=src, size=size)

    def set_memcpy_node_target(self, params: SimpleNamespace, dst: int, src: int, size: int) -> None:
        params.dst, params.src, params.size = dst, src, size

    def _node_work(self, kind: str, params: SimpleNamespace):
        """What the node runs, with its parameters copied now (node creation or exec update)."""
        if kind == "kernel":
            pointers, constants = params.func.read_args(params.params)
            func, grid = params.func, params.grid
            return lambda: self._run_kernel(func, grid, pointers, constants)
        if kind == "memset":
            dst, value, size, count = params.dst, params.value, params.element_size, params.count
            return lambda: self._memset(dst, value, size, count)
        if kind == "memcpy":
            dst, src, size = params.dst, params.src, params.size
            return lambda: ctypes.memmove(dst, src, size)
        if kind == "work":  # captured or child-graph work: the callable itself
            return params
        return lambda: None

    def _add(self, graph: list, deps: list, kind: str, params: Any) -> dict:
        for dep in deps:
            assert any(dep is node for node in graph), "a dependency from another graph"
        node = {"kind": kind, "deps": list(deps), "work": self._node_work(kind, params), "id": len(graph)}
        graph.append(node)
        return node

    def graph_add_kernel_node(self, graph, deps, params):
        self._check("cuGraphAddKernelNode")
        return self._add(graph, deps, "kernel", params)

    def graph_add_memset_node(self, graph, deps, params):
        self._check("cuGraphAddMemsetNode")
        return self._add(graph, deps, "memset", params)

    def graph_add_memcpy_node(self, graph, deps, params):
        self._check("cuGraphAddMemcpyNode")
        return self._add(graph, deps, "memcpy", params)

    def graph_add_empty_node(self, graph, deps):
        self._check("cuGraphAddEmptyNode")
        return self._add(graph, deps, "empty", None)

    def graph_instantiate(self, graph: list) -> dict:
        self._check("cuGraphInstantiate")
        return {"works": {node["id"]: node["work"] for node in graph}, "graph": graph}

    def graph_exec_destroy(self, graph_exec: dict) -> None:
        graph_exec["works"].clear()  # (launches in flight keep what they run until they finish)
        graph_exec["graph"] = None

    def graph_launch(self, graph_exec: dict, stream: _Stream) -> None:
        if stream.destroyed:
            self._destroyed("cuGraphLaunch", stream)
        self._check("cuGraphLaunch")
        works = [w for _, w in sorted(graph_exec["works"].items())]

        def run() -> None:
            for work in works:  # creation order is a topological order
                work()

        stream.inbox.put(run)

    def stream_begin_capture(self, stream: _Stream) -> None:
        self._check("cuStreamBeginCapture")
        if stream.capture is not None:
            self._raise(self.conventions.invalid_value, "cuStreamBeginCapture")
        stream.capture = []

    def stream_end_capture(self, stream: _Stream) -> list:
        self._check("cuStreamEndCapture")
        works, stream.capture = stream.capture, None
        if works is None:
            self._raise(self.conventions.invalid_value, "cuStreamEndCapture")
        graph: list = []
        previous: list = []
        for work in works:  # captured stream order: a chain
            kind = "mem_alloc" if work is ALLOCATION else "work"
            previous = [self._add(graph, previous, kind, work)]
        return graph

    def enqueue_work(self, stream: _Stream, work) -> None:
        """Run ``work`` in stream order, or capture it while the stream captures (library routines)."""
        if stream.destroyed:
            self._destroyed("enqueue", stream)
        self._check("enqueue")
        if stream.capture is not None:
            stream.capture.append(work)
        else:
            stream.inbox.put(work)

    @staticmethod
    def _child_work(child: list):
        works = [node["work"] for node in child]  # a copy: the child graph may be destroyed
        return lambda: [work() for work in works]

    def graph_add_child_graph_node(self, graph, deps, child):
        self._check("cuGraphAddChildGraphNode")
        if any(node["kind"] == "mem_alloc" for node in child):  # (as CUDA: no allocation in a child graph)
            self._raise(self.conventions.not_supported, "cuGraphAddChildGraphNode")
        return self._add(graph, deps, "work", self._child_work(child))

    def exec_set_child_graph(self, graph_exec, node, child) -> bool:
        self._check("cuGraphExecChildGraphNodeSetParams")
        if self.reject_updates:
            return False
        graph_exec["works"][node["id"]] = self._child_work(child)
        return True

    def exec_set_kernel_params(self, graph_exec, node, params) -> None:
        self._check("cuGraphExecKernelNodeSetParams")
        graph_exec["works"][node["id"]] = self._node_work("kernel", params)

    def exec_set_memset_params(self, graph_exec, node, params) -> bool:
        self._check("cuGraphExecMemsetNodeSetParams")
        if self.reject_updates:
            return False
        graph_exec["works"][node["id"]] = self._node_work("memset", params)
        return True

    def exec_set_memcpy_params(self, graph_exec, node, params) -> bool:
        self._check("cuGraphExecMemcpyNodeSetParams")
        if self.reject_updates:
            return False
        graph_exec["works"][node["id"]] = self._node_work("memcpy", params)
        return True


class FakeLibraries:
    """The ``library`` format on the simulated GPU: each routine's numpy reference, run in stream
    order (or captured) on the simulated memory, with a workspace it checks it was given."""

    name = "numpy reference"
    #: Bytes of workspace every call asks for (so the workspace path runs in the tests).
    WORKSPACE = 256

    def __init__(self, api: FakeGpuApi) -> None:
        self.api = api
        self.planned: dict = {}
        #: The routine kinds that cannot be captured (cuSOLVER's Jacobi SVD, say): enqueuing one
        #: while the stream captures invalidates the capture, as the real library does.
        self.uncapturable: set[str] = set()
        #: The routine kinds that allocate memory while captured (as cuSOLVER's getrs may): their
        #: captures hold an allocation node, which a child-graph node refuses.
        self.allocating: set[str] = set()

    def supports(self, routine) -> str | None:
        return None

    def capturable(self, routine, checked) -> bool:
        return routine.kind not in self.uncapturable

    def serial_key(self, routine, checked):
        return None if routine.kind == "gemm" else routine.kind  # (as the vendors': handles hold state)

    def plan(self, routine, checked, pointers) -> SimpleNamespace:
        key = (routine, checked, tuple(p % 256 for p in pointers))
        self.planned[key] = self.planned.get(key, 0) + 1
        return SimpleNamespace(routine=routine, workspace_size=self.WORKSPACE)

    def enqueue(self, plan, constants, pointers, workspace, workspace_size, stream) -> None:
        assert workspace and workspace_size >= self.WORKSPACE, "a library call ran without its workspace"
        api = self.api
        reference = plan.routine.reference()
        pointers = list(pointers)
        if plan.routine.kind in self.uncapturable and stream.capture is not None:
            raise RuntimeError(f"{plan.routine.kind} enqueued while its stream captures")
        if plan.routine.kind in self.allocating and stream.capture is not None:
            api.enqueue_work(stream, ALLOCATION)
        api.enqueue_work(stream, lambda: reference((1, 1, 1), [api.view(p) for p in pointers], list(constants)))


class FakeExecutableCache(ExecutableCache):
    """``numpy`` executables whose functions the simulated GPU runs (no module to load), and
    library routines through their numpy references."""

    formats = ("numpy",)

    def __init__(self, api: FakeGpuApi | None = None) -> None:
        self.libraries = FakeLibraries(api) if api is not None else None

    def prepare(self, device, spec) -> GpuExecutable:
        numpy_exe = NumpyExecutable(device, spec)
        functions = [FakeFunction(fn, e.bindings, e.constants) for fn, e in zip(numpy_exe.functions, spec.exports)]
        module = device.api.load_numpy_module(spec)
        device.modules.register(module)
        return GpuExecutable(device, spec, module, functions)

    def indirect_functions(self, device, executable) -> tuple:
        return tuple(FakeIndirectFunction(f.fn, f.bindings, f.constants) if f.bindings else None
                     for f in executable.functions)

    def join_function(self, device) -> FakeFunction:
        return FakeFunction(lambda grid, views, constants: None, 0, 0)


class KernelAborted(AbortedError):
    """What a simulated NCCL kernel meets when its communicator is aborted (it returns, as NCCL's do)."""


class _Plan:
    """NCCL's persistent plan of captured collectives: alive while a graph holds the work."""

    __slots__ = ("__weakref__",)


def _run_planned(work, plan: _Plan) -> None:
    work()  # (``plan`` is held by whatever holds this work)


class FakeComm:
    """A simulated communicator: one rank of a ``Group`` (filled in at group_end when made by a split)."""

    def __init__(self, group: Group | None = None, rank: int = 0, count: int = 1, blocking: bool = False,
                 family: list | None = None) -> None:
        self.group = group
        self.rank = rank
        self.count = count
        self.blocking = blocking
        #: The communicators sharing its resources and abort flag (NCCL's splitShare): its splits'.
        self.family = [] if family is None else family
        self.family.append(self)
        self.destroyed = False
        self.aborted = False
        #: Whether a split of it waits for other ranks (it is not ready meanwhile, as NCCL's parent).
        self.splitting = False
        self.sequence = itertools.count()
        self.sends: dict[int, itertools.count] = {}
        self.recvs: dict[int, itertools.count] = {}
        self.splits = itertools.count()
        #: The ranks of its init_rank's group (None for a split's): ready once none is None.
        self.members: list | None = None
        #: The persistent plans of its captured collectives that graphs still hold.
        self.plans: weakref.WeakSet = weakref.WeakSet()
        #: Its block cap (a split's ``max_blocks``), and its registered windows: address -> size.
        self.max_blocks: int | None = None
        self.windows: dict[int, int] = {}
        self.registrations = itertools.count()


_FAKE_DTYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"}


class FakeNccl:
    """NCCL on the simulated GPU (see the module): the ``CollectiveLibrary`` of ``hal/drivers/gpu/channel.py``."""

    name = "fake NCCL"
    #: Communicators are non-blocking and share resources with their splits, as the HAL makes NCCL's.
    nonblocking = True
    #: Splits go in groups, their communicators usable once the group completes (as nccl4py's).
    grouped_splits = True
    #: Seconds a piece of stream work waits for its peers before it faults the stream.
    TIMEOUT = 30.0
    #: Seconds an abort waits for the graphs holding its captured work to go (see ``abort``).
    PLAN_WAIT = 2.0
    #: Symmetric memory windows (NCCL 2.27's): registration waits for every rank and compares sizes.
    symmetric = True

    def __init__(self, api: FakeGpuApi) -> None:
        self.api = api
        self._lock = threading.Lock()
        self._groups: dict[bytes, tuple[Group, list[FakeComm | None]]] = {}
        self._local = threading.local()
        self._splits: dict[tuple[int, int], dict[int, tuple[int | None, int, FakeComm, FakeComm]]] = {}
        #: (id(group), registration number) -> {rank: size} of the windows registered so far.
        self._registrations: dict[tuple[int, int], dict[int, int]] = {}
        self._registered = threading.Condition(self._lock)
        #: Calls by name, and the operations of each group_end (what the tests look at).
        self.calls: dict[str, int] = {}
        self.groups: list[list[str]] = []

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    # -- communicators --------------------------------------------------------------------------
    def new_id(self) -> bytes:
        return os.urandom(128)

    def init_rank(self, count: int, id: bytes, rank: int) -> FakeComm:
        """A non-blocking init: the communicator is ``ready`` once every rank joined."""
        self._count("ncclCommInitRank")
        if len(id) != 128:
            raise InvalidArgumentError(f"an NCCL channel id is 128 bytes, got {len(id)}")
        with self._lock:
            group, members = self._groups.setdefault(id, (Group(id, count), [None] * count))
            comm = members[rank] = FakeComm(group, rank, count)
            comm.members = members
        return comm

    def ready(self, comm: FakeComm) -> bool:
        self._count("ncclCommGetAsyncError")
        if comm.destroyed or comm.aborted:
            raise RuntimeError("a destroyed or aborted communicator")
        with self._lock:
            if comm.splitting:
                return False
            if comm.members is not None:  # made by init_rank: every rank joined
                return all(m is not None for m in comm.members)
            return comm.group is not None  # made by a split: every rank split

    def split(self, comm: FakeComm, color: int | None, key: int, blocking: bool = False,
              max_blocks: int | None = None) -> FakeComm | None:
        """A non-blocking split (of a blocking communicator if ``blocking``) sharing the parent's
        resources: the new communicators are ``ready`` once every rank split."""
        self._count("ncclCommSplit")
        if comm.destroyed or comm.aborted:
            raise RuntimeError("a destroyed or aborted communicator")
        new = FakeComm(blocking=blocking, family=comm.family)
        new.max_blocks = max_blocks
        with self._lock:
            number = next(comm.splits)
            entries = self._splits.setdefault((id(comm.group), number), {})
            entries[comm.rank] = (color, key, comm, new)
            comm.splitting = True
            if len(entries) == comm.count:
                for _, _, parent, _ in entries.values():
                    parent.splitting = False
                by_color: dict[int, list] = {}
                for rank, (c, k, _, made) in entries.items():
                    if c is not None:
                        by_color.setdefault(c, []).append((k, rank, made))
                for members in by_color.values():
                    group = Group(os.urandom(16), len(members))
                    for new_rank, (_, _, made) in enumerate(sorted(members)):
                        made.group, made.rank, made.count = group, new_rank, len(members)
                del self._splits[(id(comm.group), number)]
        return None if color is None else new

    def comm_rank(self, comm: FakeComm) -> tuple[int, int]:
        return comm.rank, comm.count

    def destroy(self, comm: FakeComm) -> None:
        """Free the communicator once the graphs holding its captured work are gone (see ``abort``)."""
        self._count("ncclCommDestroy")
        if comm.destroyed:
            raise RuntimeError("ncclCommDestroy of a freed communicator")
        comm.destroyed = True
        self._wait_for_plans(comm, "ncclCommDestroy")

    def abort(self, comm: FakeComm) -> None:
        """NCCL's kernels of the communicator still waiting for peers return (the stream goes on).
        Then, as NCCL's abort, wait for every graph holding its captured work to be destroyed (a
        launch in flight lets go once its kernels returned); on an H200 it hung with one alive, even
        one never launched: here that is refused after ``PLAN_WAIT`` seconds, and counted."""
        self._count("ncclCommAbort")
        if comm.destroyed:
            raise RuntimeError("ncclCommAbort of a freed communicator")
        comm.destroyed = True
        for member in comm.family:  # (one abort flag: NCCL's splitShare)
            member.aborted = True
            if member.group is not None:
                member.group.fail(KernelAborted("ncclCommAbort"))
        self._wait_for_plans(comm, "ncclCommAbort")

    def _wait_for_plans(self, comm: FakeComm, name: str) -> None:
        """As NCCL's abort and destroy: wait until no graph holds the communicator's persistent plans;
        here refused after ``PLAN_WAIT`` seconds, and counted (NCCL would hang)."""
        deadline = time.monotonic() + self.PLAN_WAIT
        while len(comm.plans):
            gc.collect()  # (graphs the HAL destroyed and dropped are gone)
            if not len(comm.plans):
                return
            if time.monotonic() > deadline:
                self._count(f"{name} with captured graphs alive")
                raise InternalError(f"{name}: graphs holding this communicator's captured work are alive "
                                    "(NCCL waits for them)")
            time.sleep(0.01)

    # -- symmetric memory ------------------------------------------------------------------------
    def mem_alloc(self, size: int) -> int:
        self._count("ncclMemAlloc")
        return self.api.mem_alloc(size)

    def mem_free(self, ptr: int) -> None:
        self._count("ncclMemFree")
        self.api.mem_free(ptr)

    def window_register(self, comm: FakeComm, ptr: int, size: int) -> tuple[FakeComm, int]:
        """A collective registration: complete once every rank of the communicator registered its
        window of this number (at group_end in a group), sizes compared; the window is (comm, ptr)."""
        self._count("ncclCommWindowRegister")
        if comm.destroyed or comm.aborted or comm.group is None:
            raise RuntimeError("ncclCommWindowRegister on a destroyed or aborted communicator")
        key = (id(comm.group), next(comm.registrations))
        with self._registered:
            self._registrations.setdefault(key, {})[comm.rank] = size
            self._registered.notify_all()
        if getattr(self._local, "depth", 0):
            self._local.registering.append((key, comm, ptr, size))
        else:
            self._complete_registration(key, comm, ptr, size)
        return comm, ptr

    def _complete_registration(self, key: tuple[int, int], comm: FakeComm, ptr: int, size: int) -> None:
        deadline = time.monotonic() + self.TIMEOUT
        with self._registered:
            entries = self._registrations[key]
            while len(entries) < comm.count:
                if comm.aborted:
                    raise RuntimeError("ncclCommWindowRegister: the communicator was aborted")
                if time.monotonic() > deadline:
                    raise RuntimeError("ncclCommWindowRegister: the other ranks did not register")
                self._registered.wait(0.01)
            sizes = set(entries.values())
        if len(sizes) > 1:
            raise InvalidArgumentError(f"ncclCommWindowRegister: the ranks registered windows of {sorted(sizes)} bytes")
        comm.windows[ptr] = size

    def window_deregister(self, comm: FakeComm, window: tuple[FakeComm, int]) -> None:
        self._count("ncclCommWindowDeregister")
        if window[0] is not comm or window[1] not in comm.windows:
            raise RuntimeError("ncclCommWindowDeregister of a window this communicator does not hold")
        del comm.windows[window[1]]

    def _in_windows(self, comm: FakeComm, op: Collective, send: int, recv: int) -> bool:
        """Whether every operand of ``op`` lies in a window of ``comm``: NCCL 2.28 then runs its symmetric
        kernels, for every reduction but avg (measured on two H100s)."""
        size, count = op.element_size, comm.count
        spans = [(send, op.send_elements(comm.rank, count) * size), (recv, op.recv_elements(comm.rank, count) * size)]
        return all(any(base <= ptr and ptr + n <= base + length for base, length in comm.windows.items())
                   for ptr, n in spans if n)

    # -- groups --------------------------------------------------------------------------------------
    def group_start(self) -> None:
        self._count("ncclGroupStart")
        local = self._local
        local.depth = getattr(local, "depth", 0) + 1
        if local.depth == 1:
            local.pending = []
            local.registering = []

    def group_end(self) -> None:
        self._count("ncclGroupEnd")
        local = self._local
        local.depth -= 1
        if local.depth:
            return
        registering, local.registering = local.registering, []
        for registration in registering:
            self._complete_registration(*registration)
        pending, local.pending = local.pending, []
        if not pending:  # (a group of communicator inits or splits)
            return
        self.groups.append([op.kind for _, _, op, _, _ in pending])
        if not all(comm.blocking for _, comm, _, _, _ in pending):  # (NCCL starts a thread for it: slow)
            self._count("non-blocking group")
        by_stream: dict[int, list] = {}
        for item in pending:
            by_stream.setdefault(id(item[0]), []).append(item)
        for items in by_stream.values():
            stream = items[0][0]
            work = self._work(items)
            if stream.capture is not None:  # captured: a persistent plan the graphs hold (see _Plan)
                plan = _Plan()
                for item in items:
                    item[1].plans.add(plan)
                work = functools.partial(_run_planned, work, plan)
            self.api.enqueue_work(stream, work)

    def _add(self, stream: Any, comm: FakeComm, op: Collective, send: int, recv: int) -> None:
        if comm.destroyed or comm.aborted:
            raise RuntimeError("a destroyed or aborted communicator")
        if op.dtype not in _FAKE_DTYPES:
            raise InvalidArgumentError(f"NCCL has no {op.dtype}")
        self._count(op.kind)
        if comm.windows and op.reduction != "avg" and self._in_windows(comm, op, send, recv):  # (no avg kernel)
            self._count(f"symmetric {op.kind}")
        if getattr(self._local, "depth", 0):
            self._local.pending.append((stream, comm, op, send, recv))
        else:
            self.group_start()
            self._local.pending.append((stream, comm, op, send, recv))
            self.group_end()

    def _work(self, items: list):
        api = self.api

        def run() -> None:
            events = []
            for _, comm, op, send, recv in items:
                size, count = op.element_size, comm.count
                send_bytes = op.send_elements(comm.rank, count) * size
                recv_bytes = op.recv_elements(comm.rank, count) * size
                send_view = np.frombuffer(api.view(send), np.uint8)[:send_bytes] if send_bytes else None
                recv_view = np.frombuffer(api.view(recv), np.uint8)[:recv_bytes] if recv_bytes else None
                if op.kind == "send":
                    key: tuple = ("p2p", comm.rank, op.peer, next(comm.sends.setdefault(op.peer, itertools.count())))
                elif op.kind == "recv":
                    key = ("p2p", op.peer, comm.rank, next(comm.recvs.setdefault(op.peer, itertools.count())))
                else:
                    key = ("collective", next(comm.sequence))
                event = threading.Event()
                failures: list = []
                events.append((event, failures))

                def done(failure, event=event, failures=failures) -> None:
                    failures.append(failure)
                    event.set()

                comm.group.post(key, 2 if op.kind in ("send", "recv") else count,  # type: ignore[union-attr]
                                Arrival(comm.rank, op, send_view, recv_view, done), self.TIMEOUT)
            for event, failures in events:
                if not event.wait(self.TIMEOUT):
                    raise TimeoutError("a simulated NCCL kernel waited for its peers beyond the timeout")
                if isinstance(failures[0], KernelAborted):
                    return  # (NCCL's kernels return once their communicator is aborted)
                if failures[0] is not None:
                    raise failures[0]

        return run

    # -- operations ------------------------------------------------------------------------------------
    def all_reduce(self, send, recv, count, dtype, op, comm, stream) -> None:
        self._add(stream, comm, Collective("all_reduce", dtype, count, op), send, recv)

    def reduce_scatter(self, send, recv, count, dtype, op, comm, stream) -> None:
        self._add(stream, comm, Collective("reduce_scatter", dtype, count, op), send, recv)

    def reduce(self, send, recv, count, dtype, op, root, comm, stream) -> None:
        self._add(stream, comm, Collective("reduce", dtype, count, op, root=root), send, recv)

    def all_gather(self, send, recv, count, dtype, comm, stream) -> None:
        self._add(stream, comm, Collective("all_gather", dtype, count), send, recv)

    def broadcast(self, send, recv, count, dtype, root, comm, stream) -> None:
        self._add(stream, comm, Collective("broadcast", dtype, count, root=root), send, recv)

    def send(self, buffer, count, dtype, peer, comm, stream) -> None:
        self._add(stream, comm, Collective("send", dtype, count, peer=peer), buffer, 0)

    def recv(self, buffer, count, dtype, peer, comm, stream) -> None:
        self._add(stream, comm, Collective("recv", dtype, count, peer=peer), 0, buffer)


class FakeRccl(FakeNccl):
    """``FakeNccl`` as RCCL is behind hip-python (``hal/drivers/hip/rccl.py``): its communicators are
    blocking. An init outside a group returns once every rank joined (inside one, the group's end
    completes it, as NCCL's init-all); a split returns its communicator only when made within the
    call: it waits there for every rank of the parent, and refuses to be called in a group (where
    hip-python would drop the communicator made later). Either wait ends when the communicator (or
    the parent) is aborted, or fails after ``WAIT`` seconds."""

    name = "fake RCCL"
    nonblocking = False
    grouped_splits = False
    symmetric = False
    #: Seconds a blocking init or split waits for the other ranks before it fails.
    WAIT = 30.0

    def init_rank(self, count: int, id: bytes, rank: int) -> FakeComm:
        comm = super().init_rank(count, id, rank)
        comm.blocking = True
        if not getattr(self._local, "depth", 0):
            self._wait_for_ranks(comm, lambda: all(m is not None for m in comm.members), "ncclCommInitRank",
                                 "join")
        return comm

    def split(self, comm: FakeComm, color: int | None, key: int, blocking: bool = False,
              max_blocks: int | None = None) -> FakeComm | None:
        if getattr(self._local, "depth", 0):
            self._count("ncclCommSplit in a group")
            raise RuntimeError("ncclCommSplit in a group: hip-python drops the communicator it makes later")
        new = super().split(comm, color, key, blocking=True)  # (no config through hip-python: no block cap)
        self._wait_for_ranks(comm, lambda: not comm.splitting, "ncclCommSplit", "split")
        return new

    def _wait_for_ranks(self, comm: FakeComm, done, call: str, what: str) -> None:
        deadline = time.monotonic() + self.WAIT
        while True:
            with self._lock:
                if done():
                    return
            if comm.aborted or comm.destroyed:
                raise RuntimeError(f"{call} of an aborted communicator")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{call}: the other ranks did not {what} within {self.WAIT} s")
            time.sleep(0.002)


class FakeGpuDriver(Driver):
    name = "fake-gpu"
    summary = "the GPU-generic driver over a simulated GPU API (tests only)"
    #: Simulated GPUs the driver lists (ranks of the collective tests).
    DEVICES = 4

    def __init__(self, vendor: str = "cuda", libraries: bool = True, nccl: bool = True) -> None:
        super().__init__()
        self.api = FakeGpuApi(vendor)
        #: Whether its devices run library routines (False: as a GPU whose GEMM library is missing).
        self.libraries = libraries
        #: The simulated NCCL behind the devices' channels (None: as a machine without nccl4py).
        library = FakeRccl if os.environ.get("HAL_FAKE_COLLECTIVES") == "rccl" else FakeNccl
        self.nccl = library(self.api) if nccl else None

    def _probe(self) -> tuple[bool, str | None]:
        return True, None

    def _query_devices(self) -> list[DeviceInfo]:
        props = {"memory_total": 1 << 34, "memory_pools_supported": True}
        return [DeviceInfo(self.name, i, f"FAKE-{i}", "simulated GPU", f"fake-gpu://{i}", props)
                for i in range(self.DEVICES)]

    def _load_nccl(self) -> FakeNccl:
        if self.nccl is None:
            from hal.errors import UnavailableError

            raise UnavailableError("fake-gpu channels need the simulated NCCL (the driver was made without it)")
        return self.nccl

    def _create_device(self, info: DeviceInfo, **options: Any) -> GpuDevice:
        limits = {"max_workgroup_count": ((1 << 31) - 1, 65535, 65535), "max_workgroup_size": 1024}
        executables = FakeExecutableCache(self.api if self.libraries else None)
        device = GpuDevice(self, info, api=self.api, handle=0, context=self.api.conventions.context, options=options,
                           limits=limits, memory_bytes=1 << 34, memory_pools=True, executables=executables)
        device.collectives = GpuCollectives(device, self._load_nccl)
        return device


def run_conformance(paths: list[str], options: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """The conformance suite's ``paths`` on ``fake-gpu`` with driver ``options``, in a process of its own
    (registered through HAL_PLUGINS; ``env`` added to this process's environment)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, HAL_PLUGINS="drivers.fake_gpu", PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]),
               **(env or {}))
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *paths,
            "--driver", "fake-gpu"]
    for option in options:
        args += ["--driver-option", option]
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=root, timeout=300)


@hookimpl
def hal_register_drivers():
    return [DriverFactory("fake-gpu", FakeGpuDriver.summary, FakeGpuDriver, 0)]
