"""The GPU-generic driver logic (hal/drivers/gpu) on the simulated GPU API, without a GPU.

The whole conformance suite runs on ``fake-gpu`` with stream and with graph command
buffers; the tests below check what the suite cannot see: which graph structure a
barrier becomes, that rebinding touches only what changed, that frees wait for the
GPU, that a fault ends in failed semaphores rather than a hang.
"""

from __future__ import annotations

import ctypes
import threading
import time

import numpy as np
import pytest

import hal
from hal.drivers.gpu.graph_command_buffer import EDGE_LIMIT, choose_join
from hal.drivers.gpu.kernel_args import ArgArena
from hal.drivers.gpu.status import DeviceLostError

from .fake_gpu import run_conformance


def add_one(workgroups, bindings, constants):
    (n,) = constants
    values = np.frombuffer(bindings[0], np.uint32, count=n)
    values += 1


def add_pair(workgroups, bindings, constants):
    (n,) = constants
    for view in bindings[1:]:
        values = np.frombuffer(view, np.uint32, count=n)
        values += 1
    np.frombuffer(bindings[0], np.uint32, count=n)[:] += 1


def boom(workgroups, bindings, constants):
    raise RuntimeError("simulated kernel fault")


EXPORTS = [hal.Export("add_one", (64, 1, 1), bindings=1, constants=1), hal.Export("boom", bindings=1)]


def kernels(dev):
    return dev.load_executable(hal.ExecutableSpec("numpy", {"add_one": add_one, "boom": boom}, EXPORTS))


def zeroed(dev, count: int, size: int = 64) -> list:
    """``count`` new buffers of ``size`` zero bytes."""
    bufs = [dev.allocator.allocate(size) for _ in range(count)]
    for buf in bufs:
        dev.write(buf, bytes(size))
    return bufs


def run(dev, cbs, tables=None):
    sem = dev.create_semaphore(0)
    dev.queue_execute(cbs, signal=[(sem, 1)], binding_tables=tables)
    sem.wait(1, timeout=30)


def words(dev, buf) -> list[int]:
    return np.frombuffer(dev.read(buf), np.uint32).tolist()


# -- the conformance suite on the simulated GPU -----------------------------------------------------

@pytest.mark.parametrize("options", [
    ["command_buffer=stream"],
    ["command_buffer=graph"],
    ["command_buffer=graph", "indirect_bindings=true", "barrier_lowering=empty"],
], ids=["stream", "graph", "graph-indirect-empty-joins"])
def test_conformance_suite_on_the_simulated_gpu(options):
    proc = run_conformance(["tests/cts", "-k", "not kernel_failure_propagates"], options)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


# -- pure logic ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("before", "after", "expected"), [
    (1, 1, "edges"), (1, 50, "edges"), (50, 1, "edges"), (10, 10, "edges"), (16, 16, "edges"), (17, 16, "kernel"),
    (100, 100, "kernel"),
])
def test_join_choice_by_widths(before, after, expected):
    assert choose_join(before, after) == expected
    assert (before * after <= EDGE_LIMIT or min(before, after) <= 1) == (expected == "edges")


@pytest.mark.parametrize("policy", ["empty", "edges", "kernel"])
def test_join_choice_forced(policy):
    assert choose_join(100, 100, policy) == policy


def test_arg_arena_packs_pointer_arrays():
    arena = ArgArena()
    first = arena.add([0x1000, 0x2000], (7,))
    second = arena.add([], ())
    third = arena.add([0xDEAD_BEEF_0000], (1, 0xFFFFFFFF))
    arena.pack()
    assert arena.params_address(second, 0) == 0, "no parameters: a NULL void**"
    address = arena.params_address(first, 3)
    pointers = (ctypes.c_uint64 * 3).from_address(address)
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0x1000
    assert ctypes.c_uint64.from_address(pointers[1]).value == 0x2000
    assert ctypes.c_uint32.from_address(pointers[2]).value == 7
    pointers = (ctypes.c_uint64 * 3).from_address(arena.params_address(third, 3))
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0xDEAD_BEEF_0000
    assert ctypes.c_uint32.from_address(pointers[2]).value == 0xFFFFFFFF
    arena.set(third, 0x42)
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0x42


def test_device_options_are_validated(fake_driver):
    for bad in ({"command_buffer": "tape"}, {"barrier_lowering": "sometimes"}, {"queue_count": 0},
                {"indirect_bindings": "yes"}, {"no_such_option": 1}):
        with pytest.raises(hal.InvalidArgumentError):
            fake_driver.create_device(**bad)


def test_a_queue_stream_for_interop_takes_a_queue_index(fake_driver):
    device = fake_driver.create_device(queue_count=2)
    try:
        assert device.stream(0) is not None and device.stream(np.int64(1)) is not device.stream(0)
        for bad in (2, -1, 1.5, None, "0", 2**70):
            with pytest.raises(hal.InvalidArgumentError):
                device.stream(bad)
    finally:
        device.close()


# -- command buffers ---------------------------------------------------------------------------------

def test_mode_selection(fake_driver):
    with fake_driver.create_device() as dev:
        assert dev.create_command_buffer().kind == "stream"
        assert dev.create_command_buffer(hal.CommandBufferMode.REUSABLE).kind == "graph"
    for forced in ("stream", "graph"):
        with fake_driver.create_device(command_buffer=forced) as dev:
            assert dev.create_command_buffer().kind == forced
            assert dev.create_command_buffer(hal.CommandBufferMode.REUSABLE).kind == forced


@pytest.mark.parametrize("lowering", ["empty", "edges", "kernel"])
def test_barrier_lowering_builds_the_graph_shape(fake_driver, lowering):
    with fake_driver.create_device(barrier_lowering=lowering) as dev:
        exe = kernels(dev)
        bufs = [dev.allocator.allocate(64) for _ in range(3)]
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE)
        with cb.record():
            for buf in bufs:
                cb.dispatch(exe, "add_one", 1, [16], [buf])
            cb.execution_barrier()
            cb.execution_barrier()  # a second barrier in a row adds nothing
            for buf in bufs[:2]:
                cb.dispatch(exe, "add_one", 1, [16], [buf])
        graph = cb._resources.graph
        assert cb.joins == [lowering]
        kinds = [node["kind"] for node in graph]
        second_level = graph[-2:]
        if lowering == "edges":
            assert kinds == ["kernel"] * 5
            assert all(len(node["deps"]) == 3 for node in second_level), "each depends on the whole level before"
        else:
            join = graph[3]
            assert join["kind"] == ("empty" if lowering == "empty" else "kernel")
            assert len(join["deps"]) == 3
            assert all(node["deps"] == [join] for node in second_level)
        run(dev, [cb])
        assert [words(dev, b)[0] for b in bufs] == [2, 2, 1]


def test_new_tables_rewrite_the_device_table_not_the_nodes(fake_driver):
    with fake_driver.create_device(indirect_bindings=True) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 4)
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
        with cb.record():
            for _ in range(3):
                cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
                cb.execution_barrier()
            cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(1)])
        api = dev.api
        before = dict(api.calls)
        run(dev, [cb], [[bufs[0], bufs[1]]])
        run(dev, [cb], [[bufs[0], bufs[1]]])
        run(dev, [cb], [[bufs[2], bufs[3]]])
        run(dev, [cb], [[bufs[2], bufs[3]]])
        assert [words(dev, b)[0] for b in bufs] == [6, 2, 6, 2]
        assert cb.image_uploads == 2, "uploaded for each new table only"
        assert cb.updated_nodes == 0
        assert api.calls.get("cuGraphInstantiate", 0) - before.get("cuGraphInstantiate", 0) == 1
        assert api.calls.get("cuGraphExecKernelNodeSetParams", 0) == before.get("cuGraphExecKernelNodeSetParams", 0)


def dispatch_then_fill(dev, exe, fill_target):
    """A reusable command buffer: add_one on slot 0, a barrier, then fill ``fill_target`` with 7s."""
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
    with cb.record():
        cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
        cb.execution_barrier()
        cb.fill_buffer(fill_target, 7, 4)
    return cb


def test_the_same_table_again_is_one_graph_launch(fake_driver):
    with fake_driver.create_device(indirect_bindings=True) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 2)
        cb = dispatch_then_fill(dev, exe, hal.Slot(1, 0, 4))
        table = [bufs[0], bufs[1]]
        run(dev, [cb], [table])
        api = dev.api
        before = dict(api.calls)
        for _ in range(3):
            run(dev, [cb], [table])
        run(dev, [cb], [list(table)])  # another list holding the same buffers counts as the same table
        calls = {name: count - before.get(name, 0) for name, count in api.calls.items() if count != before.get(name, 0)}
        assert calls.get("cuGraphLaunch") == 4
        assert not {"cuMemcpyHtoDAsync", "cuGraphExecKernelNodeSetParams", "cuGraphExecMemsetNodeSetParams",
                    "cuGraphInstantiate"} & set(calls)
        assert words(dev, bufs[0])[0] == 5 and words(dev, bufs[1])[0] == 7


def test_an_unchanged_table_is_still_checked_for_released_buffers(fake_driver):
    with fake_driver.create_device() as dev:
        exe = kernels(dev)
        root = dev.allocator.allocate(128)
        other = dev.allocator.allocate(64)
        dev.write(root, bytes(128))
        dev.write(other, bytes(64))
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
        with cb.record():
            cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
        view = root.subspan(64, 64)
        table = [view]
        run(dev, [cb], [table])
        run(dev, [cb], [table])
        table[0] = other  # changed in place: checked and bound again
        run(dev, [cb], [table])
        assert words(dev, root)[16] == 2 and words(dev, other)[0] == 1
        table[0] = view
        run(dev, [cb], [table])
        view.release()  # the released view itself
        with pytest.raises(hal.FailedPreconditionError, match="released"):
            run(dev, [cb], [table])
        table[0] = view = root.subspan(0, 64)
        run(dev, [cb], [table])
        root.release()  # the root of a live view
        with pytest.raises(hal.FailedPreconditionError, match="released"):
            run(dev, [cb], [table])
        assert words(dev, other)[0] == 1


def test_device_table_shares_runs_of_equal_bindings(fake_driver):
    with fake_driver.create_device(indirect_bindings=True) as dev:
        exe = dev.load_executable(hal.ExecutableSpec(
            "numpy", {"add_one": add_one, "add_pair": add_pair},
            [EXPORTS[0], hal.Export("add_pair", (64, 1, 1), bindings=2, constants=1)]))
        bufs = [dev.allocator.allocate(64) for _ in range(3)]
        fixed = dev.allocator.allocate(64)
        for buf in (*bufs, fixed):
            dev.write(buf, bytes(64))
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
        with cb.record():
            for _ in range(3):  # three dispatches, one run of table entries
                cb.dispatch(exe, "add_pair", 1, [1], [hal.Slot(0), hal.Slot(1, 16)])
                cb.execution_barrier()
            cb.dispatch(exe, "add_pair", 1, [1], [hal.Slot(1, 16), fixed])
            cb.execution_barrier()
            cb.dispatch(exe, "add_one", 1, [1], [hal.Slot(0, 32)])
        run(dev, [cb], [[bufs[0], bufs[1]]])
        assert cb._resources.image.size == 8 * 5, "runs: (slot 0, slot 1+16), (slot 1+16, fixed), (slot 0+32)"
        run(dev, [cb], [[bufs[2], bufs[1]]])
        assert words(dev, bufs[0])[0] == 3 and words(dev, bufs[0])[8] == 1
        assert words(dev, bufs[2])[0] == 3 and words(dev, bufs[2])[8] == 1
        assert words(dev, bufs[1])[4] == 8, "slot 1 at +16 is bound by four dispatches in both runs"
        assert words(dev, fixed)[0] == 2
        assert cb.image_uploads == 2


def test_node_updates_touch_only_changed_slots(fake_driver):
    with fake_driver.create_device(indirect_bindings=False) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 3)
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
        with cb.record():
            for _ in range(4):
                cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
                cb.execution_barrier()
            cb.fill_buffer(hal.Slot(1, 60, 4), 0x01020304, 4)
        run(dev, [cb], [[bufs[0], bufs[1]]])
        assert cb.updated_nodes == 0
        run(dev, [cb], [[bufs[0], bufs[2]]])
        assert cb.updated_nodes == 1, "only the fill reads slot 1"
        run(dev, [cb], [[bufs[1], bufs[2]]])
        assert cb.updated_nodes == 5
        assert cb.reinstantiations == 0
        assert words(dev, bufs[0])[0] == 8 and words(dev, bufs[1])[0] == 4
        assert words(dev, bufs[2])[15] == 0x01020304  # filled through slot 1
        assert words(dev, bufs[1])[15] == 0x01020304 + 4  # filled, then incremented through slot 0


def test_one_shot_resources_return_after_completion(fake_driver):
    with fake_driver.create_device() as dev:
        buf = dev.allocator.allocate(64)
        for _ in range(20):
            cb = dev.create_command_buffer()
            with cb.record():
                cb.update_buffer(b"\x01\x02\x03\x04", (buf, 0, 4))
            run(dev, [cb])
        dev.wait_idle(timeout=30)
        free = sum(len(blocks) for blocks in dev.staging._free.values())
        assert free >= 1 and dev.api.calls["cuMemHostAlloc"] <= 2, "staging blocks are reused"
        assert dev.read(buf, 0, 4) == b"\x01\x02\x03\x04"


# -- memory ---------------------------------------------------------------------------------------------

def test_release_waits_for_submitted_work(fake_driver):
    with fake_driver.create_device() as dev:
        exe = kernels(dev)
        api = dev.api
        buf = dev.allocator.allocate(64)
        dev.write(buf, bytes(64))
        gate, done = dev.create_semaphore(0), dev.create_semaphore(0)
        cb = dev.create_command_buffer()
        with cb.record():
            cb.dispatch(exe, "add_one", 1, [16], [buf])
        dev.queue_execute([cb], wait=[(gate, 1)], signal=[(done, 1)])
        live = api.live_allocations
        buf.release()
        assert api.live_allocations == live, "parked work still uses the memory"
        assert dev.allocator.statistics().live_buffers == 0
        gate.signal(1)
        done.wait(1, timeout=30)
        dev.wait_idle(timeout=30)
        assert api.live_allocations == live - 1


def test_queue_dealloca_frees_in_stream_order(fake_driver):
    with fake_driver.create_device() as dev:
        sem = dev.create_semaphore(0)
        buf = dev.queue_alloca(256, signal=[(sem, 1)])
        assert buf._allocation.kind == "pool"
        frees = dev.api.calls.get("cuMemFreeAsync", 0)
        dev.queue_dealloca(buf, wait=[(sem, 1)], signal=[(sem, 2)])
        sem.wait(2, timeout=30)
        assert dev.api.calls.get("cuMemFreeAsync", 0) == frees + 1
        assert buf.released


def test_close_frees_everything(fake_driver):
    dev = fake_driver.create_device()
    api = dev.api
    before = api.live_allocations
    dev.allocator.allocate(64)
    dev.allocator.allocate(64, memory_type=hal.MemoryType.HOST_VISIBLE)
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.update_buffer(b"abcd", (dev.allocator.allocate(16), 0, 4))
    run(dev, [cb])
    dev.close()
    assert api.live_allocations < before + 4
    assert dev.staging._closed and dev.events.closed


# -- semaphores ---------------------------------------------------------------------------------------------

def test_device_waits_use_timepoints_without_host_round_trips(fake_driver):
    with fake_driver.create_device(queue_count=2) as dev:
        exe = kernels(dev)
        buf = dev.allocator.allocate(64)
        dev.write(buf, bytes(64))
        gate, sem = dev.create_semaphore(0), dev.create_semaphore(0)
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE)
        with cb.record():
            cb.dispatch(exe, "add_one", 1, [16], [buf])
        dev.queue_execute([cb], wait=[(gate, 1)], signal=[(sem, 1)])
        for i in range(1, 5):  # parked behind the first until it is issued, then issued with device waits
            dev.queue_execute([cb], wait=[(sem, i)], signal=[(sem, i + 1)], queue=i % 2)
        waits = dev.api.calls.get("cuStreamWaitEvent", 0)
        gate.signal(1)
        sem.wait(5, timeout=30)
        assert words(dev, buf)[0] == 5
        assert dev.api.calls.get("cuStreamWaitEvent", 0) == waits + 4, "one device wait per change of queue"
        # On one stream, stream order is the wait: no call at all.
        dev.queue_execute([cb], wait=[(sem, 5)], signal=[(sem, 6)], queue=0)
        dev.queue_execute([cb], wait=[(sem, 6)], signal=[(sem, 7)], queue=0)
        sem.wait(7, timeout=30)
        assert words(dev, buf)[0] == 7
        assert dev.api.calls.get("cuStreamWaitEvent", 0) == waits + 4


def test_values_follow_issue_order(fake_driver):
    with fake_driver.create_device() as dev:
        a, b = dev.create_semaphore(0), dev.create_semaphore(0)
        dev.queue_barrier(signal=[(a, 1)])
        dev.queue_barrier(signal=[(b, 1)])
        b.wait(1)
        assert a.value == 1, "work issued earlier is complete when later work is"


class CountingInbox:
    """The completion thread's inbox, counting the wake-ups submitters post."""

    def __init__(self, inbox) -> None:
        self.inbox = inbox
        self.puts = 0

    def put(self, item) -> None:
        self.puts += 1
        self.inbox.put(item)


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(1e-3)


def test_completion_thread_is_woken_only_when_needed(fake_driver):
    from hal.drivers.gpu.completion import WAKE_INFLIGHT

    with fake_driver.create_device() as dev:
        completion = dev.completion
        inbox = completion._inbox = CountingInbox(completion._inbox)
        sem = dev.create_semaphore(0)
        wait_for(lambda: completion.idle, "the completion thread never went to sleep")
        for value in range(1, 21):  # submit-and-wait round trips: each waiter retires its own work
            dev.queue_barrier(signal=[(sem, value)])
            sem.wait(value, timeout=30)
        gate = dev.create_semaphore(0)
        waiter = threading.Thread(target=sem.wait, args=(21, 30))
        waiter.start()  # a host wait before the work is issued wakes when it is
        dev.queue_barrier(wait=[(gate, 1)], signal=[(sem, 21)])
        gate.signal(1)
        waiter.join(30)
        assert sem.value == 21 and inbox.puts == 0
        # A listener: nobody waits on the event, so the thread is woken to retire the work.
        dev.queue_barrier(signal=[(sem, 22)])
        assert hal.wait_any([(sem, 22)], timeout=30) == 0
        assert inbox.puts == 1
        wait_for(lambda: completion.idle, "the completion thread did not go back to sleep")
        # Work nobody waits for is retired once enough of it is in flight.
        for value in range(23, 23 + WAKE_INFLIGHT):
            dev.queue_barrier(signal=[(sem, value)])
        wait_for(lambda: not dev.queues[0].inflight, "in-flight work was never retired")
        assert inbox.puts == 2 and sem.current_value == 22 + WAKE_INFLIGHT


def test_a_waiter_finds_its_work_retired_by_another_thread(fake_driver):
    with fake_driver.create_device() as dev:
        sem = dev.create_semaphore(0)
        dev.queue_barrier(signal=[(sem, 1)])
        queue = dev.queues[0]
        sub = queue.inflight[0]
        dev.api.event_synchronize(sub.event)
        errors = []

        def retire():
            try:
                queue.wait(sub, None)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        with queue.retire_lock:  # another thread is retiring: this waiter blocks on the lock ...
            waiter = threading.Thread(target=retire)
            waiter.start()
            time.sleep(0.05)
            while queue.inflight:  # ... while everything in flight is retired
                dev.completion.finish(queue.inflight.popleft(), None)
        waiter.join(30)
        assert not errors and sem.value == 1


def test_kernel_fault_loses_the_device_and_fails_waiters(fake_driver):
    with fake_driver.create_device() as dev:
        exe = kernels(dev)
        buf = dev.allocator.allocate(64)
        s1, s2, s3 = (dev.create_semaphore(0) for _ in range(3))
        cb = dev.create_command_buffer()
        with cb.record():
            cb.dispatch(exe, "boom", 1, [], [buf])
        dev.queue_execute([cb], signal=[(s1, 1)])
        dev.queue_barrier(wait=[(s1, 1)], signal=[(s2, 1)])
        for sem in (s1, s2):
            with pytest.raises(hal.AbortedError) as info:
                sem.wait(1, timeout=30)
            assert isinstance(info.value.__cause__, DeviceLostError)
        assert s2.failure is s1.failure, "dependent work carries the same cause"
        assert isinstance(dev.lost, DeviceLostError) and fake_driver.api.conventions.launch_failed.name in str(dev.lost)
        dev.queue_barrier(signal=[(s3, 1)])  # does not raise: the failure shows on the semaphore
        with pytest.raises(hal.AbortedError, match="lost"):
            s3.wait(1, timeout=30)
        with pytest.raises(DeviceLostError):
            dev.allocator.allocate(16)
        fresh = dev.create_semaphore(0)
        fresh.signal(1)
        assert fresh.value == 1


def test_indirect_bindings_auto_uses_them_for_large_graphs(fake_driver):
    from hal.drivers.gpu.device import INDIRECT_MIN_DISPATCHES

    with fake_driver.create_device() as dev:
        exe = kernels(dev)
        bufs = [dev.allocator.allocate(64) for _ in range(2)]
        for count, indirect in ((INDIRECT_MIN_DISPATCHES - 1, False), (INDIRECT_MIN_DISPATCHES, True)):
            cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
            with cb.record():
                for _ in range(count):
                    cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
                    cb.execution_barrier()
            run(dev, [cb], [[bufs[0]]])
            run(dev, [cb], [[bufs[1]]])
            assert (cb.image_uploads == 2) == indirect
            assert (cb.updated_nodes == 0) == indirect


def test_a_graph_rebound_often_switches_to_indirect_bindings(fake_driver):
    from hal.drivers.gpu.graph_command_buffer import INDIRECT_AFTER_REBINDS

    with fake_driver.create_device() as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 2)
        marker = dev.allocator.allocate(4)
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
        with cb.record():  # (a second command: a lone kernel is launched on the stream, not as a graph)
            cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
            cb.fill_buffer(marker, 7, 4)
        runs = INDIRECT_AFTER_REBINDS + 4
        for i in range(runs):
            run(dev, [cb], [[bufs[i % 2]]])
        assert cb.updated_nodes == INDIRECT_AFTER_REBINDS - 1, "node updates until the switch"
        assert cb.image_uploads == 2, "then a table copy for each of the two tables"
        assert cb.table_execs_made == 1, "after which the one that came back runs its own graph"
        assert cb.reinstantiations == 0
        assert [words(dev, b)[0] for b in bufs] == [runs // 2, runs // 2]


def test_a_graph_command_buffer_of_one_kernel_launches_the_kernel(fake_driver):
    """One kernel and nothing else: no graph is built, each submission launches the kernel with its
    table's addresses (a graph launch would cost the same call and start the kernel later)."""
    with fake_driver.create_device(command_buffer="graph") as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 3)
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
        with cb.record():
            cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
        calls = dev.api.calls
        before = {name: calls.get(name, 0) for name in ("cuGraphCreate", "cuGraphLaunch", "cuLaunchKernel")}
        for i in range(7):
            run(dev, [cb], [[bufs[i % 3]]])
        one_shot = dev.create_command_buffer(hal.CommandBufferMode.ONE_SHOT)
        with one_shot.record():
            one_shot.dispatch(exe, "add_one", 1, [16], [bufs[2]])
        run(dev, [one_shot])
        assert {name: calls.get(name, 0) - n for name, n in before.items()} == \
            {"cuGraphCreate": 0, "cuGraphLaunch": 0, "cuLaunchKernel": 8}
        assert [words(dev, b)[0] for b in bufs] == [3, 2, 3]
        assert cb.updated_nodes == 0 and cb.image_uploads == 0



@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_a_table_submitted_again_is_not_patched_again(fake_driver, monkeypatch, mode):
    """Kernels issued on the stream keep the addresses of the table last written into their argument
    slots: an execution submitted again with its table writes nothing, another table writes them
    (and so does the first one coming back), and every run adds to its own table's buffer."""
    with fake_driver.create_device(command_buffer=mode) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 2)
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
        with cb.record():  # (one kernel: a graph command buffer launches it on the stream too)
            cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(0)])
        executions = [dev.prepare([cb], [[buf]]) for buf in bufs]
        patched = []
        patch = type(cb).patch_slot_args
        monkeypatch.setattr(type(cb), "patch_slot_args",
                            lambda self, table: (patched.append(table[0][0]), patch(self, table)))
        sem = dev.create_semaphore(0)
        order = [0, 0, 0, 1, 1, 0, 1, 1]
        for value, which in enumerate(order, 1):
            executions[which].submit(signal=[(sem, value)])
        sem.wait(len(order), timeout=30)
        assert [words(dev, b)[0] for b in bufs] == [order.count(0), order.count(1)]
        assert patched == [bufs[0], bufs[1], bufs[0], bufs[1]], "written at each change of table only"

def alternating_command_buffer(dev, exe, dispatches: int = 6):
    """A reusable command buffer of indirect dispatches over two slots, levels apart."""
    cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
    with cb.record():
        for i in range(dispatches):
            if i:
                cb.execution_barrier()
            cb.dispatch(exe, "add_one", 1, [16], [hal.Slot(i % 2)])
    return cb


class DestroyCounter:
    def __init__(self, api) -> None:
        self.count = 0
        self.real = api.graph_exec_destroy
        api.graph_exec_destroy = self

    def __call__(self, graph_exec) -> None:
        self.count += 1
        self.real(graph_exec)


def test_a_recurring_table_runs_an_executable_graph_of_its_own(fake_driver):
    with fake_driver.create_device(indirect_bindings=True) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 4)
        cb = alternating_command_buffer(dev, exe)
        api = dev.api
        before = dict(api.calls)
        tables = [[bufs[0], bufs[1]], [bufs[2], bufs[3]]]
        for i in range(10):
            run(dev, [cb], [tables[i % 2]])
        assert [words(dev, b)[0] for b in bufs] == [15, 15, 15, 15], "each table's buffers, 3 adds a run"
        assert cb.image_uploads == 2, "the device table is copied for the first run of each table only"
        assert cb.table_execs_made == 1, "the table that came back got its own executable graph, once"
        assert api.calls.get("cuMemcpyHtoDAsync", 0) - before.get("cuMemcpyHtoDAsync", 0) == 2
        assert api.calls.get("cuGraphInstantiate", 0) - before.get("cuGraphInstantiate", 0) == 2
        set_params = "cuGraphExecKernelNodeSetParams"
        # its dispatches were pointed at its own device table, once
        assert api.calls.get(set_params, 0) - before.get(set_params, 0) == 6
        assert cb.updated_nodes == 0


def count_binds(monkeypatch, cb) -> list:
    """The calls of ``cb``'s ``_bind`` (bringing the graph up to date with a table), counted."""
    calls = []
    bind = cb._bind

    def counted(table, queue):
        calls.append(table)
        return bind(table, queue)

    monkeypatch.setattr(cb, "_bind", counted)
    return calls


def test_prepared_executions_switch_tables_without_binding_again(fake_driver, monkeypatch):
    """Two executions of one command buffer alternating (a double-buffered step): after each
    table's first launches, a switch is a look-up of the table by identity, nothing recomputed."""
    with fake_driver.create_device(indirect_bindings=True) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 4)
        cb = alternating_command_buffer(dev, exe)
        binds = count_binds(monkeypatch, cb)
        executions = [dev.prepare([cb], [[bufs[0], bufs[1]]]), dev.prepare([cb], [[bufs[2], bufs[3]]])]
        sem = dev.create_semaphore(0)
        for i in range(12):
            executions[i % 2].submit(signal=[(sem, i + 1)])
        sem.wait(12, timeout=30)
        assert [words(dev, b)[0] for b in bufs] == [18, 18, 18, 18], "each execution's buffers, 3 adds a run"
        assert len(binds) == 3, "each table bound at its first launch, the first again when it came back"
        assert cb.image_uploads == 2 and cb.table_execs_made == 1


def test_a_known_table_is_bound_again_once_its_executable_graph_is_gone(fake_driver, monkeypatch):
    from hal.drivers.gpu import graph_command_buffer

    monkeypatch.setattr(graph_command_buffer, "TABLE_EXECS", 1)
    with fake_driver.create_device(indirect_bindings=True) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 6)
        cb = alternating_command_buffer(dev, exe)
        binds = count_binds(monkeypatch, cb)
        launched_stale = []
        launch = dev.api.graph_launch

        def checked_launch(graph_exec, stream):
            resources = cb._resources
            live = [resources.graph_exec] + [t.graph_exec for t in resources.table_execs.values()]
            if not any(graph_exec is g for g in live):
                launched_stale.append(graph_exec)
            return launch(graph_exec, stream)

        monkeypatch.setattr(dev.api, "graph_launch", checked_launch)
        executions = [dev.prepare([cb], [[bufs[2 * j], bufs[2 * j + 1]]]) for j in range(3)]
        sem = dev.create_semaphore(0)
        # 0 and 1 alternate (1 gets the one executable graph of a table's own), then 2 comes twice
        # and takes it over while 1 is still remembered, then 1 and 0 come back.
        order = [0, 1, 0, 1, 2, 2, 1, 0, 1, 0]
        for i, j in enumerate(order):
            executions[j].submit(signal=[(sem, i + 1)])
        sem.wait(len(order), timeout=30)
        runs = [order.count(j) * 3 for j in range(3)]
        assert [words(dev, b)[0] for b in bufs] == [r for r in runs for _ in (0, 1)], "each run read its own buffers"
        assert not launched_stale, "no executable graph launched after it was replaced"
        assert len(binds) > 4, "a table whose executable graph was replaced is bound again"


def test_executable_graphs_of_tables_are_bounded_oldest_dropped_first(fake_driver, monkeypatch):
    from hal.drivers.gpu import graph_command_buffer

    monkeypatch.setattr(graph_command_buffer, "TABLE_EXECS", 1)
    with fake_driver.create_device(indirect_bindings=True) as dev:
        destroyed = DestroyCounter(dev.api)
        exe = kernels(dev)
        bufs = zeroed(dev, 6)
        cb = alternating_command_buffer(dev, exe)
        tables = [[bufs[0], bufs[1]], [bufs[2], bufs[3]], [bufs[4], bufs[5]]]
        for i in range(12):
            run(dev, [cb], [tables[i % 3]])
            assert len(cb._resources.table_execs) <= 1
        assert [words(dev, b)[0] for b in bufs] == [12] * 6, "every run read its own table's buffers"
        made = cb.table_execs_made
        assert made > 1, "recurring tables replaced each other's executable graphs"
        dev.wait_idle()
        assert destroyed.count == made - 1, "each replaced one was destroyed once its launches ran"
    assert destroyed.count == made + 1, "and the last one with the main executable graph at close"


def test_a_table_that_also_changes_nodes_is_copied_each_time(fake_driver):
    with fake_driver.create_device(indirect_bindings=True) as dev:
        exe = kernels(dev)
        bufs = zeroed(dev, 4)
        cb = dispatch_then_fill(dev, exe, hal.Slot(1))  # the memset node is updated in place per table
        tables = [[bufs[0], bufs[1]], [bufs[2], bufs[3]]]
        for i in range(6):
            run(dev, [cb], [tables[i % 2]])
        assert [words(dev, b)[0] for b in bufs] == [3, 7, 3, 7]
        assert cb.table_execs_made == 0
        assert cb.image_uploads == 6
