"""Runtime tests run on every CPU driver, and on cuda where hal.list_drivers() reports it available."""

from __future__ import annotations

import pytest
from rt_helpers import DEVICES

import runtime as rt


@pytest.fixture(params=DEVICES, scope="module")
def dev(request) -> str:
    """A device URI (also made the default device); tests create arrays on it explicitly."""
    rt.set_default_device(request.param)
    return request.param
