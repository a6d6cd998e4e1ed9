"""GEMM planning of the GPU drivers (hal/drivers/gpu/gemm.py) and the CUDA backend's loading, without a GPU."""

from __future__ import annotations

import itertools
import logging
import sys

import numpy as np
import pytest

import hal
from hal.drivers.gpu import gemm
from hal.library import GemmShape


def column_major_view(memory: np.ndarray, rows: int, cols: int, ld: int, stride: int, batch: int) -> np.ndarray:
    size = memory.itemsize
    return np.lib.stride_tricks.as_strided(memory, (batch, rows, cols), (stride * size, size, ld * size))


@pytest.mark.parametrize("transpose_a,transpose_b,batch", list(itertools.product([False, True], [False, True], [1, 3])))
def test_column_major_mapping_computes_the_row_major_product(transpose_a, transpose_b, batch):
    """D = op(X) op(Y) on the column-major views of B's, A's and C's memory is C = op(A) op(B)."""
    rng = np.random.default_rng(0)
    m, n, k = 5, 4, 3
    shape = GemmShape.of(hal.Gemm.constants_for(m, n, k, batch, transpose_a=transpose_a, transpose_b=transpose_b))
    a_memory, b_memory = rng.random(batch * m * k), rng.random(batch * k * n)
    a = a_memory.reshape(batch, k, m).transpose(0, 2, 1) if transpose_a else a_memory.reshape(batch, m, k)
    b = b_memory.reshape(batch, n, k).transpose(0, 2, 1) if transpose_b else b_memory.reshape(batch, k, n)
    problem = gemm.column_major(shape)
    x = column_major_view(b_memory, *problem.x, batch)
    y = column_major_view(a_memory, *problem.y, batch)
    x = x.transpose(0, 2, 1) if problem.transpose_x == gemm.OP_T else x
    y = y.transpose(0, 2, 1) if problem.transpose_y == gemm.OP_T else y
    c_memory = np.zeros(batch * m * n)
    column_major_view(c_memory, *problem.d, batch)[...] = x @ y
    np.testing.assert_allclose(c_memory.reshape(batch, m, n), a @ b)


@pytest.mark.parametrize("pointer,counts,expected", [
    (0x1000, (64, 4096), 256), (0x1004, (64,), 4), (0x1000, (3,), 4), (0x1010, (8,), 16), (0x1000, (), 256),
    (0x1000, (0,), 256),
])
def test_alignment_is_the_largest_power_of_two_dividing_address_and_strides(pointer, counts, expected):
    assert gemm.alignment(pointer, *counts, element_size=4) == expected


class TimedApi:
    """The calls ``fastest`` makes, with each candidate's time per run set by the test: the time
    between two events is that of the graph launched between them (its captured runs)."""

    def __init__(self, times: dict) -> None:
        self.times = times
        self.running = None
        self.allocated: list[int] = []
        self.freed: list[int] = []
        self.next = 0x10000
        self.capturing = False
        self.captured: list[str] = []
        self.graphs: list[tuple] = []
        self.destroyed: list[tuple] = []
        self.since_event: list[tuple] = []

    def stream_begin_capture(self, stream):
        self.capturing, self.captured = True, []

    def stream_end_capture(self, stream):
        self.capturing = False
        graph = ("graph", tuple(self.captured))
        self.graphs.append(graph)
        return graph

    def graph_instantiate(self, graph):
        return ("exec", graph[1])

    def graph_launch(self, graph_exec, stream):
        self.since_event.append(graph_exec)

    def graph_exec_destroy(self, graph_exec):
        self.destroyed.append(graph_exec)

    def graph_destroy(self, graph):
        self.destroyed.append(graph)

    def mem_alloc(self, size):
        self.next += 1 << 20
        self.allocated.append(self.next)
        return self.next

    def mem_free(self, ptr):
        self.freed.append(ptr)

    def stream_create(self):
        return 7

    def stream_destroy(self, stream):
        pass

    def stream_synchronize(self, stream):
        pass

    def timing_event_create(self):
        return object()

    def event_destroy(self, event):
        pass

    def event_record(self, event, stream):
        self.launched, self.since_event = self.since_event, []

    def event_synchronize(self, event):
        pass

    def event_elapsed_ms(self, start, end):
        return sum(self.times[kind] for _, runs in self.launched for kind in runs)


class Backend(gemm.GemmBackend):
    def __init__(self, api, kinds):
        super().__init__(api)
        self.kinds = kinds
        self.made = 0
        self.calls = []

    def candidates(self, g, shape, aligned):
        self.made += 1
        plans = []
        for kind in self.kinds:
            def run(pointers, workspace, size, stream, kind=kind):
                if kind == "broken" or (kind == "uncapturable" and self.api.capturing):
                    raise RuntimeError("this algorithm does not run")
                self.api.running = kind
                if self.api.capturing:
                    self.api.captured.append(kind)
                self.calls.append((kind, *pointers[:3], workspace))
            plans.append(gemm.Plan(run, 0, [], kind))
        return plans


def test_the_fastest_candidate_is_kept_and_planned_once_per_shape_and_alignment():
    api = TimedApi({"slow": 5.0, "fast": 1.0, "middle": 2.0})
    backend = Backend(api, ["slow", "broken", "fast", "middle"])
    routine = hal.Gemm("float32")
    shape = GemmShape.of(hal.Gemm.constants_for(512, 512, 512))
    assert backend.plan(routine, shape, [0x100000, 0x200000, 0x300000]).kind == "fast"
    assert backend.plan(routine, shape, [0x400000, 0x500000, 0x600000]).kind == "fast"
    assert backend.made == 1  # the same shape and alignment: the cached plan
    assert sorted(api.freed) == sorted(api.allocated)  # the scratch operands went back
    tuned = [call for call in backend.calls if call[0] == "fast"]
    assert all(call[1] not in (0x100000, 0x400000) for call in tuned), "timed on the caller's operands"
    backend.plan(routine, shape, [0x100004, 0x200000, 0x300000])  # another alignment of C: planned again
    assert backend.made == 2


@pytest.mark.parametrize("size,runs", [(256, gemm.TUNE_MAX_RUNS), (1024, 3), (4096, gemm.TUNE_RUNS)])
def test_candidates_are_timed_by_their_graph_of_runs_and_one_that_cannot_be_captured_is_no_choice(size, runs):
    """Each candidate is timed as the launch of a graph of its runs (the host's cost per call left
    out), as many runs as the product's size asks; the graphs are destroyed."""
    api = TimedApi({"slow": 5.0, "uncapturable": 0.1, "fast": 1.0})
    backend = Backend(api, ["slow", "uncapturable", "fast"])
    shape = GemmShape.of(hal.Gemm.constants_for(size, size, size))
    assert gemm.tune_runs(shape) == runs
    assert backend.plan(hal.Gemm("float32"), shape, [0x100000, 0x200000, 0x300000]).kind == "fast"
    assert [graph[1] for graph in api.graphs] == [("slow",) * runs, (), ("fast",) * runs]
    assert sorted(api.destroyed) == sorted(api.graphs + [("exec", g[1]) for g in api.graphs if g[1]])
    assert not api.capturing


def test_small_products_take_the_first_candidate_untimed():
    api = TimedApi({"slow": 5.0, "fast": 1.0})
    backend = Backend(api, ["slow", "fast"])
    plan = backend.plan(hal.Gemm("float32"), GemmShape.of(hal.Gemm.constants_for(8, 8, 8)), [256, 512, 768])
    assert plan.kind == "slow" and not backend.calls


def test_no_candidate_is_unimplemented():
    backend = Backend(None, [])
    with pytest.raises(hal.UnimplementedError, match="no algorithm"):
        backend.plan(hal.Gemm("float32"), GemmShape.of(hal.Gemm.constants_for(8, 8, 8)), [256, 512, 768])


def test_without_nvmath_the_cuda_backend_is_absent_and_says_why_once(monkeypatch, caplog, fresh_library):
    from hal.drivers.cuda import blas

    for name in ("nvmath", "nvmath.bindings", "nvmath.bindings.cublasLt", "nvmath.bindings.cublas"):
        monkeypatch.setitem(sys.modules, name, None)  # (also where nvmath was imported before): ImportError
    fresh_library(blas)
    with caplog.at_level(logging.WARNING, logger="hal"):
        assert blas.load(0) is None
        assert blas.load(1) is None
    warnings = [r for r in caplog.records if "cuBLASLt is unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "own kernels" in warnings[0].getMessage()


def test_cublaslt_loads_at_the_first_routine_and_a_failure_refuses_routines_with_the_reason(monkeypatch, caplog,
                                                                                          fresh_library):
    from types import SimpleNamespace

    from hal.drivers.cuda import blas
    from hal.drivers.gpu.library import DeferredBackend

    fresh_library(blas)
    created = []
    working = SimpleNamespace(get_version=lambda: 130100, create=lambda: created.append(1) or 7)
    deferred = DeferredBackend("cuBLASLt", lambda: blas.CublasLt(working, None, None), blas.LIBRARY.report)
    assert not created and deferred.name == "cuBLASLt"  # nothing loaded with the device
    assert deferred.supports(hal.Gemm("float32")) is None
    assert created == [1] and deferred.name == "cuBLASLt 13.1.0"

    def missing():
        raise OSError("libcublasLt.so.13: cannot open shared object file")

    absent = SimpleNamespace(get_version=missing, create=lambda: 0)
    broken = DeferredBackend("cuBLASLt", lambda: blas.CublasLt(absent, None, None), blas.LIBRARY.report)
    with caplog.at_level(logging.WARNING, logger="hal"):
        assert "libcublasLt" in broken.supports(hal.Gemm("float32"))
        assert "libcublasLt" in broken.supports(hal.Gemm("float16"))  # tried once, the same reason
    with pytest.raises(hal.UnavailableError, match="could not be loaded"):
        broken.plan(hal.Gemm("float32"), None, [0, 0, 0])
    assert sum("cuBLASLt is unavailable" in r.getMessage() for r in caplog.records) == 1


def test_every_epilogue_maps_to_a_cublaslt_epilogue():
    """Each Gemm epilogue has its cuBLASLt member (B's sums over k are cuBLASLt's BGRADA: X is B)."""
    from hal.drivers.cuda import blas as cuda_blas

    assert set(cuda_blas.EPILOGUES) == set(hal.library.GEMM_EPILOGUES)
    assert cuda_blas.EPILOGUES["bgrad_b"] == "BGRADA"
    lt = pytest.importorskip("nvmath.bindings.cublasLt")
    assert not [name for name in cuda_blas.EPILOGUES.values() if not hasattr(lt.Epilogue, name)]


def test_every_routine_dtype_maps_to_a_cuda_data_type_and_compute_type():
    """cudaDataType_t of each routine dtype (complex products: CUDA_C_32F / CUDA_C_64F, computed in
    their parts' precision with complex alpha and beta)."""
    from hal.drivers.cuda import blas as cuda_blas

    assert set(cuda_blas.DATA_TYPES) == set(hal.library.DTYPE_SIZES)
    runtime_api = pytest.importorskip("cuda.bindings.runtime")
    for dtype, name in (("float32", "CUDA_R_32F"), ("float64", "CUDA_R_64F"), ("float16", "CUDA_R_16F"),
                        ("bfloat16", "CUDA_R_16BF"), ("complex64", "CUDA_C_32F"), ("complex128", "CUDA_C_64F")):
        assert cuda_blas.DATA_TYPES[dtype] == int(getattr(runtime_api.cudaDataType, name)), dtype
    assert cuda_blas.compute_types(hal.Gemm("complex64")) == (cuda_blas.COMPUTE_32F, np.complex64)
    assert cuda_blas.compute_types(hal.Gemm("complex128")) == (cuda_blas.COMPUTE_64F, np.complex128)
    assert cuda_blas.SCALE_TYPES[np.complex64] == cuda_blas.DATA_TYPES["complex64"]
