"""The HIP driver's hipFFT backend without an AMD GPU or libhipfft: loading, the status mapping, and
the calls it makes, recorded by a stand-in for ``hip.hipfft`` that also passes every call through the
real hip-python function first (which converts each argument before it looks for libhipfft.so: a
wrong argument type raises TypeError there, a right one the loader's RuntimeError)."""

from __future__ import annotations

import inspect
import itertools
import logging
import sys

import numpy as np
import pytest

import hal
from hal.drivers.gpu import fft as gpu_fft
from hal.drivers.hip import fft as hip_fft
from hal.library_fft import Fft


@pytest.fixture
def fresh_load(fresh_library):
    """``fft.load`` as in a new process: no backend made, no reason reported yet."""
    fresh_library(hip_fft)


def unavailable_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "hipFFT is unavailable" in r.getMessage()]


def real_hipfft():
    pytest.importorskip("hip", reason="hip-python is not installed")
    try:
        from hip import hipfft
    except ImportError as exc:
        pytest.skip(f"hip-python's library bindings are not installed: {exc}")
    return hipfft


def without_libhipfft():
    lib = real_hipfft()
    if lib.has_symbol("hipfftCreate"):
        pytest.skip("libhipfft.so loads here: the real library would run these calls")
    return lib


def test_without_hip_python_there_is_no_backend_and_the_reason_is_logged_once(monkeypatch, caplog, fresh_load):
    monkeypatch.setitem(sys.modules, "hip", None)
    with caplog.at_level(logging.WARNING, logger="hal"):
        assert hip_fft.load(0) is None
        assert hip_fft.load(1) is None
    warnings = unavailable_warnings(caplog)
    assert len(warnings) == 1 and "libhipfft" in warnings[0]


def test_without_libhipfft_fft_routines_are_refused_with_the_loaders_reason(caplog, capfd, fresh_load):
    without_libhipfft()
    deferred = hip_fft.load(0)
    assert deferred is hip_fft.load(0) and deferred.name == "hipFFT"
    with caplog.at_level(logging.WARNING, logger="hal"):
        reason = deferred.supports(Fft())
        assert deferred.supports(Fft("r2c", "forward", "complex128")) == reason
    assert "hipFFT could not be loaded" in reason and "libhipfft" in reason
    assert len(unavailable_warnings(caplog)) == 1
    assert "Traceback" not in capfd.readouterr().err


def test_every_hipfft_result_is_mapped():
    lib = real_hipfft()
    codes = [code.name for code in lib.hipfftResult if code.name != "HIPFFT_SUCCESS"]
    assert len(codes) >= 10
    assert not [name for name in codes if name not in hip_fft.HIPFFT.classes]


@pytest.mark.parametrize(("name", "cls"), [
    ("HIPFFT_INVALID_SIZE", hal.InvalidArgumentError), ("HIPFFT_ALLOC_FAILED", hal.ResourceExhaustedError),
    ("HIPFFT_NOT_SUPPORTED", hal.UnimplementedError), ("HIPFFT_EXEC_FAILED", hal.InternalError),
    ("HIPFFT_NO_WORKSPACE", hal.FailedPreconditionError),
])
def test_a_failing_result_is_a_typed_error_naming_the_function(name, cls):
    lib = real_hipfft()
    code = getattr(lib.hipfftResult, name)
    with pytest.raises(cls) as err:
        hip_fft.check_hipfft((code,), "hipfftExecC2C")
    assert type(err.value) is cls and f"hipfftExecC2C failed: {name} ({int(code)})" in str(err.value)
    assert hip_fft.check_hipfft((lib.hipfftResult.HIPFFT_SUCCESS, 7), "hipfftGetVersion") == 7


def test_the_mapped_names_are_members_of_the_installed_bindings():
    lib = real_hipfft()
    for type_name in gpu_fft.TYPES.values():
        assert hasattr(lib.hipfftType, f"HIPFFT_{type_name}")
    for name, _ in hip_fft.EXECS.values():
        assert callable(getattr(lib, name))
    assert (lib.HIPFFT_FORWARD, lib.HIPFFT_BACKWARD) == (gpu_fft.DIRECTIONS["forward"], gpu_fft.DIRECTIONS["inverse"])


class FakeHipfft:
    """Answers hipFFT's calls as the library would, after the real function converted the arguments."""

    WORK = 8192

    def __init__(self, real) -> None:
        self.real = real
        self.calls: list[tuple[str, tuple]] = []
        self.hipfftType = real.hipfftType
        self.hipfftResult = real.hipfftResult
        self._handles = itertools.count(0x10)
        for name in ("hipfftCreate", "hipfftDestroy", "hipfftGetVersion", "hipfftSetAutoAllocation",
                     "hipfftMakePlanMany64", "hipfftSetStream", "hipfftSetWorkArea", *(n for n, _ in
                                                                                       hip_fft.EXECS.values())):
            setattr(self, name, self._function(name))

    def _function(self, name: str):
        def function(*args):
            inspect.signature(getattr(self.real, name)).bind(*args)  # the real function's parameters
            with pytest.raises(RuntimeError, match="libhipfft"):  # not TypeError: every argument converted
                getattr(self.real, name)(*args)
            self.calls.append((name, args))
            values = {"hipfftCreate": (next(self._handles),), "hipfftGetVersion": (10300,),
                      "hipfftMakePlanMany64": (self.WORK,)}.get(name, ())
            return (self.hipfftResult.HIPFFT_SUCCESS, *values)

        function.__name__ = name
        return function


class CopyingApi:
    def __init__(self) -> None:
        self.copies: list[tuple] = []

    def memcpy_dtod_async(self, dst, src, size, stream) -> None:
        self.copies.append((dst, src, size, stream))


@pytest.mark.parametrize("transform,direction,dtype,lengths,batch", [
    ("c2c", "forward", "complex64", (8, 6), 3), ("c2c", "inverse", "complex128", (5,), 2),
    ("r2c", "forward", "complex64", (4, 6, 5), 2), ("c2r", "inverse", "complex128", (6, 10), 3)])
def test_plans_and_calls_convert_through_hip_python(transform, direction, dtype, lengths, batch):
    without_libhipfft()
    lib = FakeHipfft(real_hipfft())
    api = CopyingApi()
    backend = hip_fft.Hipfft(lib, api)
    assert backend.name == "hipFFT 10300"
    routine = Fft(transform, direction, dtype)
    shape = routine.shape_of(Fft.constants_for(lengths, batch, transform=transform))
    plan = backend.plan(routine, shape, [0x10000, 0x20000])
    assert backend.plan(routine, shape, [0x30000, 0x40000]) is plan
    made = [args for name, args in lib.calls if name == "hipfftMakePlanMany64"]
    assert len(made) == 1
    handle, rank, n, inembed, istride, idist, onembed, ostride, odist, type_, count = made[0]
    assert (rank, list(n), count, type_.name) == (len(lengths), list(lengths), batch,
                                                   f"HIPFFT_{gpu_fft.TYPES[transform, dtype]}")
    assert [name for name, _ in lib.calls][1:4] == ["hipfftCreate", "hipfftSetAutoAllocation", "hipfftMakePlanMany64"]
    workspace = 0x50000
    lib.calls.clear()
    backend.enqueue(plan, (), [0x10000, 0x20000], workspace, plan.workspace_size, 77)
    names = [name for name, _ in lib.calls]
    assert names[:2] == ["hipfftSetStream", "hipfftSetWorkArea"] and names[2].startswith("hipfftExec")
    assert lib.calls[1][1][1] == workspace + plan.copy_offset
    execute = lib.calls[2][1]
    if transform == "c2r":
        assert api.copies == [(workspace, 0x20000, plan.copy_bytes, 77)] and execute[1] == workspace
        assert plan.workspace_size == plan.copy_offset + FakeHipfft.WORK
    else:
        assert api.copies == [] and execute[1] == 0x20000 and plan.workspace_size == FakeHipfft.WORK
    if transform == "c2c":
        assert execute[3] == gpu_fft.DIRECTIONS[direction]


def test_a_refused_plan_destroys_its_handle_and_raises_the_typed_error():
    without_libhipfft()
    lib = FakeHipfft(real_hipfft())
    failing = lib.hipfftMakePlanMany64

    def refuse(*args):
        failing(*args)
        return (lib.hipfftResult.HIPFFT_INVALID_SIZE,)

    refuse.__name__ = "hipfftMakePlanMany64"
    lib.hipfftMakePlanMany64 = refuse
    destroyed = []
    lib.hipfftDestroy = lambda handle: destroyed.append(handle)
    backend = hip_fft.Hipfft(lib)
    with pytest.raises(hal.InvalidArgumentError, match="hipfftMakePlanMany64"):
        backend.plan(Fft(), Fft().shape_of(Fft.constants_for((8,))), [0, 0])
    assert len(destroyed) == 1


def test_the_arguments_hip_python_takes_are_buffers_not_lists():
    """hipfftMakePlanMany64's n/inembed/onembed: hip-python converts buffers (numpy arrays), not lists."""
    lib = without_libhipfft()
    args = (0, 1, [8], [8], 1, 8, [8], 1, 8, lib.hipfftType.HIPFFT_C2C, 1)
    with pytest.raises(TypeError):
        lib.hipfftMakePlanMany64(*args)
    buffers = np.array([8], np.int64)
    with pytest.raises(RuntimeError, match="libhipfft"):
        lib.hipfftMakePlanMany64(0, 1, buffers, buffers, 1, 8, buffers, 1, 8, lib.hipfftType.HIPFFT_C2C, 1)
