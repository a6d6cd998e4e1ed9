"""Every hipError_t and hiprtcResult maps to a typed HalError carrying the API name and the runtime's message."""

from __future__ import annotations

import enum

import pytest

import hal
from hal.drivers.gpu.status import CompileError, DeviceLostError
from hal.drivers.hip import status
from hal.drivers.hip.status import HIP, HIPRTC, check_hiprtc


class FakeHipError(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorNoDevice = 100
    hipErrorNotReady = 600
    hipErrorIllegalAddress = 700
    hipErrorSomethingNew = 9999


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (FakeHipError.hipErrorInvalidValue, hal.InvalidArgumentError),
        (FakeHipError.hipErrorOutOfMemory, hal.ResourceExhaustedError),
        (FakeHipError.hipErrorNoDevice, hal.UnavailableError),
        (FakeHipError.hipErrorNotReady, hal.UnavailableError),
        (FakeHipError.hipErrorIllegalAddress, DeviceLostError),
        (FakeHipError.hipErrorSomethingNew, hal.InternalError),
    ],
)
def test_codes_map_to_typed_errors_with_api_name(code, cls):
    with pytest.raises(cls) as err:
        raise HIP.error(code, "hipMalloc")
    assert type(err.value) is cls
    assert err.value.api_function == "hipMalloc"
    assert err.value.api_code == code.name
    assert f"hipMalloc failed: {code.name} ({int(code)})" in str(err.value)


def test_out_of_memory_is_resource_exhausted_and_a_hal_error():
    with pytest.raises(hal.HalError) as err:
        raise HIP.error(FakeHipError.hipErrorOutOfMemory, "hipMallocAsync")
    assert err.value.code == hal.StatusCode.RESOURCE_EXHAUSTED


def test_the_shim_checks_every_status_tuple():
    """HipApi.call: raise for a failing status, else the call's value (hip-python returns tuples)."""
    from hal.drivers.hip.api import HipApi

    shim = HipApi.__new__(HipApi)
    shim.status = HIP

    def hipGetDeviceCount():  # noqa: N802 - named as the HIP function, for the error message
        return FakeHipError.hipErrorNoDevice, 0

    with pytest.raises(hal.UnavailableError, match="hipGetDeviceCount failed: hipErrorNoDevice"):
        shim.call(hipGetDeviceCount)
    assert shim.call(lambda: (FakeHipError.hipSuccess, 7)) == 7
    assert shim.call(lambda: (FakeHipError.hipSuccess,)) is None


def test_message_carries_the_runtime_text(monkeypatch):
    monkeypatch.setattr(HIP, "describe", lambda code: "out of memory on the device")
    with pytest.raises(hal.ResourceExhaustedError, match="out of memory on the device"):
        raise HIP.error(FakeHipError.hipErrorOutOfMemory, "hipMalloc")


def test_hiprtc_codes():
    class Rtc(enum.IntEnum):
        HIPRTC_ERROR_COMPILATION = 6
        HIPRTC_ERROR_INVALID_OPTION = 5
        HIPRTC_ERROR_OUT_OF_MEMORY = 1

    with pytest.raises(CompileError) as err:
        check_hiprtc((Rtc.HIPRTC_ERROR_COMPILATION,), "hiprtcCompileProgram", "the log")
    assert err.value.api_function == "hiprtcCompileProgram" and "the log" in str(err.value)
    with pytest.raises(hal.InvalidArgumentError):
        check_hiprtc((Rtc.HIPRTC_ERROR_INVALID_OPTION,), "hiprtcCompileProgram")
    with pytest.raises(hal.ResourceExhaustedError):
        check_hiprtc((Rtc.HIPRTC_ERROR_OUT_OF_MEMORY,), "hiprtcCreateProgram")


def test_describing_before_the_runtime_loaded_asks_nothing(monkeypatch, capfd):
    """hip-python prints a traceback when hipGetErrorString cannot load libamdhip64: never call it then."""
    monkeypatch.setattr(status, "_loaded", set())
    assert HIP.describe(FakeHipError.hipErrorNoDevice) == ""
    assert HIPRTC.describe(FakeHipError.hipErrorNoDevice) == ""
    assert capfd.readouterr().err == ""


# -- against the installed hip-python: every enumerator is named --------------------------------------------------


def _enum(module: str, name: str):
    package = pytest.importorskip("hip", reason="hip-python is not installed")
    return getattr(getattr(package, module), name)  # hip-python 10 has `hip.hip` as an attribute only


def test_every_hip_error_is_mapped():
    codes = [code.name for code in _enum("hip", "hipError_t") if code.name != "hipSuccess"]
    assert len(codes) > 60
    unmapped = [name for name in codes if name not in HIP.classes and name not in HIP.sticky]
    assert not unmapped, f"hipError_t codes without a HalError class: {unmapped}"


def test_every_hiprtc_result_is_mapped():
    codes = [code.name for code in _enum("hiprtc", "hiprtcResult") if code.name != "HIPRTC_SUCCESS"]
    unmapped = [name for name in codes if name not in HIPRTC.classes]
    assert not unmapped, f"hiprtcResult codes without a HalError class: {unmapped}"


def test_sticky_faults_are_real_codes():
    names = {code.name for code in _enum("hip", "hipError_t")}
    assert HIP.sticky <= names
