"""Timeline semaphores, fence waits and the readiness tracking the queues build on.

The host-side timeline lives here once for every driver: a monotonically
increasing value, an optional failure, host waiters, and listeners that fire
when a value is reached (or the semaphore fails). Queues use the listeners to
defer work until its waits are reached (wait-before-signal) without blocking
the submitting thread. GPU drivers add device timepoints on top.

Driver-facing surface (what a driver may use besides the public API):

- ``current_value``: the value without raising for a failure (``value`` raises);
- ``failure``: the exception the semaphore failed with, or None;
- ``advance(value)``: completion of device work raised the value (fires listeners);
- ``fail(cause)``: fail the semaphore with an exception;
- ``notify_at(value, listener) -> token`` / ``cancel_notify(token)``: run
  ``listener(None)`` once ``value`` is reached, or ``listener(failure)``;
- ``has_listeners()``: whether some host listener waits (a completion thread must run).

A subclass (a driver's semaphore) may override the hooks ``_advance``, ``_fail``,
``_notify_at`` and ``_wait`` (calling the base), and use ``_reached``/``_waiters``,
``_park``/``_unpark`` and ``_parked`` (the listener registry and the tokens it holds) while
holding ``_lock``. ``current_value`` and ``failure`` are public attributes,
read-only outside the semaphore's own methods.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hal import tracing
from hal.checks import MAX_U64, check_sequence, check_u64, deadline_from
from hal.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    HalError,
    InvalidArgumentError,
    aborted_by,
)
from hal.pickling import not_picklable

if TYPE_CHECKING:
    from hal.device import Device

#: Called with None once the value is reached, or with the failure.
Listener = Callable[[BaseException | None], None]


#: A thread blocked on a condition (a host wait, ``wait_idle``) looks again at least this often.
#: A notification that a KeyboardInterrupt kept from being sent (between a value's advance and
#: its notify) then costs this much latency instead of a wait that never ends.
RECHECK_SECONDS = 0.05


def remaining(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def wait_slice(left: float | None) -> float:
    """How long a condition wait with ``left`` seconds to go sleeps before looking again."""
    return RECHECK_SECONDS if left is None or left > RECHECK_SECONDS else left


class Semaphore:
    """A timeline semaphore: ``signal(v)`` raises the value, ``wait(v)`` blocks until it is reached."""

    __reduce_ex__ = not_picklable("a hal.Semaphore", "pickle its value (semaphore.value) if another process needs it")

    def __init__(self, device: Device, initial_value: int = 0) -> None:
        self.device = device
        self._lock = threading.Lock()
        self._reached = threading.Condition(self._lock)
        #: The value reached so far, also after a failure (``value`` raises then). Read-only by
        #: convention: only the semaphore's own methods change it, under its lock.
        self.current_value = initial_value
        #: The exception the semaphore failed with, or None (set once, by ``fail`` or failed work).
        self.failure: BaseException | None = None
        #: Heap of (value, token, listener); entries whose token left ``_parked`` were cancelled.
        self._listeners: list[tuple[int, int, Listener]] = []
        self._parked: set[int] = set()
        #: Host threads blocked in _wait (advancing skips the notification when there are none).
        self._waiters = 0
        self._tokens = itertools.count()

    # -- queries -------------------------------------------------------------
    @property
    def value(self) -> int:
        """The current value; raises AbortedError if the semaphore failed."""
        failure = self.failure
        if failure is not None:
            raise aborted_by(failure, "semaphore failed")
        return self.current_value

    def has_listeners(self) -> bool:
        """Whether a listener (a host ``wait_any``/``wait_all``, parked work) waits for a value."""
        return bool(self._parked)

    def _query(self) -> int:
        return self.current_value

    def _check_device_open(self) -> None:
        if self.device.closed:
            raise FailedPreconditionError(f"the semaphore's device {self.device.info.uri} is closed")

    # -- host operations -------------------------------------------------------
    def signal(self, value: int) -> None:
        """Set the value from the host; it must be above the current one."""
        value = check_u64(value, "semaphore signal value")
        self._check_device_open()
        if self.failure is not None:
            raise aborted_by(self.failure, "cannot signal a failed semaphore")
        if value <= self.current_value:
            raise InvalidArgumentError(
                f"semaphore values only increase: signal value {value} is not above the current value "
                f"{self.current_value}")
        self._advance(value)

    def fail(self, cause: BaseException | str) -> None:
        """Put the semaphore in the failed state; every current and later wait raises AbortedError."""
        if isinstance(cause, str):
            cause = HalError(10, cause)
        if not isinstance(cause, BaseException):
            raise InvalidArgumentError(f"fail() takes an exception or a message, got {cause!r}")
        self._check_device_open()
        self._fail(cause)

    def wait(self, value: int, timeout: float | None = None) -> None:
        """Block until the value is >= ``value``; DeadlineExceededError after ``timeout`` seconds
        (None, math.inf or a huge timeout: no limit)."""
        if type(value) is not int or value >> 64:  # (nonzero for a negative value too)
            value = check_u64(value, "semaphore wait value")
        deadline = None if timeout is None else deadline_from(timeout)
        if self.device.closed:  # nothing can signal it any more: report what it reached, never block
            if self.failure is not None:
                raise aborted_by(self.failure, f"semaphore failed before value {value} was reached")
            if self.current_value < value:
                self._check_device_open()
            return
        if tracing.ENABLED:
            tracing.call("semaphore.wait", self._wait, value, deadline, value=value)
        else:
            self._wait(value, deadline)

    def wait_until(self, value: int, deadline: float | None) -> None:
        """``wait`` with checked arguments: ``deadline`` a ``time.monotonic()`` value or None."""
        self._wait(value, deadline)

    # -- driver-facing ---------------------------------------------------------------
    def advance(self, value: int) -> None:
        """Raise the value to ``value`` (completed device work); no-op if already there or failed."""
        self._advance(value)

    def fail_from_device(self, cause: BaseException) -> None:
        """The work that was to signal this semaphore failed (also while its device closes)."""
        if not isinstance(cause, BaseException):
            raise InvalidArgumentError(f"fail_from_device() takes an exception, got {cause!r}")
        self._fail(cause)

    def notify_at(self, value: int, listener: Listener) -> int | None:
        """Call ``listener`` once ``value`` is reached or the semaphore fails; a token for
        ``cancel_notify`` when it had to be parked (None when it ran at once)."""
        if value.__class__ is not int or value >> 64:
            value = check_u64(value, "semaphore value")
        if not callable(listener):
            raise InvalidArgumentError(f"notify_at() takes a callable listener, got {listener!r}")
        return self._notify_at(value, listener)

    def cancel_notify(self, token: int | None) -> None:
        """Forget a parked listener (nothing stays registered once the caller is done waiting)."""
        if token is not None and token.__class__ is not int:
            raise InvalidArgumentError(f"cancel_notify() takes a token notify_at returned, or None, got {token!r}")
        if token is not None:
            with self._lock:
                self._parked.discard(token)
                listeners = self._listeners
                # Cancelled entries are dropped lazily; compact when they are most of the heap.
                if len(listeners) > 2 * len(self._parked) + 8:
                    parked = self._parked
                    self._listeners = [entry for entry in listeners if entry[1] in parked]
                    heapq.heapify(self._listeners)

    # -- shared machinery (hooks a driver's semaphore may extend) ------------------------
    def _wait(self, value: int, deadline: float | None) -> None:
        with self._lock:
            while self.current_value < value and self.failure is None:
                left = remaining(deadline)
                if left == 0.0:
                    raise DeadlineExceededError(
                        f"timed out waiting for semaphore value {value} (current value {self.current_value})")
                self._waiters += 1
                try:
                    self._reached.wait(wait_slice(left))
                finally:
                    self._waiters -= 1
            if self.failure is not None:
                raise aborted_by(self.failure, f"semaphore failed while waiting for value {value}")

    def _advance(self, value: int) -> None:
        """Raise the value (device or host completion); fires listeners reached by it. ``value`` is
        checked here, where drivers' ``advance`` lands (one test for an int in range)."""
        if value.__class__ is not int or value >> 64:  # (nonzero for a negative value too)
            value = check_u64(value, "semaphore value")
        ready: list[Listener] = []
        with self._lock:
            if value <= self.current_value or self.failure is not None:
                return
            self.current_value = value
            listeners = self._listeners
            if listeners and listeners[0][0] <= value:
                parked = self._parked
                while listeners and listeners[0][0] <= value:
                    _, token, listener = heapq.heappop(listeners)
                    if token in parked:
                        parked.discard(token)
                        ready.append(listener)
            if self._waiters:
                self._reached.notify_all()
        for listener in ready:
            listener(None)

    def _fail(self, cause: BaseException) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = cause
            parked = self._parked
            pending = [entry for entry in self._listeners if entry[1] in parked]
            self._listeners = []
            self._parked = set()
            self._reached.notify_all()
        for _, _, listener in sorted(pending, key=_listener_order):
            listener(cause)

    def _notify_at(self, value: int, listener: Listener) -> int | None:
        """See ``notify_at``; runs the listener at once (on this thread) when the value was
        already reached or the semaphore failed, else later on the thread that advances or fails it."""
        with self._lock:
            failure = self.failure
            if failure is None and self.current_value < value:
                return self._park(value, listener)
        listener(failure)
        return None

    def _park(self, value: int, listener: Listener) -> int:
        """Register ``listener`` for ``value`` (with the lock held); its token. It fires once, when
        the value is reached or the semaphore fails, unless ``_unpark`` takes it first."""
        token = next(self._tokens)
        heapq.heappush(self._listeners, (value, token, listener))
        self._parked.add(token)
        return token

    def _unpark(self, token: int) -> bool:
        """Take a parked listener out (with the lock held): True if it was still parked, and the
        caller now fires it (or drops it); False if it fired, was taken or was cancelled."""
        parked = self._parked
        if token in parked:
            parked.discard(token)
            return True
        return False

    def _cancel_notify(self, token: int | None) -> None:
        self.cancel_notify(token)

    def __repr__(self) -> str:
        state = f" failed: {self.failure}" if self.failure is not None else ""
        return f"<hal.Semaphore value={self.current_value}{state}>"


def _listener_order(entry: tuple[int, int, Listener]) -> tuple[int, int]:
    return entry[0], entry[1]


Fence = tuple[Semaphore, int]


def wait_all(fences: Sequence[Fence], timeout: float | None = None) -> None:
    """Wait until every (semaphore, value) is reached; AbortedError at once when any fails
    (before or during the wait), without waiting for the others."""
    fences = check_fences(fences, "fences")
    deadline = deadline_from(timeout)
    for index, (sem, _) in enumerate(fences):
        if sem.failure is not None:
            raise aborted_by(sem.failure, f"fence {index} failed")
    pending = [(index, sem, value) for index, (sem, value) in enumerate(fences) if sem.current_value < value]
    if not pending:
        return
    if len(pending) == 1:  # one semaphore: its own wait already fails fast
        _, sem, value = pending[0]
        if tracing.ENABLED:
            tracing.call("wait_all", sem.wait_until, value, deadline, fences=1)
        else:
            sem.wait_until(value, deadline)
        return
    if tracing.ENABLED:
        tracing.call("wait_all", lambda: _wait_fences(len(fences), pending, deadline, every=True),
                     fences=len(pending))
    else:
        _wait_fences(len(fences), pending, deadline, every=True)


def wait_any(fences: Sequence[Fence], timeout: float | None = None) -> int:
    """Wait until one (semaphore, value) is reached; returns its index (AbortedError if one failed)."""
    fences = check_fences(fences, "fences")
    if not fences:
        raise InvalidArgumentError("wait_any needs at least one fence")
    deadline = deadline_from(timeout)
    index = _first_settled(fences)
    if index is None:
        pending = [(i, sem, value) for i, (sem, value) in enumerate(fences)]
        if tracing.ENABLED:
            tracing.call("wait_any", lambda: _wait_fences(len(fences), pending, deadline, every=False),
                         fences=len(pending))
        else:
            _wait_fences(len(fences), pending, deadline, every=False)
        index = _first_settled(fences)
    return index  # type: ignore[return-value]


def _first_settled(fences: Sequence[Fence]) -> int | None:
    """The index of the first fence reached (None if none is); AbortedError for a failed one."""
    for index, (sem, value) in enumerate(fences):
        if sem.failure is not None:
            raise aborted_by(sem.failure, f"fence {index} failed")
        if sem.current_value >= value:
            return index
    return None


def _wait_fences(count: int, pending: list[tuple[int, Semaphore, int]], deadline: float | None,
                 *, every: bool) -> None:
    """Block until every (``every``) or any of ``pending`` is reached, or any fence fails.

    One listener per fence wakes this thread; every listener is cancelled before returning,
    so nothing stays registered on the semaphores however the wait ends.
    """
    woken = threading.Event()
    left = [len(pending)]
    failed: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def listener_for(index: int) -> Listener:
        def reached(failure: BaseException | None) -> None:
            with lock:
                if failure is not None:
                    failed.append((index, failure))
                else:
                    left[0] -= 1
                    if every and left[0]:
                        return
            woken.set()
        return reached

    def settled() -> bool:  # read from the semaphores themselves (a listener call may have been lost)
        reached = [sem.current_value >= value for _, sem, value in pending]
        return any(sem.failure is not None for _, sem, _ in pending) or (all(reached) if every else any(reached))

    registered = []
    try:
        for index, sem, value in pending:
            registered.append((sem, sem.notify_at(value, listener_for(index))))
            if woken.is_set() and (failed or not every):
                break
        # In slices: a listener call that a KeyboardInterrupt cut short on the advancing thread
        # costs a slice, as the values themselves are looked at after each.
        while not woken.wait(wait_slice(remaining(deadline))):
            if settled():
                break
            if deadline is not None and remaining(deadline) == 0.0:
                raise DeadlineExceededError(
                    f"timed out waiting for {'all' if every else 'any'} of {count} fences")
    finally:
        for sem, token in registered:
            sem.cancel_notify(token)
    if not failed:
        failed = [(index, sem.failure) for index, sem, _ in pending if sem.failure is not None]
    if failed:
        index, failure = failed[0]
        raise aborted_by(failure, f"fence {index} failed")


class FenceWaiter:
    """Runs ``on_ready`` once every wait is reached, or ``on_failed`` with the first failure.

    This is the pending-action queue of every driver: work parked here is
    issued by whichever thread reaches the last wait (a host ``signal``, a
    completion thread), so a submission never blocks its caller.
    """

    __slots__ = ("_pending", "_lock", "_done", "_on_ready", "_on_failed", "_registered")

    def __init__(self, waits: Sequence[Fence], on_ready: Callable[[], None],
                 on_failed: Callable[[BaseException], None]) -> None:
        self._lock = threading.Lock()
        self._pending = len(waits) + 1  # +1 until every listener is installed
        self._done = False
        self._on_ready = on_ready
        self._on_failed = on_failed
        registered = []
        for sem, value in waits:
            token = sem.notify_at(value, self._reached)
            if token is not None:
                registered.append((sem, token))
        self._registered = registered
        self._reached(None)

    @property
    def done(self) -> bool:
        return self._done

    def cancel(self, cause: BaseException) -> None:
        """Fail the parked work now (device shutdown) unless it already ran or failed; its
        listeners leave the semaphores, so a later ``signal()`` finds nothing of it."""
        self._reached(cause)
        for sem, token in self._registered:
            sem.cancel_notify(token)

    def abandon(self) -> None:
        """Stop waiting without calling back (the caller takes the work over); the listeners leave
        the semaphores."""
        with self._lock:
            self._done = True
        for sem, token in self._registered:
            sem.cancel_notify(token)

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


# -- fence checks (submissions and the waits above call these) ------------------------------------------
def check_fences(fences: object, what: str, device: Device | None = None) -> list[Fence]:
    """A fence list: a sequence of (Semaphore, int in [0, 2**64-1]) pairs of ``device``."""
    if type(fences) is list or type(fences) is tuple:
        if not fences:
            return []
        for pair in fences:  # the common case: well-formed (Semaphore, int) pairs of this device
            if type(pair) is not tuple or len(pair) != 2:
                break
            sem, value = pair
            if type(value) is not int or not 0 <= value <= MAX_U64 or not isinstance(sem, Semaphore) \
                    or (device is not None and sem.device is not device):
                break
        else:
            return list(fences)
    elif fences is None:
        return []
    return _check_fences_slowly(fences, what, device)


def _check_fences_slowly(fences: object, what: str, device: Device | None) -> list[Fence]:
    fences = check_sequence(fences, what, "(Semaphore, value) pairs")
    result = []
    for i, pair in enumerate(fences):
        if not isinstance(pair, Sequence) or isinstance(pair, (str, bytes)) or len(pair) != 2 \
                or not isinstance(pair[0], Semaphore):
            raise InvalidArgumentError(f"{what}[{i}] must be a (Semaphore, value) pair, got {pair!r}")
        value = check_u64(pair[1], f"{what}[{i}] value")
        if device is not None and pair[0].device is not device:
            raise InvalidArgumentError(f"{what}[{i}] semaphore belongs to another device ({pair[0].device!r})")
        result.append((pair[0], value))
    return result


def check_signals(signals: list[Fence]) -> None:
    """Each signal value is above its semaphore's current value (a failed one takes anything)."""
    for sem, value in signals:
        if value <= sem.current_value and sem.failure is None:
            raise InvalidArgumentError(
                f"signal[{signals.index((sem, value))}] value {value} is not above the semaphore's "
                f"current value {sem.current_value}")


def check_signal_fences(fences: object, device: Device) -> list[Fence]:
    """A submission's signal list: ``check_fences`` and ``check_signals`` in one. The usual list of
    one well-formed pair whose value is above its semaphore's is recognised in one pass (the list
    and the pair taken apart by unpacking, which raises for any other length); anything else takes
    the two checks, which report what is wrong."""
    if type(fences) is list:
        try:
            (pair,) = fences
            if type(pair) is tuple:
                sem, value = pair
                if type(value) is int and isinstance(sem, Semaphore) and sem.device is device \
                        and sem.current_value < value <= MAX_U64 and sem.failure is None:
                    return [pair]
        except ValueError:
            pass
    signals = check_fences(fences, "signal", device)
    check_signals(signals)
    return signals
