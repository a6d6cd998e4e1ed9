"""All-reduce through HAL command buffers on several GPUs of one host, against NCCL and torch.distributed.

    python benchmarks/collective_bench.py [--out FILE] [--gpus N] [--rounds R] [--sizes 8,1M,1G]
                                          [--skip torch,mlp] [--fake]

Two layouts. First one process drives every GPU (``hal.create_channels``). Per size, in rounds taken in turn:

- ``hal_stream``: a reusable command buffer of one in-place ``all_reduce`` per GPU on stream command
  buffers, submitted through a prepared execution (``device.prepare``) on every GPU, back to back;
- ``hal_graph``: the same on graph command buffers (the NCCL call captured into a child-graph node);
- ``nccl``: NCCL called directly through nccl4py in the same process: ``group_start``, one
  ``all_reduce`` per GPU on its own stream, ``group_end``, back to back.

Each sample times ``iterations`` operations on the host clock up to the end of the last one; the time
of an operation is the sample over ``iterations``, its bus bandwidth nccl-tests' ``bytes / time *
2 (n - 1) / n``. Every size reports the median and spread of each contender over the rounds and the
ratios to NCCL (bandwidth; latency at the smallest size).

``processes``: the same three with a process per GPU, as torchrun starts them (``hal.create_channel``
of one rank; NCCL's ``comm_init_rank``, one ungrouped ``all_reduce`` a step), each rank timing its own
submissions after a barrier, every rank looping as often.

``torch``: ``torch.distributed`` all-reduce with the NCCL backend, one spawned process per GPU
(after the rounds above, alone on the GPUs), timed the same way. ``mlp``: the data-parallel training
step of the workload benchmark's MLP (``workload_mlp.py``: batch 512 a GPU, 1024 -> 4096 -> 1024):
each GPU runs one compiled step on its part of the batch, whose gradients ``rt.distributed.average_gradients``
averages in buckets recorded in the same graph as the backward pass (a bucket's all-reduce beside the
rest of the backward pass), one thread queueing every GPU's step; throughput against the compiled step
on one GPU, and the first step's parameters against one GPU's step on the whole batch.
``mlp_processes``: the same step with a process per GPU (torchrun's layout: no thread drives two
GPUs), the one-GPU step timed in the same processes. ``torch_mlp``: PyTorch's data-parallel step of
the same MLP (``DistributedDataParallel``, a process per GPU) against its one-GPU step, and whether a
GEMM and an all-reduce run at once on these GPUs at all (``dp_torch.py``).

NCCL_NVLS_ENABLE=0 is set unless given (NVLink multicast off). ``--fake`` runs every HAL path on the
simulated GPU of the tests (tiny sizes, no baselines): a check that the benchmark itself runs.
Prints one JSON document (also written to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402

import hal  # noqa: E402

SIZES = [8, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
FAKE_SIZES = [8, 4096, 1 << 16]
#: A sample lasts about this long (more operations for small sizes), within these counts.
SAMPLE_S = 0.03
MIN_ITERATIONS, MAX_ITERATIONS = 5, 2000
TARGETS = {"bandwidth_vs_nccl_from_1MiB": 0.95, "latency_vs_nccl_8B": 1.3, "vs_torch": 1.0, "dp_speedup": 1.8}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("IB").rstrip("B") if text.strip().upper().endswith("B") else text.strip().upper()
    if text[-1:] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def bus_bandwidth(size: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth (bytes/s)."""
    return size / seconds * 2 * (ranks - 1) / ranks


def summary(times: list[float], size: int, ranks: int) -> dict:
    med = statistics.median(times)
    return {"time_us": med * 1e6, "min_us": min(times) * 1e6, "max_us": max(times) * 1e6,
            "busbw_GBps": bus_bandwidth(size, med, ranks) / 1e9, "samples": len(times)}


def iterations_for(size: int, estimate_s: float) -> int:
    return int(min(MAX_ITERATIONS, max(MIN_ITERATIONS, SAMPLE_S / max(estimate_s, 1e-7))))


# ---- the HAL ------------------------------------------------------------------------------------------
class HalAllReduce:
    """One in-place all-reduce per device, recorded once per size, submitted through prepared executions."""

    def __init__(self, devices: list[hal.Device], channels: list[hal.Channel], capacity: int) -> None:
        self.devices = devices
        self.channels = channels
        self.buffers = [d.allocator.allocate(capacity) for d in devices]
        self.sems = [d.create_semaphore(0) for d in devices]
        self.value = 0
        self.executions: list = []

    def prepare(self, size: int) -> None:
        count = max(size // 4, 1)
        self.executions = []
        for device, channel, buf in zip(self.devices, self.channels, self.buffers):
            cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE)
            with cb.record():
                cb.all_reduce(channel, (buf, 0, count * 4), (buf, 0, count * 4), count, "float32")
            self.executions.append(device.prepare([cb]))

    def run(self, iterations: int) -> float:
        executions = self.executions
        started = time.perf_counter()
        for _ in range(iterations - 1):
            for execution in executions:
                execution.submit()
        self.value += 1
        for execution, sem in zip(executions, self.sems):
            execution.submit(signal=[(sem, self.value)])
        for sem in self.sems:
            sem.wait(self.value, timeout=120)
        return (time.perf_counter() - started) / iterations

    def check(self, size: int) -> bool:
        """An all-reduce of the ranks' numbers sums them (run once, outside the timing)."""
        count = max(size // 4, 1)
        probe = min(count, 1024)
        for device, channel, buf in zip(self.devices, self.channels, self.buffers):
            device.write(buf, np.full(probe, channel.rank + 1, np.float32).tobytes())
        self.run(1)
        expected = sum(range(1, self.channels[0].count + 1))
        return all(np.all(np.frombuffer(d.read(b, 0, probe * 4), np.float32) == expected)
                   for d, b in zip(self.devices, self.buffers))


# ---- NCCL directly --------------------------------------------------------------------------------------
class NcclDirect:
    """NCCL through nccl4py: a communicator, stream and buffer per GPU of this process; the
    all-reduces of a step grouped where there are several, a plain call for one rank (as a process
    of torchrun makes it)."""

    def __init__(self, devices: list[hal.Device], comms: list, capacity: int) -> None:
        from nccl.bindings import nccl

        self.nccl = nccl
        self.devices = devices
        self.comms = comms
        self.buffers = [d.allocator.allocate(max(capacity, 8)) for d in devices]
        self.pointers = [b.device_address for b in self.buffers]
        self.streams = []
        for device in devices:
            device.make_current()
            self.streams.append(device.api.stream_create())
        self.handles = [int(s) for s in self.streams]
        self.count = 1

    @classmethod
    def every_gpu(cls, devices: list[hal.Device], capacity: int) -> NcclDirect:
        """One process for every GPU: ``comm_init_all``."""
        from nccl.bindings import nccl

        return cls(devices, list(nccl.comm_init_all(len(devices), [d.info.ordinal for d in devices])), capacity)

    @classmethod
    def one_rank(cls, device: hal.Device, rank: int, world: int, id: bytes, capacity: int) -> NcclDirect:
        """This process's rank: ``comm_init_rank`` (blocking)."""
        from nccl.bindings import nccl

        device.make_current()
        return cls([device], [nccl.comm_init_rank(world, nccl.UniqueId.from_buffer(bytearray(id)), rank)], capacity)

    def prepare(self, size: int) -> None:
        self.count = max(size // 4, 1)

    def run(self, iterations: int) -> float:
        nccl, comms, pointers, handles, count = self.nccl, self.comms, self.pointers, self.handles, self.count
        started = time.perf_counter()
        if len(comms) == 1:
            comm, ptr, stream = comms[0], pointers[0], handles[0]
            for _ in range(iterations):
                nccl.all_reduce(ptr, ptr, count, 7, 0, comm, stream)  # float32, sum
        else:
            for _ in range(iterations):
                nccl.group_start()
                for comm, ptr, stream in zip(comms, pointers, handles):
                    nccl.all_reduce(ptr, ptr, count, 7, 0, comm, stream)
                nccl.group_end()
        for device, stream in zip(self.devices, self.streams):
            device.make_current()
            device.api.stream_synchronize(stream)
        return (time.perf_counter() - started) / iterations

    def most(self, value: int) -> int:
        """One rank's: the largest ``value`` of every rank (an int32 max all-reduce, synchronized),
        a barrier too."""
        (device,), (buffer,) = self.devices, self.buffers
        device.write(buffer, np.array([value], np.int32).tobytes())
        self.nccl.all_reduce(self.pointers[0], self.pointers[0], 1, 2, 2, self.comms[0], self.handles[0])  # int32, max
        device.api.stream_synchronize(self.streams[0])
        return int(np.frombuffer(device.read(buffer, 0, 4), np.int32)[0])

    def close(self) -> None:
        for device, stream in zip(self.devices, self.streams):
            device.make_current()
            device.api.stream_destroy(stream)
        for comm in self.comms:
            self.nccl.comm_destroy(comm)
        for buf in self.buffers:
            buf.release()


def all_reduce_rounds(args, gpus: int, sizes: list[int]) -> dict:
    """The interleaved rounds of hal_stream, hal_graph and (on GPUs) nccl over every size."""
    capacity = max(sizes)
    result: dict = {"sizes": {}, "errors": {}}
    pairs = {}
    opened: list = []
    try:
        for mode in ("stream", "graph"):
            devices = make_devices(args, gpus, command_buffer=mode)
            opened.extend(devices)
            channels = hal.create_channels(devices)
            opened.extend(channels)
            pairs[f"hal_{mode}"] = HalAllReduce(devices, channels, capacity)
        if not args.fake:
            try:
                pairs["nccl"] = NcclDirect.every_gpu(opened[:gpus], capacity)
            except Exception as exc:  # reported, the HAL's numbers still come
                result["errors"]["nccl"] = f"{type(exc).__name__}: {exc}"
        for size in sizes:
            entry = result["sizes"][str(size)] = {"bytes": size}
            times: dict[str, list[float]] = {name: [] for name in pairs}
            for contender in pairs.values():
                contender.prepare(size)
            for name, contender in pairs.items():
                if isinstance(contender, HalAllReduce):
                    entry[f"{name}_correct"] = contender.check(size)
            estimate = {name: c.run(2) for name, c in pairs.items()}  # warm-up
            iterations = {name: iterations_for(size, t) for name, t in estimate.items()}
            for _ in range(args.rounds):
                for name, contender in pairs.items():
                    times[name].append(contender.run(iterations[name]))
            for name in pairs:
                entry[name] = summary(times[name], size, gpus)
                entry[name]["iterations"] = iterations[name]
            if "nccl" in entry:
                for name in ("hal_stream", "hal_graph"):
                    entry[f"{name}_busbw_vs_nccl"] = entry[name]["busbw_GBps"] / entry["nccl"]["busbw_GBps"]
                    entry[f"{name}_time_vs_nccl"] = entry[name]["time_us"] / entry["nccl"]["time_us"]
            print(f"all_reduce {size:>11} B: " + "  ".join(
                f"{n} {entry[n]['time_us']:9.1f} us {entry[n]['busbw_GBps']:7.1f} GB/s" for n in pairs), flush=True)
    finally:
        close_all(pairs.get("nccl"), opened)
    return result


def close_all(nccl_direct: NcclDirect | None, opened: list) -> None:
    """NCCL's communicators, then the channels, then the devices."""
    if nccl_direct is not None:
        nccl_direct.close()
    for thing in opened:
        if isinstance(thing, hal.Channel):
            thing.close()
    for thing in opened:
        if isinstance(thing, hal.Device):
            thing.close()


def make_devices(args, gpus: int, **options) -> list[hal.Device]:
    if args.fake:
        sys.path.insert(0, str(ROOT / "tests"))
        from drivers.fake_gpu import FakeGpuDriver

        driver = args.fake_driver = getattr(args, "fake_driver", None) or FakeGpuDriver()
        return [driver.create_device(i, **options) for i in range(gpus)]
    return [hal.create_device(f"cuda://{i}", **options) for i in range(gpus)]


# ---- a process per GPU ---------------------------------------------------------------------------------
def process_worker(rank: int, world: int, ids: list[bytes], sizes: list[int], rounds: int, out: str) -> None:
    """One rank of ``process_rounds``: hal_stream, hal_graph and nccl on this process's GPU."""
    capacity = max(sizes)
    opened: list = []
    pairs: dict = {}
    try:
        for mode, id in zip(("stream", "graph"), ids):
            device = hal.create_device(f"cuda://{rank}", command_buffer=mode)
            opened.append(device)
            channel = hal.create_channel(device, rank=rank, count=world, id=id)
            opened.append(channel)
            pairs[f"hal_{mode}"] = HalAllReduce([device], [channel], capacity)
        nccl_rank = pairs["nccl"] = NcclDirect.one_rank(opened[0], rank, world, ids[2], capacity)
        results: dict = {}
        for size in sizes:
            entry = results[str(size)] = {"bytes": size}
            for contender in pairs.values():
                contender.prepare(size)
            for name, contender in pairs.items():
                if isinstance(contender, HalAllReduce):
                    entry[f"{name}_correct"] = bool(nccl_rank.most(0 if contender.check(size) else 1) == 0)
            iterations = {}
            for name, contender in pairs.items():  # every rank loops as often: the most any asks for
                nccl_rank.most(0)
                iterations[name] = nccl_rank.most(iterations_for(size, contender.run(2)))
            times: dict[str, list[float]] = {name: [] for name in pairs}
            for _ in range(rounds):
                for name, contender in pairs.items():
                    nccl_rank.most(0)  # (a barrier: the ranks start together)
                    times[name].append(contender.run(iterations[name]))
            for name in pairs:
                entry[name] = summary(times[name], size, world)
                entry[name]["iterations"] = iterations[name]
            for name in ("hal_stream", "hal_graph"):
                entry[f"{name}_busbw_vs_nccl"] = entry[name]["busbw_GBps"] / entry["nccl"]["busbw_GBps"]
                entry[f"{name}_time_vs_nccl"] = entry[name]["time_us"] / entry["nccl"]["time_us"]
            if rank == 0:
                print(f"process per GPU {size:>11} B: " + "  ".join(
                    f"{n} {entry[n]['time_us']:9.1f} us {entry[n]['busbw_GBps']:7.1f} GB/s" for n in pairs), flush=True)
        if rank == 0:
            Path(out).write_text(json.dumps({"sizes": results}))
    finally:
        close_all(pairs.get("nccl"), opened)


def run_ranks(gpus: int, command, what: str) -> dict:
    """Start a process per rank (``command(rank, out)``: its argv; rank 0 writes its JSON to ``out``),
    wait for them all and return what rank 0 wrote, or an error naming ``what``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "rank0.json")
        procs = [subprocess.Popen([sys.executable, *command(rank, out)]) for rank in range(gpus)]
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes) or not Path(out).exists():
            return {"error": f"{what} exited with {codes}"}
        return json.loads(Path(out).read_text())


def process_rounds(args, gpus: int, sizes: list[int]) -> dict:
    """The contenders of ``all_reduce_rounds`` with a process per GPU (as torchrun starts them): HAL
    channels from ``hal.create_channel`` and NCCL from ``comm_init_rank``, each rank timing its own
    submissions; ids made here and passed down."""
    from nccl.bindings import nccl

    ids = [bytes(nccl.get_unique_id()) for _ in range(3)]  # (a HAL channel id on CUDA is NCCL's unique id)
    return run_ranks(gpus, lambda rank, out: [__file__, "--process-worker", str(rank), str(gpus),
                                              ",".join(i.hex() for i in ids), ",".join(map(str, sizes)),
                                              str(args.rounds), out], "workers")


# ---- torch.distributed ----------------------------------------------------------------------------------
def torch_worker(rank: int, world: int, port: int, sizes: list[int], rounds: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    results = {}
    buf = torch.ones(max(sizes) // 4, dtype=torch.float32, device="cuda")

    def run(count: int, iterations: int) -> float:
        view = buf[:count]
        torch.cuda.synchronize()
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(view)
        torch.cuda.synchronize()
        return (time.perf_counter() - started) / iterations

    for size in sizes:
        count = max(size // 4, 1)
        estimate = run(count, 2)
        iterations = iterations_for(size, estimate)
        iterations = torch.tensor([iterations], device="cuda")
        dist.broadcast(iterations, 0)  # every rank loops as often
        times = [run(count, int(iterations.item())) for _ in range(rounds)]
        results[str(size)] = summary(times, size, world)
    if rank == 0:
        Path(out).write_text(json.dumps({"torch": torch.__version__, "sizes": results}))
    dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_rounds(args, gpus: int, sizes: list[int]) -> dict:
    port = free_port()
    return run_ranks(gpus, lambda rank, out: [__file__, "--torch-worker", str(rank), str(gpus), str(port),
                                              ",".join(map(str, sizes)), str(args.rounds), out],
                     "torch.distributed workers")


# ---- the data-parallel MLP step ---------------------------------------------------------------------------
def max_relative(ours: list, reference: list) -> float:
    """The largest difference of two parameter lists, each relative to its reference's largest value."""
    import workload_mlp as mlp

    return max(mlp.relative(np.asarray(o), np.asarray(r)) for o, r in zip(ours, reference))


def dp_step_of(group):
    """The compiled data-parallel step of ``group``'s rank: gradients averaged by ``average_gradients``."""
    import workload_mlp as mlp

    import runtime as rt

    def step(w1, b1, w2, b2, x, y):
        _, grads = mlp.value_and_grad(w1, b1, w2, b2, x, y)
        grads = rt.distributed.average_gradients(grads, group)
        return tuple(p - mlp.LR * g for p, g in zip((w1, b1, w2, b2), grads))

    return rt.compile(step)


#: Symmetric memory of each group of the overlapped data-parallel step: a bucket's gradients and
#: their sums (2 x 16 MB for each of the MLP's two buckets) for each of the two recordings rt.compile
#: alternates between (a step's outputs are the next step's inputs), with room for alignment. Half
#: of it leaves every other step's operands in ordinary memory (0.714 ms a step against 0.653).
SYMMETRIC_BYTES = 96 << 20


def mlp_worker(rank: int, world: int, ids: list[bytes], rounds: int, out: str) -> None:
    """One rank of ``mlp_processes``: this process's GPU, a channel of one rank, the compiled
    data-parallel step (ordinary buffers, and overlapped in symmetric memory on a group of its own:
    ``rt.distributed``'s ``symmetric_bytes``) and the one-GPU step, each timed by every rank at
    once after a barrier."""
    import workload_mlp as mlp

    import runtime as rt

    params_np, x_all, y_all, batch = mlp.global_batch(False, world)
    device = hal.create_device(f"cuda://{rank}")
    group = rt.distributed.init(device, rank=rank, size=world, id=ids[0])
    sym_group = rt.distributed.init(device, rank=rank, size=world, id=ids[1], symmetric_bytes=SYMMETRIC_BYTES)
    try:
        token = rt.array(np.zeros(1, np.float32), device=device)

        def barrier() -> None:  # (an all-reduce read back: every rank got here)
            rt.distributed.all_sum(token, group).numpy()

        dp_c, sym_c, one_c = dp_step_of(group), dp_step_of(sym_group), rt.compile(mlp.step)
        x = rt.array(x_all[rank * batch:(rank + 1) * batch], device=device)
        y = rt.array(y_all[rank * batch:(rank + 1) * batch], device=device)
        states = {name: [rt.array(p, device=device) for p in params_np] for name in ("one", "dp", "sym")}

        def stepper(compiled, state: list):
            def run_steps(count: int) -> None:
                for _ in range(count):
                    state[:] = compiled(*state, x, y)[:4]
            return run_steps

        one_steps, dp_steps, sym_steps = (stepper(c, states[n]) for c, n in ((one_c, "one"), (dp_c, "dp"),
                                                                              (sym_c, "sym")))
        dp_steps(1)
        sym_steps(1)
        whole = one_c(*[rt.array(p, device=device) for p in params_np], rt.array(x_all, device=device),
                      rt.array(y_all, device=device))[:4]
        agreements = [max_relative(states[name], whole) for name in ("dp", "sym")]
        contenders = (("one_gpu", one_steps), ("data_parallel", dp_steps), ("data_parallel_symmetric", sym_steps))
        for _, run in contenders:  # warm-up: compiles and caches
            run(3)
        rt.synchronize(device)
        times: dict[str, list[float]] = {name: [] for name, _ in contenders}
        steps = 20
        for _ in range(rounds):
            for name, run in contenders:
                barrier()
                started = time.perf_counter()
                run(steps)
                rt.synchronize(device)
                times[name].append((time.perf_counter() - started) / steps)
        barrier()
        if rank == 0:
            one, dp, sym = (statistics.median(times[name]) for name, _ in contenders)
            Path(out).write_text(json.dumps({
                "batch_per_gpu": batch, "gpus": world, "shape": list(mlp.FULL),
                "one_gpu_step_ms": one * 1e3, "data_parallel_step_ms": dp * 1e3,
                "speedup": world * one / dp,
                "first_step_max_relative_difference_vs_one_gpu_whole_batch": agreements[0],
                "symmetric": {"data_parallel_step_ms": sym * 1e3, "speedup": world * one / sym,
                              "symmetric_bytes": SYMMETRIC_BYTES,
                              "first_step_max_relative_difference_vs_one_gpu_whole_batch": agreements[1]},
                "spread_ms": {k: [min(v) * 1e3, max(v) * 1e3] for k, v in times.items()}}))
    finally:
        sym_group.close()
        group.close()
        device.close()


def mlp_processes(args, gpus: int) -> dict:
    """The data-parallel MLP step with a process per GPU (torchrun's layout): each process drives
    its own GPU, so no thread's host work is shared; the one-GPU step is timed in the same
    processes (every GPU running it on its own part at once)."""
    from nccl.bindings import nccl

    ids = ",".join(bytes(nccl.get_unique_id()).hex() for _ in range(2))
    return run_ranks(gpus, lambda rank, out: [__file__, "--mlp-worker", str(rank), str(gpus), ids,
                                              str(args.rounds), out], "workers")


def mlp_data_parallel(args, gpus: int) -> dict:
    """Weak scaling of the workload MLP's compiled step (see the module), and the first step's agreement."""
    import workload_mlp as mlp

    import runtime as rt

    params_np, x_all, y_all, batch = mlp.global_batch(args.fake, gpus)
    devices = make_devices(args, gpus)
    groups = rt.distributed.groups(devices)
    try:
        steps_c = [dp_step_of(g) for g in groups]
        step_c = rt.compile(mlp.step)
        xs = [rt.array(x_all[i * batch:(i + 1) * batch], device=d) for i, d in enumerate(devices)]
        ys = [rt.array(y_all[i * batch:(i + 1) * batch], device=d) for i, d in enumerate(devices)]
        state = [[rt.array(p, device=d) for p in params_np] for d in devices]

        def dp_step(count: int) -> None:
            # One thread drives every GPU: each call queues its rank's step (its bucketed all-reduces
            # recorded in the same graph as the backward pass) and returns.
            for _ in range(count):
                for r in range(gpus):
                    state[r] = list(steps_c[r](*state[r], xs[r], ys[r]))

        # the first step against one GPU's step over the whole batch
        dp_step(1)
        whole = step_c(*[rt.array(p, device=devices[0]) for p in params_np], rt.array(x_all, device=devices[0]),
                       rt.array(y_all, device=devices[0]))[:4]
        ours = [np.asarray(a) for a in state[0]]
        others = [[np.asarray(a) for a in s] for s in state[1:]]
        agreement = max_relative(ours, whole)
        ranks_equal = all(all(np.array_equal(a, b) for a, b in zip(ours, other)) for other in others)

        one_state = [rt.array(p, device=devices[0]) for p in params_np]

        def one_step(count: int) -> None:
            for _ in range(count):
                one_state[:] = step_c(*one_state, xs[0], ys[0])[:4]

        apart_state = [[rt.array(p, device=d) for p in params_np] for d in devices]

        def apart_step(count: int) -> None:
            # Every GPU its own step, no collective: what the data-parallel step costs beside the all-reduce.
            for _ in range(count):
                for r in range(gpus):
                    apart_state[r][:] = step_c(*apart_state[r], xs[r], ys[r])[:4]

        def sync() -> None:
            for d in devices:
                rt.synchronize(d)

        for run in (one_step, dp_step, apart_step):  # warm-up: compiles and caches
            run(2)
        sync()
        times: dict[str, list[float]] = {"one_gpu": [], "data_parallel": [], "apart": []}
        steps = 5 if args.fake else 20
        for _ in range(args.rounds):
            for name, run in (("one_gpu", one_step), ("data_parallel", dp_step), ("apart", apart_step)):
                started = time.perf_counter()
                run(steps)
                sync()
                times[name].append((time.perf_counter() - started) / steps)
        one = statistics.median(times["one_gpu"])
        dp = statistics.median(times["data_parallel"])
        return {
            "batch_per_gpu": batch, "gpus": gpus, "shape": list(mlp.QUICK if args.fake else mlp.FULL),
            "one_gpu_step_ms": one * 1e3, "data_parallel_step_ms": dp * 1e3,
            "every_gpu_apart_step_ms": statistics.median(times["apart"]) * 1e3,
            "one_gpu_samples_per_s": batch / one, "data_parallel_samples_per_s": batch * gpus / dp,
            "speedup": (batch * gpus / dp) / (batch / one),
            "first_step_max_relative_difference_vs_one_gpu_whole_batch": agreement,
            "ranks_hold_equal_parameters": ranks_equal,
            "spread_ms": {k: [min(v) * 1e3, max(v) * 1e3] for k, v in times.items()},
        }
    finally:
        for group in groups:
            group.close()


def torch_mlp(args, gpus: int) -> dict:
    """PyTorch's data-parallel step of the same MLP (DistributedDataParallel) and the GEMM / all-reduce
    overlap probe, a process per GPU (``dp_torch.py``)."""
    port = free_port()
    script = str(ROOT / "benchmarks" / "dp_torch.py")
    return run_ranks(gpus, lambda rank, out: [script, str(rank), str(gpus), str(port), str(args.rounds), out],
                     "PyTorch data-parallel workers")


# ---- main -------------------------------------------------------------------------------------------------
def verdicts(report: dict) -> dict:
    """Per layout (one process for every GPU, a process per GPU) and mode, the worst ratios to NCCL
    and to torch.distributed (which runs a process per GPU) against the targets."""
    out: dict = {}
    torch_sizes = report.get("torch", {}).get("sizes", {})
    for layout, prefix in (("all_reduce", ""), ("processes", "processes_")):
        rounds = report.get(layout, {}).get("sizes", {})
        for mode in ("hal_stream", "hal_graph"):
            bandwidth = [e[f"{mode}_busbw_vs_nccl"] for s, e in rounds.items() if int(s) >= 1 << 20
                         and f"{mode}_busbw_vs_nccl" in e]
            small = [e[f"{mode}_time_vs_nccl"] for s, e in rounds.items()
                     if int(s) <= 8 and f"{mode}_time_vs_nccl" in e]
            vs_torch = [torch_sizes[s]["time_us"] / e[mode]["time_us"] for s, e in rounds.items() if s in torch_sizes]
            if not rounds:
                continue
            verdict = out[prefix + mode] = {
                "worst_busbw_vs_nccl_from_1MiB": min(bandwidth) if bandwidth else None,
                "latency_vs_nccl_8B": small[0] if small else None,
                "worst_speed_vs_torch": min(vs_torch) if vs_torch else None,
            }
            verdict["meets_targets"] = bool(bandwidth and small and vs_torch) and \
                min(bandwidth) >= TARGETS["bandwidth_vs_nccl_from_1MiB"] and \
                small[0] <= TARGETS["latency_vs_nccl_8B"] and min(vs_torch) >= TARGETS["vs_torch"]
    for section in ("mlp", "mlp_processes"):
        mlp = report.get(section, {})
        if "speedup" in mlp:
            out[f"{section}_dp_speedup_meets_target"] = mlp["speedup"] >= TARGETS["dp_speedup"]
            if "speedup" in report.get("torch_mlp", {}):
                out[f"{section}_dp_speedup_vs_torch_ddp"] = mlp["speedup"] / report["torch_mlp"]["speedup"]
        if "speedup" in mlp.get("symmetric", {}):
            out[f"{section}_symmetric_dp_speedup_meets_target"] = mlp["symmetric"]["speedup"] >= TARGETS["dp_speedup"]
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--process-worker":
        rank, world, ids, sizes, rounds, out = sys.argv[2:8]
        process_worker(int(rank), int(world), [bytes.fromhex(i) for i in ids.split(",")],
                       [int(s) for s in sizes.split(",")], int(rounds), out)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--mlp-worker":
        rank, world, ids, rounds, out = sys.argv[2:7]
        mlp_worker(int(rank), int(world), [bytes.fromhex(i) for i in ids.split(",")], int(rounds), out)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        rank, world, port, sizes, rounds, out = sys.argv[2:8]
        torch_worker(int(rank), int(world), int(port), [int(s) for s in sizes.split(",")], int(rounds), out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: every one, at least 2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default=None, help="comma-separated bytes (K, M, G suffixes)")
    parser.add_argument("--skip", default="",
                        help="comma-separated sections to skip: all_reduce, processes, torch, mlp, mlp_processes, "
                             "torch_mlp")
    parser.add_argument("--fake", action="store_true", help="the simulated GPU of the tests (a check that it runs)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if args.fake:
        gpus = args.gpus or 2
        sizes = FAKE_SIZES
        skip.update(("torch", "processes", "mlp_processes", "torch_mlp"))
    else:
        gpus = args.gpus or len(hal.get_driver("cuda").query_devices())
        sizes = SIZES
    if args.sizes:
        sizes = [parse_size(s) for s in args.sizes.split(",")]
    report: dict = {"benchmark": "collective_bench", "gpus": gpus, "rounds": args.rounds, "targets": TARGETS,
                    "environment": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}}
    if not args.fake:
        try:
            from hal.drivers.cuda import nccl

            report["nccl"] = nccl.load().name
        except Exception as exc:
            report["nccl"] = f"unavailable: {exc}"
        devices = hal.get_driver("cuda").query_devices()
        report["devices"] = [d.name for d in devices[:gpus]]
    if gpus < 2 and not args.fake:
        report["error"] = f"{gpus} GPU(s): collectives need 2 or more"
    else:
        for name, section in (("all_reduce", lambda: all_reduce_rounds(args, gpus, sizes)),
                              ("processes", lambda: process_rounds(args, gpus, sizes)),
                              ("torch", lambda: torch_rounds(args, gpus, sizes)),
                              ("mlp", lambda: mlp_data_parallel(args, gpus)),
                              ("mlp_processes", lambda: mlp_processes(args, gpus)),
                              ("torch_mlp", lambda: torch_mlp(args, gpus))):
            if name in skip:
                continue
            started = time.perf_counter()
            try:
                report[name] = section()
            except Exception as exc:  # one section failing leaves the others' numbers
                report[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            report[name]["seconds"] = time.perf_counter() - started
            print(f"{name}: done in {report[name]['seconds']:.1f} s", flush=True)
        report["verdicts"] = verdicts(report)
    text = json.dumps(report, indent=2, default=float)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
