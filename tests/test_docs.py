"""Every Python code block of README.md, docs/, runtime/README.md and tests/cts/README.md runs as written,
on local-task.

Blocks of one document run in order in one namespace (a later block uses what an earlier one made),
in a fresh interpreter, from a scratch folder. A block whose fence reads ```` ```python gpu ```` needs
a GPU: it runs only with HAL_DOCS_GPU=1, on the best available device (scripts/gpu-check does that).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hal import env

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "runtime" / "README.md",
             ROOT / "tests" / "cts" / "README.md"]
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)
GPU_MARK = "gpu"

RUNNER = r"""
import json, sys, traceback
namespace = {"__name__": "__main__"}
for block in json.load(sys.stdin):
    code = "\n" * (block["line"] - 1) + block["code"]  # tracebacks point at the document's own lines
    try:
        exec(compile(code, block["document"], "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"block at {block['document']}:{block['line']} failed")
"""


def python_blocks(document: Path) -> list[dict]:
    """The document's Python blocks, each with the line its code starts at and whether it needs a GPU."""
    text = document.read_text()
    name = str(document.relative_to(ROOT)) if document.is_relative_to(ROOT) else str(document)
    blocks = []
    for match in FENCE.finditer(text):
        marks = match.group(1).split()
        line = text.count("\n", 0, match.start(2)) + 1
        blocks.append({"document": name, "line": line, "code": match.group(2), "gpu": GPU_MARK in marks})
    return blocks


def run_blocks(blocks: list[dict], tmp_path: Path, device: str | None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS", "HAL_TRACE")}
    # The checkout first, then what the test process itself was given (packages installed beside it).
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if device is not None:
        environment["HAL_DEVICE"] = device
    return subprocess.run(
        [sys.executable, "-c", RUNNER],
        input=json.dumps(blocks),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment,
        timeout=300,
    )


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(d.relative_to(ROOT)) for d in DOCUMENTS])
def test_code_blocks_run_as_written(document, tmp_path):
    gpu = env.switch("HAL_DOCS_GPU", False)
    blocks = [b for b in python_blocks(document) if gpu or not b["gpu"]]
    if not blocks:
        pytest.skip(f"{document.name} has no Python block to run here")
    proc = run_blocks(blocks, tmp_path, None if gpu else "local-task")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_the_guides_have_python_blocks():
    """The user guide is examples to run, not prose about them."""
    for name in ("README.md", "docs/user-guide.md", "docs/driver-guide.md"):
        assert python_blocks(ROOT / name), name


def test_a_failing_block_is_reported_at_its_line(tmp_path):
    document = tmp_path / "broken.md"
    document.write_text("# Title\n\n```python\nx = 1\n```\n\ntext\n\n```python\ny = x + undefined_name\n```\n")
    proc = run_blocks(python_blocks(document), tmp_path, "local-task")
    assert proc.returncode != 0
    assert f'File "{document}", line 10' in proc.stderr and "NameError" in proc.stderr, proc.stderr
    assert f"block at {document}:10 failed" in proc.stderr
