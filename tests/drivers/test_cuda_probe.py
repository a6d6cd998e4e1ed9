"""The cuda availability probe against simulated driver libraries (every reason it reports)."""

from __future__ import annotations

import enum

import pytest

from hal.drivers.cuda.driver import MIN_DRIVER_VERSION, probe
from hal.drivers.cuda.status import CUDA


class Code(enum.IntEnum):
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_INSUFFICIENT_DRIVER = 35
    CUDA_ERROR_UNKNOWN = 999


class FakeShim:
    def __init__(self, init_error=None, version=13000, count=1):
        self.init_error = init_error
        self.version = version
        self.count = count

    def init(self):
        if isinstance(self.init_error, Code):
            raise CUDA.error(self.init_error, "cuInit")
        if self.init_error is not None:
            raise self.init_error

    def driver_version(self):
        return self.version

    def device_count(self):
        return self.count


def test_available_with_a_device():
    assert probe(lambda: FakeShim()) == (True, None)


def test_bindings_not_installed():
    def missing():
        raise ImportError("No module named 'cuda'")

    ok, reason = probe(missing)
    assert not ok and "cuda-bindings is not installed" in reason


def test_driver_library_missing():
    class DynamicLibNotFoundError(RuntimeError):
        pass

    ok, reason = probe(lambda: FakeShim(DynamicLibNotFoundError('"cuda" is an NVIDIA driver library')))
    assert not ok
    assert "libcuda" in reason and "DynamicLibNotFoundError" in reason


@pytest.mark.parametrize(("code", "words"), [
    (Code.CUDA_ERROR_NO_DEVICE, "no CUDA device"),
    (Code.CUDA_ERROR_INSUFFICIENT_DRIVER, "too old"),
    (Code.CUDA_ERROR_UNKNOWN, "cuInit failed"),
])
def test_cuinit_failures(code, words):
    ok, reason = probe(lambda: FakeShim(code))
    assert not ok
    assert words in reason and code.name in reason


def test_old_driver():
    ok, reason = probe(lambda: FakeShim(version=MIN_DRIVER_VERSION - 10))
    assert not ok and "or newer" in reason


def test_no_devices():
    ok, reason = probe(lambda: FakeShim(count=0))
    assert not ok and "0 devices" in reason
