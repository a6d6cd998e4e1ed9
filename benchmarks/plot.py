"""Turn benchmark JSON into PNG charts of the ratios against their same-run baselines.

    python benchmarks/plot.py bench.json runtime_bench.json --out-dir docs/images

Takes the JSON of any benchmark here (or of ``run.py``, which nests them). A report with a
``targets`` list (hal_bench) is drawn as one bar per target with its threshold marked; otherwise
every ratio in the report (keys named ``ratio*``, ``*_ratio`` or ``*_vs_*``) is one bar. Each input
file gives one PNG named after it; bars right of the dashed line at 1.0 mean "more than the baseline".
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

RATIO_KEY = re.compile(r"(^ratio|_ratio$|_vs_)")
THRESHOLD = re.compile(r"([<>]=?|[≤≥])\s*([0-9.]+)")


def ratios(report: object, path: str = "") -> Iterator[tuple[str, float]]:
    """(dotted path, value) of every finite ratio in a benchmark report."""
    if isinstance(report, dict):
        for key, value in report.items():
            inner = f"{path}.{key}" if path else str(key)
            if isinstance(value, dict) and RATIO_KEY.search(str(key)) and "median" in value:
                value = value["median"]  # a ratio measured over rounds: {median, min, max}
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if RATIO_KEY.search(str(key)) and math.isfinite(value):
                    yield inner, float(value)
            else:
                yield from ratios(value, inner)
    elif isinstance(report, list):
        for index, value in enumerate(report):
            yield from ratios(value, f"{path}[{index}]")


def bars(report: dict) -> list[tuple[str, float, tuple[str, float] | None]]:
    """(label, value, (comparison, threshold) or None) for each bar of one report."""
    if "status" in report and "result" in report:  # one entry of run.py's document
        report = report["result"] or {}
    targets = report.get("targets")
    if isinstance(targets, list) and targets:
        found = []
        for target in targets:
            if target.get("value") is None:  # not measured (its case failed): nothing to draw
                continue
            match = THRESHOLD.search(str(target.get("target", "")))
            threshold = (match.group(1), float(match.group(2))) if match else None
            found.append((str(target["benchmark"]), float(target["value"]), threshold))
        return found
    return [(label, value, None) for label, value in ratios(report)]


def draw(title: str, entries: list[tuple[str, float, tuple[str, float] | None]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    height = 1.2 + 0.42 * len(entries)
    figure, axes = plt.subplots(figsize=(10, height))
    labels = [label for label, _, _ in entries][::-1]
    values = [value for _, value, _ in entries][::-1]
    colours = []
    for _, value, threshold in entries[::-1]:
        if threshold is None:
            colours.append("#4c72b0")
        else:
            below = threshold[0] in ("<", "<=", "≤")
            met = value <= threshold[1] if below else value >= threshold[1]
            colours.append("#55a868" if met else "#c44e52")
    axes.barh(range(len(values)), values, color=colours)
    for row, (_, _, threshold) in enumerate(entries[::-1]):
        if threshold is not None:
            axes.plot([threshold[1]] * 2, [row - 0.4, row + 0.4], color="black", linewidth=2)
    for row, value in enumerate(values):
        axes.text(value, row, f" {value:.2f}x", va="center", fontsize=8)
    axes.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    axes.set_xlabel(
        "ratio to the baseline measured in the same run (black tick: target; green: met, red: missed)", fontsize=8
    )
    axes.set_title(title)
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 30:  # ratios far apart: a log axis keeps the small ones visible
        axes.set_xscale("log")
        axes.set_xlim(min(positive + [1.0]) / 2, max(positive + [1.0]) * 3)
    else:
        axes.set_xlim(0, max(values + [1.0]) * 1.2)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def plot_file(source: Path, out_dir: Path) -> list[Path]:
    """One PNG per report in ``source`` (run.py's document holds several)."""
    document = json.loads(source.read_text())
    nested = all(isinstance(v, dict) and "status" in v for v in document.values()) if document else False
    reports = document.items() if nested else [(source.stem, document)]
    written = []
    for name, report in reports:
        entries = bars(report)
        if not entries:
            continue
        out = out_dir / f"{name if nested else source.stem}.png"
        draw(f"{name}: ratios from {source.name}", entries, out)
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", type=Path, help="benchmark JSON files")
    parser.add_argument("--out-dir", type=Path, default=Path("docs/images"), help="where the PNGs go (%(default)s)")
    args = parser.parse_args(argv)
    written = []
    for source in args.inputs:
        if not source.is_file():
            parser.error(f"no such file: {source}")
        written += plot_file(source, args.out_dir)
    if not written:
        print("no ratios found in the inputs", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
