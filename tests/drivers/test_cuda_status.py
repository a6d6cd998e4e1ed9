"""CUresult and nvrtcResult codes map to the HalError classes the contract names."""

from __future__ import annotations

import pytest

import hal
from hal.drivers.cuda.status import CUDA, NVRTC, CompileError, DeviceLostError, check, check_nvrtc, raise_for

driver = pytest.importorskip("cuda.bindings.driver")
nvrtc = pytest.importorskip("cuda.bindings.nvrtc")
R = driver.CUresult


@pytest.mark.parametrize(("code", "cls"), [
    (R.CUDA_ERROR_OUT_OF_MEMORY, hal.ResourceExhaustedError),
    (R.CUDA_ERROR_INVALID_VALUE, hal.InvalidArgumentError),
    (R.CUDA_ERROR_INVALID_HANDLE, hal.InvalidArgumentError),
    (R.CUDA_ERROR_NOT_FOUND, hal.NotFoundError),
    (R.CUDA_ERROR_NOT_READY, hal.UnavailableError),
    (R.CUDA_ERROR_NO_DEVICE, hal.UnavailableError),
    (R.CUDA_ERROR_NOT_SUPPORTED, hal.UnimplementedError),
    (R.CUDA_ERROR_INVALID_PTX, hal.IncompatibleError),
    (R.CUDA_ERROR_NO_BINARY_FOR_GPU, hal.IncompatibleError),
    (R.CUDA_ERROR_INVALID_CONTEXT, hal.FailedPreconditionError),
    (R.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, hal.ResourceExhaustedError),
    (R.CUDA_ERROR_UNKNOWN, hal.InternalError),
])
def test_codes_map_to_classes(code, cls):
    err = CUDA.error(code, "cuSomething")
    assert type(err) is cls
    assert err.code == cls.code


@pytest.mark.parametrize("code", [R.CUDA_ERROR_ILLEGAL_ADDRESS, R.CUDA_ERROR_LAUNCH_FAILED,
                                  R.CUDA_ERROR_ILLEGAL_INSTRUCTION, R.CUDA_ERROR_MISALIGNED_ADDRESS,
                                  R.CUDA_ERROR_ASSERT, R.CUDA_ERROR_HARDWARE_STACK_ERROR])
def test_sticky_faults_mean_a_lost_device(code):
    err = CUDA.error(code, "cuEventSynchronize")
    assert isinstance(err, DeviceLostError)
    assert isinstance(err, hal.InternalError)
    assert err.code == hal.StatusCode.INTERNAL


def test_message_carries_function_code_and_value():
    err = CUDA.error(R.CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc", "allocating 1 TiB")
    text = str(err)
    assert "cuMemAlloc" in text and "CUDA_ERROR_OUT_OF_MEMORY" in text and "(2)" in text
    assert "allocating 1 TiB" in text
    assert err.api_function == "cuMemAlloc"
    assert err.api_code == "CUDA_ERROR_OUT_OF_MEMORY"


def test_every_cuda_code_maps_to_some_hal_error():
    for code in R:
        if code == R.CUDA_SUCCESS:
            continue
        assert isinstance(CUDA.error(code, "f"), hal.HalError)


def test_check_unwraps_results():
    assert check((R.CUDA_SUCCESS,), "f") is None
    assert check((R.CUDA_SUCCESS, 7), "f") == 7
    assert check((R.CUDA_SUCCESS, 1, 2), "f") == (1, 2)
    with pytest.raises(hal.ResourceExhaustedError):
        check((R.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc")
    with pytest.raises(hal.InvalidArgumentError, match="cuLaunchKernel"):
        raise_for(R.CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel")


def test_nvrtc_codes():
    N = nvrtc.nvrtcResult
    assert type(NVRTC.error(N.NVRTC_ERROR_COMPILATION, "nvrtcCompileProgram")) is CompileError
    assert issubclass(CompileError, hal.InvalidArgumentError)
    assert type(NVRTC.error(N.NVRTC_ERROR_OUT_OF_MEMORY, "f")) is hal.ResourceExhaustedError
    assert type(NVRTC.error(N.NVRTC_ERROR_INVALID_OPTION, "f")) is hal.InvalidArgumentError
    assert type(NVRTC.error(N.NVRTC_ERROR_INTERNAL_ERROR, "f")) is hal.InternalError
    assert check_nvrtc((N.NVRTC_SUCCESS, 5), "f") == 5
    message = str(NVRTC.error(N.NVRTC_ERROR_INVALID_OPTION, "nvrtcCompileProgram"))
    assert "nvrtcCompileProgram" in message and "NVRTC_ERROR_INVALID_OPTION" in message
