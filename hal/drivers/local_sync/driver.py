"""``local-sync``: submissions run on the thread that submits them, or that reaches their last wait.

Deferred work released by a host ``signal()`` runs inside that call. A
per-thread trampoline turns nested releases (a long chain of submissions each
waiting on the previous one) into a loop instead of a deep recursion.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from hal.driver import DeviceInfo
from hal.drivers.local.device import LocalDevice
from hal.drivers.local.driver import LocalDriver


class LocalSyncDevice(LocalDevice):
    def __init__(self, driver, info) -> None:
        super().__init__(driver, info)
        self._trampoline = threading.local()

    def _schedule(self, queue: int, run: Callable[[], None]) -> None:
        state = self._trampoline
        pending = getattr(state, "pending", None)
        if pending is not None:  # already draining on this thread: run after the current item
            pending.append(run)
            return
        state.pending = collections.deque([run])
        try:
            while state.pending:
                state.pending.popleft()()
        finally:
            state.pending = None


class LocalSyncDriver(LocalDriver):
    name = "local-sync"
    summary = "CPU, executes inline at submit (reference semantics)"

    def _create_device(self, info: DeviceInfo, **options: Any) -> LocalSyncDevice:
        if options:
            from hal.errors import InvalidArgumentError

            raise InvalidArgumentError(f"local-sync takes no device options, got {sorted(options)}")
        return LocalSyncDevice(self, info)
