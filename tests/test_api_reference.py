"""The API reference is generated from the docstrings by pdoc: it builds, and covers the public API."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import hal

ROOT = Path(__file__).resolve().parent.parent
#: The documented command (README.md, "More").
COMMAND = [sys.executable, "-m", "pdoc", "--output-directory"]


def test_api_reference_builds_and_documents_every_public_name(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HAL_TRACE", "HAL_DEVICE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [*COMMAND, str(tmp_path), "hal", "runtime"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Error" not in proc.stderr, proc.stderr
    page = (tmp_path / "hal.html").read_text()
    missing = [name for name in hal.__all__ if name not in hal.REFERENCE_MODULES and f'id="{name}"' not in page]
    assert missing == [], missing
    # the modules the driver guide sends authors to, with the helpers it names
    for module, members in {"submission": ("HostSubmissions", "run_inline", "HostSubmissions.submit"),
                            "semaphore": ("FenceWaiter",), "executable": ("numpy_functions",),
                            "log": ("driver_logger",), "pickling": ("NotPicklableError",)}.items():
        module_page = (tmp_path / "hal" / f"{module}.html").read_text()
        for member in members:
            assert f'id="{member}"' in module_page, (module, member)
    for member in ("Device.queue_execute", "CommandBuffer.dispatch", "Semaphore.wait", "Allocator.allocate"):
        assert f'id="{member}"' in page, member
    assert (tmp_path / "runtime.html").exists()
