"""Helpers of the driver-specific tests: the simulated GPU driver, registered for these tests."""

from __future__ import annotations

import pytest

import hal


def cuda_available() -> bool:
    info = {i.name: i for i in hal.list_drivers()}.get("cuda")
    return bool(info and info.available)


@pytest.fixture(params=["cuda", "hip"])
def fake_driver(request):
    """A fresh simulated-GPU driver (its own API object, so a fault stays in this test), failing with
    CUDA's status conventions and again with HIP's."""
    from .fake_gpu import FakeGpuDriver

    return FakeGpuDriver(request.param)


@pytest.fixture
def fake_device(fake_driver):
    dev = fake_driver.create_device()
    yield dev
    dev.close()


def replay_device(fake_driver, monkeypatch, native: bool, **options):
    """A simulated-GPU device with the C replay, or without it (``HAL_NATIVE=0``)."""
    with monkeypatch.context() as env:
        if native:
            env.delenv("HAL_NATIVE", raising=False)
        else:
            env.setenv("HAL_NATIVE", "0")
        dev = fake_driver.create_device(**options)
    assert dev.native_replay is native
    return dev


@pytest.fixture
def pair(fake_driver, monkeypatch):
    """(device with the C replay, device without it), in graph mode."""
    native = replay_device(fake_driver, monkeypatch, True, command_buffer="graph")
    python = replay_device(fake_driver, monkeypatch, False, command_buffer="graph")
    yield native, python
    native.close()
    python.close()
