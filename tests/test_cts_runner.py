"""How the conformance suite behaves as a tool: driver selection errors, skip summary, what it catches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import hal

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(*args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_CTS_DRIVERS", "HAL_PLUGINS")}
    full_env.update(env)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, env=full_env, cwd=cwd, timeout=600)


def test_unknown_driver_is_one_usage_error():
    proc = pytest_run("tests/cts", "--driver", "no-such-driver")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage-error exit code
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("ERROR: --driver 'no-such-driver': no HAL driver named 'no-such-driver' (known: ")
    assert "local-task" in line and "local-sync" in line
    assert "error" not in proc.stdout.lower()


def test_expected_skips_are_one_line_per_reason():
    unavailable = [d for d in hal.list_drivers() if not d.available and d.name in ("cuda", "hip")]  # built-ins
    proc = pytest_run("tests/cts/test_fill.py", "tests/cts/test_copy.py")
    assert proc.returncode == 0, proc.stdout[-3000:]
    lines = proc.stdout.splitlines()
    assert not any(line.startswith("SKIPPED") for line in lines), "per-test skip lines are replaced by the summary"
    for driver in unavailable:
        mine = [line for line in lines if f"skipped: driver {driver.name!r} unavailable: " in line]
        assert len(mine) == 1, lines
    assert " passed" in lines[-1]  # pytest's closing line stays last


def test_cts_catches_a_driver_that_ignores_unknown_device_options(tmp_path):
    (tmp_path / "careless_driver.py").write_text(textwrap.dedent("""
        import hal
        from examples.minimal_driver import MinimalDevice, MinimalDriver

        class CarelessDriver(MinimalDriver):
            name = "careless"

            def _create_device(self, info, **options):
                return MinimalDevice(self, info)  # options dropped on the floor

        @hal.hookimpl
        def hal_register_drivers():
            return [hal.DriverFactory(CarelessDriver.name, "ignores options", CarelessDriver)]
    """))
    proc = pytest_run("tests/cts/test_device_options.py", "--driver", "careless",
                      HAL_PLUGINS="careless_driver", PYTHONPATH=str(tmp_path))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr
    assert "3 failed" in proc.stdout.splitlines()[-1]  # the unknown options, and a queue_count it ignored
    assert "DID NOT RAISE" in proc.stdout


def _unavailable_builtin() -> str | None:
    return next((d.name for d in hal.list_drivers() if not d.available and d.name in ("cuda", "hip")), None)


def test_a_named_driver_unavailable_here_is_an_error_unless_allowed():
    """A CI step running the suite for a driver this machine cannot run must fail, not pass having tested nothing."""
    name = _unavailable_builtin()
    if name is None:
        import pytest
        pytest.skip("every built-in GPU driver is available here")
    proc = pytest_run("tests/cts/test_fill.py", "--driver", name)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr  # pytest's usage-error exit code
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"ERROR: --driver '{name}': driver '{name}' is unavailable here: ")
    assert line.endswith("(pass --allow-unavailable to report its tests as skipped instead)")
    via_env = pytest_run("tests/cts/test_fill.py", HAL_CTS_DRIVERS=name)
    assert via_env.returncode == 4, via_env.stdout[-2000:]
    allowed = pytest_run("tests/cts/test_fill.py", "--driver", name, "--allow-unavailable")
    assert allowed.returncode == 0 and f"skipped: driver {name!r} unavailable" in allowed.stdout, allowed.stdout
    installed = subprocess.run([sys.executable, "-m", "hal_cts", "--driver", name, "-q", "-p", "no:cacheprovider"],
                               capture_output=True, text=True, cwd=ROOT, timeout=300,
                               env={k: v for k, v in os.environ.items() if k != "HAL_CTS_DRIVERS"})
    assert installed.returncode == 4 and "is unavailable here" in installed.stderr, installed.stdout[-2000:]
