"""Soak: threads submitting, signalling, closing and reopening devices for a while; JSON out.

    python benchmarks/soak.py [--driver local-task] [--seconds 60] [--threads 8] [--out FILE]

Eight threads (by default) share a few device slots. Workers record and submit transfers
(one-shot and reusable command buffers with binding tables), queue allocations, and wait on
their own semaphores; some submissions wait on a gate another thread signals from the host;
one thread keeps closing the device of a slot and putting a new one in its place while the
others are using it. The contract under test is issue-free survival:

- every error a call raises is a typed ``hal.HalError`` (anything else is reported as a bug);
- work accepted by a device is never dropped: its semaphore is reached or failed, also when the
  device is closed under it (a wait that finds it neither is reported as a bug);
- memory stays flat: RSS and the allocators' live bytes are sampled after a warm-up and at the end.

The simulated GPU runs it too: ``HAL_PLUGINS=drivers.fake_gpu PYTHONPATH=.:tests python
benchmarks/soak.py --driver fake-gpu``; on a GPU machine ``--driver cuda``.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hal  # noqa: E402

WAIT_TIMEOUT = 10.0
BUFFER_SIZE = 4096


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the peak is the best available
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.bugs: list[str] = []

    def add(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def error(self, exc: BaseException) -> None:
        with self.lock:
            if isinstance(exc, hal.HalError):
                self.errors[type(exc).__name__] += 1
            else:
                self.errors["untyped:" + type(exc).__name__] += 1
                if len(self.bugs) < 20:
                    self.bugs.append(f"untyped {type(exc).__name__}: {exc}")

    def bug(self, text: str) -> None:
        with self.lock:
            self.counts["bugs"] += 1
            if len(self.bugs) < 20:
                self.bugs.append(text)


class Slots:
    """Devices the workers share; the closer replaces one at a time while others use it."""

    def __init__(self, uri: str, count: int, options: dict) -> None:
        self.uri = uri
        self.options = options
        self.lock = threading.Lock()
        self.devices = [hal.create_device(uri, **options) for _ in range(count)]

    def pick(self, rng: random.Random) -> hal.Device:
        return self.devices[rng.randrange(len(self.devices))]

    def reopen(self, index: int) -> hal.Device:
        fresh = hal.create_device(self.uri, **self.options)
        with self.lock:
            old, self.devices[index] = self.devices[index], fresh
        return old

    def close_all(self) -> None:
        for dev in self.devices:
            dev.close()


def settle(sem: hal.Semaphore, value: int, tally: Tally, what: str) -> None:
    """Wait for accepted work: reached counts as completed, failed is a typed outcome; a closed
    device whose semaphore is neither reached nor failed dropped the work (a bug)."""
    try:
        sem.wait(value, timeout=WAIT_TIMEOUT)
    except hal.FailedPreconditionError as exc:
        if sem.failure is None and sem.current_value < value:
            tally.bug(f"{what}: accepted work dropped at close ({exc})")
        else:
            tally.error(exc)
    except hal.DeadlineExceededError as exc:
        tally.add("wait_timeouts")
        tally.error(exc)
    except BaseException as exc:
        tally.error(exc)
    else:
        tally.add("submissions_completed")


def one_shot(dev: hal.Device, rng: random.Random, tally: Tally, gates: collections.deque) -> None:
    src = dev.allocator.allocate(BUFFER_SIZE)
    dst = dev.allocator.allocate(BUFFER_SIZE)
    try:
        cb = dev.create_command_buffer()
        with cb.record():
            cb.fill_buffer(src, rng.randrange(256), 1)
            cb.update_buffer(b"\x01" * 64, (src, 0, 64))
            cb.execution_barrier()
            cb.copy_buffer(src, dst)
        sem = dev.create_semaphore(0)
        waits = []
        if rng.random() < 0.3:  # released by a host signal from another thread
            gate = dev.create_semaphore(0)
            waits = [(gate, 1)]
            gates.append(gate)
        dev.queue_execute([cb], wait=waits, signal=[(sem, 1)])
        tally.add("submissions_accepted")
        settle(sem, 1, tally, "queue_execute")
    finally:
        src.release()
        dst.release()


def reusable(dev: hal.Device, rng: random.Random, tally: Tally, cache: dict) -> None:
    entry = cache.get(dev)
    if entry is None:
        for old in list(cache):
            if old.closed:
                del cache[old]
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=2)
        with cb.record():
            cb.fill_buffer(hal.Slot(0), 0x3C, 1)
            cb.execution_barrier()
            cb.copy_buffer(hal.Slot(0), hal.Slot(1))
        buffers = [dev.allocator.allocate(BUFFER_SIZE) for _ in range(2)]
        entry = cache[dev] = (cb, buffers, dev.create_semaphore(0), [0])
    cb, buffers, sem, counter = entry
    for _ in range(rng.randrange(1, 8)):
        counter[0] += 1
        dev.queue_execute([cb], signal=[(sem, counter[0])], binding_tables=[buffers])
        tally.add("submissions_accepted")
    settle(sem, counter[0], tally, "reusable queue_execute")


def alloca(dev: hal.Device, rng: random.Random, tally: Tally) -> None:
    sem = dev.create_semaphore(0)
    buf = dev.queue_alloca(rng.choice([0, 256, BUFFER_SIZE]), signal=[(sem, 1)])
    tally.add("submissions_accepted")
    dev.queue_dealloca(buf, wait=[(sem, 1)], signal=[(sem, 2)])
    tally.add("submissions_accepted")
    settle(sem, 2, tally, "queue_alloca/dealloca")


def barrier(dev: hal.Device, rng: random.Random, tally: Tally) -> None:
    sem = dev.create_semaphore(0)
    dev.queue_barrier(signal=[(sem, 1)])
    tally.add("submissions_accepted")
    settle(sem, 1, tally, "queue_barrier")


def worker(slots: Slots, seed: int, stop: threading.Event, tally: Tally, gates: collections.deque) -> None:
    rng = random.Random(seed)
    cache: dict = {}
    while not stop.is_set():
        dev = slots.pick(rng)
        choice = rng.random()
        try:
            if choice < 0.45:
                one_shot(dev, rng, tally, gates)
            elif choice < 0.75:
                reusable(dev, rng, tally, cache)
            elif choice < 0.9:
                alloca(dev, rng, tally)
            else:
                barrier(dev, rng, tally)
        except BaseException as exc:
            tally.error(exc)
    cache.clear()


def signaller(stop: threading.Event, tally: Tally, gates: collections.deque) -> None:
    while not stop.is_set() or gates:
        try:
            gate = gates.popleft()
        except IndexError:
            time.sleep(0.0005)
            continue
        try:
            gate.signal(1)
            tally.add("host_signals")
        except BaseException as exc:
            tally.error(exc)


def closer(slots: Slots, seed: int, stop: threading.Event, tally: Tally, every: float) -> None:
    rng = random.Random(seed)
    while not stop.wait(every * (0.5 + rng.random())):
        try:
            old = slots.reopen(rng.randrange(len(slots.devices)))
            old.close()
            tally.add("devices_reopened")
        except BaseException as exc:
            tally.error(exc)


def allocator_totals(slots: Slots) -> dict:
    stats = [dev.allocator.statistics() for dev in slots.devices]
    return {"bytes_allocated": sum(s.bytes_allocated for s in stats),
            "live_buffers": sum(s.live_buffers for s in stats)}


def run(uri: str, seconds: float, threads: int, options: dict, close_every: float) -> dict:
    slots = Slots(uri, 2, options)
    tally = Tally()
    gates: collections.deque = collections.deque()
    stop = threading.Event()
    workers = max(1, threads - 2)  # the rest: one host signaller, one closer
    pool = [threading.Thread(target=worker, args=(slots, i, stop, tally, gates), daemon=True)
            for i in range(workers)]
    pool.append(threading.Thread(target=signaller, args=(stop, tally, gates), daemon=True))
    pool.append(threading.Thread(target=closer, args=(slots, 10_000, stop, tally, close_every), daemon=True))
    start = time.monotonic()
    for t in pool:
        t.start()
    warmup = min(5.0, seconds * 0.1)
    time.sleep(warmup)
    gc.collect()
    rss_start = rss_bytes()
    alloc_start = allocator_totals(slots)
    samples = []
    while time.monotonic() - start < seconds:
        time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - start))))
        samples.append(rss_bytes())
    stop.set()
    hung = 0
    for t in pool:
        t.join(WAIT_TIMEOUT * 3)
        hung += t.is_alive()
    elapsed = time.monotonic() - start
    gc.collect()
    alloc_end = allocator_totals(slots)
    rss_end = rss_bytes()
    slots.close_all()
    counts = dict(tally.counts)
    failures = sum(tally.errors.values())
    untyped = sum(n for k, n in tally.errors.items() if k.startswith("untyped:"))
    return {
        "driver": uri, "seconds": round(elapsed, 1), "threads": threads,
        "submissions_accepted": counts.get("submissions_accepted", 0),
        "submissions_completed": counts.get("submissions_completed", 0),
        "submissions_per_second": round(counts.get("submissions_completed", 0) / elapsed, 1),
        "host_signals": counts.get("host_signals", 0),
        "devices_reopened": counts.get("devices_reopened", 0),
        "failures_seen": failures,
        "failures_by_type": dict(tally.errors),
        "untyped_failures": untyped,
        "dropped_or_other_bugs": counts.get("bugs", 0),
        "bugs": tally.bugs,
        "hung_threads": hung,
        "wait_timeouts": counts.get("wait_timeouts", 0),
        "memory": {
            "rss_after_warmup_mb": round(rss_start / 2**20, 1),
            "rss_end_mb": round(rss_end / 2**20, 1),
            "rss_peak_mb": round(max(samples + [rss_end]) / 2**20, 1),
            "rss_growth_mb": round((rss_end - rss_start) / 2**20, 1),
            "allocator_after_warmup": alloc_start,
            "allocator_end": alloc_end,
        },
        "ok": untyped == 0 and counts.get("bugs", 0) == 0 and hung == 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", default="local-task", help="device URI (local-task, cuda, fake-gpu, ...)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--close-every", type=float, default=0.5, help="mean seconds between device reopenings")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="device option (repeatable), e.g. command_buffer=graph")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    options = dict(o.split("=", 1) for o in args.option)
    result = run(args.driver, args.seconds, args.threads, options, args.close_every)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
