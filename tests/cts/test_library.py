"""Library routines (hal.Gemm): dispatched like kernels, checked against numpy.

Every driver that lists the ``library`` format runs these: the CPU drivers with numpy, CUDA with
cuBLASLt (in stream and graph command buffers), HIP with hipBLASLt. One-shot and reusable
command buffers, binding-table slots with rebinding, offsets, transposed and batched operands,
epilogues, and the checks that reject a dispatch before any device work.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hal

from .helpers import allocate_with, record, submit_and_wait

Mode = hal.CommandBufferMode
Slot = hal.Slot
#: Relative tolerance per dtype (16-bit inputs accumulate in float32; products of about 64 terms).
TOLERANCE = {"float32": 1e-5, "float64": 1e-12, "float16": 2e-2, "bfloat16": 5e-2}
#: cuBLASLt and hipBLASLt take 16-byte aligned operands best: offsets used below keep that.
OFFSET = 64


@pytest.fixture
def library(device):
    if not device.can_prepare("library"):
        pytest.skip(f"{device.info.uri} has no library routines (formats {list(device.executable_formats)})")
    return device


def to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        bits = values.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return values.astype(dtype)


def from_storage(raw: bytes, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, dtype).astype(np.float64)


def exact(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` as the device sees them (rounded to ``dtype``), in float64."""
    return from_storage(to_storage(values, dtype).tobytes(), dtype).astype(np.float64).reshape(values.shape)


def gemm_exe(device, dtype="float32", epilogue="none"):
    return device.load_executable(hal.library_spec({"gemm": hal.Gemm(dtype, epilogue=epilogue)}))


def check_close(actual, expected, dtype):
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(expected).max())


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_matches_numpy(library, dtype, transpose_a, transpose_b):
    rng = np.random.default_rng(1)
    m, n, k = 33, 20, 64
    a = rng.standard_normal((k, m) if transpose_a else (m, k))
    b = rng.standard_normal((n, k) if transpose_b else (k, n))
    A = allocate_with(library, to_storage(a, dtype))
    B = allocate_with(library, to_storage(b, dtype))
    C = library.allocator.allocate(m * n * hal.Gemm(dtype).element_size)
    exe = gemm_exe(library, dtype)
    constants = hal.Gemm.constants_for(m, n, k, transpose_a=transpose_a, transpose_b=transpose_b)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=constants, bindings=[C, A, B]))
    submit_and_wait(library, [cb])
    ea, eb = exact(a, dtype), exact(b, dtype)
    expected = (ea.T if transpose_a else ea) @ (eb.T if transpose_b else eb)
    check_close(from_storage(library.read(C), dtype).reshape(m, n), expected, dtype)


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (True, True)])
def test_complex_gemm_matches_numpy(library, dtype, transpose_a, transpose_b):
    """Complex products (no operand conjugated), batched with an offset; a library without complex
    GEMMs (hipBLASLt) refuses the routine when it is loaded, with the reason."""
    try:
        exe = gemm_exe(library, dtype)
    except hal.UnimplementedError as exc:
        assert dtype in str(exc)
        pytest.skip(f"{library.info.uri}: {exc}")
    rng = np.random.default_rng(7)
    batch, m, n, k = 3, 17, 9, 40
    def draw(shape):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    a = draw((batch, k, m) if transpose_a else (batch, m, k))
    b = draw((batch, n, k) if transpose_b else (batch, k, n))
    item = np.dtype(dtype).itemsize
    A = allocate_with(library, np.concatenate([np.zeros(OFFSET // item, dtype), a.ravel()]))
    B = allocate_with(library, b)
    C = library.allocator.allocate(batch * m * n * item)
    constants = hal.Gemm.constants_for(m, n, k, batch, transpose_a=transpose_a, transpose_b=transpose_b)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=constants,
                                                bindings=[C, (A, OFFSET, a.nbytes), B]))
    submit_and_wait(library, [cb])
    ea = a.transpose(0, 2, 1) if transpose_a else a
    eb = b.transpose(0, 2, 1) if transpose_b else b
    expected = ea.astype(np.complex128) @ eb
    tol = 1e-5 if dtype == "complex64" else 1e-12
    out = np.frombuffer(library.read(C), dtype).reshape(batch, m, n)
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * np.abs(expected).max())


def test_complex_gemms_take_no_epilogue():
    with pytest.raises(hal.InvalidArgumentError, match="epilogue"):
        hal.Gemm("complex64", epilogue="bias")
    assert hal.Gemm("complex128").element_size == 16


def test_batched_gemm_with_strides_offsets_and_a_shared_matrix(library):
    rng = np.random.default_rng(2)
    batch, m, n, k = 4, 16, 24, 8
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)  # one B for every batch entry: stride 0
    A = allocate_with(library, np.concatenate([np.zeros(OFFSET // 4, np.float32), a.ravel()]))
    B = allocate_with(library, b)
    ldc = n + 8  # a padded output: rows of ldc elements
    C = allocate_with(library, np.full(batch * m * ldc, 7, np.float32))
    exe = gemm_exe(library)
    constants = hal.Gemm.constants_for(m, n, k, batch, stride_b=0, ldc=ldc, stride_c=m * ldc)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=constants,
                                                bindings=[C, (A, OFFSET, a.nbytes), B]))
    submit_and_wait(library, [cb])
    out = np.frombuffer(library.read(C), np.float32).reshape(batch, m, ldc)
    check_close(out[..., :n], a @ b, "float32")
    assert (out[..., n:] == 7).all(), "the padding between rows was written"


@pytest.mark.parametrize("epilogue", ["bias", "relu", "bias_relu", "gelu", "bias_gelu"])
def test_gemm_epilogues(library, epilogue):
    rng = np.random.default_rng(3)
    m, n, k = 32, 48, 16
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    buffers = [library.allocator.allocate(m * n * 4), allocate_with(library, a), allocate_with(library, b)]
    if epilogue.startswith("bias"):
        buffers.append(allocate_with(library, bias))
    exe = gemm_exe(library, epilogue=epilogue)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k),
                                                bindings=buffers))
    submit_and_wait(library, [cb])
    expected = a.astype(np.float64) @ b
    if epilogue.startswith("bias"):
        expected += bias
    if epilogue.endswith("relu"):
        expected = np.maximum(expected, 0)
    elif epilogue.endswith("gelu"):
        expected = 0.5 * expected * (1 + np.tanh(np.sqrt(2 / np.pi) * (expected + 0.044715 * expected ** 3)))
    check_close(np.frombuffer(library.read(buffers[0]), np.float32).reshape(m, n), expected, "float32")


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_derivative(x):
    t = np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * x * x)


def relu_mask_bits(raw: bytes, m: int, n: int) -> np.ndarray:
    """The (m, n) mask of a ReLU aux binding: rows of n bits padded to 128, little-endian bits."""
    row = -(-n // 128) * 16
    bits = np.frombuffer(raw, np.uint8)[:m * row].reshape(m, row)
    return np.unpackbits(bits, axis=1, bitorder="little")


def dispatch_gemm(library, epilogue, m, n, k, buffers):
    exe = gemm_exe(library, epilogue=epilogue)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k),
                                                bindings=buffers))
    submit_and_wait(library, [cb])


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemm_forward_and_backward_epilogues(library, activation, with_bias):
    """A layer's forward product with its aux output, then the backward product multiplied by the
    activation's derivative read from that aux, with the bias gradient: against numpy."""
    rng = np.random.default_rng(5)
    m, n, k = 40, 136, 24  # n past a 128-bit mask row: two 16-byte chunks a row
    a = rng.standard_normal((m, k)).astype(np.float32)
    a[3] = 0  # with no bias a whole row of exact zeros: ReLU's kink, whose derivative is 1 (pre >= 0)
    b = rng.standard_normal((k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    pre = a.astype(np.float64) @ b + (bias if with_bias else 0)
    aux_bytes = hal.Gemm.relu_mask_bytes(m, n) if activation == "relu" else m * n * 4
    assert aux_bytes == (m * 32 if activation == "relu" else m * n * 4)
    C, AUX = library.allocator.allocate(m * n * 4), allocate_with(library, np.full(aux_bytes, 0xA5, np.uint8))
    forward = [C, allocate_with(library, a), allocate_with(library, b)]
    if with_bias:
        forward.append(allocate_with(library, bias))
    epilogue = ("bias_" if with_bias else "") + activation + "_aux"
    assert hal.Gemm(epilogue=epilogue).bindings == len(forward) + 1
    dispatch_gemm(library, epilogue, m, n, k, forward + [AUX])
    expected = np.maximum(pre, 0) if activation == "relu" else gelu(pre)
    check_close(np.frombuffer(library.read(C), np.float32).reshape(m, n), expected, "float32")
    if activation == "relu":
        bits = relu_mask_bits(library.read(AUX), m, n)
        assert (bits[:, :n] == (pre >= 0)).all(), "the mask is pre >= 0 (a row's padding bits are unspecified)"
    else:
        check_close(np.frombuffer(library.read(AUX), np.float32).reshape(m, n), pre, "float32")

    g_left = rng.standard_normal((m, 16)).astype(np.float32)
    g_right = rng.standard_normal((16, n)).astype(np.float32)
    g = g_left.astype(np.float64) @ g_right
    if activation == "relu":
        grad = np.where(relu_mask_bits(library.read(AUX), m, n)[:, :n].astype(bool), g, 0)
    else:
        grad = g * gelu_derivative(np.frombuffer(library.read(AUX), np.float32).reshape(m, n).astype(np.float64))
    for bgrad in (False, True):
        D = library.allocator.allocate(m * n * 4)
        backward = [D, allocate_with(library, g_left), allocate_with(library, g_right)]
        BG = allocate_with(library, np.full(n, 7, np.float32))
        dispatch_gemm(library, "d" + activation + ("_bgrad" if bgrad else ""), m, n, 16,
                      backward + ([BG] if bgrad else []) + [AUX])
        # GELU's derivative: libraries evaluate its tanh their own way (about 1e-5 of the largest value)
        tolerance = 1e-5 if activation == "relu" else 1e-4
        for got, expected in ((np.frombuffer(library.read(D), np.float32).reshape(m, n), grad),
                              (np.frombuffer(library.read(BG), np.float32), grad.sum(axis=0))):
            np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max())
            if not bgrad:
                break


def test_gemm_bias_gradient_of_b(library):
    """``bgrad_b``: dW = x^T @ dy with db = dy summed over the batch, one dispatch (x stored as is,
    read transposed)."""
    rng = np.random.default_rng(6)
    batch, n_in, n_out = 64, 24, 40
    x = rng.standard_normal((batch, n_in)).astype(np.float32)
    dy = rng.standard_normal((batch, n_out)).astype(np.float32)
    W, DB = library.allocator.allocate(n_in * n_out * 4), allocate_with(library, np.zeros(n_out, np.float32))
    exe = gemm_exe(library, epilogue="bgrad_b")
    constants = hal.Gemm.constants_for(n_in, n_out, batch, transpose_a=True)
    X, DY = allocate_with(library, x), allocate_with(library, dy)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=constants, bindings=[W, X, DY, DB]))
    submit_and_wait(library, [cb])
    check_close(np.frombuffer(library.read(W), np.float32).reshape(n_in, n_out), x.T.astype(np.float64) @ dy,
                "float32")
    check_close(np.frombuffer(library.read(DB), np.float32), dy.astype(np.float64).sum(axis=0), "float32")


@pytest.mark.parametrize("epilogue", ["relu_aux", "bias_gelu_aux", "drelu_bgrad", "dgelu", "bgrad_b"])
def test_gemm_aux_and_gradient_epilogues_are_checked(library, epilogue):
    gemm = hal.Gemm(epilogue=epilogue)
    m, n, k = 8, 130, 4
    exe = gemm_exe(library, epilogue=epilogue)
    full = [m * n * 4, m * k * 4, k * n * 4]
    if gemm.has_bias or gemm.bias_gradient:
        full.append(n * 4)
    if gemm.aux:
        full.append(hal.Gemm.relu_mask_bytes(m, n) if gemm.aux == "relu_mask" else m * n * 4)
    assert len(full) == gemm.bindings
    buffers = [library.allocator.allocate(size) for size in full]
    short = [*buffers[:-1], (buffers[-1], 0, full[-1] - 1)]
    cb = library.create_command_buffer()
    with pytest.raises(hal.InvalidArgumentError, match="too short"), cb.record():
        cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k), bindings=short)
    cb = library.create_command_buffer()
    with pytest.raises(hal.InvalidArgumentError, match="not a batch"), cb.record():
        cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k, 2), bindings=buffers)
    # the device still runs a correct dispatch of the same executable
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k),
                                                bindings=buffers))
    submit_and_wait(library, [cb])


def test_reusable_gemm_rebinds_every_operand(library):
    rng = np.random.default_rng(4)
    m, n, k = 24, 40, 32
    exe = gemm_exe(library)
    constants = hal.Gemm.constants_for(m, n, k)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=constants,
                                                bindings=[Slot(0), Slot(1), Slot(2, OFFSET)]),
                mode=Mode.REUSABLE, binding_capacity=3)
    outputs = [library.allocator.allocate(m * n * 4) for _ in range(2)]
    for step in range(5):  # tables alternate, then come back: in-place updates and repeats
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        A = allocate_with(library, a)
        B = allocate_with(library, np.concatenate([np.zeros(OFFSET // 4, np.float32), b.ravel()]))
        C = outputs[step % 2]
        submit_and_wait(library, [cb], binding_tables=[[C, A, B]])
        check_close(np.frombuffer(library.read(C), np.float32).reshape(m, n), a @ b, "float32")


def test_a_gemm_between_kernels_in_one_command_buffer(library, kernels):
    """The product reads what a fill wrote before a barrier, and a copy after the next reads it."""
    m = n = k = 16
    A = library.allocator.allocate(m * k * 4)
    B = allocate_with(library, np.eye(k, dtype=np.float32) * 2)
    C = library.allocator.allocate(m * n * 4)
    D = library.allocator.allocate(m * n * 4)
    exe = gemm_exe(library)

    def body(cb):
        cb.fill_buffer(A, pattern=0x3F800000, pattern_length=4)  # 1.0
        cb.execution_barrier()
        cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k), bindings=[C, A, B])
        cb.execution_barrier()
        cb.copy_buffer(C, D)

    for mode in (Mode.ONE_SHOT, Mode.REUSABLE):
        submit_and_wait(library, [record(library, body, mode=mode)])
        np.testing.assert_array_equal(np.frombuffer(library.read(D), np.float32), np.full(m * n, 2, np.float32))


def test_independent_gemms_of_one_level_do_not_share_a_workspace(library):
    rng = np.random.default_rng(5)
    m, n, k = 64, 64, 256
    exe = gemm_exe(library)
    pairs = [(rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32))
             for _ in range(4)]
    operands = [(library.allocator.allocate(m * n * 4), allocate_with(library, a), allocate_with(library, b))
                for a, b in pairs]

    def body(cb):  # no barrier: the products may run concurrently
        for c, a, b in operands:
            cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k), bindings=[c, a, b])

    submit_and_wait(library, [record(library, body, mode=Mode.REUSABLE)])
    for (c, _, _), (a, b) in zip(operands, pairs):
        check_close(np.frombuffer(library.read(c), np.float32).reshape(m, n), a @ b, "float32")


def test_gemms_recorded_and_submitted_from_threads(library):
    rng = np.random.default_rng(6)
    m, n, k = 32, 32, 32
    exe = gemm_exe(library)
    errors = []

    def worker(seed):
        try:
            a = rng.standard_normal((m, k)).astype(np.float32) + seed
            b = np.eye(k, n, dtype=np.float32)
            C = library.allocator.allocate(m * n * 4)
            A, B = allocate_with(library, a), allocate_with(library, b)
            for _ in range(5):
                cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k),
                                                            bindings=[C, A, B]))
                submit_and_wait(library, [cb])
                check_close(np.frombuffer(library.read(C), np.float32).reshape(m, n), a, "float32")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_zero_size_gemm_writes_nothing(library):
    C = allocate_with(library, np.full(4, 3, np.float32))
    A = library.allocator.allocate(64)
    B = library.allocator.allocate(64)
    exe = gemm_exe(library)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(0, 4, 4),
                                                bindings=[C, A, B]))
    submit_and_wait(library, [cb])
    np.testing.assert_array_equal(np.frombuffer(library.read(C), np.float32), np.full(4, 3, np.float32))


# -- rejected before any device work ---------------------------------------------------------------

def test_bad_routines_and_specs_are_rejected(library):
    with pytest.raises(hal.InvalidArgumentError, match="dtype"):
        hal.Gemm("int32")
    with pytest.raises(hal.InvalidArgumentError, match="epilogue"):
        hal.Gemm("float32", epilogue="softmax")
    with pytest.raises(hal.InvalidArgumentError, match="tf32"):
        hal.Gemm("float16", precision="tf32")
    with pytest.raises(hal.InvalidArgumentError, match="routine"):
        hal.library_spec({"gemm": "not a routine"})
    wrong = hal.ExecutableSpec("library", {"gemm": hal.Gemm()}, [hal.Export("gemm", bindings=2, constants=11)])
    with pytest.raises(hal.InvalidArgumentError, match="declares 2 bindings"):
        library.load_executable(wrong)
    missing = hal.ExecutableSpec("library", {}, [hal.Export("gemm", bindings=3, constants=11)])
    with pytest.raises(hal.InvalidArgumentError, match="no routine"):
        library.load_executable(missing)


@pytest.mark.parametrize("constants,match", [
    (hal.Gemm.constants_for(8, 8, 8, lda=4), "lda"),
    (hal.Gemm.constants_for(8, 8, 9), "A range"),
    (hal.Gemm.constants_for(8, 8, 0), "k must be"),
    (hal.Gemm.constants_for(8, 8, 2, 2, stride_c=8), "overlap"),
    ([8, 8, 8, 1, 4, 8, 8, 8, 64, 64, 64], "flags"),
    (hal.Gemm.constants_for(8, 9, 8), "range"),
])
def test_bad_dispatches_are_rejected_while_recording(library, constants, match):
    exe = gemm_exe(library)
    bufs = [library.allocator.allocate(8 * 8 * 4) for _ in range(3)]
    cb = library.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError, match=match):
        cb.dispatch(exe, "gemm", constants=constants, bindings=bufs)
    with pytest.raises(hal.InvalidArgumentError, match="constants"):
        cb.dispatch(exe, "gemm", constants=[8, 8, 8], bindings=bufs)
    with pytest.raises(hal.InvalidArgumentError, match="bindings"):
        cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(8, 8, 8), bindings=bufs[:2])
    cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(8, 8, 8), bindings=bufs)  # still usable
    cb.end()
    submit_and_wait(library, [cb])


def test_a_short_table_entry_is_rejected_at_submission(library):
    m = n = k = 8
    exe = gemm_exe(library)
    cb = record(library, lambda cb: cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(m, n, k),
                                                bindings=[Slot(0), Slot(1), Slot(2)]),
                mode=Mode.REUSABLE, binding_capacity=3)
    C, A = library.allocator.allocate(m * n * 4), allocate_with(library, np.ones((m, k), np.float32))
    short = library.allocator.allocate(k * n * 4 - 4)
    sem = library.create_semaphore(0)
    with pytest.raises(hal.InvalidArgumentError, match="B range"):
        library.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[C, A, short]])
    assert sem.value == 0
    B = allocate_with(library, np.eye(k, dtype=np.float32))
    submit_and_wait(library, [cb], binding_tables=[[C, A, B]])
    np.testing.assert_array_equal(np.frombuffer(library.read(C), np.float32), np.ones(m * n, np.float32))


def test_a_library_executable_of_another_device_is_rejected(library, make_device):
    other = make_device()
    exe = gemm_exe(other)
    bufs = [library.allocator.allocate(256) for _ in range(3)]
    cb = library.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError, match="another device"):
        cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(2, 2, 2), bindings=bufs)
