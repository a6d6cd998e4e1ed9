"""Fixtures of the conformance suite.

Driver selection (--driver, --driver-option, HAL_CTS_DRIVERS, --run-fault-tests)
and the `device` / `make_device` fixtures live in tests/conftest.py, shared
with the differential tests; this file adds what only the CTS needs.
"""

from __future__ import annotations

import pytest

import hal

from .kernels import load_kernels


@pytest.fixture
def kernels(device: hal.Device) -> hal.Executable:
    """Every CTS kernel, in the first format the device can prepare."""
    return load_kernels(device)


@pytest.fixture
def alloc(device: hal.Device):
    """allocate(size, **kwargs) on the device; buffers are released after the test."""
    buffers: list[hal.Buffer] = []

    def allocate(size: int, **kwargs) -> hal.Buffer:
        buf = device.allocator.allocate(size, **kwargs)
        buffers.append(buf)
        return buf

    yield allocate
    for buf in buffers:
        buf.release()
