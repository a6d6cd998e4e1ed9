"""Argument types as a hostile (or numpy-heavy) user passes them.

Every integer argument accepts Python ints and numpy integer scalars of any width, and rejects
floats, bools, strings and None with InvalidArgumentError naming the argument and the value,
before anything runs: buffers stay unchanged and the device stays usable. Timeouts accept numpy
scalars, and math.inf or huge values wait without limit.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

import hal

from .helpers import MAPPABLE, WAIT_TIMEOUT, allocate_with, random_bytes, read_u32, record, submit_and_wait

ORIGINAL = random_bytes(64, seed=61)
INT_TYPES = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]
Slot = hal.Slot


@pytest.mark.parametrize("t", INT_TYPES, ids=lambda t: t.__name__)
def test_numpy_integers_are_accepted_everywhere(device, kernels, t):
    """The same program written with numpy scalars gives the numpy reference result."""
    buf = device.allocator.allocate(t(64), memory_type=MAPPABLE)
    assert buf.size == 64 and type(buf.size) is int
    device.write(buf, ORIGINAL[:32], t(0))
    device.write(buf, ORIGINAL[32:], offset=t(32))
    assert device.read(buf, t(0), t(64)) == ORIGINAL
    view = buf.subspan(t(16), t(32))
    out = allocate_with(device, bytes(64))
    cb = device.create_command_buffer(binding_capacity=t(1))
    with cb.record():
        cb.fill_buffer((out, t(0), t(16)), t(0x5A), t(1))
        cb.update_buffer(b"\x01\x02\x03\x04", (out, t(16), t(4)))
        cb.copy_buffer((view, t(0), t(8)), (out, t(20), t(8)))
        cb.execution_barrier()
        cb.dispatch(kernels, t(list(kernels.exports).index(next(e for e in kernels.exports
                                                                   if e.name == "cts_add_one"))),
                    workgroups=t(1), constants=[t(2)], bindings=[Slot(t(0), t(32), t(8))])
        cb.dispatch(kernels, "cts_add_one", workgroups=(t(1), t(1), t(1)), constants=(t(2),),
                    bindings=[(out, t(40), t(8))])
    sem = device.create_semaphore(t(0))
    device.queue_execute([cb], wait=[(sem, t(0))], signal=[(sem, t(1))], binding_tables=[[out]], queue=t(0))
    sem.wait(t(1), timeout=t(30))
    expected = bytearray(64)
    expected[:16] = b"\x5a" * 16
    expected[16:20] = b"\x01\x02\x03\x04"
    expected[20:28] = ORIGINAL[16:24]
    words = np.frombuffer(bytes(expected), np.uint32).copy()
    words[8:10] += 1  # bytes 32..40 through the slot
    words[10:12] += 1  # bytes 40..48 directly
    np.testing.assert_array_equal(read_u32(device, out), words)
    sem.signal(t(2))
    assert sem.value == 2
    hal.wait_all([(sem, t(2))], timeout=t(5))
    assert hal.wait_any([(sem, t(2))], timeout=t(5)) == 0
    with buf.map(hal.MemoryAccess.READ, t(8), t(8)) as mv:
        assert mv.tobytes() == ORIGINAL[8:16]
    view.release()
    buf.release()
    out.release()


class Target:
    """Objects a call with a bad argument is made against, and checked afterwards."""

    def __init__(self, device: hal.Device, kernels: hal.Executable) -> None:
        self.device = device
        self.kernels = kernels
        self.buf = allocate_with(device, ORIGINAL)
        self.other = allocate_with(device, ORIGINAL)
        self.mappable = allocate_with(device, ORIGINAL, memory_type=MAPPABLE)
        self.sem = device.create_semaphore(0)
        self.cb = device.create_command_buffer()
        self.cb.begin()

    def reusable_with_slot(self) -> hal.CommandBuffer:
        return record(self.device, lambda cb: cb.fill_buffer(Slot(0), 1, 1), mode=hal.CommandBufferMode.REUSABLE,
                      binding_capacity=1)


#: argument name as the message names it -> call with the bad value ``v``
INT_ARGUMENTS = {
    "allocation size": lambda c, v: c.device.allocator.allocate(v),
    "pattern_length": lambda c, v: c.cb.fill_buffer(c.buf, 0, v),
    "fill pattern": lambda c, v: c.cb.fill_buffer(c.buf, v, 1),
    "fill target offset": lambda c, v: c.cb.fill_buffer((c.buf, v, 8), 0, 1),
    "fill target length": lambda c, v: c.cb.fill_buffer((c.buf, 0, v), 0, 1),
    "copy source offset": lambda c, v: c.cb.copy_buffer((c.buf, v, 8), (c.other, 0, 8)),
    "copy target length": lambda c, v: c.cb.copy_buffer((c.buf, 0, 8), (c.other, 0, v)),
    "update target offset": lambda c, v: c.cb.update_buffer(b"\x01" * 4, (c.buf, v, 4)),
    "workgroups": lambda c, v: c.cb.dispatch(c.kernels, "cts_add_one", v, [4], [c.buf]),
    "workgroups[1]": lambda c, v: c.cb.dispatch(c.kernels, "cts_add_one", (1, v, 1), [4], [c.buf]),
    "constant 0": lambda c, v: c.cb.dispatch(c.kernels, "cts_add_one", 1, [v], [c.buf]),
    "slot index": lambda c, v: record(c.device, lambda cb: cb.fill_buffer(Slot(v), 1, 1),
                                      binding_capacity=1),
    "binding_capacity": lambda c, v: c.device.create_command_buffer(binding_capacity=v),
    "semaphore initial value": lambda c, v: c.device.create_semaphore(v),
    "semaphore signal value": lambda c, v: c.sem.signal(v),
    "semaphore wait value": lambda c, v: c.sem.wait(v, timeout=0),
    "signal[0] value": lambda c, v: c.device.queue_barrier(signal=[(c.sem, v)]),
    "queue": lambda c, v: c.device.queue_barrier(queue=v),
    "subspan offset": lambda c, v: c.buf.subspan(v, 8),
    "read length": lambda c, v: c.device.read(c.buf, 0, v),
    "write offset": lambda c, v: c.device.write(c.buf, b"\x00", v),
    "map offset": lambda c, v: c.mappable.map(hal.MemoryAccess.READ, v, 8).__enter__(),
}
BAD_VALUES = {"float": 1.0, "bool": True, "str": "1", "None": None}


#: None is a length's documented value for "to the end", so it is no bad length.
BAD_CASES = [(argument, kind) for argument in INT_ARGUMENTS for kind in BAD_VALUES
             if not (kind == "None" and argument.endswith("length"))]


@pytest.mark.parametrize(("argument", "kind"), BAD_CASES)
def test_non_integer_arguments_are_invalid(device, kernels, argument, kind):
    target = Target(device, kernels)
    value = BAD_VALUES[kind]
    with pytest.raises(hal.InvalidArgumentError) as info:
        INT_ARGUMENTS[argument](target, value)
    message = str(info.value)
    assert argument.split("[")[0] in message, f"{message!r} does not name {argument!r}"
    assert repr(value) in message or str(value) in message, f"{message!r} does not show {value!r}"
    # Nothing ran or was recorded; the device still works.
    target.cb.end()
    submit_and_wait(device, [target.cb])
    assert device.read(target.buf) == ORIGINAL and device.read(target.other) == ORIGINAL
    assert target.sem.current_value == 0 and target.sem.failure is None


@pytest.mark.parametrize("value", [2**64, -1])
def test_semaphore_values_outside_64_bits_are_invalid(device, value):
    with pytest.raises(hal.InvalidArgumentError) as info:
        device.create_semaphore(value)
    assert str(value) in str(info.value)
    sem = device.create_semaphore(0)
    with pytest.raises(hal.InvalidArgumentError):
        sem.signal(value)
    assert sem.value == 0


def test_largest_semaphore_value_is_accepted(device):
    top = 2**64 - 1
    sem = device.create_semaphore(top - 1)
    sem.signal(np.uint64(top))
    assert sem.value == top
    sem.wait(top, timeout=0)


# -- timeouts ---------------------------------------------------------------------------------------------

TIMEOUTS = {
    "float64": np.float64(5.0), "float32": np.float32(5.0), "int64": np.int64(5), "uint8": np.uint8(5),
    "inf": math.inf, "numpy-inf": np.inf, "huge-float": 1e300, "huge-int": 10**30,
}


@pytest.mark.parametrize("timeout", list(TIMEOUTS))
def test_timeouts_accept_numpy_scalars_and_unlimited_values(device, timeout):
    value = TIMEOUTS[timeout]
    sem = device.create_semaphore(0)
    threading.Timer(0.05, lambda: sem.signal(1)).start()
    sem.wait(1, timeout=value)  # wakes on the signal; no OverflowError for inf/huge
    hal.wait_all([(sem, 1)], timeout=value)
    assert hal.wait_any([(sem, 1)], timeout=value) == 0
    device.wait_idle(timeout=value)


@pytest.mark.parametrize("timeout", ["1", True, -1, -0.5, math.nan, [1]], ids=str)
def test_bad_timeouts_are_invalid(device, timeout):
    sem = device.create_semaphore(0)
    for call in (lambda: sem.wait(1, timeout=timeout), lambda: hal.wait_all([(sem, 1)], timeout=timeout),
                 lambda: hal.wait_any([(sem, 1)], timeout=timeout), lambda: device.wait_idle(timeout=timeout)):
        with pytest.raises(hal.InvalidArgumentError) as info:
            call()
        assert "timeout" in str(info.value)


def test_numpy_timeout_still_expires(device):
    sem = device.create_semaphore(0)
    with pytest.raises(hal.DeadlineExceededError):
        sem.wait(1, timeout=np.float32(0.01))
    with pytest.raises(hal.DeadlineExceededError):
        hal.wait_any([(sem, 1)], timeout=np.int64(0))


def test_mapped_numpy_offsets_read_the_right_bytes(device):
    buf = allocate_with(device, ORIGINAL, memory_type=MAPPABLE)
    with buf.map(hal.MemoryAccess.READ, np.int32(4), np.uint16(12)) as mv:
        assert mv.tobytes() == ORIGINAL[4:16]
    assert WAIT_TIMEOUT > 0


@pytest.mark.parametrize("queue", [False, True, 0.0, "0", None, np.bool_(False), -1, 1 << 40],
                         ids=lambda v: f"{type(v).__name__}-{v!r}")
def test_queue_execute_rejects_a_bad_queue_also_one_equal_to_the_default(device, queue):
    """queue_execute recognises its default queue by identity: False (== 0) and the like still
    go through the whole check and are refused before anything runs."""
    sem = device.create_semaphore(0)
    buf = allocate_with(device, ORIGINAL)
    cb = record(device, lambda c: c.fill_buffer(buf, 0xAB, 1))
    with pytest.raises(hal.InvalidArgumentError, match="queue"):
        device.queue_execute([cb], signal=[(sem, 1)], queue=queue)
    assert sem.current_value == 0 and device.read(buf) == ORIGINAL
    device.queue_execute([cb], signal=[(sem, 1)], queue=np.int64(0))  # a numpy 0 is the first queue
    sem.wait(1, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\xab" * len(ORIGINAL)


@pytest.mark.parametrize("wait", [0, "()", b"", {}, [(None, 0)], [()], ((),)], ids=repr)
def test_queue_execute_rejects_a_bad_wait_list_also_an_empty_looking_one(device, wait):
    sem = device.create_semaphore(0)
    buf = allocate_with(device, ORIGINAL)
    cb = record(device, lambda c: c.fill_buffer(buf, 0xAB, 1))
    with pytest.raises(hal.InvalidArgumentError, match="wait"):
        device.queue_execute([cb], wait=wait, signal=[(sem, 1)])
    cb = record(device, lambda c: c.fill_buffer(buf, 0xAB, 1), hal.CommandBufferMode.REUSABLE)
    assert sem.current_value == 0 and device.read(buf) == ORIGINAL
    for value, empty in enumerate(((), [], None), 1):  # the empty wait lists all mean "no waits"
        device.queue_execute([cb], wait=empty, signal=[(sem, value)])
    sem.wait(3, timeout=WAIT_TIMEOUT)
    assert device.read(buf) == b"\xab" * len(ORIGINAL)
