"""Mapping host-visible buffers, subspan aliasing and range checks."""

from __future__ import annotations

import pytest

import hal

from .helpers import MAPPABLE, execute, random_bytes

Access = hal.MemoryAccess


@pytest.fixture
def mappable(device):
    buffers = []

    def make(data: bytes) -> hal.Buffer:
        buf = device.allocator.allocate(len(data), memory_type=MAPPABLE)
        device.write(buf, data)
        buffers.append(buf)
        return buf

    yield make
    for buf in buffers:
        buf.release()


@pytest.mark.parametrize(("offset", "length"), [(0, None), (0, 1), (7, 9), (100, 28), (127, 1), (64, None)])
def test_map_read_sees_buffer_contents(device, mappable, offset, length):
    data = random_bytes(128, seed=offset)
    buf = mappable(data)
    with buf.map(Access.READ, offset, length) as view:
        assert isinstance(view, memoryview)
        assert view.format == "B"
        assert view.readonly
        end = 128 if length is None else offset + length
        assert len(view) == end - offset
        assert view.tobytes() == data[offset:end]


@pytest.mark.parametrize(("offset", "length"), [(0, None), (3, 5), (64, 64), (127, 1)])
def test_map_write_is_visible_to_reads_and_commands(device, mappable, offset, length):
    original = random_bytes(128, seed=1)
    buf = mappable(original)
    end = 128 if length is None else offset + length
    patch = random_bytes(end - offset, seed=2)
    with buf.map(Access.WRITE, offset, length) as view:
        assert not view.readonly
        view[:] = patch
    expected = original[:offset] + patch + original[end:]
    assert device.read(buf) == expected
    other = device.allocator.allocate(128)
    execute(device, lambda cb: cb.copy_buffer(buf, other))
    assert device.read(other) == expected
    other.release()


def test_map_default_access_reads_and_writes(device, mappable):
    buf = mappable(bytes(16))
    with buf.map() as view:
        assert not view.readonly
        view[4:8] = b"\x01\x02\x03\x04"
        assert view.tobytes()[4:8] == b"\x01\x02\x03\x04"
    assert device.read(buf) == bytes(4) + b"\x01\x02\x03\x04" + bytes(8)


def test_map_after_command_sees_its_result(device, mappable):
    buf = mappable(bytes(64))
    execute(device, lambda cb: cb.fill_buffer((buf, 16, 32), 0xABCD, 2))
    with buf.map(Access.READ) as view:
        assert view.tobytes() == bytes(16) + b"\xcd\xab" * 16 + bytes(16)


def test_subspan_aliases_its_parent(device, mappable):
    data = random_bytes(256, seed=3)
    buf = mappable(data)
    view = buf.subspan(64, 128)
    assert view.size == 128
    assert device.read(view) == data[64:192]
    device.write(view, b"\xff" * 8, 4)
    assert device.read(buf, 64, 16) == data[64:68] + b"\xff" * 8 + data[76:80]
    with view.map(Access.READ, 4, 8) as mapped:
        assert mapped.tobytes() == b"\xff" * 8


@pytest.mark.parametrize(("first", "second"), [((0, 128), (0, 64)), ((16, 200), (8, 100)), ((255, 1), (0, 1))])
def test_subspan_of_subspan(device, mappable, first, second):
    data = random_bytes(256, seed=4)
    buf = mappable(data)
    inner = buf.subspan(*first).subspan(*second)
    start = first[0] + second[0]
    assert inner.size == second[1]
    assert device.read(inner) == data[start : start + second[1]]


def test_subspan_to_the_end(device, mappable):
    data = random_bytes(100, seed=5)
    buf = mappable(data)
    view = buf.subspan(30)
    assert view.size == 70
    assert device.read(view) == data[30:]


@pytest.mark.parametrize(("offset", "length"), [(0, 257), (256, 1), (300, None), (200, 100), (257, 0)])
def test_subspan_outside_buffer_is_out_of_range(device, offset, length):
    buf = device.allocator.allocate(256)
    with pytest.raises(hal.OutOfRangeError):
        buf.subspan(offset, length)
    buf.release()


@pytest.mark.parametrize(("offset", "length"), [(0, 65), (64, 1), (65, None), (60, 8)])
def test_map_range_outside_buffer_is_out_of_range(device, mappable, offset, length):
    buf = mappable(bytes(64))
    with pytest.raises(hal.OutOfRangeError), buf.map(Access.READ, offset, length):
        pass


@pytest.mark.parametrize(("offset", "length"), [(0, 65), (64, 1), (65, None)])
def test_read_range_outside_buffer_is_out_of_range(device, offset, length):
    buf = device.allocator.allocate(64)
    with pytest.raises(hal.OutOfRangeError):
        device.read(buf, offset, length)
    buf.release()


@pytest.mark.parametrize(("offset", "size"), [(0, 65), (60, 8), (64, 1), (100, 1)])
def test_write_range_outside_buffer_is_out_of_range(device, offset, size):
    buf = device.allocator.allocate(64)
    device.write(buf, b"\x01" * 64)
    with pytest.raises(hal.OutOfRangeError):
        device.write(buf, b"\x02" * size, offset)
    assert device.read(buf) == b"\x01" * 64, "a rejected write must not write part of its data"
    buf.release()


def test_map_without_mapping_usage_is_failed_precondition(device):
    usage = hal.BufferUsage.TRANSFER | hal.BufferUsage.DISPATCH_STORAGE
    buf = device.allocator.allocate(64, memory_type=MAPPABLE, usage=usage)
    with pytest.raises(hal.FailedPreconditionError), buf.map(Access.READ):
        pass
    buf.release()


def test_device_local_memory_maps_only_if_host_visible(device):
    buf = device.allocator.allocate(64, memory_type=hal.MemoryType.DEVICE_LOCAL)
    device.write(buf, b"\x09" * 64)
    if hal.MemoryType.HOST_VISIBLE in buf.memory_type:
        with buf.map(Access.READ) as view:
            assert view.tobytes() == b"\x09" * 64
    else:
        with pytest.raises(hal.FailedPreconditionError), buf.map(Access.READ):
            pass
    buf.release()
