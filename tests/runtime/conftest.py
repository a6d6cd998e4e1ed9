"""Runtime tests run on every CPU driver, and on cuda where hal.list_drivers() reports it available."""

from __future__ import annotations

import contextlib
import importlib

import pytest
from rt_helpers import DEVICES

import hal
import runtime as rt
from runtime.device import context_for
from runtime.lowering import evaluate, record


@pytest.fixture(params=DEVICES, scope="module")
def dev(request) -> str:
    """A device URI (also made the default device); tests create arrays on it explicitly."""
    rt.set_default_device(request.param)
    return request.param


@pytest.fixture(scope="module", params=["numpy", "cuda-emulated"])
def gpu_like(request):
    """A local-sync device lowered as a GPU, its kernels the generated CUDA C compiled for the CPU
    (cuda_emu) or their numpy implementations (the fusion tests)."""
    cuda_emu = pytest.importorskip("cuda_emu")
    if request.param == "cuda-emulated" and cuda_emu.GXX is None:
        pytest.skip("g++ is needed to emulate the CUDA kernels")
    context_for("local-sync")  # the URI's shared device (hal.open_device) stays a CPU-lowered one
    device = hal.create_device("local-sync")
    context_for(device).is_gpu = True
    try:
        with cuda_emu.emulated_kernels() if request.param == "cuda-emulated" else contextlib.nullcontext():
            yield device
    finally:
        device.close()


@pytest.fixture
def recordings(monkeypatch):
    """The recordings made while the test runs."""
    made = []
    real = record.record

    def spy(*args, **kwargs):
        rec = real(*args, **kwargs)
        made.append(rec)
        return rec

    for caller in (evaluate, importlib.import_module("runtime.compile")):  # (rt.compile is the function)
        monkeypatch.setattr(caller, "record", spy)
    return made
