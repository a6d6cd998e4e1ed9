"""The HIP shim against the real bindings: it implements the declared GPU API, and every hip-python
function it calls exists in the installed hip-python and accepts the arguments the shim passes."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from hal.drivers.bindings_shim import FUNCTIONS, VENDORS
from hal.drivers.gpu.api import GpuApi, missing_members, protocol_members
from hal.drivers.hip import api as hip_api
from hal.drivers.hip.api import ENTRY_POINTS, HipApi

from .test_hip_driver import rocm_missing

SHIM_SOURCE = Path(hip_api.__file__).read_text()


def parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def test_the_shim_implements_every_call_with_its_parameters():
    assert missing_members(HipApi) == []
    for name in protocol_members():
        declared = getattr(GpuApi, name, None)
        if callable(declared):
            assert len(parameters(getattr(HipApi, name))) == len(parameters(declared)), name


@pytest.fixture(scope="module")
def hip():
    package = pytest.importorskip("hip", reason="hip-python is not installed")
    return package.hip  # hip-python 10 has `hip.hip` as an attribute, not a submodule


def test_every_function_named_in_the_shim_exists_in_hip_python(hip):
    named = set(re.findall(r"(?:\bh|self\.hip)\.(hip[A-Z]\w*)\b", SHIM_SOURCE))  # h = self.hip
    functions = {name for name in named if not hasattr(hip, name) or inspect.isroutine(getattr(hip, name))}
    functions |= {names[VENDORS.index("hip")] for names in FUNCTIONS.values()}  # the shared calls
    missing = sorted(name for name in functions if not hasattr(hip, name))
    assert not missing, f"hip-python lacks {missing}"
    assert functions == set(ENTRY_POINTS), "ENTRY_POINTS lists exactly the functions the shim calls"


def test_the_shared_calls_name_functions_of_the_cuda_bindings_too():
    driver = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings is not installed")
    column = VENDORS.index("cuda")
    missing = sorted(names[column] for names in FUNCTIONS.values() if not hasattr(driver, names[column]))
    assert not missing


class RecordingHip:
    """hip-python's module with every function replaced by a recorder that binds the call's arguments
    to the real function's signature (TypeError when the count is wrong) and answers hipSuccess.
    With ``call_real``, the real function is called too (its arguments converted to C; the status,
    an error without a GPU, is ignored), except those whose C symbol the runtime lacks."""

    def __init__(self, hip, call_real: bool = False, unbound: tuple[str, ...] = ()) -> None:
        self._hip = hip
        self._call_real = call_real
        self._unbound = unbound
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        real = getattr(self._hip, name)
        if not inspect.isroutine(real):
            return real  # enums, flags and parameter records are the real ones
        signature = inspect.signature(real)
        success = self._hip.hipError_t.hipSuccess

        def record(*args):
            signature.bind(*args)
            if self._call_real and hip_api.c_symbol(real) not in self._unbound:
                real(*args)
            self.calls.append((name, args))
            if name == "hipMemGetInfo":
                return success, 1 << 20, 1 << 30
            if name == "hipGetDeviceProperties":
                return success, self._hip.hipDeviceProp_t()
            return success, 4096

        return record


def test_every_call_binds_to_the_real_signature(hip):
    """Run every GpuApi method and the driver's calls over the recorder: each hip-python call the
    shim makes is bound to the installed function's signature."""
    exercise_every_call(RecordingHip(hip))


def test_every_call_converts_its_arguments_in_the_real_bindings(hip):
    """The same calls through the real functions into the HIP runtime (without a GPU each returns an
    error status after hip-python converted the arguments: a wrong type raises TypeError)."""
    api = HipApi(hip)
    try:
        api.runtime_version()
    except RuntimeError as exc:
        rocm_missing(exc)
    err, count = hip.hipGetDeviceCount()
    if err == hip.hipError_t.hipSuccess and count > 0:  # stand-in handles would reach a GPU
        pytest.skip("an AMD GPU is present: the CTS makes these calls for real (pytest tests/cts --driver hip)")
    exercise_every_call(RecordingHip(hip, call_real=True, unbound=tuple(api.missing_entry_points())))


def exercise_every_call(recorder: RecordingHip) -> None:
    api = HipApi(recorder)
    stream, event, graph = api.stream_create(), api.event_create(), api.graph_create()
    function = api.module_function(api.module_load(b"\x7fELF"), "k")
    kernel = api.kernel_node_params(function, (4, 2, 1), (64, 1, 1), 8192)
    memset = api.memset_node_params(4096, 7, 4, 16)
    memcpy = api.memcpy_node_params(4096, 8192, 64)
    node = api.graph_add_kernel_node(graph, [], kernel)
    api.graph_add_memset_node(graph, [node], memset)
    api.graph_add_memcpy_node(graph, [node], memcpy)
    api.graph_add_empty_node(graph, [node, node])
    graph_exec = api.graph_instantiate(graph)
    api.set_memset_node_target(memset, 8192, 32)
    api.set_memcpy_node_target(memcpy, 8192, 4096, 32)
    assert api.exec_set_memset_params(graph_exec, node, memset) is True
    assert api.exec_set_memcpy_params(graph_exec, node, memcpy) is True
    api.exec_set_kernel_params(graph_exec, node, kernel)
    api.stream_begin_capture(stream)
    child = api.stream_end_capture(stream)
    child_node = api.graph_add_child_graph_node(graph, [node], child)
    assert api.exec_set_child_graph(graph_exec, child_node, child) is True
    api.graph_launch(graph_exec, stream)
    api.run_prepared(
        [
            api.prepare_launch(function, (1, 1, 1), (64, 1, 1), stream, 8192),
            api.prepare_launch(function, (1, 1, 1), (64, 1, 1), stream, 0),
            *(api.prepare_memset(4096, 1, size, 8, stream) for size in (1, 2, 4)),
            api.prepare_copy(4096, 8192, 64, stream),
            api.prepare_upload(4096, 8192, 64, stream),
        ]
    )
    for size in (1, 2, 4):
        api.memset_async(4096, 1, size, 8, stream)
    api.memcpy_dtod_async(4096, 8192, 64, stream)
    api.memcpy_htod_async(4096, 8192, 64, stream)
    api.memcpy_htod(4096, 8192, 64)
    api.memcpy_dtoh(8192, 4096, 64)
    api.activate(0)
    api.stream_wait_event(stream, event)
    api.event_record(event, stream)
    assert api.event_query(event) is True
    api.event_synchronize(event)
    assert api.event_elapsed_ms(api.timing_event_create(), event) == 4096.0
    api.mem_free(api.mem_alloc(64))
    api.mem_free_async(api.mem_alloc_async(64, stream), stream)
    api.configure_memory_pool(0, 1 << 30)
    api.host_free(api.host_device_pointer(api.host_alloc(64)))
    assert api.function_max_threads(function) == 4096
    api.graph_exec_destroy(graph_exec)
    api.graph_destroy(graph)
    api.module_unload(function)
    api.event_destroy(event)
    api.stream_synchronize(stream)
    api.stream_destroy(stream)
    # the driver's calls
    api.runtime_version(), api.driver_version(), api.init(), api.device_count(), api.memory_info()
    props = api.device_properties(0)
    assert {"name", "gcn_arch_name", "compute_units", "memory_total", "memory_pools_supported", "uuid"} <= set(props)
    assert {name for name, _ in recorder.calls} == set(ENTRY_POINTS), "every entry point was exercised"


def test_node_parameters_hold_what_the_shim_set(hip):
    api = HipApi(RecordingHip(hip))
    kernel = api.kernel_node_params(4096, (4, 2, 3), (64, 2, 1), 8192)
    assert (kernel.gridDim.x, kernel.gridDim.y, kernel.gridDim.z) == (4, 2, 3)
    assert (kernel.blockDim.x, kernel.blockDim.y, kernel.blockDim.z) == (64, 2, 1)
    assert int(kernel.kernelParams) == 8192 and int(kernel.func) == 4096
    memset = api.memset_node_params(4096, 7, 2, 16)
    api.set_memset_node_target(memset, 12288, 8)
    assert (int(memset.dst), memset.value, memset.elementSize, memset.width, memset.height) == (12288, 7, 2, 8, 1)


def test_c_symbols_are_read_from_the_bindings(hip):
    """hip-python binds some functions to versioned C symbols; the probe checks those in the library."""
    assert hip_api.c_symbol(hip.hipMalloc) == "hipMalloc"
    assert hip_api.c_symbol(hip.hipGetDeviceProperties).startswith("hipGetDeviceProperties")
