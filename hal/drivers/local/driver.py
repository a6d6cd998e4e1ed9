"""The driver both CPU drivers share: one device, always available."""

from __future__ import annotations

import platform

from hal.driver import DeviceInfo, Driver


class LocalDriver(Driver):
    worker_threads = 0

    def _probe(self) -> tuple[bool, str | None]:
        return True, None

    def _query_devices(self) -> list[DeviceInfo]:
        from hal.drivers.local.device import local_device_properties

        name = platform.processor() or platform.machine() or "host CPU"
        return [DeviceInfo(self.name, 0, "cpu0", f"{name} ({self.name})", f"{self.name}://0",
                           local_device_properties(self.worker_threads))]
