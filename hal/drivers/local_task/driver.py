"""``local-task``: each queue has a worker thread; ``queue_execute`` returns before the work runs.

A host thread that waits for the device's work (``Semaphore.wait`` or ``wait_idle`` without a
timeout) runs ready submissions itself meanwhile (``queue_runner``), instead of sleeping while
the worker runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hal import interrupts
from hal.driver import DeviceInfo
from hal.drivers.local.device import LocalDevice
from hal.drivers.local.driver import LocalDriver
from hal.drivers.local_task.queue_runner import QueueRunner
from hal.errors import InvalidArgumentError
from hal.semaphore import Semaphore
from hal.validation import check_int


class _DonatingSemaphore(Semaphore):
    """A semaphore whose untimed host wait runs the device's ready work until the value is reached."""

    def _wait(self, value: int, deadline: float | None) -> None:
        # A timed wait keeps its deadline: it must not start a submission that may outlast it.
        if deadline is None and self.current_value < value and self.failure is None:
            self.device.donate_work(lambda: self.current_value >= value or self.failure is not None)
        super()._wait(value, deadline)


class LocalTaskDevice(LocalDevice):
    def __init__(self, driver, info, *, queue_count: int = 1) -> None:
        super().__init__(driver, info, queue_count=queue_count)
        self._runners = [QueueRunner(f"hal-local-task-q{i}") for i in range(queue_count)]
        # A device dropped without close() ends its workers (nothing can wait for its work any more:
        # a semaphore holds its device). Not joined: the collector may run this on any thread. (At
        # exit the daemon workers end with the process, as before.)
        interrupts.finalize(self, _stop_runners, self._runners).atexit = False

    def _create_semaphore(self, initial_value: int) -> Semaphore:
        return _DonatingSemaphore(self, initial_value)

    def _schedule(self, queue: int, run: Callable[[], None]) -> None:
        self._runners[queue].put(run)

    def donate_work(self, done: Callable[[], bool]) -> None:
        """Run ready work of every queue on this thread until ``done()`` or none is left to run here."""
        if not callable(done):
            raise InvalidArgumentError(f"donate_work() takes a callable, got {done!r}")
        for runner in self._runners:
            runner.donate(done)

    def _before_idle_wait(self, deadline: float | None) -> None:
        if deadline is None:
            self.donate_work(lambda: all(runner.idle() for runner in self._runners))

    def _close(self) -> None:
        for runner in self._runners:
            runner.stop()


def _stop_runners(runners: list[QueueRunner]) -> None:
    for runner in runners:
        runner.stop(join=False)


class LocalTaskDriver(LocalDriver):
    name = "local-task"
    summary = "CPU, one worker thread per queue (asynchronous)"
    worker_threads = 1

    def _create_device(self, info: DeviceInfo, **options: Any) -> LocalTaskDevice:
        queue_count = check_int(options.pop("queue_count", 1), "queue_count", minimum=1)
        if options:
            raise InvalidArgumentError(f"unknown local-task device options {sorted(options)}; known: ['queue_count']")
        return LocalTaskDevice(self, info, queue_count=queue_count)
