"""Every GPU kernel the project ships compiles with hiprtc into an AMDGPU code object, on the CPU.

The CTS kernels, the runtime's kernel library (every op x dtype), fused-kernel
templates, the indirect-binding variants and the graph join kernel are compiled
from the same CUDA C source behind the HIP prelude, through the HIP driver's
own compile path (``hal.drivers.hip.executable_cache``), for gfx90a (MI200) and
for the newest CDNA processor the installed compiler knows. CI installs
Debian's ROCm 5.2 hiprtc for this (``.ci/run``; ``HAL_CI_HIPRTC=1`` makes a
missing library a failure instead of a skip).
"""

from __future__ import annotations

import pytest

import hal
from hal.drivers.gpu.executable_cache import indirect_name, indirect_source
from hal.drivers.hip import executable_cache as hip_cache
from hal.errors import UnavailableError

from .test_hip_driver import rocm_missing

#: AMD's CDNA (Instinct) processors, oldest first.
CDNA_PROCESSORS = ("gfx908", "gfx90a", "gfx940", "gfx941", "gfx942", "gfx950")
#: A full gcnArchName as a device reports it: the compile path takes the feature suffix as given.
MI200 = "gfx90a:sramecc+:xnack-"


@pytest.fixture(scope="module", autouse=True)
def hiprtc():
    try:
        hip_cache.hiprtc_version()
    except UnavailableError as exc:
        rocm_missing(exc)
    if hip_cache.known_processors() is None:
        pytest.fail("hiprtc loads but the code-object manager (comgr) cannot be asked for its processors")


def newest_cdna() -> str:
    known = hip_cache.known_processors() or frozenset()
    return ([p for p in CDNA_PROCESSORS if p in known] or ["gfx90a"])[-1]


def targets() -> list[str]:
    """gfx90a (with a device's feature suffix) and the newest CDNA processor, if another."""
    newest = newest_cdna()
    return [MI200] if newest == "gfx90a" else [MI200, newest]


def compile_all(
    named_sources: list[tuple[str, str]], target: str, options: dict | None = None
) -> dict[str, bytes | Exception]:
    """Compile each (name, HIP source); name -> image or error. (The driver compiles one program at a
    time: ROCm 5.2's hiprtc aborts the process when two threads compile at once.)"""

    def one(item: tuple[str, str]) -> tuple[str, bytes | Exception]:
        name, source = item
        try:
            return name, hip_cache.compile_hip_c(source, target, options, name=f"{name}.hip")
        except hal.HalError as exc:
            return name, exc

    return dict(map(one, named_sources))


def assert_code_objects(results: dict, exports: dict[str, list[str]]) -> None:
    failures = {name: r for name, r in results.items() if isinstance(r, Exception)}
    assert not failures, f"{len(failures)} of {len(results)} failed; first: {next(iter(failures.items()))}"
    for name, image in results.items():
        assert image[:4] == b"\x7fELF", name
        for export in exports[name]:
            assert export.encode() in image, f"{export} is not a symbol of {name}'s code object"


def test_the_newest_cdna_processor_is_known_and_newer_ones_are_refused():
    newest = newest_cdna()
    assert CDNA_PROCESSORS.index(newest) >= CDNA_PROCESSORS.index("gfx90a")
    later = CDNA_PROCESSORS[CDNA_PROCESSORS.index(newest) + 1 :]
    if later:  # comgr would abort the process for these: the shim refuses them first
        with pytest.raises(hal.IncompatibleError, match=later[0]):
            hip_cache.compile_hip_c('extern "C" __global__ void k() {}', later[0])


@pytest.mark.parametrize("target", targets())
def test_cts_kernels_compile(target):
    from cts.kernels import EXPORT_NAMES, hip_source

    whole = [("cts_kernels", hip_source())] + [(name, hip_source([name])) for name in EXPORT_NAMES[:1]]
    exports = {"cts_kernels": EXPORT_NAMES, EXPORT_NAMES[0]: EXPORT_NAMES[:1]}
    assert_code_objects(compile_all(whole, target), exports)


#: Kernel families per hiprtc program in the whole-library test: one program costs about a second of
#: fixed compiler start-up, a family about 0.2 s more, so 1,100 one-family programs took ten minutes.
FAMILIES_PER_PROGRAM = 60
#: The whole-library test compiles unoptimised (a batch of 60 families: 6.7 s against 16.5 at hiprtc's
#: default -O3): it asks whether every family compiles for the target; the driver's own options are
#: what the test of one family of each kind compiles with.
WHOLE_LIBRARY_OPTIONS = {"hiprtc_options": ["-O0"]}


def batched_program(sources: list) -> str:
    """One HIP program holding every family of `sources`, each in its own namespace (their helper functions
    share names; the kernels are extern "C" and keep theirs)."""
    from runtime.kernels.cuda_common import COMMON, HIP_PRELUDE

    bodies = (f"namespace rt_family_{i} {{\n{src.body()}\n}}\n" for i, src in enumerate(sources))
    return HIP_PRELUDE + COMMON + "".join(bodies)


def compile_batch(sources: list, target: str) -> dict[str, bytes | Exception]:
    """family name -> code object (the batch's) or error. A batch that fails is compiled family by family,
    so the failure names the family and carries its own log."""
    try:
        image = hip_cache.compile_hip_c(batched_program(sources), target, WHOLE_LIBRARY_OPTIONS,
                                        name=f"{sources[0].name}_batch.hip")
    except hal.HalError:
        return compile_all([(s.name, s.hip_source()) for s in sources], target, WHOLE_LIBRARY_OPTIONS)
    return {s.name: image for s in sources}


def _compile_batch_in_worker(args: tuple) -> dict:
    names, target = args
    from runtime.kernels.catalog import all_sources

    by_name = {s.name: s for s in all_sources()}
    return compile_batch([by_name[n] for n in names], target)


@pytest.mark.parametrize("target", targets())
def test_every_runtime_kernel_compiles(target):
    """Every family the runtime can generate (op x dtypes), in batched programs compiled by one process per
    core (hiprtc compiles one program at a time per process)."""
    import concurrent.futures
    import multiprocessing
    import os

    from runtime.kernels.catalog import all_sources

    sources = all_sources()
    assert len(sources) > 150
    names = [s.name for s in sources]
    assert len(set(names)) == len(names)
    batches = [(names[i : i + FAMILIES_PER_PROGRAM], target) for i in range(0, len(names), FAMILIES_PER_PROGRAM)]
    workers = min(len(batches), os.cpu_count() or 1)
    spawn = multiprocessing.get_context("spawn")  # a fresh hiprtc per worker, no state forked from this one
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn) as pool:
        results = {name: r for part in pool.map(_compile_batch_in_worker, batches) for name, r in part.items()}
    assert_code_objects(results, {s.name: [e.name for e in s.exports] for s in sources})


@pytest.mark.parametrize("target", targets())
def test_one_family_of_each_kind_compiles_as_its_own_program(target):
    """What the driver compiles at run time: one family per program, at global scope."""
    from runtime.kernels.catalog import all_sources

    first_of_kind: dict = {}
    for src in all_sources():
        first_of_kind.setdefault(src.key[0], src)
    results = compile_all([(s.name, s.hip_source()) for s in first_of_kind.values()], target)
    assert_code_objects(results, {s.name: [e.name for e in s.exports] for s in first_of_kind.values()})


def _fused_specs() -> list:
    import runtime as rt
    from runtime.kernels.fused import FusedSpec

    f32, i32, b8 = rt.float32, rt.int32, rt.bool_
    return [
        # a sigmoid-of-affine chain, one broadcast scalar input
        FusedSpec(
            ((f32, "c"), (f32, "s"), (f32, "c")),
            (
                ("mul", f32, f32, (("i", 0), ("i", 1))),
                ("add", f32, f32, (("m", 0), ("i", 2))),
                ("sigmoid", f32, f32, (("m", 1),)),
            ),
            (2,),
        ),
        # comparisons, where and two outputs across float, int and bool
        FusedSpec(
            ((f32, "c"), (f32, "c"), (i32, "s")),
            (
                ("lt", f32, b8, (("i", 0), ("i", 1))),
                ("where", f32, f32, (("m", 0), ("i", 0), ("i", 1))),
                ("cast", i32, i32, (("m", 1),)),
                ("maximum", i32, i32, (("m", 2), ("i", 2))),
            ),
            (1, 3),
        ),
        # integer arithmetic and a bool output
        FusedSpec(
            ((i32, "c"), (i32, "c")),
            (
                ("sub", i32, i32, (("i", 0), ("i", 1))),
                ("abs", i32, i32, (("m", 0),)),
                ("eq", i32, b8, (("m", 1), ("i", 1))),
            ),
            (1, 2),
        ),
        # unary float chain from broadcast inputs only
        FusedSpec(
            ((f32, "s"), (f32, "s")),
            (
                ("div", f32, f32, (("i", 0), ("i", 1))),
                ("exp", f32, f32, (("m", 0),)),
                ("log", f32, f32, (("m", 1),)),
                ("sqrt", f32, f32, (("m", 2),)),
                ("tanh", f32, f32, (("m", 3),)),
                ("neg", f32, f32, (("m", 4),)),
            ),
            (5,),
        ),
    ]


@pytest.mark.parametrize("target", targets())
def test_fused_kernel_templates_compile(target):
    from runtime.kernels.fused import fused_source

    sources = [fused_source(spec) for spec in _fused_specs()]
    results = compile_all([(s.name, s.hip_source()) for s in sources], target)
    assert_code_objects(results, {s.name: [e.name for e in s.exports] for s in sources})


def test_indirect_binding_variants_compile():
    """The graph command buffer's indirect-binding wrappers fit every kernel family and the CTS kernels."""
    from cts.kernels import hip_source, specs

    from runtime.kernels.catalog import all_sources

    families: dict = {}
    for src in all_sources():
        families.setdefault(src.key[0], (src.hip_source(), src.exports))
    families["cts"] = (hip_source(), specs()[2].exports)
    named = [(family, indirect_source(code, exports)) for family, (code, exports) in families.items()]
    exports = {family: [indirect_name(e.name) for e in ex if e.bindings] for family, (_, ex) in families.items()}
    assert_code_objects(compile_all(named, MI200), exports)


def test_join_kernel_compiles():
    from hal.drivers.gpu import executable_cache

    source = getattr(executable_cache, "JOIN_KERNEL_SOURCE", 'extern "C" __global__ void hal_join() {}\n')
    image = hip_cache.compile_hip_c(source, MI200)
    assert image[:4] == b"\x7fELF" and b"hal_join" in image


def test_compile_errors_carry_the_log():
    with pytest.raises(hal.InvalidArgumentError) as err:
        hip_cache.compile_hip_c("this is not HIP", MI200, name="broken.hip")
    assert "broken.hip" in str(err.value) and "error" in err.value.log


def test_options_reach_the_compiler():
    source = 'extern "C" __global__ void k(int* out) { out[0] = VALUE; }'
    image = hip_cache.compile_hip_c(source, MI200, {"defines": {"VALUE": 7}})
    assert image[:4] == b"\x7fELF"
    with pytest.raises(hal.InvalidArgumentError, match="hiprtc_options"):
        hip_cache.compile_hip_c(source, MI200, {"hiprtc_options": "-O0"})
    with pytest.raises(hal.InvalidArgumentError):  # undefined VALUE
        hip_cache.compile_hip_c(source, MI200)


def test_disk_cache_reuses_code_objects(tmp_path, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hip_cache, "_disk_cache", hip_cache.DiskCache("hip"))
    source = 'extern "C" __global__ void cached(float* x) { x[threadIdx.x] *= 2.0f; }'
    first = hip_cache.cached_compile(source, MI200)
    assert len(list((tmp_path / "hip").iterdir())) == 1

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled again despite the disk cache")

    monkeypatch.setattr(hip_cache, "compile_hip_c", no_compile)
    assert hip_cache.cached_compile(source, MI200) == first
    with pytest.raises(AssertionError):  # another target is another entry
        hip_cache.cached_compile(source, "gfx908")


def test_executable_cache_formats_and_code_objects():
    cache = hip_cache.HipExecutableCache(MI200)
    assert cache.formats == ("hip-c", "hsaco") and cache.source_format == "hip-c"
    exports = [hal.Export("k", (64, 1, 1), 1, 0)]
    image = cache.image_for(hal.ExecutableSpec("hip-c", 'extern "C" __global__ void k(float* x) {}', exports))
    assert image[:4] == b"\x7fELF"
    assert cache.image_for(hal.ExecutableSpec("hsaco", image, exports)) == image  # taken as given
    for bad in (b"\xff\xfe", "text", b""):
        with pytest.raises(hal.InvalidArgumentError):
            cache.image_for(hal.ExecutableSpec("hsaco", bad, exports))
    with pytest.raises(hal.IncompatibleError):
        cache.image_for(hal.ExecutableSpec("cubin", image, exports))
