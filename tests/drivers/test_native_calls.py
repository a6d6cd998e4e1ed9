"""The native driver calls (``hal.drivers._native``) against a driver library built here from C.

The fake library has the CUDA driver API's names and the signatures it shares with the HIP runtime
(opened by path with local symbols, so it never stands in for a real driver library); it logs
each call's arguments and returns the status the test set, so the tests check that the native
calls pass every field exactly, stop at the first failing call and report it as the bindings
path does (the same HalError, naming the function), and that the shim falls back or refuses
as ``HAL_NATIVE`` says.
"""

from __future__ import annotations

import ctypes
import enum
import shutil
import subprocess
import sys
import types

import pytest

import hal
from hal.drivers import native_calls
from hal.drivers.bindings_shim import FUNCTIONS, BindingsShim
from hal.drivers.gpu.status import StatusTable


def _load_native():
    """The extension where it was built (an import failure is then a test failure, not a skip)."""
    import importlib
    import importlib.machinery
    import pathlib

    import hal.drivers

    folder = pathlib.Path(hal.drivers.__file__).parent
    if not any(folder.glob(f"_native{suffix}") for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        pytest.skip("the C extension was not built here (no C compiler at install)", allow_module_level=True)
    return importlib.import_module("hal.drivers._native")


_native = _load_native()

FAKE_DRIVER = r"""
#include <stdint.h>
#define LOG 64
uint64_t calls[LOG][12];
int count = 0;
int fail_at = -1;        /* the call (by count) that returns `failure` */
int failure = 0;
int not_ready = 600;
int pending = 0;         /* event_query answers not_ready while this is set */

static int log_call(int kind, int n, const uint64_t *args) {
    int index = count;
    if (index < LOG) {
        for (int i = 0; i < 12; i++) calls[index][i] = 0;
        calls[index][0] = (uint64_t)kind;
        for (int i = 0; i < n && i < 11; i++) calls[index][i + 1] = args[i];
    }
    count++;
    return index == fail_at ? failure : 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
               unsigned shared, void *stream, void **params, void **extra) {
    uint64_t a[11] = {(uint64_t)(uintptr_t)f, gx, gy, gz, bx, by, bz, shared, (uint64_t)(uintptr_t)stream,
                      (uint64_t)(uintptr_t)params, (uint64_t)(uintptr_t)extra};
    return log_call(1, 11, a);
}
int cuGraphLaunch(void *exec, void *stream) {
    uint64_t a[2] = {(uint64_t)(uintptr_t)exec, (uint64_t)(uintptr_t)stream};
    return log_call(2, 2, a);
}
int cuEventRecord(void *event, void *stream) {
    uint64_t a[2] = {(uint64_t)(uintptr_t)event, (uint64_t)(uintptr_t)stream};
    return log_call(3, 2, a);
}
int cuEventQuery(void *event) {
    uint64_t a[1] = {(uint64_t)(uintptr_t)event};
    int status = log_call(4, 1, a);
    return status ? status : (pending ? not_ready : 0);
}
int cuEventSynchronize(void *event) {
    uint64_t a[1] = {(uint64_t)(uintptr_t)event};
    return log_call(5, 1, a);
}
int cuStreamWaitEvent(void *stream, void *event, unsigned flags) {
    uint64_t a[3] = {(uint64_t)(uintptr_t)stream, (uint64_t)(uintptr_t)event, flags};
    return log_call(6, 3, a);
}
"""

NAMES = {"launch": "cuLaunchKernel", "graph_launch": "cuGraphLaunch", "event_record": "cuEventRecord",
         "event_query": "cuEventQuery", "event_synchronize": "cuEventSynchronize",
         "stream_wait_event": "cuStreamWaitEvent"}
LAUNCH, GRAPH, RECORD, QUERY, SYNC, WAIT = range(1, 7)


class FakeDriver:
    """The compiled library, opened twice: by the native calls (dlopen) and here (ctypes) to read its log."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lib = ctypes.CDLL(path)

    def int_var(self, name: str) -> ctypes.c_int:
        return ctypes.c_int.in_dll(self.lib, name)

    def reset(self, fail_at: int = -1, failure: int = 0) -> None:
        self.int_var("count").value = 0
        self.int_var("fail_at").value = fail_at
        self.int_var("failure").value = failure
        self.int_var("pending").value = 0

    def log(self) -> list[tuple[int, ...]]:
        table = (ctypes.c_uint64 * 12 * 64).in_dll(self.lib, "calls")
        return [tuple(table[i]) for i in range(self.int_var("count").value)]


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory) -> FakeDriver:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the fake driver library")
    directory = tmp_path_factory.mktemp("fake_driver")
    source = directory / "fake_driver.c"
    source.write_text(FAKE_DRIVER)
    library = directory / "libfakedriver.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True)
    return FakeDriver(str(library))


@pytest.fixture
def calls(fake_driver):
    fake_driver.reset()
    return _native.Calls(fake_driver.path, **NAMES)


def test_a_packed_launch_passes_every_field(calls, fake_driver):
    packed = _native.pack_launch(0xF00D, 1, 2, 3, 64, 4, 2, 128, 0x5EA, 0xABCDEF)
    assert len(packed) == _native.LAUNCH_BYTES
    assert calls.run([packed]) is None
    assert fake_driver.log() == [(LAUNCH, 0xF00D, 1, 2, 3, 64, 4, 2, 128, 0x5EA, 0xABCDEF, 0)]


def test_handles_up_to_64_bits_and_grid_fields_of_32(calls, fake_driver):
    top = 2**64 - 1
    assert calls.run([_native.pack_launch(top, 2**32 - 1, 1, 1, 1, 1, 1, 0, top, top)]) is None
    assert fake_driver.log()[0][1:3] == (top, 2**32 - 1)
    with pytest.raises(OverflowError):
        _native.pack_launch(1, 2**32, 1, 1, 1, 1, 1, 0, 1, 1)
    with pytest.raises(OverflowError):
        _native.pack_launch(-1, 1, 1, 1, 1, 1, 1, 0, 1, 1)
    with pytest.raises(TypeError):
        _native.pack_launch(1, 1, 1)
    with pytest.raises(TypeError):
        _native.pack_launch(1.5, 1, 1, 1, 1, 1, 1, 0, 1, 1)
    with pytest.raises(TypeError, match="prepared call 0"):
        calls.run([b"short"])


def test_run_issues_launches_and_bindings_calls_in_order(calls, fake_driver):
    seen = []

    def bindings_call(*args):  # a bindings function: a (status, ...) tuple
        seen.append((args, len(fake_driver.log())))
        return (0,)

    prepared = [_native.pack_launch(1, 1, 1, 1, 32, 1, 1, 0, 7, 100), (bindings_call, ("memset", 3)),
                _native.pack_launch(2, 4, 1, 1, 32, 1, 1, 0, 7, 200)]
    assert calls.run(prepared) is None
    assert [entry[1] for entry in fake_driver.log()] == [1, 2]
    assert seen == [(("memset", 3), 1)]  # between the two launches


def test_run_stops_at_the_first_failing_call_and_names_it(calls, fake_driver):
    fake_driver.reset(fail_at=1, failure=98)
    prepared = [_native.pack_launch(i, 1, 1, 1, 1, 1, 1, 0, 7, 0) for i in range(4)]
    assert calls.run(prepared) == (1, 98)
    assert len(fake_driver.log()) == 2  # nothing after the failure was launched

    class Status(enum.IntEnum):
        SUCCESS = 0
        OUT_OF_MEMORY = 2

    def failing(*args):
        return (Status.OUT_OF_MEMORY, None)

    fake_driver.reset()
    assert calls.run([prepared[0], (failing, ()), prepared[1]]) == (1, Status.OUT_OF_MEMORY)
    assert len(fake_driver.log()) == 1


def test_run_lets_a_python_exception_through_and_refuses_unknown_items(calls):
    def broken(*args):
        raise ValueError("bindings bug")

    with pytest.raises(ValueError, match="bindings bug"):
        calls.run([(broken, ())])
    for bad in ([b"x" * 8], [("not", "a tuple of args")], [42]):
        with pytest.raises(TypeError, match="prepared call 0"):
            calls.run(bad)
    with pytest.raises(TypeError):
        calls.run(None)


def test_the_other_calls_pass_their_handles_and_statuses(calls, fake_driver):
    assert calls.graph_launch(0x6A, 0x5EA) == 0
    assert calls.event_record(0xE1, 0x5EA) == 0
    assert calls.event_query(0xE1) == 0
    assert calls.event_synchronize(0xE1) == 0
    assert calls.stream_wait_event(0x5EA, 0xE1, 0) == 0
    assert [entry[:4] for entry in fake_driver.log()] == [
        (GRAPH, 0x6A, 0x5EA, 0), (RECORD, 0xE1, 0x5EA, 0), (QUERY, 0xE1, 0, 0), (SYNC, 0xE1, 0, 0),
        (WAIT, 0x5EA, 0xE1, 0)]
    fake_driver.int_var("pending").value = 1
    assert calls.event_query(0xE1) == 600
    fake_driver.reset(fail_at=0, failure=700)
    assert calls.graph_launch(1, 2) == 700
    with pytest.raises(TypeError):
        calls.event_record(1)
    for bad in ("7", 7.0, b"7", [7]):
        with pytest.raises(TypeError, match="a handle is an int"):
            calls.event_query(bad)
    assert calls.event_query(Handle(0xE2)) == 0  # a bindings handle object converts with int()
    assert fake_driver.log()[-1][:2] == (QUERY, 0xE2)


def test_the_checked_calls_return_nothing_and_raise_through_the_handler(calls, fake_driver):
    with pytest.raises(TypeError, match="set_failure"):
        calls.set_failure("not callable", 600)
    fake_driver.reset(fail_at=0, failure=700)
    with pytest.raises(RuntimeError, match="before set_failure"):
        calls.checked_graph_launch(1, 2)
    failures = []

    def fail(status, call):
        failures.append((status, call))
        raise hal.InternalError(f"{call}: {status}")

    calls.set_failure(fail, 600)
    fake_driver.reset()
    assert calls.checked_graph_launch(0x6A, 0x5EA) is None
    assert calls.checked_event_record(0xE1, 0x5EA) is None
    assert calls.checked_event_query(0xE1) is True
    assert calls.checked_event_synchronize(0xE1) is None
    assert calls.checked_stream_wait_event(0x5EA, 0xE1, 0) is None
    assert [entry[:3] for entry in fake_driver.log()] == [
        (GRAPH, 0x6A, 0x5EA), (RECORD, 0xE1, 0x5EA), (QUERY, 0xE1, 0), (SYNC, 0xE1, 0), (WAIT, 0x5EA, 0xE1)]
    fake_driver.int_var("pending").value = 1
    assert calls.checked_event_query(0xE1) is False  # not ready is no failure
    assert failures == []
    for i, (call, args) in enumerate([("graph_launch", (1, 2)), ("event_record", (1, 2)), ("event_query", (1,)),
                                      ("event_synchronize", (1,)), ("stream_wait_event", (1, 2, 0))]):
        fake_driver.reset(fail_at=0, failure=400 + i)
        with pytest.raises(hal.InternalError, match=f"{call}: {400 + i}"):
            getattr(calls, f"checked_{call}")(*args)
    assert failures == [(400 + i, call) for i, call in enumerate(
        ["graph_launch", "event_record", "event_query", "event_synchronize", "stream_wait_event"])]
    with pytest.raises(TypeError, match="a handle is an int"):
        calls.checked_event_record("7", 1)
    calls.set_failure(lambda status, call: None, 600)  # a handler must raise: one that returns is a bug
    fake_driver.reset(fail_at=0, failure=700)
    with pytest.raises(RuntimeError, match="returned for status 700 of graph_launch"):
        calls.checked_graph_launch(1, 2)


def test_a_missing_library_or_function_is_an_os_error(fake_driver, tmp_path):
    with pytest.raises(OSError, match="cannot open"):
        _native.Calls(str(tmp_path / "missing.so"), **NAMES)
    with pytest.raises(OSError, match="no function cuNothing"):
        _native.Calls(fake_driver.path, **{**NAMES, "event_query": "cuNothing"})
    uninitialised = _native.Calls.__new__(_native.Calls)
    with pytest.raises(RuntimeError, match="not initialised"):
        uninitialised.event_query(1)


# -- the shim over them ----------------------------------------------------------------------------

class Status(enum.IntEnum):
    SUCCESS = 0
    INVALID_HANDLE = 400
    NOT_READY = 600
    ILLEGAL_ADDRESS = 700


class Handle:
    """A bindings handle object: an int only through int()."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


def fake_shim(fake_driver) -> BindingsShim:
    def make(name):
        def function(*args):
            return (Status.SUCCESS, Handle(0x1234))
        function.__name__ = name
        return function

    bindings = types.SimpleNamespace(**{names[0]: make(names[0]) for names in FUNCTIONS.values()})
    table = StatusTable("fake", {"INVALID_HANDLE": hal.InvalidArgumentError}, ["ILLEGAL_ADDRESS"], lambda code: "")
    shim = BindingsShim(bindings, "cuda", {
        "status": table, "not_ready": Status.NOT_READY, "update_rejected": (), "stream_flags": 0,
        "event_flags": 0, "timing_event_flags": 0, "host_flags": 0, "max_threads_attribute": 0,
        "memset_params_type": object, "capture_mode": 1})
    shim.use_native(fake_driver.path, "cuLaunchKernel")
    return shim


@pytest.fixture
def shim(fake_driver, monkeypatch):
    monkeypatch.delenv("HAL_NATIVE", raising=False)
    fake_driver.reset()
    return fake_shim(fake_driver)


def test_the_shim_makes_its_hot_calls_natively(shim, fake_driver):
    assert shim.native is not None
    # handles made now are ints, which the native calls take with no conversion
    for create in (shim.stream_create, shim.event_create, shim.timing_event_create,
                   lambda: shim.graph_instantiate(Handle(1)), lambda: shim.module_function(Handle(1), "kernel")):
        handle = create()
        assert type(handle) is int and handle == 0x1234
    shim.graph_launch(Handle(0x6A), Handle(0x5EA))
    shim.event_record(Handle(0xE1), Handle(0x5EA))
    assert shim.event_query(Handle(0xE1)) is True
    fake_driver.int_var("pending").value = 1
    assert shim.event_query(Handle(0xE1)) is False
    shim.event_synchronize(Handle(0xE1))
    shim.stream_wait_event(Handle(0x5EA), Handle(0xE1))
    shim.run_prepared([shim.pack_launch(0xF, 1, 1, 1, 32, 1, 1, 0, 0x5EA, 0x100)])
    assert [entry[0] for entry in fake_driver.log()] == [GRAPH, RECORD, QUERY, QUERY, SYNC, WAIT, LAUNCH]


def test_a_failing_native_call_raises_the_bindings_error(shim, fake_driver):
    fake_driver.reset(fail_at=0, failure=int(Status.INVALID_HANDLE))
    with pytest.raises(hal.InvalidArgumentError, match=r"cuEventRecord failed: INVALID_HANDLE \(400\)"):
        shim.event_record(Handle(1), Handle(2))
    fake_driver.reset(fail_at=1, failure=int(Status.ILLEGAL_ADDRESS))
    launches = [shim.pack_launch(i, 1, 1, 1, 1, 1, 1, 0, 2, 0) for i in range(3)]
    with pytest.raises(hal.InternalError, match=r"cuLaunchKernel failed: ILLEGAL_ADDRESS") as info:
        shim.run_prepared(launches)
    assert info.value.api_code == "ILLEGAL_ADDRESS"
    fake_driver.reset(fail_at=0, failure=int(Status.ILLEGAL_ADDRESS))
    with pytest.raises(hal.InternalError, match="cuEventQuery failed"):
        shim.event_query(Handle(1))


def test_hal_native_off_keeps_the_bindings_calls(fake_driver, monkeypatch):
    monkeypatch.setenv("HAL_NATIVE", "0")
    assert native_calls.load(fake_driver.path, NAMES) is None
    monkeypatch.setenv("HAL_NATIVE", "1")
    assert native_calls.load(fake_driver.path, NAMES) is not None
    with pytest.raises(hal.UnavailableError, match="HAL_NATIVE=1"):
        native_calls.load("/nonexistent/libdriver.so", NAMES)
    monkeypatch.setenv("HAL_NATIVE", "maybe")
    with pytest.raises(hal.InvalidArgumentError, match="HAL_NATIVE"):
        native_calls.load(fake_driver.path, NAMES)
    monkeypatch.delenv("HAL_NATIVE")
    assert native_calls.load("/nonexistent/libdriver.so", NAMES) is None  # unset: a quiet fallback


def test_the_native_module_is_optional_for_the_package(fake_driver, monkeypatch):
    """Without the extension (no compiler at install), loading falls back to the Python calls."""
    import hal.drivers

    monkeypatch.delenv("HAL_NATIVE", raising=False)
    monkeypatch.setitem(sys.modules, "hal.drivers._native", None)  # makes the import fail
    monkeypatch.delattr(hal.drivers, "_native", raising=False)
    assert native_calls.load(fake_driver.path, NAMES) is None
    monkeypatch.setenv("HAL_NATIVE", "1")
    with pytest.raises(hal.UnavailableError, match="HAL_NATIVE=1"):
        native_calls.load(fake_driver.path, NAMES)


def test_run_survives_a_bindings_call_that_changes_the_list(calls, fake_driver):
    prepared: list = []

    def clear(*args):
        prepared.clear()  # the list being run shrinks under the loop
        return (0,)

    prepared.extend([(clear, ()), *[_native.pack_launch(i, 1, 1, 1, 1, 1, 1, 0, 7, 0) for i in range(50)]])
    assert calls.run(prepared) is None
    assert fake_driver.log() == []  # nothing was left to launch once the list was emptied


def test_activate_switches_only_when_the_threads_context_changes(calls):
    import threading

    made = []

    def make_current(context):
        if context == "broken":
            raise hal.InternalError("cannot make it current")
        made.append((threading.get_ident(), context))

    with pytest.raises(RuntimeError, match="set_activate"):
        calls.activate("a")
    calls.set_activate(make_current)
    for context in ("a", "a", "b", "b", "a"):
        calls.activate(context)
    assert [c for _, c in made] == ["a", "b", "a"]
    with pytest.raises(hal.InternalError):
        calls.activate("broken")  # a failed switch is not recorded: "a" is still the current one
    calls.activate("a")
    assert [c for _, c in made] == ["a", "b", "a"]
    other = threading.Thread(target=lambda: (calls.activate("a"), calls.activate("a")))
    other.start()
    other.join()
    assert len(made) == 4 and made[-1][0] != made[0][0] and made[-1][1] == "a"  # each thread its own
    with pytest.raises(TypeError):
        calls.set_activate(42)


def test_the_shim_activates_through_c_and_records_the_context(shim):
    switches = []
    original = shim._make_current

    def counting(context):
        switches.append(context)
        return original(context)

    shim._make_current = counting
    first, second = Handle(1), Handle(2)
    for context in (first, first, second, first, first):
        shim.activate(context)
    assert switches == [first, second, first]
    assert shim._current.context is first  # the calls that take the context explicitly read it here


def test_activate_entered_again_by_the_switch_keeps_one_reference_per_record(calls):
    """A switch runs Python (make_current): a finalizer there may activate another context on this
    thread. The outer call records its own context last and releases only what it replaced."""
    outer, inner = Handle(10), Handle(20)
    calls.set_activate(lambda context: calls.activate(inner) if context is outer else None)
    before = sys.getrefcount(outer), sys.getrefcount(inner)
    calls.activate(outer)  # enters activate(inner) from inside its own switch
    calls.activate(Handle(30))  # replaces the record: outer's reference is given back once
    assert (sys.getrefcount(outer), sys.getrefcount(inner)) == before
    calls.activate(outer)
    assert sys.getrefcount(inner) == before[1]


def test_calls_and_the_shim_holding_them_are_collected_together(fake_driver):
    import gc
    import weakref

    class Holder:
        def __init__(self) -> None:
            self.calls = _native.Calls(fake_driver.path, **NAMES)
            self.calls.set_activate(self.make_current)  # holder -> calls -> bound method -> holder
            self.calls.set_failure(self.fail, 600)

        def make_current(self, context) -> None:
            pass

        def fail(self, status, call) -> None:
            raise hal.InternalError(call)

    holder = Holder()
    alive = weakref.ref(holder)
    del holder
    gc.collect()
    assert alive() is None


def test_stream_wait_flags_beyond_32_bits_are_refused(calls, fake_driver):
    with pytest.raises(OverflowError, match="32 bits"):
        calls.stream_wait_event(1, 2, 1 << 32)
    assert fake_driver.log() == []
    assert calls.stream_wait_event(1, 2, (1 << 32) - 1) == 0
