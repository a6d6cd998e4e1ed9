"""Library routines in the GPU-generic command buffers (over the simulated GPU): captures, rebinding,
recurring tables, workspaces."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import hal

from .fake_gpu import FakeGpuDriver

N = 8


def make(mode: str, **options):
    driver = FakeGpuDriver()
    return driver.api, driver.create_device(command_buffer=mode, **options)


def gemm_buffer(device, mode=hal.CommandBufferMode.REUSABLE):
    exe = device.load_executable(hal.library_spec({"gemm": hal.Gemm("float32")}))
    cb = device.create_command_buffer(mode=mode, binding_capacity=3)
    with cb.record():
        cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(N, N, N),
                    bindings=[hal.Slot(0), hal.Slot(1), hal.Slot(2)])
    return cb


def table(device, scale: float):
    a = np.full((N, N), scale, np.float32)
    buffers = [device.allocator.allocate(N * N * 4) for _ in range(3)]
    device.write(buffers[1], a)
    device.write(buffers[2], np.eye(N, dtype=np.float32))
    return buffers


def run(device, cb, buffers, sem):
    value = sem.value + 1
    device.queue_execute([cb], signal=[(sem, value)], binding_tables=[buffers])
    sem.wait(value, timeout=10)
    return np.frombuffer(device.read(buffers[0]), np.float32)


def test_alternating_tables_get_executable_graphs_of_their_own():
    api, device = make("graph")
    try:
        cb = gemm_buffer(device)
        sem = device.create_semaphore(0)
        first, second = table(device, 1.0), table(device, 2.0)
        for step in range(8):
            for buffers, scale in ((first, 1.0), (second, 2.0)):
                np.testing.assert_array_equal(run(device, cb, buffers, sem), np.full(N * N, scale))
            if step == 1:  # each table seen twice: both have executable graphs of their own
                captures = cb.library_recaptures
        assert cb.table_execs_made == 2
        assert cb.library_recaptures == captures, "a recurring table was captured again"
        third = table(device, 3.0)  # a new table: the main graph, captured again
        np.testing.assert_array_equal(run(device, cb, third, sem), np.full(N * N, 3.0))
        assert cb.library_recaptures == captures + 1
        np.testing.assert_array_equal(run(device, cb, first, sem), np.full(N * N, 1.0))
    finally:
        device.close()


def test_a_stream_buffer_resolves_a_call_once_per_table_it_is_resubmitted_with(monkeypatch):
    """A prepared execution hands its one checked table at every submission: the call's addresses,
    plan and workspace are resolved at its first issue only; another table (each queue_execute checks
    its table anew) resolves them again, and every result follows its own table's buffers."""
    api, device = make("stream")
    try:
        cb = gemm_buffer(device)
        sem = device.create_semaphore(0)
        first, second = table(device, 1.0), table(device, 2.0)
        from hal.drivers.gpu.library import LibraryCall

        resolved = []
        real_prepare = LibraryCall.prepare
        monkeypatch.setattr(LibraryCall, "prepare", lambda call, dev, tbl: resolved.append(tbl) or
                            real_prepare(call, dev, tbl))
        executions = {1.0: device.prepare([cb], [first]), 2.0: device.prepare([cb], [second])}
        for _ in range(3):
            for scale, execution in executions.items():
                value = sem.value + 1
                execution.submit(signal=[(sem, value)])
                sem.wait(value, timeout=10)
                buffers = first if scale == 1.0 else second
                np.testing.assert_array_equal(np.frombuffer(device.read(buffers[0]), np.float32),
                                              np.full(N * N, scale))
        assert len(resolved) == 6  # the two tables alternate: each issue finds the other's resolution
        resolved.clear()
        for _ in range(3):  # one execution again and again (the last issue was the other's): resolved once
            value = sem.value + 1
            executions[1.0].submit(signal=[(sem, value)])
            sem.wait(value, timeout=10)
        assert len(resolved) == 1
        for scale, buffers in ((3.0, table(device, 3.0)), (1.0, first)):  # queue_execute: a table checked anew
            np.testing.assert_array_equal(run(device, cb, buffers, sem), np.full(N * N, scale))
        assert len(resolved) == 3
    finally:
        device.close()


def test_a_refused_child_update_rebuilds_the_graph():
    api, device = make("graph")
    try:
        cb = gemm_buffer(device)
        sem = device.create_semaphore(0)
        run(device, cb, table(device, 1.0), sem)
        api.reject_updates = True
        np.testing.assert_array_equal(run(device, cb, table(device, 5.0), sem), np.full(N * N, 5.0))
        assert cb.reinstantiations == 1
    finally:
        device.close()


@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_workspaces_go_with_the_command_buffer(mode):
    api, device = make(mode)
    try:
        sem = device.create_semaphore(0)
        buffers = table(device, 1.0)
        before = api.live_allocations
        run(device, gemm_buffer(device, hal.CommandBufferMode.ONE_SHOT), buffers, sem)
        device.wait_idle()
        assert api.live_allocations == before, "a one-shot buffer's workspace outlived its submission"
        reusable = gemm_buffer(device)
        run(device, reusable, buffers, sem)
        assert api.live_allocations > before  # kept for the next submission
        released = weakref.ref(reusable)
        del reusable
        gc.collect()
        if released() is None:  # (unless the device still remembers its last submission)
            device.wait_idle()
            assert api.live_allocations == before
    finally:
        device.close()
    assert api.live_allocations == 0


def test_a_failing_library_call_fails_its_semaphore_and_the_device_stays_usable():
    api, device = make("stream")
    try:
        sem = device.create_semaphore(0)
        buffers = table(device, 1.0)
        backend = device.executables.libraries
        enqueue = backend.enqueue

        def refuse(*args):
            raise hal.InternalError("the library refused the call")

        backend.enqueue = refuse
        try:
            with pytest.raises(hal.HalError) as raised:
                device.queue_execute([gemm_buffer(device, hal.CommandBufferMode.ONE_SHOT)], signal=[(sem, 1)],
                                     binding_tables=[buffers])
                sem.wait(1, timeout=10)
            assert "refused" in repr(raised.value) + repr(raised.value.__cause__)
        finally:
            backend.enqueue = enqueue
        other = device.create_semaphore(0)
        np.testing.assert_array_equal(run(device, gemm_buffer(device), buffers, other), np.ones(N * N))
    finally:
        device.close()


def test_library_backends_route_each_routine_to_its_kinds_library():
    from types import SimpleNamespace

    from hal.drivers.gpu.library import LibraryBackends

    calls = []

    class Backend:
        def __init__(self, name):
            self.name = name

        def supports(self, routine):
            return None if routine.dtype != "float64" else f"{self.name} has no float64"

        def plan(self, routine, checked, pointers):
            return SimpleNamespace(workspace_size=64, by=self.name)

        def capturable(self, routine, checked):
            return True

        def serial_key(self, routine, checked):
            return None

        def enqueue(self, plan, constants, pointers, workspace, workspace_size, stream):
            calls.append((self.name, plan.by, tuple(pointers), workspace_size))

    assert LibraryBackends.of({"gemm": None}) is None  # no library loaded: no ``library`` format
    backends = LibraryBackends.of({"gemm": Backend("blas"), "other": None})
    assert backends.name == "blas" and set(backends.backends) == {"gemm"}
    gemm = hal.Gemm("float32")
    assert backends.supports(gemm) is None
    assert backends.supports(hal.Gemm("float64")) == "blas has no float64"
    unknown = SimpleNamespace(kind="fft")
    assert "no library runs 'fft' routines" in backends.supports(unknown)
    plan = backends.plan(gemm, None, [1, 2, 3])
    assert plan.workspace_size == 64
    backends.enqueue(plan, (), [1, 2, 3], 0, 64, 0)
    assert calls == [("blas", "blas", (1, 2, 3), 64)]


@pytest.mark.parametrize("mode", ["stream", "graph"])
@pytest.mark.parametrize("uncapturable", [False, True], ids=["captured", "streamed"])
def test_the_queue_keeps_no_retired_submission_alive(mode, uncapturable):
    """Once its work is done, a command buffer the program dropped is freed (with its graph) at
    once, without waiting for the cyclic collector: a communicator whose work a CUDA graph holds
    cannot be destroyed, so nothing may keep one."""
    api, device = make(mode)
    try:
        if uncapturable:
            device.executables.libraries.uncapturable.add("gemm")
        sem = device.create_semaphore(0)
        cb = gemm_buffer(device)
        run(device, cb, table(device, 1.0), sem)
        device.wait_idle()
        released = weakref.ref(cb)
        gc.disable()
        try:
            del cb
            assert released() is None  # (no reference cycle through it)
        finally:
            gc.enable()
    finally:
        device.close()


@pytest.mark.parametrize("slots", [False, True], ids=["fixed", "slots"])
def test_a_graph_buffer_with_an_uncapturable_call_issues_its_commands_on_the_stream(slots):
    """A library call that waits on the device while it is enqueued (cuSOLVER's gesvdj) would
    invalidate a capture: the graph command buffer holding it builds no graph and issues every
    command in order on the stream, updates from its device staging included."""
    api, device = make("graph")
    try:
        device.executables.libraries.uncapturable.add("gemm")
        exe = device.load_executable(hal.library_spec({"gemm": hal.Gemm("float32")}))
        buffers = table(device, 3.0)
        out = device.allocator.allocate(N * N * 4)
        ones = np.ones((N, N), np.float32)
        refs = [hal.Slot(i) for i in range(4)] if slots else [*buffers, out]
        cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE,
                                         binding_capacity=4 if slots else 0)
        with cb.record():
            cb.fill_buffer(refs[0], 0, 4)
            cb.update_buffer(ones.tobytes(), refs[2])  # B = ones, from the staging block
            cb.execution_barrier()
            cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(N, N, N), bindings=refs[:3])
            cb.execution_barrier()
            cb.copy_buffer(refs[0], refs[3])
        sem = device.create_semaphore(0)
        for value in (1, 2):
            device.queue_execute([cb], signal=[(sem, value)], binding_tables=[[*buffers, out]] if slots else None)
            sem.wait(value, timeout=10)
            got = np.frombuffer(device.read(out), np.float32).reshape(N, N)
            np.testing.assert_array_equal(got, np.full((N, N), 3.0 * N))
        assert cb.node_count == 0  # no graph was built
    finally:
        device.close()


def test_library_calls_sharing_a_handles_state_run_one_after_another_in_a_graph():
    """Calls of one level whose library keeps state of its own between them (a solver handle's
    internal scratch: ``serial_key``) get an edge from the call recorded before them; the others
    stay free to run concurrently, and every result is right."""
    api, device = make("graph")
    try:
        libraries = device.executables.libraries
        libraries.serial_key = lambda routine, checked: "handle" if routine.dtype == "float64" else None
        exe = device.load_executable(hal.library_spec({"f32": hal.Gemm("float32"), "f64": hal.Gemm("float64")}))
        dtypes = ["float32", "float64", "float32", "float64", "float64"]
        outs, inputs = [], []
        cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE)
        with cb.record():  # one level: no barrier between the products
            for i, dtype in enumerate(dtypes):
                a = np.full((N, N), i + 1, dtype)
                ins = [device.allocator.allocate(a.nbytes) for _ in range(2)]
                device.write(ins[0], a)
                device.write(ins[1], np.eye(N, dtype=dtype))
                outs.append(device.allocator.allocate(a.nbytes))
                inputs.append(ins)
                cb.dispatch(exe, "f32" if dtype == "float32" else "f64", constants=hal.Gemm.constants_for(N, N, N),
                            bindings=[outs[-1], *ins])
        nodes = [node for node in cb._resources.graph if node["kind"] == "work"]
        assert [len(node["deps"]) for node in nodes] == [0, 0, 0, 1, 1]
        assert nodes[3]["deps"] == [nodes[1]] and nodes[4]["deps"] == [nodes[3]]
        sem = device.create_semaphore(0)
        device.queue_execute([cb], signal=[(sem, 1)])
        sem.wait(1, timeout=10)
        for i, (out, dtype) in enumerate(zip(outs, dtypes)):
            np.testing.assert_array_equal(np.frombuffer(device.read(out), dtype), np.full(N * N, i + 1))
    finally:
        device.close()


@pytest.mark.parametrize("slots", [False, True], ids=["fixed", "slots"])
def test_a_call_whose_capture_allocates_is_issued_on_the_stream(slots):
    """A library that allocates memory while captured (cuSOLVER's getrs did) gives a graph that a
    child-graph node refuses: the command buffer issues its commands on the stream instead, with
    the right results, and later buffers with that routine skip the capture."""
    api, device = make("graph")
    try:
        device.executables.libraries.allocating.add("gemm")
        sem = device.create_semaphore(0)
        for value, scale in ((1, 2.0), (2, 3.0)):
            buffers = table(device, scale)
            if slots:
                cb = gemm_buffer(device)
                got = run(device, cb, buffers, sem)
            else:
                exe = device.load_executable(hal.library_spec({"gemm": hal.Gemm("float32")}))
                cb = device.create_command_buffer(mode=hal.CommandBufferMode.ONE_SHOT)
                with cb.record():
                    cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(N, N, N), bindings=buffers)
                device.queue_execute([cb], signal=[(sem, sem.value + 1)])
                sem.wait(value, timeout=10)
                got = np.frombuffer(device.read(buffers[0]), np.float32)
            np.testing.assert_array_equal(got, np.full(N * N, scale))
            assert cb.node_count == 0
        assert not device.capturer.holds(cb.library_calls[0])
    finally:
        device.close()
