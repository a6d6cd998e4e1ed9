"""Registers the ``hip`` driver without importing it (nor hip-python)."""

from hal.registry import DriverFactory, hookimpl

SUMMARY = "AMD GPUs through HIP (hip-python) and hiprtc"


def _load():
    from hal.drivers.hip.driver import HipDriver

    return HipDriver()


@hookimpl
def hal_register_drivers():
    return [DriverFactory("hip", SUMMARY, _load, 90)]
