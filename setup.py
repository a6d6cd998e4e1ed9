"""What pyproject.toml cannot say: the conformance suite ships as the package ``hal_cts``.

Its home in the repository stays tests/cts; installed, a driver author runs it with
``python -m hal_cts --driver NAME`` (see tests/cts/README.md).
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["hal", "hal.*", "runtime", "runtime.*"]), "hal_cts"],
    package_dir={"hal_cts": "tests/cts"},
    package_data={"hal": ["py.typed"], "runtime": ["py.typed"], "hal_cts": ["README.md"]},
)
