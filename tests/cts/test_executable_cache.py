"""Loading executables: format choice, caching, and errors."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import allocate_with, execute, read_u32
from .kernels import _ALL_SPECS, EXPORT_NAMES, KERNELS, load_kernels, specs

CTS_FORMATS = ["numpy", "cuda-c", "hip-c"]


def bogus_spec(format_name: str = "cts-bogus-format") -> hal.ExecutableSpec:
    return hal.ExecutableSpec(format_name, "nothing", [hal.Export("noop")])


def test_device_prepares_one_of_the_cts_formats(device):
    assert any(device.can_prepare(f) for f in CTS_FORMATS)
    assert not device.can_prepare("cts-bogus-format")


def test_loaded_executable_has_the_first_preparable_format(device):
    exe = load_kernels(device)
    assert exe.format == next(s.format for s in _ALL_SPECS if device.can_prepare(s.format))
    assert [e.name for e in exe.exports] == EXPORT_NAMES


def test_unpreparable_specs_before_are_skipped(device):
    exe = device.load_executable([bogus_spec(), bogus_spec("another-bogus"), *specs(["cts_iota"])])
    assert device.can_prepare(exe.format)
    assert [e.name for e in exe.exports] == ["cts_iota"]
    buf = allocate_with(device, np.zeros(5, np.uint32))
    execute(device, lambda cb: cb.dispatch(exe, "cts_iota", workgroups=1, constants=[5], bindings=[buf]))
    np.testing.assert_array_equal(read_u32(device, buf), np.arange(5, dtype=np.uint32))


def test_same_spec_twice_is_cached(device):
    assert load_kernels(device) is load_kernels(device)


def test_equal_source_specs_share_an_executable(device):
    # Two spec objects built separately from the same text (GPU formats) or the same callables (numpy).
    first = device.load_executable(specs(["cts_add_one", "cts_iota"]))
    second = device.load_executable(specs(["cts_add_one", "cts_iota"]))
    assert first is second


def test_different_specs_are_different_executables(device):
    assert device.load_executable(specs(["cts_iota"])) is not device.load_executable(specs(["cts_add_one"]))


def test_spec_in_a_list_or_alone(device):
    chosen = next(s for s in specs(["cts_add_one"]) if device.can_prepare(s.format))
    assert device.load_executable(chosen) is device.load_executable([chosen])


@pytest.mark.parametrize("formats", [["cts-bogus-format"], ["cts-bogus-format", "another-bogus", "yet-another"]])
def test_no_preparable_format_is_incompatible(device, formats):
    with pytest.raises(hal.IncompatibleError) as info:
        device.load_executable([bogus_spec(f) for f in formats])
    for f in formats:
        assert f in str(info.value)


def test_executables_of_separate_kernels_run_side_by_side(device):
    iota = device.load_executable(specs(["cts_iota"]))
    add = device.load_executable(specs(["cts_add_one"]))
    buf = allocate_with(device, np.zeros(10, np.uint32))

    def body(cb):
        cb.dispatch(iota, "cts_iota", workgroups=1, constants=[10], bindings=[buf])
        cb.execution_barrier()
        cb.dispatch(add, 0, workgroups=1, constants=[10], bindings=[buf])

    execute(device, body)
    np.testing.assert_array_equal(read_u32(device, buf), np.arange(1, 11, dtype=np.uint32))


_NOT_C = 'extern "C" __global__ void cts_iota(unsigned int* out, unsigned int n) { this is not C }'
_WRONG_NAME = 'extern "C" __global__ void some_other_name(unsigned int* out, unsigned int n) {}'
BAD_CODE = {
    "numpy": [42, "def cts_iota(): pass", {"cts_iota": "not callable"}],
    "cuda-c": [_NOT_C, _WRONG_NAME, b"\xff\xfe"],
    "hip-c": [_NOT_C, _WRONG_NAME, b"\xff\xfe"],
}


@pytest.mark.parametrize("variant", [0, 1, 2], ids=["garbage", "wrong-kind-or-name", "wrong-type"])
def test_bad_code_is_a_typed_error(device, variant):
    format_name = next(f for f in CTS_FORMATS if device.can_prepare(f))
    spec = hal.ExecutableSpec(format_name, BAD_CODE[format_name][variant], [KERNELS["cts_iota"].export()])
    with pytest.raises(hal.HalError):
        device.load_executable(spec)
    assert load_kernels(device).format == format_name


def numpy_only(device):
    if not device.can_prepare("numpy"):
        pytest.skip("the numpy executable format is prepared by CPU drivers only")


def test_numpy_single_callable_code(device):
    numpy_only(device)
    kernel = KERNELS["cts_iota"]
    exe = device.load_executable(hal.ExecutableSpec("numpy", kernel.numpy_fn, [kernel.export()]))
    buf = allocate_with(device, np.zeros(3, np.uint32))
    execute(device, lambda cb: cb.dispatch(exe, "cts_iota", workgroups=1, constants=[3], bindings=[buf]))
    np.testing.assert_array_equal(read_u32(device, buf), np.arange(3, dtype=np.uint32))


def test_numpy_mapping_missing_an_export_is_invalid_argument(device):
    numpy_only(device)
    exports = [KERNELS["cts_iota"].export(), KERNELS["cts_add_one"].export()]
    spec = hal.ExecutableSpec("numpy", {"cts_iota": KERNELS["cts_iota"].numpy_fn}, exports)
    with pytest.raises(hal.InvalidArgumentError):
        device.load_executable(spec)


def test_numpy_single_callable_with_several_exports_is_invalid_argument(device):
    numpy_only(device)
    exports = [KERNELS["cts_iota"].export(), KERNELS["cts_add_one"].export()]
    with pytest.raises(hal.InvalidArgumentError):
        device.load_executable(hal.ExecutableSpec("numpy", KERNELS["cts_iota"].numpy_fn, exports))


def test_executable_from_another_device_is_invalid_argument(device, make_device):
    other = make_device()
    foreign = load_kernels(other)
    buf = device.allocator.allocate(16)
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError):
        cb.dispatch(foreign, "cts_iota", workgroups=1, constants=[4], bindings=[buf])
    buf.release()


def test_the_executable_cache_is_bounded_and_evicted_executables_still_run(device, monkeypatch):
    """Distinct executables beyond the cache's bound push out the least recently used; one evicted
    while a command buffer holds it still runs, and loading its spec again works."""
    import hal.device

    if "numpy" not in device.executable_formats:
        pytest.skip("the bound is checked with numpy executables (format of the CPU drivers)")
    monkeypatch.setattr(hal.device, "EXECUTABLE_CACHE_ENTRIES", 4)

    def spec_adding(amount):
        def add(workgroups, bindings, constants):
            words = np.frombuffer(bindings[0], np.uint32)
            words += np.uint32(amount)
        return hal.ExecutableSpec("numpy", add, [hal.Export("add", bindings=1)])

    buf = device.allocator.allocate(16)
    device.write(buf, bytes(16))
    specs = [spec_adding(i + 1) for i in range(10)]
    first = device.load_executable(specs[0])
    cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.dispatch(first, "add", 1, [], [buf])
    for spec in specs[1:]:
        device.load_executable(spec)
    sem = device.create_semaphore(0)
    device.queue_execute([cb], signal=[(sem, 1)])
    sem.wait(1, timeout=30)
    assert np.frombuffer(device.read(buf), np.uint32).tolist() == [1, 1, 1, 1]
    assert device.load_executable(specs[-1]) is device.load_executable(specs[-1])  # recent ones stay cached
    again = device.load_executable(specs[0])  # evicted: loaded again, and it works
    assert again is not first
    cb2 = device.create_command_buffer()
    with cb2.record():
        cb2.dispatch(again, "add", 1, [], [buf])
    device.queue_execute([cb2], signal=[(sem, 2)])
    sem.wait(2, timeout=30)
    assert np.frombuffer(device.read(buf), np.uint32).tolist() == [2, 2, 2, 2]
    buf.release()
