"""Fixtures of the conformance suite.

Driver selection (--driver, --driver-option, HAL_CTS_DRIVERS, --run-fault-tests)
and the `device` / `make_device` fixtures live in plugin.py, loaded before the
command line is parsed: by tests/conftest.py in the repository (shared with the
differential tests), by ``python -m hal_cts`` for the installed suite. This file
adds what only the CTS needs.
"""

from __future__ import annotations

import pytest

import hal

from .kernels import load_kernels

RUN_INSTALLED = "python -m hal_cts --driver NAME [pytest options]"


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--driver", default=None) is None:  # pytest --pyargs hal_cts, without the plugin
        raise pytest.UsageError(f"the conformance suite needs its driver-selection plugin: run {RUN_INSTALLED}")


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
