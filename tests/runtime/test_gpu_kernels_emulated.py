"""The CUDA C kernels, run on the CPU by cuda_emu through the real runtime plans, against numpy.

The runtime is pointed at a local-sync device that claims to be a GPU (so
reductions take their split two-pass path) while every executable it loads
launches the emulated CUDA kernels instead of the numpy implementations.
"""

from __future__ import annotations

import numpy as np
import pytest

cuda_emu = pytest.importorskip("cuda_emu")
if cuda_emu.GXX is None:
    pytest.skip("g++ is needed to emulate the CUDA kernels", allow_module_level=True)

import hal  # noqa: E402
import runtime as rt  # noqa: E402
from runtime.device import context_for  # noqa: E402


@pytest.fixture(scope="module")
def gpu_like():
    context_for("local-sync")  # the URI's shared device (hal.open_device) stays a CPU-lowered one
    device = hal.create_device("local-sync")
    ctx = context_for(device)
    ctx.is_gpu = True
    try:
        with cuda_emu.emulated_kernels():
            yield device
    finally:
        device.close()


def close(got, want, rtol=1e-5, atol=1e-5):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind in "fc":
        wide = np.complex128 if want.dtype.kind == "c" else np.float64
        np.testing.assert_allclose(got.astype(wide), want.astype(wide), rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(got, want)


def test_elementwise_variants_and_dtypes(gpu_like):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    A, B = rt.array(a, device=gpu_like), rt.array(b, device=gpu_like)
    close((A + B).numpy(), a + b)  # broadcast: strided variant
    close((A * 2.0).numpy(), a * 2)  # contiguous + scalar
    close((3.0 - A).numpy(), 3 - a)
    close(rt.maximum(A, B).numpy(), np.maximum(a, b))
    close((A.T[::-1] > 0).numpy(), a.T[::-1] > 0)
    close(rt.sigmoid(A).numpy(), 1 / (1 + np.exp(-a)), rtol=1e-5)
    close(rt.where(A > 0, A, B).numpy(), np.where(a > 0, a, b))
    close(A.astype(rt.float16).numpy(), a.astype(np.float16))
    close((A.astype(rt.bfloat16) * 2).astype(rt.float32).numpy(), a * 2, rtol=1e-2, atol=1e-2)
    i = rng.integers(-5, 5, (4, 4)).astype(np.int32)
    ii = rt.array(i, device=gpu_like)
    close((ii * ii - 3).numpy(), i * i - 3)
    close((ii ** 2).numpy(), i ** 2)
    close(abs(ii).numpy(), np.abs(i))
    close((ii / 2).numpy(), (i / 2).astype(np.float32))
    h = rng.standard_normal(7).astype(np.float16)
    close((rt.array(h, device=gpu_like) + 1).numpy(), h + np.float16(1), rtol=1e-3, atol=1e-3)


def test_vector_and_scalar_paths(gpu_like):
    """Contiguous kernels move 4 elements per access when n and offsets are multiples of 4."""
    x = np.arange(64, dtype=np.float32)
    X = rt.array(x, device=gpu_like)
    close((X[4:] + X[:-4]).numpy(), x[4:] + x[:-4])  # aligned offsets: vector path
    close((X[1:61] * X[2:62]).numpy(), x[1:61] * x[2:62])  # misaligned: scalar path
    close((X[8:] - 1.5).numpy(), x[8:] - 1.5)
    h = x.astype(np.float16)
    close((rt.array(h, device=gpu_like)[4:] * 2).numpy(), h[4:] * np.float16(2))
    b = x > 30
    close(rt.where(rt.array(b, device=gpu_like), X, -X).numpy(), np.where(b, x, -x))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int16", "int8"])
def test_narrow_elements_move_eight_a_vector(gpu_like, dtype, monkeypatch):
    """Elements of 2 bytes or fewer move 8 a vector (16 bytes a thread) where n and the offsets are
    multiples of 8, in the elementwise and the fused kernels; offsets of 4 but not 8, odd lengths and
    a 4-byte output take the other paths. The values are numpy's."""
    from runtime.kernels import cuda_common, elementwise, fused

    monkeypatch.setenv("RUNTIME_FUSE_AFTER", "1")  # (fused at the first evaluation)
    narrow = getattr(rt, dtype)
    assert cuda_common.vector_width([narrow, narrow]) == 8 and cuda_common.vector_width([narrow, rt.float32]) == 4
    assert elementwise.contiguous_width("cc", (narrow, narrow), narrow) == 8
    assert elementwise.contiguous_width("cs", (narrow, rt.float64), narrow) == 8  # (a scalar is not moved)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(203) * 20).astype(np.float32)
    X = rt.array(x, device=gpu_like).astype(narrow)
    h = X.astype(rt.float32).numpy()  # what the narrow array holds
    if dtype == "bfloat16":  # (numpy has no bfloat16: float64 products, to bfloat16's precision)
        want_of, tol = (lambda a, b: a.astype(np.float64) * b), dict(rtol=1e-2, atol=1e-1)
    else:
        held = h.astype(getattr(np, dtype))
        h = held
        want_of, tol = (lambda a, b: a * b), {}
    for lo, hi in ((8, 200), (4, 196), (3, 203), (0, 203)):  # aligned, 4 apart, odd offset, odd length
        close((X[lo:hi] * X[lo:hi]).astype(rt.float32).numpy(), want_of(h[lo:hi], h[lo:hi]), **tol)
        fused_pair = (X[lo:hi] + X[lo:hi]) * X[lo:hi]  # one fused kernel of narrow values
        close(fused_pair.astype(rt.float32).numpy(), want_of(h[lo:hi] + h[lo:hi], h[lo:hi]), **tol)
    wide = (X[8:200] * 2).astype(rt.float32) + 1  # a 4-byte result: vectors of 4
    close(wide.numpy(), want_of(h[8:200], 2).astype(np.float32) + 1, **tol)
    assert fused._width(fused.FusedSpec(((narrow, "c"),), (("neg", narrow, narrow, (("i", 0),)),), (0,))) == 8


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "complex64", "bool"])
def test_strided_variant_four_along_the_last_dim_or_one(gpu_like, dtype):
    """Broadcast and strided inputs (the "g" variant): 4 outputs a thread where the collapsed last
    dim is a multiple of 4, each input loaded as a vector only where its stride there is 1 and its
    position aligned, by elements otherwise (misaligned, reversed, broadcast, step 2); one output a
    thread for any other last dim; and three inputs (where)."""
    rng = np.random.default_rng(3)

    def make(shape):
        values = rng.standard_normal(shape) * 4
        if dtype == "complex64":
            values = values + 1j * rng.standard_normal(shape)
        return values.astype(np.int64).astype(dtype) if dtype in ("int64", "bool") else values.astype(dtype)

    def put(x):
        return rt.array(x, device=gpu_like)

    tol = dict(rtol=1e-2, atol=1e-2) if dtype == "float16" else {}
    op = np.logical_xor if dtype == "bool" else np.add
    rt_op = rt.logical_xor if dtype == "bool" else rt.add
    for rows, cols in ((6, 8), (5, 12), (3, 7), (4, 1), (1, 16)):
        x, row, col = make((rows, cols)), make((cols,)), make((rows, 1))
        X = put(x)
        close(rt_op(X, put(row)).numpy(), op(x, row), **tol)  # broadcast along the rows
        close(rt_op(X, put(col)).numpy(), op(x, col), **tol)  # broadcast along the columns (stride 0)
        wide = make((rows, cols + 3))
        close(rt_op(put(wide)[:, 1:cols + 1], put(row)).numpy(), op(wide[:, 1:cols + 1], row), **tol)  # misaligned
        close(rt_op(X[:, ::-1], put(row)).numpy(), op(x[:, ::-1], row), **tol)  # reversed
        twice = make((rows, 2 * cols))
        close(rt_op(put(twice)[:, ::2], X).numpy(), op(twice[:, ::2], x), **tol)  # step 2
        cond = rng.standard_normal((rows, cols)) > 0
        close(rt.where(put(cond), X, put(row)).numpy(), np.where(cond, x, row))
    cube = make((3, 4, 8))
    close(rt_op(put(cube), put(cube[0])).numpy(), op(cube, cube[0]), **tol)
    close(put(cube)[:, ::-1, 2:6].numpy(), cube[:, ::-1, 2:6])  # a strided copy
    close(rt.broadcast_to(put(cube[:, :1]), (3, 5, 8)).numpy(), np.broadcast_to(cube[:, :1], (3, 5, 8)))
    six = make((2, 1, 3, 2, 1, 4))
    close(rt_op(put(six), put(six[:, :, :1])).numpy(), op(six, six[:, :, :1]), **tol)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "complex128"])
def test_triangles_by_vectors_and_elements(gpu_like, dtype):
    """tril/triu (kernels/tri.py): 4 neighbours a thread where the rows' length and the input's
    offset are multiples of 4, one otherwise; every diagonal offset, batches, an offset input, and
    the gradient."""
    rng = np.random.default_rng(5)
    for shape in ((6, 8), (5, 7), (3, 4, 12), (2, 1, 5)):
        x = (rng.standard_normal(shape) * 5).astype(dtype)
        X = rt.array(x, device=gpu_like)
        for k in (-shape[-2] - 2, -1, 0, 2, shape[-1] + 1):
            close(rt.tril(X, k=k).numpy(), np.tril(x, k))
            close(rt.triu(X, k=k).numpy(), np.triu(x, k))
    batch = (rng.standard_normal((3, 4, 8)) * 5).astype(dtype)
    close(rt.tril(rt.array(batch, device=gpu_like)[1:]).numpy(), np.tril(batch[1:]))  # offset 32: vectors
    close(rt.triu(rt.array(batch, device=gpu_like)[:, 1:], k=1).numpy(), np.triu(batch[:, 1:], 1))  # a copy first
    if dtype == "float32":
        w = rt.array(batch, device=gpu_like)
        close(rt.grad(lambda a: rt.sum(rt.triu(a, k=-1) * a))(w).numpy(), 2 * np.triu(batch, -1))


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "complex64"])
def test_takes_along_an_axis(gpu_like, dtype):
    """take / take_along_axis / one-array indexing (kernels/take.py): 4 neighbours a thread where the
    inner length and the source's offset are multiples of 4 and the indices are shared across it,
    one otherwise; every mode; indices from the host and from the device, checked there."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((3, 6, 8)) * 5).astype(dtype)
    X = rt.array(x, device=gpu_like)
    for axis in (0, 1, 2):
        n = x.shape[axis]
        idx = rng.integers(-n, n, 7)
        close(rt.take(X, idx, axis=axis).numpy(), np.take(x, idx, axis=axis))
        close(rt.take(X, rt.array(idx, device=gpu_like), axis=axis).numpy(), np.take(x, idx, axis=axis))
        wild = rng.integers(-3 * n, 3 * n, (2, 5))
        for mode in ("wrap", "clip"):
            close(rt.take(X, rt.array(wild, device=gpu_like), axis=axis, mode=mode).numpy(),
                  np.take(x, wild, axis=axis, mode=mode))
        along = rng.integers(-n, n, tuple(4 if a == axis else d for a, d in enumerate(x.shape)))
        close(rt.take_along_axis(X, rt.array(along, device=gpu_like), axis=axis).numpy(),
              np.take_along_axis(x, along, axis))
    close(X[1:][rt.array(np.array([1, 0, 1]), device=gpu_like)].numpy(), x[1:][[1, 0, 1]])  # offset 48: vectors
    close(X[:, 1:, 1:][:, rt.array(np.array([4, 0]), device=gpu_like)].numpy(), x[:, 1:, 1:][:, [4, 0]])
    bad = X[rt.array(np.array([0, 3]), device=gpu_like)]
    with pytest.raises(IndexError):
        bad.numpy()
    close(X[rt.array(np.array([2]), device=gpu_like)].numpy(), x[[2]])  # the device still usable


def _scaled_normals(rng, dtype, shape):
    """Normal values times 5 in `dtype` (complex ones with a normal imaginary part too)."""
    values = rng.standard_normal(shape) * 5
    if np.dtype(dtype).kind == "c":
        values = values + 1j * rng.standard_normal(shape)
    return values.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "complex64"])
def test_adds_along_an_axis(gpu_like, dtype):
    """take_add (kernels/take.py): x.at[indices].add(v) through one index array, repeated and
    negative indices, host and device indices (checked there), and the gradient of a take."""
    rng = np.random.default_rng(11)

    def make(*shape):
        return _scaled_normals(rng, dtype, shape)

    x = make(5, 4, 3)
    X = rt.array(x, device=gpu_like)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == "float16" else dict(rtol=1e-5, atol=1e-5)
    for axis in (0, 1, 2):
        n = x.shape[axis]
        idx = np.array([0, n - 1, -1, 1, 0])
        key = (slice(None),) * axis + (idx,)
        v = make(*x[key].shape)
        want = x.copy()
        np.add.at(want, key, v)
        close(X.at[key].add(rt.array(v, device=gpu_like)).numpy(), want, **tol)
        device_key = (slice(None),) * axis + (rt.array(idx, device=gpu_like),)
        close(X.at[device_key].add(rt.array(v, device=gpu_like)).numpy(), want, **tol)
    bad = X.at[rt.array(np.array([7]), device=gpu_like)].add(1)
    with pytest.raises(IndexError):
        bad.numpy()
    if dtype == "float32":
        idx = rt.array(np.array([[2, 2], [0, 4]]), device=gpu_like)
        g = rt.grad(lambda a: rt.sum(rt.take(a, idx, axis=0) * 3))(X)
        want = np.zeros_like(x)
        np.add.at(want, np.array([[2, 2], [0, 4]]), 3)
        close(g.numpy(), want)


def test_reductions_single_and_split(gpu_like):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 9000)).astype(np.float32)  # long rows, few outputs: split into chunks
    X = rt.array(x, device=gpu_like)
    close(X.sum(axis=1).numpy(), x.sum(axis=1), rtol=1e-4, atol=1e-3)
    # Replays of one recording, eager and compiled: the last chunk of each row to finish sets the
    # row's ticket back to zero for the next.
    total = rt.compile(lambda a: (a * 2).sum(axis=1))
    for _ in range(3):
        x = rng.standard_normal((3, 9000)).astype(np.float32)
        X = rt.array(x, device=gpu_like)
        close(X.sum(axis=1).numpy(), x.sum(axis=1), rtol=1e-4, atol=1e-3)
        close(X.argmin(axis=1).numpy(), x.argmin(axis=1).astype(np.int32))
        close(total(X).numpy(), 2 * x.sum(axis=1), rtol=1e-4, atol=1e-3)
    close(X.mean(axis=1).numpy(), x.mean(axis=1), rtol=1e-4, atol=1e-5)
    close(X.max(axis=1).numpy(), x.max(axis=1))
    close(X.argmax(axis=1).numpy(), x.argmax(axis=1).astype(np.int32))
    close(X.argmin(axis=1).numpy(), x.argmin(axis=1).astype(np.int32))
    y = rng.standard_normal((4, 6, 5)).astype(np.float32)
    Y = rt.array(y, device=gpu_like)
    close(Y.sum(axis=(0, 2)).numpy(), y.sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)  # strided
    close(Y[:, ::-2].min(axis=0).numpy(), y[:, ::-2].min(axis=0))
    close(Y.argmax(axis=1).numpy(), y.argmax(axis=1).astype(np.int32))
    t = np.array([[1, 5, 5, 2]], np.int32)  # ties: the first index wins
    close(rt.array(t, device=gpu_like).argmax(axis=1).numpy(), np.array([1], np.int32))
    b = rng.random((5, 7)) > 0.5
    close(rt.array(b, device=gpu_like).sum(axis=0).numpy(), b.sum(axis=0).astype(np.int32))


def test_reductions_vector_loads_at_any_alignment(gpu_like):
    """Contiguous rows are read as 4-element vectors from their first aligned element."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 9003)).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    for lo in (0, 1, 2, 3):
        close(X[:, lo:].sum(axis=1).numpy(), x[:, lo:].sum(axis=1), rtol=1e-4, atol=1e-3)  # split, unaligned
        close(X[1, lo:lo + 37].sum().numpy(), x[1, lo:lo + 37].sum(), rtol=1e-5, atol=1e-5)  # one block
    close(X.reshape(-1)[5:].max().numpy(), x.reshape(-1)[5:].max())
    close(X.min(axis=1).numpy(), x.min(axis=1))
    h = x[:, :4099].astype(np.float16)
    close(rt.array(h, device=gpu_like)[:, 1:].sum(axis=1).numpy(), h[:, 1:].astype(np.float32).sum(axis=1)
          .astype(np.float16), rtol=1e-2, atol=1e-1)
    i = rng.integers(-9, 9, (3, 5001)).astype(np.int32)
    close(rt.array(i, device=gpu_like)[:, 3:].sum(axis=1).numpy(), i[:, 3:].sum(axis=1).astype(np.int32))
    # One long row dealt out to about 200 chunks, its head and tail unaligned.
    long = rng.standard_normal(401_419).astype(np.float32)
    L = rt.array(long, device=gpu_like)
    close(L[1:].sum().numpy(), long[1:].astype(np.float64).sum(), rtol=1e-4, atol=1e-2)
    close(L[2:-3].max().numpy(), long[2:-3].max())


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "complex128", "bool"])
def test_sets_along_an_axis(gpu_like, dtype):
    """take_set (kernels/take.py): x.at[indices].set(v) through one index array, the last value
    where indices repeat, host and device indices (checked there), strided x, and its gradients."""
    rng = np.random.default_rng(13)

    def make(*shape):
        return _scaled_normals(rng, dtype, shape)

    x = make(5, 4, 3)
    X = rt.array(x, device=gpu_like)
    for axis in (0, 1, 2):
        n = x.shape[axis]
        idx = np.array([1, n - 1, -1, 1, 0, 1])
        key = (slice(None),) * axis + (idx,)
        v = make(*x[key].shape)
        want = x.copy()
        want[key] = v
        close(X.at[key].set(rt.array(v, device=gpu_like)).numpy(), want)
        device_key = (slice(None),) * axis + (rt.array(idx, device=gpu_like),)
        close(X.at[device_key].set(rt.array(v, device=gpu_like)).numpy(), want)
    strided = x[:, ::-1]
    want = strided.copy()
    value = make(4, 3)
    want[[2, 2]] = value
    close(X[:, ::-1].at[rt.array(np.array([2, 2]), device=gpu_like)].set(rt.array(value, device=gpu_like)).numpy(),
          want)
    bad = X.at[rt.array(np.array([7]), device=gpu_like)].set(make(1, 4, 3))
    with pytest.raises(IndexError):
        bad.numpy()
    if dtype == "float32":
        idx = rt.array(np.array([3, 0, 3]), device=gpu_like)
        v = make(3, 4, 3)
        weights = rng.standard_normal(x.shape).astype(np.float32)
        gx, gv = rt.grad(lambda a, b: rt.sum(a.at[idx].set(b) * rt.array(weights, device=gpu_like)),
                         argnums=(0, 1))(X, rt.array(v, device=gpu_like))
        want_x = weights.copy()
        want_x[[3, 0]] = 0
        want_v = weights[[3, 0, 3]].copy()
        want_v[0] = 0  # (index 3 repeats: the last value stays)
        close(gx.numpy(), want_x)
        close(gv.numpy(), want_v)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "float64"])
def test_arg_reductions_in_vectors(gpu_like, dtype):
    """argmax/argmin of contiguous rows read 4-element vectors from each row's first aligned element
    (rows of odd length start anywhere), two in flight a thread, one long row split across chunks:
    the first of equal values wins, a NaN wins (the first of them), as numpy's."""
    rng = np.random.default_rng(12)
    big = 100 if dtype == "int8" else 1000
    for shape in ((5, 1001), (3, 4096), (1, 40_003)):
        x = (rng.integers(-big, big, shape)).astype(dtype)  # (integers: ties across vectors and chunks)
        X = rt.array(x, device=gpu_like)
        close(X.argmax(axis=1).numpy(), x.argmax(axis=1))
        close(X.argmin(axis=1).numpy(), x.argmin(axis=1))
        flat = x.reshape(-1)
        for lo in (1, 2, 3):
            close(rt.argmax(X.reshape(-1)[lo:]).numpy(), flat[lo:].argmax())
    if dtype in ("float32", "float16", "float64"):
        y = rng.standard_normal((2, 9001)).astype(dtype)
        y[0, 7000] = y[0, 8001] = np.nan
        y[1, 5] = y[1, 9000] = y[1].max() + 1
        Y = rt.array(y, device=gpu_like)
        close(Y.argmax(axis=1).numpy(), y.argmax(axis=1))
        close(Y.argmin(axis=1).numpy(), y.argmin(axis=1))


def test_matmul_tiles_and_batches(gpu_like):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 19, 23)).astype(np.float32)
    b = rng.standard_normal((23, 17)).astype(np.float32)
    A, B = rt.array(a, device=gpu_like), rt.array(b, device=gpu_like)
    close((A @ B).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    close((A[1].T @ A[0]).numpy(), a[1].T @ a[0], rtol=1e-4, atol=1e-4)
    h = a.astype(np.float16)
    close((rt.array(h, device=gpu_like) @ rt.array(b.astype(np.float16), device=gpu_like)).numpy(),
          (h.astype(np.float32) @ b.astype(np.float16).astype(np.float32)).astype(np.float16), rtol=1e-2, atol=1e-2)


def test_matrix_vector_products(gpu_like):
    """One output column or row: the GEMV kernels (contiguous rows, or strided rows split over K)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((70, 45)).astype(np.float32)
    v = rng.standard_normal(70).astype(np.float32)
    u = rng.standard_normal(45).astype(np.float32)
    X, V, U = (rt.array(t, device=gpu_like) for t in (x, v, u))
    close((X @ U).numpy(), x @ u, rtol=1e-4, atol=1e-4)  # rows contiguous
    close((X.T @ V).numpy(), x.T @ v, rtol=1e-4, atol=1e-4)  # rows strided: K split in shared memory
    close((V @ X).numpy(), v @ x, rtol=1e-4, atol=1e-4)  # one output row
    close((U @ X.T).numpy(), u @ x.T, rtol=1e-4, atol=1e-4)
    close((X[3:, ::2] @ U[::2]).numpy(), x[3:, ::2] @ u[::2], rtol=1e-4, atol=1e-4)  # offsets, strides
    close((X @ U.reshape(45, 1)).numpy(), x @ u.reshape(45, 1), rtol=1e-4, atol=1e-4)
    close((U @ U).numpy(), u @ u, rtol=1e-4, atol=1e-4)  # a dot product
    # few outputs, long K: gemv_colsk, K split over 256 threads a block (and not a multiple of it)
    tall = rng.standard_normal((613, 37)).astype(np.float32)
    w = rng.standard_normal(613).astype(np.float32)
    close((rt.array(tall, device=gpu_like).T @ rt.array(w, device=gpu_like)).numpy(), tall.T @ w,
          rtol=1e-4, atol=1e-4)
    i = rng.integers(-3, 4, (9, 40)).astype(np.int32)
    j = rng.integers(-3, 4, 40).astype(np.int32)
    close((rt.array(i, device=gpu_like) @ rt.array(j, device=gpu_like)).numpy(), i @ j)
    h = x.astype(np.float16)
    close((rt.array(h, device=gpu_like).T @ V.astype(rt.float16)).numpy(),
          (h.astype(np.float32).T @ v.astype(np.float16).astype(np.float32)).astype(np.float16), rtol=1e-2, atol=1e-2)


def test_random_matches_numpy_philox(gpu_like):
    from runtime.kernels.random import philox
    key = rt.random.key(7, device=gpu_like)
    w0, w1 = philox(np.arange(300, dtype=np.uint64), 7, 0)
    u = (w0 >> 8).astype(np.float32) * np.float32(2**-24)
    np.testing.assert_array_equal(rt.random.uniform((300,), key=key).numpy(), u)
    u1 = ((w0 >> 8).astype(np.float32) + 1) * np.float32(2**-24)
    u2 = (w1 >> 8).astype(np.float32) * np.float32(2**-24)
    z = np.sqrt(-2 * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)
    np.testing.assert_allclose(rt.random.normal((300,), key=key).numpy(), z, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rt.random.split(key, 3).numpy().reshape(-1), philox(
        np.arange(6, dtype=np.uint64), 7, 0)[0].view(np.int32))


def test_gradient_through_slices(gpu_like):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    g = rt.grad(lambda v: (v[1:, ::-2] * 3).sum() + v[0, 2])(rt.array(x, device=gpu_like)).numpy()
    want = np.zeros_like(x)
    want[1:, ::-2] = 3
    want[0, 2] += 1
    close(g, want)


def test_fill_and_copy(gpu_like):
    z = rt.zeros((3, 4), device=gpu_like) + rt.full((4,), 2.5, device=gpu_like)
    close(z.numpy(), np.full((3, 4), 2.5, np.float32))
    x = rt.array(np.arange(12, dtype=np.float32).reshape(3, 4), device=gpu_like)
    close(x.T.reshape(-1).numpy(), np.arange(12).reshape(3, 4).T.reshape(-1))


def test_strided_views_fuzz(gpu_like):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
    @given(shape=st.lists(st.integers(1, 4), min_size=2, max_size=4), seed=st.integers(0, 99),
           steps=st.lists(st.sampled_from([1, 2, -1, -2]), min_size=4, max_size=4))
    def run(shape, seed, steps):
        x = np.random.default_rng(seed).standard_normal(tuple(shape)).astype(np.float32)
        key = tuple(slice(None, None, s) for s in steps[:len(shape)])
        v, r = rt.array(x, device=gpu_like)[key], x[key]
        close((v * 2 + v.T.T).numpy(), r * 3)
        close(v.sum(axis=0).numpy(), r.sum(axis=0), rtol=1e-5, atol=1e-5)
        close(v.max(axis=-1).numpy(), r.max(axis=-1))
        close(rt.matmul(v, rt.swapaxes(v, -1, -2)).numpy(), r @ np.swapaxes(r, -1, -2), rtol=1e-4, atol=1e-4)

    run()


def test_wide_and_narrow_dtypes(gpu_like):
    """int8/uint8 wrap as numpy's, int64/uint64/uint32/float64 are computed natively, integer division,
    remainder and shifts follow numpy, float->int casts saturate (NaN -> 0) as on the CPU drivers."""
    dev = gpu_like
    i8 = np.array([100, -100, 7, -128], np.int8)
    close((rt.array(i8, device=dev) + rt.array(i8, device=dev)).numpy(), i8 + i8)
    u8 = np.array([3, 250, 0, 9], np.uint8)
    close((rt.array(u8, device=dev) - np.uint8(10)).numpy(), u8 - np.uint8(10))
    i64 = np.array([2**40, -3, 5, 2**62, 11, -2**50, 0, 1])
    I64 = rt.array(i64, device=dev)
    close((I64 * 3 + 1).numpy(), i64 * 3 + 1)
    close(I64.sum().numpy(), i64.sum())
    close(I64.max().numpy(), i64.max())
    close(I64.argmin().numpy(), i64.argmin())
    u32 = np.array([4_000_000_000, 5, 7, 1], np.uint32)
    close((rt.array(u32, device=dev) + np.uint32(1)).numpy(), u32 + np.uint32(1))
    f64 = np.random.default_rng(3).standard_normal(1000)
    F64 = rt.array(f64, device=dev)
    close(rt.exp(F64).numpy(), np.exp(f64), rtol=1e-12)
    close(F64.sum().numpy(), f64.sum(), rtol=1e-12)
    close(F64.mean().numpy(), f64.mean(), rtol=1e-12)
    close(F64.argmax().numpy(), f64.argmax())
    close((F64.reshape(10, 100) @ F64.reshape(100, 10)).numpy(), f64.reshape(10, 100) @ f64.reshape(100, 10),
          rtol=1e-10, atol=1e-10)
    a = np.array([7, -7, 7, -7, 0, -2**31, 5, 9], np.int32)
    b = np.array([2, 2, -2, -2, 3, -1, 0, 4], np.int32)
    A, B = rt.array(a, device=dev), rt.array(b, device=dev)
    with np.errstate(all="ignore"):
        close((A // B).numpy(), a // b)
        close((A % B).numpy(), a % b)
    fa = np.array([5.5, -5.5, 5.5, -5.5, 1.0, -0.0, 3.0, 7.25], np.float32)
    fb = np.array([2, 2, -2, -2, 0, 3, np.inf, -1.5], np.float32)
    FA, FB = rt.array(fa, device=dev), rt.array(fb, device=dev)
    with np.errstate(all="ignore"):
        close((FA // FB).numpy(), fa // fb)
        close((FA % FB).numpy(), fa % fb)
    s = np.array([1, -8, 3, 1, -1, 5, 2, 2], np.int32)
    t = np.array([3, 1, 40, 31, 33, 0, 1, 2], np.int32)
    S, T = rt.array(s, device=dev), rt.array(t, device=dev)
    close((S << T).numpy(), np.where(t >= 32, 0, s << np.minimum(t, 31)))
    close((S >> T).numpy(), np.where(t >= 32, np.where(s < 0, -1, 0), s >> np.minimum(t, 31)))
    x = np.array([np.nan, np.inf, -np.inf, 300.7, -300.7, 2.9, -2.9, 0.5], np.float32)
    for dtype in ("int8", "uint8", "int32", "int64"):
        cpu = rt.array(x, device="local-sync").astype(dtype).numpy()
        close(rt.array(x, device=dev).astype(dtype).numpy(), cpu)
    close(rt.full((5,), 2**40 + 1, dtype=rt.int64, device=dev).numpy(), np.full(5, 2**40 + 1))


def test_sign_of_zeros_and_nan(gpu_like):
    """sign(-0.0) is +0.0 (the array API, numpy), NaN stays NaN, in every float width."""
    for dtype in (np.float32, np.float64, np.float16):
        x = np.array([-0.0, 0.0, np.nan, -2.5, 3.0], dtype)
        got = rt.sign(rt.array(x, device=gpu_like)).numpy()
        np.testing.assert_array_equal(got, np.sign(x))
        assert not np.signbit(got[0]), dtype


# The smallest negative subnormals of float16 (2**-24) and bfloat16 (2**-133) step to -0 toward zero.
NEXTAFTER_A = [2.0, 1.0, 0.0, -0.0, -1.0, 65504.0, np.inf, -np.inf, 2.0 ** -14, 2.0 ** -24, np.nan, 3.0, 1.5,
               -(2.0 ** -24), -(2.0 ** -24), -(2.0 ** -133)]
NEXTAFTER_B = [1.0, 2.0, 1.0, -1.0, -2.0, np.inf, 0.0, 0.0, 0.0, 0.0, 1.0, 3.0, np.nan, 0.0, 1.0, 1.0]


def nextafter_16(a: np.ndarray, b: np.ndarray, mant: int, emin: int, max_finite: float) -> np.ndarray:
    """An independent nextafter of a 16-bit format by its bit patterns (float32's top 16 bits for
    bfloat16; numpy's own float16): the neighbour of a toward b."""
    if mant == 10:
        with np.errstate(over="ignore"):
            return np.nextafter(a.astype(np.float16), b.astype(np.float16)).astype(np.float64)
    out = []
    for x, y in zip(a.astype(np.float32), b.astype(np.float32)):
        if np.isnan(x) or np.isnan(y):
            out.append(np.nan)
            continue
        if x == y:
            out.append(float(y))
            continue
        bits = int(np.array(x, np.float32).view(np.uint32)) >> 16
        if x == 0:
            bits = 0x0001 | (0x8000 if y < 0 else 0)
        else:
            bits += 1 if (y > x) == (x > 0) else -1
        out.append(float(np.array(bits << 16, np.uint32).view(np.float32)))
    return np.array(out)


@pytest.mark.parametrize("dtype, mant", [("float16", 10), ("bfloat16", 7)])
def test_nextafter_steps_in_the_16_bit_format(gpu_like, dtype, mant):
    """nextafter of float16 (on GPUs) and bfloat16 (everywhere) returned its first operand: the step
    was a float32 one, which the 16-bit store rounded away."""
    a = np.array(NEXTAFTER_A, np.float32)
    b = np.array(NEXTAFTER_B, np.float32)
    want = nextafter_16(rt.astype(rt.array(a), getattr(rt, dtype)).astype(rt.float32).numpy().astype(np.float64),
                        rt.astype(rt.array(b), getattr(rt, dtype)).astype(rt.float32).numpy().astype(np.float64),
                        mant, 0, 0)
    cpu = hal.create_device("local-task")
    try:
        for device in (gpu_like, cpu):
            A = rt.astype(rt.array(a, device=device), getattr(rt, dtype))
            B = rt.astype(rt.array(b, device=device), getattr(rt, dtype))
            got = rt.nextafter(A, B).astype(rt.float64).numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{dtype} on {device.info.uri}")
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=f"{dtype} on {device.info.uri}")
    finally:
        cpu.close()


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_mean_of_64_bit_integers_does_not_wrap(gpu_like, dtype):
    """A mean of 64-bit integers summed in their own type wrapped past 2**63: the mean of seven
    nanosecond timestamps of 2023 came out negative. numpy sums them in float64; so does the runtime."""
    stamps = np.array([1_700_000_000_000_000_000 + i * 1_000_003 for i in range(7)], dtype)
    wide = (np.arange(3 * 300, dtype=np.uint64).reshape(3, 300) * np.uint64(2**62 // 300)).astype(dtype)
    cpu = hal.create_device("local-task")
    try:
        for device in (gpu_like, cpu):
            where = f"{dtype} on {device.info.uri}"
            got = rt.array(stamps, device=device).mean()
            assert got.dtype == rt.float64, where
            np.testing.assert_allclose(got.numpy(), stamps.mean(), rtol=1e-15, err_msg=where)
            w = rt.array(wide, device=device)
            for axis in (0, 1, None):
                np.testing.assert_allclose(rt.mean(w, axis=axis).numpy(), wide.mean(axis=axis), rtol=1e-15,
                                           err_msg=f"{where}, axis {axis}")
            # fused with the elementwise op that feeds it (a row program on GPUs)
            np.testing.assert_allclose(rt.mean(w + 3, axis=-1, keepdims=True).numpy(),
                                       (wide + 3).mean(axis=-1, keepdims=True), rtol=1e-15, err_msg=where)
    finally:
        cpu.close()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_scatter_add_sums_repeated_indices(gpu_like, dtype):
    """The gradient of a gather: values added at their indices (repeats summed) into zeros, indices past
    either end clamped as the unchecked gather clamps them."""
    rng = np.random.default_rng(11)
    values = rng.standard_normal(3000).astype(dtype)
    idx = rng.integers(-5, 105, 3000)
    want = np.zeros(100, dtype)
    np.add.at(want, np.clip(idx, 0, 99), values)
    got = rt.ops.scatter_add(rt.array(values, device=gpu_like), rt.array(idx, device=gpu_like), 100).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-4)
    empty = rt.ops.scatter_add(rt.array(values[:0], device=gpu_like), rt.array(idx[:0], device=gpu_like), 7)
    np.testing.assert_array_equal(empty.numpy(), np.zeros(7, dtype))
    # checked: the values at indices out of range are dropped, and reading the result raises IndexError
    inside = (idx >= 0) & (idx < 100)
    want = np.zeros(100, dtype)
    np.add.at(want, idx[inside], values[inside])
    fine = rt.ops.scatter_add(rt.array(values[inside], device=gpu_like), rt.array(idx[inside], device=gpu_like), 100,
                              rt.array(np.zeros(int(inside.sum()), bool), device=gpu_like))
    np.testing.assert_allclose(fine.numpy(), want, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-4)
    checked = rt.ops.scatter_add(rt.array(values, device=gpu_like), rt.array(idx, device=gpu_like), 100,
                                 rt.array(~inside, device=gpu_like))
    with pytest.raises(IndexError):
        checked.numpy()


def test_gradients_through_gathers_sort_and_scans_on_gpu_kernels(gpu_like):
    """The gradients of an embedding lookup, a sort and a cumulative sum, lowered as on a GPU."""
    rng = np.random.default_rng(12)
    table = rng.standard_normal((50, 8)).astype(np.float32)
    ids = rng.integers(0, 50, 300)
    w = rng.standard_normal((300, 8)).astype(np.float32)
    want = np.zeros_like(table)
    np.add.at(want, ids, w)
    t = rt.array(table, device=gpu_like)
    g = rt.grad(lambda t: (t[rt.array(ids, device=gpu_like)] * rt.array(w, device=gpu_like)).sum())(t)
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-5, atol=1e-5)
    x = rng.standard_normal((4, 300)).astype(np.float32)
    v = rng.standard_normal((4, 300)).astype(np.float32)
    xs, vs = rt.array(x, device=gpu_like), rt.array(v, device=gpu_like)
    order = np.argsort(x, axis=1, kind="stable")
    want = np.zeros_like(x)
    np.put_along_axis(want, order, v, axis=1)
    np.testing.assert_allclose(rt.grad(lambda a: (rt.sort(a, axis=1) * vs).sum())(xs).numpy(), want, rtol=1e-6)
    want = np.flip(np.cumsum(np.flip(v, 1), axis=1), 1)  # the reverse running sum of the cotangent
    np.testing.assert_allclose(rt.grad(lambda a: (rt.cumulative_sum(a, axis=1) * vs).sum())(xs).numpy(), want,
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int8", "int64", "uint8", "uint64",
                                   "bool", "complex64"])
def test_cumulative_sum_scans_every_dtype_and_axis(gpu_like, dtype):
    """The scan kernel (real dtypes; bool and complex take the log-step composition) against numpy's
    running sum: rows of one tile and of several, every axis, include_initial, empty axes; integers
    wrap as numpy's sum in the dtype does."""
    rng = np.random.default_rng(13)
    for shape, axis in (((5, 700), 1), ((700, 5), 0), ((3, 4, 300), 2), ((3, 300, 4), 1), ((257,), 0),
                        ((0, 5), 1), ((4, 0), 1)):
        if dtype == "bool":
            x = rng.random(shape) < 0.5
        elif dtype == "complex64":
            x = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
        elif dtype in ("float16", "bfloat16", "float32", "float64"):
            x = rng.standard_normal(shape).astype(np.float32 if dtype == "bfloat16" else dtype)
        else:
            x = rng.integers(-200, 200, shape).astype(dtype)
        X = rt.astype(rt.array(x, device=gpu_like), getattr(rt, dtype))
        host = X.astype(rt.float64).numpy() if dtype in ("float16", "bfloat16") else x
        for initial in (False, True):
            want = np.cumsum(host, axis=axis)
            if initial:
                want = np.concatenate([np.zeros_like(want.take([0], axis=axis)) if want.shape[axis] else
                                       np.zeros(want.shape[:axis] + (1,) + want.shape[axis + 1:], want.dtype), want],
                                      axis=axis)
            got = rt.cumulative_sum(X, axis=axis, include_initial=initial)
            where = f"{dtype} {shape} axis {axis} initial {initial}"
            if dtype in ("float16", "bfloat16"):
                tol = 2e-2 if dtype == "float16" else 5e-2
                np.testing.assert_allclose(got.astype(rt.float64).numpy(), want, rtol=tol,
                                           atol=tol * max(1.0, float(np.abs(want).max()) if want.size else 1.0),
                                           err_msg=where)
            elif dtype in ("float32", "float64", "complex64"):
                tol = 1e-12 if dtype == "float64" else 1e-4
                np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol * 10, err_msg=where)
            else:
                assert got.dtype == want.dtype, where
                np.testing.assert_array_equal(got.numpy(), want, err_msg=where)
    if dtype == "int8":  # the running sum in the dtype itself wraps as numpy's
        y = rt.array(np.array([[100, 100, 100, -128]], np.int8), device=gpu_like)
        np.testing.assert_array_equal(rt.cumulative_sum(y, axis=1, dtype=rt.int8).numpy(), [[100, -56, 44, -84]])
