"""Registers the ``cuda`` driver without importing it (nor cuda.bindings)."""

from hal.registry import DriverFactory, hookimpl

SUMMARY = "NVIDIA GPUs through the CUDA driver API (cuda.bindings) and NVRTC"


def _load():
    from hal.drivers.cuda.driver import CudaDriver

    return CudaDriver()


@hookimpl
def hal_register_drivers():
    return [DriverFactory("cuda", SUMMARY, _load, 100)]
