"""Run every benchmark and print one JSON document.

    python benchmarks/run.py [--out FILE] [--only NAME ...]

Each benchmark is a script of this folder that prints JSON and takes ``--out``;
they run in separate processes so one's failure (a missing GPU, say) is
reported as such without hiding the others.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = {
    "local": ["local_bench.py", "--driver", "local-task", "--driver", "local-sync"],
    "hal_gpu": ["hal_bench.py"],
    "runtime": ["runtime_bench.py"],
    "workload": ["workload_bench.py"],
}


def run_one(name: str, argv: list[str], timeout: float) -> dict:
    script = HERE / argv[0]
    if not script.exists():
        return {"status": "absent"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH")]))
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        try:
            proc = subprocess.run([sys.executable, str(script), *argv[1:], "--out", out.name],
                                  capture_output=True, text=True, timeout=timeout,
                                  cwd=HERE.parent, env=env)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "timeout_s": timeout}
        try:
            result = json.loads(Path(out.name).read_text() or "null")
        except json.JSONDecodeError:
            result = None
    if proc.returncode != 0 or result is None:
        return {"status": "failed", "returncode": proc.returncode, "stderr": proc.stderr[-4000:]}
    return {"status": "ok", "result": result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--only", nargs="*", choices=sorted(BENCHMARKS), help="run only these")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per benchmark")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    report = {name: run_one(name, BENCHMARKS[name], args.timeout) for name in names}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if all(r["status"] in ("ok", "absent") for r in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
