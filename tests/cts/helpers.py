"""Small helpers shared by the conformance tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

import hal

WAIT_TIMEOUT = 30.0

#: Device property a driver sets when a failing kernel leaves the device usable for new work
#: (CPU drivers: the kernel raised a Python exception). On GPUs a kernel fault usually ends
#: the context for the rest of the process.
RECOVERABLE_FAULTS_PROPERTY = "recoverable_kernel_faults"


def faults_recoverable(device: hal.Device) -> bool:
    return bool(device.info.properties.get(RECOVERABLE_FAULTS_PROPERTY, False))

# Memory the host can map on every driver (pinned host memory on GPUs).
MAPPABLE = hal.MemoryType.HOST_LOCAL | hal.MemoryType.HOST_VISIBLE


def random_bytes(size: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def random_array(shape, dtype, seed: int = 0) -> np.ndarray:
    """Standard normal values of ``dtype`` (a numpy dtype or its name); complex ones in both parts."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def allocate_with(device: hal.Device, data: bytes | np.ndarray, **kwargs) -> hal.Buffer:
    """A buffer holding `data` (written synchronously)."""
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    buf = device.allocator.allocate(len(raw), **kwargs)
    device.write(buf, raw)
    return buf


def read_u32(device: hal.Device, buf: hal.Buffer, offset: int = 0, length: int | None = None) -> np.ndarray:
    return np.frombuffer(device.read(buf, offset, length), dtype=np.uint32)


def read_f32(device: hal.Device, buf: hal.Buffer) -> np.ndarray:
    return np.frombuffer(device.read(buf), dtype=np.float32)


def pattern_bytes(pattern: int, pattern_length: int) -> bytes:
    return pattern.to_bytes(pattern_length, "little")


def filled(original: bytes, offset: int, length: int, pattern: int, pattern_length: int) -> bytes:
    """What `original` looks like after filling [offset, offset + length)."""
    expected = bytearray(original)
    expected[offset : offset + length] = pattern_bytes(pattern, pattern_length) * (length // pattern_length)
    return bytes(expected)


def submit_and_wait(
    device: hal.Device,
    command_buffers: Sequence[hal.CommandBuffer],
    binding_tables: Sequence[object] | None = None,
    wait: Sequence[tuple[hal.Semaphore, int]] = (),
) -> hal.Semaphore:
    sem = device.create_semaphore(0)
    device.queue_execute(list(command_buffers), wait=wait, signal=[(sem, 1)], binding_tables=binding_tables)
    sem.wait(1, timeout=WAIT_TIMEOUT)
    return sem


def record(
    device: hal.Device,
    body: Callable[[hal.CommandBuffer], None],
    mode: hal.CommandBufferMode = hal.CommandBufferMode.ONE_SHOT,
    binding_capacity: int = 0,
) -> hal.CommandBuffer:
    cb = device.create_command_buffer(mode=mode, binding_capacity=binding_capacity)
    with cb.record():
        body(cb)
    return cb


def execute(device: hal.Device, body: Callable[[hal.CommandBuffer], None]) -> None:
    """Records one one-shot command buffer, submits it and waits for it."""
    submit_and_wait(device, [record(device, body)])


def assert_not_reached(sem: hal.Semaphore, value: int) -> None:
    """The semaphore has neither reached `value` nor failed."""
    assert sem.failure is None
    assert sem.value < value


@contextmanager
def safety_signal(sem: hal.Semaphore, value: int, after: float = 10.0) -> Iterator[None]:
    """Signals `sem` to `value` from a timer if the test has not by then.

    A wait-before-signal bug would otherwise hang the suite: the timer
    unblocks it and the test's own timing checks report the failure.
    """

    def fire() -> None:
        try:
            if sem.failure is None and sem.value < value:
                sem.signal(value)
        except hal.HalError:
            pass  # signalled or failed meanwhile by the test itself

    timer = threading.Timer(after, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def root_cause(err: BaseException) -> BaseException:
    while err.__cause__ is not None:
        err = err.__cause__
    return err


def cause_chain(err: BaseException) -> list[BaseException]:
    chain = [err]
    while chain[-1].__cause__ is not None:
        chain.append(chain[-1].__cause__)
    return chain
