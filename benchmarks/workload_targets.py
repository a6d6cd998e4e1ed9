"""The design's device-side targets, read off a ``workload_bench.py`` report: each met or missed.

A ratio is PyTorch's (or numpy's) time over the runtime's, median over interleaved rounds. A case
whose result disagrees with the baseline's misses its targets whatever its speed; a target whose
case did not run, or whose baseline did not, is missed with the reason.
"""

from __future__ import annotations

#: (case, the runtime's contender, the baseline, the least ratio) on a GPU.
GPU_TARGETS = [
    ("matmul_4096_float32", "runtime", "torch_eager", 0.95),
    ("matmul_4096_float16", "runtime", "torch_eager", 0.95),
    ("matmul_4096_bfloat16", "runtime", "torch_eager", 0.95),
    ("batched_matmul_float32", "runtime", "torch_eager", 0.95),
    ("matmul_256_float32", "runtime", "torch_eager", 1.0),
    ("softmax_8192x4096", "runtime", "torch_compile", 1.0),
    ("softmax_8192x4096", "runtime_compile", "torch_compile", 1.0),
    ("layer_norm_8192x4096", "runtime", "torch_compile", 1.0),
    ("layer_norm_8192x4096", "runtime_compile", "torch_compile", 1.0),
    # (the gradients: the project's own targets, beside the design's)
    ("softmax_grad_8192x4096", "runtime_compile", "torch_compile", 1.0),
    ("layer_norm_grad_8192x4096", "runtime_compile", "torch_compile", 1.0),
    ("column_sum_8192x8192", "runtime", "torch_eager", 0.95),
    ("transposed_copy_8192x8192", "runtime", "torch_eager", 1.0),
    ("elementwise_chain_64M", "runtime", "torch_eager", 5.0),
    ("mlp_step", "runtime_compile", "torch_eager", 1.1),
    ("mlp_step", "runtime_compile", "torch_compile", 1.0),
    ("mlp_step", "runtime_eager", "torch_eager", 1.0),
]
#: On a CPU driver, by CPU time (all this process's threads; a shared host's other work does not count).
CPU_TARGETS = [
    ("mlp_step", "runtime_compile", "numpy", 0.8),
]
#: A loop whose host time to issue a call reaches this fraction of its time per iteration measures the
#: host (the device waits for it, at least at times).
HOST_BOUND = 0.9
NAMES = {"runtime": "runtime", "runtime_eager": "eager", "runtime_compile": "rt.compile",
         "torch_eager": "PyTorch eager", "torch_compile": "torch.compile", "numpy": "numpy"}


def title(case: str, section: dict) -> str:
    return section.get("title", case)


def targets(report: dict) -> list[dict]:
    on_cpu = report.get("device", {}).get("driver") in ("local-task", "local-sync")
    cases = report.get("cases", {})
    out = []
    for case, ours, base, least in CPU_TARGETS if on_cpu else GPU_TARGETS:
        if case not in cases:
            continue
        section = cases[case]
        key = f"{ours}_vs_{base}" + ("_cpu_time" if on_cpu else "")
        measured = section.get("ratios", {}).get(key)
        value = None if measured is None else round(measured["median"], 3)
        entry = {"benchmark": f"{title(case, section)}: {NAMES[ours]} / {NAMES[base]}", "case": case,
                 "ours": ours, "baseline": base, "value": value, "target": f"≥ {least}"}
        if measured is not None:
            entry["spread"] = [round(measured["min"], 3), round(measured["max"], 3)]
        agrees = correct(section)
        entry["met"] = measured is not None and measured["median"] >= least and agrees
        bound = None if on_cpu else host_bound(section, ours)  # (a CPU driver's host is its device)
        if bound:
            entry["host_bound"] = bound
        if measured is None:
            entry["note"] = why_missing(section, ours, base)
        elif not agrees:
            entry["note"] = "result disagrees with the baseline's"
        out.append(entry)
    mlp = cases.get("mlp_step", {})
    if "check" in mlp:
        check = mlp["check"]
        out.append({"benchmark": f"MLP step agrees with the {check['against']} to float32 rounding (1: yes)",
                    "case": "mlp_step", "value": 1.0 if check["ok"] else 0.0, "target": "≥ 1",
                    "met": bool(check["ok"])})
    return out


def host_bound(section: dict, ours: str) -> str | None:
    """Why the runtime's loop measured its host rather than the device, or None: its host time to
    issue one call (``host_s``) is at least HOST_BOUND of its time per iteration."""
    entry = section.get("contenders", {}).get(ours, {})
    host, per_call = entry.get("host_s"), entry.get("s", {}).get("median")
    if not host or not per_call or host < HOST_BOUND * per_call:
        return None
    return f"host-bound: {host * 1e6:.1f} us of host time a call against {per_call * 1e6:.1f} us an iteration"


def correct(section: dict) -> bool:
    check = section.get("check")
    return bool(check and check.get("ok"))


def why_missing(section: dict, ours: str, base: str) -> str:
    if "error" in section:
        return "case failed: " + section["error"].strip().splitlines()[-1]
    if "skipped" in section:
        return "case skipped: " + section["skipped"]
    errors = section.get("errors", {})
    for name in (ours, base):
        if name in errors:
            return f"{name} failed: " + errors[name].strip().splitlines()[-1]
    return f"{base} not measured"


def summary(report: dict) -> list[str]:
    """One line per target, met or MISSED, then each case that failed, was skipped or disagreed."""
    device = report.get("device", {})
    torch = report.get("torch", {}).get("version", "absent")
    quick = report.get("settings", {}).get("quick")
    lines = [f"workload targets ({device.get('name')}, {device.get('driver')}, torch {torch}, quick: {quick}):"]
    for t in report.get("targets", []):
        value = "not measured" if t["value"] is None else f"{t['value']}x"
        if t.get("spread"):
            value += f" [{t['spread'][0]}-{t['spread'][1]}]"
        note = "".join(f" ({t[key]})" for key in ("note", "host_bound") if t.get(key))
        lines.append(f"    {'met   ' if t['met'] else 'MISSED'} {t['benchmark']}: {value} (target {t['target']}){note}")
    for name, section in report.get("cases", {}).items():
        if "error" in section:
            lines.append(f"    {name}: ERROR {section['error'].strip().splitlines()[-1]}")
        elif "skipped" in section:
            lines.append(f"    {name}: skipped ({section['skipped']})")
        elif not correct(section) and "check" in section:
            lines.append(f"    {name}: result disagrees with the baseline's: {section['check']}")
        for contender, error in section.get("errors", {}).items():
            lines.append(f"    {name}/{contender}: ERROR {error.strip().splitlines()[-1]}")
    return lines


if __name__ == "__main__":
    import json
    import sys

    for path in sys.argv[1:]:
        with open(path) as f:
            print("\n".join(summary(json.load(f))))
