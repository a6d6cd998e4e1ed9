"""``hal_cts`` in a checkout on ``sys.path`` (the editable install): the conformance suite in tests/cts.

Installed from a wheel, ``hal_cts`` is tests/cts itself (setup.py maps it) and this file is not part of
it. In the checkout the suite keeps its home in tests/cts, so this stand-in loads that package under the
name ``hal_cts`` and puts it in its own place in ``sys.modules``: submodules, ``python -m hal_cts`` and
pytest's ``--pyargs hal_cts`` then all resolve to tests/cts, one module per file.
"""

import importlib.util
import sys
from pathlib import Path

_SUITE = Path(__file__).resolve().parent.parent / "tests" / "cts"
_spec = importlib.util.spec_from_file_location(__name__, _SUITE / "__init__.py",
                                               submodule_search_locations=[str(_SUITE)])
assert _spec is not None and _spec.loader is not None
_suite = importlib.util.module_from_spec(_spec)
sys.modules[__name__] = _suite
_spec.loader.exec_module(_suite)
