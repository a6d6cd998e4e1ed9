"""Train a 2-layer MLP data-parallel with rt.distributed: every device a rank, gradients averaged in buckets.

    python examples/data_parallel_mlp.py                                   # every local GPU from one process
    torchrun --nproc-per-node 2 examples/data_parallel_mlp.py --per-process  # a process per GPU (cuda://LOCAL_RANK)
    python examples/data_parallel_mlp.py --driver local-task --local 2       # two CPU devices, no GPU needed

The model and step are the workload benchmark's (1024 -> 4096 -> 1024, ReLU, mean-squared error,
SGD; ``--small`` for 64 -> 256 -> 64). Each rank takes its slice of the global batch; the compiled
step computes the gradients, averages them over the group (``rt.distributed.average_gradients``:
one collective per bucket, recorded in the same graph as the backward pass, so a bucket's
all-reduce runs beside the rest of the backward pass) and updates the parameters. A rank's step
only queues work on a GPU, so one thread could drive every GPU; a CPU device runs a collective on
the calling thread, where it waits for the other ranks, so each rank here has a thread of its own.
Every rank ends with the same parameters; the last line compares the first step with one device's
step over the whole batch (float32 rounding), and reports how far the trajectories drifted apart by
the last step (rounding differences grow from step to step).

``--symmetric-mb N`` gives each group N MB of symmetric memory (``rt.distributed``'s
``symmetric_bytes``): the buckets' all-reduces then run in NCCL's symmetric kernels, those before
the last on four SMs beside the backward pass's GEMMs (1.66x one GPU's throughput against 1.49x on
two H100s; docs/distributed.md). It wants twice the largest bucket's gradients and sums (96 for
the full model).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import hal  # noqa: E402
import runtime as rt  # noqa: E402
from hal import channel_provider  # noqa: E402

LR = 0.1


def loss(w1, b1, w2, b2, x, y):
    h = rt.nn.relu(x @ w1 + b1)
    d = h @ w2 + b2 - y
    return (d * d).mean()


value_and_grad = rt.value_and_grad(loss, argnums=(0, 1, 2, 3))


def make_step(group: rt.distributed.Group):
    def step(w1, b1, w2, b2, x, y):
        value, grads = value_and_grad(w1, b1, w2, b2, x, y)
        grads = rt.distributed.average_gradients(grads, group)
        return (*(p - LR * g for p, g in zip((w1, b1, w2, b2), grads)), rt.distributed.all_mean(value, group))

    return rt.compile(step)


def device(driver: str, index: int) -> hal.Device:
    """Device ``index`` of the driver (the CPU drivers make a new device each time: one per rank)."""
    if driver in ("local-sync", "local-task"):
        return hal.create_device(driver)
    return hal.open_device(f"{driver}://{index}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", default="cuda", help="driver of the devices (default: cuda)")
    parser.add_argument("--local", type=int, default=0, metavar="N",
                        help="drive N devices from this process (default: every device of the driver)")
    parser.add_argument("--per-process", action="store_true",
                        help="one device per process, rank and size from the launcher (torchrun, mpirun)")
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--batch", type=int, default=512, help="samples per rank and step (default 512)")
    parser.add_argument("--small", action="store_true", help="a small model (64 -> 256 -> 64)")
    parser.add_argument("--symmetric-mb", type=int, default=0, metavar="N",
                        help="symmetric memory for overlapped buckets, MB per group (default 0: none)")
    args = parser.parse_args()
    if args.steps < 1 or args.batch < 1 or args.local < 0 or args.symmetric_mb < 0:
        parser.error("--steps and --batch must be at least 1, --local and --symmetric-mb at least 0")
    symmetric = args.symmetric_mb << 20
    if args.per_process:
        launch = channel_provider.launch_environment()
        local_rank = launch.local_rank if launch is not None else 0
        groups = [rt.distributed.init(device(args.driver, local_rank), symmetric_bytes=symmetric)]
    else:
        count = args.local or len(hal.get_driver(args.driver).query_devices())
        groups = rt.distributed.groups([device(args.driver, i) for i in range(count)], symmetric_bytes=symmetric)
    size = groups[0].size
    n_in, hidden, n_out = (64, 256, 64) if args.small else (1024, 4096, 1024)
    rng = np.random.default_rng(0)  # every rank draws the same parameters and the same global batch
    params = [(rng.standard_normal((n_in, hidden)) / np.sqrt(n_in)).astype(np.float32), np.zeros(hidden, np.float32),
              (rng.standard_normal((hidden, n_out)) / np.sqrt(hidden)).astype(np.float32), np.zeros(n_out, np.float32)]
    x_all = rng.standard_normal((args.batch * size, n_in)).astype(np.float32)
    y_all = rng.standard_normal((args.batch * size, n_out)).astype(np.float32)

    ranks = []
    for group in groups:
        rows = slice(group.rank * args.batch, (group.rank + 1) * args.batch)
        ranks.append({"group": group, "step": make_step(group),
                      "state": [rt.array(p, device=group.device) for p in params],
                      "x": rt.array(x_all[rows], device=group.device), "y": rt.array(y_all[rows], device=group.device)})
    def train(r: dict) -> None:
        for step in range(args.steps):
            *r["state"], r["loss"] = r["step"](*r["state"], r["x"], r["y"])
            if step == 0:
                r["first"] = [np.array(np.asarray(a)) for a in r["state"]]
            if step in (0, args.steps - 1) and r["group"].rank == 0:
                print(f"step {step}: loss {float(r['loss']):.5f} (mean over {size} ranks)")
        rt.synchronize(r["group"].device)

    # A thread per rank of this process (see the module doc).
    started = time.perf_counter()
    threads = [threading.Thread(target=train, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    print(f"{args.steps} steps of {args.batch * size} samples on {size} ranks: "
          f"{args.steps * args.batch * size / elapsed:,.0f} samples/s")

    # One device over the whole batch: its first step agrees to float32 rounding; later steps drift.
    first = ranks[0]["group"].device
    one = [rt.array(p, device=first) for p in params]
    X, Y = rt.array(x_all, device=first), rt.array(y_all, device=first)

    def difference(states: list) -> float:
        return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(float(np.max(np.abs(np.asarray(b)))),
                                                                              1e-30))
                   for state in states for a, b in zip(state, one))

    for step in range(args.steps):
        _, grads = value_and_grad(*one, X, Y)
        one = [p - LR * g for p, g in zip(one, grads)]
        rt.eval(*one)
        if step == 0:
            first_step = difference([r["first"] for r in ranks])
    last_step = difference([r["state"] for r in ranks])
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for r in ranks[1:]
               for a, b in zip(r["state"], ranks[0]["state"]))
    ok = first_step < 1e-5 and same
    print(f"against one device: first step {first_step:.2e} (relative), after {args.steps} steps {last_step:.2e}; "
          f"ranks identical: {same} -> {'OK' if ok else 'WRONG'}")
    for r in ranks:
        r["group"].close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
