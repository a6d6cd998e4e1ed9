"""Every GPU kernel source the runtime can generate (all ops x dtypes) compiles with NVRTC for sm_90."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda.bindings is not installed")

from runtime.kernels.catalog import all_sources  # noqa: E402

ARCH = b"--gpu-architecture=sm_90"


def compile_cubin(source: str, name: str) -> tuple[bool, str, bytes]:
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        (res,) = nvrtc.nvrtcCompileProgram(program, 1, [ARCH])
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, log.decode(errors="replace"), b""
        _, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(program, cubin)
        return True, "", cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def test_every_runtime_kernel_compiles():
    sources = all_sources()
    assert len(sources) > 150
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda s: (s, *compile_cubin(s.cuda_source(), s.name)), sources))
    failures = [(s.name, log) for s, ok, log, _ in results if not ok]
    assert not failures, f"{len(failures)} sources failed; first: {failures[0][0]}\n{failures[0][1][:4000]}"
    for src, _, _, cubin in results:
        assert cubin[:4] == b"\x7fELF"
        for export in src.exports:
            assert export.name.encode() in cubin, f"{export.name} missing from {src.name}"


def test_hip_sources_share_the_kernel_body():
    for src in all_sources()[:20]:
        hip = src.hip_source()
        assert hip.startswith("\n#include <hip/hip_runtime.h>")
        body = src.cuda_source().split("RT_DEV float bf16_to_f32", 1)[1]
        assert body in hip


def test_indirect_binding_variants_compile():
    """The GPU driver's indirect-binding transformation (kernels become device functions called by
    wrappers reading buffer addresses from a table) fits the runtime's kernels: one per family."""
    executable_cache = pytest.importorskip("hal.drivers.gpu.executable_cache")
    seen: dict = {}
    for src in all_sources():
        seen.setdefault(src.key[0], src)
    for family, src in seen.items():
        code = executable_cache.indirect_source(src.cuda_source(), src.exports)
        ok, log, cubin = compile_cubin(code, f"{src.name}_indirect")
        assert ok, f"{family}: {log[:4000]}"
        for export in src.exports:
            assert executable_cache.indirect_name(export.name).encode() in cubin
