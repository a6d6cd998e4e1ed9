"""Reductions and their fused neighbours on one device, against its copy bandwidth and PyTorch; prints JSON.

    python benchmarks/reduction_probe.py [--driver cuda] [--quick] [--iters N] [--out FILE]

Cases (composed array ops, as a user writes them): softmax, log-softmax, layer norm, RMS norm over
the rows of 8192x4096 float32, a mean-squared error of two such arrays, the column sum and the row
sum of 8192x8192 float32. Each case's time per call is its device time: on cuda, CUDA events
recorded on the HAL queue's stream around `--iters` evaluations (each one submission, replayed from
the graph cache with its fused kernel); elsewhere the wall clock around them and a synchronize.
Bandwidth counts the bytes a case must move (inputs read once, outputs written once). The copy
baseline is a device-to-device copy (a HAL copy_buffer) moving the same bytes, timed the same way in
the same process; PyTorch eager and torch.compile of the same composition run beside it where torch
is importable (CUDA events on torch's stream). Rounds interleave the contenders; each keeps its best.

`--quick` runs tiny shapes (a check that the probe works, e.g. on local-task).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

import numpy as np

import hal
import runtime as rt


def _torch(xp) -> bool:
    return getattr(xp, "__name__", "") == "torch"


def _last(x, xp, op: str):
    """A reduction over the last axis keeping it (numpy's and the runtime's spelling, or PyTorch's)."""
    if _torch(xp):
        return getattr(x, "amax" if op == "max" else op)(dim=-1, keepdim=True)
    return getattr(x, op)(axis=-1, keepdims=True)


def softmax(x, xp):
    e = xp.exp(x - _last(x, xp, "max"))
    return e / _last(e, xp, "sum")


def log_softmax(x, xp):
    s = x - _last(x, xp, "max")
    return s - xp.log(_last(xp.exp(s), xp, "sum"))


def layer_norm(x, w, b, xp):
    c = x - _last(x, xp, "mean")
    return c / xp.sqrt(_last(c * c, xp, "mean") + 1e-5) * w + b


def rms_norm(x, w, xp):
    return x / xp.sqrt(_last(x * x, xp, "mean") + 1e-6) * w


def mse(a, b, xp):
    d = a - b
    return (d * d).mean()


def column_sum(x, xp):
    return x.sum(dim=0) if _torch(xp) else x.sum(axis=0)


def row_sum(x, xp):
    return x.sum(dim=1) if _torch(xp) else x.sum(axis=1)


def cases(quick: bool) -> list:
    """(name, fn, input shapes (the first is x), bytes moved)."""
    R, N = (64, 96) if quick else (8192, 4096)
    S = 96 if quick else 8192
    f = 4
    rows_io = 2 * R * N * f
    return [
        ("softmax", softmax, [(R, N)], rows_io),
        ("log_softmax", log_softmax, [(R, N)], rows_io),
        ("layer_norm", layer_norm, [(R, N), (N,), (N,)], rows_io + 2 * N * f),
        ("rms_norm", rms_norm, [(R, N), (N,)], rows_io + N * f),
        ("mse", mse, [(R, N), (R, N)], rows_io),
        ("column_sum", column_sum, [(S, S)], S * S * f + S * f),
        ("row_sum", row_sum, [(S, S)], S * S * f + S * f),
    ]


class Timer:
    """Device time of `fn(count)` (count calls queued, then one wait): CUDA events on `stream`, or the wall clock."""

    def __init__(self, stream=None, sync=None) -> None:
        self.stream, self.sync = stream, sync
        self.cu = None
        if stream is not None:
            from cuda.bindings import driver as cu
            self.cu = cu
            self.start = _check(cu.cuEventCreate(0))
            self.end = _check(cu.cuEventCreate(0))

    def __call__(self, fn, count: int) -> float:
        self.sync()
        if self.cu is None:
            t = time.perf_counter()
            fn(count)
            self.sync()
            return (time.perf_counter() - t) / count
        cu = self.cu
        _check(cu.cuEventRecord(self.start, self.stream))
        fn(count)
        _check(cu.cuEventRecord(self.end, self.stream))
        _check(cu.cuEventSynchronize(self.end))
        ms = _check(cu.cuEventElapsedTime(self.start, self.end))
        self.sync()
        return ms / 1e3 / count


def _check(result):
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err}")
    return rest[0] if len(rest) == 1 else rest


@contextlib.contextmanager
def recordings():
    """The recordings the runtime makes inside the block (to report how many kernels a case runs)."""
    from runtime import lowering

    made: list = []
    real = lowering.record

    def spy(*args, **kwargs):
        rec = real(*args, **kwargs)
        made.append(rec)
        return rec

    lowering.record = spy
    try:
        yield made
    finally:
        lowering.record = real


def torch_timer(torch):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timer(fn, count: int) -> float:
        torch.cuda.synchronize()
        start.record()
        fn(count)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / count
    return timer


def probe(device: hal.Device, quick: bool, iters: int, rounds: int) -> dict:
    on_cuda = device.info.driver == "cuda" if hasattr(device, "info") else False
    stream = device.stream(0) if on_cuda and hasattr(device, "stream") else None
    timer = Timer(stream, rt.synchronize)
    try:
        import torch
        torch_ok = on_cuda and torch.cuda.is_available()
    except ImportError:
        torch = None
        torch_ok = False
    rng = np.random.default_rng(0)
    report: dict = {"device": str(device), "timer": "cuda-events" if stream is not None else "wall-clock",
                    "quick": quick, "iters": iters, "rounds": rounds, "cases": {}}
    for name, fn, shapes, nbytes in cases(quick):
        host = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        args = [rt.array(h, device=device) for h in host]
        want = fn(*[h.astype(np.float64) for h in host], xp=np)

        def ours(count, fn=fn, args=args):
            for _ in range(count):
                rt.eval(fn(*args, xp=rt))

        # The copy moving the same bytes: half of them read, half written.
        half = max(4, nbytes // 2 // 4 * 4)
        src = device.allocator.allocate(half)
        dst = device.allocator.allocate(half)
        cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE)
        with cb.record():
            cb.copy_buffer(src, dst)

        def copy(count, cb=cb):
            device.queue_execute([cb] * count)

        contenders = {"runtime": (timer, ours), "copy": (timer, copy)}
        if torch_ok:
            targs = [torch.from_numpy(h).cuda() for h in host]

            def eager(count, fn=fn, targs=targs):
                for _ in range(count):
                    fn(*targs, xp=torch)
            compiled_fn = torch.compile(lambda *a, fn=fn: fn(*a, xp=torch))

            def compiled(count, f=compiled_fn, targs=targs):
                for _ in range(count):
                    f(*targs)
            tt = torch_timer(torch)
            contenders["torch_eager"] = (tt, eager)
            contenders["torch_compile"] = (tt, compiled)
        entry: dict = {"bytes": nbytes}
        try:
            best = {}
            with recordings() as made:
                got = fn(*args, xp=rt).numpy()
                entry["max_abs_error"] = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
                for t, run in contenders.values():  # warm up: graph cache, fusion, compiles
                    run(3)
                    t(run, 1)
            if made:  # the recording the case replays: its kernels (1 where the group is one program)
                entry["runtime_dispatches"] = made[-1].dispatches
                entry["runtime_fused_kernels"] = made[-1].fused
            for _ in range(rounds):
                for name_c, (t, run) in contenders.items():
                    s = t(run, iters)
                    best[name_c] = min(best.get(name_c, s), s)
            for name_c, s in best.items():
                entry[name_c] = {"us": s * 1e6, "GBps": nbytes / s / 1e9}
            for name_c in best:
                if name_c != "copy":
                    entry[name_c]["fraction_of_copy"] = best["copy"] / best[name_c]
            for base in ("torch_eager", "torch_compile"):
                if base in best:
                    entry[f"runtime_vs_{base}"] = best[base] / best["runtime"]  # >= 1: the runtime is as fast
        except Exception as exc:  # noqa: BLE001 - reported in the JSON; the other cases go on
            entry["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            rt.synchronize()
            src.release()
            dst.release()
        report["cases"][name] = entry
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--driver", default=None, help="device URI (default: the best available)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: check that the probe runs")
    parser.add_argument("--iters", type=int, default=None, help="calls per timed sample (default 20; 3 quick)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; 2 quick)")
    parser.add_argument("--out", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    iters = args.iters or (3 if args.quick else 20)
    rounds = args.rounds or (2 if args.quick else 5)
    device = hal.create_device(args.driver)
    rt.set_default_device(device)
    report = probe(device, args.quick, iters, rounds)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if not any("error" in c for c in report["cases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
