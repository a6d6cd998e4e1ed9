"""Recording a dispatch like the last one from C (``hal/drivers/gpu/_replay_record.c``), on the
simulated GPU.

As in test_replay.py, each test records the same dispatches on a device with the C code and on
one without it (``HAL_NATIVE=0``) and compares what they do: buffer contents after a run against
counts computed here, the recorded commands, the error each bad call raises. The Python
``CommandBuffer.dispatch``'s frames are counted to show which path a dispatch took.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import hal
from hal.command_buffer import CommandBuffer

from .conftest import replay_device as device
from .test_gpu_generic import EXPORTS, add_one, add_pair, words, zeroed
from .test_replay import outcome, python_calls

pytest.importorskip("hal.drivers.gpu._replay", reason="the C replay is not built here (no C compiler at install)")

MODES = ["graph", "stream"]

#: How many times a call entered the Python ``CommandBuffer.dispatch`` on this thread.
python_dispatches = partial(python_calls, function=CommandBuffer.dispatch)


def pair_kernels(dev):
    return dev.load_executable(hal.ExecutableSpec(
        "numpy", {"add_one": add_one, "add_pair": add_pair},
        [EXPORTS[0], hal.Export("add_pair", (64, 1, 1), bindings=2, constants=1)]))


def recorded(cb) -> list:
    """What the command buffer recorded, device addresses aside: each level's dispatches (grid,
    block, argument count) and the constants among the packed arguments."""
    return [[(type(c).__name__, getattr(c, "grid", None), getattr(c, "block", None), getattr(c, "arg_count", None))
             for c in level] for level in cb.levels]


def program(dev, mode: str):
    """A loop of dispatches of two exports, constants in several forms, whole buffers, a range, a
    slot, a barrier, a dispatch of no work: (recorded commands, buffer words after one run, Python
    dispatch entries)."""
    exe = pair_kernels(dev)
    a, b, c = zeroed(dev, 3)
    kind = hal.CommandBufferMode.REUSABLE if mode == "graph" else hal.CommandBufferMode.ONE_SHOT
    cb = dev.create_command_buffer(kind, binding_capacity=1)
    grid = (1, 1, 1)
    entered = 0
    cb.begin()
    for i in range(12):
        entered += python_dispatches(lambda i=i: cb.dispatch(exe, "add_one", grid, [1 + i % 4], [a]))
    entered += python_dispatches(lambda: cb.dispatch(exe, "add_one", grid, (16,), (b,)))
    entered += python_dispatches(lambda: cb.dispatch(exe, "add_one", grid, [np.uint32(2)], [b]))  # numpy constant
    entered += python_dispatches(lambda: cb.dispatch(exe, 1, grid, [3], [c, a]))  # another export: resolved
    entered += python_dispatches(lambda: cb.dispatch(exe, 1, grid, [3], [c, a]))
    entered += python_dispatches(lambda: cb.dispatch(exe, 1, (1, 1, 1), [3], [c, (a, 0, 16)]))
    cb.execution_barrier()
    entered += python_dispatches(lambda: cb.dispatch(exe, 1, grid, [3], [c, hal.Slot(0)]))
    entered += python_dispatches(lambda: cb.dispatch(exe, 1, (0, 1, 1), [3], [c, a]))  # no work
    entered += python_dispatches(lambda: cb.dispatch(exe, 1, grid, [3], [c, a], ))
    cb.end()
    commands = recorded(cb)
    sem = dev.create_semaphore(0)
    dev.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[b]])
    sem.wait(1, timeout=30)
    return commands, [words(dev, x) for x in (a, b, c)], entered


@pytest.mark.parametrize("mode", MODES)
def test_usual_dispatches_are_recorded_in_c_as_in_python(fake_driver, monkeypatch, mode):
    results = {}
    for native in (True, False):
        with device(fake_driver, monkeypatch, native, command_buffer=mode) as dev:
            results[native] = program(dev, mode)
    assert results[True][:2] == results[False][:2]
    a, b, c = results[True][1]
    # a: 12 dispatches over 1-4 words, then four add_pair reading it as their second binding
    # (three whole, one 16-byte range) over 3 words; b: 16 words once, 2 words, the slot's dispatch.
    expected_a = [sum(1 for i in range(12) if w < 1 + i % 4) + (4 if w < 3 else 0) for w in range(16)]
    assert a == expected_a
    assert b == [1 + (w < 2) + (w < 3) if w < 16 else 0 for w in range(16)]
    assert c == [5 if w < 3 else 0 for w in range(16)]
    assert results[False][2] == 20
    # In C: the repeats of one export with one grid tuple and whole buffers bound before; Python:
    # the first of each, the numpy constant, the range, the slot, the new grid tuples, no work.
    assert results[True][2] == 8


def test_bad_dispatches_fail_as_on_the_python_path_and_leave_the_device_usable(pair):
    outcomes = []
    stranger = object()

    def check(dev):
        exe = pair_kernels(dev)
        a, spare = zeroed(dev, 2)
        other = pair[1 if dev is pair[0] else 0]
        foreign = other.allocator.allocate(64)
        grid = (1, 1, 1)
        cb = dev.create_command_buffer(hal.CommandBufferMode.ONE_SHOT)
        cb.begin()
        cb.dispatch(exe, "add_one", grid, [4], [a])
        bad = {name: outcome(call) for name, call in {
            "constants count": lambda: cb.dispatch(exe, "add_one", grid, [4, 5], [a]),
            "float constant": lambda: cb.dispatch(exe, "add_one", grid, [4.0], [a]),
            "constant too large": lambda: cb.dispatch(exe, "add_one", grid, [1 << 32], [a]),
            "constant too negative": lambda: cb.dispatch(exe, "add_one", grid, [-(1 << 31) - 1], [a]),
            "constant a string": lambda: cb.dispatch(exe, "add_one", grid, ["4"], [a]),
            "bindings count": lambda: cb.dispatch(exe, "add_one", grid, [4], [a, a]),
            "binding not a buffer": lambda: cb.dispatch(exe, "add_one", grid, [4], [stranger]),
            "foreign buffer": lambda: cb.dispatch(exe, "add_one", grid, [4], [foreign]),
            "constants not a sequence": lambda: cb.dispatch(exe, "add_one", grid, 4, [a]),
            "unknown entry point": lambda: cb.dispatch(exe, "nothing", grid, [4], [a]),
        }.items()}
        cb.dispatch(exe, "add_one", grid, [4], bindings=[a])  # a keyword: the Python method
        spare.release()  # a release since: the whole-buffer memo is looked at again
        cb.dispatch(exe, "add_one", grid, [2], [a])
        a_copy = a
        cb.end()
        bad["after end"] = outcome(lambda: cb.dispatch(exe, "add_one", grid, [4], [a_copy]))
        sem = dev.create_semaphore(0)
        dev.queue_execute([cb], signal=[(sem, 1)])
        sem.wait(1, timeout=30)
        foreign.release()
        outcomes.append((bad, words(dev, a)))

    for dev in pair:
        check(dev)
    native, python = outcomes
    assert native == python
    for name, result in native[0].items():
        assert result is not None and issubclass(result[0], (hal.HalError, TypeError)), (name, result)
    assert native[1] == [3 if w < 2 else 2 if w < 4 else 0 for w in range(16)]


def test_released_buffers_and_closed_devices_are_reported_alike(pair):
    outcomes = []

    def check(dev):
        exe = pair_kernels(dev)
        (a,) = zeroed(dev, 1)
        grid = (1, 1, 1)
        cb = dev.create_command_buffer(hal.CommandBufferMode.ONE_SHOT)
        cb.begin()
        cb.dispatch(exe, "add_one", grid, [4], [a])
        a.release()
        released = outcome(lambda: cb.dispatch(exe, "add_one", grid, [4], [a]))
        dev.close()
        closed = outcome(lambda: cb.dispatch(exe, "add_one", grid, [4], [a]))
        outcomes.append((released, closed))

    for dev in pair:
        check(dev)
    assert outcomes[0] == outcomes[1]
    assert all(result is not None for result in outcomes[0])


def test_a_replaced_queue_execute_keeps_the_c_dispatch_and_wait(fake_driver):
    """A spy over ``device.queue_execute`` (as the runtime's tests set) changes nothing else."""
    with fake_driver.create_device(command_buffer="stream") as dev:
        calls = []
        replay = dev.queue_execute

        def spy(*args, **kwargs):
            calls.append(len(args))
            return replay(*args, **kwargs)

        dev.queue_execute = spy
        exe = pair_kernels(dev)
        (a,) = zeroed(dev, 1)
        cb, sem = dev.create_command_buffer(), dev.create_semaphore(0)
        assert "dispatch" in vars(cb) and "wait" in vars(sem)
        with cb.record():
            for _ in range(3):
                cb.dispatch(exe, "add_one", (1, 1, 1), [2], [a])
        dev.queue_execute([cb], signal=[(sem, 1)])
        sem.wait(1)
        assert calls == [1] and words(dev, a)[:3] == [3, 3, 0]
