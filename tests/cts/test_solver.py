"""Solver routines (hal.solver: Cholesky, LU, LUSolve, Eigh, Svd, Qr) checked against numpy.

Every driver that lists the ``library`` format and runs them: the CPU drivers with numpy's LAPACK,
CUDA with cuSOLVER, HIP with hipSOLVER. Matrices are column-major; each routine is checked in
one-shot and reusable command buffers, through binding-table slots with rebinding, batched, with
the info word of failing entries, and the checks that reject a dispatch before any device work.
"""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import allocate_with, record, submit_and_wait
from .helpers import random_array as rand

Mode = hal.CommandBufferMode
Slot = hal.Slot
DTYPES = ["float32", "float64", "complex64", "complex128"]
TOL = {"float32": 1e-4, "float64": 1e-10, "complex64": 1e-4, "complex128": 1e-10}


@pytest.fixture
def solver(device):
    if not device.can_prepare("library"):
        pytest.skip(f"{device.info.uri} has no library routines")
    try:
        device.load_executable(hal.library_spec({"potrf": hal.Cholesky("float32")}))
    except hal.UnimplementedError as exc:
        pytest.skip(f"{device.info.uri} runs no solver routines: {exc}")
    return device


def colmajor(a: np.ndarray) -> np.ndarray:
    """A stack of matrices as packed column-major bytes."""
    return np.ascontiguousarray(np.swapaxes(a, -1, -2))


def read_matrices(device, buf, dtype, batch, rows, cols) -> np.ndarray:
    raw = np.frombuffer(device.read(buf), dtype)[:batch * rows * cols]
    return raw.reshape(batch, cols, rows).transpose(0, 2, 1)


def read_vector(device, buf, dtype, count) -> np.ndarray:
    return np.frombuffer(device.read(buf), dtype)[:count]


def out(device, nbytes):
    return device.allocator.allocate(max(nbytes, 4))


def close(actual, expected, dtype, scale=10.0):
    tol = TOL[dtype] * scale
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * max(1.0, float(np.abs(expected).max())))


def run_one(device, routine, constants, bindings):
    exe = device.load_executable(hal.library_spec({"r": routine}))
    cb = record(device, lambda cb: cb.dispatch(exe, "r", constants=constants, bindings=bindings))
    submit_and_wait(device, [cb])


def hpd(batch, n, dtype, seed=0):
    a = rand((batch, n, n), dtype, seed)
    return (a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cholesky_and_its_info(solver, dtype):
    batch, n = 3, 5
    a = hpd(batch, n, dtype)
    a[1, 0, 0] = -1  # not positive definite: the leading minor of order 1
    L, info = out(solver, a.nbytes), out(solver, 4 * batch)
    run_one(solver, hal.Cholesky(dtype), [batch, n], [L, allocate_with(solver, colmajor(a)), info])
    result = np.tril(read_matrices(solver, L, dtype, batch, n, n))
    np.testing.assert_array_equal(read_vector(solver, info, np.int32, batch), [0, 1, 0])
    for i in (0, 2):
        close(result[i], np.linalg.cholesky(a[i]), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("transpose", [False, True])
def test_lu_and_lu_solve(solver, dtype, transpose):
    batch, n, nrhs = 4, 6, 3
    a = rand((batch, n, n), dtype)
    a[3, :, 2] = 0  # singular: a zero pivot
    b = rand((batch, n, nrhs), dtype, 1)
    LU, pivots, info = out(solver, a.nbytes), out(solver, 4 * batch * n), out(solver, 4 * batch)
    run_one(solver, hal.LU(dtype), [batch, n], [LU, allocate_with(solver, colmajor(a)), pivots, info])
    lu = read_matrices(solver, LU, dtype, batch, n, n)
    piv = read_vector(solver, pivots, np.int32, batch * n).reshape(batch, n)
    codes = read_vector(solver, info, np.int32, batch)
    assert list(codes[:3]) == [0, 0, 0] and codes[3] > 0
    for i in range(3):
        lower = np.tril(lu[i], -1) + np.eye(n)
        upper = np.triu(lu[i])
        rows = np.arange(n)
        for k in range(n):  # P A = L U, rows swapped in order
            p = piv[i, k] - 1
            rows[[k, p]] = rows[[p, k]]
        close(a[i][rows], lower @ upper, dtype)
        assert abs(np.prod(np.diag(upper)) * (-1) ** np.sum(piv[i] != np.arange(1, n + 1))
                   - np.linalg.det(a[i])) <= TOL[dtype] * 100 * max(1, abs(np.linalg.det(a[i])))
    X = out(solver, b.nbytes)
    run_one(solver, hal.LUSolve(dtype, transpose=transpose), [batch, n, nrhs],
            [X, LU, pivots, allocate_with(solver, colmajor(b))])
    x = read_matrices(solver, X, dtype, batch, n, nrhs)
    for i in range(3):
        close(x[i], np.linalg.solve(a[i].T if transpose else a[i], b[i]), dtype, 100)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vectors", [True, False])
def test_eigh(solver, dtype, vectors):
    batch, n = 3, 7
    a = hpd(batch, n, dtype)
    V, W, info = out(solver, a.nbytes), out(solver, batch * n * np.dtype(dtype).itemsize), out(solver, 4 * batch)
    real = hal.Eigh(dtype).real_dtype
    run_one(solver, hal.Eigh(dtype, vectors=vectors), [batch, n], [V, W, allocate_with(solver, colmajor(a)), info])
    w = read_vector(solver, W, real, batch * n).reshape(batch, n)
    close(w, np.linalg.eigvalsh(a), dtype)
    np.testing.assert_array_equal(read_vector(solver, info, np.int32, batch), 0)
    if vectors:
        v = read_matrices(solver, V, dtype, batch, n, n)
        close(v @ (w[:, :, None] * np.conj(np.swapaxes(v, -1, -2))), a, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", [(6, 4), (4, 6), (5, 5)])
@pytest.mark.parametrize("full", [False, True])
def test_svd(solver, dtype, m, n, full):
    batch = 2
    a = rand((batch, m, n), dtype)
    routine = hal.Svd(dtype, full_matrices=full)
    ku, kv = routine.columns(m, n)
    k = min(m, n)
    size = np.dtype(dtype).itemsize
    U, S, V, info = out(solver, batch * m * ku * size), out(solver, batch * k * size), \
        out(solver, batch * n * kv * size), out(solver, 4 * batch)
    run_one(solver, routine, [batch, m, n], [U, S, V, allocate_with(solver, colmajor(a)), info])
    s = read_vector(solver, S, routine.real_dtype, batch * k).reshape(batch, k)
    close(s, np.linalg.svd(a, compute_uv=False), dtype)
    u = read_matrices(solver, U, dtype, batch, m, ku)
    v = read_matrices(solver, V, dtype, batch, n, kv)
    close((u[:, :, :k] * s[:, None, :]) @ np.conj(np.swapaxes(v[:, :, :k], -1, -2)), a, dtype)
    close(np.conj(np.swapaxes(u, -1, -2)) @ u, np.broadcast_to(np.eye(ku), (batch, ku, ku)), dtype)
    close(np.conj(np.swapaxes(v, -1, -2)) @ v, np.broadcast_to(np.eye(kv), (batch, kv, kv)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n", [(6, 4), (4, 6), (5, 5)])
@pytest.mark.parametrize("complete", [False, True])
def test_qr(solver, dtype, m, n, complete):
    batch = 2
    a = rand((batch, m, n), dtype)
    routine = hal.Qr(dtype, complete=complete)
    kq = routine.q_columns(m, n)
    size = np.dtype(dtype).itemsize
    Q, R = out(solver, batch * m * kq * size), out(solver, batch * m * n * size)
    run_one(solver, routine, [batch, m, n], [Q, R, allocate_with(solver, colmajor(a))])
    q = read_matrices(solver, Q, dtype, batch, m, kq)
    r = np.triu(read_matrices(solver, R, dtype, batch, m, n))[:, :kq]
    close(q @ r, a, dtype)
    close(np.conj(np.swapaxes(q, -1, -2)) @ q, np.broadcast_to(np.eye(kq), (batch, kq, kq)), dtype)


def test_reusable_solver_rebinds_its_operands(solver):
    n, batch = 4, 2
    exe = solver.load_executable(hal.library_spec({"potrf": hal.Cholesky("float64")}))
    cb = record(solver, lambda cb: cb.dispatch(exe, "potrf", constants=[batch, n],
                                               bindings=[Slot(0), Slot(1), Slot(2)]),
                mode=Mode.REUSABLE, binding_capacity=3)
    outputs = [(out(solver, batch * n * n * 8), out(solver, 4 * batch)) for _ in range(2)]
    for step in range(4):
        a = hpd(batch, n, "float64", seed=step)
        L, info = outputs[step % 2]
        submit_and_wait(solver, [cb], binding_tables=[[L, allocate_with(solver, colmajor(a)), info]])
        close(np.tril(read_matrices(solver, L, "float64", batch, n, n)), np.linalg.cholesky(a), "float64")
        np.testing.assert_array_equal(read_vector(solver, info, np.int32, batch), 0)


def test_a_solver_routine_between_others_in_one_command_buffer(solver):
    n = 5
    a = rand((1, n, n), "float32")
    b = rand((1, n, 2), "float32", 1)
    exe = solver.load_executable(hal.library_spec({"getrf": hal.LU("float32"), "getrs": hal.LUSolve("float32")}))
    LU, pivots, info, X = out(solver, a.nbytes), out(solver, 4 * n), out(solver, 4), out(solver, b.nbytes)
    A, B = allocate_with(solver, colmajor(a)), allocate_with(solver, colmajor(b))

    def body(cb):
        cb.dispatch(exe, "getrf", constants=[1, n], bindings=[LU, A, pivots, info])
        cb.execution_barrier()
        cb.dispatch(exe, "getrs", constants=[1, n, 2], bindings=[X, LU, pivots, B])

    submit_and_wait(solver, [record(solver, body)])
    close(read_matrices(solver, X, "float32", 1, n, 2), np.linalg.solve(a, b), "float32", 100)


def test_zero_size_routines_write_nothing(solver):
    L = allocate_with(solver, np.full(4, 7, np.int32))
    run_one(solver, hal.Cholesky("float32"), [0, 3], [L, L, L])
    run_one(solver, hal.Svd("float32"), [2, 0, 3], [L, L, L, L, L])
    np.testing.assert_array_equal(np.frombuffer(solver.read(L), np.int32), 7)


def test_bad_routines_and_dispatches_are_rejected(solver):
    with pytest.raises(hal.InvalidArgumentError):
        hal.Cholesky("int32")
    with pytest.raises(hal.InvalidArgumentError):
        hal.Svd("float16")
    exe = solver.load_executable(hal.library_spec({"potrf": hal.Cholesky("float32")}))
    short, info = out(solver, 4 * 4 * 4 - 4), out(solver, 4)
    full = out(solver, 4 * 4 * 4)
    cb = solver.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.InvalidArgumentError, match="too short"):
        cb.dispatch(exe, "potrf", constants=[1, 4], bindings=[short, full, info])
    with pytest.raises(hal.InvalidArgumentError, match="too short"):
        cb.dispatch(exe, "potrf", constants=[2, 4], bindings=[full, full, info])
    with pytest.raises(hal.InvalidArgumentError):
        cb.dispatch(exe, "potrf", constants=[1, 4, 1], bindings=[full, full, info])
    cb.end()


def test_a_short_table_entry_is_rejected_at_submission(solver):
    exe = solver.load_executable(hal.library_spec({"potrf": hal.Cholesky("float32")}))
    cb = record(solver, lambda cb: cb.dispatch(exe, "potrf", constants=[1, 4], bindings=[Slot(0), Slot(1), Slot(2)]),
                mode=Mode.REUSABLE, binding_capacity=3)
    full, short, info = out(solver, 64), out(solver, 32), out(solver, 4)
    with pytest.raises(hal.InvalidArgumentError, match="too short"):
        solver.queue_execute([cb], binding_tables=[[full, short, info]])
