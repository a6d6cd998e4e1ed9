"""The GPU drivers' solver planning (``hal/drivers/gpu/solver.py``) end to end over a numpy stand-in
for the vendor library: device memory is one byte array, addresses are offsets into it, and each
call does what LAPACK's does there (column-major, in place, ``info`` per matrix). Every routine's
outputs must equal its numpy reference (``hal.solver``), batched and single, looped and through
the batched calls: the addresses, strides, copies and workspace layout of the planner are checked
numerically, as cuSOLVER and hipSOLVER will be given them."""

from __future__ import annotations

import numpy as np
import pytest
from cts.helpers import random_array as rand

import hal
from hal.drivers.gpu.solver import SolverBackend
from hal.solver import lu_factor, lu_solve

BASE = 1 << 12
SIZE = 1 << 24


class Memory:
    def __init__(self) -> None:
        self.bytes = np.zeros(SIZE, np.uint8)
        self.top = BASE

    def allocate(self, nbytes: int) -> int:
        address = self.top
        self.top += -(-max(nbytes, 1) // 256) * 256
        assert self.top < SIZE
        return address

    def array(self, address: int, dtype, count: int) -> np.ndarray:
        start = address - 0
        return self.bytes[start:start + count * np.dtype(dtype).itemsize].view(dtype)

    def matrix(self, address: int, dtype, rows: int, cols: int) -> np.ndarray:
        """A column-major rows x cols matrix at ``address`` (a writable view)."""
        return self.array(address, dtype, rows * cols).reshape(cols, rows).T


REAL = {"float32": "float32", "float64": "float64", "complex64": "float32", "complex128": "float64"}


class NumpyCalls:
    """``SolverCalls`` doing LAPACK's work with numpy on ``Memory``."""

    name = "numpy LAPACK stand-in"

    def __init__(self, memory: Memory) -> None:
        self.m = memory
        self.streams: list = []
        self.qr: dict = {}

    def set_stream(self, stream) -> None:
        self.streams.append(stream)

    def copy(self, dst, src, nbytes, stream) -> None:
        data = self.m.bytes[src:src + nbytes].copy()
        self.m.bytes[dst:dst + nbytes] = data

    def pointer_array(self, pointers):
        address = self.m.allocate(8 * len(pointers))
        self.m.array(address, np.uint64, len(pointers))[...] = pointers
        return address

    # Cholesky
    def potrf_lwork(self, dtype, n, a):
        return 3

    def potrf(self, dtype, n, a, work, lwork, info):
        mat = self.m.matrix(a, dtype, n, n)
        lower = np.tril(mat)
        hermitian = lower + np.conj(np.tril(mat, -1)).T
        try:
            factor = np.linalg.cholesky(hermitian)
            code = 0
        except np.linalg.LinAlgError:
            factor, code = np.zeros_like(hermitian), 1
        mat[np.tril_indices(n)] = factor[np.tril_indices(n)]
        self.m.array(info, np.int32, 1)[0] = code

    def potrf_batched_lwork(self, dtype, n, array, batch):
        return 0

    def potrf_batched(self, dtype, n, array, work, lwork, info, batch):
        for i, address in enumerate(self.m.array(array, np.uint64, batch)):
            self.potrf(dtype, n, int(address), work, lwork, info + 4 * i)

    # LU
    def getrf_lwork(self, dtype, n, a):
        return 5

    def getrf(self, dtype, n, a, work, lwork, pivots, info):
        mat = self.m.matrix(a, dtype, n, n)
        lu, piv, code = lu_factor(mat[None].copy())
        mat[...] = lu[0]
        self.m.array(pivots, np.int32, n)[...] = piv[0]
        self.m.array(info, np.int32, 1)[0] = code[0]

    def getrs_lwork(self, dtype, transpose, n, nrhs, a, pivots, b):
        return 2

    # the batched LU, over arrays of the matrices' addresses (as cuBLAS's)
    batched_lu = True

    def getrf_batched(self, dtype, n, array, pivots, info, batch):
        for i, address in enumerate(self.m.array(array, np.uint64, batch)):
            self.getrf(dtype, n, int(address), 0, 0, pivots + 4 * n * i, info + 4 * i)

    def getrs_batched(self, dtype, transpose, n, nrhs, lu_array, pivots, b_array, batch):
        lus, bs = self.m.array(lu_array, np.uint64, batch), self.m.array(b_array, np.uint64, batch)
        for i in range(batch):
            self.getrs(dtype, transpose, n, nrhs, int(lus[i]), pivots + 4 * n * i, int(bs[i]), 0, 0,
                       self.m.allocate(4))

    def getrs(self, dtype, transpose, n, nrhs, a, pivots, b, work, lwork, info):
        lu = self.m.matrix(a, dtype, n, n)[None]
        piv = self.m.array(pivots, np.int32, n)[None]
        rhs = self.m.matrix(b, dtype, n, nrhs)
        rhs[...] = lu_solve(lu, piv, rhs[None].copy(), transpose)[0]
        self.m.array(info, np.int32, 1)[0] = 0

    # Eigh
    def evd_lwork(self, dtype, vectors, n, a, w):
        return 4

    def evd(self, dtype, vectors, n, a, w, work, lwork, info):
        mat = self.m.matrix(a, dtype, n, n)
        values, vecs = np.linalg.eigh(mat.copy(), UPLO="L")
        self.m.array(w, REAL[dtype], n)[...] = values
        if vectors:
            mat[...] = vecs
        self.m.array(info, np.int32, 1)[0] = 0

    def evd_batched_lwork(self, dtype, vectors, n, a, w, batch):
        return 4

    def evd_batched(self, dtype, vectors, n, a, w, work, lwork, info, batch):
        size, real = np.dtype(dtype).itemsize, np.dtype(REAL[dtype]).itemsize
        for i in range(batch):
            self.evd(dtype, vectors, n, a + i * n * n * size, w + i * n * real, work, lwork, info + 4 * i)

    # SVD
    def gesvdj_lwork(self, dtype, full, m, n, a, s, u, v):
        return 6

    def gesvdj(self, dtype, full, m, n, a, s, u, v, work, lwork, info):
        mat = self.m.matrix(a, dtype, m, n)
        uu, ss, vh = np.linalg.svd(mat.copy(), full_matrices=full)
        k = min(m, n)
        self.m.array(s, REAL[dtype], k)[...] = ss
        self.m.matrix(u, dtype, m, uu.shape[1])[...] = uu
        self.m.matrix(v, dtype, n, vh.shape[0])[...] = np.conj(vh).T
        mat[...] = 0  # (gesvdj destroys its input)
        self.m.array(info, np.int32, 1)[0] = 0

    def gesvdj_batched_lwork(self, dtype, m, n, a, s, u, v, batch):
        return 6

    def gesvdj_batched(self, dtype, m, n, a, s, u, v, work, lwork, info, batch):
        size, real, k = np.dtype(dtype).itemsize, np.dtype(REAL[dtype]).itemsize, min(m, n)
        for i in range(batch):
            self.gesvdj(dtype, True, m, n, a + i * m * n * size, s + i * k * real, u + i * m * m * size,
                        v + i * n * n * size, work, lwork, info + 4 * i)

    # QR (geqrf keeps Q aside for orgqr: the reflectors themselves are LAPACK's business)
    def geqrf_lwork(self, dtype, m, n, a):
        return 7

    def geqrf(self, dtype, m, n, a, tau, work, lwork, info):
        mat = self.m.matrix(a, dtype, m, n)
        q, r = np.linalg.qr(mat.copy(), mode="complete")
        self.qr[a] = q
        mat[np.triu_indices(m, 0, n)] = r[np.triu_indices(m, 0, n)]

    def orgqr_lwork(self, dtype, m, n, k, a, tau):
        return 7

    def orgqr(self, dtype, m, n, k, a, tau, work, lwork, info):
        self.m.matrix(a, dtype, m, n)[...] = self.qr.pop(a)[:, :n]


def inputs_for(routine, sizes):
    batch = sizes[0]
    if isinstance(routine, (hal.Cholesky, hal.Eigh)):
        n = sizes[1]
        a = rand((batch, n, n), routine.dtype)
        return {"A": np.ascontiguousarray(
            np.swapaxes(a @ np.conj(np.swapaxes(a, -1, -2)) + n * np.eye(n), -1, -2)).astype(routine.dtype)}
    if isinstance(routine, hal.LU):
        return {"A": rand((batch, sizes[1], sizes[1]), routine.dtype) + 4 * np.eye(sizes[1])}
    if isinstance(routine, hal.LUSolve):
        n, nrhs = sizes[1], sizes[2]
        a = rand((batch, n, n), routine.dtype) + 4 * np.eye(n)
        lu, piv, _ = lu_factor(np.swapaxes(a, -1, -2).copy())
        return {"LU": np.ascontiguousarray(np.swapaxes(lu, -1, -2)).astype(routine.dtype), "pivots": piv,
                "B": rand((batch, nrhs, n), routine.dtype, 1)}
    return {"A": rand((batch, sizes[2], sizes[1]), routine.dtype)}  # Svd, Qr: m x n column-major


CASES = [
    (hal.Cholesky("float64"), [1, 5]), (hal.Cholesky("complex64"), [3, 4]),
    (hal.LU("float32"), [3, 6]), (hal.LU("complex128"), [1, 5]),
    (hal.LUSolve("float64", transpose=True), [3, 5, 2]), (hal.LUSolve("complex64"), [2, 4, 3]),
    (hal.Eigh("float64"), [3, 5]), (hal.Eigh("complex128"), [2, 40]), (hal.Eigh("float32", vectors=False), [2, 4]),
    (hal.Svd("float64"), [2, 5, 3]), (hal.Svd("complex64", full_matrices=True), [3, 4, 6]),
    (hal.Svd("float64", full_matrices=True), [2, 40, 33]),
    (hal.Qr("float64"), [2, 5, 3]), (hal.Qr("complex128", complete=True), [2, 6, 4]), (hal.Qr("float32"), [1, 3, 5]),
]


@pytest.mark.parametrize("routine,sizes", CASES, ids=lambda c: getattr(c, "kind", None))
def test_the_planner_computes_what_the_reference_does(routine, sizes):
    memory = Memory()
    backend = SolverBackend(NumpyCalls(memory))
    call = routine.call_of(sizes)
    names = routine.binding_names()
    data = inputs_for(routine, sizes)
    pointers, reference_views = [], []
    for name, nbytes in call.extents:
        address = memory.allocate(nbytes)
        pointers.append(address)
        raw = bytearray(max(nbytes, 1))
        if name in data:
            payload = np.ascontiguousarray(data[name]).view(np.uint8).ravel()
            memory.bytes[address:address + nbytes] = payload[:nbytes]
            raw[:nbytes] = payload[:nbytes].tobytes()
        reference_views.append(raw)
    plan = backend.plan(routine, call, pointers)
    workspace = memory.allocate(plan.workspace_size)
    guard = memory.allocate(256)
    memory.bytes[guard:guard + 256] = 0xAB
    backend.enqueue(plan, tuple(sizes), pointers, workspace, plan.workspace_size, "stream")
    assert (memory.bytes[guard:guard + 256] == 0xAB).all(), "the call wrote past its workspace"
    routine.reference()((1, 1, 1), [memoryview(r) for r in reference_views], list(sizes))
    for i in routine.OUTPUTS:
        name, nbytes = call.extents[i]
        got = memory.bytes[pointers[i]:pointers[i] + nbytes]
        expected = np.frombuffer(bytes(reference_views[i][:nbytes]), np.uint8)
        dtype = np.int32 if name in ("info", "pivots") else REAL[routine.dtype] if name in ("W", "S") \
            else routine.dtype
        got, expected = got.view(dtype), expected.view(dtype)
        if name in ("L",):  # (only the lower triangle is specified)
            n = sizes[1]
            got = np.tril(got.reshape(-1, n, n).transpose(0, 2, 1))
            expected = np.tril(expected.reshape(-1, n, n).transpose(0, 2, 1))
        if name == "R":
            m, n = sizes[1], sizes[2]
            got = np.triu(got.reshape(-1, n, m).transpose(0, 2, 1))
            expected = np.triu(expected.reshape(-1, n, m).transpose(0, 2, 1))
        if name == "V" and isinstance(routine, hal.Eigh) and not routine.vectors:
            continue
        tol = 1e-4 if routine.dtype in ("float32", "complex64") else 1e-10
        np.testing.assert_allclose(got, expected, rtol=tol, atol=tol, err_msg=f"{type(routine).__name__} {name}")
    assert names  # (every binding named)


@pytest.mark.parametrize("routine,sizes", [case for case in CASES if case[0].kind in ("lu", "lu_solve")],
                         ids=lambda c: getattr(c, "kind", None))
def test_without_a_batched_lu_the_planner_loops_over_the_matrices(routine, sizes, monkeypatch):
    monkeypatch.setattr(NumpyCalls, "batched_lu", False)
    monkeypatch.setattr(NumpyCalls, "getrf_batched", None)
    monkeypatch.setattr(NumpyCalls, "getrs_batched", None)
    test_the_planner_computes_what_the_reference_does(routine, sizes)
