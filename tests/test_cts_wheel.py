"""The conformance suite ships in the wheel: installed in a fresh virtual environment, it runs on its own.

Builds the wheel from the project's files, installs it with its ``cts`` extra (numpy, pluggy, pytest) into
a new venv, and runs part of the installed suite with the documented command from a folder outside
the repository, so nothing of the source tree can stand in for what the wheel lacks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def project_files(destination: Path) -> Path:
    """The files git knows of (tracked or new, not ignored): what a fresh clone builds from."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


def can_build_without_isolation() -> bool:
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 77


def run(*argv: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "HAL_DEVICE", "HAL_PLUGINS", "HAL_CTS_DRIVERS", "VIRTUAL_ENV")
    }
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv holding the wheel; returns its python."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the project's git checkout to list its files")
    tmp = tmp_path_factory.mktemp("wheel")
    source = project_files(tmp / "src")
    # Without build isolation when this environment has a recent setuptools (the test extra): no download.
    isolation = ["--no-build-isolation"] if can_build_without_isolation() else []
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", tmp / "dist", source, cwd=tmp)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("hal_gpu-*.whl")
    venv = tmp / "venv"
    made = run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # The documented install for driver authors: the wheel with its cts extra, nothing else.
    done = run(sys.executable, "-m", "pip", "--python", python, "install", "-q", f"{wheel}[cts]", cwd=tmp)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return python


def test_wheel_holds_the_suite_and_its_kernels(installed):
    proc = run(
        installed,
        "-c",
        "import hal, hal_cts, hal_cts.kernels, hal_cts.plugin; print(hal.__file__); print(hal_cts.__file__)",
        cwd=installed.parent,
    )
    assert proc.returncode == 0, proc.stderr
    venv = installed.parent.parent
    for path in proc.stdout.split():
        assert Path(path).is_relative_to(venv), path  # from the wheel, not the source tree


def test_installed_suite_runs_against_a_driver(installed, tmp_path):
    proc = run(
        installed,
        "-m",
        "hal_cts",
        "--driver",
        "local-sync",
        "-q",
        "-p",
        "no:cacheprovider",
        "-k",
        "fill or copy or device_options or dispatch",
        cwd=tmp_path,
    )
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in last and "failed" not in last and "error" not in last, last
    assert int(last.split(" passed")[0].split()[-1]) >= 50, last


def test_installed_suite_rejects_an_unknown_driver_in_one_line(installed, tmp_path):
    proc = run(installed, "-m", "hal_cts", "--driver", "no-such-driver", "-p", "no:cacheprovider", cwd=tmp_path)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr
    assert proc.stderr.strip().startswith("ERROR: --driver 'no-such-driver': no HAL driver named")
    assert "error" not in proc.stdout.lower()


def test_installed_suite_without_its_plugin_says_how_to_run_it(installed, tmp_path):
    proc = run(installed, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "hal_cts", cwd=tmp_path)
    assert proc.returncode != 0
    assert "python -m hal_cts --driver NAME" in proc.stdout + proc.stderr


def test_wheel_is_typed_licensed_and_versioned(installed):
    code = (
        "import importlib.metadata as m, pathlib, hal, runtime\n"
        "dist = m.distribution('hal-gpu')\n"
        "print(hal.__version__ == dist.version)\n"
        "print((pathlib.Path(hal.__file__).parent / 'py.typed').exists())\n"
        "print((pathlib.Path(runtime.__file__).parent / 'py.typed').exists())\n"
        "print(dist.metadata['License-Expression'])\n"
        "print(any(str(f).endswith('LICENSE') for f in dist.files))\n"
    )
    proc = run(installed, "-c", code, cwd=installed.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "True", "Apache-2.0", "True"]
    version = run(installed.parent / "hal", "--version", cwd=installed.parent)
    assert version.returncode == 0 and version.stdout.startswith("hal (hal-gpu) "), version.stdout + version.stderr


def test_wheel_leaves_out_the_checkout_stand_in_and_needs_no_tqdm(installed):
    code = (
        "import importlib.metadata as m, hal_cts\n"
        "print(hal_cts.__file__)\n"
        "print(sorted(str(f) for f in m.distribution('hal-gpu').files if str(f).startswith('hal_cts/__init__')))\n"
        "import importlib.util; print(importlib.util.find_spec('tqdm'))\n"
    )
    proc = run(installed, "-c", code, cwd=installed.parent)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("site-packages/hal_cts/__init__.py")
    assert lines[1] == "['hal_cts/__init__.py']"  # one: the suite's own (tests/cts/__init__.py)
    assert lines[2] == "None"  # tqdm is the examples extra's, not a requirement
