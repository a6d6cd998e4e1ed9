"""Device-side workloads against PyTorch on the same GPU, in the same process; prints JSON.

    python benchmarks/workload_bench.py [--device URI] [--quick] [--only CASE ...] [--out FILE]

On a GPU: matmul 4096² in float32 (IEEE on both sides: no TF32), float16 and bfloat16; batched
matmul 64×(512×64 @ 64×512); matmul 256²; softmax and layer norm over the rows of 8192×4096 written
as composed array ops, eager and under rt.compile (the counterpart of torch.compile of the same
function: the eager call builds and keys its graph's nodes each time, which on a fast GPU can take
longer than the one fused kernel), and, with no target, the same two over 1024 rows of 32768,
softmax over 2048 rows of 16384 and over 8 rows of 4194304 (split across workgroups), and layer norm
in bfloat16; the column sum of 8192×8192; a transposed copy of 8192×8192; an 8-op elementwise chain
over 64M floats; with no target, sorts (2**20 floats, each row of 4096×4096, argsort of each row of
65536×64, against PyTorch's stable sort) and the running sum of 2**24 floats; a 2-layer MLP training
step (batch 512, 1024→4096→1024, float32), eager and under rt.compile; last, with no target (run
while the budget lasts), an embedding lookup plus positions, a lookup from half the columns of a
table (a strided view), cross entropy over 2048 rows of 128256 logits and softmax over 8192×4096 in
bfloat16. Each runs against PyTorch eager and torch.compile of the same composition (where torch
with CUDA imports) and reports its time (median and spread over interleaved rounds), its TFLOP/s or
GB/s, the device-to-device copy bandwidth measured beside the bandwidth-bound cases, the ratios
(PyTorch's time over the runtime's: >= 1 means as fast), each result's agreement with PyTorch's, and
the targets of the design's device-side table, met or missed.

On a CPU driver (local-task): the MLP step, eager and compiled, against the step written by hand in
numpy, and matmul (numpy's BLAS on both sides). ``--quick`` shrinks every shape: seconds on a CPU.

One case failing (an op the runtime lacks, a compile error) is reported in its section with the
error; the others run. The JSON is written after every case, so a run cut short keeps what it
measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import workload_mlp
import workload_torch
from workload_cases import BY_NAME, Case
from workload_targets import targets
from workload_timing import Contender, Settings, error_text, synced, timed

import runtime as rt

GPU_CASES = [
    "matmul_4096_float32", "matmul_4096_float16", "matmul_4096_bfloat16", "batched_matmul_float32",
    "matmul_256_float32", "softmax_8192x4096", "layer_norm_8192x4096", "softmax_1024x32768",
    "layer_norm_1024x32768", "softmax_2048x16384", "softmax_8x4194304", "layer_norm_bfloat16_8192x4096",
    "softmax_grad_8192x4096", "layer_norm_grad_8192x4096", "cross_entropy_grad_4096x32000", "column_sum_8192x8192",
    "transposed_copy_8192x8192", "concat_8192x4096", "elementwise_chain_64M", "sort_1048576", "sort_rows_4096x4096",
    "argsort_65536x64", "cumsum_16777216", "mlp_step", "embedding_32x1024_of_50000x1024",
    "take_columns_32x1024_of_50000x512", "cross_entropy_2048x128256", "softmax_bfloat16_8192x4096",
]
CPU_CASES = ["matmul_1024_float32", "mlp_step"]
ALL_CASES = [*BY_NAME, "mlp_step"]


def device_array(host: np.ndarray, dtype: str, device: str) -> rt.Array:
    a = rt.array(host, device=device)
    if dtype != "float32":
        a = a.astype(getattr(rt, dtype))
    rt.eval(a)
    return a


def as_float32(a: rt.Array) -> np.ndarray:
    """A host copy (np.asarray may view a buffer the runtime recycles once the array is gone)."""
    return np.array(np.asarray(a if a.dtype == rt.float32 else a.astype(rt.float32)))


def runtime_contender(fn, args: list, device: str) -> Contender:
    held = []

    def run(count: int) -> None:
        for _ in range(count):
            y = fn(*args)
            rt.eval(y)
            held[:] = [y]  # the previous result goes back to the buffer cache, as in a loop

    return Contender(run, lambda: rt.synchronize(device))


def copy_contender(settings: Settings, nbytes: int) -> tuple[Contender, object]:
    """(device-to-device copies of ``nbytes``, their release): the HAL's copy_buffer on a GPU (each
    batch waits itself), numpy's copyto on a CPU driver."""
    if settings.on_gpu:
        from runtime_bench import device_copy

        copy, release = device_copy(rt.device.context_for(settings.device).device, nbytes)
        return Contender(copy, lambda: None), release
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)

    def run(count: int) -> None:
        for _ in range(count):
            np.copyto(dst, src)

    return Contender(run, lambda: None), lambda: None


def run_case(case: Case, settings: Settings) -> dict:
    inputs = case.make(settings.rng, settings.quick)
    out: dict = {"title": case.title, "dtype": case.dtype, "shapes": [list(a.shape) for a in inputs]}
    ours = [device_array(a, case.dtype, settings.device) for a in inputs]
    result = case.runtime(*ours)
    rt.eval(result)
    nbytes = sum(a.nbytes for a in ours) + result.nbytes
    contenders = {"runtime": runtime_contender(case.runtime, ours, settings.device)}
    results = {"runtime": result}
    if case.compiled:
        compiled = rt.compile(case.runtime)
        results["runtime_compile"] = compiled(*ours)
        contenders["runtime_compile"] = runtime_contender(compiled, ours, settings.device)
    torch = settings.torch
    if torch is not None:
        theirs = [workload_torch.tensor(torch, a, case.dtype) for a in inputs]
        reference = workload_torch.to_numpy(case.torch(*theirs))
        out["check_against"] = "PyTorch eager"
        contenders.update(workload_torch.case_contenders(torch, case.torch, theirs, settings.torch_compile))
    else:
        # Inputs rounded to the device's dtype as the runtime holds them; the reference in float32.
        host = inputs if case.dtype == "float32" else [as_float32(a) for a in ours]
        reference = case.numpy(*host)
        out["check_against"] = "numpy"
        if not settings.on_gpu:
            contenders["numpy"] = Contender(lambda count: [case.numpy(*host) for _ in range(count)], lambda: None)
    scale = float(np.abs(reference).max()) or 1.0
    errors = {}
    for name, value in results.items():  # the eager result, and the compiled one where timed
        mine = as_float32(value)
        errors[name] = float(np.abs(mine.astype(np.float64) - reference).max()) / scale \
            if mine.shape == reference.shape else None
    error = None if None in errors.values() else max(errors.values())
    out["check"] = {"max_rel_err": error, "tolerance": case.tolerance,
                    "ok": error is not None and error <= case.tolerance}
    if len(errors) > 1:
        out["check"]["max_rel_err_of"] = errors
    if case.synced:
        contenders.update({f"{name}_synced": synced(c) for name, c in contenders.items()})
    release = None
    copy_bytes = None
    if case.bandwidth_bound:
        copy_bytes = max(a.nbytes for a in ours)
        contenders["copy"], release = copy_contender(settings, copy_bytes)
        out["copy_bytes"] = copy_bytes
    try:
        flop = case.flop(inputs) if case.flop else None
        out.update(timed(settings, contenders, ("runtime", "runtime_synced", "runtime_compile"), flop=flop,
                         nbytes=nbytes if case.bandwidth_bound else None, copy_bytes=copy_bytes))
    finally:
        if release is not None:
            release()
    if case.bandwidth_bound:
        out["bytes"] = nbytes
    return out


def run_all(names: list[str], settings: Settings, report: dict, budget_s: float, save) -> None:
    """Each case in turn into report["cases"]; those not started within ``budget_s`` are skipped."""
    deadline = time.perf_counter() + budget_s
    for name in names:
        if time.perf_counter() > deadline:
            report["cases"][name] = {"skipped": f"time budget of {budget_s:.0f} s spent"}
            continue
        t = time.perf_counter()
        try:
            section = workload_mlp.bench(settings) if name == "mlp_step" else run_case(BY_NAME[name], settings)
        except Exception as exc:  # noqa: BLE001 - reported; the other cases go on
            section = {"error": error_text(exc)}
        section["elapsed_s"] = time.perf_counter() - t
        report["cases"][name] = section
        release_memory(settings)
        report["targets"] = targets(report)
        save(report)


def release_memory(settings: Settings) -> None:
    """Drop a finished case's arrays so that the next case's large inputs fit, and keep what stays
    (caches, compiled code) out of later garbage collections, which host-bound loops would pay for
    more with every case run before them."""
    gc.collect()
    gc.freeze()
    rt.synchronize(settings.device)
    if settings.torch is not None:
        settings.torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="HAL device URI (default: the best available)")
    parser.add_argument("--quick", action="store_true", help="small shapes (seconds on a CPU)")
    parser.add_argument("--only", nargs="+", choices=ALL_CASES, help="run these cases (default: the device's set)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds (default 7; 3 quick)")
    parser.add_argument("--batch-ms", type=float, default=None,
                        help="about how long each timed batch runs (default 25 ms; 2 ms quick)")
    parser.add_argument("--no-torch-compile", action="store_true", help="PyTorch eager baselines only")
    parser.add_argument("--no-torch", action="store_true", help="no PyTorch: results checked against numpy")
    parser.add_argument("--budget", type=float, default=200.0,
                        help="seconds after which cases not yet started are skipped (default %(default)s)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    dev = rt.set_default_device(args.device) if args.device else rt.default_device()
    on_gpu = rt.device.context_for(dev).is_gpu
    rt.set_float32_matmul_precision("highest")
    torch, torch_info = workload_torch.load(on_gpu and not args.no_torch)
    settings = Settings(dev, on_gpu, args.quick, args.rounds or (3 if args.quick else 7),
                        (args.batch_ms or (2.0 if args.quick else 25.0)) / 1e3, torch,
                        not args.no_torch_compile, np.random.default_rng(0))
    info = dev.info
    report: dict = {
        "device": {"name": info.name, "uri": info.uri, "driver": info.driver,
                   "native_calls": info.properties.get("native_calls")},
        "torch": torch_info,
        "settings": {"quick": args.quick, "rounds": settings.rounds, "batch_s": settings.batch_s,
                     "torch_compile": settings.torch_compile and torch is not None,
                     "runtime_float32_matmul_precision": rt.get_float32_matmul_precision()},
        "cases": {},
        "targets": [],
    }

    def save(doc: dict) -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(doc, indent=2))

    started = time.perf_counter()
    run_all(args.only or (GPU_CASES if on_gpu else CPU_CASES), settings, report, args.budget, save)
    report["elapsed_s"] = time.perf_counter() - started
    save(report)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
