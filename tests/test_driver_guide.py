"""The driver guide's promise: the ~100-line example driver passes the whole conformance suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_minimal_example_driver_passes_the_cts():
    env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_CTS_DRIVERS")}
    env.update(HAL_PLUGINS="examples.minimal_driver", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/cts",
         "--driver", "minimal", "--run-fault-tests"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "skipped" not in summary, summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 150, summary
