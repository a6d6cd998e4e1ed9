"""Every CUDA C kernel of the conformance suite compiles with NVRTC to an sm_90 cubin (no GPU needed)."""

from __future__ import annotations

import pytest

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda.bindings is not installed")

from cts.kernels import EXPORT_NAMES, cuda_source  # noqa: E402

ARCH = b"--gpu-architecture=sm_90"


def _check(result, program=None) -> object:
    """Unwrap an NVRTC result tuple; on a compile error, fail with the program log."""
    err, *values = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        log = ""
        if program is not None:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            buffer = b" " * size
            nvrtc.nvrtcGetProgramLog(program, buffer)
            log = buffer.decode(errors="replace")
        pytest.fail(f"NVRTC failed: {err}\n{log}")
    return values[0] if len(values) == 1 else values


def compile_to_cubin(source: str, name: str) -> bytes:
    program = _check(nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], []))
    try:
        _check(nvrtc.nvrtcCompileProgram(program, 1, [ARCH]), program)
        size = _check(nvrtc.nvrtcGetCUBINSize(program))
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(program, cubin))
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)


@pytest.mark.parametrize("name", EXPORT_NAMES)
def test_kernel_compiles_alone(name):
    cubin = compile_to_cubin(cuda_source([name]), name)
    assert cubin[:4] == b"\x7fELF"
    assert name.encode() in cubin, 'the extern "C" symbol keeps its name'


def test_whole_cts_module_compiles():
    cubin = compile_to_cubin(cuda_source(), "cts_kernels")
    assert cubin[:4] == b"\x7fELF"
    for name in EXPORT_NAMES:
        assert name.encode() in cubin


def test_broken_source_is_reported():
    program = _check(nvrtc.nvrtcCreateProgram(b"this is not CUDA", b"broken.cu", 0, [], []))
    try:
        (err,) = nvrtc.nvrtcCompileProgram(program, 1, [ARCH])
        assert err != nvrtc.nvrtcResult.NVRTC_SUCCESS
    finally:
        nvrtc.nvrtcDestroyProgram(program)
