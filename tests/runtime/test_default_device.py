"""The default device: set for good, or for a `with` block that restores the previous one and closes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import DEVICES

import hal
import runtime as rt
from runtime.device import context_for

CPU = [uri for uri in DEVICES if uri != "cuda"]


@pytest.fixture(autouse=True)
def _restore_default():
    before = rt.default_device()
    yield
    rt.set_default_device(before.info.uri if before.closed else before)  # (a closed device is refused)


@pytest.mark.parametrize("uri", CPU)
def test_a_scoped_default_restores_the_previous_and_closes_nothing(uri):
    outer = rt.set_default_device("local-task" if uri == "local-sync" else "local-sync").device
    with rt.set_default_device(uri) as inner:
        assert isinstance(inner, hal.Device) and rt.default_device() is inner
        x = rt.arange(4) * 2
        assert x.device is inner
    assert rt.default_device() is outer
    assert not inner.closed
    np.testing.assert_array_equal(x.numpy(), [0, 2, 4, 6])
    np.testing.assert_array_equal((rt.arange(3) + 1).numpy(), [1, 2, 3])
    assert rt.arange(1).device is outer


@pytest.mark.parametrize("uri", CPU)
def test_scopes_nest_and_an_error_inside_still_restores(uri):
    first = rt.set_default_device(uri).device
    other = "local-task" if uri == "local-sync" else "local-sync"
    with pytest.raises(ZeroDivisionError):
        with rt.set_default_device(other):
            with rt.set_default_device(uri) as again:
                assert again is first
            assert rt.default_device() is context_for(other).device
            1 / 0  # noqa: B018
    assert rt.default_device() is first


@pytest.mark.parametrize("uri", CPU)
def test_the_returned_handle_reads_as_the_device(uri):
    handle = rt.set_default_device(uri)
    assert handle.info.uri == handle.device.info.uri
    assert isinstance(handle, rt.DefaultDevice)
    assert rt.array([1.0], device=handle).device is handle.device


@pytest.mark.parametrize("uri", CPU)
def test_a_runtime_device_closed_by_its_user_is_opened_anew(uri):
    dev = rt.set_default_device(uri).device
    dev.close()
    np.testing.assert_array_equal(rt.arange(3).numpy(), [0, 1, 2])
    assert rt.default_device() is not dev and not rt.default_device().closed
    np.testing.assert_array_equal(rt.ones((2,), device=uri).numpy(), [1, 1])


def test_a_closed_device_is_refused_as_the_default_and_for_new_arrays():
    device = hal.create_device("local-task")
    device.close()
    rt.ones(2, device="local-task").numpy()  # another device is registered meanwhile
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        rt.set_default_device(device)
    with pytest.raises(hal.FailedPreconditionError, match="closed"):
        rt.ones(2, device=device)
    np.testing.assert_array_equal(rt.arange(2).numpy(), [0, 1])


@pytest.mark.parametrize("bad", [42, 1.5, b"local-task", object()])
def test_a_bad_device_argument_is_a_typed_error(bad):
    with pytest.raises(hal.InvalidArgumentError, match="device must be"):
        rt.array([1.0], device=bad)
    with pytest.raises(hal.InvalidArgumentError, match="device must be"):
        rt.set_default_device(bad)
    np.testing.assert_array_equal(rt.arange(2).numpy(), [0, 1])
