"""The distribution's metadata (its name, requirements and extras) and what an editable install gives type
checkers, read from the installed metadata and from pyproject.toml."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import hal
import runtime
from hal.distribution import NAME

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_distribution_name_is_ours_and_the_import_names_stay():
    """``pyhal`` on the package index is another project: the distribution is ``hal-gpu``."""
    assert NAME == "hal-gpu" == PYPROJECT["project"]["name"]
    dist = importlib.metadata.distribution(NAME)
    assert dist.metadata["Name"] == NAME and dist.version == hal.__version__ == runtime.__version__
    top_level = {name for name, dists in importlib.metadata.packages_distributions().items() if NAME in dists}
    assert {"hal", "runtime", "hal_cts"} <= top_level, top_level


def _requirements(extra: str | None) -> set[str]:
    """Names required by the installed metadata, unconditionally (None) or by one extra."""
    names = set()
    for requirement in importlib.metadata.requires(NAME) or []:
        spec, _, marker = requirement.partition(";")
        wanted = f'extra == "{extra}"' in marker if extra else not marker.strip()
        if wanted:
            names.add(spec.strip().split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip())
    return names


def test_requirements_are_only_what_the_packages_import():
    assert _requirements(None) == {"numpy", "pluggy"}
    assert "tqdm" in _requirements("examples")  # the logistic regression example's progress bar
    assert _requirements("cts") == {"pytest"}  # what `python -m hal_cts` needs beyond the base
    assert {"cuda-bindings", "nvidia-cuda-nvrtc", "nvmath-python", "nvidia-cublas"} <= _requirements("cuda")
    assert "mypy" in _requirements("test")


def test_the_install_hints_name_the_distribution():
    from hal.distribution import install_hint
    assert install_hint("cuda") == "pip install 'hal-gpu[cuda]'"


USER_SCRIPT = '''
import numpy as np

import hal
import runtime as rt

with hal.create_device("local-task") as dev:
    buf: hal.Buffer = dev.allocator.allocate(64)
    sem: hal.Semaphore = dev.create_semaphore(0)
    cb = dev.create_command_buffer()
    with cb.record():
        cb.fill_buffer(buf, pattern=0, pattern_length=4)
    dev.queue_execute([cb], signal=[(sem, 1)])
    sem.wait(1)
    data: bytes = dev.read(buf)
ordinal: int = hal.create_device("local-sync").info.ordinal
x: rt.Array = rt.array(np.ones(4, np.float32))
total: rt.Array = rt.sum(rt.exp(x))
'''


def test_a_user_script_type_checks_against_the_installed_packages(tmp_path):
    """mypy finds `hal` and `runtime` through the install alone (from a folder outside the checkout, with no
    MYPYPATH): an editable install must put the checkout on a path entry, not only behind an import hook."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (the test extra has it)")
    (tmp_path / "user.py").write_text(textwrap.dedent(USER_SCRIPT))
    (tmp_path / "wrong.py").write_text("import hal\nname: int = hal.create_device('local-task').info.uri\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    command = [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", "--cache-dir", os.devnull]
    good = subprocess.run([*command, "user.py"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr
    wrong = subprocess.run([*command, "wrong.py"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert wrong.returncode == 1 and 'expression has type "str", variable has type "int"' in wrong.stdout, wrong.stdout


def test_the_checkout_stand_in_is_the_suite_itself():
    """In the checkout `hal_cts` is tests/cts, one module per file (the wheel maps it the same way)."""
    import hal_cts.plugin

    suite = ROOT / "tests" / "cts"
    assert Path(hal_cts.__file__).resolve() == suite / "__init__.py"
    assert Path(hal_cts.plugin.__file__).resolve() == suite / "plugin.py"
    if shutil.which("git") and (ROOT / ".git").exists():
        listed = subprocess.run(["git", "ls-files", "hal_cts"], cwd=ROOT, capture_output=True, text=True).stdout
        assert listed.split() in ([], ["hal_cts/__init__.py"])  # the stand-in alone, no copy of the suite
