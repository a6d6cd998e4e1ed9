"""Draw a trace written by ``hal.trace`` / ``HAL_TRACE`` as a timeline PNG (one row per thread or device track).

    python benchmarks/plot_trace.py trace.json timeline.png [--start-ms 0] [--window-ms 5]

A picture of the same events Perfetto shows, for where no browser can open the trace. The window
starts ``--start-ms`` after the first event; nested spans are drawn narrower than their parents.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLOURS = {"runtime": "#4c72b0", "hal": "#dd8452", "device": "#55a868"}


def rows(document: dict) -> tuple[list[str], dict[int, int]]:
    """Track names in the order drawn, and each tid's row."""
    names = {
        e["tid"]: e["args"]["name"]
        for e in document["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    spans = [e for e in document["traceEvents"] if e.get("ph") == "X"]
    order = sorted({e["tid"] for e in spans}, key=lambda tid: (tid < 0, str(names.get(tid, tid))))
    return [str(names.get(tid, tid)) for tid in order], {tid: i for i, tid in enumerate(order)}


def depth_of(spans: list[dict]) -> list[int]:
    """Nesting depth of each span among the spans of its own track (spans are well nested per thread)."""
    depths = []
    open_ends: dict[int, list[float]] = {}
    for event in spans:
        stack = open_ends.setdefault(event["tid"], [])
        while stack and stack[-1] <= event["ts"]:
            stack.pop()
        depths.append(len(stack))
        stack.append(event["ts"] + event["dur"])
    return depths


def draw(document: dict, out: Path, start_ms: float, window_ms: float) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = sorted((e for e in document["traceEvents"] if e.get("ph") == "X"), key=lambda e: (e["tid"], e["ts"]))
    if not spans:
        raise SystemExit("the trace has no spans")
    origin = min(e["ts"] for e in spans) + start_ms * 1000.0
    end = origin + window_ms * 1000.0
    labels, row = rows(document)
    figure, axes = plt.subplots(figsize=(14, 1.0 + 0.9 * len(labels)))
    drawn = 0
    for event, depth in zip(spans, depth_of(spans)):
        if event["ts"] + event["dur"] < origin or event["ts"] > end:
            continue
        height = 0.8 * (0.75**depth)
        left = (event["ts"] - origin) / 1000.0
        axes.barh(
            row[event["tid"]],
            event["dur"] / 1000.0,
            left=left,
            height=height,
            color=COLOURS.get(event["cat"], "#8172b2"),
            edgecolor="black",
            linewidth=0.3,
        )
        if event["dur"] > window_ms * 1000.0 / 40:
            axes.text(
                left + event["dur"] / 2000.0,
                row[event["tid"]] - height / 2 + 0.05,  # near the top edge of its own bar
                event["name"],
                ha="center",
                va="center",
                fontsize=6,
                clip_on=True,
            )
        drawn += 1
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xlim(0, window_ms)
    axes.set_xlabel(f"ms from {start_ms:g} ms after the first event")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    axes.legend(handles, [f"{k} spans" for k in COLOURS], loc="lower right", fontsize=7)
    axes.set_title("hal.trace timeline (the trace's own events, drawn with matplotlib)")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return drawn


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="trace JSON written by hal.trace or HAL_TRACE")
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--start-ms", type=float, default=0.0, help="window start after the first event (%(default)s)")
    parser.add_argument("--window-ms", type=float, default=5.0, help="window length in ms (%(default)s)")
    args = parser.parse_args(argv)
    if args.window_ms <= 0 or args.start_ms < 0:
        parser.error("--window-ms must be positive and --start-ms not negative")
    drawn = draw(json.loads(args.trace.read_text()), args.out, args.start_ms, args.window_ms)
    print(f"{args.out}: {drawn} spans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
