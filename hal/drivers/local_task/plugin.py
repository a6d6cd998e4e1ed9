"""Registers ``local-task`` without importing it."""

from hal.registry import DriverFactory, hookimpl


def _load():
    from hal.drivers.local_task.driver import LocalTaskDriver

    return LocalTaskDriver()


@hookimpl
def hal_register_drivers():
    return [DriverFactory("local-task", "CPU, one worker thread per queue (asynchronous)", _load, 50)]
