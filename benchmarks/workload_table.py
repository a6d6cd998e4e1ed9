"""A markdown table of a ``workload_bench.py`` report, for docs/performance.md.

    python benchmarks/workload_table.py workload_bench.json [--out FILE]

One row per case and runtime variant: the runtime's time per iteration with its TFLOP/s or GB/s,
each baseline's, the copy bandwidth measured beside it, the ratios (baseline's time over the
runtime's, median over rounds) and the design's targets, met or missed. The chart of the same
report is ``benchmarks/plot.py``'s (one bar per target).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from workload_targets import NAMES

OURS = ("runtime", "runtime_eager", "runtime_compile")


def duration(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us / 1e3:,.2f} ms" if us >= 10_000 else f"{us:,.1f} µs"


def rate(value: float) -> str:
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def measured(entry: dict | None) -> str:
    if not entry:
        return "-"
    text = duration(entry["s"]["median"])
    if "TFLOPs" in entry:
        text += f", {rate(entry['TFLOPs'])} TFLOP/s"
    elif "GBps" in entry:
        text += f", {entry['GBps']:,.0f} GB/s"
    return text


def baselines(report: dict) -> list[str]:
    """Every baseline of the report, in the order first met (call-to-result timings left out)."""
    seen: list[str] = []
    for section in report.get("cases", {}).values():
        for name in section.get("contenders", {}):
            if name not in OURS and name != "copy" and not name.endswith("_synced") and name not in seen:
                seen.append(name)
    return seen


def targets_text(report: dict, case: str, ours: str) -> str:
    found = [t for t in report.get("targets", []) if t.get("case") == case and t.get("ours") == ours]
    return "; ".join(target_text(t) for t in found)


def target_text(t: dict) -> str:
    value = "not measured" if t["value"] is None else f"{t['value']:.2f}x"
    text = f"{'met' if t['met'] else '**missed**'}: {value} vs {NAMES[t['baseline']]} (target {t['target']})"
    return text + (f", {t['note']}" if t.get("note") else "")


def table(report: dict) -> str:
    bases = baselines(report)
    head = ["case", "runtime", *(NAMES.get(b, b) for b in bases), "copy", *(f"vs {NAMES.get(b, b)}" for b in bases),
            "targets"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for case, section in report.get("cases", {}).items():
        title = section.get("title", case)
        problem = section.get("error") or section.get("skipped")
        if problem:
            cells = [title, problem.strip().splitlines()[-1]] + [""] * (len(head) - 2)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        contenders = section.get("contenders", {})
        copy = f"{section['copy_GBps']:,.0f} GB/s" if "copy_GBps" in section else "-"
        for ours in (name for name in OURS if name in contenders):
            label = title if ours == "runtime" else f"{title}, {NAMES[ours]}"
            ratios = section.get("ratios", {})
            cells = [label, measured(contenders[ours]), *(measured(contenders.get(b)) for b in bases), copy]
            for b in bases:
                r = ratios.get(f"{ours}_vs_{b}")
                cells.append(f"{r['median']:.2f}x" if r else "-")
            cells.append(targets_text(report, case, ours))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="workload_bench.py's JSON")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    text = table(json.loads(args.report.read_text()))
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
