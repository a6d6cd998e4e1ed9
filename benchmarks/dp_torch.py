"""PyTorch's side of the data-parallel MLP step (``collective_bench.py``'s ``torch_mlp`` section).

A process per GPU, as torchrun starts them, ``torch.distributed`` on NCCL:

- ``one_gpu`` / ``ddp``: the workload benchmark's MLP step (``workload_mlp.py``: batch 512 a GPU,
  1024 -> 4096 -> 1024, float32 without TF32, the in-place SGD update) on one GPU's part of the batch,
  alone and wrapped in ``DistributedDataParallel`` (its default 25 MB buckets, each bucket's all-reduce
  started by autograd hooks while the backward pass goes on): the peer a user would pick for the
  runtime's data-parallel step, timed the same way in the same run.
- ``overlap``: the backward pass's largest pair on its own, the first layer's weight gradient
  (``x.T @ dh``, 1024 x 4096 from 512 terms) and an all-reduce of the second layer's gradient
  (4096 x 1024 float32) on two streams: each alone, one after the other, and issued together. Whether
  NCCL's kernel runs beside a GEMM that fills the GPU in one wave decides how much of a data-parallel
  step's all-reduce any scheduler can hide.

    python benchmarks/dp_torch.py RANK WORLD PORT ROUNDS OUT    (started by collective_bench.py)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

STEPS = 20  # steps a timed sample
OVERLAP_REPEATS = 50


def worker(rank: int, world: int, port: int, rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    import workload_mlp as mlp
    from torch.nn.parallel import DistributedDataParallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    torch.backends.cuda.matmul.allow_tf32 = False  # IEEE float32, as the runtime's step
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    try:
        params_np, x_all, y_all, batch = mlp.global_batch(False, world)
        x = torch.from_numpy(x_all[rank * batch:(rank + 1) * batch]).cuda()
        y = torch.from_numpy(y_all[rank * batch:(rank + 1) * batch]).cuda()

        class Mlp(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.from_numpy(p).cuda())
                                                      for p in params_np)

            def forward(self, x, y):
                return mlp.torch_loss(x, y, *self.weights)

        def trainer(model):
            weights = list(model.parameters())

            def run(count: int) -> None:
                for _ in range(count):
                    model(x, y).backward()
                    with torch.no_grad():
                        mlp.sgd(weights, [w.grad for w in weights])
                    for w in weights:
                        w.grad = None

            return run

        runs = {"one_gpu": trainer(Mlp()), "ddp": trainer(DistributedDataParallel(Mlp(), device_ids=[rank]))}
        for run in runs.values():  # warm-up
            run(3)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(rounds):
            for name, run in runs.items():
                torch.cuda.synchronize()
                dist.barrier()
                started = time.perf_counter()
                run(STEPS)
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - started) / STEPS)
        overlap = overlap_times(torch, dist, x, params_np)
        if rank == 0:
            one, ddp = statistics.median(times["one_gpu"]), statistics.median(times["ddp"])
            Path(out).write_text(json.dumps({
                "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "gpus": world, "batch_per_gpu": batch, "one_gpu_step_ms": one * 1e3, "ddp_step_ms": ddp * 1e3,
                "speedup": world * one / ddp,
                "spread_ms": {k: [min(v) * 1e3, max(v) * 1e3] for k, v in times.items()},
                "overlap": overlap}))
    finally:
        dist.destroy_process_group()


def overlap_times(torch, dist, x, params_np) -> dict:
    """Microseconds (CUDA events, OVERLAP_REPEATS each) of the first layer's weight-gradient GEMM and the
    second layer's gradient all-reduce: alone, in sequence, and issued together on two streams."""
    dh = torch.randn(x.shape[0], params_np[0].shape[1], device="cuda")
    out = torch.empty(params_np[0].shape, device="cuda")
    grad = torch.randn(params_np[2].size, device="cuda")
    gemm_stream, collective_stream = torch.cuda.Stream(), torch.cuda.Stream()

    def gemm() -> None:
        torch.mm(x.t(), dh, out=out)

    def all_reduce() -> None:
        dist.all_reduce(grad)

    def together() -> None:
        current = torch.cuda.current_stream()
        for stream, fn in ((collective_stream, all_reduce), (gemm_stream, gemm)):
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                fn()
        current.wait_stream(gemm_stream)
        current.wait_stream(collective_stream)

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(OVERLAP_REPEATS):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / OVERLAP_REPEATS

    result = {"gemm_us": timed(gemm), "all_reduce_us": timed(all_reduce),
              "in_sequence_us": timed(lambda: (gemm(), all_reduce())), "together_us": timed(together)}
    result["together_vs_in_sequence"] = result["together_us"] / result["in_sequence_us"]
    return result


if __name__ == "__main__":
    rank, world, port, rounds, out = sys.argv[1:6]
    worker(int(rank), int(world), int(port), int(rounds), out)
