"""The FFT library routine (hal.Fft): dispatched like a kernel, checked against numpy.fft.

Every driver that lists the ``library`` format runs these: the CPU drivers with numpy's pocketfft,
CUDA with cuFFT (in stream and graph command buffers), HIP with hipFFT. Every transform kind and
precision, ranks 1-3, batches in packed and interleaved layouts, one-shot and reusable command
buffers, binding-table slots with rebinding and offsets, an input left as it was (C2R), and the
checks that reject a dispatch before any device work.
"""

from __future__ import annotations

import numpy as np
import pytest

import hal
from hal.library_fft import side_lengths

from .helpers import allocate_with, record, submit_and_wait
from .helpers import random_array as draw

Mode = hal.CommandBufferMode
Slot = hal.Slot
#: Relative tolerance by the transform's precision.
TOLERANCE = {"complex64": 1e-4, "complex128": 1e-10}
OFFSET = 256


@pytest.fixture
def library(device):
    if not device.can_prepare("library"):
        pytest.skip(f"{device.info.uri} has no library routines (formats {list(device.executable_formats)})")
    return device


def fft_exe(device, transform="c2c", direction="forward", dtype="complex64"):
    routine = hal.Fft(transform, direction, dtype)
    try:
        return device.load_executable(hal.library_spec({"fft": routine})), routine
    except hal.UnimplementedError as exc:  # a GPU without its FFT library: refused with the reason
        assert "fft" in str(exc).lower()
        pytest.skip(f"{device.info.uri}: {exc}")


def expected(transform, direction, x, lengths):
    axes = tuple(range(1, len(lengths) + 1))
    if transform == "r2c":
        return np.fft.rfftn(x, axes=axes)
    if transform == "c2r":
        return np.fft.irfftn(x, s=lengths, axes=axes, norm="forward")
    return np.fft.fftn(x, axes=axes) if direction == "forward" else np.fft.ifftn(x, axes=axes, norm="forward")


def check_close(actual, wanted, dtype):
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(actual, wanted, rtol=tol, atol=tol * max(1.0, np.abs(wanted).max()))


KINDS = [("c2c", "forward"), ("c2c", "inverse"), ("r2c", "forward"), ("c2r", "inverse")]


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("transform,direction", KINDS)
@pytest.mark.parametrize("lengths,batch", [((16,), 3), ((15,), 1), ((6, 10), 2), ((4, 6, 5), 2), ((1,), 4)])
def test_transforms_match_numpy(library, transform, direction, dtype, lengths, batch):
    exe, routine = fft_exe(library, transform, direction, dtype)
    in_len, out_len = side_lengths(transform, lengths, "in"), side_lengths(transform, lengths, "out")
    x = draw((batch, *in_len), routine.input_dtype)
    if transform == "c2r":  # a Hermitian-consistent spectrum: what every library inverts alike
        x = np.fft.rfftn(draw((batch, *lengths), routine.output_dtype), axes=tuple(range(1, len(lengths) + 1)))
        x = x.astype(routine.input_dtype)
    X = allocate_with(library, x)
    Y = library.allocator.allocate(batch * int(np.prod(out_len)) * np.dtype(routine.output_dtype).itemsize)
    constants = hal.Fft.constants_for(lengths, batch, transform=transform)
    submit_and_wait(library, [record(library, lambda cb: cb.dispatch(exe, "fft", constants=constants,
                                                                      bindings=[Y, X]))])
    out = np.frombuffer(library.read(Y), routine.output_dtype).reshape(batch, *out_len)
    check_close(out, expected(transform, direction, x, lengths), dtype)
    np.testing.assert_array_equal(np.frombuffer(library.read(X), x.dtype).reshape(x.shape), x)  # input intact


@pytest.mark.parametrize("transform,direction", KINDS)
def test_interleaved_transforms_along_strided_elements(library, transform, direction):
    """stride = batch, dist = 1: transform b reads elements b, b + batch, ... (the last axis is the batch)."""
    exe, routine = fft_exe(library, transform, direction, "complex128")
    lengths, batch = (6, 5), 7
    in_len, out_len = side_lengths(transform, lengths, "in"), side_lengths(transform, lengths, "out")
    x = draw((batch, *in_len), routine.input_dtype, seed=2)
    if transform == "c2r":
        x = np.fft.rfftn(draw((batch, *lengths), "float64", seed=2), axes=(1, 2))
    X = allocate_with(library, np.ascontiguousarray(np.moveaxis(x, 0, -1)))
    Y = library.allocator.allocate(batch * int(np.prod(out_len)) * np.dtype(routine.output_dtype).itemsize)
    constants = hal.Fft.constants_for(lengths, batch, transform=transform, istride=batch, idist=1, ostride=batch,
                                      odist=1)
    submit_and_wait(library, [record(library, lambda cb: cb.dispatch(exe, "fft", constants=constants,
                                                                      bindings=[Y, X]))])
    out = np.moveaxis(np.frombuffer(library.read(Y), routine.output_dtype).reshape(*out_len, batch), -1, 0)
    check_close(out, expected(transform, direction, x, lengths), "complex128")


def test_embedded_rows_skip_their_padding(library):
    """inembed/onembed wider than the transform: each row of 6 is read from (and written to) rows of 8."""
    exe, routine = fft_exe(library, "c2c", "forward", "complex128")
    x = draw((2, 4, 8), "complex128", seed=3)
    X = allocate_with(library, x)
    Y = allocate_with(library, np.zeros((2, 4, 8), np.complex128))
    constants = hal.Fft.constants_for((4, 6), 2, inembed=(4, 8), onembed=(4, 8))
    submit_and_wait(library, [record(library, lambda cb: cb.dispatch(exe, "fft", constants=constants,
                                                                      bindings=[Y, X]))])
    out = np.frombuffer(library.read(Y), np.complex128).reshape(2, 4, 8)
    check_close(out[..., :6], np.fft.fftn(x[..., :6], axes=(1, 2)), "complex128")
    np.testing.assert_array_equal(out[..., 6:], 0)  # the padding is not written


@pytest.mark.parametrize("transform,direction", KINDS)
def test_reusable_transform_rebinds_its_operands(library, transform, direction):
    exe, routine = fft_exe(library, transform, direction, "complex64")
    lengths, batch = (8, 12), 3
    in_len, out_len = side_lengths(transform, lengths, "in"), side_lengths(transform, lengths, "out")
    constants = hal.Fft.constants_for(lengths, batch, transform=transform)
    cb = record(library, lambda cb: cb.dispatch(exe, "fft", constants=constants,
                                                bindings=[Slot(0), Slot(1, OFFSET)]),
                mode=Mode.REUSABLE, binding_capacity=2)
    out_bytes = batch * int(np.prod(out_len)) * np.dtype(routine.output_dtype).itemsize
    outputs = [library.allocator.allocate(out_bytes) for _ in range(2)]
    for step in range(4):  # tables alternate, then come back
        x = draw((batch, *in_len), routine.input_dtype, seed=step)
        if transform == "c2r":
            x = np.fft.rfftn(draw((batch, *lengths), "float32", seed=step), axes=(1, 2)).astype(np.complex64)
        X = allocate_with(library, np.concatenate([np.zeros(OFFSET, np.uint8), x.view(np.uint8).ravel()]))
        Y = outputs[step % 2]
        submit_and_wait(library, [cb], binding_tables=[[Y, X]])
        out = np.frombuffer(library.read(Y), routine.output_dtype).reshape(batch, *out_len)
        check_close(out, expected(transform, direction, x, lengths), "complex64")


def test_one_shot_and_reusable_buffers_with_a_transform_between_copies(library):
    """The transform reads what a copy wrote before a barrier, and a copy after the next reads it."""
    exe, _ = fft_exe(library)
    x = draw((4, 32), "complex64", seed=5)
    source = allocate_with(library, x)
    X, Y, Z = (library.allocator.allocate(x.nbytes) for _ in range(3))

    def body(cb):
        cb.copy_buffer(source, X)
        cb.execution_barrier()
        cb.dispatch(exe, "fft", constants=hal.Fft.constants_for((32,), 4), bindings=[Y, X])
        cb.execution_barrier()
        cb.copy_buffer(Y, Z)

    for mode in (Mode.ONE_SHOT, Mode.REUSABLE):
        submit_and_wait(library, [record(library, body, mode=mode)])
        check_close(np.frombuffer(library.read(Z), np.complex64).reshape(4, 32), np.fft.fft(x), "complex64")


def test_an_empty_batch_writes_nothing(library):
    exe, _ = fft_exe(library)
    Y = allocate_with(library, np.full(8, 7, np.complex64))
    X = allocate_with(library, np.zeros(8, np.complex64))
    submit_and_wait(library, [record(library, lambda cb: cb.dispatch(
        exe, "fft", constants=hal.Fft.constants_for((8,), 0), bindings=[Y, X]))])
    np.testing.assert_array_equal(np.frombuffer(library.read(Y), np.complex64), 7)


@pytest.mark.parametrize("constants,match", [
    ([0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], "rank"),
    ([4, 2, 2, 2, 1, 1, 8, 1, 8, 2, 2, 2, 2], "rank"),
    ([1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], "lengths"),
    ([1, 8, 2, 1, 1, 1, 8, 1, 8, 1, 1, 1, 1], "lengths"),
    ([1, 8, 1, 1, 1, 0, 8, 1, 8, 1, 1, 1, 1], "strides"),
    ([2, 4, 8, 1, 1, 1, 32, 1, 32, 4, 1, 8, 1], "embed"),
    ([1, 8, 1, 1, 4, 1, 8, 1, 4, 1, 1, 1, 1], "overlap"),
])
def test_invalid_constants_are_rejected_when_recorded(library, constants, match):
    exe, _ = fft_exe(library)
    buf = library.allocator.allocate(1 << 12)
    cb = library.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError, match=match):
        cb.dispatch(exe, "fft", constants=constants, bindings=[buf, buf])


def test_short_ranges_are_rejected_directly_and_at_submission(library):
    exe, _ = fft_exe(library, "r2c", "forward", "complex64")
    constants = hal.Fft.constants_for((16,), 4, transform="r2c")  # input 4 x 16 float32, output 4 x 9 complex64
    small, big = library.allocator.allocate(4 * 16 * 4 - 4), library.allocator.allocate(4 * 9 * 8)
    cb = library.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError, match="input range"):
        cb.dispatch(exe, "fft", constants=constants, bindings=[big, small])
    cb = record(library, lambda cb: cb.dispatch(exe, "fft", constants=constants, bindings=[Slot(0), Slot(1)]),
                mode=Mode.REUSABLE, binding_capacity=2)
    with pytest.raises(hal.InvalidArgumentError, match="too short"):
        library.queue_execute([cb], signal=[(library.create_semaphore(0), 1)], binding_tables=[[big, small]])


def test_routines_check_their_parameters():
    with pytest.raises(hal.InvalidArgumentError, match="transform"):
        hal.Fft("r2r")
    with pytest.raises(hal.InvalidArgumentError, match="dtype"):
        hal.Fft("c2c", "forward", "float32")
    with pytest.raises(hal.InvalidArgumentError, match="forward"):
        hal.Fft("r2c", "inverse")
    with pytest.raises(hal.InvalidArgumentError, match="inverse"):
        hal.Fft("c2r", "forward")
    routine = hal.Fft("c2r", "inverse", "complex128")
    assert (routine.input_dtype, routine.output_dtype, routine.bindings, routine.constants) == (
        "complex128", "float64", 2, 13)
    assert hal.Fft.constants_for((6, 10), 3, transform="c2r") == [2, 6, 10, 1, 3, 1, 36, 1, 60, 6, 1, 10, 1]
