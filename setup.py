"""What pyproject.toml cannot say: the conformance suite ships as the package ``hal_cts``, and the
optional C extension ``hal.drivers._native``.

The suite's home in the repository stays tests/cts; installed, a driver author runs it with
``python -m hal_cts --driver NAME`` (see tests/cts/README.md).

The extension is built at install when a C compiler and the Python headers are there, and
skipped otherwise (``optional``): the pure-Python calls are the fallback, and ``HAL_NATIVE=0``
selects them where it was built too (see hal/drivers/native_calls.py).
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=[*find_packages(include=["hal", "hal.*", "runtime", "runtime.*"]), "hal_cts"],
    package_dir={"hal_cts": "tests/cts"},
    package_data={"hal": ["py.typed"], "runtime": ["py.typed"], "hal_cts": ["README.md"]},
    ext_modules=[Extension("hal.drivers._native", ["hal/drivers/_native.c"], optional=True)],
)
