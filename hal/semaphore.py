"""Timeline semaphores, fence waits and the readiness tracking the queues build on.

The host-side timeline lives here once for every driver: a monotonically
increasing value, an optional failure, host waiters, and listeners that fire
when a value is reached (or the semaphore fails). Queues use the listeners to
defer work until its waits are reached (wait-before-signal) without blocking
the submitting thread. GPU drivers add device timepoints on top.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hal.buffer import check_int
from hal.errors import (
    DeadlineExceededError,
    HalError,
    InvalidArgumentError,
    aborted_by,
)

if TYPE_CHECKING:
    from hal.device import Device

#: Called with None once the value is reached, or with the failure.
Listener = Callable[[BaseException | None], None]

MAX_VALUE = (1 << 64) - 1


def deadline_from(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise InvalidArgumentError(f"timeout must be None or a number >= 0 seconds, got {timeout!r}")
    return time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Semaphore:
    """A timeline semaphore: ``signal(v)`` raises the value, ``wait(v)`` blocks until it is reached."""

    def __init__(self, device: Device, initial_value: int = 0) -> None:
        self.device = device
        self._lock = threading.Lock()
        self._reached = threading.Condition(self._lock)
        self._value = initial_value
        self._failure: BaseException | None = None
        self._listeners: list[tuple[int, int, Listener]] = []
        #: Host threads blocked in _wait (advancing skips the notification when there are none).
        self._waiters = 0
        self._cancelled: set[int] = set()
        self._tokens = itertools.count()

    # -- queries -------------------------------------------------------------
    @property
    def value(self) -> int:
        """The current value; raises AbortedError if the semaphore failed."""
        failure = self._failure
        if failure is not None:
            raise aborted_by(failure, "semaphore failed")
        return self._value

    @property
    def failure(self) -> BaseException | None:
        """The exception the semaphore failed with, or None."""
        return self._failure

    def _query(self) -> int:
        return self._value

    # -- host operations -------------------------------------------------------
    def signal(self, value: int) -> None:
        """Set the value from the host; it must be above the current one."""
        value = check_int(value, "semaphore signal value")
        if value > MAX_VALUE:
            raise InvalidArgumentError(f"semaphore value {value} exceeds 2**64-1")
        if self._failure is not None:
            raise aborted_by(self._failure, "cannot signal a failed semaphore")
        if value <= self._value:
            raise InvalidArgumentError(
                f"semaphore values only increase: signal value {value} is not above the current value {self._value}")
        self._advance(value)

    def fail(self, cause: BaseException | str) -> None:
        """Put the semaphore in the failed state; every current and later wait raises AbortedError."""
        if isinstance(cause, str):
            cause = HalError(10, cause)
        if not isinstance(cause, BaseException):
            raise InvalidArgumentError(f"fail() takes an exception or a message, got {cause!r}")
        self._fail(cause)

    def wait(self, value: int, timeout: float | None = None) -> None:
        """Block until the value is >= ``value``; DeadlineExceededError after ``timeout`` seconds."""
        if type(value) is not int or value < 0:
            value = check_int(value, "semaphore wait value")
        self._wait(value, None if timeout is None else deadline_from(timeout))

    # -- shared machinery (drivers call these) ----------------------------------
    def _wait(self, value: int, deadline: float | None) -> None:
        with self._lock:
            while self._value < value and self._failure is None:
                left = remaining(deadline)
                if left == 0.0:
                    raise DeadlineExceededError(
                        f"timed out waiting for semaphore value {value} (current value {self._value})")
                self._waiters += 1
                try:
                    self._reached.wait(left)
                finally:
                    self._waiters -= 1
            if self._failure is not None:
                raise aborted_by(self._failure, f"semaphore failed while waiting for value {value}")

    def _advance(self, value: int) -> None:
        """Raise the value (device or host completion); fires listeners reached by it."""
        ready: list[Listener] = []
        with self._lock:
            if value <= self._value or self._failure is not None:
                return
            self._value = value
            listeners = self._listeners
            while listeners and listeners[0][0] <= value:
                _, token, listener = heapq.heappop(listeners)
                if token in self._cancelled:
                    self._cancelled.discard(token)
                else:
                    ready.append(listener)
            if self._waiters:
                self._reached.notify_all()
        for listener in ready:
            listener(None)

    def _fail(self, cause: BaseException) -> None:
        with self._lock:
            if self._failure is not None:
                return
            self._failure = cause
            pending = [entry for entry in self._listeners if entry[1] not in self._cancelled]
            self._listeners = []
            self._cancelled.clear()
            self._reached.notify_all()
        for _, _, listener in sorted(pending):
            listener(cause)

    def _notify_at(self, value: int, listener: Listener) -> int | None:
        """Call ``listener`` once ``value`` is reached or the semaphore fails.

        Runs it at once (on this thread) when that has already happened, else later
        on the thread that advances or fails the semaphore. Returns a token for
        ``_cancel_notify`` when it was parked.
        """
        with self._lock:
            failure = self._failure
            if failure is None and self._value < value:
                token = next(self._tokens)
                heapq.heappush(self._listeners, (value, token, listener))
                return token
        listener(failure)
        return None

    def _cancel_notify(self, token: int | None) -> None:
        if token is not None:
            with self._lock:
                if any(entry[1] == token for entry in self._listeners):
                    self._cancelled.add(token)

    def __repr__(self) -> str:
        state = f" failed: {self._failure}" if self._failure is not None else ""
        return f"<hal.Semaphore value={self._value}{state}>"


Fence = tuple[Semaphore, int]


def check_fences(fences: object, what: str, device: Device | None = None) -> list[Fence]:
    """Normalise a fence list: a sequence of (Semaphore, int >= 0) pairs."""
    if fences is None or (type(fences) is tuple and not fences):
        return []
    # Checked by type first: the ABC check would cost more than the rest of a small submission's checks.
    if type(fences) is not list and type(fences) is not tuple and (
            isinstance(fences, (str, bytes)) or not isinstance(fences, Sequence)):
        raise InvalidArgumentError(f"{what} must be a sequence of (Semaphore, value) pairs, got {fences!r}")
    result = []
    for i, pair in enumerate(fences):
        if type(pair) is tuple and len(pair) == 2 and type(pair[1]) is int and 0 <= pair[1] <= MAX_VALUE \
                and isinstance(pair[0], Semaphore) and (device is None or pair[0].device is device):
            result.append(pair)  # fast path: a well-formed (Semaphore, int) pair of this device
            continue
        if not isinstance(pair, Sequence) or len(pair) != 2 or not isinstance(pair[0], Semaphore):
            raise InvalidArgumentError(f"{what}[{i}] must be a (Semaphore, value) pair, got {pair!r}")
        value = check_int(pair[1], f"{what}[{i}] value")
        if value > MAX_VALUE:
            raise InvalidArgumentError(f"{what}[{i}] value {value} exceeds 2**64-1")
        if device is not None and pair[0].device is not device:
            raise InvalidArgumentError(f"{what}[{i}] semaphore belongs to another device ({pair[0].device!r})")
        result.append((pair[0], value))
    return result


def wait_all(fences: Sequence[Fence], timeout: float | None = None) -> None:
    """Wait until every (semaphore, value) is reached."""
    fences = check_fences(fences, "fences")
    deadline = deadline_from(timeout)
    for sem, value in fences:
        sem._wait(value, deadline)


def wait_any(fences: Sequence[Fence], timeout: float | None = None) -> int:
    """Wait until one (semaphore, value) is reached; returns its index."""
    fences = check_fences(fences, "fences")
    if not fences:
        raise InvalidArgumentError("wait_any needs at least one fence")
    deadline = deadline_from(timeout)
    woken = threading.Event()
    tokens = []
    try:
        for sem, value in fences:
            tokens.append(sem._notify_at(value, lambda _failure: woken.set()))
            if woken.is_set():
                break
        if not woken.wait(remaining(deadline)):
            raise DeadlineExceededError(f"timed out waiting for any of {len(fences)} fences")
    finally:
        for (sem, _), token in zip(fences, tokens):
            sem._cancel_notify(token)
    for index, (sem, value) in enumerate(fences):
        if sem._failure is not None:
            raise aborted_by(sem._failure, f"fence {index} failed")
        if sem._value >= value:
            return index
    raise DeadlineExceededError("no fence was reached")  # unreachable: woken implies one


class FenceWaiter:
    """Runs ``on_ready`` once every wait is reached, or ``on_failed`` with the first failure.

    This is the pending-action queue of every driver: work parked here is
    issued by whichever thread reaches the last wait (a host ``signal``, a
    completion thread), so a submission never blocks its caller.
    """

    __slots__ = ("_pending", "_lock", "_done", "_on_ready", "_on_failed")

    def __init__(self, waits: Sequence[Fence], on_ready: Callable[[], None],
                 on_failed: Callable[[BaseException], None]) -> None:
        self._lock = threading.Lock()
        self._pending = len(waits) + 1  # +1 until every listener is installed
        self._done = False
        self._on_ready = on_ready
        self._on_failed = on_failed
        for sem, value in waits:
            sem._notify_at(value, self._reached)
        self._reached(None)

    @property
    def done(self) -> bool:
        return self._done

    def cancel(self, cause: BaseException) -> None:
        """Fail the parked work now (device shutdown) unless it already ran or failed."""
        self._reached(cause)

    def _reached(self, failure: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            if failure is None:
                self._pending -= 1
                if self._pending:
                    return
            self._done = True
        if failure is None:
            self._on_ready()
        else:
            self._on_failed(failure)
