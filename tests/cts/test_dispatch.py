"""dispatch of the CTS kernels; results checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import allocate_with, execute, read_f32, read_u32, submit_and_wait
from .kernels import EXPORT_NAMES, KERNELS, WORKGROUP_SIZE, f32_bits, groups_for, load_kernels

SENTINEL = 0xCAFEF00D


def sentinel_buffer(device, words: int) -> hal.Buffer:
    return allocate_with(device, np.full(words, SENTINEL, np.uint32))


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4096])
def test_iota(device, kernels, n):
    buf = sentinel_buffer(device, n + 3)
    execute(
        device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=groups_for(n), constants=[n], bindings=[buf])
    )
    expected = np.concatenate([np.arange(n, dtype=np.uint32), np.full(3, SENTINEL, np.uint32)])
    np.testing.assert_array_equal(read_u32(device, buf), expected)


@pytest.mark.parametrize(("n", "groups"), [(1000, 1), (1000, 3), (200, (2, 1, 1)), (200, (1, 2, 1)), (200, (1, 1, 2))])
def test_under_dispatch_touches_only_launched_threads(device, kernels, n, groups):
    buf = sentinel_buffer(device, n)
    execute(device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=groups, constants=[n], bindings=[buf]))
    gx, gy, gz = (groups, 1, 1) if isinstance(groups, int) else groups
    launched = gx * gy * gz * WORKGROUP_SIZE
    expected = np.full(n, SENTINEL, np.uint32)
    expected[:launched] = np.arange(min(launched, n), dtype=np.uint32)
    np.testing.assert_array_equal(read_u32(device, buf), expected)


@pytest.mark.parametrize("a", [2.0, -0.5, 0.0, 1e-3, 3.25])
@pytest.mark.parametrize("n", [5, 256, 1000])
def test_saxpy(device, kernels, n, a):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    x_buf, y_buf = allocate_with(device, x), allocate_with(device, y)
    execute(
        device,
        lambda cb: cb.dispatch(
            kernels, "cts_saxpy", workgroups=groups_for(n), constants=[n, f32_bits(a)], bindings=[x_buf, y_buf]
        ),
    )
    expected = (np.float32(a) * x).astype(np.float32) + y
    np.testing.assert_array_equal(read_f32(device, y_buf), expected)
    np.testing.assert_array_equal(read_f32(device, x_buf), x)


def test_add_one_wraps_at_uint32_max(device, kernels):
    values = np.array([0, 1, 0x7FFFFFFF, 0xFFFFFFFE, 0xFFFFFFFF], np.uint32)
    buf = allocate_with(device, values)
    execute(device, lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[5], bindings=[buf]))
    np.testing.assert_array_equal(read_u32(device, buf), np.array([1, 2, 0x80000000, 0xFFFFFFFF, 0], np.uint32))


@pytest.mark.parametrize(("offset_words", "n"), [(0, 16), (1, 16), (7, 100), (250, 6), (128, 128)])
def test_binding_subrange(device, kernels, offset_words, n):
    base = np.arange(256, dtype=np.uint32) * 10
    buf = allocate_with(device, base)
    ref = (buf, offset_words * 4, n * 4)
    execute(
        device, lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=groups_for(n), constants=[n], bindings=[ref])
    )
    expected = base.copy()
    expected[offset_words : offset_words + n] += 1
    np.testing.assert_array_equal(read_u32(device, buf), expected)


def test_binding_through_subspan(device, kernels):
    base = np.arange(128, dtype=np.uint32)
    buf = allocate_with(device, base)
    view = buf.subspan(64, 256)  # words 16 .. 80
    execute(
        device, lambda cb: cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[32], bindings=[(view, 16, 128)])
    )
    expected = base.copy()
    expected[20:52] += 1
    np.testing.assert_array_equal(read_u32(device, buf), expected)


def test_disjoint_subranges_without_barrier(device, kernels):
    buf = sentinel_buffer(device, 256)

    def body(cb):
        for part in range(4):
            cb.dispatch(kernels, "cts_iota", workgroups=1, constants=[64], bindings=[(buf, part * 256, 256)])

    execute(device, body)
    np.testing.assert_array_equal(read_u32(device, buf), np.tile(np.arange(64, dtype=np.uint32), 4))


@pytest.mark.parametrize(
    ("n", "src_offset", "dst_offset"), [(10, 0, 0), (10, 5, 0), (10, 0, 5), (64, 3, 60), (1, 127, 0)]
)
def test_copy_offset_constants(device, kernels, n, src_offset, dst_offset):
    src_values = np.arange(1000, 1128, dtype=np.uint32)
    src = allocate_with(device, src_values)
    dst = sentinel_buffer(device, 128)
    execute(
        device,
        lambda cb: cb.dispatch(
            kernels,
            "cts_copy_offset",
            workgroups=groups_for(n),
            constants=[n, src_offset, dst_offset],
            bindings=[src, dst],
        ),
    )
    expected = np.full(128, SENTINEL, np.uint32)
    expected[dst_offset : dst_offset + n] = src_values[src_offset : src_offset + n]
    np.testing.assert_array_equal(read_u32(device, dst), expected)


@pytest.mark.parametrize("n", [1, 100, 777])
def test_three_bindings(device, kernels, n):
    rng = np.random.default_rng(n)
    a, b, out = (rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    a_buf, b_buf, out_buf = allocate_with(device, a), allocate_with(device, b), allocate_with(device, out)
    execute(
        device,
        lambda cb: cb.dispatch(
            kernels, "cts_mix3", workgroups=groups_for(n), constants=[n], bindings=[a_buf, b_buf, out_buf]
        ),
    )
    expected = ((a.astype(np.uint64) + 2 * b.astype(np.uint64) + 3 * out.astype(np.uint64)) % 2**32).astype(np.uint32)
    np.testing.assert_array_equal(read_u32(device, out_buf), expected)
    np.testing.assert_array_equal(read_u32(device, a_buf), a)
    np.testing.assert_array_equal(read_u32(device, b_buf), b)


@pytest.mark.parametrize(
    ("constant", "expected"),
    [
        (0, 0),
        (1, 1),
        (0x7FFFFFFF, 0x7FFFFFFF),
        (0x80000000, 0x80000000),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (-1, 0xFFFFFFFF),
        (-(2**31), 0x80000000),
    ],
)
def test_constant_values(device, kernels, constant, expected):
    buf = sentinel_buffer(device, 70)
    execute(
        device,
        lambda cb: cb.dispatch(kernels, "cts_fill_constant", workgroups=2, constants=[70, constant], bindings=[buf]),
    )
    np.testing.assert_array_equal(read_u32(device, buf), np.full(70, expected, np.uint32))


def _expected_workgroup_ids(n, groups):
    gx, gy, gz = groups
    words = []
    for bz in range(gz):
        for by in range(gy):
            for bx in range(gx):
                words.extend([(bz << 20) | (by << 10) | bx] * WORKGROUP_SIZE)
    result = np.full(n, SENTINEL, np.uint32)
    count = min(n, len(words))
    result[:count] = words[:count]
    return result


@pytest.mark.parametrize("groups", [(1, 1, 1), (3, 1, 1), (1, 3, 1), (1, 1, 3), (3, 2, 4), (2, 5, 1), (5, 1, 2)])
def test_three_dimensional_workgroups(device, kernels, groups):
    n = 64 * 40
    buf = sentinel_buffer(device, n)
    execute(
        device, lambda cb: cb.dispatch(kernels, "cts_workgroup_id", workgroups=groups, constants=[n], bindings=[buf])
    )
    np.testing.assert_array_equal(read_u32(device, buf), _expected_workgroup_ids(n, groups))


@pytest.mark.parametrize("groups", [0, (0, 1, 1), (1, 0, 1), (1, 1, 0), (0, 0, 0)])
def test_zero_workgroups_do_nothing(device, kernels, groups):
    buf = sentinel_buffer(device, 64)
    execute(device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=groups, constants=[64], bindings=[buf]))
    np.testing.assert_array_equal(read_u32(device, buf), np.full(64, SENTINEL, np.uint32))


def test_many_workgroups(device, kernels):
    n = 1 << 20
    buf = device.allocator.allocate(n * 4)
    try:
        execute(
            device, lambda cb: cb.dispatch(kernels, "cts_iota", workgroups=groups_for(n), constants=[n], bindings=[buf])
        )
        np.testing.assert_array_equal(read_u32(device, buf), np.arange(n, dtype=np.uint32))
    finally:
        buf.release()


def test_kernels_in_order_across_barriers(device, kernels):
    n = 300
    a = sentinel_buffer(device, n)
    b = sentinel_buffer(device, n)

    def body(cb):
        cb.dispatch(kernels, "cts_iota", workgroups=groups_for(n), constants=[n], bindings=[a])
        cb.execution_barrier()
        cb.dispatch(kernels, "cts_add_one", workgroups=groups_for(n), constants=[n], bindings=[a])
        cb.execution_barrier()
        cb.dispatch(kernels, "cts_copy_offset", workgroups=groups_for(n), constants=[n, 0, 0], bindings=[a, b])
        cb.execution_barrier()
        cb.dispatch(kernels, "cts_add_one", workgroups=groups_for(n), constants=[n], bindings=[b])

    execute(device, body)
    np.testing.assert_array_equal(read_u32(device, a), np.arange(1, n + 1, dtype=np.uint32))
    np.testing.assert_array_equal(read_u32(device, b), np.arange(2, n + 2, dtype=np.uint32))


def test_transfers_and_dispatches_mixed(device, kernels):
    buf = sentinel_buffer(device, 128)

    def body(cb):
        cb.fill_buffer(buf, 5, 4)
        cb.execution_barrier()
        cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[64], bindings=[(buf, 0, 256)])
        cb.execution_barrier()
        cb.update_buffer(np.array([9, 9], np.uint32), (buf, 8, 8))
        cb.execution_barrier()
        cb.copy_buffer((buf, 0, 256), (buf, 256, 256))

    execute(device, body)
    half = np.full(64, 6, np.uint32)
    half[2:4] = 9
    np.testing.assert_array_equal(read_u32(device, buf), np.concatenate([half, half]))


def test_dispatch_by_export_index(device, kernels):
    index = [export.name for export in kernels.exports].index("cts_iota")
    buf = sentinel_buffer(device, 10)
    execute(device, lambda cb: cb.dispatch(kernels, index, workgroups=1, constants=[10], bindings=[buf]))
    np.testing.assert_array_equal(read_u32(device, buf), np.arange(10, dtype=np.uint32))


def test_executable_lists_every_export(kernels):
    assert [export.name for export in kernels.exports] == EXPORT_NAMES
    for ordinal, (name, kernel) in enumerate(KERNELS.items()):
        assert kernels.export(name) == (ordinal, kernels.exports[ordinal])
        assert kernels.export(ordinal) == (ordinal, kernels.exports[ordinal])
        export = kernels.exports[ordinal]
        assert export.name == name
        assert export.bindings == kernel.bindings
        assert export.constants == kernel.constants
        assert tuple(export.workgroup_size) == (kernel.workgroup_size, 1, 1)


def test_one_command_buffer_many_dispatches(device, kernels):
    buf = allocate_with(device, np.zeros(64, np.uint32))

    def body(cb):
        for _ in range(50):
            cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[64], bindings=[buf])
            cb.execution_barrier()

    execute(device, body)
    np.testing.assert_array_equal(read_u32(device, buf), np.full(64, 50, np.uint32))


def test_bad_executable_or_entry_point_after_a_valid_dispatch_is_rejected(device, kernels, make_device):
    """A dispatch resolves its export once per (executable, entry point) in a row: whatever differs
    from the last one is checked again."""
    buf = sentinel_buffer(device, 4)
    other = make_device()
    other_kernels = load_kernels(other)
    cb = device.create_command_buffer()
    cb.begin()
    cb.dispatch(kernels, "cts_add_one", 1, [4], [buf])
    bad = [(other_kernels, "cts_add_one", "another device"), ("kernels", "cts_add_one", "hal.Executable"),
           (kernels, len(kernels.exports), "export"), (kernels, "no_such_export", "no_such_export"),
           (kernels, True, "export")]
    for executable, entry, words in bad:
        with pytest.raises(hal.InvalidArgumentError) as info:
            cb.dispatch(executable, entry, 1, [4], [buf])
        assert words in str(info.value)
        cb.dispatch(kernels, "cts_add_one", 1, [4], [buf])  # the last valid export, resolved again
    cb.end()
    submit_and_wait(device, [cb])
    np.testing.assert_array_equal(read_u32(device, buf), np.full(4, SENTINEL + 6, np.uint32))
