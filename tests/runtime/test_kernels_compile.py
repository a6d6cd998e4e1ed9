"""Every GPU kernel source the runtime can generate (all ops x dtypes) compiles with NVRTC for sm_90."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda.bindings is not installed")

from runtime.kernels.catalog import all_sources  # noqa: E402

ARCH = b"--gpu-architecture=sm_90"


def fast_compile() -> list[bytes]:
    """NVRTC's quickest full compile (front end, NVVM and ptxas, optimising little), where it has one
    (CUDA 12.8 on): the whole catalog took 165 s of a 2-core machine's test run at the default level,
    about a fifth of that with it. The driver's own compile, at the default level, is what the tests
    of one family per kind and the GPU's tests run."""
    err, major, minor = nvrtc.nvrtcVersion()
    return [b"--Ofast-compile=max"] if (major, minor) >= (12, 8) else []


def compile_cubin(source: str, name: str, options: tuple[bytes, ...] = ()) -> tuple[bool, str, bytes]:
    """(compiled, the compiler's log, the cubin) of ``source`` for sm_90."""
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        flags = [ARCH, *options]
        (res,) = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, log.decode(errors="replace"), b""
        _, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(program, cubin)
        return True, log.decode(errors="replace"), cubin
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _units(sources: list, per_unit: int = 48) -> list:
    """Translation units to compile: sources in batches behind one prelude, each in its own namespace
    (their helper functions share names; the extern "C" kernels keep theirs). (name, C source, exports)."""
    from runtime.kernels.cuda_common import COMMON, CUDA_PRELUDE

    units = []
    for i in range(0, len(sources), per_unit):
        batch = sources[i:i + per_unit]
        code = CUDA_PRELUDE + COMMON + "".join(f"namespace rt_unit{j} {{\n{s._cuda_fn()}\n}}\n"
                                               for j, s in enumerate(batch))
        units.append((f"{batch[0].name}..{batch[-1].name}", code, [e.name for s in batch for e in s.exports]))
    return units


def test_every_runtime_kernel_compiles():
    sources = all_sources()
    assert len(sources) > 1000
    units = _units(sources)
    options = tuple(fast_compile())
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda u: (u, *compile_cubin(u[1], u[0], options)), units))
    failures = [(u[0], log) for u, ok, log, _ in results if not ok]
    assert not failures, f"{len(failures)} sources failed; first: {failures[0][0]}\n{failures[0][1][:4000]}"
    for (name, _, exports), _, _, cubin in results:
        assert cubin[:4] == b"\x7fELF"
        for export in exports:
            assert export.encode() in cubin, f"{export} missing from {name}"


def test_hip_sources_share_the_kernel_body():
    for src in all_sources()[:20]:
        hip = src.hip_source()
        assert hip.startswith("\n#ifndef __HIPCC_RTC__") and "#include <hip/hip_runtime.h>" in hip
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


REGISTERS_PER_SM = 65536  # sm_90: what a workgroup's threads share at most


def registers_used(source: str, name: str) -> dict[str, int]:
    """{kernel: registers a thread} as ptxas reports them compiling ``source`` for sm_90."""
    ok, text, _ = compile_cubin(source, name, (b"--ptxas-options=-v",))
    assert ok, text[:4000]
    used, kernel = {}, None
    for line in text.splitlines():
        if "Compiling entry function" in line:
            kernel = line.split("'")[1]
        elif "Used" in line and "registers" in line and kernel is not None:
            used[kernel] = int(line.split("Used")[1].split()[0])
    return used


def long_row_programs() -> list:
    """The row programs the runtime makes for a layer norm, a softmax and a longer composition over
    300 rows of 20000 float32 and float64 values (1024 threads a workgroup: loop mode, or the long-row
    register mode of the float32 softmax and layer norm), recorded on a CPU device lowered as a GPU."""
    import numpy as np

    import hal
    import runtime as rt
    from runtime.device import context_for
    from runtime.kernels import rows

    made = []
    real = rows.rows_source

    def spy(spec, config):
        src = real(spec, config)
        made.append(src)
        return src

    device = hal.create_device("local-sync")
    context_for(device).is_gpu = True
    rows.rows_source = spy  # (plan finds it as a module global)
    try:
        for dtype in ("float32", "float64"):
            rng = np.random.default_rng(0)
            x, w, b = (rt.array(a.astype(dtype), device=device)
                       for a in (rng.standard_normal((300, 20000)), 1 + 0.1 * rng.standard_normal(20000),
                                 0.1 * rng.standard_normal(20000)))
            mean = x.mean(axis=-1, keepdims=True)
            centred = x - mean
            norm = centred / rt.sqrt((centred * centred).mean(axis=-1, keepdims=True) + 1e-5) * w + b
            e = rt.exp(x - x.max(axis=-1, keepdims=True))
            softmax = e / e.sum(axis=-1, keepdims=True)
            longer = softmax * rt.tanh(norm * 0.79 + 0.03 * norm * norm * norm) + rt.exp(-abs(norm)) * x
            for y in (norm, softmax, longer):
                rt.eval(y)
    finally:
        rows.rows_source = real
        device.close()
    return made


def test_wide_workgroups_registers_fit():
    """A kernel of more than 256 threads a workgroup (a row program over rows of more than 16384
    elements, in loop mode or in registers; the matrix-vector products' column kernels) takes no more
    registers a thread than its workgroup's threads can share, directly and through the
    indirect-binding wrappers: a float64 layer norm's row program took 70 (64 at most for 1024
    threads) without launch bounds, and a workgroup of it could not launch."""
    executable_cache = pytest.importorskip("hal.drivers.gpu.executable_cache")

    made = long_row_programs()
    wide = {src.name: src for src in [*made, *all_sources()]
            if any(math.prod(e.workgroup_size) > 256 for e in src.exports)}
    assert {src.key[0] for src in wide.values()} >= {"rows", "matmul"}
    assert sum("const double* __restrict__ in0" in src.cuda_source() for src in made) >= 2  # float64 among them

    def check(src):
        direct = registers_used(src.cuda_source(), src.name)
        indirect = registers_used(executable_cache.indirect_source(src.cuda_source(), src.exports), src.name)
        for export in src.exports:
            wrapper = executable_cache.indirect_name(export.name)
            for kernel, used in ((export.name, direct[export.name]), (wrapper, indirect[wrapper])):
                threads = math.prod(export.workgroup_size)
                assert used * threads <= REGISTERS_PER_SM, (kernel, used, threads)
        return len(src.exports)

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert sum(pool.map(check, wide.values())) >= len(wide)
