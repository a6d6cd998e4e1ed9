"""Loaded kernels are bounded: a GPU executable's module unloads once the executable is collected and no
command buffer holds it (safe against the device closing first), and the runtime's kernel caches drop
their least recently used entries, so that a program making ever new executables or graphs runs in
bounded device modules and host memory (the GPU-generic driver over the simulated GPU API)."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import hal
import runtime as rt
from hal import device as hal_device
from runtime.device import context_for
from runtime.kernels import source as kernel_source
from runtime.lowering import fusion

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
fake_gpu = pytest.importorskip("drivers.fake_gpu")


@pytest.fixture(params=["graph", "stream"])
def gpu(request):
    device = fake_gpu.FakeGpuDriver().create_device(command_buffer=request.param)
    try:
        yield device
    finally:
        device.close()


def _spec(i: int) -> hal.ExecutableSpec:
    def kernel(wg, bindings, constants):
        np.frombuffer(bindings[0], dtype=np.uint32)[0] = constants[0]
    return hal.ExecutableSpec("numpy", kernel, [hal.Export(f"k{i}", (1, 1, 1), 1, 1)])


def _names(api) -> set:
    return {m.spec.exports[0].name for m in api.modules.values()}


def test_dropped_executables_unload_their_modules(gpu):
    api = gpu.api
    tracemalloc.start()
    try:
        for i in range(hal_device.EXECUTABLE_CACHE_ENTRIES + 50):  # the device's executable cache full
            gpu.load_executable(_spec(i))
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):
            exe = gpu.load_executable(_spec(10000 + i))
            assert exe.functions
            del exe
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    limit = hal_device.EXECUTABLE_CACHE_ENTRIES
    assert len(api.modules) == len(gpu.modules) <= limit  # the device's cache keeps the recent ones only
    assert grown < 384 << 10, grown  # the 1,000 executables' modules and objects went
    assert not api.use_after_destroy


def test_a_command_buffer_keeps_the_executables_it_dispatches_loaded(gpu):
    api = gpu.api
    out = gpu.allocator.allocate(4)
    exe = gpu.load_executable(_spec(99999))
    cb = gpu.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.dispatch(exe, 0, constants=[7], bindings=[out])
    del exe
    for i in range(hal_device.EXECUTABLE_CACHE_ENTRIES + 10):  # pushes it out of the device's cache
        gpu.load_executable(_spec(5000 + i))
    gc.collect()
    assert "k99999" in _names(api)
    sem = gpu.create_semaphore(0)
    gpu.queue_execute([cb], signal=[(sem, 1)])
    sem.wait(1)
    assert np.frombuffer(gpu.read(out), np.uint32)[0] == 7
    del cb, sem
    other = gpu.create_command_buffer()  # (a queue keeps the submission it issued last)
    with other.record():
        other.fill_buffer(out, 0, 4)
    gpu.queue_execute([other])
    gpu.wait_idle()
    del other
    gc.collect()
    assert "k99999" not in _names(api)
    assert not api.use_after_destroy


def test_executables_outliving_their_device_unload_nothing_twice(gpu):
    api = gpu.api
    kept = [gpu.load_executable(_spec(i)) for i in range(5)]
    cb = gpu.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    out = gpu.allocator.allocate(4)
    with cb.record():
        cb.dispatch(kept[0], 0, constants=[1], bindings=[out])
    gpu.close()
    assert not api.modules  # the close unloaded every module
    del kept, cb
    gc.collect()
    assert not api.modules and not api.use_after_destroy  # the finalizers found nothing left to unload


def test_the_runtime_bounds_its_kernels_over_many_distinct_graphs(gpu, monkeypatch):
    """1,000 distinct graphs, each with a fused kernel of its own, through a graph cache that is full:
    loaded modules, kept executables and sources, and traced host memory stay bounded."""
    monkeypatch.setenv("RUNTIME_FUSE_AFTER", "1")  # each graph's fused kernel is compiled at once
    monkeypatch.setattr(kernel_source, "EXECUTABLES_KEPT", 32)
    monkeypatch.setattr(kernel_source, "SOURCES_KEPT", 64)
    monkeypatch.setattr(fusion, "WANTS_KEPT", 64)
    ctx = context_for(gpu)
    ctx.is_gpu = True  # lowered as for a GPU: fused elementwise kernels
    ctx.graphs.max_entries = 16
    x_np = np.linspace(-1, 1, 64, dtype=np.float32)
    x = rt.array(x_np, device=gpu)

    def graph(i: int):
        y, want = x, x_np
        for bit in range(10):
            if i >> bit & 1:
                y, want = y * 0.5, want * np.float32(0.5)
            else:
                y, want = y + 0.25, want + np.float32(0.25)
            y, want = rt.abs(y), np.abs(want)
        return y, want

    api = gpu.api
    modules = []
    memory = []
    tracemalloc.start()
    try:
        for i in range(1024):
            y, want = graph(i)
            if i % 97 == 0:
                np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
            else:
                rt.eval(y)
            del y
            if i in (511, 1023):  # (the caches are full from the first hundred graphs on)
                gpu.wait_idle()
                gc.collect()
                modules.append(len(api.modules))
                memory.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert ctx.graphs.evictions >= 1000
    bound = hal_device.EXECUTABLE_CACHE_ENTRIES + kernel_source.EXECUTABLES_KEPT + 16 * 4
    assert max(modules) <= bound, modules
    assert len(ctx.executables) <= kernel_source.EXECUTABLES_KEPT
    assert len(kernel_source._sources) <= kernel_source.SOURCES_KEPT
    assert len(ctx.fusion_wanted) <= fusion.WANTS_KEPT
    assert memory[1] - memory[0] < 1 << 20, memory  # the second 512 graphs added no kept memory
