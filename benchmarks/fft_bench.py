"""A 2-D FFT of 4096 x 4096 complex64 through rt.fft, against PyTorch (GPU) or numpy (CPU drivers).

    python benchmarks/fft_bench.py [--device URI] [--n 4096] [--dtype complex64] [--rounds N]
                                   [--quick] [--out FILE]

The runtime's ``rt.fft.fftn`` (one ``hal.Fft`` dispatch: cuFFT on CUDA, hipFFT on HIP, numpy's
pocketfft on the CPU drivers), eager and under ``rt.compile``, is timed beside ``torch.fft.fft2``
on the same GPU in the same process when torch is importable and has the device, else beside
``numpy.fft.fft2`` (on the CPU drivers always numpy). Batches of queued transforms, one wait a
batch, contenders in turn round by round (``workload_timing.py``); the ratios are the baseline's
time over the runtime's (>= 1: the runtime is as fast), median and spread over rounds. Every
result is checked against numpy first. Prints one JSON document (also written to --out).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import workload_torch  # noqa: E402
from workload_timing import Contender, Settings, timed  # noqa: E402

import runtime as rt  # noqa: E402


def runtime_contenders(fn, x, device) -> dict[str, Contender]:
    held = []
    compiled = rt.compile(fn)

    def eager(count: int) -> None:
        for _ in range(count):
            y = fn(x)
            rt.eval(y)
            held[:] = [y]

    def replay(count: int) -> None:
        for _ in range(count):
            held[:] = [compiled(x)]

    def sync() -> None:
        rt.synchronize(device)

    return {"runtime_eager": Contender(eager, sync), "runtime_compile": Contender(replay, sync)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="HAL device URI (default: the best available)")
    parser.add_argument("--n", type=int, default=4096, help="the transform is n x n (4096)")
    parser.add_argument("--dtype", default="complex64", choices=["complex64", "complex128"])
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (7; --quick: 3)")
    parser.add_argument("--quick", action="store_true", help="256 x 256, short batches (a smoke run)")
    parser.add_argument("--no-torch", action="store_true", help="numpy as the baseline on GPUs too")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    n = 256 if args.quick else args.n
    device = rt.set_default_device(args.device) if args.device else rt.default_device()
    on_gpu = rt.device.context_for(device).is_gpu
    torch, torch_info = workload_torch.load(on_gpu and not args.no_torch)
    settings = Settings(device, on_gpu, args.quick, args.rounds or (3 if args.quick else 7),
                        (2.0 if args.quick else 25.0) / 1e3, torch)
    rng = np.random.default_rng(0)
    host = (rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))).astype(args.dtype)
    x = rt.asarray(host, device=device)

    def fft2(a):
        return rt.fft.fftn(a, axes=(-2, -1))

    expected = np.fft.fft2(host)
    got = np.asarray(fft2(x).numpy())
    tolerance = 1e-4 if args.dtype == "complex64" else 1e-10
    error = float(np.abs(got - expected).max() / np.abs(expected).max())
    contenders = runtime_contenders(fft2, x, device)
    if torch is not None:
        t = torch.from_numpy(host).to("cuda")
        torch_out = torch.fft.fft2(t)
        torch.cuda.synchronize()

        def torch_run(count: int) -> None:
            for _ in range(count):
                torch.fft.fft2(t)

        contenders["torch"] = Contender(torch_run, torch.cuda.synchronize)
        del torch_out
    else:
        contenders["numpy"] = Contender(lambda count: [np.fft.fft2(host) for _ in range(count)], lambda: None)
    # 5 n^2 log2(n^2) flops: the usual figure of an FFT's work (radix-2 count)
    flop = 5.0 * n * n * math.log2(n * n)
    nbytes = 2 * host.nbytes  # read + write once
    result = timed(settings, contenders, ("runtime_eager", "runtime_compile"), flop=flop, nbytes=nbytes)
    info = rt.device.context_for(device).device.info
    report = {
        "benchmark": "fft2",
        "shape": [n, n],
        "dtype": args.dtype,
        "device": {"name": info.name, "uri": info.uri, "driver": info.driver},
        "torch": torch_info,
        "baseline": "torch.fft.fft2" if torch is not None else "numpy.fft.fft2",
        "max_relative_error_vs_numpy": error,
        "correct": error <= tolerance,
        **result,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["correct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
