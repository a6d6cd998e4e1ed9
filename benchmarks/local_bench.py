"""Submission overhead of the CPU drivers, against the raw mechanisms they are built on.

    python benchmarks/local_bench.py [--driver local-task] [--out FILE]

- round trip: submit an empty command buffer + wait on its semaphore, vs handing a
  no-op to a worker thread and waiting for an Event (the bare cost of one thread hop);
- 1000 dispatches: record + submit + wait a command buffer of 1000 tiny dispatches,
  vs calling the same numpy kernel 1000 times directly.
Prints JSON; ratios > 1 mean the HAL costs that many times the baseline.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time

import numpy as np

import hal


def median_time(fn, repeats: int, inner: int = 1) -> float:
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - start) / inner)
    return statistics.median(samples)


def add_one(workgroups, bindings, constants):
    data = np.frombuffer(bindings[0], np.uint32)
    data += 1


def bench_round_trip(device: hal.Device, repeats: int) -> dict:
    sem = device.create_semaphore(0)
    empty = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with empty.record():
        pass
    counter = [0]

    def hal_round_trip():
        counter[0] += 1
        device.queue_execute([empty], signal=[(sem, counter[0])])
        sem.wait(counter[0])

    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def worker():
        while (item := inbox.get()) is not None:
            item.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    def raw_round_trip():
        done = threading.Event()
        inbox.put(done)
        done.wait()

    hal_s = median_time(hal_round_trip, repeats, 50)
    raw_s = median_time(raw_round_trip, repeats, 50)
    inbox.put(None)
    return {"hal_us": hal_s * 1e6, "baseline_thread_hop_us": raw_s * 1e6, "ratio": hal_s / raw_s}


def bench_dispatches(device: hal.Device, count: int, repeats: int) -> dict:
    exe = device.load_executable(hal.ExecutableSpec("numpy", add_one, [hal.Export("add_one", (64, 1, 1), 1, 0)]))
    buf = device.allocator.allocate(256)
    device.write(buf, bytes(256))
    sem = device.create_semaphore(0)
    counter = [0]

    def hal_dispatches():
        cb = device.create_command_buffer()
        with cb.record():
            for _ in range(count):
                cb.dispatch(exe, 0, 1, (), [buf])
        counter[0] += 1
        device.queue_execute([cb], signal=[(sem, counter[0])])
        sem.wait(counter[0])

    host = np.zeros(64, np.uint32)
    views = [memoryview(host).cast("B")]

    def direct_calls():
        for _ in range(count):
            add_one((1, 1, 1), views, [])

    hal_s = median_time(hal_dispatches, repeats)
    raw_s = median_time(direct_calls, repeats)
    runs = 1 + repeats  # one warm-up + the timed runs, each adds `count`
    expected = np.full(64, runs * count, np.uint32)
    if not np.array_equal(np.frombuffer(device.read(buf), np.uint32), expected):
        raise AssertionError("dispatch benchmark produced wrong results")
    buf.release()
    return {"dispatches": count, "hal_us_per_dispatch": hal_s / count * 1e6,
            "baseline_direct_call_us_per_dispatch": raw_s / count * 1e6, "ratio": hal_s / raw_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CPU driver submission overhead")
    parser.add_argument("--driver", action="append", help="driver (repeatable; default local-task)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    results = {}
    for name in args.driver or ["local-task"]:
        with hal.create_device(name) as device:
            results[name] = {
                "submit_wait_round_trip": bench_round_trip(device, args.repeats),
                "command_buffer_1000_dispatches": bench_dispatches(device, 1000, args.repeats),
            }
    text = json.dumps({"benchmark": "local", "results": results}, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
