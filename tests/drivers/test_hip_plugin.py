"""The hip plugin: registered, unavailable here, with the real reason."""

from __future__ import annotations

import enum

import pytest

import hal
from hal.drivers.hip.plugin import probe_hip


def test_hip_is_listed_unavailable_with_a_reason():
    info = {i.name: i for i in hal.list_drivers()}["hip"]
    assert info.available is False
    assert info.reason and ("hip-python" in info.reason or "HIP" in info.reason)
    with pytest.raises(hal.UnavailableError) as err:
        hal.create_device("hip://0")
    assert info.reason in str(err.value)


def test_hip_ranks_between_cuda_and_local_task():
    names = [i.name for i in hal.list_drivers()]
    assert names.index("cuda") < names.index("hip") < names.index("local-task")


class HipError(enum.IntEnum):
    hipSuccess = 0
    hipErrorNoDevice = 100


class FakeHip:
    def __init__(self, init=HipError.hipSuccess, count=0):
        self._init, self._count = init, count

    def hipInit(self, flags):
        return (self._init,)

    def hipGetDeviceCount(self):
        return (HipError.hipSuccess, self._count)


def test_probe_without_hip_python():
    def missing():
        raise ImportError("No module named 'hip'")

    ok, reason = probe_hip(missing)
    assert not ok and "hip-python is not installed" in reason


def test_probe_reports_hip_error_no_device():
    ok, reason = probe_hip(lambda: FakeHip(init=HipError.hipErrorNoDevice))
    assert not ok and "hipErrorNoDevice" in reason


def test_probe_reports_zero_devices():
    ok, reason = probe_hip(lambda: FakeHip(count=0))
    assert not ok and "0 devices" in reason


def test_probe_with_a_device_still_says_why():
    ok, reason = probe_hip(lambda: FakeHip(count=2))
    assert not ok and "2 HIP device" in reason
