"""rt.linalg's decompositions against PyTorch (torch.linalg) in the same process, and numpy on CPU drivers.

    python benchmarks/linalg_bench.py [--device cuda] [--out FILE] [--rounds N] [--small]

Cases: batched ``solve`` (256 systems of 64 x 64, one right-hand side column each of 64) and
``cholesky`` of 256 x 64 x 64 float32, and ``svd`` of one 1024 x 1024 float32 matrix. The runtime's
time is from the call to the evaluated result (``rt.eval``, then ``rt.synchronize``); PyTorch's
includes a ``torch.cuda.synchronize()`` on GPUs. Rounds are interleaved (runtime, then the
baselines), each case reports the median over rounds and the ratio baseline / runtime (above 1:
the runtime is faster). PyTorch is measured where it imports (on the GPU for a GPU device, else on
the CPU); numpy where the device is a CPU driver. ``--small`` shrinks the cases (a smoke run).
Prints one JSON document (also written to --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import runtime as rt  # noqa: E402

try:
    import torch
except ImportError:  # the baseline is optional
    torch = None


def cases(small: bool) -> dict:
    batch, n, big = (16, 16, 64) if small else (256, 64, 1024)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, n, n)).astype(np.float32)
    spd = (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(np.float32)
    b = rng.standard_normal((batch, n, n)).astype(np.float32)
    m = rng.standard_normal((big, big)).astype(np.float32)
    return {
        f"solve {batch}x{n}x{n} float32": ("solve", (a + n * np.eye(n, dtype=np.float32), b)),
        f"cholesky {batch}x{n}x{n} float32": ("cholesky", (spd,)),
        f"svd {big}x{big} float32": ("svd", (m,)),
    }


def _rt_fn(name: str):
    if name == "solve":
        return lambda x, y: rt.linalg.solve(x, y)
    if name == "cholesky":
        return rt.linalg.cholesky
    return lambda x: rt.linalg.svd(x, full_matrices=False)


def _torch_fn(name: str):
    if name == "solve":
        return torch.linalg.solve
    if name == "cholesky":
        return torch.linalg.cholesky
    return lambda x: torch.linalg.svd(x, full_matrices=False)


def _numpy_fn(name: str):
    if name == "solve":
        return np.linalg.solve
    if name == "cholesky":
        return np.linalg.cholesky
    return lambda x: np.linalg.svd(x, full_matrices=False)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="HAL device URI (default: the runtime's default device)")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args(argv)
    device = args.device or rt.default_device()
    uri = getattr(getattr(device, "info", None), "uri", device)
    on_gpu = not str(uri).startswith("local")
    torch_device = None
    if torch is not None:
        torch_device = "cuda" if on_gpu and torch.cuda.is_available() else "cpu"
    report: dict = {"device": str(uri), "torch": None if torch is None else torch.__version__,
                    "torch_device": torch_device, "rounds": args.rounds, "cases": {}}
    for label, (name, inputs) in cases(args.small).items():
        xs = [rt.asarray(x, device=device) for x in inputs]
        rt.eval(*xs)
        fn = _rt_fn(name)

        def run_rt(fn=fn, xs=xs):
            out = fn(*xs)
            rt.eval(*(out if isinstance(out, tuple) else (out,)))
            rt.synchronize(device)  # (rt.eval submits; the work may still run)

        samples: dict = {"runtime": []}
        baselines = {}
        if torch is not None:
            ts = [torch.from_numpy(x).to(torch_device) for x in inputs]
            tfn = _torch_fn(name)

            def run_torch(tfn=tfn, ts=ts):
                tfn(*ts)
                if torch_device == "cuda":
                    torch.cuda.synchronize()

            baselines["torch"] = run_torch
        if not on_gpu:
            nfn = _numpy_fn(name)
            baselines["numpy"] = lambda nfn=nfn, inputs=inputs: nfn(*inputs)
        for key in baselines:
            samples[key] = []
        run_rt()  # warm-up: executables loaded, plans made, graph recorded
        for run in baselines.values():
            run()
        for _ in range(args.rounds):
            samples["runtime"].append(timed(run_rt))
            for key, run in baselines.items():
                samples[key].append(timed(run))
        medians = {key: statistics.median(v) for key, v in samples.items()}
        entry = {f"{key}_ms": medians[key] * 1e3 for key in medians}
        for key in baselines:
            entry[f"ratio_vs_{key}"] = medians[key] / medians["runtime"]
        report["cases"][label] = entry
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
