"""fill_buffer: 1, 2 and 4-byte little-endian patterns over byte ranges."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import allocate_with, execute, filled, pattern_bytes, random_bytes

SIZE = 512

PATTERNS = {
    1: [0x00, 0xFF, 0x5A],
    2: [0x0000, 0xFFFF, 0x1234],
    4: [0x00000000, 0xFFFFFFFF, 0xDEADBEEF],
}

# (offset, length) in units of the pattern length.
RANGES = [(0, 1), (0, 7), (1, 1), (1, 2), (3, 5), (5, 17), (16, 32), (31, 1)]


def _cases():
    for pattern_length, patterns in PATTERNS.items():
        for pattern in patterns:
            for offset_units, length_units in RANGES:
                offset, length = offset_units * pattern_length, length_units * pattern_length
                case_id = f"p{pattern_length}-{pattern:#x}-off{offset}-len{length}"
                yield pytest.param(pattern_length, pattern, offset, length, id=case_id)


@pytest.mark.parametrize(("pattern_length", "pattern", "offset", "length"), list(_cases()))
def test_fill_range_matches_byte_pattern(device, pattern_length, pattern, offset, length):
    original = random_bytes(SIZE, seed=offset * 7 + length)
    buf = allocate_with(device, original)
    execute(device, lambda cb: cb.fill_buffer((buf, offset, length), pattern, pattern_length))
    assert device.read(buf) == filled(original, offset, length, pattern, pattern_length)


@pytest.mark.parametrize("pattern_length", [1, 2, 4])
def test_fill_whole_buffer_by_bare_reference(device, pattern_length):
    pattern = {1: 0xC3, 2: 0xBEEF, 4: 0x01020304}[pattern_length]
    buf = allocate_with(device, random_bytes(256, seed=1))
    execute(device, lambda cb: cb.fill_buffer(buf, pattern, pattern_length))
    assert device.read(buf) == pattern_bytes(pattern, pattern_length) * (256 // pattern_length)


@pytest.mark.parametrize("pattern_length", [1, 2, 4])
def test_fill_to_end_with_length_none(device, pattern_length):
    original = random_bytes(128, seed=2)
    buf = allocate_with(device, original)
    offset = 8 * pattern_length
    execute(device, lambda cb: cb.fill_buffer((buf, offset, None), 0xAB, pattern_length))
    assert device.read(buf) == filled(original, offset, 128 - offset, 0xAB, pattern_length)


def test_fill_float_one_is_little_endian(device):
    buf = allocate_with(device, np.zeros(64, np.float32))
    execute(device, lambda cb: cb.fill_buffer(buf, 0x3F800000, 4))
    np.testing.assert_array_equal(np.frombuffer(device.read(buf), np.float32), np.ones(64, np.float32))


def test_fill_two_byte_pattern_byte_order(device):
    buf = allocate_with(device, bytes(8))
    execute(device, lambda cb: cb.fill_buffer(buf, 0x1234, 2))
    assert device.read(buf) == b"\x34\x12" * 4


@pytest.mark.parametrize(
    ("sub_offset", "sub_length", "ref_offset", "ref_length"),
    [(0, 64, 0, 64), (16, 64, 0, 64), (16, 64, 8, 32), (100, 100, 4, 92), (252, 4, 0, 4)],
)
def test_fill_through_subspan(device, sub_offset, sub_length, ref_offset, ref_length):
    original = random_bytes(256, seed=sub_offset)
    buf = allocate_with(device, original)
    view = buf.subspan(sub_offset, sub_length)
    execute(device, lambda cb: cb.fill_buffer((view, ref_offset, ref_length), 0x11223344, 4))
    expected = filled(original, sub_offset + ref_offset, ref_length, 0x11223344, 4)
    assert device.read(buf) == expected


def test_later_fill_wins_after_barrier(device):
    buf = allocate_with(device, bytes(64))

    def body(cb):
        cb.fill_buffer(buf, 0x01, 1)
        cb.execution_barrier()
        cb.fill_buffer((buf, 16, 32), 0x0202, 2)
        cb.execution_barrier()
        cb.fill_buffer((buf, 24, 4), 0x03030303, 4)

    execute(device, body)
    expected = filled(filled(bytes([1]) * 64, 16, 32, 0x0202, 2), 24, 4, 0x03030303, 4)
    assert device.read(buf) == expected


def test_disjoint_fills_without_barrier(device):
    original = random_bytes(1024, seed=3)
    buf = allocate_with(device, original)
    ranges = [(0, 100, 0x0A, 1), (128, 64, 0x0B0B, 2), (256, 256, 0x0C0C0C0C, 4), (700, 300, 0x0D, 1)]

    def body(cb):
        for offset, length, pattern, pattern_length in ranges:
            cb.fill_buffer((buf, offset, length), pattern, pattern_length)

    execute(device, body)
    expected = original
    for offset, length, pattern, pattern_length in ranges:
        expected = filled(expected, offset, length, pattern, pattern_length)
    assert device.read(buf) == expected


def test_fill_one_mebibyte(device):
    size = 1 << 20
    buf = device.allocator.allocate(size)
    try:
        execute(device, lambda cb: cb.fill_buffer(buf, 0x7F7F7F7F, 4))
        data = np.frombuffer(device.read(buf), np.uint32)
        assert data.size == size // 4 and bool(np.all(data == 0x7F7F7F7F))
    finally:
        buf.release()


@pytest.mark.parametrize(
    ("pattern_length", "offset", "length"), [(2, 1, 2), (2, 0, 3), (4, 2, 4), (4, 0, 6), (4, 1, 8), (4, 4, 5)]
)
def test_misaligned_fill_is_invalid_argument(device, pattern_length, offset, length):
    original = random_bytes(64, seed=4)
    buf = allocate_with(device, original)
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError) as info:
        cb.fill_buffer((buf, offset, length), 0, pattern_length)
    assert type(info.value) is hal.InvalidArgumentError
    assert device.read(buf) == original


@pytest.mark.parametrize(("pattern", "pattern_length"), [(0x100, 1), (0x10000, 2), (1 << 32, 4)])
def test_pattern_too_big_for_its_length_is_invalid_argument(device, pattern, pattern_length):
    buf = allocate_with(device, bytes(16))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.fill_buffer(buf, pattern, pattern_length)


@pytest.mark.parametrize("pattern_length", [0, 3, 8, -1])
def test_pattern_length_outside_1_2_4_is_invalid_argument(device, pattern_length):
    buf = allocate_with(device, bytes(16))
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError) as info:
        cb.fill_buffer(buf, 0, pattern_length)
    assert "pattern_length" in str(info.value)
