"""Reductions fused with their neighbours on GPU lowering: row programs and column reductions.

Softmax, log-softmax, layer norm, RMS norm and a mean-squared error written as
composed ops are each scheduled as one kernel; the values match numpy for odd
sizes, rows longer than the register limit, split rows, strided inputs and
every float type. The GPU path runs on a local-sync device that claims to be
a GPU, with its kernels either the generated CUDA C compiled for the CPU
(cuda_emu) or the programs' numpy implementations.
"""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import failures_in_threads

import runtime as rt
from runtime.device import context_for
from runtime.kernels import reduce_columns, rows

cuda_emu = pytest.importorskip("cuda_emu")


@pytest.fixture(autouse=True)
def fuse_at_once(monkeypatch):
    monkeypatch.setenv("RUNTIME_FUSE_AFTER", "1")


@pytest.fixture(autouse=True)
def fresh_plans():
    """Each test plans its graphs anew: many set the planner's limits, which the graph cache's keys do
    not hold (a recording planned under another test's limits would be replayed, its buffers alike)."""
    rt.clear_graph_cache()
    yield
    rt.clear_graph_cache()




def test_a_long_chain_into_a_reduction_is_cut_at_max_ops(gpu_like, recordings, monkeypatch):
    """The row group took in the whole chain feeding its reduction, recursively: 1,500 ops raised
    RecursionError, and a program of hundreds of ops took NVRTC minutes. Now at most MAX_OPS ops a
    program; the rest of the chain runs as fused kernels of its own."""
    from runtime.kernels import fused

    monkeypatch.setattr(fused, "MAX_OPS", 16)
    specs = []
    real = rows.rows_source

    def spy(spec, config):
        specs.append(spec)
        return real(spec, config)

    monkeypatch.setattr(rows, "rows_source", spy)
    h = np.linspace(-1, 1, 8 * 40, dtype=np.float32).reshape(8, 40)
    x = rt.array(h, device=gpu_like)
    for _ in range(1500):
        x = x * 0.999 + 0.001
        h = (h * np.float32(0.999) + np.float32(0.001)).astype(np.float32)
    y = x - x.max(axis=-1, keepdims=True)
    np.testing.assert_allclose(y.numpy(), h - h.max(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert specs and max(len(spec.members) for spec in specs) <= 16


# ---- the compositions, on runtime arrays and on numpy (float64) --------------------------------

def softmax(x, xp=rt):
    e = xp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_softmax(x, xp=rt):
    s = x - x.max(axis=-1, keepdims=True)
    return s - xp.log(xp.exp(s).sum(axis=-1, keepdims=True))


def layer_norm(x, w, b, xp=rt):
    mean = x.mean(axis=-1, keepdims=True)
    c = x - mean
    var = (c * c).mean(axis=-1, keepdims=True)
    return c / xp.sqrt(var + 1e-5) * w + b


def rms_norm(x, w, xp=rt):
    return x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


def mse(a, b, xp=rt):
    d = a - b
    return (d * d).mean()


CASES = {
    "softmax": (lambda x, w, b, y, xp=rt: softmax(x, xp)),
    "log_softmax": (lambda x, w, b, y, xp=rt: log_softmax(x, xp)),
    "layer_norm": (lambda x, w, b, y, xp=rt: layer_norm(x, w, b, xp)),
    "rms_norm": (lambda x, w, b, y, xp=rt: rms_norm(x, w, xp)),
    "mse": (lambda x, w, b, y, xp=rt: mse(x, y, xp)),
}

TOL = {"float32": 2e-5, "float64": 1e-11, "float16": 2e-2, "bfloat16": 8e-2}


def operands(shape, dtype, rng, device, transform=None):
    n = shape[-1]
    host = [rng.standard_normal(shape), rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(shape)]
    host = [h.astype(np.float32).astype(np.float64) for h in host]
    arrays = [rt.array(h, device=device).astype(dtype) for h in host]
    if dtype in ("float16", "bfloat16"):  # the reference sees the rounded values
        host = [a.astype(rt.float32).numpy().astype(np.float64) for a in arrays]
    rt.eval(*arrays)
    if transform is not None:
        arrays[0], host[0] = transform(arrays[0]), transform(host[0])
    return arrays, host


def check(case, arrays, host, dtype):
    got = CASES[case](*arrays)
    want = CASES[case](*host, xp=np)
    assert got.dtype == getattr(rt, dtype)
    got = got.astype(rt.float32).numpy() if dtype in ("float16", "bfloat16") else got.numpy()
    tol = TOL[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# ---- one kernel each -----------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_each_composition_is_one_kernel(gpu_like, recordings, case):
    arrays, host = operands((6, 40), "float32", np.random.default_rng(0), gpu_like)
    recordings.clear()
    check(case, arrays, host, "float32")
    rec = recordings[-1]
    assert (rec.dispatches, rec.fused) == (1, 1)
    assert len(rec.fresh) == 1, "only the result gets a buffer"


def test_shared_reductions_and_materialized_members(gpu_like, recordings):
    """Two reductions of one input share the pass; a member read after the eval is also written."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 33)).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    m = X.mean(axis=-1, keepdims=True)
    var = (X * X).mean(axis=-1, keepdims=True) - m * m
    rt.eval(var, m)
    assert recordings[-1].dispatches == 1
    np.testing.assert_allclose(var.numpy(), x.var(axis=-1, keepdims=True), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(m.numpy(), x.mean(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)


# ---- values --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(3, 7), (4, 128), (2, 3, 33), (5, 1001), (1, 2)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_values_match_numpy(gpu_like, case, shape):
    arrays, host = operands(shape, "float32", np.random.default_rng(len(shape) + shape[-1]), gpu_like)
    check(case, arrays, host, "float32")


@pytest.mark.parametrize("view", ["offset", "step", "transposed"])
@pytest.mark.parametrize("case", ["softmax", "layer_norm", "mse"])
def test_strided_inputs(gpu_like, recordings, case, view):
    transform = {"offset": lambda a: a[1:, 3:], "step": lambda a: a[:, ::2],
                 "transposed": lambda a: a.T[:, :-1]}[view]
    arrays, host = operands((12, 12), "float32", np.random.default_rng(3), gpu_like)
    arrays[0], host[0] = transform(arrays[0]), transform(host[0])
    arrays[1:3] = [a[:arrays[0].shape[-1]] for a in arrays[1:3]]
    host[1:3] = [h[:host[0].shape[-1]] for h in host[1:3]]
    rows_, cols = host[0].shape
    arrays[3], host[3] = arrays[3][:rows_, :cols], host[3][:rows_, :cols]
    recordings.clear()
    check(case, arrays, host, "float32")
    # (a full reduction reads its operands as one row: a view that does not flatten is read by a kernel of
    # its own first)
    assert recordings[-1].dispatches == (1 if case != "mse" else 2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_float_types(gpu_like, case, dtype):
    arrays, host = operands((3, 68), dtype, np.random.default_rng(4), gpu_like)
    check(case, arrays, host, dtype)


def _rounding_rows(dtype: str) -> np.ndarray:
    """Rows whose values, cast to a narrow float and run through exactly rounded ops, meet ties,
    subnormal results, overflow to infinity, infinities and NaN. Each row's largest value is unique
    (the largest of +0 and -0 is either, by the order a reduction takes)."""
    rng = np.random.default_rng(11)
    tiny, huge = (1e-39, 1e38) if dtype == "bfloat16" else (1e-6, 4e4)
    host = np.stack([rng.standard_normal(96) * scale for scale in (1.0, 37.0, tiny * 10, tiny, huge, 1.0, 1.0)])
    host[0, 1:8] = [1.5, 3.0, 0.75, -2.5, 129.0, 257.0, -0.0]  # products of 3 and quotients of 7 that tie
    host[:, 0] = np.abs(host).max(axis=1) * 1.25
    host[4, 3] = -huge * 1.5  # minus the largest: overflows
    host[5, 2], host[5, 7] = np.inf, -np.inf  # the largest is inf; inf - inf is NaN
    host[6, 9] = np.nan
    return host.astype(np.float32)


def _check_narrow_rounding(device, dtype):
    def composition(x):
        return (x - x.max(axis=-1, keepdims=True)) * 3 / 7 + x

    host = _rounding_rows(dtype)
    got = composition(rt.array(host, device=device).astype(dtype)).astype(rt.float32).numpy()
    want = composition(rt.array(host, device="local-sync").astype(dtype)).astype(rt.float32).numpy()
    smallest_normal = 2.0 ** -126 if dtype == "bfloat16" else 2.0 ** -14
    finite = np.abs(want[np.isfinite(want)])
    assert np.isnan(want).any() and np.isinf(want).any() and ((finite > 0) & (finite < smallest_normal)).any()
    nan = np.isnan(want)  # (a NaN's sign and payload are the hardware's: a float16 NaN's differ)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrow_rows_round_as_their_ops_do(dev, dtype):
    """A narrow-float row program rounds every value it keeps as a store and a load would: bit for bit
    what the same ops give one at a time on a CPU driver (numpy), where a GPU rounds with its
    conversion instructions, a NaN as a NaN. The ops are exactly rounded ones (max, subtraction,
    product, quotient)."""
    _check_narrow_rounding(dev, dtype)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrow_rows_round_as_their_ops_do_in_emulation(gpu_like, recordings, dtype):
    """The same, as one row program in the CUDA C compiled for the CPU and in its numpy twin."""
    _check_narrow_rounding(gpu_like, dtype)
    assert any(rec.fused for rec in recordings)


@pytest.fixture
def chosen(monkeypatch):
    """The mappings the row programs of the test were given."""
    made = []
    real = rows.choose

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(rows, "choose", spy)
    return made


@pytest.mark.parametrize("case", ["softmax", "layer_norm", "log_softmax"])
def test_rows_beyond_the_register_limit_stream_in_every_phase(gpu_like, monkeypatch, chosen, case):
    monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)  # rows over 1024 elements take loop mode
    monkeypatch.setattr(rows, "LONG_PER_THREAD", 1)
    arrays, host = operands((2, 1500), "float32", np.random.default_rng(5), gpu_like)
    check(case, arrays, host, "float32")
    arrays, host = operands((3, 1027), "float32", np.random.default_rng(6), gpu_like)
    check(case, arrays, host, "float32")
    assert chosen and all(c.loop for c in chosen)


@pytest.mark.parametrize("case", ["softmax", "layer_norm", "log_softmax", "rms_norm"])
def test_long_rows_in_registers_of_1024_threads(gpu_like, monkeypatch, chosen, case):
    """Rows past the register limit of the usual mapping stay in registers, 1024 threads a row, while
    the program's 32-bit values fit the long-row budget (scaled down here: rows over 1024 elements
    and up to 4096 take it, at 2 or 4 elements a thread)."""
    monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)
    monkeypatch.setattr(rows, "LONG_PER_THREAD", 4)
    monkeypatch.setattr(rows, "LONG_REGISTER_BUDGET", 8 * 4)
    for shape, seed in (((2, 1500), 5), ((3, 1027), 6), ((2, 4096), 7)):
        arrays, host = operands(shape, "float32", np.random.default_rng(seed), gpu_like)
        check(case, arrays, host, "float32")
    assert chosen and all((c.T, c.loop) == (1024, False) and c.E in (2, 4) for c in chosen)


def _softmax_spec(d):
    A = rt.float32 if d is not rt.float64 else d
    return rows.RowSpec(((d, "v"),), (
        ("red", "max", d, d, (("i", 0),)),
        ("ew", "sub", A, d, (("i", 0), ("m", 0))),
        ("ew", "exp", A, d, (("m", 1),)),
        ("red", "sum", d, d, (("m", 2),)),
        ("ew", "div", A, d, (("m", 2), ("m", 3)))), (False, True, True, False, True), (4,))


def test_long_row_mode_takes_32_bit_values_within_budget():
    f32 = _softmax_spec(rt.float32)
    for n, vec in ((16385, 1), (20000, 4), (32768, 4)):
        c = rows.choose(f32, 1024, n, True)
        assert (c.T, c.RPB, c.E, c.VEC, c.loop) == (1024, 1, 32, vec, False)
    assert rows.choose(_softmax_spec(rt.float16), 1024, 32768, True).E == 32  # (computed in float)
    assert rows.choose(f32, 1024, 32769, True).loop  # longer than 1024 x 32
    assert rows.choose(_softmax_spec(rt.float64), 1024, 20000, True).loop  # 32 doubles fill a thread
    chain = tuple(("ew", "exp", rt.float32, rt.float32, (("m", k - 1) if k else ("i", 0),)) for k in range(8))
    nine = rows.RowSpec(((rt.float32, "v"),), chain + (("red", "sum", rt.float32, rt.float32, (("m", 7),)),),
                        (True,) * 8 + (False,), (8,))
    assert rows.choose(nine, 1024, 20000, True).loop  # 9 values x 32 > the budget of 256
    c = rows.choose(nine, 1024, 16384, True)  # (the usual mapping: 1024 x 16)
    assert (c.T, c.E, c.loop) == (1024, 16, False)


def test_rows_of_16384_take_two_workgroups_an_sm():
    """Rows that would take 1024 threads of 16 elements take 512 of 32 where the values fit (two
    workgroups an SM), and keep 1024 x 16 where they do not (doubles, many values)."""
    for n in (8193, 16384):
        c = rows.choose(_softmax_spec(rt.float32), 1024, n, True)
        assert (c.T, c.RPB, c.E, c.loop) == (512, 1, 32, False)
    c = rows.choose(_softmax_spec(rt.float64), 1024, 16384, True)
    assert (c.T, c.E, c.loop) == (1024, 16, False)
    c = rows.choose(_softmax_spec(rt.float32), 1024, 8192, True)
    assert (c.T, c.E) == (512, 16)  # (shorter rows: as before)


def _norm_spec(d, late_weights: bool = False):
    """A layer norm's program over rows of ``d`` (x, weight, bias), as the lowering makes it."""
    A = rt.float32 if d is not rt.float64 else d
    return rows.RowSpec(((d, "v"), (d, "v"), (d, "v")), (
        ("red", "sum", d, d, (("i", 0),)),
        ("ew", "sub", A, d, (("i", 0), ("m", 0))),
        ("ew", "square", A, d, (("m", 1),)),
        ("red", "sum", d, d, (("m", 2),)),
        ("ew", "div", A, d, (("m", 1), ("m", 3))),
        ("ew", "mul", A, d, (("m", 4), ("i", 1))),
        ("ew", "add", A, d, (("m", 5), ("i", 2)))),
        (False, True, True, False, True, True, True), (6,))


def test_narrow_rows_take_twice_the_elements_a_thread():
    """Rows of 16-bit values: a thread keeps 32 elements, in workgroups of 128 threads, so that its
    loads bring as many bytes as a 32-bit row's 16 do; 32-bit rows keep 256 threads of 16, and a
    narrow program whose values would exceed the register budget at 32 a thread keeps 16."""
    for d in (rt.bfloat16, rt.float16):
        c = rows.choose(_softmax_spec(d), 8192, 4096, True)
        assert (c.T, c.RPB, c.E, c.VEC, c.loop) == (128, 1, 32, 4, False)
        c = rows.choose(_softmax_spec(d), 65536, 512, True)
        assert (c.T, c.RPB, c.E) == (16, 8, 32)
        c = rows.choose(_norm_spec(d), 8192, 4096, True)
        assert (c.T, c.RPB, c.E) == (256, 1, 16)
    c = rows.choose(_softmax_spec(rt.float32), 8192, 4096, True)
    assert (c.T, c.RPB, c.E) == (256, 1, 16)


def test_a_pass_loads_its_vectors_first_where_a_thread_keeps_many():
    """``loads_first``: register mode with at least PREFETCH_MIN_E elements a thread loads every vector
    of the row in a pass before it converts any; fewer elements, streamed rows and the vectors loaded
    late keep the load beside its use, and 16-bit programs with late vectors keep it too."""
    f32, bf16 = _norm_spec(rt.float32), _norm_spec(rt.bfloat16)
    softmax = _softmax_spec(rt.bfloat16)
    assert rows.loads_first(softmax, rows.Config(128, 1, 32, 4, False))
    assert not rows.loads_first(softmax, rows.Config(256, 1, 16, 4, False))
    assert not rows.loads_first(softmax, rows.Config(1024, 1, 32, 4, True))
    assert rows.loads_first(f32, rows.Config(1024, 1, 32, 4, False, late=(1, 2)))
    assert not rows.loads_first(bf16, rows.Config(512, 1, 32, 4, False, late=(1, 2)))
    assert rows.loads_first(bf16, rows.Config(512, 1, 32, 4, False))

    def body(spec, config):
        source = rows.rows_source(spec, config).body()
        return source[source.index("__global__"):]

    first = body(softmax, rows.Config(128, 1, 32, 4, False, prefetch=True))
    assert "rt_vec4<unsigned short> w0[E / VEC];" in first
    assert first.index("w0[q] = reinterpret_cast") < first.index("bf16_to_f32(w0[q].v[e])")
    beside = body(softmax, rows.Config(128, 1, 32, 4, False))
    assert "w0[E / VEC]" not in beside and "const rt_vec4<unsigned short> w0 = " in beside
    weights_late = body(f32, rows.Config(1024, 1, 32, 4, False, late=(1, 2), prefetch=True))
    assert "float w0[E / VEC]" not in weights_late  # (float vectors: rt_vec4<float>)
    assert "rt_vec4<float> w0[E / VEC];" in weights_late
    assert "w1[E / VEC]" not in weights_late and "const rt_vec4<float> w1 = " in weights_late


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", ["softmax", "layer_norm", "log_softmax", "rms_norm"])
def test_loading_a_pass_first_gives_the_same_bits(gpu_like, monkeypatch, chosen, case, dtype):
    """The order of the loads changes no value: the same program with its vectors loaded first and
    beside their use gives the same bits (scaled down: every mapping of 4 elements a thread or more
    loads first), and both agree with numpy."""
    arrays, host = operands((5, 640), dtype, np.random.default_rng(21), gpu_like)
    results = []
    for least in (4, 1 << 30):
        monkeypatch.setattr(rows, "PREFETCH_MIN_E", least)
        rt.clear_graph_cache()
        check(case, arrays, host, dtype)
        results.append(np.asarray(CASES[case](*arrays).astype(rt.float32)).view(np.uint32))
    np.testing.assert_array_equal(results[0], results[1])
    prefetched = [c.prefetch for c in chosen]
    if dtype != "float32" and case in ("layer_norm", "rms_norm"):
        assert not any(prefetched)  # 16-bit rows whose weights are loaded late: beside their use
    else:
        assert any(prefetched) and not all(prefetched)


@pytest.mark.parametrize("case", ["softmax", "layer_norm"])
def test_two_workgroups_an_sm_values(gpu_like, monkeypatch, chosen, case):
    """The same mapping computes the same values (scaled down: rows over 512 elements would take
    1024 threads of 4)."""
    monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)
    arrays, host = operands((3, 1000), "float32", np.random.default_rng(13), gpu_like)
    check(case, arrays, host, "float32")
    assert chosen and all((c.T, c.E, c.loop) == (512, 8, False) for c in chosen)


def test_register_budget_forces_loop_mode():
    spec = rows.examples()[0]  # any program: the budget picks the mode
    assert spec is not None
    many = rows.RowSpec(((rt.float32, "v"),), tuple(("ew", "exp", rt.float32, rt.float32, (("i", 0),))
                                                   for _ in range(20)) + (("red", "sum", rt.float32, rt.float32,
                                                                           (("m", 19),)),),
                        (True,) * 20 + (False,), (20,))
    assert rows.choose(many, 64, 16384, True).loop
    few = rows.RowSpec(((rt.float32, "v"),), (("red", "sum", rt.float32, rt.float32, (("i", 0),)),), (False,), (0,))
    c = rows.choose(few, 8192, 4096, True)
    assert (c.T, c.E, c.VEC, c.loop) == (256, 16, 4, False)


@pytest.mark.parametrize("vec", [4, 1])
def test_register_mode_loads_every_input_before_the_first_reduction(vec):
    """A layer norm's weight (read after both reductions) is loaded with the row, in the first
    phase, so that its latency overlaps the reductions; loop mode reads it where it is used."""
    norm = _norm_spec(rt.float32)

    def body(config):
        source = rows.rows_source(norm, config).body()
        return source[source.index("__global__"):]

    loads = [f"(in{k} + rb{k})" if vec == 4 else f"in{k}[rb{k}" for k in range(3)]
    registers = body(rows.Config(256, 1, 16, vec, False))
    first_reduction = registers.index("__syncthreads")
    assert all(registers.count(load) == 1 and registers.index(load) < first_reduction for load in loads)
    looped = body(rows.Config(1024, 1, 8 if vec == 4 else 4, vec, True))
    assert looped.index(loads[1]) > looped.index("__syncthreads")
    # the weights, late: each loaded once, after the last reduction, where they are read
    late = body(rows.Config(256, 1, 16, vec, False, late=(1, 2)))
    last_reduction = late.rindex("__syncthreads")
    assert late.count(loads[0]) == 1 and late.index(loads[0]) < late.index("__syncthreads")
    assert all(late.count(load) == 1 and late.index(load) > last_reduction for load in loads[1:])


def test_vectors_the_same_for_every_row_load_where_they_are_read(gpu_like):
    """A layer norm's weight and bias (row stride 0) are the plan's late inputs; its rows are not,
    and the result is the composition's, against numpy."""
    made = []
    real = rows.choose
    rng = np.random.default_rng(11)
    x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((6, 40), (40,), (40,)))
    X, W, B = (rt.array(a, device=gpu_like) for a in (x, w, b))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rows, "choose", lambda *args: made.append(args) or real(*args))
        mean = X.mean(axis=-1, keepdims=True)
        centred = X - mean
        got = (centred / rt.sqrt((centred * centred).mean(axis=-1, keepdims=True) + 1e-5) * W + B).numpy()
    mean = x.mean(axis=-1, keepdims=True)
    want = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-5) * w + b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ((spec, _, _, _, late),) = made
    assert len(late) == 2 and all(spec.inputs[k][1] == "v" for k in late)
    assert all(k not in late for k, (_, kind) in enumerate(spec.inputs) if kind == "e" or k == 0)


@pytest.mark.parametrize("case", ["mse", "rms_norm"])
def test_few_long_rows_split_into_chunks(gpu_like, recordings, monkeypatch, case):
    monkeypatch.setattr(rows, "SPLIT_MIN_N", 1000)
    monkeypatch.setattr(rows, "SPLIT_CHUNK", 256)
    arrays, host = operands((2, 1030), "float32", np.random.default_rng(7), gpu_like)
    recordings.clear()
    check(case, arrays, host, "float32")
    if case == "mse":  # one stage: partials, then the combine
        assert recordings[-1].dispatches == 2


@pytest.mark.parametrize("case", ["softmax", "log_softmax", "layer_norm", "rms_norm", "mse"])
def test_few_streamed_rows_split_in_every_phase(gpu_like, recordings, monkeypatch, chosen, case):
    """Rows too long for registers and too few to fill the GPU split into chunks in every phase: a
    dispatch a phase over every chunk (each finishing the reductions before it from all chunks'
    partials), then a combine where the group writes row values. Scaled down: chunks of 256."""
    monkeypatch.setattr(rows, "SPLIT_MIN_N", 1000)
    monkeypatch.setattr(rows, "SPLIT_CHUNK", 256)
    monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)
    monkeypatch.setattr(rows, "LONG_PER_THREAD", 1)
    dispatches = {"softmax": 3, "log_softmax": 3, "layer_norm": 3, "rms_norm": 2, "mse": 2}[case]
    for shape, seed in (((2, 1030), 7), ((1, 4100), 8), ((3, 2051), 9)):  # (odd: a short last chunk)
        arrays, host = operands(shape, "float32", np.random.default_rng(seed), gpu_like)
        recordings.clear()
        check(case, arrays, host, "float32")
        assert recordings[-1].dispatches == dispatches
    assert chosen and all(c.C > 1 and c.loop for c in chosen)


def test_sums_of_exponentials_are_accumulated_with_their_maxima():
    """A float32 sum of exp(x - max(x)) joins its maximum's phase (rows.online_sums): softmax runs two
    phases; in a narrow type (values rounded between ops) or over another maximum it keeps its own."""
    f32 = _softmax_spec(rt.float32)
    assert f32.online == {3: (0, ("i", 0))} and f32.phases == 2
    assert _softmax_spec(rt.bfloat16).online == {} and _softmax_spec(rt.bfloat16).phases == 3
    d = rt.float32
    other = rows.RowSpec(((d, "v"), (d, "v")), (
        ("red", "max", d, d, (("i", 1),)),
        ("ew", "sub", d, d, (("i", 0), ("m", 0))),
        ("ew", "exp", d, d, (("m", 1),)),
        ("red", "sum", d, d, (("m", 2),))), (False, True, True, False), (3,))
    assert other.online == {} and other.phases == 2
    lse = rows.RowSpec(((d, "v"),), (  # log-sum-exp: the exponentials are not computed at all
        ("red", "max", d, d, (("i", 0),)),
        ("ew", "sub", d, d, (("i", 0), ("m", 0))),
        ("ew", "exp", d, d, (("m", 1),)),
        ("red", "sum", d, d, (("m", 2),)),
        ("ew", "log", d, d, (("m", 3),))), (False, True, True, False, False), (4,))
    assert lse.phases == 1 and lse.live == (True, False, False, True, True)


def _special_rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(5)
    host = (rng.standard_normal((9, n)) * 4).astype(np.float32)
    host[1] = -np.inf  # only -inf: exp(-inf - -inf) is NaN in the two passes
    host[2, ::3] = -np.inf  # some -inf: they add nothing
    host[3, n // 2] = np.inf  # +inf: NaN (inf - inf)
    host[4, 5] = np.nan
    host[5, :-1] = -np.inf  # the maximum is the last element
    host[6] = np.linspace(-80, 80, n)  # the maximum grows at every element: rescaled each time
    host[7] = np.linspace(80, -80, n)
    host[8, 0] = np.inf  # +inf first
    return host


@pytest.mark.parametrize("mode", ["register", "loop", "split"])
@pytest.mark.parametrize("case", ["softmax", "log_softmax"])
def test_online_sums_give_what_the_two_passes_give(gpu_like, recordings, monkeypatch, chosen, mode, case):
    """Softmax and log-softmax over streamed rows (scaled down: rows.ONLINE_MIN_N), whole or split into
    chunks, with the sum accumulated beside its maximum, against the ops one at a time on the CPU
    driver: rows of -inf only, some -inf, +inf, NaN, a maximum growing at every element or found last.
    Rows in registers keep the two passes (three dispatches split, where online takes two)."""
    monkeypatch.setattr(rows, "ONLINE_MIN_N", 2000)
    if mode != "register":
        monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)
        monkeypatch.setattr(rows, "LONG_PER_THREAD", 1)
    if mode == "split":
        monkeypatch.setattr(rows, "SPLIT_MIN_N", 1000)
        monkeypatch.setattr(rows, "SPLIT_CHUNK", 256)
    host = _special_rows(2100)
    fn = CASES[case]
    recordings.clear()
    got = fn(rt.array(host, device=gpu_like), None, None, None).numpy()
    if mode == "split":
        assert recordings[-1].dispatches == 2
    want = fn(rt.array(host, device="local-sync"), None, None, None).numpy()
    assert chosen and all(c.loop == (mode != "register") and (c.C > 1) == (mode == "split") for c in chosen)
    nan = np.isnan(want)
    assert nan[1].all() and nan[3].all() and nan[4].all() and not nan[2].any() and not nan[6].any()
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_allclose(got[~nan], want[~nan], rtol=2e-5, atol=1e-6)


def test_online_sums_are_planned_for_long_streamed_rows_only(monkeypatch):
    """rows.plan keeps the two passes in register mode and for streamed rows shorter than ONLINE_MIN_N."""
    made = []
    real = rows.rows_source
    monkeypatch.setattr(rows, "rows_source", lambda spec, config: (made.append(spec), real(spec, config))[1])
    spec = _softmax_spec(rt.float32)
    for n, online in ((4096, False), (40000, False), (rows.ONLINE_MIN_N, True), (131072, True)):
        rows.plan(spec, 4096, n, [(0, n, 1)])
        assert bool(made[-1].online) == online, n
    rows.plan(spec, 8, 1 << 20, [(0, 1 << 20, 1)])  # split
    assert made[-1].online


@pytest.fixture
def split_everything(monkeypatch):
    """Rows over 1000 elements stream and, being few, split into chunks of 256 in every phase."""
    monkeypatch.setattr(rows, "SPLIT_MIN_N", 1000)
    monkeypatch.setattr(rows, "SPLIT_CHUNK", 256)
    monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)
    monkeypatch.setattr(rows, "LONG_PER_THREAD", 1)


def test_split_phases_write_row_and_full_outputs(gpu_like, recordings, split_everything, chosen):
    """Row values read after the eval (a mean, a variance, their root) come from the combine, full
    values from the phases that compute them, in one split program."""
    x = np.random.default_rng(14).standard_normal((3, 1500)) * 3 + 1
    X = rt.array(x.astype(np.float32), device=gpu_like)
    mean = X.mean(axis=-1, keepdims=True)
    centred = X - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    std = rt.sqrt(var)
    z = centred / std
    recordings.clear()
    rt.eval(mean, var, std, z, centred)
    assert recordings[-1].dispatches == 4  # three phases, the combine
    assert chosen and all(c.C > 1 for c in chosen)
    want_mean = x.mean(axis=-1, keepdims=True)
    for got, want in ((mean, want_mean), (var, x.var(axis=-1, keepdims=True)), (std, x.std(axis=-1, keepdims=True)),
                      (centred, x - want_mean), (z, (x - want_mean) / x.std(axis=-1, keepdims=True))):
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
@pytest.mark.parametrize("case", ["softmax", "layer_norm"])
def test_split_phases_in_every_float_type(gpu_like, split_everything, chosen, case, dtype):
    arrays, host = operands((2, 1301), dtype, np.random.default_rng(15), gpu_like)
    check(case, arrays, host, dtype)
    assert chosen and all(c.C > 1 for c in chosen)


@pytest.mark.parametrize("view", ["step", "transposed"])
def test_split_phases_over_strided_rows(gpu_like, split_everything, chosen, view):
    transform = {"step": lambda a: a[:, ::2], "transposed": lambda a: a.T}[view]
    shape = (3, 2600) if view == "step" else (1300, 3)
    arrays, host = operands(shape, "float32", np.random.default_rng(16), gpu_like, transform)
    check("softmax", arrays, host, "float32")
    assert chosen and all(c.C > 1 for c in chosen)


def test_one_row_over_the_whole_array(gpu_like, split_everything, chosen):
    """A normalization over a whole array is one row: it splits too (a softmax of a flattened vector
    likewise)."""
    x = np.random.default_rng(17).standard_normal(5000) * 2 + 7
    X = rt.array(x.astype(np.float32), device=gpu_like)
    got = ((X - X.mean()) / X.std()).numpy()
    np.testing.assert_allclose(got, (x - x.mean()) / x.std(), rtol=1e-4, atol=1e-4)
    e = rt.exp(X - X.max())
    np.testing.assert_allclose((e / e.sum()).numpy(), np.exp(x - x.max()) / np.exp(x - x.max()).sum(),
                               rtol=1e-4, atol=1e-9)
    assert chosen and all(c.C > 1 for c in chosen)


# ---- the graph cache, rt.compile and gradients ----------------------------------------------------

def test_repeated_graph_fuses_on_its_second_evaluation(gpu_like, recordings, monkeypatch):
    monkeypatch.delenv("RUNTIME_FUSE_AFTER")
    x = np.random.default_rng(8).standard_normal((5, 24)).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    for _ in range(4):
        np.testing.assert_allclose(softmax(X).numpy(), softmax(x.astype(np.float64), np), rtol=1e-5, atol=1e-6)
    assert [r.dispatches for r in recordings] == [5, 1]


def test_compiled_and_differentiated(gpu_like):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((4, 20)).astype(np.float32)
    t = rng.standard_normal((4, 20)).astype(np.float32)
    w = rng.standard_normal(20).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    X, Tt, W, B = (rt.array(v, device=gpu_like) for v in (x, t, w, b))

    def loss(v, w, b):
        return (softmax(layer_norm(v, w, b)) * Tt).sum() + mse(rms_norm(v, w), Tt)

    step = rt.compile(rt.value_and_grad(loss, argnums=(0, 1, 2)))
    cpu = [rt.array(v, device="local-sync") for v in (x, t, w, b)]

    def cpu_loss(v, w, b):
        return (softmax(layer_norm(v, w, b)) * cpu[1]).sum() + mse(rms_norm(v, w), cpu[1])

    want_value, want_grads = rt.value_and_grad(cpu_loss, argnums=(0, 1, 2))(cpu[0], cpu[2], cpu[3])
    for _ in range(2):
        value, grads = step(X, W, B)
        np.testing.assert_allclose(value.numpy(), want_value.numpy(), rtol=1e-4, atol=1e-5)
        for g, wg in zip(grads, want_grads):
            np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=1e-4, atol=1e-5)


# ---- backward passes -----------------------------------------------------------------------------

def _normalized(x, eps):
    c = x - x.mean(axis=-1, keepdims=True)
    return c, 1 / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps)


def _softmax_grad(x, g):
    y = softmax(x, np)
    return y * (g - (g * y).sum(axis=-1, keepdims=True))


def _log_softmax_grad(x, g):
    return g - softmax(x, np) * g.sum(axis=-1, keepdims=True)


def _layer_norm_grads(x, w, g):
    c, inv = _normalized(x, 1e-5)
    xhat, gw = c * inv, g * w
    dx = inv * (gw - gw.mean(axis=-1, keepdims=True) - xhat * (gw * xhat).mean(axis=-1, keepdims=True))
    rows_of = tuple(range(x.ndim - 1))
    return dx, (g * xhat).sum(axis=rows_of), g.sum(axis=rows_of)


def _rms_norm_grad(x, w, g):
    inv = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6)
    gw = g * w
    return inv * gw - x * inv ** 3 * (gw * x).mean(axis=-1, keepdims=True)


#: case -> (the gradient taken, its numpy form, the dispatches it records at most)
BACKWARD = {
    "softmax": (lambda x, w, b, g: rt.grad(lambda x: (softmax(x) * g).sum())(x),
                lambda x, w, b, g: (_softmax_grad(x, g),), 1),
    "log_softmax": (lambda x, w, b, g: rt.grad(lambda x: (log_softmax(x) * g).sum())(x),
                    lambda x, w, b, g: (_log_softmax_grad(x, g),), 1),
    "layer_norm": (lambda x, w, b, g: rt.grad(lambda x, w, b: (layer_norm(x, w, b) * g).sum(),
                                              argnums=(0, 1, 2))(x, w, b),
                   lambda x, w, b, g: _layer_norm_grads(x, w, g), 5),  # (w's and b's column sums: 2 each)
    "rms_norm": (lambda x, w, b, g: rt.grad(lambda x: (rms_norm(x, w) * g).sum())(x),
                 lambda x, w, b, g: (_rms_norm_grad(x, w, g),), 1),
}


@pytest.mark.parametrize("shape", [(6, 40), (2, 3, 33), (1, 2)])
@pytest.mark.parametrize("case", sorted(BACKWARD))
def test_backward_passes_are_one_row_program(gpu_like, recordings, case, shape):
    """The gradients of the compositions run as one row program: the cotangent's scaling and negation,
    made before the rows' work in the backward graph's order, are taken into the program; layer norm's
    weight and bias gradients are column sums beside it."""
    take, want_of, kernels = BACKWARD[case]
    arrays, host = operands(shape, "float32", np.random.default_rng(11), gpu_like)
    x, w, b, g = arrays
    recordings.clear()
    got = take(x, w, b, g)
    got = got if isinstance(got, tuple) else (got,)
    rt.eval(*got)
    for have, want in zip(got, want_of(*host)):
        np.testing.assert_allclose(have.numpy(), want, rtol=2e-4, atol=2e-5)
    rec = recordings[-1]
    assert rec.dispatches <= kernels and rec.fused == 1


@pytest.mark.parametrize("case", ["softmax", "layer_norm"])
def test_backward_passes_of_long_rows_stream_in_every_phase(gpu_like, recordings, monkeypatch, chosen, case):
    monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)  # rows over 1024 elements take loop mode
    monkeypatch.setattr(rows, "LONG_PER_THREAD", 1)
    take, want_of, kernels = BACKWARD[case]
    arrays, host = operands((3, 1500), "float32", np.random.default_rng(12), gpu_like)
    recordings.clear()
    got = take(*arrays)
    got = got if isinstance(got, tuple) else (got,)
    rt.eval(*got)
    for have, want in zip(got, want_of(*host)):
        np.testing.assert_allclose(have.numpy(), want, rtol=2e-4, atol=2e-5)
    assert recordings[-1].dispatches <= kernels and chosen and all(c.loop for c in chosen)


def test_a_group_never_waits_for_what_waits_for_it(gpu_like, recordings):
    """A node outside a row group that reads the group's row values, and that a later member would
    read, keeps that member out of the group (one kernel cannot both make a value and wait for
    what is computed from it): the values stay right."""
    h = np.random.default_rng(13).standard_normal((5, 24)).astype(np.float32)
    x = rt.array(h, device=gpu_like)
    m = x.max(axis=-1, keepdims=True)
    d = x - m
    s = d.sum(axis=-1, keepdims=True)
    outside = rt.cumulative_sum(s, axis=0)  # (no row program computes a running sum across rows)
    y = d * outside
    hm = h.astype(np.float64)
    hd = hm - hm.max(axis=-1, keepdims=True)
    want = hd * np.cumsum(hd.sum(axis=-1, keepdims=True), axis=0)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
    assert recordings[-1].dispatches >= 3


# ---- scatters into a computed array --------------------------------------------------------------

def _xent(x, y):
    m = x.max(axis=-1, keepdims=True)
    lse = m[:, 0] + rt.log(rt.sum(rt.exp(x - m), axis=-1))
    return rt.mean(lse - rt.take_along_axis(x, y[:, None], axis=1)[:, 0])


@pytest.fixture
def fills(monkeypatch):
    """The buffer fills recorded while the test runs (a take_add's zeros among them)."""
    from hal.command_buffer import CommandBuffer

    made = []
    real = CommandBuffer.fill_buffer

    def spy(self, *args, **kwargs):
        made.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CommandBuffer, "fill_buffer", spy)
    return made


@pytest.mark.parametrize("shape", [(6, 40), (3, 1027)])
def test_cross_entropy_gradient_scatters_its_labels_into_the_rows_result(gpu_like, recordings, fills, shape):
    """Cross entropy's gradient is softmax(x) less the labels' one-hot, over the rows: the row program
    writes the first term where the gradient goes, and the labels' term is added there in place (a
    take's transpose into zeros, then a pass adding them, before)."""
    rng = np.random.default_rng(16)
    h = rng.standard_normal(shape).astype(np.float32)
    labels = rng.integers(0, shape[1], shape[0])
    x, y = rt.array(h, device=gpu_like), rt.array(labels, device=gpu_like)
    recordings.clear()
    fills.clear()
    got = rt.grad(_xent)(x, y)
    rt.eval(got)
    want = softmax(h.astype(np.float64), np)
    want[np.arange(shape[0]), labels] -= 1
    np.testing.assert_allclose(got.numpy(), want / shape[0], rtol=1e-4, atol=1e-6)
    rec = recordings[-1]
    # the status word's zeros, two padded row vectors, the rows, the forward's checked take (which
    # sets that word), the scatter
    assert rec.fused == 1 and rec.dispatches <= 6
    assert fills and all(target.length == 4 for target, *_ in fills), "no zeros but the status word's"


def test_an_indexed_add_into_a_computed_array_is_one_scatter_in_place(gpu_like, recordings, fills):
    """``(x * 2).at[i].add(v)``: the product's kernel writes the result's buffer and the values are
    added there; where the product is also read elsewhere (or kept), it is not overwritten. An x
    computed before is copied into the result's buffer, then the values added (no zeros)."""
    rng = np.random.default_rng(17)
    h = rng.standard_normal((50, 8)).astype(np.float32)
    idx = rng.integers(0, 50, 30)
    vals = rng.standard_normal((30, 8)).astype(np.float32)
    x, i, v = (rt.array(a, device=gpu_like) for a in (h, idx, vals))
    want = h * 2
    np.add.at(want, idx, vals)
    recordings.clear()
    fills.clear()
    got = (x * 2).at[i].add(v)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    # the product, the zeros of the device indices' status word, the scatter into the product's buffer
    assert recordings[-1].dispatches == 3 and [target.length for target, *_ in fills] == [4]
    doubled = x * 2
    both = doubled.at[i].add(v) + doubled  # the product read twice: it keeps its own buffer
    np.testing.assert_allclose(both.numpy(), want + h * 2, rtol=1e-6, atol=1e-6)
    kept = x * 3
    added = kept.at[i].add(v)
    rt.eval(added, kept)
    want3 = h * 3
    np.add.at(want3, idx, vals)
    np.testing.assert_allclose(added.numpy(), want3, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(kept.numpy(), h * 3, rtol=1e-6, atol=1e-6)
    recordings.clear()
    fills.clear()
    direct = x.at[i].add(v)  # x computed before: the result's buffer takes a copy of it, then the values
    want_x = h.copy()
    np.add.at(want_x, idx, vals)
    np.testing.assert_allclose(direct.numpy(), want_x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(x.numpy(), h)  # (x itself unchanged)
    assert recordings[-1].dispatches == 3 and [target.length for target, *_ in fills] == [4]
    strided = x.T.at[i[:5] % 8].add(v[:5, :1])  # x read through a transposed view: copied whole first
    want_t = h.T.copy()
    np.add.at(want_t, idx[:5] % 8, vals[:5, :1])
    np.testing.assert_allclose(strided.numpy(), want_t, rtol=1e-6, atol=1e-6)


def test_compiled_gradients_replay_with_new_values(gpu_like):
    """Under rt.compile the in-place scatter and the backward row programs replay with new inputs
    every call (two recordings alternating their buffers, ``w = step(w)``): each call's values are
    numpy's, none left over from the call before."""
    rng = np.random.default_rng(18)
    step = rt.compile(lambda x, y: x - 0.5 * rt.grad(_xent)(x, y))
    h = rng.standard_normal((5, 24)).astype(np.float32)
    x = rt.array(h, device=gpu_like)
    for _ in range(4):
        labels = rng.integers(0, 24, 5)
        g = softmax(h.astype(np.float64), np)
        g[np.arange(5), labels] -= 1
        h = (h - 0.5 * g / 5).astype(np.float32)
        x = step(x, rt.array(labels, device=gpu_like))
        np.testing.assert_allclose(x.numpy(), h, rtol=1e-5, atol=1e-6)
    scatter = rt.compile(lambda a, i, v: (a * 2).at[i].add(v))
    for seed in range(3):
        r = np.random.default_rng(seed)
        a, i, v = r.standard_normal((9, 3)).astype(np.float32), r.integers(0, 9, 6), r.standard_normal((6, 3))
        want = a * 2
        np.add.at(want, i, v.astype(np.float32))
        got = scatter(*(rt.array(t, device=gpu_like) for t in (a, i, v.astype(np.float32))))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)


def test_threads_take_gradients_at_once(gpu_like):
    """Eight threads each taking softmax's and cross entropy's gradients of their own rows (one graph
    cache, one planner): every result is its thread's."""

    def work(seed):
        rng = np.random.default_rng(100 + seed)
        h = rng.standard_normal((4, 16)).astype(np.float32)
        c = rng.standard_normal((4, 16)).astype(np.float32)
        labels = rng.integers(0, 16, 4)
        x, g, y = (rt.array(t, device=gpu_like) for t in (h, c, labels))
        for _ in range(3):
            got = rt.grad(lambda v: (softmax(v) * g).sum())(x)
            np.testing.assert_allclose(got.numpy(), _softmax_grad(h.astype(np.float64), c), rtol=1e-4, atol=1e-5)
            want = softmax(h.astype(np.float64), np)
            want[np.arange(4), labels] -= 1
            np.testing.assert_allclose(rt.grad(_xent)(x, y).numpy(), want / 4, rtol=1e-4, atol=1e-6)

    errors = failures_in_threads(work, 8)
    assert not errors, errors[0]


def _random_loss(rng, x, w, idx, xp):
    """A scalar of row reductions, broadcasts, a product, takes and indexed adds in a random order: the
    same program on runtime arrays (xp=rt) and as the CPU driver's reference (xp=rt too, other device)."""
    h = x
    steps = rng.integers(0, 7, int(rng.integers(3, 8)))
    for step in steps:
        if step == 0:  # softmax over the rows
            e = rt.exp(h - h.max(axis=-1, keepdims=True))
            h = e / e.sum(axis=-1, keepdims=True)
        elif step == 1:  # a norm with the weight row
            c = h - h.mean(axis=-1, keepdims=True)
            h = c / rt.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5) * w[0]
        elif step == 2:  # a product
            h = rt.tanh(h @ w)
        elif step == 3:  # rows taken, and added back where they came from
            h = h.at[idx].add(rt.take(h, idx, axis=0) * 0.5)
        elif step == 4:  # labels' logits against the rows' log-sum-exp
            m = h.max(axis=-1, keepdims=True)
            lse = m + rt.log(rt.exp(h - m).sum(axis=-1, keepdims=True))
            h = h - lse + rt.take_along_axis(h, idx[:, None] % h.shape[1], axis=1)
        elif step == 5:
            h = h * h.sum(axis=-1, keepdims=True) * 0.1
        else:
            h = rt.maximum(h, 0.0) - 0.25 * h
    return (h * h).sum()


@pytest.mark.parametrize("seed", range(16))
def test_random_gradients_agree_with_the_cpu_driver(gpu_like, seed):
    """Gradients of random compositions of the planner's patterns (backward row programs with late
    externals, products with epilogues, takes' transposes scattered in place) on the GPU lowering,
    eager and under rt.compile, against the same program on the CPU driver, whose lowering shares
    none of it. (A late external reading the group's first member once made a group wait for a
    value computed from its own: uninitialized reads.)"""
    rng = np.random.default_rng(200 + seed)
    n = int(rng.choice([8, 24, 40]))
    hx = rng.standard_normal((n, n)).astype(np.float32) * 0.5
    hw = rng.standard_normal((n, n)).astype(np.float32) / np.sqrt(n)
    hidx = rng.integers(0, n, n)
    program = np.random.default_rng(seed)
    program_seed = program.bit_generator.state["state"]["state"] % (1 << 32)
    values = {}
    for where, compiled in ((gpu_like, False), (gpu_like, True), ("local-sync", False)):
        x, w, idx = (rt.array(a, device=where) for a in (hx, hw, hidx))
        step = rt.value_and_grad(lambda x, w, idx: _random_loss(np.random.default_rng(program_seed), x, w, idx, rt),
                                 argnums=(0, 1))
        loss, (gx, gw) = (rt.compile(step) if compiled else step)(x, w, idx)
        rt.eval(loss, gx, gw)
        values[(where if where == "local-sync" else "gpu", compiled)] = [loss.numpy(), gx.numpy(), gw.numpy()]
    want_all = values[("local-sync", False)]
    for key in (("gpu", False), ("gpu", True)):
        for got, want in zip(values[key], want_all):
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4 * scale, err_msg=str(key))


# ---- column reductions ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis", [((64, 48), 0), ((33, 40), 0), ((3, 50, 20), 1), ((600, 64), 0),
                                        ((5, 2, 36), (0, 1))])
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_column_reductions(gpu_like, monkeypatch, shape, axis, op):
    planned = []
    real = reduce_columns.plan

    def spy(*args):
        cmds = real(*args)
        planned.append(cmds is not None)
        return cmds

    monkeypatch.setattr(reduce_columns, "plan", spy)
    x = np.random.default_rng(10).standard_normal(shape).astype(np.float32)
    got = getattr(rt.array(x, device=gpu_like), op)(axis=axis).numpy()
    np.testing.assert_allclose(got, getattr(x, op)(axis=axis), rtol=1e-5, atol=1e-5)
    assert planned == [True]


def test_column_reductions_of_views_and_types(gpu_like):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((40, 70)).astype(np.float32)
    X = rt.array(x, device=gpu_like)
    np.testing.assert_allclose(X.T.sum(axis=1).numpy(), x.T.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(X[::-1, 2:].sum(axis=0).numpy(), x[::-1, 2:].sum(axis=0), rtol=1e-5, atol=1e-5)
    for dtype in ("float16", "bfloat16", "float64"):
        v = X.astype(dtype)
        ref = v.astype(rt.float64).numpy()
        np.testing.assert_allclose(v.sum(axis=0).astype(rt.float64).numpy(), ref.sum(axis=0),
                                   rtol=TOL[dtype], atol=TOL[dtype] * 10)
    i = rng.integers(-5, 5, (30, 20)).astype(np.int32)
    np.testing.assert_array_equal(rt.array(i, device=gpu_like).sum(axis=0).numpy(), i.sum(axis=0))
    np.testing.assert_array_equal(rt.array(i, device=gpu_like).max(axis=0).numpy(), i.max(axis=0))


def test_column_plan_splits_tall_matrices():
    cmds = reduce_columns.plan("sum", rt.float32, rt.float32, (8192,), (1,), 8192, 8192, 0)
    part = [c for c in cmds if c[0] == "dispatch"][0]
    groups = part[3][0] * part[3][1] * part[3][2]
    assert groups >= 1024 and part[2].endswith("_v4_p")
    assert reduce_columns.plan("sum", rt.float32, rt.float32, (8,), (1,), 100, 8, 0) is None



# ---- on the GPU driver (simulated API, graph and stream command buffers) -------------------------

@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("mode", ["graph", "stream"])
def test_programs_rebind_on_the_gpu_driver(mode, monkeypatch, streamed):
    """Row programs (split ones with their scratch too) replay from the graph cache with new buffers;
    `streamed`: the rows too long for registers, so that every program splits, in every phase."""
    import sys
    from pathlib import Path

    if cuda_emu.GXX is None:
        pytest.skip("g++ is needed to emulate the CUDA kernels")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    fake_gpu = pytest.importorskip("drivers.fake_gpu")
    monkeypatch.setattr(rows, "SPLIT_MIN_N", 1000)
    monkeypatch.setattr(rows, "SPLIT_CHUNK", 256)
    if streamed:
        monkeypatch.setattr(rows, "MAX_PER_THREAD", 1)
        monkeypatch.setattr(rows, "LONG_PER_THREAD", 1)
    device = fake_gpu.FakeGpuDriver().create_device(command_buffer=mode)
    context_for(device).is_gpu = True
    rng = np.random.default_rng(12)
    try:
        with cuda_emu.emulated_kernels():
            for _ in range(3):
                arrays, host = operands((2, 1030), "float32", rng, device)
                check("softmax", arrays, host, "float32")
                check("mse", arrays, host, "float32")
                check("layer_norm", arrays, host, "float32")
    finally:
        device.close()
