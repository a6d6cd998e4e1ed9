"""Runtime benchmarks with baselines measured in the same run; prints JSON (ratios > 1: the runtime wins).

    python benchmarks/runtime_bench.py [--device URI] [--elements N] [--steps N] [--out FILE]
    python benchmarks/runtime_bench.py --host-cost [--out FILE]

- logistic regression, 1000 x 100 (MLX's example shape), full-batch steps:
  lazy eager mode with rt.value_and_grad (one eval per step) and under rt.compile,
  against PyTorch eager with autograd and (on cuda) PyTorch CUDA-graph replay of a
  hand-written step, and against the same step written in plain numpy. Every loop is
  timed twice, both sides alike: `synced` waits for each step's result before the next
  step (as reading the loss every step does); `pipelined` waits only once, after the
  last step of the round (the steps queue up, as in a loop that reads the loss rarely).
  Every timing ends with the device idle;
- elementwise add and sum over 64M float32 against the device's copy bandwidth
  (HAL copy_buffer on a GPU; numpy copy on a CPU driver) and against plain numpy.
  Bandwidth counts the bytes an op must move: add reads two arrays and writes one,
  sum reads one, copy reads one and writes one. `single` times one op from the call
  to its result on the host (graph building, submission and the wait included);
  `pipelined` queues 10 of the same op and waits once (the device's throughput). The three ops
  are timed in turn, a few samples each round, and each keeps its best time.
- `--host-cost`: the host's share of a logistic step over the simulated GPU of the tests
  (`tests/drivers/fake_gpu.py`, graph and stream command buffers), compiled and eager:
  Python bytecodes executed on the calling thread per step (deterministic; split into the
  runtime's and the rest: HAL core, GPU driver, simulated API) and that thread's CPU time
  per step (median and spread of rounds). Host work is what the H100 runs show limits these
  steps; this measures it on any machine.
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


def interleaved(contenders: dict, steps: int, rounds: int) -> tuple[dict, dict]:
    """Iterations per second of each contender, rounds taken in turn (one round of every contender,
    then the next round), so that drift of the host's speed hits all alike.

    contenders: name -> (step function, finish function run at the end of a round).
    Returns (wall, cpu): name -> per-round rates by wall-clock time and by this process's CPU
    time (all its threads; on a shared host the CPU clock does not count other processes' turns,
    but it misses time a device works while the host waits: it fits CPU drivers only).
    """
    for fn, finish in contenders.values():
        fn()
        finish()
    wall: dict = {name: [] for name in contenders}
    cpu: dict = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (fn, finish) in contenders.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(steps):
                fn()
            finish()
            wall[name].append(steps / (time.perf_counter() - t))
            cpu[name].append(steps / max(time.process_time() - c, 1e-9))
    return wall, cpu


def ratio_stats(out: dict, name: str, num: list, den: list) -> None:
    """out[name]: the median of the per-round ratios num[i] / den[i]; out[name + "_spread"]: [min, max]."""
    ratios = sorted(a / b for a, b in zip(num, den))
    out[name] = statistics.median(ratios)
    out[name + "_spread"] = [ratios[0], ratios[-1]]


def bench_logistic(device: str | None, steps: int, rounds: int = 7) -> dict:
    X_np, y_np = logistic_data()
    lr = 0.1
    X, y = rt.array(X_np, device=device), rt.array(y_np, device=device)
    vg = rt.value_and_grad(loss_fn)
    state = {"w": rt.zeros((100,), device=device)}
    ctx = rt.device.context_for(device)

    def sync() -> None:
        rt.synchronize(device)

    def eager_step(wait: bool) -> None:
        loss, g = vg(state["w"], X, y)
        state["w"] = state["w"] - lr * g
        rt.eval(state["w"], loss)
        if wait:
            ctx.wait_storage(loss.root.storage)  # the step's results are ready

    def step(w, X, y):
        loss, g = vg(w, X, y)
        return w - lr * g, loss

    compiled = rt.compile(step)
    cstate = {"w": rt.zeros((100,), device=device)}

    def compiled_step(wait: bool) -> None:
        cstate["w"], loss = compiled(cstate["w"], X, y)
        if wait:
            ctx.wait_storage(loss.root.storage)

    # plain numpy, hand-written gradient (the CPU reference of the same computation)
    np_state = {"w": np.zeros(100, np.float32)}

    def numpy_step():
        w_np = np_state["w"]
        z = X_np @ w_np
        p = 1 / (1 + np.exp(-z))
        g = X_np.T @ (p - y_np) / len(y_np)
        np_state["w"] = w_np - lr * g

    same = {"w": np.zeros(100, np.float32)}

    def numpy_same_ops():
        # the forward and backward ops the runtime's graph evaluates, one numpy call each
        w_same = same["w"]
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
        same["w"] = w_same - lr * gw
        return loss

    def nothing() -> None:
        pass

    torch_info, torch_steps = torch_contenders(X_np, y_np, lr, ctx.device)
    rates = interleaved({
        "runtime_eager_grad": (lambda: eager_step(True), sync),
        "runtime_compile": (lambda: compiled_step(True), sync),
        "runtime_eager_grad_pipelined": (lambda: eager_step(False), sync),
        "runtime_compile_pipelined": (lambda: compiled_step(False), sync),
        "numpy_hand_gradient": (numpy_step, nothing),
        "numpy_same_ops": (numpy_same_ops, nothing),
        **torch_steps,
    }, steps, rounds)
    rates, cpu_rates = rates
    out = {f"{name}_it_s": statistics.median(r) for name, r in rates.items()}
    out.update(torch_info)
    out["rounds"] = rounds
    w_check = cstate["w"].numpy()
    out["compile_weights_finite"] = bool(np.isfinite(w_check).all())
    out["compile_matches_numpy"] = bool(np.allclose(w_check, state["w"].numpy(), rtol=1e-3, atol=1e-5))
    for mode, name in (("eager", "runtime_eager_grad"), ("compile", "runtime_compile")):
        for base in ("numpy_hand_gradient", "numpy_same_ops"):
            ratio_stats(out, f"{mode}_vs_{base}", rates[name], rates[base])
            ratio_stats(out, f"{mode}_vs_{base}_cpu_time", cpu_rates[name], cpu_rates[base])
    for ours, theirs, name in (("runtime_eager_grad", "torch_eager_autograd", "eager_vs_torch_eager"),
                               ("runtime_compile", "torch_cuda_graph", "compile_vs_torch_cuda_graph")):
        if theirs in rates:
            ratio_stats(out, name, rates[ours], rates[theirs])
            ratio_stats(out, name + "_pipelined", rates[ours + "_pipelined"], rates[theirs + "_pipelined"])
    return out


def torch_contenders(X_np, y_np, lr, device: hal.Device) -> tuple[dict, dict]:
    """(info, name -> (step, finish)) of the PyTorch baselines (none without torch)."""
    try:
        import torch
    except ImportError:
        return {"torch": "absent"}, {}
    on_cuda = device.info.driver == "cuda" and torch.cuda.is_available()
    tdev = "cuda" if on_cuda else "cpu"
    if not on_cuda:
        # One thread, as the numpy baseline's one BLAS thread: idle intra-op threads spin after each
        # op and count as this process's CPU time while the other contenders run.
        torch.set_num_threads(1)
    X = torch.from_numpy(X_np).to(tdev)
    y = torch.from_numpy(y_np).to(tdev)
    w = torch.zeros(100, device=tdev, requires_grad=True)

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    def eager(wait: bool) -> None:
        z = X @ w
        loss = torch.nn.functional.softplus(z).sub(y * z).mean()
        loss.backward()
        with torch.no_grad():
            w.sub_(lr * w.grad)
            w.grad = None
        if wait:
            sync()

    contenders = {"torch_eager_autograd": (lambda: eager(True), sync),
                  "torch_eager_autograd_pipelined": (lambda: eager(False), sync)}
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

        def replay(wait: bool) -> None:
            graph.replay()
            if wait:
                torch.cuda.synchronize()

        contenders["torch_cuda_graph"] = (lambda: replay(True), sync)
        contenders["torch_cuda_graph_pipelined"] = (lambda: replay(False), sync)
    return {"torch_device": tdev}, contenders


# ---- bandwidth-bound kernels ------------------------------------------------------------------

PIPELINE = 10  # ops queued before the one wait of a pipelined timing


def device_copy(device: hal.Device, nbytes: int):
    """(copy(count): ``count`` device-to-device copies through the HAL, then a wait; release)."""
    src = device.allocator.allocate(nbytes)
    dst = device.allocator.allocate(nbytes)
    sem = device.create_semaphore(0)
    cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.copy_buffer(src, dst)
    value = [0]

    def copy(count: int) -> None:
        for _ in range(count):
            value[0] += 1
            device.queue_execute([cb], wait=[(sem, value[0] - 1)], signal=[(sem, value[0])])
        sem.wait(value[0])

    def release() -> None:
        src.release()
        dst.release()

    return copy, release


def interleaved_best(measures: dict, rounds: int, per_round: int = 5) -> dict:
    """The best time of each measure in its steady state, taken in turn round by round: each round
    runs a measure once untimed, then times ``per_round`` samples of it in a row. A slow stretch of
    the host (the best of samples all taken back to back spans a few ms) hits every measure alike,
    and no timed sample pays or gains from the op before it: timed one sample at a time right
    after another op, the H100's one-op sum read 108.7 µs after the add against 100.7 µs after a
    sum, and the copy 180.6-181.8 µs after a sum against 185 µs after a copy (likely the dirty
    cache lines an op leaves, written back during the next: the add and the copy write 256 MiB,
    the sum 4 bytes)."""
    best = {name: float("inf") for name in measures}
    for _ in range(rounds):
        for name, fn in measures.items():
            fn()
            for _ in range(per_round):
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
    return best


def bench_bandwidth(device: str | None, n: int, repeats: int) -> dict:
    ctx = rt.device.context_for(device)
    rng = np.random.default_rng(1)
    a_np = rng.standard_normal(n, dtype=np.float32)
    b_np = rng.standard_normal(n, dtype=np.float32)
    a, b = rt.array(a_np, device=device), rt.array(b_np, device=device)
    holder = {}

    def rt_add(count: int) -> None:
        for _ in range(count):
            c = a + b
            rt.eval(c)
            holder["c"] = c  # freed on the next call, so the buffer cache recycles it
        ctx.wait(c.root.storage.ready)

    def rt_sum(count: int) -> None:
        for _ in range(count):
            s = a.sum()
            rt.eval(s)
        ctx.wait(s.root.storage.ready)

    nbytes = n * 4
    out = {"elements": n}
    release = None
    if ctx.is_gpu:
        copy, release = device_copy(ctx.device, nbytes)
        out["copy_baseline"] = "hal copy_buffer"
    else:
        dst = np.empty_like(a_np)

        def copy(count: int) -> None:
            for _ in range(count):
                np.copyto(dst, a_np)
        out["copy_baseline"] = "numpy copyto"
    ops = {"add": rt_add, "sum": rt_sum, "copy": copy}
    single = interleaved_best({name: lambda op=op: op(1) for name, op in ops.items()}, repeats)
    queued = interleaved_best({name: lambda op=op: op(PIPELINE) for name, op in ops.items()}, repeats, 2)
    holder.clear()
    if release is not None:
        release()
    t_add, t_sum, t_copy = single["add"], single["sum"], single["copy"]
    t_add_p, t_sum_p, t_copy_p = (queued[name] / PIPELINE for name in ("add", "sum", "copy"))
    s_check = float(a.sum())
    out["sum_relative_error"] = abs(s_check - float(a_np.astype(np.float64).sum())) / float(np.abs(a_np).sum())
    for mode, ta, ts, tc in (("single", t_add, t_sum, t_copy), ("pipelined", t_add_p, t_sum_p, t_copy_p)):
        suffix = "" if mode == "single" else "_pipelined"
        out[f"add_s{suffix}"] = ta
        out[f"sum_s{suffix}"] = ts
        out[f"add_GBps{suffix}"] = 3 * nbytes / ta / 1e9
        out[f"sum_GBps{suffix}"] = nbytes / ts / 1e9
        out[f"copy_GBps{suffix}"] = 2 * nbytes / tc / 1e9
        out[f"add_vs_copy_bandwidth{suffix}"] = out[f"add_GBps{suffix}"] / out[f"copy_GBps{suffix}"]
        out[f"sum_vs_copy_bandwidth{suffix}"] = out[f"sum_GBps{suffix}"] / out[f"copy_GBps{suffix}"]
    # the same computations in plain numpy (allocating results as numpy code does)
    t_np_add = best_of(lambda: a_np + b_np, repeats)
    t_np_sum = best_of(lambda: a_np.sum(), repeats)
    out["numpy_add_s"] = t_np_add
    out["numpy_sum_s"] = t_np_sum
    out["add_vs_numpy"] = t_np_add / t_add
    out["sum_vs_numpy"] = t_np_sum / t_sum
    return out


def bytecodes(fn) -> dict:
    """Bytecodes executed on this thread by one fn() call, by where their code lives."""
    counts = {"runtime": 0, "other": 0}
    runtime_dir = str(Path(rt.__file__).resolve().parent)

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        if event == "opcode":
            counts["runtime" if frame.f_code.co_filename.startswith(runtime_dir) else "other"] += 1
        return tracer

    from opcode_tracing import prime  # (beside this script; imported here: tests load it by path)

    prime()
    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    counts["total"] = counts["runtime"] + counts["other"]
    return counts


def host_cost_steps(device, X_np, y_np) -> dict:
    """name -> a step returning its loss: the compiled and the eager logistic step on `device`."""
    X, y = rt.array(X_np, device=device), rt.array(y_np, device=device)
    vg = rt.value_and_grad(loss_fn)

    def step(w, X, y):
        loss, g = vg(w, X, y)
        return w - 0.1 * g, loss

    compiled = rt.compile(step)
    state = {"c": rt.zeros((100,), device=device), "e": rt.zeros((100,), device=device)}

    def compiled_step():
        state["c"], loss = compiled(state["c"], X, y)
        return loss

    def eager_step():
        loss, g = vg(state["e"], X, y)
        state["e"] = state["e"] - 0.1 * g
        rt.eval(state["e"], loss)
        return loss

    return {"compiled": compiled_step, "eager": eager_step}


def bench_host_cost(steps: int, rounds: int = 9) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from drivers.fake_gpu import FakeGpuDriver

    X_np, y_np = logistic_data()
    out = {}
    for mode in ("graph", "stream"):
        device = FakeGpuDriver().create_device(command_buffer=mode)
        ctx = rt.device.context_for(device)
        ctx.is_gpu = True  # lower as for a GPU (the simulated API runs the numpy kernels)
        for name, fn in host_cost_steps(device, X_np, y_np).items():
            for _ in range(30):
                fn()
            rt.synchronize(device)
            counts = bytecodes(fn)
            rt.synchronize(device)
            samples = []
            for _ in range(rounds):
                spent = 0.0
                for _ in range(steps):
                    t = time.thread_time()
                    loss = fn()
                    spent += time.thread_time() - t
                    ctx.wait_storage(loss.root.storage)  # keep the simulated queue short
                samples.append(spent / steps * 1e6)
            samples.sort()
            out[f"{mode}_{name}"] = {"bytecodes": counts, "host_cpu_us": {
                "median": statistics.median(samples), "min": samples[0], "max": samples[-1]}}
        device.close()
    return out


def targets(report: dict) -> list[dict]:
    """The performance targets this report measures: on a GPU against PyTorch and the device's copy
    bandwidth, on a CPU driver against the hand-written numpy step (ratios > 1: the runtime wins)."""
    out = []

    def add(name: str, value: float | None, limit: float) -> None:
        if value is not None:
            out.append({"benchmark": name, "value": round(value, 3), "target": f"≥ {limit}", "met": value >= limit})

    lr = report.get("logistic_regression_1000x100", {})
    bw = report.get("bandwidth", {})
    on_cpu = report.get("device", {}).get("driver") in ("local-task", "local-sync")
    if on_cpu:
        add("compiled step / numpy hand-written step, CPU time", lr.get("compile_vs_numpy_hand_gradient_cpu_time"), 0.5)
        add("eager step / numpy hand-written step, CPU time", lr.get("eager_vs_numpy_hand_gradient_cpu_time"), 0.25)
        return out
    add("rt.compile step / PyTorch CUDA-graph replay, synced", lr.get("compile_vs_torch_cuda_graph"), 0.8)
    add("rt.compile step / PyTorch CUDA-graph replay, pipelined", lr.get("compile_vs_torch_cuda_graph_pipelined"), 1.0)
    add("eager step / PyTorch eager autograd, synced", lr.get("eager_vs_torch_eager"), 3.0)
    add("eager step / PyTorch eager autograd, pipelined", lr.get("eager_vs_torch_eager_pipelined"), 3.0)
    add("add of 64M float32, one op / copy bandwidth", bw.get("add_vs_copy_bandwidth"), 0.9)
    add("sum of 64M float32, one op / copy bandwidth", bw.get("sum_vs_copy_bandwidth"), 0.9)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="HAL device URI (default: the best available)")
    parser.add_argument("--elements", type=int, default=64 * 1024 * 1024)
    parser.add_argument("--steps", type=int, default=200, help="training steps per timing round")
    parser.add_argument("--repeats", type=int, default=25,
                        help="rounds of the one-op and copy timings (5 samples of each a round), the best kept")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the logistic regression")
    parser.add_argument("--only", choices=["logistic", "bandwidth"], help="run one part only")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--host-cost", action="store_true",
                        help="only the host cost per step over the simulated GPU (see the module doc)")
    args = parser.parse_args(argv)
    if args.host_cost:
        text = json.dumps({"host_cost_fake_gpu": bench_host_cost(100)}, indent=2)
        print(text)
        if args.out:
            Path(args.out).write_text(text)
        return 0
    dev = rt.set_default_device(args.device) if args.device else rt.default_device()
    info = dev.info
    report: dict = {"device": {"name": info.name, "uri": info.uri, "driver": info.driver,
                               "native_calls": info.properties.get("native_calls")}}
    if args.only in (None, "logistic"):
        report["logistic_regression_1000x100"] = bench_logistic(args.device, args.steps, args.rounds)
    if args.only in (None, "bandwidth"):
        report["bandwidth"] = bench_bandwidth(args.device, args.elements, args.repeats)
    report["targets"] = targets(report)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
