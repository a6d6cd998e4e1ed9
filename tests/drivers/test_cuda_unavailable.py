"""The cuda driver on a machine where it cannot run (CI has no GPU): listed, unavailable, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hal

from .conftest import cuda_available

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(cuda_available(), reason="a CUDA GPU is present: the no-device path does not apply")


def cuda_info() -> hal.DriverInfo:
    return {info.name: info for info in hal.list_drivers()}["cuda"]


def test_cuda_is_listed_unavailable_with_a_reason():
    info = cuda_info()
    assert info.available is False
    assert isinstance(info.reason, str) and len(info.reason) > 10
    assert info.summary


def test_reason_names_what_is_missing():
    reason = cuda_info().reason.lower()
    assert any(word in reason for word in ("libcuda", "no cuda device", "cuda-bindings", "driver")), reason


def test_get_driver_raises_unavailable_with_the_reason():
    with pytest.raises(hal.UnavailableError) as info:
        hal.get_driver("cuda")
    assert cuda_info().reason in str(info.value)


@pytest.mark.parametrize("uri", ["cuda", "cuda://0", "cuda://GPU-00000000-0000-0000-0000-000000000000"])
def test_create_device_raises_unavailable(uri):
    with pytest.raises(hal.UnavailableError):
        hal.create_device(uri, command_buffer="graph")


def test_default_device_falls_back_to_the_cpu(monkeypatch):
    monkeypatch.delenv("HAL_DEVICE", raising=False)
    with hal.create_device() as dev:
        assert dev.driver_name == "local-task"


def test_importing_hal_and_the_plugin_loads_no_cuda_module():
    code = """
        import sys, hal, hal.drivers.cuda.plugin, hal.drivers.hip.plugin
        hal.create_device("local-sync").close()
        loaded = [m for m in sys.modules if m.split(".")[0] in ("cuda", "hip")]
        assert not loaded, loaded
    """
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_probe_does_not_raise_twice_and_is_cached():
    driver = hal.registry._registry.driver("cuda")
    first = driver.available()
    assert driver.available() is first
