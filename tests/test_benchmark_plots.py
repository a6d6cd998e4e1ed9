"""benchmarks/plot.py turns benchmark JSON into PNG charts of the ratios."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import plot  # noqa: E402

HAL_BENCH = {
    "results": {"round_trip": {"ratio": 2.07, "raw_us": 25.6}},
    "targets": [
        {"benchmark": "round trip / raw", "value": 2.07, "target": "≤ 1.5", "met": False},
        {"benchmark": "fill bandwidth / raw", "value": 0.99, "target": "≥ 0.95", "met": True},
    ],
}
RUNTIME_BENCH = {
    "device": {"uri": "local-task://0"},
    "bandwidth": {"add_vs_copy_bandwidth": 0.95, "add_s": 0.01, "sum_vs_numpy": 0.99},
    "logistic_regression_1000x100": {
        "eager": {"ratio_vs_numpy": 0.15, "it_per_s": 900.0},
        "compile_vs_torch": {"median": 0.5, "min": 0.4, "max": 0.6},  # measured over rounds
    },
}


def script(name: str, *argv: str) -> subprocess.CompletedProcess:
    """Run benchmarks/<name>.py as a user would."""
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py"), *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_targets_become_bars_with_their_thresholds():
    assert plot.bars(HAL_BENCH) == [("round trip / raw", 2.07, ("≤", 1.5)), ("fill bandwidth / raw", 0.99, ("≥", 0.95))]


def test_ratios_are_found_anywhere_in_a_report():
    assert plot.bars(RUNTIME_BENCH) == [
        ("bandwidth.add_vs_copy_bandwidth", 0.95, None),
        ("bandwidth.sum_vs_numpy", 0.99, None),
        ("logistic_regression_1000x100.eager.ratio_vs_numpy", 0.15, None),
        ("logistic_regression_1000x100.compile_vs_torch", 0.5, None),
    ]


def test_command_writes_one_png_per_report(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps(HAL_BENCH))
    (tmp_path / "all.json").write_text(
        json.dumps(
            {"runtime": {"status": "ok", "result": RUNTIME_BENCH}, "hal_gpu": {"status": "failed", "returncode": 1}}
        )
    )
    proc = script("plot", str(tmp_path / "bench.json"), str(tmp_path / "all.json"), "--out-dir", str(tmp_path / "png"))
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert written == ["bench.png", "runtime.png"]
    for name in written:
        data = (tmp_path / "png" / name).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000


def test_a_file_without_ratios_is_an_error(tmp_path):
    (tmp_path / "empty.json").write_text(json.dumps({"device": {"uri": "x"}}))
    proc = script("plot", str(tmp_path / "empty.json"), "--out-dir", str(tmp_path))
    assert proc.returncode == 1 and "no ratios" in proc.stderr


def test_trace_timeline_from_a_real_trace(tmp_path):
    import numpy as np

    import hal
    import runtime as rt

    x = rt.array(np.ones(64, np.float32), device="local-task")
    with hal.trace(tmp_path / "trace.json"):
        for _ in range(3):
            rt.eval((x * 2.0).sum())
    proc = script("plot_trace", str(tmp_path / "trace.json"), str(tmp_path / "timeline.png"), "--window-ms", "1000")
    assert proc.returncode == 0, proc.stderr
    drawn = int(proc.stdout.split(": ")[1].split()[0])
    spans = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    assert drawn == len(spans) >= 6
    assert (tmp_path / "timeline.png").read_bytes().startswith(b"\x89PNG")


def test_trace_overhead_compares_the_hot_path_without_its_hooks(tmp_path):
    import trace_overhead

    import hal

    stripped = trace_overhead.without_hooks(hal.Execution, "submit")
    assert "tracing" not in stripped.__code__.co_names and "tracing" in hal.Execution.submit.__code__.co_names
    proc = script(
        "trace_overhead",
        "--driver",
        "local-sync",
        "--rounds",
        "2",
        "--submissions",
        "5",
        "--out",
        tmp_path / "overhead.json",
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "overhead.json").read_text())
    assert report["hooked"] == ["Execution.submit", "Semaphore.wait"]
    for loop in ("queued", "round_trip"):
        assert set(report[loop]["us_per_submission"]) == {"hooks_off", "no_hooks", "trace_on"}
        assert report[loop]["ratio_hooks_off_vs_no_hooks"] > 0
