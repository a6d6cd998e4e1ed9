"""Helpers of the driver-specific tests: the simulated GPU driver, registered for these tests."""

from __future__ import annotations

import pytest

import hal


def cuda_available() -> bool:
    info = {i.name: i for i in hal.list_drivers()}.get("cuda")
    return bool(info and info.available)


@pytest.fixture
def fake_driver():
    """A fresh simulated-GPU driver (its own API object, so a fault stays in this test)."""
    from .fake_gpu import FakeGpuDriver

    return FakeGpuDriver()


@pytest.fixture
def fake_device(fake_driver):
    dev = fake_driver.create_device()
    yield dev
    dev.close()
