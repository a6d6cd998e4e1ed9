"""copy_buffer between buffers, within a buffer, and through subspans."""

from __future__ import annotations

import pytest

import hal

from .helpers import allocate_with, execute, random_bytes

SIZE = 300


@pytest.mark.parametrize(
    ("src_offset", "dst_offset", "length"),
    [
        (0, 0, 300),
        (0, 0, 1),
        (1, 0, 1),
        (0, 1, 3),
        (3, 7, 5),
        (4, 8, 64),
        (13, 2, 200),
        (299, 0, 1),
        (0, 299, 1),
        (100, 100, 100),
        (256, 0, 44),
        (5, 250, 50),
    ],
)
def test_copy_range_between_buffers(device, src_offset, dst_offset, length):
    src_bytes = random_bytes(SIZE, seed=1)
    dst_bytes = random_bytes(SIZE, seed=2)
    src = allocate_with(device, src_bytes)
    dst = allocate_with(device, dst_bytes)
    execute(device, lambda cb: cb.copy_buffer((src, src_offset, length), (dst, dst_offset, length)))
    expected = bytearray(dst_bytes)
    expected[dst_offset : dst_offset + length] = src_bytes[src_offset : src_offset + length]
    assert device.read(dst) == bytes(expected)
    assert device.read(src) == src_bytes


@pytest.mark.parametrize("size", [1, 4, 100, 4096, 65537])
def test_copy_whole_buffer_by_bare_references(device, size):
    data = random_bytes(size, seed=size)
    src = allocate_with(device, data)
    dst = allocate_with(device, bytes(size))
    execute(device, lambda cb: cb.copy_buffer(src, dst))
    assert device.read(dst) == data


@pytest.mark.parametrize(
    ("src_offset", "dst_offset", "length"), [(0, 100, 100), (150, 0, 150), (10, 200, 64), (299, 0, 1)]
)
def test_copy_disjoint_ranges_within_one_buffer(device, src_offset, dst_offset, length):
    data = random_bytes(SIZE, seed=3)
    buf = allocate_with(device, data)
    execute(device, lambda cb: cb.copy_buffer((buf, src_offset, length), (buf, dst_offset, length)))
    expected = bytearray(data)
    expected[dst_offset : dst_offset + length] = data[src_offset : src_offset + length]
    assert device.read(buf) == bytes(expected)


def test_copy_between_subspans(device):
    src_bytes, dst_bytes = random_bytes(256, seed=4), random_bytes(256, seed=5)
    src, dst = allocate_with(device, src_bytes), allocate_with(device, dst_bytes)
    src_view, dst_view = src.subspan(32, 128), dst.subspan(64)
    execute(device, lambda cb: cb.copy_buffer((src_view, 8, 40), (dst_view, 100, 40)))
    expected = bytearray(dst_bytes)
    expected[164:204] = src_bytes[40:80]
    assert device.read(dst) == bytes(expected)


def test_copy_to_end_with_length_none(device):
    src_bytes, dst_bytes = random_bytes(64, seed=6), random_bytes(64, seed=7)
    src, dst = allocate_with(device, src_bytes), allocate_with(device, dst_bytes)
    execute(device, lambda cb: cb.copy_buffer((src, 16, None), (dst, 0, 48)))
    assert device.read(dst) == src_bytes[16:] + dst_bytes[48:]


def test_copy_chain_through_barriers(device):
    data = random_bytes(128, seed=8)
    a = allocate_with(device, data)
    b = allocate_with(device, bytes(128))
    c = allocate_with(device, bytes(128))

    def body(cb):
        cb.copy_buffer(a, b)
        cb.execution_barrier()
        cb.copy_buffer((b, 0, 64), (c, 64, 64))
        cb.execution_barrier()
        cb.copy_buffer((c, 64, 64), (c, 0, 64))

    execute(device, body)
    assert device.read(b) == data
    assert device.read(c) == data[:64] + data[:64]


def test_fill_then_copy_then_fill(device):
    a = allocate_with(device, bytes(64))
    b = allocate_with(device, random_bytes(64, seed=9))

    def body(cb):
        cb.fill_buffer(a, 0x77, 1)
        cb.execution_barrier()
        cb.copy_buffer(a, b)
        cb.execution_barrier()
        cb.fill_buffer((b, 0, 16), 0x99, 1)

    execute(device, body)
    assert device.read(b) == b"\x99" * 16 + b"\x77" * 48


@pytest.mark.parametrize(("src_range", "dst_range"), [((0, 8), (0, 16)), ((0, 16), (4, 8)), ((0, None), (0, 32))])
def test_copy_length_mismatch_is_invalid_argument(device, src_range, dst_range):
    src = allocate_with(device, bytes(64))
    dst = allocate_with(device, bytes(64))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError) as info:
        cb.copy_buffer((src, *src_range), (dst, *dst_range))
    assert type(info.value) is hal.InvalidArgumentError


@pytest.mark.parametrize(("src_offset", "dst_offset", "length"), [(0, 8, 16), (8, 0, 16), (0, 0, 32), (10, 41, 32)])
def test_overlapping_copy_within_one_buffer_is_invalid_argument(device, src_offset, dst_offset, length):
    buf = allocate_with(device, bytes(128))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.copy_buffer((buf, src_offset, length), (buf, dst_offset, length))


def test_overlapping_copy_between_aliasing_subspans_is_invalid_argument(device):
    buf = allocate_with(device, bytes(128))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.copy_buffer((buf.subspan(0, 64), 0, 32), (buf.subspan(16, 64), 0, 32))


@pytest.mark.parametrize(
    ("src_range", "dst_range"), [((60, 8), (0, 8)), ((0, 8), (60, 8)), ((65, 0), (0, 0)), ((0, 65), (0, 65))]
)
def test_copy_outside_buffer_is_out_of_range(device, src_range, dst_range):
    src = allocate_with(device, bytes(64))
    dst = allocate_with(device, bytes(64))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.OutOfRangeError):
        cb.copy_buffer((src, *src_range), (dst, *dst_range))
