"""Runtime benchmarks with baselines measured in the same run; prints JSON (ratios > 1: the runtime wins).

    python benchmarks/runtime_bench.py [--device URI] [--elements N] [--steps N] [--out FILE]

- logistic regression, 1000 x 100 (MLX's example shape), full-batch steps:
  lazy eager mode with rt.value_and_grad (one eval per step) and under rt.compile,
  against PyTorch eager with autograd and (on cuda) PyTorch CUDA-graph replay of a
  hand-written step, and against the same step written in plain numpy;
- elementwise add and sum over 64M float32 against the device's copy bandwidth
  (HAL copy_buffer on a GPU; numpy copy on a CPU driver) and against plain numpy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import hal
import runtime as rt


def best_of(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def rate(fn, steps: int, rounds: int = 3) -> float:
    """Iterations per second of fn() (median of rounds of `steps` calls)."""
    fn()
    rates = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(steps):
            fn()
        rates.append(steps / (time.perf_counter() - t))
    return statistics.median(rates)


# ---- logistic regression ----------------------------------------------------------------------

def logistic_data(n: int = 1000, d: int = 100, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    w_true = rng.standard_normal(d).astype(np.float32)
    y = (X @ w_true > 0).astype(np.float32)
    return X, y


def loss_fn(w, X, y):
    z = X @ w
    return (rt.maximum(z, 0.0) + rt.log(1.0 + rt.exp(-abs(z))) - y * z).mean()


def bench_logistic(device: str | None, steps: int) -> dict:
    X_np, y_np = logistic_data()
    lr = 0.1
    X, y = rt.array(X_np, device=device), rt.array(y_np, device=device)
    vg = rt.value_and_grad(loss_fn)
    state = {"w": rt.zeros((100,), device=device)}

    ctx = rt.device.context_for(device)

    def eager_step():
        loss, g = vg(state["w"], X, y)
        state["w"] = state["w"] - lr * g
        rt.eval(state["w"], loss)
        ctx.wait_storage(loss.root.storage)  # the step is done (as the baselines synchronize)

    def step(w, X, y):
        loss, g = vg(w, X, y)
        return w - lr * g, loss

    compiled = rt.compile(step)
    cstate = {"w": rt.zeros((100,), device=device)}

    def compiled_step():
        cstate["w"], loss = compiled(cstate["w"], X, y)
        ctx.wait_storage(loss.root.storage)

    out = {}
    eager = rate(eager_step, steps)
    rt.synchronize(device)
    comp = rate(compiled_step, steps)
    rt.synchronize(device)
    out["runtime_eager_grad_it_s"] = eager
    out["runtime_compile_it_s"] = comp

    # plain numpy, hand-written gradient (the CPU reference of the same computation)
    w_np = np.zeros(100, np.float32)

    def numpy_step():
        nonlocal w_np
        z = X_np @ w_np
        p = 1 / (1 + np.exp(-z))
        g = X_np.T @ (p - y_np) / len(y_np)
        w_np = w_np - lr * g

    out["numpy_hand_gradient_it_s"] = rate(numpy_step, steps)
    w_same = np.zeros(100, np.float32)

    def numpy_same_ops():
        # the forward and backward ops the runtime's graph evaluates, one numpy call each
        nonlocal w_same
        n = np.float32(len(y_np))
        z = X_np @ w_same
        az = np.abs(z)
        e = np.exp(-az)
        lg = np.log(1 + e)
        sp = np.maximum(z, 0) + lg
        loss = np.mean(sp - y_np * z)
        g = np.full(z.shape, 1 / n, np.float32)
        dz = -(g * y_np)
        dsp = g
        dz = dz + np.where(z >= 0, dsp, 0)
        dlg = dsp / (1 + e)
        de = -(dlg * e)
        daz = de
        dz = dz + np.where(z >= 0, daz, -daz)
        gw = X_np.T @ dz
        w_same = w_same - lr * gw
        return loss

    out["numpy_same_ops_it_s"] = rate(numpy_same_ops, steps)
    out["eager_vs_numpy_same_ops"] = eager / out["numpy_same_ops_it_s"]
    out["compile_vs_numpy_same_ops"] = comp / out["numpy_same_ops_it_s"]
    out["compile_vs_numpy_hand_gradient"] = comp / out["numpy_hand_gradient_it_s"]
    out.update(torch_baselines(X_np, y_np, lr, steps, rt.device.context_for(device).device))
    if "torch_eager_autograd_it_s" in out:
        out["eager_vs_torch_eager"] = eager / out["torch_eager_autograd_it_s"]
    if "torch_cuda_graph_it_s" in out:
        out["compile_vs_torch_cuda_graph"] = comp / out["torch_cuda_graph_it_s"]
    return out


def torch_baselines(X_np, y_np, lr, steps, device: hal.Device) -> dict:
    try:
        import torch
    except ImportError:
        return {"torch": "absent"}
    on_cuda = device.info.driver == "cuda" and torch.cuda.is_available()
    tdev = "cuda" if on_cuda else "cpu"
    X = torch.from_numpy(X_np).to(tdev)
    y = torch.from_numpy(y_np).to(tdev)
    w = torch.zeros(100, device=tdev, requires_grad=True)

    def eager():
        z = X @ w
        loss = torch.nn.functional.softplus(z).sub(y * z).mean()
        loss.backward()
        with torch.no_grad():
            w.sub_(lr * w.grad)
            w.grad = None
        if on_cuda:
            torch.cuda.synchronize()

    out = {"torch_device": tdev, "torch_eager_autograd_it_s": rate(eager, steps)}
    if on_cuda:
        wg = torch.zeros(100, device=tdev)

        def hand_step():
            z = X @ wg
            g = X.T @ (torch.sigmoid(z) - y) / y.shape[0]
            wg.sub_(lr * g)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                hand_step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            hand_step()

        def replay():
            graph.replay()
            torch.cuda.synchronize()

        out["torch_cuda_graph_it_s"] = rate(replay, steps)
    return out


# ---- bandwidth-bound kernels ------------------------------------------------------------------

def device_copy_seconds(device: hal.Device, nbytes: int, repeats: int) -> float:
    src = device.allocator.allocate(nbytes)
    dst = device.allocator.allocate(nbytes)
    sem = device.create_semaphore(0)
    cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.copy_buffer(src, dst)
    value = [0]

    def once():
        value[0] += 1
        device.queue_execute([cb], signal=[(sem, value[0])])
        sem.wait(value[0])

    t = best_of(once, repeats)
    src.release()
    dst.release()
    return t


def bench_bandwidth(device: str | None, n: int, repeats: int) -> dict:
    ctx = rt.device.context_for(device)
    rng = np.random.default_rng(1)
    a_np = rng.standard_normal(n, dtype=np.float32)
    b_np = rng.standard_normal(n, dtype=np.float32)
    a, b = rt.array(a_np, device=device), rt.array(b_np, device=device)
    holder = {}

    def rt_add():
        c = a + b
        rt.eval(c)
        ctx.wait(c.root.storage.ready)
        holder["c"] = c  # freed on the next call, so the buffer cache recycles it

    def rt_sum():
        s = a.sum()
        rt.eval(s)
        ctx.wait(s.root.storage.ready)

    t_add = best_of(rt_add, repeats)
    holder.clear()
    t_sum = best_of(rt_sum, repeats)
    nbytes = n * 4
    out = {"elements": n, "add_s": t_add, "sum_s": t_sum,
           "add_GBps": 3 * nbytes / t_add / 1e9, "sum_GBps": nbytes / t_sum / 1e9}
    if ctx.is_gpu:
        t_copy = device_copy_seconds(ctx.device, nbytes, repeats)
        out["copy_baseline"] = "hal copy_buffer"
    else:
        dst = np.empty_like(a_np)
        t_copy = best_of(lambda: np.copyto(dst, a_np), repeats)
        out["copy_baseline"] = "numpy copyto"
    out["copy_GBps"] = 2 * nbytes / t_copy / 1e9
    out["add_vs_copy_bandwidth"] = out["add_GBps"] / out["copy_GBps"]
    out["sum_vs_copy_bandwidth"] = out["sum_GBps"] / out["copy_GBps"]
    # the same computations in plain numpy (allocating results as numpy code does)
    t_np_add = best_of(lambda: a_np + b_np, repeats)
    t_np_sum = best_of(lambda: a_np.sum(), repeats)
    out["numpy_add_s"] = t_np_add
    out["numpy_sum_s"] = t_np_sum
    out["add_vs_numpy"] = t_np_add / t_add
    out["sum_vs_numpy"] = t_np_sum / t_sum
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="HAL device URI (default: the best available)")
    parser.add_argument("--elements", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--steps", type=int, default=200, help="training steps per timing round")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    dev = rt.set_default_device(args.device) if args.device else rt.default_device()
    info = dev.info
    report = {"device": {"name": info.name, "uri": info.uri, "driver": info.driver},
              "logistic_regression_1000x100": bench_logistic(args.device, args.steps),
              "bandwidth": bench_bandwidth(args.device, args.elements, args.repeats)}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
