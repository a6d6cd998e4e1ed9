"""The bottom of a GPU device: the vendor API, its context, the lost state and releases from any thread.

Every part of a GPU device (allocator, queues, event pool, completion) works on one ``GpuContext``
instead of calling back into the device: it makes the context current on the calling thread
(``make_current``: a cheap check when it already is), turns an API error into the failure to
report (``fault``: a sticky fault marks the context lost, and every later submission fails with
the same ``DeviceLostError``), and runs releases that may come from any thread, a finalizer say
(``run_released``, ``release_later``), skipping them once the device closed for good (the context
then released everything). ``GpuDevice`` composes the parts from above.

A GPU context does not survive ``fork()``: in a child process every context of its parent is
marked unusable at once (``os.register_at_fork``), so each use of a device made before the fork
raises ``FailedPreconditionError`` saying so before any driver call, instead of failing inside
the driver (or waiting for a completion thread the child does not have).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

from hal.drivers.gpu.api import GpuApi
from hal.drivers.gpu.status import DeviceLostError
from hal.errors import FailedPreconditionError, HalError


class GpuContext:
    def __init__(self, api: GpuApi, handle: Any, context: Any, uri: str, driver: str) -> None:
        self.api = api
        #: The vendor's device handle and context.
        self.handle = handle
        self.context = context
        #: For messages and thread names.
        self.uri = uri
        self.driver = driver
        #: The failure every later submission reports once a sticky fault lost the context, or None.
        self.lost: BaseException | None = None
        #: Set at the end of the device's close: its objects are gone, releases are skipped.
        self.closed_for_good = False
        #: Set in a process forked after the context was made: nothing may reach the driver.
        self.forked = False
        self._lost_lock = threading.Lock()
        _contexts.add(self)

    def fork_child(self) -> None:
        """This process is a fork of the one that made the context, which the driver's context does
        not survive: every later use fails with the reason, and releases are skipped (the memory
        and objects are the parent's)."""
        self.forked = True
        self.closed_for_good = True
        self._lost_lock = threading.Lock()  # (the parent's threads may have held it at the fork)
        self.lost = FailedPreconditionError(
            f"device {self.uri} was created before this process was forked, and a {self.driver} context "
            f"does not survive fork(): create GPU devices only in processes started after the parent's "
            f"last GPU use, or with the 'spawn' start method (multiprocessing.set_start_method('spawn'))")

    def make_current(self) -> None:
        """Make the context current on the calling thread (a cheap check when it is)."""
        self.api.activate(self.context)

    def check_usable(self) -> None:
        if self.lost is not None:
            raise self.lost

    def fault(self, exc: BaseException) -> BaseException:
        """The failure to report for an API error: a sticky fault marks the context lost."""
        if isinstance(exc, DeviceLostError):
            with self._lost_lock:
                if self.lost is None:
                    self.lost = DeviceLostError(f"device {self.uri} is lost after a GPU fault; create a new "
                                                f"process to use it again: {exc}")
                    self.lost.__cause__ = exc
        return self.lost or exc

    def run_released(self, fn: Callable[[], Any]) -> None:
        """Run a release now with the context current; skipped once closed, quiet once lost."""
        if self.closed_for_good:
            return
        try:
            self.make_current()
            fn()
        except HalError:
            if self.lost is None:
                raise

    def release_later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Release a resource from any thread (a finalizer): skipped once the device is closed."""
        if self.closed_for_good:
            return
        self.run_released(lambda: fn(*args))


#: Every live context: a forked child marks them unusable (``GpuContext.fork_child``).
_contexts: weakref.WeakSet[GpuContext] = weakref.WeakSet()


def _mark_forked() -> None:
    for context in list(_contexts):
        context.fork_child()


os.register_at_fork(after_in_child=_mark_forked)
