"""The CUDA driver's cuFFT backend (hal/drivers/cuda/fft.py) without a GPU: its loading, the plan
arguments of each routine, and its calls, made to a stand-in for ``nvmath.bindings.cufft`` that
computes what cuFFT documents (its advanced data layout, its unnormalized transforms, C2R
overwriting its input) on the simulated GPU's memory, in stream order or captured."""

from __future__ import annotations

import ctypes
import enum
import itertools
import logging
import sys

import numpy as np
import pytest

import hal
from hal.drivers.cuda import fft as cuda_fft
from hal.drivers.gpu import fft as gpu_fft
from hal.drivers.gpu.library import DeferredBackend, LibraryBackends
from hal.library_fft import FftShape, side_lengths

from .fake_gpu import FakeGpuDriver, _Stream


class CufftType(enum.IntEnum):
    """cufftType's values (cufft.h), as nvmath's ``cufft.Type``."""

    R2C = 0x2A
    C2R = 0x2C
    C2C = 0x29
    D2Z = 0x6A
    Z2D = 0x6C
    Z2Z = 0x69


TYPE_DTYPES = {CufftType.C2C: ("complex64", "complex64"), CufftType.Z2Z: ("complex128", "complex128"),
               CufftType.R2C: ("float32", "complex64"), CufftType.D2Z: ("float64", "complex128"),
               CufftType.C2R: ("complex64", "float32"), CufftType.Z2D: ("complex128", "float64")}
WORK = 4096


def stream_of(address: int) -> _Stream:
    return ctypes.cast(address, ctypes.py_object).value


class FakeCufft:
    """Answers nvmath's cuFFT calls as the library documents them; records (name, arguments)."""

    Type = CufftType

    def __init__(self, api, version: int = 12000) -> None:
        self.api = api
        self.version = version
        self.calls: list[tuple[str, tuple]] = []
        self.plans: dict[int, dict] = {}
        self._handles = itertools.count(1)

    def get_version(self) -> int:
        return self.version

    def create(self) -> int:
        handle = next(self._handles)
        self.plans[handle] = {"auto": 1}
        self.calls.append(("create", ()))
        return handle

    def destroy(self, handle) -> None:
        self.calls.append(("destroy", (handle,)))
        del self.plans[handle]

    def set_auto_allocation(self, handle, value) -> None:
        self.plans[handle]["auto"] = value

    def make_plan_many64(self, handle, rank, n, inembed, istride, idist, onembed, ostride, odist, type_, batch):
        assert isinstance(type_, int) and all(isinstance(v, list) for v in (n, inembed, onembed))
        assert len(n) == len(inembed) == len(onembed) == rank
        self.calls.append(("make_plan_many64", (handle, rank, n, inembed, istride, idist, onembed, ostride, odist,
                                                 type_, batch)))
        self.plans[handle].update(rank=rank, n=n, inembed=inembed, istride=istride, idist=idist, onembed=onembed,
                                  ostride=ostride, odist=odist, type=CufftType(type_), batch=batch)
        return WORK

    def set_stream(self, handle, stream) -> None:
        assert isinstance(stream, int)
        self.plans[handle]["stream"] = stream

    def set_work_area(self, handle, area) -> None:
        self.plans[handle]["work"] = area

    def _exec(self, name, handle, source, result, direction=None) -> None:
        plan = self.plans[handle]
        assert plan["auto"] == 0 and plan["work"], "a call without its own work area"
        self.calls.append((name, (handle, source, result, direction)))
        api = self.api
        api.enqueue_work(stream_of(plan["stream"]), lambda: compute(api, plan, source, result, direction))

    def exec_c2c(self, handle, source, result, direction):
        self._exec("exec_c2c", handle, source, result, direction)

    def exec_z2z(self, handle, source, result, direction):
        self._exec("exec_z2z", handle, source, result, direction)

    def exec_r2c(self, handle, source, result):
        self._exec("exec_r2c", handle, source, result)

    def exec_d2z(self, handle, source, result):
        self._exec("exec_d2z", handle, source, result)

    def exec_c2r(self, handle, source, result):
        self._exec("exec_c2r", handle, source, result)

    def exec_z2d(self, handle, source, result):
        self._exec("exec_z2d", handle, source, result)


def _cufft_view(api, pointer, dtype, rank, lengths, embed, stride, dist, batch, writable=False):
    """cuFFT's advanced layout: element (b, x) at b * dist + ((x0 * embed[1] + x1) * embed[2] + x2) * stride."""
    item = np.dtype(dtype).itemsize
    memory = np.frombuffer(api.view(pointer), np.uint8)
    elements = memory[:len(memory) // item * item].view(dtype)
    inner, step = [], stride
    for i in reversed(range(rank)):
        inner.insert(0, step)
        step *= embed[i] if i else 1
    return np.lib.stride_tricks.as_strided(elements, (batch, *lengths), [v * item for v in (dist, *inner)],
                                           writeable=writable)


def compute(api, plan, source, result, direction) -> None:
    rank, n, kind = plan["rank"], plan["n"], plan["type"]
    in_dtype, out_dtype = TYPE_DTYPES[kind]
    half = n[:-1] + [n[-1] // 2 + 1]
    in_lengths = half if kind in (CufftType.C2R, CufftType.Z2D) else n
    out_lengths = half if kind in (CufftType.R2C, CufftType.D2Z) else n
    x = _cufft_view(api, source, in_dtype, rank, in_lengths, plan["inembed"], plan["istride"], plan["idist"],
                    plan["batch"], writable=True)
    axes = tuple(range(1, rank + 1))
    if kind in (CufftType.C2C, CufftType.Z2Z):
        y = np.fft.fftn(x, axes=axes) if direction == -1 else np.fft.ifftn(x, axes=axes, norm="forward")
    elif kind in (CufftType.R2C, CufftType.D2Z):
        y = np.fft.rfftn(x, axes=axes)
    else:
        y = np.fft.irfftn(x, s=n, axes=axes, norm="forward")
        x[...] = np.nan  # C2R overwrites its input
    out = _cufft_view(api, result, out_dtype, rank, out_lengths, plan["onembed"], plan["ostride"], plan["odist"],
                      plan["batch"], writable=True)
    out[...] = y


@pytest.fixture(params=["stream", "graph"])
def device(request):
    driver = FakeGpuDriver()
    device = driver.create_device(command_buffer=request.param)
    library = FakeCufft(driver.api)
    device.executables.libraries = LibraryBackends.of({"fft": cuda_fft.Cufft(library, driver.api)})
    _Stream.__int__ = lambda self: id(self)  # the address cuFFT would get
    try:
        yield device, library
    finally:
        del _Stream.__int__
        device.close()


def draw(shape, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape)
    return (x + 1j * rng.standard_normal(shape)).astype(dtype) if np.dtype(dtype).kind == "c" else x.astype(dtype)


CASES = [("c2c", "forward", "complex64", (8, 6), 3, {}), ("c2c", "inverse", "complex128", (5,), 4, {}),
         ("r2c", "forward", "complex64", (4, 6, 5), 2, {}), ("r2c", "forward", "complex128", (9,), 3, {}),
         ("c2r", "inverse", "complex64", (6, 7), 2, {}), ("c2r", "inverse", "complex128", (3, 4, 8), 1, {}),
         ("c2c", "forward", "complex64", (4, 5), 6, {"istride": 6, "idist": 1, "ostride": 6, "odist": 1})]


@pytest.mark.parametrize("transform,direction,dtype,lengths,batch,layout", CASES)
def test_routines_run_through_cufft_calls(device, transform, direction, dtype, lengths, batch, layout):
    device, library = device
    routine = hal.Fft(transform, direction, dtype)
    exe = device.load_executable(hal.library_spec({"fft": routine}))
    constants = hal.Fft.constants_for(lengths, batch, transform=transform, **layout)
    shape = FftShape.of(constants)
    in_len, out_len = side_lengths(transform, lengths, "in"), side_lengths(transform, lengths, "out")
    x = draw((batch, *in_len), routine.input_dtype)
    if layout:  # interleaved: (lengths..., batch) in memory
        x = np.ascontiguousarray(np.moveaxis(x, 0, -1))
    out_bytes, in_bytes = (e * np.dtype(t).itemsize
                           for e, t in zip(routine.extents(shape), (routine.output_dtype, routine.input_dtype)))
    X, Y = device.allocator.allocate(in_bytes), device.allocator.allocate(out_bytes)
    device.write(X, x)
    cb = device.create_command_buffer(mode=hal.CommandBufferMode.REUSABLE, binding_capacity=2)
    with cb.record():
        cb.dispatch(exe, "fft", constants=constants, bindings=[hal.Slot(0), hal.Slot(1)])
    sem = device.create_semaphore(0)
    for step in (1, 2):
        device.queue_execute([cb], signal=[(sem, step)], binding_tables=[[Y, X]])
        sem.wait(step, timeout=10)
    data = np.moveaxis(x, -1, 0) if layout else x
    axes = tuple(range(1, len(lengths) + 1))
    expected = {"c2c": lambda: np.fft.fftn(data, axes=axes) if direction == "forward" else
                np.fft.ifftn(data, axes=axes, norm="forward"),
                "r2c": lambda: np.fft.rfftn(data, axes=axes),
                "c2r": lambda: np.fft.irfftn(data, s=lengths, axes=axes, norm="forward")}[transform]()
    y = np.frombuffer(device.read(Y), routine.output_dtype)
    y = np.moveaxis(y.reshape(*out_len, batch), -1, 0) if layout else y.reshape(batch, *out_len)
    tol = 1e-4 if dtype == "complex64" else 1e-10
    np.testing.assert_allclose(y, expected, rtol=tol, atol=tol * np.abs(expected).max())
    np.testing.assert_array_equal(np.frombuffer(device.read(X), x.dtype).reshape(x.shape), x)  # input intact
    made = [args for name, args in library.calls if name == "make_plan_many64"]
    assert len(made) == 1, "a plan is made once per routine and constants"
    rank, n, inembed, istride, idist, onembed, ostride, odist, type_, count = made[0][1:]
    assert (rank, n, count) == (len(lengths), list(lengths), batch)
    assert (inembed[1:], onembed[1:]) == (list(in_len[1:]), list(out_len[1:]))
    assert (istride, idist, ostride, odist) == (shape.istride, shape.idist, shape.ostride, shape.odist)
    assert CufftType(type_).name == gpu_fft.TYPES[transform, dtype]
    execs = [args for name, args in library.calls if name.startswith("exec_")]
    assert len(execs) == 2
    expected_direction = {"c2c": -1 if direction == "forward" else 1}.get(transform)
    assert all(d == expected_direction for *_, d in execs)


def test_plans_are_made_once_and_their_workspace_holds_a_c2r_input_copy():
    library = FakeCufft(api=None)
    backend = cuda_fft.Cufft(library)
    assert backend.name == "cuFFT 12.0.0"
    routine = hal.Fft("c2r", "inverse", "complex128")
    shape = routine.shape_of(hal.Fft.constants_for((6, 10), 3, transform="c2r"))
    plan = backend.plan(routine, shape, [0x1000, 0x2000])
    assert backend.plan(routine, shape, [0x3000, 0x4100]) is plan
    copy = 3 * 6 * 6 * 16
    assert plan.copy_bytes == copy and plan.copy_offset % gpu_fft.WORK_ALIGN == 0 and plan.copy_offset >= copy
    assert plan.workspace_size == plan.copy_offset + WORK
    assert [name for name, _ in library.calls].count("create") == 1
    forward = backend.plan(hal.Fft("c2c"), hal.Fft("c2c").shape_of(hal.Fft.constants_for((8,), 2)), [0, 0])
    assert forward.copy_bytes == 0 and forward.workspace_size == WORK
    assert "not a routine of cuFFT" in backend.supports(hal.Gemm("float32"))


def test_a_failing_plan_destroys_its_handle():
    library = FakeCufft(api=None)

    def refuse(*args):
        raise RuntimeError("CUFFT_INVALID_SIZE")

    library.make_plan_many64 = refuse
    backend = cuda_fft.Cufft(library)
    routine = hal.Fft("c2c")
    with pytest.raises(RuntimeError):
        backend.plan(routine, routine.shape_of(hal.Fft.constants_for((8,))), [0, 0])
    assert [name for name, _ in library.calls] == ["create", "destroy"]


@pytest.fixture
def fresh_load(fresh_library):
    fresh_library(cuda_fft)


def test_without_the_bindings_there_is_no_backend_and_the_reason_is_logged_once(monkeypatch, caplog, fresh_load):
    monkeypatch.setitem(sys.modules, "nvmath.bindings.cufft", None)
    with caplog.at_level(logging.WARNING, logger="hal"):
        assert cuda_fft.load(0) is None
        assert cuda_fft.load(1) is None
    warnings = [r.getMessage() for r in caplog.records if "cuFFT is unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "nvidia-cufft" in warnings[0]


def test_a_library_that_fails_to_load_refuses_fft_routines_with_the_reason(monkeypatch, caplog, fresh_load):
    class Missing:
        def get_version(self):
            raise RuntimeError("libcufft.so.12: cannot open shared object file")

    deferred = DeferredBackend("cuFFT", lambda: cuda_fft.Cufft(Missing(), None), cuda_fft.LIBRARY.report)
    assert deferred.name == "cuFFT"
    with caplog.at_level(logging.WARNING, logger="hal"):
        reason = deferred.supports(hal.Fft())
        assert deferred.supports(hal.Fft()) == reason
    assert "cuFFT could not be loaded" in reason and "libcufft" in reason
    assert len([r for r in caplog.records if "cuFFT is unavailable" in r.getMessage()]) == 1
    driver = FakeGpuDriver()
    device = driver.create_device()
    try:
        device.executables.libraries = LibraryBackends.of({"fft": deferred})
        with pytest.raises(hal.UnimplementedError, match="cuFFT could not be loaded"):
            device.load_executable(hal.library_spec({"fft": hal.Fft()}))
    finally:
        device.close()


def test_every_routine_maps_to_a_cufft_type_and_exec_of_the_bindings(fresh_load):
    cufft = pytest.importorskip("nvmath.bindings.cufft")
    deferred = cuda_fft.load(0)  # (the library itself loads at the first routine)
    assert isinstance(deferred, DeferredBackend) and cuda_fft.load(0) is deferred
    assert {name: int(getattr(cufft.Type, name)) for name in gpu_fft.TYPES.values()} == {
        t.name: int(t) for t in CufftType}
    for name, _ in cuda_fft.EXECS.values():
        assert callable(getattr(cufft, name))
    for name in ("create", "destroy", "set_auto_allocation", "make_plan_many64", "set_stream", "set_work_area",
                 "get_version"):
        assert callable(getattr(cufft, name))
