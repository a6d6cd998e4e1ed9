"""Registers the ``hip`` driver without importing it (nor hip-python)."""

from importlib import import_module

from hal.registry import DriverFactory, hookimpl

SUMMARY = "AMD GPUs through HIP (hip-python) and hiprtc"


@hookimpl
def hal_register_drivers():
    # the driver module is imported only when the registry first asks for the driver
    return [DriverFactory("hip", SUMMARY, lambda: import_module("hal.drivers.hip.driver").HipDriver(), 90)]
