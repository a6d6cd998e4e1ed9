"""The device-side workloads of ``workload_bench.py``: shapes, the runtime's composition, PyTorch's
composition of the same ops, and a numpy reference.

PyTorch's compositions use tensor methods only, so this module imports without torch and
torch.compile traces nothing but the ops.

Each composition is written the way a user writes it (array ops, no fused library call), the same
ops on each side, so a ratio measures how well each side runs that composition.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import runtime as rt

EPS = 1e-5  # the layer norm's variance epsilon


@dataclass
class Case:
    """One workload: ``make(rng, quick)`` gives the host inputs (float32 numpy arrays); ``dtype`` is the
    dtype they take on the device. ``flop(inputs)`` gives TFLOP/s; a bandwidth-bound case reports GB/s
    counting one read of every input and one write of the output, the least any kernel moves."""

    name: str
    title: str
    make: Callable[[np.random.Generator, bool], list[np.ndarray]]
    runtime: Callable
    torch: Callable
    numpy: Callable
    dtype: str = "float32"
    flop: Callable[[list[np.ndarray]], float] | None = None
    bandwidth_bound: bool = False
    tolerance: float = 1e-4  # max |ours - reference| / max |reference|
    #: Also time each call to its result, one at a time: for work so small that a queued loop
    #: measures the host's cost per call rather than the device's.
    synced: bool = False
    #: Also time the composition under ``rt.compile`` (``runtime_compile``), the counterpart of
    #: torch.compile of the same function: one recorded graph replayed, no nodes built a call.
    compiled: bool = False


def normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


# ---- products -----------------------------------------------------------------------------------

def matmul_case(name: str, n: int, quick_n: int, dtype: str, tolerance: float, synced: bool = False) -> Case:
    def make(rng, quick):
        m = quick_n if quick else n
        return [normal(rng, m, m), normal(rng, m, m)]

    return Case(name, f"matmul {n}² {dtype}", make, lambda a, b: a @ b, lambda a, b: a @ b,
                lambda a, b: a @ b, dtype=dtype, tolerance=tolerance, synced=synced,
                flop=lambda ins: 2.0 * ins[0].shape[0] * ins[0].shape[1] * ins[1].shape[1])


def batched_make(rng, quick):
    b, m, k = (8, 64, 32) if quick else (64, 512, 64)
    return [normal(rng, b, m, k), normal(rng, b, k, m)]


BATCHED = Case("batched_matmul_float32", "batched matmul 64×(512×64 @ 64×512) float32", batched_make,
               lambda a, b: a @ b, lambda a, b: a @ b, lambda a, b: a @ b,
               flop=lambda ins: 2.0 * ins[0].shape[0] * ins[0].shape[1] * ins[0].shape[2] * ins[1].shape[2])


# ---- row reductions written as composed ops -----------------------------------------------------

def rows_make(rng, quick):
    return [normal(rng, *((256, 512) if quick else (8192, 4096)))]


def softmax_rt(x):
    e = rt.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_torch(x):
    e = (x - x.amax(dim=-1, keepdim=True)).exp()
    return e / e.sum(dim=-1, keepdim=True)


def softmax_np(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm_make(rng, quick):
    (x,) = rows_make(rng, quick)
    return with_norm_weights(rng, x)


def with_norm_weights(rng, x):
    return [x, 1.0 + 0.1 * normal(rng, x.shape[1]), 0.1 * normal(rng, x.shape[1])]


def long_rows_make(rng, quick):
    """Rows of more than 16384 elements: one workgroup of 1024 threads an SM holds a row in registers
    (float32; longer rows stream, read once a phase)."""
    return [normal(rng, *((16, 20000) if quick else (1024, 32768)))]


def rows_16k_make(rng, quick):
    """Rows of 16384 elements: 512 threads of 32 elements, two workgroups an SM."""
    return [normal(rng, *((16, 16384) if quick else (2048, 16384)))]


def few_rows_make(rng, quick):
    """Few very long rows: each split into chunks, a dispatch a phase over every chunk."""
    return [normal(rng, *((2, 40000) if quick else (8, 1 << 22)))]


def long_layer_norm_make(rng, quick):
    (x,) = long_rows_make(rng, quick)
    return with_norm_weights(rng, x)


def layer_norm_rt(x, gamma, beta):
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / rt.sqrt(var + EPS) * gamma + beta


def layer_norm_torch(x, gamma, beta):
    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    return centred / (var + EPS).sqrt() * gamma + beta


def layer_norm_np(x, gamma, beta):
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + EPS) * gamma + beta


# ---- gradients of the row compositions ------------------------------------------------------------

def gradient_make(rng, quick):
    """Rows and the cotangent the gradient is taken against."""
    (x,) = rows_make(rng, quick)
    return [x, normal(rng, *x.shape)]


def softmax_grad_rt(x, g):
    return rt.grad(lambda v: (softmax_rt(v) * g).sum())(x)


def softmax_grad_torch(x, g):
    x = x.detach().requires_grad_()
    (softmax_torch(x) * g).sum().backward()
    return x.grad


def softmax_grad_np(x, g):
    y = softmax_np(x)
    return y * (g - (g * y).sum(axis=-1, keepdims=True))


def layer_norm_grad_make(rng, quick):
    x, g = gradient_make(rng, quick)
    return [x, g, *with_norm_weights(rng, x)[1:]]


def layer_norm_grad_rt(x, g, gamma, beta):
    return rt.grad(lambda v: (layer_norm_rt(v, gamma, beta) * g).sum())(x)


def layer_norm_grad_torch(x, g, gamma, beta):
    x = x.detach().requires_grad_()
    (layer_norm_torch(x, gamma, beta) * g).sum().backward()
    return x.grad


def layer_norm_grad_np(x, g, gamma, beta):
    centred = x - x.mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + EPS)
    xhat, gw = centred * inv, g * gamma
    return inv * (gw - gw.mean(axis=-1, keepdims=True) - xhat * (gw * xhat).mean(axis=-1, keepdims=True))


def cross_entropy_make(rng, quick):
    """Logits over a vocabulary of 32000 and a label a row (as float32 indices: every input is float32
    on the host; the compositions take them as integers)."""
    rows, n = (64, 1000) if quick else (4096, 32000)
    return [normal(rng, rows, n), rng.integers(0, n, rows).astype(np.float32)]


def vocabulary_make(rng, quick):
    """Logits over a vocabulary of 128256 (a large language model's), 2048 rows."""
    rows, n = (32, 5000) if quick else (2048, 128256)
    return [normal(rng, rows, n), rng.integers(0, n, rows).astype(np.float32)]


def cross_entropy_rt(x, labels):
    m = x.max(axis=-1, keepdims=True)
    lse = m[:, 0] + rt.log(rt.exp(x - m).sum(axis=-1))
    return (lse - rt.take_along_axis(x, labels.astype(rt.int64)[:, None], axis=1)[:, 0]).mean()


def cross_entropy_torch(x, labels):
    m = x.amax(dim=-1, keepdim=True)
    lse = m[:, 0] + (x - m).exp().sum(dim=-1).log()
    return (lse - x.gather(1, labels.long()[:, None])[:, 0]).mean()


def cross_entropy_np(x, labels):
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=-1))
    return np.asarray((lse - x[np.arange(len(x)), labels.astype(np.int64)]).mean())


def embedding_make(rng, quick):
    """A table of 50000 rows of 1024, 32x1024 token ids (as float32) and positions of 1024x1024."""
    rows, width, batch, seq = (500, 64, 4, 32) if quick else (50000, 1024, 32, 1024)
    return [normal(rng, rows, width), rng.integers(0, rows, (batch, seq)).astype(np.float32), normal(rng, seq, width)]


def embedding_rt(table, ids, pos):
    return rt.take(table, ids.astype(rt.int64), axis=0) + pos


def embedding_torch(table, ids, pos):
    return table[ids.long()] + pos


def embedding_np(table, ids, pos):
    return table[ids.astype(np.int64)] + pos


def columns_make(rng, quick):
    """The embedding's table and ids: the lookup reads the first half of the columns, a view (the
    other half might be another head's)."""
    return embedding_make(rng, quick)[:2]


def take_columns_rt(table, ids):
    return rt.take(table[:, :table.shape[1] // 2], ids.astype(rt.int64), axis=0)


def take_columns_torch(table, ids):
    return table[:, :table.shape[1] // 2][ids.long()]


def take_columns_np(table, ids):
    return table[:, :table.shape[1] // 2][ids.astype(np.int64)]


def cross_entropy_grad_rt(x, labels):
    def loss(v):
        m = v.max(axis=-1, keepdims=True)
        lse = m[:, 0] + rt.log(rt.exp(v - m).sum(axis=-1))
        return (lse - rt.take_along_axis(v, labels.astype(rt.int64)[:, None], axis=1)[:, 0]).mean()

    return rt.grad(loss)(x)


def cross_entropy_grad_torch(x, labels):
    x = x.detach().requires_grad_()
    m = x.amax(dim=-1, keepdim=True)
    lse = m[:, 0] + (x - m).exp().sum(dim=-1).log()
    (lse - x.gather(1, labels.long()[:, None])[:, 0]).mean().backward()
    return x.grad


def cross_entropy_grad_np(x, labels):
    g = softmax_np(x.astype(np.float64))
    g[np.arange(len(x)), labels.astype(np.int64)] -= 1
    return g / len(x)


# ---- strided reductions and copies --------------------------------------------------------------

def square_make(rng, quick):
    return [normal(rng, *((512, 384) if quick else (8192, 8192)))]


# ---- joining arrays -------------------------------------------------------------------------------

def halves_make(rng, quick):
    shape = (256, 192) if quick else (8192, 2048)
    return [normal(rng, *shape), normal(rng, *shape)]


def concat_torch(a, b):
    import torch  # (only where PyTorch's baseline runs: this module imports without it)

    return torch.cat((a, b), dim=1)


# ---- an elementwise chain (8 ops: one fused pass for the runtime, 8 kernels for PyTorch eager) --

def chain_make(rng, quick):
    return [rng.uniform(-1.0, 1.0, (1 << 16) if quick else (64 << 20)).astype(np.float32)]


def chain(x, sqrt, tanh):
    y = x * 1.5
    y = y + 0.5
    y = y * x
    y = y - 0.25
    y = abs(y)
    y = sqrt(y)
    y = y + 1.0
    return tanh(y)


def chain_torch(x):
    return chain(x, lambda t: t.sqrt(), lambda t: t.tanh())


# ---- sorting (a merge sort on the device; PyTorch's is a radix sort) ------------------------------

def vector_make(rng, quick):
    return [normal(rng, (1 << 12) if quick else (1 << 20))]


def sort_rows_make(rng, quick):
    return [normal(rng, *((64, 512) if quick else (4096, 4096)))]


def short_rows_make(rng, quick):
    return [normal(rng, *((1024, 64) if quick else (65536, 64)))]


def sort_case(name: str, title: str, make) -> Case:
    return Case(name, title, make, lambda x: rt.sort(x, axis=-1), lambda x: x.sort(dim=-1, stable=True).values,
                lambda x: np.sort(x, axis=-1, kind="stable"), bandwidth_bound=True, tolerance=0.0)


# ---- running sums --------------------------------------------------------------------------------

def steps_make(rng, quick):
    """Steps of -1, 0 or 1 (as float32): every running sum is an integer float32 holds exactly, so any
    order of the additions gives the same result."""
    return [rng.integers(-1, 2, (1 << 12) if quick else (1 << 24)).astype(np.float32)]


def dtype_tags(dtype: str) -> tuple[str, str]:
    """(the case name's part, the title's part) naming a dtype other than float32 (float32: none)."""
    return ("", "") if dtype == "float32" else (f"_{dtype}", f" {dtype}")


def softmax_case(rows: int, n: int, make, dtype: str = "float32", tolerance: float = 1e-4) -> Case:
    name, title = dtype_tags(dtype)
    return Case(f"softmax{name}_{rows}x{n}", f"softmax over rows of {rows}×{n}{title}, composed ops", make,
                softmax_rt, softmax_torch, softmax_np, dtype=dtype, bandwidth_bound=True, compiled=True,
                tolerance=tolerance)


def layer_norm_case(rows: int, n: int, make, dtype: str = "float32", tolerance: float = 1e-4) -> Case:
    name, title = dtype_tags(dtype)
    return Case(f"layer_norm{name}_{rows}x{n}", f"layer norm {rows}×{n}{title}, composed ops", make,
                layer_norm_rt, layer_norm_torch, layer_norm_np, dtype=dtype, bandwidth_bound=True, compiled=True,
                tolerance=tolerance)


CASES = [
    matmul_case("matmul_4096_float32", 4096, 192, "float32", 1e-4),
    matmul_case("matmul_4096_float16", 4096, 192, "float16", 1e-2),
    matmul_case("matmul_4096_bfloat16", 4096, 192, "bfloat16", 2e-2),
    BATCHED,
    matmul_case("matmul_256_float32", 256, 64, "float32", 1e-4, synced=True),
    softmax_case(8192, 4096, rows_make),
    layer_norm_case(8192, 4096, layer_norm_make),
    softmax_case(1024, 32768, long_rows_make),
    layer_norm_case(1024, 32768, long_layer_norm_make),
    softmax_case(2048, 16384, rows_16k_make),
    softmax_case(8, 4194304, few_rows_make),
    layer_norm_case(8192, 4096, layer_norm_make, "bfloat16", 3e-2),
    softmax_case(8192, 4096, rows_make, "bfloat16", 3e-2),
    Case("softmax_grad_8192x4096", "softmax's gradient over rows of 8192×4096, composed ops", gradient_make,
         softmax_grad_rt, softmax_grad_torch, softmax_grad_np, bandwidth_bound=True, compiled=True),
    Case("layer_norm_grad_8192x4096", "layer norm's gradient over rows of 8192×4096, composed ops",
         layer_norm_grad_make, layer_norm_grad_rt, layer_norm_grad_torch, layer_norm_grad_np,
         bandwidth_bound=True, compiled=True),
    Case("cross_entropy_grad_4096x32000", "cross entropy's gradient over 4096 rows of 32000 logits, composed ops",
         cross_entropy_make, cross_entropy_grad_rt, cross_entropy_grad_torch, cross_entropy_grad_np,
         bandwidth_bound=True, compiled=True),
    Case("cross_entropy_2048x128256", "cross entropy over 2048 rows of 128256 logits, composed ops",
         vocabulary_make, cross_entropy_rt, cross_entropy_torch, cross_entropy_np, bandwidth_bound=True,
         compiled=True),
    Case("embedding_32x1024_of_50000x1024", "embedding lookup plus positions, 32×1024 ids into 50000×1024",
         embedding_make, embedding_rt, embedding_torch, embedding_np, compiled=True, tolerance=0.0),
    Case("take_columns_32x1024_of_50000x512", "embedding lookup from half the columns of a 50000×1024 table "
         "(a strided view), 32×1024 ids", columns_make, take_columns_rt, take_columns_torch, take_columns_np,
         compiled=True, tolerance=0.0),
    Case("column_sum_8192x8192", "column sum of 8192×8192", square_make, lambda x: x.sum(axis=0),
         lambda x: x.sum(dim=0), lambda x: x.sum(axis=0), bandwidth_bound=True),
    Case("transposed_copy_8192x8192", "transposed copy 8192×8192", square_make, lambda x: x.T.copy(),
         lambda x: x.t().contiguous(), lambda x: np.ascontiguousarray(x.T), bandwidth_bound=True, tolerance=0.0),
    Case("concat_8192x4096", "concat of two 8192×2048 along their rows", halves_make,
         lambda a, b: rt.concat([a, b], axis=1), concat_torch, lambda a, b: np.concatenate([a, b], axis=1),
         bandwidth_bound=True, tolerance=0.0),
    Case("elementwise_chain_64M", "8-op elementwise chain over 64M float32", chain_make,
         lambda x: chain(x, rt.sqrt, rt.tanh), chain_torch, lambda x: chain(x, np.sqrt, np.tanh),
         bandwidth_bound=True),
    sort_case("sort_1048576", "sort of 2**20 float32", vector_make),
    sort_case("sort_rows_4096x4096", "sort of each row of 4096×4096 float32", sort_rows_make),
    Case("argsort_65536x64", "argsort of each row of 65536×64 float32", short_rows_make,
         lambda x: rt.argsort(x, axis=-1), lambda x: x.argsort(dim=-1, stable=True),
         lambda x: np.argsort(x, axis=-1, kind="stable"), bandwidth_bound=True, tolerance=0.0),
    Case("cumsum_16777216", "running sum of 2**24 float32", steps_make, lambda x: rt.cumulative_sum(x),
         lambda x: x.cumsum(dim=0), lambda x: np.cumsum(x), bandwidth_bound=True, tolerance=0.0),
    # A CPU driver's product: numpy's BLAS on both sides.
    matmul_case("matmul_1024_float32", 1024, 128, "float32", 1e-4),
]
BY_NAME = {case.name: case for case in CASES}
