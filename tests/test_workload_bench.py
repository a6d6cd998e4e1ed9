"""benchmarks/workload_bench.py on the CPU driver (--quick): the report's structure, its targets, the
met/missed summary, the markdown table and the chart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import plot  # noqa: E402
import workload_table  # noqa: E402
import workload_targets  # noqa: E402


def bench(tmp_path: Path, *argv: str) -> dict:
    out = tmp_path / "workload.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "workload_bench.py"), "--device", "local-task", "--quick",
         "--rounds", "2", "--batch-ms", "1", *argv, "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout) == report
    return report


@pytest.fixture(scope="module")
def local_report(tmp_path_factory) -> dict:
    return bench(tmp_path_factory.mktemp("workload"))


def test_the_cpu_driver_runs_the_mlp_step_and_matmul_against_numpy(local_report):
    assert local_report["device"]["driver"] == "local-task"
    assert local_report["settings"]["quick"] is True
    assert set(local_report["cases"]) == {"matmul_1024_float32", "mlp_step"}
    matmul = local_report["cases"]["matmul_1024_float32"]
    assert matmul["check"]["ok"] and matmul["graph_cache_misses_while_timed"] == 0
    assert set(matmul["contenders"]) == {"runtime", "numpy"}
    assert matmul["contenders"]["runtime"]["TFLOPs"] > 0
    assert set(matmul["ratios"]) == {"runtime_vs_numpy", "runtime_vs_numpy_cpu_time"}
    mlp = local_report["cases"]["mlp_step"]
    assert set(mlp["contenders"]) == {"runtime_eager", "runtime_compile", "numpy"}
    assert mlp["check"]["ok"], mlp["check"]
    assert mlp["check"]["runtime_eager"]["grads_ok"] and mlp["check"]["runtime_compile"]["params_ok"]
    assert mlp["graph_cache_misses_while_timed"] == 0
    for name, entry in mlp["contenders"].items():
        assert entry["s"]["min"] <= entry["s"]["median"] <= entry["s"]["max"], name
        assert entry["batch"] >= 1
    ratio = mlp["ratios"]["runtime_compile_vs_numpy_cpu_time"]
    assert ratio["min"] <= ratio["median"] <= ratio["max"]


def test_targets_and_summary(local_report):
    (compiled, agrees) = local_report["targets"]
    assert compiled["case"] == "mlp_step" and compiled["target"] == "≥ 0.8"
    assert compiled["ours"] == "runtime_compile" and compiled["baseline"] == "numpy"
    assert compiled["value"] == round(local_report["cases"]["mlp_step"]["ratios"][
        "runtime_compile_vs_numpy_cpu_time"]["median"], 3)
    assert compiled["met"] == (compiled["value"] >= 0.8)
    assert agrees["met"] is True and agrees["value"] == 1.0
    lines = workload_targets.summary(local_report)
    assert lines[0].startswith("workload targets (") and len(lines) == 3
    assert all(line.split()[0] in ("met", "MISSED") for line in lines[1:])


def test_every_device_case_runs_on_the_cpu_driver(tmp_path):
    """The GPU's cases at quick sizes, checked against numpy: each composition is the runtime's as written."""
    report = bench(tmp_path, "--only", "matmul_4096_float16", "batched_matmul_float32", "matmul_256_float32",
                   "softmax_8192x4096", "layer_norm_8192x4096", "softmax_1024x32768", "layer_norm_1024x32768",
                   "softmax_2048x16384", "softmax_8x4194304", "layer_norm_bfloat16_8192x4096",
                   "softmax_bfloat16_8192x4096", "softmax_grad_8192x4096", "layer_norm_grad_8192x4096",
                   "cross_entropy_grad_4096x32000",
                   "column_sum_8192x8192", "transposed_copy_8192x8192",
                   "elementwise_chain_64M")
    for name, case in report["cases"].items():
        assert "error" not in case, (name, case.get("error"))
        assert case["check"]["ok"], (name, case["check"])
        assert "runtime_vs_numpy" in case["ratios"], name
    softmax = report["cases"]["softmax_8192x4096"]
    assert softmax["copy_GBps"] > 0 and softmax["contenders"]["runtime"]["fraction_of_copy_bandwidth"] > 0
    for name in ("softmax_8192x4096", "layer_norm_8192x4096", "softmax_1024x32768", "layer_norm_1024x32768",
                 "softmax_2048x16384", "softmax_8x4194304", "layer_norm_bfloat16_8192x4096",
                 "softmax_bfloat16_8192x4096", "softmax_grad_8192x4096", "layer_norm_grad_8192x4096",
                 "cross_entropy_grad_4096x32000"):
        # eager and rt.compile'd, each checked
        case = report["cases"][name]
        assert "runtime_compile_vs_numpy" in case["ratios"], name
        assert set(case["check"]["max_rel_err_of"]) == {"runtime", "runtime_compile"}, name
        assert max(case["check"]["max_rel_err_of"].values()) <= case["check"]["tolerance"], name
    assert softmax["bytes"] == 2 * 256 * 512 * 4
    assert "runtime_synced_vs_numpy_synced" in report["cases"]["matmul_256_float32"]["ratios"]
    assert report["targets"] == []  # the GPU's targets are not the CPU driver's


def test_gpu_targets_read_from_a_report():
    """The device-side targets: a missing baseline, a failed case and a wrong result each miss, with why."""
    report = {
        "device": {"driver": "cuda", "name": "GPU"},
        "cases": {
            "matmul_4096_float32": {"check": {"ok": True}, "ratios": {
                "runtime_vs_torch_eager": {"median": 0.97, "min": 0.9, "max": 1.0}}},
            "softmax_8192x4096": {"check": {"ok": False}, "ratios": {
                "runtime_vs_torch_compile": {"median": 1.2, "min": 1.1, "max": 1.3}}},
            "layer_norm_8192x4096": {"error": "Traceback ...\nValueError: no such op\n"},
            "column_sum_8192x8192": {"check": {"ok": True}, "ratios": {},
                                     "errors": {"torch_eager": "RuntimeError: boom"}},
        },
    }
    found = {(t["case"], t["ours"]): t for t in workload_targets.targets(report)}
    matmul, softmax = found["matmul_4096_float32", "runtime"], found["softmax_8192x4096", "runtime"]
    assert matmul["met"] is True and matmul["spread"] == [0.9, 1.0]
    assert softmax["met"] is False and "disagrees" in softmax["note"]
    # the compiled composition is a target of its own, missed with why where it was not timed
    compiled = found["softmax_8192x4096", "runtime_compile"]
    assert compiled["met"] is False and compiled["value"] is None and compiled["note"] == "torch_compile not measured"
    assert compiled["benchmark"].endswith(": rt.compile / torch.compile")
    layer_norm = found["layer_norm_8192x4096", "runtime"]
    assert layer_norm["value"] is None and "no such op" in layer_norm["note"]
    assert "torch_eager failed: RuntimeError: boom" in found["column_sum_8192x8192", "runtime"]["note"]
    summary = "\n".join(workload_targets.summary(report))
    assert "layer_norm_8192x4096: ERROR ValueError: no such op" in summary
    assert "column_sum_8192x8192/torch_eager: ERROR RuntimeError: boom" in summary


def test_a_host_bound_gpu_target_says_so():
    """A runtime loop whose host time to issue a call reaches 0.9 of its time per iteration is
    reported host-bound, met or missed; a CPU driver's loops never are (the host is the device)."""
    def section(host_s, per_call):
        return {"check": {"ok": True}, "ratios": {"runtime_vs_torch_eager": {"median": 0.6, "min": 0.5, "max": 0.7}},
                "contenders": {"runtime": {"s": {"median": per_call}, "host_s": host_s}}}

    report = {"device": {"driver": "cuda", "name": "GPU"},
              "cases": {"matmul_256_float32": section(35e-6, 36e-6), "matmul_4096_float32": section(20e-6, 2.7e-3)}}
    found = {t["case"]: t for t in workload_targets.targets(report)}
    assert found["matmul_256_float32"]["host_bound"] == (
        "host-bound: 35.0 us of host time a call against 36.0 us an iteration")
    assert "host_bound" not in found["matmul_4096_float32"]
    report["targets"] = list(found.values())
    assert "(host-bound: 35.0 us" in "\n".join(workload_targets.summary(report))
    report["device"]["driver"] = "local-task"
    report["cases"]["mlp_step"] = {"check": {"ok": True, "against": "numpy"}, "ratios": {
        "runtime_compile_vs_numpy_cpu_time": {"median": 0.9, "min": 0.9, "max": 0.9}},
        "contenders": {"runtime_compile": {"s": {"median": 1e-3}, "host_s": 1e-3}}}
    assert all("host_bound" not in t for t in workload_targets.targets(report))


def test_queued_contenders_report_their_host_time(local_report):
    for case in local_report["cases"].values():
        for name, entry in case["contenders"].items():
            assert (entry.get("host_s", 0) > 0) == (name != "copy" and not name.endswith("_synced")), name


def test_markdown_table_and_chart(local_report, tmp_path):
    text = workload_table.table(local_report)
    lines = text.splitlines()
    assert lines[0] == "| case | runtime | numpy | copy | vs numpy | targets |"
    assert len(lines) == 2 + 3  # matmul, the eager step, the compiled step
    assert "met" in lines[-1] or "missed" in lines[-1]
    (tmp_path / "workload.json").write_text(json.dumps(local_report))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "plot.py"), str(tmp_path / "workload.json"),
         "--out-dir", str(tmp_path / "png")],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "png" / "workload.png").read_bytes().startswith(b"\x89PNG")


def test_the_chart_leaves_out_targets_not_measured():
    report = {"targets": [{"benchmark": "a", "value": None, "target": "≥ 1.0", "met": False},
                          {"benchmark": "b", "value": 1.5, "target": "≥ 1.0", "met": True}]}
    assert plot.bars(report) == [("b", 1.5, ("≥", 1.0))]
