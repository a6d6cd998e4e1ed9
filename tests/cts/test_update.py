"""update_buffer: inline host data copied into a buffer range."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import allocate_with, execute, random_bytes, record, submit_and_wait

SIZE = 256


@pytest.mark.parametrize(
    ("offset", "length"), [(0, 1), (0, 256), (1, 3), (3, 17), (4, 64), (100, 156), (255, 1), (128, 100)]
)
def test_update_range(device, offset, length):
    original = random_bytes(SIZE, seed=1)
    data = random_bytes(length, seed=offset + 1000)
    buf = allocate_with(device, original)
    execute(device, lambda cb: cb.update_buffer(data, (buf, offset, length)))
    expected = bytearray(original)
    expected[offset : offset + length] = data
    assert device.read(buf) == bytes(expected)


@pytest.mark.parametrize(
    "make_data",
    [
        pytest.param(lambda raw: raw, id="bytes"),
        pytest.param(bytearray, id="bytearray"),
        pytest.param(memoryview, id="memoryview"),
        pytest.param(lambda raw: np.frombuffer(raw, np.uint8).copy(), id="ndarray-uint8"),
        pytest.param(lambda raw: np.frombuffer(raw, np.float32).copy(), id="ndarray-float32"),
        pytest.param(lambda raw: np.frombuffer(raw, np.uint16).reshape(4, 8).copy(), id="ndarray-2d-uint16"),
    ],
)
def test_update_accepts_bytes_like_and_arrays(device, make_data):
    raw = random_bytes(64, seed=2)
    buf = allocate_with(device, bytes(128))
    execute(device, lambda cb: cb.update_buffer(make_data(raw), (buf, 32, 64)))
    assert device.read(buf) == bytes(32) + raw + bytes(32)


def test_update_whole_buffer_by_bare_reference(device):
    data = random_bytes(SIZE, seed=3)
    buf = allocate_with(device, bytes(SIZE))
    execute(device, lambda cb: cb.update_buffer(data, buf))
    assert device.read(buf) == data


def test_update_largest_allowed_size(device):
    data = random_bytes(65536, seed=4)
    buf = allocate_with(device, bytes(65536 + 8))
    execute(device, lambda cb: cb.update_buffer(data, (buf, 8, 65536)))
    assert device.read(buf) == bytes(8) + data


def test_update_data_is_captured_at_record_time(device):
    data = bytearray(b"\x01" * 32)
    buf = allocate_with(device, bytes(32))
    cb = record(device, lambda cb: cb.update_buffer(data, buf))
    data[:] = b"\x02" * 32
    submit_and_wait(device, [cb])
    assert device.read(buf) == b"\x01" * 32


def test_update_through_subspan(device):
    original = random_bytes(128, seed=5)
    buf = allocate_with(device, original)
    view = buf.subspan(40, 64)
    execute(device, lambda cb: cb.update_buffer(b"\xee" * 16, (view, 4, 16)))
    assert device.read(buf) == original[:44] + b"\xee" * 16 + original[60:]


def test_updates_in_order_across_barriers(device):
    buf = allocate_with(device, bytes(16))

    def body(cb):
        cb.update_buffer(b"\x01" * 16, buf)
        cb.execution_barrier()
        cb.update_buffer(b"\x02" * 8, (buf, 4, 8))
        cb.execution_barrier()
        cb.update_buffer(b"\x03", (buf, 6, 1))

    execute(device, body)
    assert device.read(buf) == b"\x01" * 4 + b"\x02\x02\x03" + b"\x02" * 5 + b"\x01" * 4


@pytest.mark.parametrize("length", [65537, 100000])
def test_update_larger_than_64k_is_invalid_argument(device, length):
    buf = allocate_with(device, bytes(length))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.update_buffer(bytes(length), buf)


@pytest.mark.parametrize(("data_length", "target_length"), [(8, 16), (16, 8), (1, 2)])
def test_update_length_mismatch_is_invalid_argument(device, data_length, target_length):
    buf = allocate_with(device, bytes(64))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.update_buffer(bytes(data_length), (buf, 0, target_length))


@pytest.mark.parametrize(("offset", "length"), [(60, 8), (64, 1), (0, 65)])
def test_update_outside_buffer_is_out_of_range(device, offset, length):
    buf = allocate_with(device, bytes(64))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.OutOfRangeError):
        cb.update_buffer(bytes(length), (buf, offset, length))
