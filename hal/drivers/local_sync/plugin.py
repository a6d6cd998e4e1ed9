"""Registers ``local-sync`` without importing it."""

from hal.registry import DriverFactory, hookimpl


def _load():
    from hal.drivers.local_sync.driver import LocalSyncDriver

    return LocalSyncDriver()


@hookimpl
def hal_register_drivers():
    return [DriverFactory("local-sync", "CPU, executes inline at submit (reference semantics)", _load, 10)]
