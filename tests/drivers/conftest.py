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


@pytest.fixture
def fresh_library(monkeypatch):
    """``fresh_library(module)``: the module's vendor library (``module.LIBRARY``) as in a new process,
    no backend made and no reason reported yet, for this test."""
    from hal.drivers.gpu.library import VendorLibrary

    def fresh(module) -> None:
        library = module.LIBRARY
        monkeypatch.setattr(module, "LIBRARY", VendorLibrary(library.driver, library.name, library.consequence))

    return fresh
