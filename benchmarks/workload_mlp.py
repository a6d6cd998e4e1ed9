"""The 2-layer MLP training step of ``workload_bench.py``: float32, batch 512, 1024 -> 4096 -> 1024,
ReLU, mean-squared-error loss, plain SGD.

Contenders: the runtime's eager step (``rt.value_and_grad``, one ``rt.eval`` a step) and the same
step under ``rt.compile``; on a GPU PyTorch eager (autograd, ``torch.optim.SGD``) and torch.compile
of the same loss and update; on a CPU driver the step written by hand in numpy. Before any timing,
one step of each runtime variant from the same weights is compared with the baseline's step.
"""

from __future__ import annotations

import numpy as np
from workload_timing import Contender, Settings, timed

import runtime as rt

LR = 0.1
FULL = (512, 1024, 4096, 1024)  # batch, inputs, hidden, outputs
QUICK = (64, 128, 256, 128)
#: Gradients and the loss: max |ours - reference| / max |reference| (GEMMs of up to 4096 terms,
#: summed in another order on each side).
GRAD_TOLERANCE = 1e-4
#: No hidden pre-activation of the first step is closer than this to ReLU's kink (see away_from_the_kink).
KINK = 1e-4
#: An updated weight may differ by this many float32 ulps of itself, beyond GRAD_TOLERANCE of its update.
PARAM_ULPS = 2


def data(rng: np.random.Generator, quick: bool) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    batch, n_in, hidden, n_out = QUICK if quick else FULL
    params = [
        (rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32),
        (0.01 * rng.standard_normal(hidden)).astype(np.float32),
        (rng.standard_normal((hidden, n_out)) / np.sqrt(hidden)).astype(np.float32),
        (0.01 * rng.standard_normal(n_out)).astype(np.float32),
    ]
    x = rng.standard_normal((batch, n_in), dtype=np.float32)
    away_from_the_kink(rng, x, params[0], params[1])
    y = rng.standard_normal((batch, n_out), dtype=np.float32)
    return params, x, y


def global_batch(quick: bool, parts: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, int]:
    """The data-parallel benchmarks' data: the MLP's parameters, a global batch (inputs, targets) of
    ``parts`` batches, and the batch a part (a GPU's)."""
    rng = np.random.default_rng(0)
    params, _, _ = data(rng, quick)
    batch = (QUICK if quick else FULL)[0]
    x_all = rng.standard_normal((batch * parts, params[0].shape[0]), dtype=np.float32)
    away_from_the_kink(rng, x_all, params[0], params[1])
    y_all = rng.standard_normal((batch * parts, params[2].shape[1]), dtype=np.float32)
    return params, x_all, y_all, batch


def away_from_the_kink(rng: np.random.Generator, x: np.ndarray, w1: np.ndarray, b1: np.ndarray) -> None:
    """Redraw the samples (rows of x) with a hidden pre-activation within KINK of 0. There ReLU's
    derivative jumps, and float32 rounding (a few 1e-6 here, different in every GEMM's order of
    summation) decides on which side a unit falls: one sample's whole term of the first layer's
    gradient comes or goes, and two correct steps disagree by percents (seen on the H100 host:
    numpy's own float32 step against its float64 one, 2.2% of the largest gradient)."""
    rows = np.arange(len(x))
    while rows.size:
        pre = x[rows].astype(np.float64) @ w1 + b1
        rows = rows[(np.abs(pre) < KINK).any(axis=1)]
        x[rows] = rng.standard_normal((rows.size, x.shape[1]), dtype=np.float32)


def flop(x: np.ndarray, params: list[np.ndarray]) -> float:
    """The step's GEMM work: both forward products, and backward the two weight gradients and the
    hidden layer's gradient (the input's is not needed)."""
    batch, n_in = x.shape
    hidden, n_out = params[2].shape
    return 2.0 * batch * (2 * n_in * hidden + 3 * hidden * n_out)


# ---- the runtime ----------------------------------------------------------------------------------

def loss(w1, b1, w2, b2, x, y):
    h = rt.maximum(x @ w1 + b1, 0.0)
    d = h @ w2 + b2 - y
    return (d * d).mean()


value_and_grad = rt.value_and_grad(loss, argnums=(0, 1, 2, 3))


def step(w1, b1, w2, b2, x, y):
    value, grads = value_and_grad(w1, b1, w2, b2, x, y)
    return (*(p - LR * g for p, g in zip((w1, b1, w2, b2), grads)), value)


def host_copies(arrays) -> list[np.ndarray]:
    """Copies on the host: np.asarray may view a buffer that the runtime's buffer cache hands to
    later work once the array is gone."""
    return [np.array(np.asarray(a)) for a in arrays]


def runtime_side(params, x_np, y_np, device) -> tuple[dict, dict]:
    """(name -> Contender, the first step of each variant as numpy: params, loss, and the eager grads)."""
    x, y = rt.array(x_np, device=device), rt.array(y_np, device=device)
    start = [rt.array(p, device=device) for p in params]
    first = {}
    value, grads = value_and_grad(*start, x, y)
    updated = [p - LR * g for p, g in zip(start, grads)]
    rt.eval(value, *grads, *updated)
    first["runtime_eager"] = {"loss": float(value), "grads": host_copies(grads), "params": host_copies(updated)}
    compiled = rt.compile(step)
    *updated, value = compiled(*start, x, y)
    first["runtime_compile"] = {"loss": float(value), "params": host_copies(updated)}

    eager_state = list(start)
    compiled_state = list(start)

    def eager(count: int) -> None:
        for _ in range(count):
            value, grads = value_and_grad(*eager_state, x, y)
            eager_state[:] = [p - LR * g for p, g in zip(eager_state, grads)]
            rt.eval(value, *eager_state)

    def compiled_run(count: int) -> None:
        for _ in range(count):
            compiled_state[:] = compiled(*compiled_state, x, y)[:4]

    def sync() -> None:
        rt.synchronize(device)

    return {"runtime_eager": Contender(eager, sync), "runtime_compile": Contender(compiled_run, sync)}, first


# ---- numpy, by hand ---------------------------------------------------------------------------------

def numpy_grads(params, x, y):
    w1, b1, w2, b2 = params
    pre = x @ w1 + b1
    h = np.maximum(pre, 0)
    d = h @ w2 + b2 - y
    g_out = d * np.float32(2.0 / d.size)
    g_h = (g_out @ w2.T) * (pre > 0)
    return float((d * d).mean()), [x.T @ g_h, g_h.sum(axis=0), h.T @ g_out, g_out.sum(axis=0)]


def numpy_side(params, x, y) -> tuple[dict, dict]:
    value, grads = numpy_grads(params, x, y)
    first = {"loss": value, "grads": grads, "params": [p - np.float32(LR) * g for p, g in zip(params, grads)]}
    state = [p.copy() for p in params]

    def run(count: int) -> None:
        for _ in range(count):
            _, grads = numpy_grads(state, x, y)
            state[:] = [p - np.float32(LR) * g for p, g in zip(state, grads)]

    return {"numpy": Contender(run, lambda: None)}, first


# ---- PyTorch ------------------------------------------------------------------------------------------

def torch_loss(x, y, w1, b1, w2, b2):
    h = (x @ w1 + b1).relu()
    d = h @ w2 + b2 - y
    return (d * d).mean()


def sgd(weights, grads) -> None:
    for w, g in zip(weights, grads):
        w.add_(g, alpha=-LR)


def torch_side(torch, params, x_np, y_np, with_compile: bool) -> tuple[dict, dict, dict]:
    """(name -> Contender, the first eager step as numpy, notes). The update is the plain in-place
    one (one fused kernel a weight, a few µs of host each): torch.optim.SGD's Python made the eager
    step host-bound on the H100's host (0.82 against 0.68 ms a step), a baseline weaker than
    PyTorch can be."""
    import workload_torch as wt

    x, y = wt.tensor(torch, x_np), wt.tensor(torch, y_np)

    def trainer(loss_fn, update):
        weights = [wt.tensor(torch, p, requires_grad=True) for p in params]

        def run(count: int) -> None:
            for _ in range(count):
                loss_fn(x, y, *weights).backward()
                with torch.no_grad():
                    update(weights, [w.grad for w in weights])
                for w in weights:
                    w.grad = None

        return weights, Contender(run, torch.cuda.synchronize)

    weights, eager = trainer(torch_loss, sgd)
    contenders, notes = {"torch_eager": eager}, {}
    # The reference step, on the eager trainer's weights before any timing.
    value = torch_loss(x, y, *weights)
    value.backward()
    grads = [wt.to_numpy(w.grad) for w in weights]
    with torch.no_grad():
        sgd(weights, [w.grad for w in weights])
    for w in weights:
        w.grad = None
    first = {"loss": value.item(), "grads": grads, "params": [wt.to_numpy(w) for w in weights]}
    if with_compile:
        contenders["torch_compile"] = trainer(wt.compiled(torch, torch_loss), wt.compiled(torch, sgd))[1]
        notes["torch_compile"] = "the loss with its backward (AOTAutograd) and the update each torch.compile'd"
    return contenders, first, notes


# ---- agreement ---------------------------------------------------------------------------------------

def relative(ours: np.ndarray, ref: np.ndarray) -> float:
    scale = float(np.abs(ref).max()) or 1.0
    return float(np.abs(ours.astype(np.float64) - ref).max()) / scale


def params_agree(ours: list, ref: list, start: list) -> tuple[bool, float]:
    """Whether each updated weight is within PARAM_ULPS float32 ulps of the reference's plus
    GRAD_TOLERANCE of the largest update (comparing updates, not weights, which barely move), and the
    largest difference as a fraction of that update."""
    ok, worst = True, 0.0
    for o, r, s in zip(ours, ref, start):
        o, r, s = (np.asarray(a, np.float64) for a in (o, r, s))
        step_size = float(np.abs(r - s).max()) or 1.0
        allowed = GRAD_TOLERANCE * step_size + PARAM_ULPS * np.spacing(np.abs(r).astype(np.float32))
        diff = np.abs(o - r)
        ok = ok and bool((diff <= allowed).all())
        worst = max(worst, float(diff.max()) / step_size)
    return ok, worst


def agreement(first: dict, reference: dict, start: list, against: str) -> dict:
    out = {"against": against, "grad_tolerance": GRAD_TOLERANCE, "param_ulps": PARAM_ULPS}
    ok = True
    for name, result in first.items():
        entry = {"loss_rel_err": abs(result["loss"] - reference["loss"]) / (abs(reference["loss"]) or 1.0)}
        entry["loss_ok"] = entry["loss_rel_err"] <= GRAD_TOLERANCE
        if "grads" in result:
            entry["grad_max_rel_err"] = max(relative(g, r) for g, r in zip(result["grads"], reference["grads"]))
            entry["grads_ok"] = entry["grad_max_rel_err"] <= GRAD_TOLERANCE
        entry["params_ok"], entry["param_err_vs_update"] = params_agree(result["params"], reference["params"], start)
        entry["ok"] = all(v for k, v in entry.items() if k.endswith("_ok"))
        ok = ok and entry["ok"]
        out[name] = entry
    out["ok"] = ok
    return out


def bench(settings: Settings) -> dict:
    params, x, y = data(settings.rng, settings.quick)
    out = {"title": "2-layer MLP training step, float32, SGD", "shape": {
        "batch": x.shape[0], "inputs": x.shape[1], "hidden": params[0].shape[1], "outputs": params[2].shape[1]},
        "lr": LR}
    contenders, first = runtime_side(params, x, y, settings.device)
    if settings.torch is not None:
        theirs, reference, notes = torch_side(settings.torch, params, x, y, settings.torch_compile)
        out["notes"] = notes
        against = "PyTorch eager step"
    else:
        theirs, reference = numpy_side(params, x, y)
        against = "numpy step"
    contenders.update(theirs)
    out["check"] = agreement(first, reference, params, against)
    # Each side's gradients against float64 (numpy): when the two disagree, which one is off.
    _, exact = numpy_grads([p.astype(np.float64) for p in params], x.astype(np.float64), y.astype(np.float64))
    out["check"]["grad_err_vs_float64"] = {
        name: max(relative(g, e) for g, e in zip(side["grads"], exact))
        for name, side in (("runtime_eager", first["runtime_eager"]), ("baseline", reference))}
    out.update(timed(settings, contenders, ("runtime_eager", "runtime_compile"), flop=flop(x, params)))
    return out
