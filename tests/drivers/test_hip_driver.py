"""The HIP driver's availability probe: every way HIP can be missing gives a reason, never a traceback.

The probe logic runs over stand-in shims; the no-device paths also run for real
in subprocesses through the ``hal`` command: hip-python without the HIP runtime
library ("library not found"), and with Debian's ROCm 5.2 runtime on a machine
without an AMD GPU (``hipErrorNoDevice``; CI installs it, see .ci/run).
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import subprocess
import sys

import pytest

import hal
from hal.drivers.hip.driver import format_version, probe
from hal.drivers.hip.status import HIP


class HipError(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidDevice = 101
    hipErrorNoDevice = 100


class StandInApi:
    """The probe's calls of ``HipApi``, answering as configured."""

    def __init__(self, *, load_error=None, count=1, count_error=None, missing=(), init_error=None):
        self.load_error, self.count, self.count_error = load_error, count, count_error
        self.missing, self.init_error = list(missing), init_error

    def runtime_version(self):
        if self.load_error:
            raise self.load_error
        return 50221153

    def library_path(self):
        return "/usr/lib/libamdhip64.so.5.2.21153"

    def missing_entry_points(self):
        return self.missing

    def device_count(self):
        if self.count_error:
            raise HIP.error(self.count_error, "hipGetDeviceCount")
        return self.count

    def init(self):
        if self.init_error:
            raise HIP.error(self.init_error, "hipInit")


def test_versions_are_formatted_as_rocm_does():
    assert format_version(50221153) == "5.2.21153"
    assert format_version(60342134) == "6.3.42134"


def test_without_hip_python():
    def missing():
        raise ImportError("No module named 'hip'")

    ok, reason = probe(missing)
    assert not ok and "hip-python is not installed" in reason


def test_without_the_runtime_library():
    loader = RuntimeError("failed to dlopen 'libamdhip64.so': cannot open shared object file")
    ok, reason = probe(lambda: StandInApi(load_error=loader))
    assert not ok and "library not found" in reason and "LD_LIBRARY_PATH" in reason


def test_no_device_names_the_runtime_found():
    ok, reason = probe(lambda: StandInApi(count_error=HipError.hipErrorNoDevice))
    assert not ok
    assert reason.startswith("no HIP device") and "hipErrorNoDevice" in reason
    assert "HIP runtime 5.2.21153 (/usr/lib/libamdhip64.so.5.2.21153)" in reason


def test_zero_devices():
    ok, reason = probe(lambda: StandInApi(count=0))
    assert not ok and "0 devices" in reason


def test_a_runtime_older_than_the_bindings_is_unusable_with_a_plain_reason():
    ok, reason = probe(lambda: StandInApi(count=2, missing=["hipGetDevicePropertiesR0600"]))
    assert not ok
    assert "HIP runtime 5.2.21153" in reason and "lacks hipGetDevicePropertiesR0600" in reason
    assert "cannot drive a device" in reason
    ok, reason = probe(lambda: StandInApi(count_error=HipError.hipErrorNoDevice, missing=["hipX"]))
    assert reason.startswith("no HIP device") and "lacks hipX" in reason


def test_init_failure():
    ok, reason = probe(lambda: StandInApi(init_error=HipError.hipErrorInvalidDevice))
    assert not ok and "hipInit failed" in reason and "hipErrorInvalidDevice" in reason


def test_a_usable_runtime_with_a_device_is_available():
    assert probe(lambda: StandInApi(count=1)) == (True, None)


def test_hip_is_listed_between_cuda_and_local_task_with_a_reason():
    infos = {i.name: i for i in hal.list_drivers()}
    names = [i.name for i in hal.list_drivers()]
    assert names.index("cuda") < names.index("hip") < names.index("local-task")
    if not infos["hip"].available:
        assert infos["hip"].reason
        with pytest.raises(hal.UnavailableError) as err:
            hal.create_device("hip://0")
        assert infos["hip"].reason in str(err.value)


# -- for real, through the command line ------------------------------------------------------------------


def _runtime_loads(env: dict) -> bool:
    code = "import ctypes; ctypes.CDLL('libamdhip64.so')"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True).returncode == 0


def _hal(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hal", *args], env=env, capture_output=True, text=True, timeout=120)


def _env(**changes: str) -> dict:
    env = dict(os.environ)
    env.update(changes)
    return env


def rocm_missing(why: object) -> None:
    """Skip for a missing ROCm library, unless CI installed it (.ci/run sets HAL_CI_HIPRTC=1): then fail."""
    if os.environ.get("HAL_CI_HIPRTC") == "1":
        pytest.fail(f"CI installed Debian's ROCm libraries, but: {why}")
    pytest.skip(f"{why} (CI installs Debian's ROCm libraries: .ci/run)")


@pytest.fixture
def hip_python():
    pytest.importorskip("hip", reason="hip-python is not installed")


def test_cli_without_the_runtime_library(hip_python):
    env = _env(LD_LIBRARY_PATH="")
    if _runtime_loads(env):
        pytest.skip("libamdhip64.so is installed system-wide here")
    listing = _hal("--list-drivers", env=env)
    line = next(line for line in listing.stdout.splitlines() if line.startswith("hip "))
    assert "unavailable" in line and "library not found" in line
    assert "Traceback" not in listing.stdout + listing.stderr
    dump = _hal("--dump-devices", "--driver", "hip", env=env)
    assert dump.returncode != 0 and "library not found" in dump.stdout + dump.stderr
    assert "Traceback" not in dump.stdout + dump.stderr


def test_cli_with_the_runtime_and_no_gpu(hip_python):
    env = _env()
    if not _runtime_loads(env):
        rocm_missing("libamdhip64.so does not load")
    listing = _hal("--list-drivers", "--json", env=env)
    info = {entry["name"]: entry for entry in json.loads(listing.stdout)}["hip"]
    if info["available"]:
        pytest.skip("this machine has an AMD GPU")
    assert "no HIP device" in info["reason"] and "hipErrorNoDevice" in info["reason"]
    assert "HIP runtime" in info["reason"]  # which library was found
    dump = _hal("--dump-devices", "--driver", "hip", env=env)
    output = dump.stdout + dump.stderr
    assert dump.returncode != 0 and "no HIP device" in output
    assert "Traceback" not in output + listing.stderr


def test_the_loaded_runtime_is_named_by_file(hip_python):
    if not _runtime_loads(_env()):
        pytest.skip("the HIP runtime library is not installed here")
    from hal.drivers.hip.api import HipApi

    api = HipApi()
    version = api.runtime_version()
    assert version > 0 and "libamdhip64" in (api.library_path() or "")
    ctypes.CDLL(api.library_path())
