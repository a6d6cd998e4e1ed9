"""CUDA-driver specifics on a real GPU (run by scripts/gpu-check; skipped where cuda is unavailable).

The conformance suite covers the HAL contract; these check what only the CUDA
driver promises: device properties and URIs, formats and compile errors,
in-place graph rebinding of only the changed nodes, every barrier lowering,
pinned memory, stream-ordered allocation, and a GPU fault ending in a lost
device with failed semaphores instead of a hang (in a child process, since a
fault ends the process's context).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hal

from .conftest import cuda_available

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA device on this machine")

ADD = r"""
extern "C" __global__ void add(unsigned int* a, const unsigned int* b, unsigned int n, unsigned int k) {
  unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] += b[i] + k;
}
"""
ADD_EXPORT = hal.Export("add", (64, 1, 1), bindings=2, constants=2)


@pytest.fixture(scope="module")
def dev():
    with hal.create_device("cuda") as device:
        yield device


def upload(dev, array: np.ndarray) -> hal.Buffer:
    buf = dev.allocator.allocate(array.nbytes)
    dev.write(buf, array)
    return buf


def run(dev, cbs, tables=None):
    sem = dev.create_semaphore(0)
    dev.queue_execute(cbs, signal=[(sem, 1)], binding_tables=tables)
    sem.wait(1, timeout=30)


def test_properties_and_uuid_uri(dev):
    props = dev.info.properties
    for key in ("name", "uuid", "compute_capability", "sm_count", "memory_total", "memory_free", "driver_version",
                "memory_pools_supported", "max_threads_per_block", "nvrtc_version"):
        assert key in props, key
    assert props["uuid"].startswith("GPU-") and dev.info.id == props["uuid"]
    assert 0 < props["memory_free"] <= props["memory_total"]
    with hal.create_device(f"cuda://{props['uuid']}") as same:
        assert same.info.ordinal == dev.info.ordinal
    assert dev.limits["max_workgroup_size"] == props["max_threads_per_block"]


def test_unknown_option_is_invalid():
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_device("cuda", command_buffers="graph")
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_device("cuda", command_buffer="tape")


def test_compile_error_is_invalid_argument_with_log(dev):
    from hal.drivers.gpu.status import CompileError

    with pytest.raises(CompileError) as info:
        dev.load_executable(hal.ExecutableSpec("cuda-c", "this is not CUDA", [hal.Export("k")]))
    assert "error" in info.value.log


def test_missing_export_is_invalid_argument(dev):
    with pytest.raises(hal.InvalidArgumentError, match="not_there"):
        dev.load_executable(hal.ExecutableSpec("cuda-c", ADD, [hal.Export("not_there")]))


@pytest.mark.parametrize("fmt", ["cubin", "ptx"])
def test_precompiled_formats(dev, fmt):
    from hal.drivers.cuda.executable_cache import compile_cuda_c

    target = dev.executables.target
    code = compile_cuda_c(ADD, target if fmt == "cubin" else target.replace("sm_", "compute_"))
    exe = dev.load_executable(hal.ExecutableSpec(fmt, code, [ADD_EXPORT]))
    a, b = upload(dev, np.arange(100, dtype=np.uint32)), upload(dev, np.full(100, 2, np.uint32))
    cb = dev.create_command_buffer()
    with cb.record():
        cb.dispatch(exe, "add", 2, [100, 5], [a, b])
    run(dev, [cb])
    np.testing.assert_array_equal(np.frombuffer(dev.read(a), np.uint32), np.arange(100) + 7)


def test_pinned_memory_is_mapped_and_used_by_kernels(dev):
    exe = dev.load_executable(hal.ExecutableSpec("cuda-c", ADD, [ADD_EXPORT]))
    host = dev.allocator.allocate(400, memory_type=hal.MemoryType.HOST_LOCAL | hal.MemoryType.HOST_VISIBLE)
    assert hal.MemoryType.HOST_COHERENT in host.memory_type
    with host.map(hal.MemoryAccess.WRITE) as view:
        view[:] = np.arange(100, dtype=np.uint32).tobytes()
    ones = upload(dev, np.ones(100, np.uint32))
    cb = dev.create_command_buffer()
    with cb.record():
        cb.dispatch(exe, "add", 2, [100, 0], [host, ones])
    run(dev, [cb])
    with host.map(hal.MemoryAccess.READ) as view:
        np.testing.assert_array_equal(np.frombuffer(view, np.uint32), np.arange(100) + 1)


@pytest.mark.parametrize("lowering", ["auto", "empty", "edges", "kernel"])
def test_barrier_lowerings_keep_levels_ordered(lowering):
    with hal.create_device("cuda", barrier_lowering=lowering) as dev:
        exe = dev.load_executable(hal.ExecutableSpec("cuda-c", ADD, [ADD_EXPORT]))
        width, levels, n = 20, 8, 256
        sets = [[upload(dev, np.full(n, j, np.uint32)) for j in range(width)] for _ in range(2)]
        model = [np.arange(width, dtype=np.int64), np.arange(width, dtype=np.int64)]
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE)
        with cb.record():
            for level in range(levels):
                if level:
                    cb.execution_barrier()
                # Writes go to one set and reads come from the other, which the previous level wrote:
                # a join that does not wait for the whole previous level shows as a wrong sum.
                dst, src = sets[level % 2], sets[1 - level % 2]
                for j in range(width):
                    cb.dispatch(exe, "add", 4, [n, level], [dst[j], src[(j + 1) % width]])
        run(dev, [cb])
        for level in range(levels):
            d, s_ = level % 2, 1 - level % 2
            model[d] = model[d] + np.roll(model[s_], -1) + level
        for which in range(2):
            got = [int(np.frombuffer(dev.read(buf, 0, 4), np.uint32)[0]) for buf in sets[which]]
            assert got == [int(v) % (1 << 32) for v in model[which]]
        if lowering != "auto":
            assert set(cb.joins) == {lowering}
        else:
            assert set(cb.joins) <= {"edges", "kernel"}


def test_rebinding_updates_only_changed_nodes():
    with hal.create_device("cuda", indirect_bindings=False) as dev:
        exe = dev.load_executable(hal.ExecutableSpec("cuda-c", ADD, [ADD_EXPORT]))
        n, parts = 64, 10
        targets = [upload(dev, np.zeros(n * parts, np.uint32)) for _ in range(3)]
        one = upload(dev, np.ones(n, np.uint32))
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
        with cb.record():
            for i in range(parts):  # disjoint ranges of slot 0: no two dispatches of a level race
                cb.dispatch(exe, "add", 1, [n, 0], [hal.Slot(0, 4 * n * i, 4 * n), one])
            cb.execution_barrier()
            cb.dispatch(exe, "add", 1, [n, 0], [hal.Slot(1, 0, 4 * n), one])
        assert cb.kind == "graph"
        run(dev, [cb], [[targets[0], targets[2]]])
        before = cb.updated_nodes
        run(dev, [cb], [[targets[0], targets[2]]])
        assert cb.updated_nodes == before, "the same table updates nothing"
        run(dev, [cb], [[targets[0], targets[1]]])
        assert cb.updated_nodes == before + 1, "only the node reading slot 1 changes"
        run(dev, [cb], [[targets[1], targets[1]]])
        assert cb.updated_nodes == before + 11
        assert cb.reinstantiations == 0
        words = [np.frombuffer(dev.read(t), np.uint32).reshape(parts, n) for t in targets]
        np.testing.assert_array_equal(words[0], np.full((parts, n), 3))
        expected_1 = np.ones((parts, n))
        expected_1[0] = 3
        np.testing.assert_array_equal(words[1], expected_1)
        expected_2 = np.zeros((parts, n))
        expected_2[0] = 2
        np.testing.assert_array_equal(words[2], expected_2)


def test_transfer_nodes_rebind_across_allocation_kinds(dev):
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
    with cb.record():
        cb.fill_buffer(hal.Slot(0), 0x11, 1)
        cb.execution_barrier()
        cb.copy_buffer(hal.Slot(0, 0, 16), hal.Slot(1, 0, 16))
        cb.update_buffer(b"\x05\x06", hal.Slot(1, 16, 2))
    plain = [dev.allocator.allocate(64) for _ in range(2)]
    sem = dev.create_semaphore(0)
    pooled = dev.queue_alloca(64, signal=[(sem, 1)])
    sem.wait(1, timeout=30)
    pinned = dev.allocator.allocate(64, memory_type=hal.MemoryType.HOST_VISIBLE)
    for table in ([plain[0], plain[1]], [pooled, plain[1]], [plain[0], pinned], [pinned, pooled]):
        for buf in table:
            dev.write(buf, bytes(64))
        run(dev, [cb], [table])
        assert dev.read(table[0]) == b"\x11" * 64
        assert dev.read(table[1], 0, 18) == b"\x11" * 16 + b"\x05\x06"
    dev.queue_dealloca(pooled, signal=[(sem, 2)])
    sem.wait(2, timeout=30)


def test_queue_alloca_is_stream_ordered_and_memory_returns(dev):
    sem = dev.create_semaphore(0)
    before = dev.allocator.statistics()
    for i in range(50):
        buf = dev.queue_alloca(1 << 20, wait=[(sem, 2 * i)], signal=[(sem, 2 * i + 1)])
        cb = dev.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buf, i, 1)
        dev.queue_execute([cb], wait=[(sem, 2 * i + 1)], signal=[(sem, 2 * i + 2)])
        dev.queue_dealloca(buf, wait=[(sem, 2 * i + 2)])
    sem.wait(100, timeout=30)
    dev.wait_idle(timeout=30)
    assert dev.allocator.statistics().live_buffers == before.live_buffers


def test_release_while_in_flight_is_deferred(dev):
    exe = dev.load_executable(hal.ExecutableSpec("cuda-c", ADD, [ADD_EXPORT]))
    n = 1 << 20
    a, b = upload(dev, np.zeros(n, np.uint32)), upload(dev, np.ones(n, np.uint32))
    gate = dev.create_semaphore(0)
    cb = dev.create_command_buffer()
    with cb.record():
        for _ in range(20):
            cb.dispatch(exe, "add", n // 64, [n, 0], [a, b])
    done = dev.create_semaphore(0)
    dev.queue_execute([cb], wait=[(gate, 1)], signal=[(done, 1)])
    b.release()  # the parked submission still reads b: its memory must outlive it
    gate.signal(1)
    done.wait(1, timeout=30)
    assert np.frombuffer(dev.read(a, 0, 16), np.uint32).tolist() == [20] * 4


def test_gpu_fault_loses_the_device_without_hanging():
    code = r"""
        import hal, sys
        dev = hal.create_device("cuda")
        exe = dev.load_executable(hal.ExecutableSpec("cuda-c",
            'extern "C" __global__ void bad(unsigned int* p) { p[1ull << 40] = 1; }', [hal.Export("bad", bindings=1)]))
        buf = dev.allocator.allocate(16)
        s1, s2, s3 = (dev.create_semaphore(0) for _ in range(3))
        cb = dev.create_command_buffer()
        with cb.record():
            cb.dispatch(exe, "bad", 1, [], [buf])
        dev.queue_execute([cb], signal=[(s1, 1)])
        dev.queue_barrier(wait=[(s1, 1)], signal=[(s2, 1)])
        for sem in (s1, s2):
            try:
                sem.wait(1, timeout=30)
            except hal.AbortedError as err:
                print("aborted:", err)
        dev.queue_barrier(signal=[(s3, 1)])
        try:
            s3.wait(1, timeout=30)
        except hal.AbortedError as err:
            print("later work aborted:", "lost" in str(err))
        try:
            dev.allocator.allocate(16)
        except hal.HalError as err:
            print("allocate:", type(err).__name__)
        dev.close()
        print("closed")
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert sum(line.startswith("aborted:") for line in out.splitlines()) == 2 and "ILLEGAL_ADDRESS" in out, out
    assert "later work aborted: True" in out
    assert "allocate: DeviceLostError" in out
    assert "closed" in out


def test_dropped_devices_give_back_their_memory_threads_and_modules():
    """Devices made, used (memory never released, kernels loaded, a graph with a cuBLASLt call
    where the library is installed) and dropped without close() give everything back once
    collected: free device memory and the process's threads return to where they were."""
    import gc
    import threading
    import time
    import weakref

    def use_and_drop() -> weakref.ref:
        device = hal.create_device("cuda")
        exe = device.load_executable(hal.ExecutableSpec("cuda-c", ADD, [ADD_EXPORT]))
        a = upload(device, np.zeros(1 << 16, np.uint32))
        upload(device, np.zeros(64 << 20, np.uint8))  # 64 MiB the program never releases
        cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=3)
        with cb.record():
            cb.dispatch(exe, "add", ((1 << 16) // 64, 1, 1), [1 << 16, 1], [a, a])
            if "library" in device.executable_formats:
                gemm = device.load_executable(hal.library_spec({"gemm": hal.Gemm("float32")}))
                cb.dispatch(gemm, "gemm", constants=hal.Gemm.constants_for(64, 64, 64),
                            bindings=[hal.Slot(0), hal.Slot(1), hal.Slot(2)])
        operands = [device.allocator.allocate(64 * 64 * 4) for _ in range(3)]
        sem = device.create_semaphore(0)
        device.queue_execute([cb], signal=[(sem, 1)], binding_tables=[operands])
        sem.wait(1, timeout=60)
        assert np.frombuffer(device.read(a), np.uint32)[0] == 1
        return weakref.ref(device)

    with hal.create_device("cuda") as probe:
        use_and_drop()  # (the first use of a library in the process loads its kernels for good)
        gc.collect()
        time.sleep(0.5)
        threads = set(threading.enumerate())
        free_before = probe.api.memory_info()[0]
        for _ in range(8):
            ref = use_and_drop()
            gc.collect()
            assert ref() is None, "a dropped device was not collected"
        deadline = time.monotonic() + 10

        while True:
            extra_threads = set(threading.enumerate()) - threads
            lost_mib = (free_before - probe.api.memory_info()[0]) >> 20
            if (not extra_threads and lost_mib <= 32) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not extra_threads and lost_mib <= 32, (
            f"after 8 devices of 64 MiB dropped: threads left {extra_threads}, {lost_mib} MiB not given back")


def test_a_forked_child_gets_typed_errors_and_the_parent_goes_on(dev):
    """CUDA does not survive fork(): in the child, the parent's device refuses every use with a
    FailedPreconditionError saying so, and a new device fails with a HalError (never a crash or a
    hang); the parent's device works on."""
    from forking import in_forked_child

    buf = upload(dev, np.arange(16, dtype=np.uint32))

    def child() -> list:
        outcomes = []
        for use in (lambda: dev.read(buf), lambda: dev.allocator.allocate(64)):
            try:
                use()
                outcomes.append("ran")
            except hal.FailedPreconditionError as exc:
                outcomes.append("fork()" in str(exc))
        try:
            with hal.create_device("cuda") as fresh:
                fresh.allocator.allocate(64)
            outcomes.append("ran")
        except hal.HalError as exc:
            outcomes.append(type(exc).__name__ + ": " + str(exc)[:300])
        return outcomes

    outcomes = in_forked_child(child)
    assert outcomes[:2] == [True, True]
    assert outcomes[2] != "ran" and not isinstance(outcomes[2], bool) and "raised" not in outcomes, outcomes
    np.testing.assert_array_equal(np.frombuffer(dev.read(buf), np.uint32), np.arange(16))
