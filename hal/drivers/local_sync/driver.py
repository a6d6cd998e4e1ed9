"""``local-sync``: submissions run on the thread that submits them, or that reaches their last wait.

Deferred work released by a host ``signal()`` runs inside that call
(``hal.submission.run_inline``: nested releases become a loop, not a recursion).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hal.driver import DeviceInfo
from hal.drivers.local.device import LocalDevice
from hal.drivers.local.driver import LocalDriver
from hal.submission import run_inline


class LocalSyncDevice(LocalDevice):
    def _schedule(self, queue: int, run: Callable[[], None]) -> None:
        run_inline(run)


class LocalSyncDriver(LocalDriver):
    name = "local-sync"
    summary = "CPU, executes inline at submit (reference semantics)"

    def _create_device(self, info: DeviceInfo, **options: Any) -> LocalSyncDevice:
        if options:
            from hal.errors import InvalidArgumentError

            raise InvalidArgumentError(f"local-sync takes no device options, got {sorted(options)}")
        return LocalSyncDevice(self, info)
