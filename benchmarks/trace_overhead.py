"""What the tracing hooks cost when no trace is on: a submission hot path with and without them, in one process.

    python benchmarks/trace_overhead.py [--driver cuda|fake-gpu|local-sync|local-task] [--rounds 15] [--out FILE]

"without" is the same code with every tracing hook compiled out: the functions that hold a hook
(``Execution.submit``, ``Semaphore.wait``, the GPU queue's ``issue``) are re-compiled from their
own source with each ``if tracing.ENABLED: ... else: X`` replaced by ``X`` and swapped in. Rounds of
both variants (and of tracing on, for scale) are interleaved; each round times a loop of
re-submissions of one prepared execution of a reusable command buffer, back to back and each
followed by a semaphore wait, in CPU time of the submitting thread. Reported: medians in µs per submission and the ratio
with/without hooks (1.00 = no cost).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import hal  # noqa: E402
from hal.semaphore import Semaphore  # noqa: E402


class _StripTracing(ast.NodeTransformer):
    """``if tracing.ENABLED: A else: B`` -> ``B``; ``x = f() if tracing.ENABLED else None`` and the
    ``if x is not None:`` that uses it -> nothing."""

    def __init__(self) -> None:
        self.dropped: set[str] = set()

    @staticmethod
    def _is_flag(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "ENABLED" and getattr(node.value, "id", "") == "tracing"

    def visit_If(self, node: ast.If):  # noqa: N802
        self.generic_visit(node)
        if self._is_flag(node.test):
            return node.orelse or None
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id in self.dropped
            and isinstance(test.ops[0], ast.IsNot)
        ):
            return None
        return node

    def visit_Assign(self, node: ast.Assign):  # noqa: N802
        if isinstance(node.value, ast.IfExp) and self._is_flag(node.value.test):
            self.dropped.update(t.id for t in node.targets if isinstance(t, ast.Name))
            return None
        return node


def without_hooks(cls: type, name: str):
    """``cls.name`` re-compiled from its source with the tracing hooks removed."""
    function = cls.__dict__[name]
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    stripper = _StripTracing()
    stripped = ast.fix_missing_locations(stripper.visit(tree))
    source = ast.unparse(stripped)
    if "tracing" in source:
        raise RuntimeError(f"{cls.__name__}.{name}: tracing hooks left after stripping")
    namespace: dict = {}
    exec(compile(stripped, f"<{cls.__name__}.{name} without tracing>", "exec"), function.__globals__, namespace)
    return namespace[name]


def hooked_functions(device: hal.Device) -> list[tuple[type, str]]:
    targets = [(hal.Execution, "submit"), (Semaphore, "wait")]
    queues = getattr(device, "queues", None)
    if queues:  # the GPU drivers: the queue's issue path holds the device-span hook
        targets.append((type(queues[0]), "issue"))
    return targets


def make_device(driver: str) -> hal.Device:
    if driver == "fake-gpu":
        sys.path.insert(0, str(ROOT / "tests"))
        from drivers.fake_gpu import FakeGpuDriver

        return FakeGpuDriver().create_device(command_buffer="graph")
    return hal.create_device(driver)


def measure(device: hal.Device, submissions: int) -> dict[str, float]:
    """CPU µs of the submitting thread per submission (thread time: what other processes do to the
    shared machine does not count): queued back to back (one wait at the end), and each waited for."""
    buf = device.allocator.allocate(256)
    cb = device.create_command_buffer(hal.CommandBufferMode.REUSABLE)
    with cb.record():
        cb.fill_buffer(buf, pattern=7, pattern_length=4)
    execution = device.prepare([cb])
    sem = device.create_semaphore(0)
    start = time.thread_time()
    for value in range(1, submissions + 1):
        execution.submit(signal=[(sem, value)])
    sem.wait(submissions)
    queued = time.thread_time() - start
    start = time.thread_time()
    for value in range(submissions + 1, 2 * submissions + 1):
        execution.submit(signal=[(sem, value)])
        sem.wait(value)
    round_trip = time.thread_time() - start
    buf.release()
    return {"queued": queued / submissions * 1e6, "round_trip": round_trip / submissions * 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--driver", default="fake-gpu", help="cuda, fake-gpu, local-sync, local-task (%(default)s)")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of each variant (%(default)s)")
    parser.add_argument("--submissions", type=int, default=500, help="submissions per round (%(default)s)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.submissions < 1:
        parser.error("--rounds and --submissions must be at least 1")
    device = make_device(args.driver)
    targets = hooked_functions(device)
    hooked = {target: target[0].__dict__[target[1]] for target in targets}
    stripped = {target: without_hooks(*target) for target in targets}
    samples: dict[str, list[dict[str, float]]] = {"hooks_off": [], "no_hooks": [], "trace_on": []}
    measure(device, args.submissions)  # warm-up
    with tempfile.TemporaryDirectory() as scratch:
        variants = ["hooks_off", "no_hooks", "trace_on"]
        for round_index in range(args.rounds):
            # Each variant goes first, second and third in turn: what a round leaves behind (a traced
            # round's retirements and garbage) must not fall on one variant only.
            shift = round_index % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                for (cls, name), function in (stripped if variant == "no_hooks" else hooked).items():
                    setattr(cls, name, function)
                try:
                    if variant == "trace_on":
                        with hal.trace(Path(scratch) / "round.json"):
                            samples[variant].append(measure(device, args.submissions))
                    else:
                        samples[variant].append(measure(device, args.submissions))
                finally:
                    for (cls, name), function in hooked.items():
                        setattr(cls, name, function)
    device.close()
    report: dict = {
        "driver": args.driver,
        "hooked": [f"{cls.__name__}.{name}" for cls, name in targets],
        "rounds": args.rounds,
        "submissions_per_round": args.submissions,
    }
    for loop in ("queued", "round_trip"):
        medians = {variant: statistics.median(s[loop] for s in runs) for variant, runs in samples.items()}
        ratios = [h[loop] / n[loop] for h, n in zip(samples["hooks_off"], samples["no_hooks"])]
        report[loop] = {
            "us_per_submission": medians,
            "ratio_hooks_off_vs_no_hooks": statistics.median(ratios),
            "ratio_spread": [min(ratios), max(ratios)],
            "ratio_trace_on_vs_no_hooks": medians["trace_on"] / medians["no_hooks"],
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
