"""Shared helpers of the runtime tests."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import hal


def runtime_devices() -> list[str]:
    available = {info.name for info in hal.list_drivers() if info.available}
    return [name for name in ("local-sync", "local-task", "cuda") if name in available]


DEVICES = runtime_devices()


def rand(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    """Random host data of a runtime dtype's numpy type, kept in ranges every op is defined on."""
    name = str(dtype)
    if name == "bool":
        return rng.random(shape) > 0.5
    if name.startswith("uint"):
        return rng.integers(0, 11, size=shape).astype(name)
    if name.startswith("int"):
        return rng.integers(-5, 6, size=shape).astype(name)
    x = rng.standard_normal(shape)
    if name == "float64":
        return x
    x = x.astype(np.float32)
    if name == "float16":
        return x.astype(np.float16)
    return x


ALL_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
              "float64"]
TOL = {"float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2), "float64": (1e-12, 1e-12)}
TOL.update({name: (0, 0) for name in ALL_DTYPES if name[0] in "ub" or name.startswith("int")})


def simulated_gpu(libraries: bool):
    """A graph-mode device of the simulated GPU (tests/drivers/fake_gpu.py) lowered as a GPU, its
    kernels the generated CUDA C compiled for the CPU, and the context that runs them
    (``cuda_emu.emulated_kernels()``); skips without g++. ``libraries``: the numpy references of
    the library routines (GEMMs, solvers, FFTs) as its ``library`` format."""
    from runtime.device import context_for

    cuda_emu = pytest.importorskip("cuda_emu")
    if cuda_emu.GXX is None:
        pytest.skip("g++ is needed to emulate the CUDA kernels")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    fake_gpu = pytest.importorskip("drivers.fake_gpu")
    device = fake_gpu.FakeGpuDriver(libraries=libraries).create_device(command_buffer="graph")
    context_for(device).is_gpu = True
    return device, cuda_emu.emulated_kernels()


def failures_in_threads(work: Callable[[int], None], count: int,
                        timeout: float | None = None) -> list[BaseException]:
    """Run ``work(k)`` for k in range(count), each on a thread of its own, all at once; the exceptions
    they raised (the test asserts there are none). With ``timeout``, each join waits that long at most
    and a thread still running then is a failure too (a hang reported, not waited for)."""
    failures: list[BaseException] = []

    def run(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    failures.extend(AssertionError(f"{t.name} still running after {timeout} s") for t in threads if t.is_alive())
    return failures


def counting_prepares(monkeypatch, device) -> list:
    """The command-buffer count of each execution ``device.prepare`` makes from now on (a spy)."""
    prepared: list = []
    real = device.prepare

    def spy(command_buffers, binding_tables=None, **kwargs):
        prepared.append(len(command_buffers))
        return real(command_buffers, binding_tables, **kwargs)

    monkeypatch.setattr(device, "prepare", spy)
    return prepared
