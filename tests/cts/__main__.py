"""``python -m hal_cts --driver NAME [pytest options]``: run the installed conformance suite.

The same as ``python -m pytest -p hal_cts.plugin --pyargs hal_cts --driver NAME``; any other
pytest option (``-x``, ``-k fill``, ``--driver-option KEY=VALUE``) passes through.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest


def main(argv: Sequence[str] | None = None) -> int:
    package = __spec__.parent if __spec__ is not None else "hal_cts"
    here = Path(__file__).resolve().parent
    args = list(sys.argv[1:] if argv is None else argv)
    # --confcutdir: in a source checkout installed in editable mode the suite's folder is tests/cts,
    # whose parent conftest would load the selection plugin a second time.
    return int(pytest.main(["-p", f"{package}.plugin", "--confcutdir", str(here), "--pyargs", package, *args]))


if __name__ == "__main__":
    sys.exit(main())
