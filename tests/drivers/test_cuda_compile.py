"""NVRTC compilation through the cuda driver's executable cache, for sm_90, without a GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from cts.kernels import EXPORT_NAMES, cuda_source  # noqa: E402

import hal  # noqa: E402
from hal.drivers.cuda import executable_cache as cache  # noqa: E402
from hal.drivers.cuda.status import CompileError  # noqa: E402
from hal.drivers.gpu.executable_cache import JOIN_KERNEL_SOURCE  # noqa: E402

try:
    cache.nvrtc_version()
except hal.UnavailableError as exc:  # pragma: no cover - NVRTC is part of the CI install
    pytest.skip(f"NVRTC unavailable: {exc}", allow_module_level=True)


def is_cubin(image: bytes) -> bool:
    return image[:4] == b"\x7fELF"


def test_cts_kernels_compile_to_an_sm90_cubin():
    image = cache.compile_cuda_c(cuda_source(), "sm_90")
    assert is_cubin(image)
    for name in EXPORT_NAMES:
        assert name.encode() in image


def test_driver_join_kernel_compiles():
    image = cache.compile_cuda_c(JOIN_KERNEL_SOURCE, "sm_90")
    assert is_cubin(image) and b"hal_join" in image


def test_benchmark_kernels_compile():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "hal_bench.py"
    spec = importlib.util.spec_from_file_location("hal_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    image = cache.compile_cuda_c(module.KERNELS, "sm_90")
    for export in module.EXPORTS:
        assert export.name.encode() in image


def test_runtime_kernels_compile_through_the_driver():
    catalog = pytest.importorskip("runtime.kernels.catalog")
    sources = catalog.all_sources()
    # The runtime's own test compiles every source; here a spread of them goes through the driver's path.
    for source in sources[:: max(1, len(sources) // 12)]:
        assert is_cubin(cache.compile_cuda_c(source.cuda_source(), "sm_90"))


def test_ptx_target():
    ptx = cache.compile_cuda_c(cuda_source(["cts_iota"]), "compute_90")
    assert b".entry cts_iota" in ptx and b".target sm_90" in ptx


def test_launch_bounds_take_the_indirect_path_and_the_wrapper_gets_the_exports():
    """Indirect bindings inline each kernel into a wrapper: a kernel's own __launch_bounds__ (allowed on
    kernels only) step aside there, and the wrapper is bounded to the export's workgroup size."""
    from hal.drivers.gpu.executable_cache import indirect_name, indirect_source

    source = ('extern "C" __global__ void __launch_bounds__(512) scale(float* x, unsigned n) '
              "{ unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }\n")
    export = hal.Export("scale", (128, 2, 1), 1, 1)
    direct = cache.compile_cuda_c(source, "compute_90").decode()
    assert ".maxntid 512, 1, 1" in direct
    ptx = cache.compile_cuda_c(indirect_source(source, [export]), "compute_90").decode()
    wrapper = ptx[ptx.index(f".entry {indirect_name('scale')}"):]
    assert ".maxntid 256, 1, 1" in wrapper[:wrapper.index("{")]  # (128 x 2 threads)
    assert is_cubin(cache.compile_cuda_c(indirect_source(source, [export]), "sm_90"))


def test_compile_error_carries_the_log():
    with pytest.raises(CompileError) as info:
        cache.compile_cuda_c('extern "C" __global__ void broken( { }', "sm_90", name="broken.cu")
    err = info.value
    assert isinstance(err, hal.InvalidArgumentError)
    assert "broken.cu" in err.log and "error" in err.log
    assert err.log in str(err)


def test_defines_and_options():
    source = 'extern "C" __global__ void k(unsigned int* p) { p[0] = VALUE; }'
    with pytest.raises(CompileError):
        cache.compile_cuda_c(source, "sm_90")
    image = cache.compile_cuda_c(source, "sm_90", {"defines": {"VALUE": 7}, "nvrtc_options": ["-lineinfo"]})
    assert is_cubin(image)
    with pytest.raises(hal.InvalidArgumentError):
        cache.compile_cuda_c(source, "sm_90", {"nvrtc_options": "-lineinfo"})


@pytest.mark.parametrize(("capability", "supported", "target"), [
    ((9, 0), [75, 80, 86, 89, 90, 100], "sm_90"),
    ((8, 9), [75, 80, 86, 90], "sm_86"),
    ((12, 1), [75, 80, 90, 100, 120], "sm_120"),
    ((10, 3), [75, 80, 90], "compute_90"),
])
def test_target_for_device(capability, supported, target):
    assert cache.target_for(capability, supported) == target


def test_target_for_too_old_device():
    with pytest.raises(hal.IncompatibleError):
        cache.target_for((6, 0), [75, 80])


def test_disk_cache_keys_by_source_target_options(monkeypatch, tmp_path):
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_disk_cache", cache.DiskCache("cuda"))
    calls = []
    real = cache.compile_cuda_c

    def counting(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(cache, "compile_cuda_c", counting)
    source = cuda_source(["cts_add_one"])
    first = cache.cached_compile(source, "sm_90")
    assert cache.cached_compile(source, "sm_90") == first
    assert calls == ["sm_90"]
    cache.cached_compile(source, "sm_80")
    cache.cached_compile(source, "sm_90", {"defines": {"X": 1}})
    assert len(calls) == 3
    assert any(tmp_path.joinpath("cuda").iterdir())
