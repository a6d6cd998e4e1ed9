"""Timing of device work for ``workload_bench.py``: batches of queued iterations, one wait a batch,
contenders taken in turn round by round.

A batch queues ``count`` iterations and waits once, so the host's cost per call hides behind the
device's work wherever the device is the slower one (as in a training loop that reads its loss
rarely), and the wait's own latency is spread over the batch. The same clock and the same loop time
every contender, the runtime's and PyTorch's alike: the runtime's work runs on its own stream,
where PyTorch's CUDA events could not bracket it.
"""

from __future__ import annotations

import random
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import runtime as rt


@dataclass
class Settings:
    """What every case of a run shares."""

    device: Any  # the hal.Device the runtime's arrays live on
    on_gpu: bool
    quick: bool
    rounds: int
    batch_s: float
    torch: Any = None  # the torch module, where PyTorch's baselines run
    torch_compile: bool = True
    rng: np.random.Generator | None = None


@dataclass
class Contender:
    """``run(count)`` queues ``count`` iterations; ``sync()`` returns once they have finished."""

    run: Callable[[int], None]
    sync: Callable[[], None]


def synced(contender: Contender) -> Contender:
    """The same iterations, each waited for before the next is called."""

    def run(count: int) -> None:
        for _ in range(count):
            contender.run(1)
            contender.sync()

    return Contender(run, contender.sync)


def error_text(exc: BaseException) -> str:
    """The exception and the innermost frames of its traceback, for the JSON."""
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(frames)[-1500:]


def batch_size(contender: Contender, batch_s: float, limit: int) -> int:
    """Iterations a batch needs to last about ``batch_s``, from one synchronized iteration."""
    t = time.perf_counter()
    contender.run(1)
    contender.sync()
    one = time.perf_counter() - t
    return max(1, min(limit, round(batch_s / max(one, 1e-7))))


def measure(contenders: dict[str, Contender], rounds: int, batch_s: float, limit: int = 500,
            warmups: int = 2, counter: Callable[[], int] = lambda: 0) -> tuple[dict, dict, int]:
    """(name -> {"wall": [s per iteration, a round each], "cpu": [...], "batch": n}, name -> error,
    how much ``counter()`` grew while the rounds were timed).

    Each contender is warmed up (compiles, traces, the graph cache, the allocators: ``warmups``
    synchronized iterations, then one batch at the size it will be timed at) before any is timed; a
    contender that raises there is dropped, with its error, and the others go on. Every contender's
    batch is as long as the longest any asks for (``batch_size``, up to ``limit``): a batch's fixed
    costs (the device idle while the first iteration is queued, the closing wait) then weigh alike
    on every contender, where a contender whose one timed iteration came out slow (a kernel loaded
    on its first fused run, say) would have got a shorter batch that they weigh on more. Every round
    then times one batch of each contender in turn, so that a drift of the host's or the device's
    speed hits all alike; each timed batch follows one untimed iteration of its own, so no timed
    sample pays for (or gains from) the cache state the previous contender left. The turn's order
    is shuffled every round (seeded): on an H200 the same kernel ran up to 3% faster or slower for
    twenty launches depending on which kernels ran before it, so in a fixed order one contender would
    always follow the same other one.
    """
    errors = {}
    sizes = {}
    for name, contender in list(contenders.items()):
        try:
            for _ in range(warmups):
                contender.run(1)
                contender.sync()
            sizes[name] = batch_size(contender, batch_s, limit)
        except Exception as exc:  # noqa: BLE001 - reported in the JSON; the other contenders go on
            errors[name] = error_text(exc)
    longest = max(sizes.values(), default=1)
    for name in list(sizes):
        sizes[name] = longest
        try:
            contenders[name].run(longest)
            contenders[name].sync()
        except Exception as exc:  # noqa: BLE001
            errors[name] = error_text(exc)
            del sizes[name]
    samples = {name: {"wall": [], "cpu": [], "batch": n} for name, n in sizes.items()}
    start = counter()
    order = random.Random(0)
    for _ in range(rounds):
        turn = list(sizes.items())
        order.shuffle(turn)
        for name, n in turn:
            contender = contenders[name]
            try:
                contender.run(1)
                contender.sync()
                t, c = time.perf_counter(), time.process_time()
                contender.run(n)
                contender.sync()
                samples[name]["wall"].append((time.perf_counter() - t) / n)
                samples[name]["cpu"].append((time.process_time() - c) / n)
            except Exception as exc:  # noqa: BLE001
                errors[name] = error_text(exc)
    grown = counter() - start
    for name in errors:
        samples.pop(name, None)
    return samples, errors, grown


def host_time(contender: Contender, samples: int = 21) -> float:
    """Seconds the host spends issuing one iteration with nothing in flight (median of ``samples``).
    Where it comes near the time an iteration takes in a batch, the batch measures the host's cost
    per call rather than the device's."""
    times = []
    for _ in range(samples):
        contender.sync()
        t = time.perf_counter()
        contender.run(1)
        times.append(time.perf_counter() - t)
    contender.sync()
    return statistics.median(times)


def spread(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1]}


def ratio(theirs: list[float], ours: list[float]) -> dict:
    """Their time over ours, round by round (>= 1: ours is as fast): median and spread over rounds."""
    return spread([t / o for t, o in zip(theirs, ours)])


def throughput(seconds: float, flop: float | None, nbytes: int | None) -> dict:
    out = {}
    if flop:
        out["TFLOPs"] = flop / seconds / 1e12
    if nbytes:
        out["GBps"] = nbytes / seconds / 1e9
    return out


def timed(settings: Settings, contenders: dict[str, Contender], ours: tuple[str, ...], flop: float | None = None,
          nbytes: int | None = None, copy_bytes: int | None = None) -> dict:
    """Measure the contenders; each one's time per iteration (median and spread over rounds) with its
    TFLOP/s or GB/s, the ratios of every baseline's time over each of ``ours`` (wall clock, and on a
    CPU driver this process's CPU time too), errors, and how many graphs the runtime built while timed (0: its graph
    cache was warm). A ``copy`` contender, moving ``copy_bytes`` (read + write), gives the copy
    bandwidth that each contender's GB/s is set against. Each queued contender's ``host_s`` is the
    host's time to issue one iteration with nothing in flight (``host_time``)."""
    samples, errors, misses = measure(contenders, settings.rounds, settings.batch_s,
                                      counter=lambda: rt.graph_cache_stats(settings.device)["misses"])
    out: dict = {"graph_cache_misses_while_timed": misses}
    copy = None
    if "copy" in samples and copy_bytes:
        copy = 2 * copy_bytes / statistics.median(samples["copy"]["wall"]) / 1e9
        out["copy_GBps"] = copy
    table = {}
    for name, sample in samples.items():
        entry = {"s": spread(sample["wall"]), "cpu_s": spread(sample["cpu"]), "batch": sample["batch"]}
        if name != "copy" and not name.endswith("_synced"):
            entry["host_s"] = host_time(contenders[name])
        if name != "copy":
            entry.update(throughput(entry["s"]["median"], flop, nbytes))
            if copy and "GBps" in entry:
                entry["fraction_of_copy_bandwidth"] = entry["GBps"] / copy
        table[name] = entry
    out["contenders"] = table
    ratios = {}
    for mine in ours:
        for base in samples:
            # queued against queued, synced against synced
            alike = mine.endswith("_synced") == base.endswith("_synced")
            if mine in samples and base not in ours and base != "copy" and alike:
                ratios[f"{mine}_vs_{base}"] = ratio(samples[base]["wall"], samples[mine]["wall"])
                if not settings.on_gpu:  # a GPU's waits spin: the CPU clock says nothing there
                    ratios[f"{mine}_vs_{base}_cpu_time"] = ratio(samples[base]["cpu"], samples[mine]["cpu"])
    out["ratios"] = ratios
    if errors:
        out["errors"] = errors
    return out
