"""What rebinding a library routine in a graph command buffer costs, against a kernel node's rebind.

    python benchmarks/library_bench.py [--out FILE] [--fake] [--rounds N]

A reusable graph command buffer of one dispatch is re-submitted, once for a kernel dispatch and
once for a library GEMM (``hal.Gemm``, 64 x 64 x 64 float32), with the same binding table, with
two tables alternating, and with a table it has not seen lately (one of 40 in turn). The host
time of ``queue_execute`` is measured (the wait for completion is outside the timed part):

- same table: one graph launch for either;
- kernel, a new table: ``cuGraphExecKernelNodeSetParams`` of the node (indirect bindings off);
- library, a table not seen lately: the GEMM captured again into a child graph and set in place
  (``cuGraphExecChildGraphNodeSetParams``) before the launch;
- library, alternating tables: each table, seen before, has an executable graph of its own
  (made the second time it came), so a switch is one launch.

Samples of the four cases are taken interleaved, round by round; each reports its median over
rounds. With ``--fake`` the simulated GPU of the tests stands in (host costs of the HAL only).
Prints one JSON document (also written to --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hal  # noqa: E402

KERNEL = r"""
extern "C" __global__ void bench_touch(unsigned int* p, unsigned int n) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && n == 0xffffffffu) p[0] = n;
}
"""
SIZE = 64
SUBMITS = 40
#: Tables the "fresh" case cycles through: more than a command buffer remembers.
FRESH_TABLES = 40


def touch_spec() -> list[hal.ExecutableSpec]:
    export = [hal.Export("bench_touch", (32, 1, 1), bindings=1, constants=1)]
    return [hal.ExecutableSpec("cuda-c", KERNEL, export),
            hal.ExecutableSpec("numpy", lambda workgroups, bindings, constants: None, export)]


def make_device(fake: bool) -> hal.Device:
    if fake:
        tests = Path(__file__).resolve().parent.parent / "tests"
        sys.path.insert(0, str(tests))
        from drivers.fake_gpu import FakeGpuDriver

        return FakeGpuDriver().create_device(command_buffer="graph", indirect_bindings=False)
    return hal.create_device("cuda", command_buffer="graph", indirect_bindings=False)


def case(device: hal.Device, library: bool) -> tuple:
    """(command buffer, its two tables) of one kernel dispatch or one GEMM through slots."""
    n = SIZE
    cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE, binding_capacity=3 if library else 1)
    if library:
        exe = device.load_executable(hal.library_spec({"gemm": hal.Gemm("float32")}))
        with cb.record():
            cb.dispatch(exe, "gemm", constants=hal.Gemm.constants_for(n, n, n),
                        bindings=[hal.Slot(0), hal.Slot(1), hal.Slot(2)])
        tables = [[device.allocator.allocate(n * n * 4) for _ in range(3)] for _ in range(FRESH_TABLES)]
    else:
        exe = device.load_executable(touch_spec())
        with cb.record():
            cb.dispatch(exe, "bench_touch", workgroups=(1, 1, 1), constants=[1], bindings=[hal.Slot(0)])
        tables = [[device.allocator.allocate(256)] for _ in range(FRESH_TABLES)]
    return cb, tables


def submit_time(device: hal.Device, cb: hal.CommandBuffer, tables: list, pattern: str, sem: hal.Semaphore,
                start: int = 0) -> float:
    """Median host seconds of queue_execute over SUBMITS submissions (each waited for after timing):
    ``pattern`` "same", "alternating" (two tables) or "fresh" (the next of FRESH_TABLES from ``start``)."""
    times = []
    for i in range(SUBMITS):
        table = {"same": tables[0], "alternating": tables[i % 2],
                 "fresh": tables[(start + i) % len(tables)]}[pattern]
        value = sem.value + 1
        began = time.perf_counter()
        device.queue_execute([cb], signal=[(sem, value)], binding_tables=[table])
        times.append(time.perf_counter() - began)
        sem.wait(value)
    return statistics.median(times)


def run(fake: bool, rounds: int) -> dict:
    device = make_device(fake)
    try:
        sem = device.create_semaphore(0)
        cases = {"kernel": case(device, False), "library": case(device, True)}
        for cb, tables in cases.values():  # warm-up: built, planned, both tables seen
            submit_time(device, cb, tables, "alternating", sem)
        samples: dict[str, list[float]] = {}
        fresh = 2
        for _ in range(rounds):
            for name, (cb, tables) in cases.items():
                for pattern in ("same", "alternating", "fresh"):
                    key = f"{name}_{pattern}_table_us"
                    samples.setdefault(key, []).append(submit_time(device, cb, tables, pattern, sem, fresh) * 1e6)
            fresh += SUBMITS
        result = {key: statistics.median(values) for key, values in samples.items()}
        result["spread_us"] = {key: [min(values), max(values)] for key, values in samples.items()}
        for name in cases:
            for pattern in ("alternating", "fresh"):
                result[f"{name}_{pattern}_rebind_cost_us"] = (result[f"{name}_{pattern}_table_us"]
                                                              - result[f"{name}_same_table_us"])
        result["library_vs_kernel_fresh_rebind"] = (result["library_fresh_rebind_cost_us"]
                                                    / result["kernel_fresh_rebind_cost_us"])
        library_cb = cases["library"][0]
        result["library_recaptures"] = getattr(library_cb, "library_recaptures", None)
        result["library_table_execs"] = getattr(library_cb, "table_execs_made", None)
        result["reinstantiations"] = getattr(library_cb, "reinstantiations", None)
        result["device"] = {"uri": device.info.uri, "name": device.info.name,
                            "library": getattr(device.executables.libraries, "name", None)}  # type: ignore[attr-defined]
        return result
    finally:
        device.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--fake", action="store_true", help="the simulated GPU of the tests instead of cuda")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    report = {"library_rebind": run(args.fake, args.rounds)}
    text = json.dumps(report, indent=2, default=float)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
