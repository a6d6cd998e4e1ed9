"""``local-task``: each queue is a worker thread; ``queue_execute`` returns before the work runs."""

from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Callable
from typing import Any

from hal.driver import DeviceInfo
from hal.drivers.local.device import LocalDevice
from hal.drivers.local.driver import LocalDriver
from hal.errors import InvalidArgumentError
from hal.validation import check_int

_STOP = object()


class _Worker:
    """A daemon thread running ready submissions of one queue in the order they became ready."""

    def __init__(self, name: str) -> None:
        self.inbox: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            run = self.inbox.get()
            if run is _STOP:
                return
            run()


class LocalTaskDevice(LocalDevice):
    def __init__(self, driver, info, *, queue_count: int = 1) -> None:
        super().__init__(driver, info, queue_count=queue_count)
        self._workers = [_Worker(f"hal-local-task-q{i}") for i in range(queue_count)]

    def _schedule(self, queue: int, run: Callable[[], None]) -> None:
        self._workers[queue].inbox.put(run)

    def _close(self) -> None:
        for worker in self._workers:
            worker.inbox.put(_STOP)
        for worker in self._workers:
            if worker.thread is not threading.current_thread():
                worker.thread.join(timeout=5)


class LocalTaskDriver(LocalDriver):
    name = "local-task"
    summary = "CPU, one worker thread per queue (asynchronous)"
    worker_threads = 1

    def _create_device(self, info: DeviceInfo, **options: Any) -> LocalTaskDevice:
        queue_count = check_int(options.pop("queue_count", 1), "queue_count", minimum=1)
        if options:
            raise InvalidArgumentError(f"unknown local-task device options {sorted(options)}; known: ['queue_count']")
        return LocalTaskDevice(self, info, queue_count=queue_count)
