"""The HIP driver's hipBLASLt backend without an AMD GPU or libhipblaslt: loading, the enum mapping
of Gemm routines, and the calls it makes, recorded by a stand-in for ``hip.hipblaslt``.

The stand-in answers like the library; with ``convert=True`` every call also goes through the real
hip-python function first, which converts each argument before it looks for libhipblaslt.so: a
wrong argument type raises TypeError there, a right one the loader's RuntimeError.
"""

from __future__ import annotations

import ctypes
import inspect
import itertools
import logging
import sys

import numpy as np
import pytest

import hal
from hal.drivers.gpu import gemm
from hal.drivers.hip import blas
from hal.drivers.hip.status import HIPBLASLT, check_hipblaslt
from hal.library import GEMM_EPILOGUES, Gemm, GemmShape, Routine


@pytest.fixture
def fresh_load(fresh_library):
    """``blas.load`` as in a new process: no backend made, no reason reported yet."""
    fresh_library(blas)


def unavailable_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "hipBLASLt is unavailable" in r.getMessage()]


def without_hip_python(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "hip", None)  # import hip... raises ImportError


def without_library_bindings(monkeypatch) -> None:
    """hip-python without its ``libraries`` extra: ``hip`` imports, ``hip.hipblaslt`` does not."""
    hip = pytest.importorskip("hip", reason="hip-python is not installed")
    monkeypatch.delattr(hip, "hipblaslt", raising=False)
    monkeypatch.setitem(sys.modules, "hip.hipblaslt", None)


@pytest.mark.parametrize("missing", [without_hip_python, without_library_bindings])
def test_without_the_bindings_the_backend_is_absent_and_says_why_once(missing, monkeypatch, caplog, fresh_load):
    missing(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="hal"):
        assert blas.load(0) is None
        assert blas.load(1) is None
    warnings = unavailable_warnings(caplog)
    assert len(warnings) == 1 and "Error" in warnings[0] and "own kernels" in warnings[0], warnings
    assert "hip" in warnings[0].split("):")[0]  # the import that failed


# -- against the installed hip-python ------------------------------------------------------------------------


def real_hipblaslt():
    pytest.importorskip("hip", reason="hip-python is not installed")
    try:
        from hip import hipblaslt
    except ImportError as exc:
        pytest.skip(f"hip-python's library bindings are not installed: {exc}")
    return hipblaslt


def without_libhipblaslt():
    lt = real_hipblaslt()
    if lt.has_symbol("hipblasLtCreate"):
        pytest.skip("libhipblaslt.so loads here: the real library would run these calls")
    return lt


def test_without_libhipblaslt_the_backend_is_absent_with_the_loaders_reason(caplog, capfd, fresh_load):
    without_libhipblaslt()
    with caplog.at_level(logging.WARNING, logger="hal"):
        assert blas.load(0) is None
        assert blas.load(0) is None
    warnings = unavailable_warnings(caplog)
    assert len(warnings) == 1 and "libhipblaslt" in warnings[0], warnings
    assert "Traceback" not in capfd.readouterr().err


def test_every_hipblas_status_is_mapped():
    lt = real_hipblaslt()
    codes = [code.name for code in lt.hipblasStatus_t if code.name != "HIPBLAS_STATUS_SUCCESS"]
    assert len(codes) >= 10
    assert not [name for name in codes if name not in HIPBLASLT.classes]


@pytest.mark.parametrize(("name", "cls"), [
    ("HIPBLAS_STATUS_INVALID_VALUE", hal.InvalidArgumentError),
    ("HIPBLAS_STATUS_ALLOC_FAILED", hal.ResourceExhaustedError),
    ("HIPBLAS_STATUS_NOT_SUPPORTED", hal.UnimplementedError),
    ("HIPBLAS_STATUS_NOT_INITIALIZED", hal.FailedPreconditionError),
    ("HIPBLAS_STATUS_EXECUTION_FAILED", hal.InternalError),
])
def test_a_failing_status_is_a_typed_error_naming_the_function(name, cls):
    code = getattr(real_hipblaslt().hipblasStatus_t, name)
    with pytest.raises(cls) as err:
        check_hipblaslt((code,), "hipblasLtMatmul")
    assert type(err.value) is cls
    assert err.value.api_function == "hipblasLtMatmul" and err.value.api_code == name
    assert f"hipblasLtMatmul failed: {name} ({int(code)})" in str(err.value)
    lt = real_hipblaslt()
    assert check_hipblaslt((lt.hipblasStatus_t.HIPBLAS_STATUS_SUCCESS, 7), "hipblasLtGetVersion") == 7


def test_the_mapped_names_are_members_of_the_installed_enums():
    lt = real_hipblaslt()
    enums = blas.Enums.installed()
    forward = {"none", "bias", "relu", "bias_relu", "gelu", "bias_gelu"}
    assert set(blas.EPILOGUES) == forward
    for epilogue in set(GEMM_EPILOGUES) - forward:  # aux outputs and gradients: refused, with the reason
        reason = blas.unsupported(lt, enums, hal.Gemm("float32", epilogue=epilogue))
        assert reason is not None and epilogue in reason and "not wired" in reason
    for names, enum in ((blas.DATA_TYPES.values(), enums.data_type), ([blas.SCALE_TYPE], enums.data_type),
                        (blas.COMPUTE_TYPES.values(), enums.compute_type), (blas.EPILOGUES.values(),
                        lt.hipblasLtEpilogue_t), (blas.OPERATIONS.values(), enums.operation)):
        assert not [name for name in names if not hasattr(enum, name)]


@pytest.mark.parametrize(("dtype", "precision", "data", "compute"), [
    ("float32", "ieee", "HIP_R_32F", "HIPBLAS_COMPUTE_32F"),
    ("float32", "tf32", "HIP_R_32F", "HIPBLAS_COMPUTE_32F_FAST_TF32"),
    ("float16", "ieee", "HIP_R_16F", "HIPBLAS_COMPUTE_32F"),
    ("bfloat16", "ieee", "HIP_R_16BF", "HIPBLAS_COMPUTE_32F"),
])
@pytest.mark.parametrize(("epilogue", "member"), [
    ("none", "HIPBLASLT_EPILOGUE_DEFAULT"), ("bias", "HIPBLASLT_EPILOGUE_BIAS"), ("relu", "HIPBLASLT_EPILOGUE_RELU"),
    ("bias_relu", "HIPBLASLT_EPILOGUE_RELU_BIAS"), ("gelu", "HIPBLASLT_EPILOGUE_GELU"),
    ("bias_gelu", "HIPBLASLT_EPILOGUE_GELU_BIAS"),
])
def test_gemm_types_map_to_hipblaslt_enums(dtype, precision, data, compute, epilogue, member):
    lt = real_hipblaslt()
    enums = blas.Enums.installed()
    routine = Gemm(dtype, epilogue, precision)
    assert blas.unsupported(lt, enums, routine) is None
    types = blas.types_of(lt, enums, routine)
    assert (types.data.name, types.scale.name, types.compute.name, types.epilogue.name) == (
        data, "HIP_R_32F", compute, member)
    assert types.epilogue is getattr(lt.hipblasLtEpilogue_t, member)


def test_float64_and_a_missing_xf32_are_unsupported_with_the_reason():
    lt = real_hipblaslt()
    enums = blas.Enums.installed()
    assert "no float64 GEMM" in blas.unsupported(lt, enums, Gemm("float64"))

    class NoFastCompute:
        HIPBLAS_COMPUTE_32F = 2

    older = blas.Enums(enums.data_type, NoFastCompute, enums.operation)
    assert blas.unsupported(lt, older, Gemm("float32")) is None
    assert "HIPBLAS_COMPUTE_32F_FAST_TF32" in blas.unsupported(lt, older, Gemm("float32", precision="tf32"))


# -- the calls, recorded ---------------------------------------------------------------------------------------


class FakeHipblasLt:
    """Answers hipBLASLt's calls as the library would and records them as (name, arguments), with the
    values behind attribute buffers and scalars read at call time. Handles are small ints."""

    def __init__(self, real, *, convert: bool = False, statuses: dict[str, str] | None = None,
                 results: list[tuple[int, str]] | None = None) -> None:
        self.real = real
        self.convert = convert
        self.statuses = statuses or {}
        #: The heuristic's answer: (workspace bytes, state) per algorithm.
        self.results = [(0, "HIPBLAS_STATUS_SUCCESS"), (4096, "HIPBLAS_STATUS_SUCCESS")] if results is None else results
        self.calls: list[tuple[str, tuple]] = []
        self._handles = itertools.count(0x100)
        for name in ("hipblasLtEpilogue_t", "hipblasLtMatmulDescAttributes_t", "hipblasLtMatrixLayoutAttribute_t",
                     "hipblasLtMatmulPreferenceAttributes_t", "hipblasLtMatmulHeuristicResult_t", "hipblasStatus_t"):
            setattr(self, name, getattr(real, name))
        for name in ("hipblasLtCreate", "hipblasLtGetVersion", "hipblasLtMatmulDescCreate",
                     "hipblasLtMatmulDescDestroy", "hipblasLtMatmulDescSetAttribute", "hipblasLtMatrixLayoutCreate",
                     "hipblasLtMatrixLayoutDestroy", "hipblasLtMatrixLayoutSetAttribute",
                     "hipblasLtMatmulPreferenceCreate", "hipblasLtMatmulPreferenceDestroy",
                     "hipblasLtMatmulPreferenceSetAttribute", "hipblasLtMatmulAlgoGetHeuristic", "hipblasLtMatmul"):
            setattr(self, name, self._function(name))

    def _function(self, name: str):
        answer = getattr(self, "_" + name)

        def function(*args):
            inspect.signature(getattr(self.real, name)).bind(*args)  # the real function's parameters
            if self.convert:
                with pytest.raises(RuntimeError, match="libhipblaslt"):  # not TypeError: every argument converted
                    getattr(self.real, name)(*args)
            self.calls.append((name, args))
            status = getattr(self.hipblasStatus_t, self.statuses.get(name, "HIPBLAS_STATUS_SUCCESS"))
            return (status, *answer(*args))

        function.__name__ = name
        return function

    def named(self, name: str) -> list[tuple]:
        return [args for call, args in self.calls if call == name]

    def attributes(self, name: str, target) -> dict:
        """{attribute name: value} set on ``target`` by ``name`` (hipblasLt...SetAttribute)."""
        return {attribute.name: value for handle, attribute, value, _ in self.named(name) if handle == target}

    # The calls' answers (the values after the status); attribute values are read now, as the library does.
    def _hipblasLtCreate(self):
        return (next(self._handles),)

    def _hipblasLtGetVersion(self, handle):
        return (100401,)

    def _hipblasLtMatmulDescCreate(self, compute, scale):
        return (next(self._handles),)

    def _hipblasLtMatrixLayoutCreate(self, data_type, rows, cols, ld):
        return (next(self._handles),)

    def _hipblasLtMatmulPreferenceCreate(self):
        return (next(self._handles),)

    def _set_attribute(self, target, attribute, buffer, size):
        self.calls[-1] = (self.calls[-1][0], (target, attribute, int.from_bytes(ctypes.string_at(buffer, size),
                                                                                 "little", signed=True), size))
        return ()

    _hipblasLtMatmulDescSetAttribute = _hipblasLtMatrixLayoutSetAttribute = _set_attribute
    _hipblasLtMatmulPreferenceSetAttribute = _set_attribute

    def _destroy(self, target):
        return ()

    _hipblasLtMatmulDescDestroy = _hipblasLtMatrixLayoutDestroy = _hipblasLtMatmulPreferenceDestroy = _destroy

    def _hipblasLtMatmulAlgoGetHeuristic(self, handle, desc, a, b, c, d, preference, requested, array):
        size = self.hipblasLtMatmulHeuristicResult_t().c_sizeof()
        for i, (workspace, state) in enumerate(self.results[:requested]):
            result = self.hipblasLtMatmulHeuristicResult_t.fromObj(array + i * size)
            ctypes.memset(array + i * size, 0xA0 + i, 16)  # the algorithm's opaque data: which one it is
            result.workspaceSize = workspace
            result.state = getattr(self.hipblasStatus_t, state)
        return (len(self.results[:requested]),)

    def _hipblasLtMatmul(self, handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo,
                         workspace, size, stream):
        scalars = (np.frombuffer(ctypes.string_at(alpha, 4), np.float32)[0],
                   np.frombuffer(ctypes.string_at(beta, 4), np.float32)[0])
        self.calls[-1] = ("hipblasLtMatmul", (*self.calls[-1][1], scalars, ctypes.string_at(algo, 1)[0]))
        return ()


def backend_over(fake: FakeHipblasLt) -> blas.HipblasLt:
    return blas.HipblasLt(fake, blas.Enums.installed())


def fake(**options) -> FakeHipblasLt:
    return FakeHipblasLt(real_hipblaslt(), **options)


def test_the_backend_is_named_with_the_librarys_version():
    backend = backend_over(fake())
    assert backend.name == "hipBLASLt 1.4.1"
    assert backend.handle == 0x100


@pytest.mark.parametrize("transpose_a,transpose_b,batch", list(itertools.product([False, True], [False, True], [1, 3])))
def test_candidates_describe_the_column_major_problem(transpose_a, transpose_b, batch):
    lt = fake(convert=True) if not real_hipblaslt().has_symbol("hipblasLtCreate") else fake()
    backend = backend_over(lt)
    m, n, k = 5, 4, 3
    shape = GemmShape.of(Gemm.constants_for(m, n, k, batch, transpose_a=transpose_a, transpose_b=transpose_b))
    plans = backend.candidates(Gemm("float16"), shape, (256, 256, 256))
    problem = gemm.column_major(shape)
    (compute, scale), = lt.named("hipblasLtMatmulDescCreate")
    assert (compute.name, scale.name) == ("HIPBLAS_COMPUTE_32F", "HIP_R_32F")
    layouts = lt.named("hipblasLtMatrixLayoutCreate")
    assert [(t.name, rows, cols, ld) for t, rows, cols, ld in layouts] == [
        ("HIP_R_16F", rows, cols, ld) for rows, cols, ld, _ in (problem.x, problem.y, problem.d)]
    handles = [0x102, 0x103, 0x104]  # after the library handle and the matmul descriptor
    for handle, (_, _, _, stride) in zip(handles, (problem.x, problem.y, problem.d)):
        set_on_layout = lt.attributes("hipblasLtMatrixLayoutSetAttribute", handle)
        expected = {"HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT": batch,
                    "HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET": stride} if batch > 1 else {}
        assert set_on_layout == expected
    op = {False: 111, True: 112}  # HIPBLAS_OP_N, HIPBLAS_OP_T: X is B's memory, Y is A's
    assert lt.attributes("hipblasLtMatmulDescSetAttribute", 0x101) == {
        "HIPBLASLT_MATMUL_DESC_TRANSA": op[transpose_b], "HIPBLASLT_MATMUL_DESC_TRANSB": op[transpose_a],
        "HIPBLASLT_MATMUL_DESC_EPILOGUE": int(lt.hipblasLtEpilogue_t.HIPBLASLT_EPILOGUE_DEFAULT)}
    (heuristic,) = lt.named("hipblasLtMatmulAlgoGetHeuristic")
    assert heuristic[:7] == (0x100, 0x101, *handles, handles[2], 0x105) and heuristic[7] == blas.CANDIDATES
    assert lt.attributes("hipblasLtMatmulPreferenceSetAttribute", 0x105) == {
        "HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES": blas.WORKSPACE_LIMIT}
    assert lt.named("hipblasLtMatmulPreferenceDestroy") == [(0x105,)]
    assert [plan.workspace_size for plan in plans] == [0, 4096] and {plan.kind for plan in plans} == {"hipblasLt"}

    plans[1].run([0xC000, 0xA000, 0xB000], 0xF000, 8192, 0x5)
    (call,) = lt.named("hipblasLtMatmul")
    handle, desc, alpha, b, x, a, y, beta, c, d_in, d, d_out, algo, work, work_size, stream, scalars, algo_id = call
    assert (handle, desc, b, x, a, y, c, d_in, d, d_out) == (0x100, 0x101, 0xB000, handles[0], 0xA000, handles[1],
                                                           0xC000, handles[2], 0xC000, handles[2])
    assert scalars == (1.0, 0.0) and algo_id == 0xA1  # the second algorithm the heuristic gave
    assert (work, work_size, stream) == (0xF000, 8192, 0x5)  # the call's own workspace, on the given stream


@pytest.mark.parametrize("epilogue", list(blas.EPILOGUES))
def test_epilogue_and_the_bias_pointer_of_each_call(epilogue):
    lt = fake()
    backend = backend_over(lt)
    routine = Gemm("bfloat16", epilogue)
    shape = GemmShape.of(Gemm.constants_for(64, 32, 16))
    plan = backend.plan(routine, shape, [0x10000, 0x20000, 0x30000, 0x40000])
    set_on_desc = lt.attributes("hipblasLtMatmulDescSetAttribute", 0x101)
    assert set_on_desc["HIPBLASLT_MATMUL_DESC_EPILOGUE"] == int(getattr(lt.hipblasLtEpilogue_t,
                                                                        blas.EPILOGUES[epilogue]))
    if routine.has_bias:
        assert set_on_desc["HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE"] == 14  # HIP_R_16BF: the Gemm's own type
    else:
        assert "HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE" not in set_on_desc
    before = len(lt.calls)
    for bias in (0x40000, 0x50000):
        backend.enqueue(plan, (), [0x10000, 0x20000, 0x30000, bias], 0x60000, plan.workspace_size, 9)
    issued = [(name, args) for name, args in lt.calls[before:]]
    if routine.has_bias:  # the bias pointer is set on the descriptor right before each call
        assert [name for name, _ in issued] == ["hipblasLtMatmulDescSetAttribute", "hipblasLtMatmul"] * 2
        assert [args[2] for name, args in issued if name != "hipblasLtMatmul"] == [0x40000, 0x50000]
        assert issued[0][1][1].name == "HIPBLASLT_MATMUL_DESC_BIAS_POINTER"
    else:
        assert [name for name, _ in issued] == ["hipblasLtMatmul"] * 2


def test_results_the_heuristic_marks_failed_are_not_candidates():
    lt = fake(results=[(0, "HIPBLAS_STATUS_NOT_SUPPORTED"), (512, "HIPBLAS_STATUS_SUCCESS")])
    plans = backend_over(lt).candidates(Gemm("float32"), GemmShape.of(Gemm.constants_for(8, 8, 8)), (256,) * 3)
    assert [plan.workspace_size for plan in plans] == [512]


@pytest.mark.parametrize("options", [{"results": []},
                                     {"statuses": {"hipblasLtMatmulAlgoGetHeuristic": "HIPBLAS_STATUS_NOT_SUPPORTED"}}])
def test_no_algorithm_is_unimplemented_and_frees_the_descriptors(options):
    lt = fake(**options)
    backend = backend_over(lt)
    with pytest.raises(hal.UnimplementedError, match="hipBLASLt 1.4.1 has no algorithm"):
        backend.plan(Gemm("float32", precision="tf32"), GemmShape.of(Gemm.constants_for(8, 8, 8)), [256, 512, 768])
    assert lt.named("hipblasLtMatrixLayoutDestroy") == [(0x102,), (0x103,), (0x104,)]
    assert lt.named("hipblasLtMatmulDescDestroy") == [(0x101,)]
    assert lt.named("hipblasLtMatmulPreferenceDestroy") == [(0x105,)]


def test_a_failing_call_raises_the_typed_error_and_frees_what_it_made():
    lt = fake(statuses={"hipblasLtMatrixLayoutCreate": "HIPBLAS_STATUS_ALLOC_FAILED"})
    with pytest.raises(hal.ResourceExhaustedError, match="hipblasLtMatrixLayoutCreate failed") as err:
        backend_over(lt).candidates(Gemm("float32"), GemmShape.of(Gemm.constants_for(8, 8, 8)), (256,) * 3)
    assert err.value.api_function == "hipblasLtMatrixLayoutCreate"
    assert lt.named("hipblasLtMatmulDescDestroy") == [(0x101,)]


def test_a_failing_matmul_is_a_typed_error():
    lt = fake(statuses={"hipblasLtMatmul": "HIPBLAS_STATUS_INVALID_VALUE"})
    backend = backend_over(lt)
    plan = backend.candidates(Gemm("float32"), GemmShape.of(Gemm.constants_for(8, 8, 8)), (256,) * 3)[0]
    with pytest.raises(hal.InvalidArgumentError, match="hipblasLtMatmul failed: HIPBLAS_STATUS_INVALID_VALUE"):
        plan.run([0x1000, 0x2000, 0x3000], 0, 0, 0)


def test_supports_names_the_reason():
    backend = backend_over(fake())
    assert backend.supports(Gemm("float32", "bias_gelu", "tf32")) is None
    assert "float64" in backend.supports(Gemm("float64"))

    class NotAGemm(Routine):
        pass

    assert "not a routine of hipBLASLt" in backend.supports(NotAGemm())


def test_load_makes_the_device_current_and_keeps_one_backend_per_ordinal(monkeypatch, fresh_load):
    lt = fake()
    monkeypatch.setattr(sys.modules["hip"], "hipblaslt", lt)

    class Api:
        activated: list = []

        def activate(self, context):
            self.activated.append(context)

    api = Api()
    backend = blas.load(1, api)
    assert isinstance(backend, blas.HipblasLt) and backend.api is api and api.activated == [1]
    assert blas.load(1, api) is backend and len(lt.named("hipblasLtCreate")) == 1
