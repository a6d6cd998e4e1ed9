"""Arrays pickle as host data and their device's URI; one whose device is missing where it is unpickled
lands on the default device with a warning saying so."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import runtime as rt


def _with_missing_device(data: bytes, uri: str) -> bytes:
    """The same pickle naming a driver that does not exist (a name of the same length keeps it valid)."""
    name = uri.split("://")[0]
    return data.replace(uri.encode(), ("z" * len(name) + uri[len(name):]).encode())


def test_an_array_pickles_onto_its_own_device_without_a_warning(dev):
    x = rt.arange(5, device=dev) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = pickle.loads(pickle.dumps(x))
    assert back.device is x.device and back.dtype == x.dtype
    np.testing.assert_array_equal(back.numpy(), [0, 3, 6, 9, 12])


def test_an_array_whose_device_is_missing_warns_and_lands_on_the_default(dev):
    x = rt.arange(4, device=dev).astype(rt.float32)
    data = _with_missing_device(pickle.dumps(x), x.device.info.uri)
    with pytest.warns(rt.DeviceFallbackWarning, match="is not usable here.*the default device") as record:
        back = pickle.loads(data)
    assert "zzzz" in str(record[0].message)
    assert back.device is rt.default_device() and back.dtype == rt.float32
    np.testing.assert_array_equal(back.numpy(), [0, 1, 2, 3])
    with warnings.catch_warnings():  # and the warnings filter makes it an error, for those who want one
        warnings.simplefilter("error", rt.DeviceFallbackWarning)
        with pytest.raises(rt.DeviceFallbackWarning):
            pickle.loads(data)
