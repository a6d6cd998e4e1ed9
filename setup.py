"""What pyproject.toml cannot say: the conformance suite ships as the package ``hal_cts``, and the
optional C extension ``hal.drivers._native`` (a driver library's hot calls).

The suite's home in the repository stays tests/cts; installed, a driver author runs it with
``python -m hal_cts --driver NAME`` (see tests/cts/README.md).

An editable install (``pip install -e .``) puts the checkout itself on ``sys.path`` (setuptools'
``compat`` editable mode, the default here): type checkers (mypy, pyright), which read path entries
of ``.pth`` files but run no import hooks, then find ``hal`` and ``runtime``. ``hal_cts`` has no
folder of that name in the checkout; the stand-in ``hal_cts/__init__.py`` at the root loads
tests/cts as ``hal_cts`` there. Wheels map ``hal_cts`` to tests/cts and do not contain the stand-in.

The extension is built at install when a C compiler and the Python headers are there, and
skipped otherwise (``optional``): the pure-Python code is the fallback, and ``HAL_NATIVE=0``
selects it where it was built too (see hal/drivers/native_calls.py).
"""

from setuptools import Extension, find_packages, setup

setup(
    # The checkout on sys.path, not an import hook: see the module docstring.
    options={"editable_wheel": {"mode": "compat"}},
    packages=[*find_packages(include=["hal", "hal.*", "runtime", "runtime.*"]), "hal_cts"],
    package_dir={"hal_cts": "tests/cts"},
    package_data={"hal": ["py.typed"], "runtime": ["py.typed"], "hal_cts": ["README.md"]},
    ext_modules=[Extension("hal.drivers._native", ["hal/drivers/_native.c"], optional=True)],
)
