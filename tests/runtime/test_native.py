"""The runtime's C code (runtime._native) against the Python it stands in for.

The key walk must number the same nodes in the same order, give equal keys, list the same
externals and find the same live nodes, on graphs with views, shared subexpressions, repeated
externals and intermediates still referenced; the node constructors and the unary and binary
fast paths must make the nodes the Python code makes, attach the same storages, and a
recording's submission must take and give back the buffers the Python code does. HAL_NATIVE
selects between them (the DLPack capsule destructor is tested in test_interop.py).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import hal
import runtime as rt
from runtime import lowering
from runtime.array import PLACEHOLDER, Array
from runtime.device import Storage

native = pytest.mark.skipif(lowering._native_walk is None, reason="runtime._native not built or HAL_NATIVE=0")

FIELDS = ("op", "params", "shape", "dtype", "ctx", "base", "strides", "offset", "storage")


def _summary(result) -> tuple:
    """What a walk gave, with nodes by identity (the result itself is dropped: its lists would
    count as references and change the next walk's live nodes)."""
    order, key, externals, keep = result
    return [id(n) for n in order], key, [id(e) for e in externals], keep


def _both(targets: list, live: bool) -> tuple:
    from_c = _summary(lowering._native_walk(targets, live))
    from_python = _summary(lowering._eval_key_python(targets, live))
    return from_c, from_python


def _random_graph(rng: np.random.Generator, steps: int) -> tuple[list, list]:
    """Pending arrays built by random ops over a few externals (views, broadcasts, reductions,
    repeated operands); returns (every array made, the ones kept referenced)."""
    dev = "local-sync"
    pool = [rt.array(rng.standard_normal((4, 6)).astype(np.float32), device=dev),
            rt.array(rng.standard_normal((6,)).astype(np.float32), device=dev),
            rt.array(rng.standard_normal((4, 1)).astype(np.float32), device=dev)]
    made = list(pool)
    for _ in range(steps):
        a = pool[rng.integers(len(pool))]
        b = pool[rng.integers(len(pool))]
        kind = rng.integers(9)
        try:
            if kind == 0:
                c = rt.exp(a)
            elif kind == 1:
                c = a + b
            elif kind == 2:
                c = a * a  # one operand twice
            elif kind == 3:
                c = a.T if a.ndim == 2 else a.reshape((-1, 1))
            elif kind == 4:
                c = a[1:] if a.shape and a.shape[0] > 1 else -a
            elif kind == 5:
                c = a.sum(axis=0) if a.ndim else a + 1.5
            elif kind == 6:
                c = rt.maximum(a, 0.0)
            elif kind == 7:
                c = a.reshape((-1,))
            else:
                c = a - b * 2.0
        except hal.HalError:  # shapes that do not broadcast
            continue
        pool.append(c)
        made.append(c)
    kept = [made[i] for i in rng.choice(len(made), size=min(4, len(made)), replace=False)]
    return made, kept


@native
@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("live", [True, False])
def test_c_walk_matches_the_python_walk(seed: int, live: bool) -> None:
    rng = np.random.default_rng(seed)
    made, kept = _random_graph(rng, int(rng.integers(3, 30)))
    targets = []
    for a in (made[-1], *kept):
        r = a.root
        if r.storage is None and all(r is not t for t in targets):
            targets.append(r)
    if not targets:
        pytest.skip("the graph has nothing pending")
    del made  # only the kept arrays reference intermediates: the live masks tell them apart
    from_c, from_python = _both(targets, live)
    assert from_c == from_python


@native
def test_c_walk_live_nodes_follow_references() -> None:
    x = rt.array(np.arange(6, dtype=np.float32), device="local-sync")
    t = x * 2
    z = (t + 1).reshape((2, 3))  # t is held here; z's root is read through a view
    u = z.sum()
    from_c, from_python = _both([u.root], True)
    assert from_c == from_python
    held = from_c[3]
    assert held & 1  # t (numbered first): referenced by this test
    del t
    from_c, from_python = _both([u.root], True)
    assert from_c == from_python
    assert not from_c[3] & 1
    np.testing.assert_allclose(u.numpy(), (np.arange(6) * 2 + 1).sum())


@native
def test_c_walk_view_chains() -> None:
    """Views of views of an external and of pending nodes, one view read twice, a view of a view
    already numbered: the same numbering of views and roots as the Python walk."""
    dev = "local-sync"
    x_np = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = rt.array(x_np, device=dev)
    xv = x.T.reshape((3, 8))[1:]  # external -> transpose -> reshape -> slice
    p = rt.exp(x * 0.1)
    pv = p.reshape((6, 4)).T  # pending -> reshape -> transpose
    a = xv.sum(axis=0) + xv.sum(axis=0)  # the same view twice
    b = pv[1:].sum() + pv.sum()  # a view of a view already numbered
    c = (a.reshape((2, 4)) * b).reshape((-1,))
    for live in (True, False):
        from_c, from_python = _both([c.root], live)
        assert from_c == from_python
    assert len(from_c[1][1]) >= 6  # the views are part of the key
    xv_np = x_np.T.reshape(3, 8)[1:]
    pv_np = np.exp(x_np * np.float32(0.1)).reshape(6, 4).T
    want = ((xv_np.sum(0) * 2).reshape(2, 4) * (pv_np[1:].sum() + pv_np.sum())).reshape(-1)
    np.testing.assert_allclose(c.numpy(), want, rtol=1e-5)


@native
def test_c_walk_any_depth() -> None:
    """The C walk's stack is its own: a chain far deeper than the recursive Python walk allows
    gets the same post-order (the Python walk restarts iteratively past _MAX_KEY_DEPTH)."""
    x = rt.array(np.ones(3, np.float32), device="local-sync")
    y = x
    for _ in range(5 * lowering._MAX_KEY_DEPTH):
        y = y + 1.0
    order, key, externals, keep = lowering._native_walk([y.root], True)
    assert len(order) == 5 * lowering._MAX_KEY_DEPTH and order[-1] is y.root
    assert all(p[4][0] == i - 1 for i, p in enumerate(key[0]) if i)  # each node reads the one before
    del order, key, externals
    np.testing.assert_allclose(y.numpy(), np.full(3, 1 + 5 * lowering._MAX_KEY_DEPTH))


@native
def test_c_walk_declines_other_node_types() -> None:
    assert lowering._native_walk([object()], True) is None


@native
def test_setup_needs_a_slots_class() -> None:
    from runtime import _native

    class NoSlots:
        pass

    with pytest.raises(TypeError, match="not a __slots__ field"):
        _native.setup(NoSlots, "placeholder")
    _native.setup(Array, PLACEHOLDER)  # restored for the other tests


def test_hal_native_selects_the_c_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import native as runtime_native

    monkeypatch.setenv("HAL_NATIVE", "0")
    assert runtime_native.load(Array, PLACEHOLDER, Storage) is None
    monkeypatch.setitem(sys.modules, "runtime._native", None)  # as if it was not built
    monkeypatch.delattr(rt, "_native", raising=False)
    monkeypatch.delenv("HAL_NATIVE")
    assert runtime_native.load(Array, PLACEHOLDER, Storage) is None
    monkeypatch.setenv("HAL_NATIVE", "1")
    with pytest.raises(hal.UnavailableError, match="HAL_NATIVE=1"):
        runtime_native.load(Array, PLACEHOLDER, Storage)


@native
def test_c_constructors_match_the_python_ones() -> None:
    """array.new_node / new_view in C set every field as the Python constructors do."""
    from runtime import _native

    x = rt.array(np.arange(6, dtype=np.float32), device="local-sync")
    t = x * 2
    node = _native.new_node("exp", (t,), rt.float32, (6,), rt.float32, t.ctx)
    done = _native.new_node(None, (), None, (6,), rt.float32, x.ctx, x.storage)
    for a in (node, done):
        assert type(a) is Array and a.base is None and a.strides is None and a.offset == 0
    assert [getattr(node, f) for f in ("op", "inputs", "params", "shape", "dtype", "ctx", "storage")] == [
        "exp", (t,), rt.float32, (6,), rt.float32, t.ctx, None]
    assert done.storage is x.storage and done.op is None
    np.testing.assert_allclose(node.numpy(), np.exp(np.arange(6) * 2), rtol=1e-6)
    v = _native.new_view("reshape", t, (2, 3), (2, 3), (3, 1), 0)
    w = _native.new_view("transpose", v, (1, 0), (3, 2), (1, 3), 0)
    assert w.base is t and v.base is t and w.inputs[0] is v and len(w.inputs) == 1
    assert [getattr(w, f) for f in ("op", "params", "shape", "dtype", "ctx", "strides", "offset", "storage")] == [
        "transpose", (1, 0), (3, 2), t.dtype, t.ctx, (1, 3), 0, None]
    np.testing.assert_allclose(w.numpy(), (np.arange(6) * 2).reshape(2, 3).T)
    with pytest.raises(TypeError):
        _native.new_node("exp", (t,))
    with pytest.raises(TypeError):
        _native.new_view("reshape", object(), (6,), (6,), (1,), 0)


def test_python_walk_evaluates_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback serves evals end to end (the whole suite runs on it with HAL_NATIVE=0)."""
    monkeypatch.setattr(lowering, "_native_walk", None)
    rng = np.random.default_rng(3)
    x_np = rng.standard_normal((5, 4)).astype(np.float32)
    x = rt.array(x_np, device="local-task")
    y = (rt.exp(x.T) * 2.0).sum(axis=1) + x[0].reshape((-1,))
    np.testing.assert_allclose(y.numpy(), (np.exp(x_np.T) * 2).sum(axis=1) + x_np[0], rtol=1e-5)


def _fields(node: Array) -> tuple:
    return tuple(getattr(node, f) for f in FIELDS) + (tuple(map(id, node.inputs)),)


@native
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow", "maximum", "lt", "eq", "logical_and", "bitwise_and"])
def test_c_binary_makes_the_python_node(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import ops

    dev = "local-sync"
    f32 = rt.array(np.linspace(-1, 1, 6, dtype=np.float32), device=dev)
    f64 = rt.array(np.linspace(-1, 1, 6), device=dev)
    i32 = rt.array(np.arange(6, dtype=np.int32), device=dev)
    b8 = rt.array(np.arange(6) % 2 == 0, device=dev)
    mat = rt.array(np.ones((2, 6), np.float32), device=dev)
    zero_d = rt.array(np.float32(2.0), device=dev)
    operands = [f32, f64, i32, b8, mat, zero_d, 2.5, 3, True, -0.0, 0.0, float("nan"), np.float32(1.5), -2]
    python_binary = ops._native_binary
    compared = scalars = 0
    for a in operands:
        for b in operands:
            if type(a) is not Array and type(b) is not Array:
                continue
            for _ in range(2):  # the second time, the Python code's memos are filled
                try:
                    monkeypatch.setattr(ops, "_native_binary", None)
                    want = ops._binary(op, a, b)
                except hal.HalError as exc:
                    want = type(exc)
                monkeypatch.setattr(ops, "_native_binary", python_binary)
                got = python_binary(op, a, b)
                if got is None:
                    continue  # the Python code's case
                compared += 1
                scalars += type(a) is not Array or type(b) is not Array
                assert not isinstance(want, type), (op, a, b)
                got_fields, want_fields = _fields(got), _fields(want)
                # a scalar's constant is the memoized one: the same object either way
                assert got_fields == want_fields, (op, a, b)
    assert compared > 0
    assert (scalars > 0) == (op != "pow")  # pow's scalar operands always take the Python checks


@native
def test_c_attach_gives_the_python_storages(monkeypatch: pytest.MonkeyPatch) -> None:
    """An eval's materialized nodes get the same Storage fields from the C attach as from the
    Python one, and drop their op, inputs and params; a graph evaluated twice reads the same."""
    from runtime.device import context_for

    dev = "local-task"
    x_np = np.linspace(-2, 2, 12, dtype=np.float32)
    x = rt.array(x_np, device=dev)
    ctx = context_for(dev)
    seen = []
    for attach in (lowering._native_attach, None):
        monkeypatch.setattr(lowering, "_native_attach", attach)
        t = rt.exp(x) * 2.0
        u = (t + x).sum()
        rt.eval(t, u)
        for a in (t, u):
            st = a.storage
            assert type(st) is Storage and a.op is None and a.inputs == () and a.params is None
            assert st.ctx is ctx and st.sem is ctx.semaphore and st.ready == ctx.submitted
            seen.append((a.shape, st.bucket, st.nbytes, a.numpy().tobytes()))
        del t, u  # their storages go back to the buffer cache (Storage.__del__)
    assert seen[:2] == seen[2:]
    np.testing.assert_allclose(np.frombuffer(seen[1][3], np.float32), (np.exp(x_np) * 2 + x_np).sum(), rtol=1e-5)


@native
@pytest.mark.parametrize("op", ["exp", "neg", "abs", "log", "logical_not", "isnan", "sign", "bitwise_invert"])
def test_c_unary_makes_the_python_node(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import ops

    dev = "local-sync"
    operands = [rt.array(np.linspace(-1, 1, 4, dtype=np.float32), device=dev),
                rt.array(np.arange(4, dtype=np.int32), device=dev),
                rt.array(np.arange(4) % 2 == 0, device=dev), rt.array(np.float64(2.0), device=dev), 1.5]
    c_unary = ops._native_unary
    compared = 0
    for x in operands:
        for _ in range(2):  # the second time, the Python code's signature memo is filled
            monkeypatch.setattr(ops, "_native_unary", None)
            try:
                want = ops._unary(op, x)
            except hal.HalError as exc:
                want = type(exc)
            monkeypatch.setattr(ops, "_native_unary", c_unary)
            got = c_unary(op, x)
            if got is None:
                continue
            compared += 1
            assert not isinstance(want, type), (op, x)
            assert _fields(got) == _fields(want), (op, x)
    assert compared > 0


def _submit_program(device) -> tuple[list, dict]:
    """A fixed sequence of evals on a fresh context of `device`: repeats of one graph (its table
    unchanged), results held across evals (its buffers busy: another one, `moved`), a pipelined
    run without waits, reductions with scratch in the table; what each eval gave and the
    context's counters."""
    rng = np.random.default_rng(7)
    a_np = rng.standard_normal((64, 33)).astype(np.float32)
    b_np = rng.standard_normal((64, 33)).astype(np.float32)
    ctx = rt.device.context_for(device)  # a context of its own for this device object
    a, b = rt.array(a_np, device=ctx), rt.array(b_np, device=ctx)
    results, held = [], []
    for step in range(12):
        c = (a + b) * float(step % 3)
        s = c.sum()
        if step % 4 == 1:
            held.append(c)  # kept: the next eval of the graph finds its buffer busy
        rt.eval(s)
        results.append(float(s))
    for _ in range(6):  # queued without a wait in between
        rt.eval(a * b)
    results.append(float((a - b).sum()))
    big = rt.array(rng.standard_normal((512, 4096)).astype(np.float32), device=ctx)
    for _ in range(3):  # scratch through the binding table (large reductions' partials on a CPU)
        results.append((rt.exp(big * 0.1).max(axis=0) + big.mean()).numpy().tolist())
    del c, s, held  # their storages give their buffers back
    cache = ctx.buffers
    counters = {"hits": cache.hits, "misses": cache.misses, "free_bytes": cache.free_bytes,
                "allocated_bytes": cache.allocated_bytes, "submitted": ctx.submitted,
                "moved": sorted(rec.moved for entry in ctx.graphs._entries.values() for rec in entry.recs),
                "graph_cache": ctx.graphs.stats(), "newest": list(ctx.graphs._entries).index(
                    next(k for k, v in ctx.graphs._entries.items() if v is ctx.graphs._newest))}
    return results, counters


@native
@pytest.mark.parametrize("driver", ["local-task", "fake-gpu"])
def test_c_submit_makes_the_python_submissions(driver: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """lowering.submit and Variants.pick: the C code's usual cases against the Python code."""
    outcomes = []
    c_submit, c_pick = lowering._native_submit, lowering._native_pick
    monkeypatch.setattr(lowering, "_native_evaluate", None)  # (it submits and picks without these calls)
    monkeypatch.setattr(lowering, "_native_eval_arrays", None)
    for use_c in (True, False):
        device = _device_for(driver)
        calls, picks = [], []
        if use_c:
            monkeypatch.setattr(lowering, "_native_submit", _counting(c_submit, calls))
            monkeypatch.setattr(lowering, "_native_pick", _counting(c_pick, picks))
        else:
            monkeypatch.setattr(lowering, "_native_submit", None)
            monkeypatch.setattr(lowering, "_native_pick", None)
        try:
            outcomes.append(_submit_program(device))
        finally:
            device.close()
        if use_c:
            assert any(calls) and not all(calls)  # the C code made the repeats, Python the first runs
            assert any(picks) and not all(picks)  # and picked the usual recordings, Python the rest
    assert outcomes[0] == outcomes[1]


def _device_for(driver: str):
    """A fresh device of `driver`: a CPU driver's, or ``fake-gpu``, the simulated GPU in graph mode."""
    if driver == "fake-gpu":
        fake_gpu = pytest.importorskip("drivers.fake_gpu")
        return fake_gpu.FakeGpuDriver().create_device(command_buffer="graph")
    return hal.create_device(driver)


def _counting(fn, calls: list):
    """`fn` noting in `calls` whether it made the submission (True), declined it (False) or raised."""
    def counted(*args):
        try:
            result = fn(*args)
        except BaseException:
            calls.append("raised")
            raise
        calls.append(result is not None)
        return result
    return counted


def _refused_program(device) -> tuple:
    """A graph run twice, then again with the device refusing the submission: the error, and the
    buffer cache before and after (the buffers taken for it go back)."""
    ctx = rt.device.context_for(device)
    a = rt.array(np.arange(4096, dtype=np.float32), device=ctx)
    for _ in range(2):
        rt.eval(rt.exp(a))
    cache = ctx.buffers
    before = (cache.free_bytes, cache.hits)

    def refuse(*args, **kwargs):
        raise hal.ResourceExhaustedError("refused")

    device.queue_execute = refuse
    try:
        with pytest.raises(hal.HalError) as info:
            rt.eval(rt.exp(a))
    finally:
        del device.queue_execute
        device.close()
    return type(info.value), before, (cache.free_bytes, cache.hits), ctx.submitted


@native
def test_c_submit_gives_the_buffers_back_when_the_device_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    c_evaluate = lowering._native_evaluate
    from_c_evaluate = _refused_program(hal.create_device("local-task"))  # refused inside the C evaluate
    monkeypatch.setattr(lowering, "_native_evaluate", None)
    monkeypatch.setattr(lowering, "_native_eval_arrays", None)
    monkeypatch.setattr(lowering, "_native_submit", _counting(lowering._native_submit, calls))
    from_c = _refused_program(hal.create_device("local-task"))
    assert calls == [False, True, "raised"]  # recorded, repeated in C, refused in C
    monkeypatch.setattr(lowering, "_native_submit", None)
    from_python = _refused_program(hal.create_device("local-task"))
    assert from_c == from_python == from_c_evaluate
    assert from_c[0] is hal.ResourceExhaustedError and from_c[2][0] == from_c[1][0]
    assert c_evaluate is not None


@native
def test_c_submit_declines_what_is_not_its_case() -> None:
    from runtime.array import NATIVE

    ctx = rt.device.context_for(hal.create_device("local-task"))
    a = rt.array(np.ones(8, np.float32), device=ctx)
    rt.eval(a + 1.0)
    rec = next(r for entry in ctx.graphs._entries.values() for r in entry.recs)
    ext = list(rec.last_ext)
    assert NATIVE.submit(object(), rec, ext) is None and NATIVE.submit(ctx, object(), ext) is None
    assert NATIVE.submit(ctx, rec, tuple(ext)) is None  # not a list
    assert NATIVE.submit(ctx, rec, ext + ext) is None  # not its externals' count
    ctx.queued.append((rec.cb, rec.last_table))  # queued replays go first: the Python code
    assert NATIVE.submit(ctx, rec, ext) is None
    ctx.queued.clear()
    submitted = ctx.submitted
    table, value = NATIVE.submit(ctx, rec, ext)
    assert value == submitted + 1 == ctx.submitted and table[:len(ext)] == ext
    ctx.wait(value)
    with pytest.raises(TypeError):
        NATIVE.submit(ctx, rec)
    # pick: the recording that last ran with these externals, its buffers free; else ask Python
    assert NATIVE.pick([rec], rec.last_ext, ctx.buffers) is rec
    assert NATIVE.pick([rec], ext + ext, ctx.buffers) is None  # no recording ran with these
    assert NATIVE.pick((rec,), ext, ctx.buffers) is None and NATIVE.pick([rec], ext, object()) is None
    rec.moved = True  # its buffers are checked now: the submission above kept its result's buffer
    assert NATIVE.pick([rec], rec.last_ext, ctx.buffers) is None
    ctx.buffers.release(rec.last_table[rec.n_ext], rec.buckets[0])  # free again
    assert NATIVE.pick([rec], rec.last_ext, ctx.buffers) is rec
    ctx.device.close()


def _python_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every eval step in Python: the walk, pick, submit, attach, evaluate and Storage.__del__."""
    for name in ("_native_walk", "_native_pick", "_native_submit", "_native_attach", "_native_evaluate",
                 "_native_eval_arrays"):
        monkeypatch.setattr(lowering, name, None)
    monkeypatch.setattr(Storage, "__del__", lowering._python_storage_del)
    monkeypatch.setattr(rt.device.DeviceContext, "wait", lowering._python_context_wait)


def _noting(evaluate, seen: list):
    """The C evaluate noting in `seen` whether it made the eval, walked only, or declined."""
    def noted(*args):
        result = evaluate(*args)
        seen.append("done" if result is True else "declined" if result is False else "walked")
        return result
    return noted


@native
@pytest.mark.parametrize("entry", ["evaluate", "eval_arrays"])
@pytest.mark.parametrize("driver", ["local-task", "fake-gpu"])
def test_c_evaluate_makes_the_python_evals(driver: str, entry: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The eval of a graph the cache holds, all in C (and a storage's buffer given back in C),
    against the Python code: the same results, buffer-cache and graph-cache counters, recordings.
    ``evaluate``: entered from lowering._evaluate_on (noting what it did); ``eval_arrays``: from
    rt.eval, grouping and locking in C too."""
    outcomes = []
    if entry == "evaluate":
        monkeypatch.setattr(lowering, "_native_eval_arrays", None)
    for use_c in (True, False):
        device = _device_for(driver)
        seen: list = []
        with monkeypatch.context() as patch:
            if use_c:
                patch.setattr(lowering, "_native_evaluate", _noting(lowering._native_evaluate, seen))
            else:
                _python_only(patch)
            try:
                outcomes.append(_submit_program(device))
            finally:
                device.close()
        if use_c and entry == "evaluate":  # first runs and busy buffers went on in Python, repeats in C
            assert "done" in seen and "walked" in seen
    assert outcomes[0] == outcomes[1]


@native
def test_c_evaluate_goes_on_in_python_where_it_must(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime import graph_cache
    from runtime.array import NATIVE

    ctx = rt.device.context_for(hal.create_device("local-task"))
    a = rt.array(np.arange(8, dtype=np.float32), device=ctx)
    with pytest.raises(TypeError):
        NATIVE.evaluate(ctx, [a])
    assert NATIVE.evaluate(object(), [a + 1.0], True) is False and NATIVE.evaluate(ctx, (a + 1.0,), True) is False

    def walked(result) -> bool:
        return isinstance(result, tuple) and len(result) == 4

    first = a + 1.0
    assert walked(NATIVE.evaluate(ctx, [first], True))  # a miss: the Python code records it
    assert first.storage is None and ctx.graphs.stats()["misses"] == 0 == ctx.graphs.stats()["hits"]
    rt.eval(first)
    del first  # its buffer is free again: the recording's table stays as it was
    hits = ctx.graphs.stats()["hits"]
    again = a + 1.0
    assert NATIVE.evaluate(ctx, [again], True) is True and again.storage is not None
    assert ctx.graphs.stats()["hits"] == hits + 1
    np.testing.assert_array_equal(again.numpy(), np.arange(8, dtype=np.float32) + 1)
    monkeypatch.setattr(graph_cache, "ENABLED", False)
    assert walked(NATIVE.evaluate(ctx, [a + 1.0], True))
    monkeypatch.setattr(graph_cache, "ENABLED", True)
    rec = next(r for entry in ctx.graphs._entries.values() for r in entry.recs)
    rec.deferred.append("a fused kernel")  # due or not: the Python code's question
    try:
        assert walked(NATIVE.evaluate(ctx, [a + 1.0], True))
    finally:
        rec.deferred.clear()
    ctx.device.close()


@native
def test_c_storage_release_gives_the_buffer_back() -> None:
    ctx = rt.device.context_for(hal.create_device("local-task"))
    x = rt.exp(rt.array(np.ones(1000, np.float32), device=ctx))
    rt.eval(x)
    st = x.root.storage
    buffer, bucket = st.buffer, st.bucket
    free = ctx.buffers.free_bytes
    del x, st
    assert ctx.buffers.free_bytes == free + bucket
    assert ctx.buffers._free[bucket][id(buffer)] == (buffer, ctx.submitted)
    orphan = Storage.__new__(Storage)  # no fields: nothing to give back, and no error
    orphan.ctx = None
    del orphan
    ctx.device.close()


@native
def test_c_eval_arrays_takes_the_usual_call_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """rt.eval's usual call (pending arrays of one context) in C; anything else is lowering.evaluate's."""
    import threading

    from hal import tracing

    eval_arrays = lowering._native_eval_arrays
    ctx = rt.device.context_for(hal.create_device("local-task"))
    other = rt.device.context_for(hal.create_device("local-sync"))
    a = rt.array(np.arange(6, dtype=np.float32), device=ctx)
    b = rt.array(np.ones(6, np.float32), device=other)
    assert eval_arrays([a + 1.0]) is False  # a list: the Python code flattens containers
    assert eval_arrays(()) is False and eval_arrays((a,)) is False  # nothing, or computed already
    assert eval_arrays((a + 1.0, b * 2.0)) is False  # two contexts
    assert eval_arrays((a + 1.0, [a])) is False
    monkeypatch.setattr(tracing, "ENABLED", True)
    assert eval_arrays((a + 1.0,)) is False
    monkeypatch.setattr(tracing, "ENABLED", False)
    x, y = a + 1.0, (a * 3.0)[2:]  # a view: its root is evaluated
    assert eval_arrays((x, y, x)) is True
    np.testing.assert_array_equal(x.numpy(), np.arange(6) + 1.0)
    np.testing.assert_array_equal(y.numpy(), (np.arange(6) * 3.0)[2:])
    for _ in range(3):  # repeats: made in C from the walk to attach
        z = rt.exp(a)
        assert eval_arrays((z,)) is True
    np.testing.assert_allclose(z.numpy(), np.exp(np.arange(6, dtype=np.float32)), rtol=1e-6)

    def refuse(*args, **kwargs):
        raise hal.ResourceExhaustedError("refused")

    ctx.device.queue_execute = refuse
    with pytest.raises(hal.ResourceExhaustedError):
        eval_arrays((rt.exp(a),))
    del ctx.device.queue_execute
    got = []

    def take_the_lock() -> None:
        got.append(ctx.lock.acquire(timeout=5))
        if got[-1]:
            ctx.lock.release()

    thread = threading.Thread(target=take_the_lock)
    thread.start()
    thread.join()
    assert got == [True]  # the failed eval let the context's lock go
    np.testing.assert_allclose(rt.exp(a).numpy(), np.exp(np.arange(6, dtype=np.float32)), rtol=1e-6)
    ctx.device.close()
    other.device.close()


def _failing_program(device) -> tuple:
    """Waits on a context whose work fails (a kernel raising): what each wait raised, the
    context's timeline after its recovery, and a value computed afterwards."""
    ctx = rt.device.context_for(device)
    a = rt.array(np.arange(4, dtype=np.float32), device=ctx)
    x = a + 1.0
    rt.eval(x)
    ctx.wait(np.int64(x.root.storage.ready))  # a numpy value: the Python method
    ctx.wait(x.root.storage.ready)  # reached: nothing to do
    results = [x.numpy().tolist()]
    y = a * 2.0
    rt.eval(y)
    value = y.root.storage.ready
    old = ctx.semaphore
    old.fail(hal.HalError(13, "the work failed"))  # as a failed kernel fails the timeline
    with pytest.raises(hal.AbortedError) as info:
        ctx.wait(value)
    results.append((type(info.value), ctx.semaphore is not old, ctx.completed == ctx.submitted, old in ctx.failed))
    results.append((a - 1.0).numpy().tolist())
    device.close()
    return results


@native
def test_c_context_wait_waits_and_recovers_as_the_python_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from_c = _failing_program(hal.create_device("local-task"))
    with monkeypatch.context() as patch:
        _python_only(patch)
        from_python = _failing_program(hal.create_device("local-task"))
    assert from_c == from_python
    assert from_c[1] == (hal.AbortedError, True, True, True)
