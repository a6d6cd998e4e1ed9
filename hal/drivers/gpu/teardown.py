"""Releasing what a GPU device holds: one function for ``close()`` and for a device dropped without it.

A GPU device's driver objects live in its parts: the completion thread, one stream per queue, the
event and staging pools, memory not freed yet, graph command buffers' device objects, the library
capture stream and the loaded modules. ``DeviceTeardown`` holds those parts and not the device
(none of them refers to it), so the same steps run at ``close()`` and from the device's finalizer
when the device is collected without one: a program that makes devices and drops them keeps no
thread, stream or memory of theirs.

A collected device has no work in flight (a submission holds its command buffers, and they hold
the device) and none parked (the pending queue's waiters hold the same). The finalizer runs the
steps on a thread of their own: the collector may run it on any thread, the completion thread
included, inside locks the steps take (a queue's retirement lock, say).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hal.errors import FailedPreconditionError, HalError

if TYPE_CHECKING:
    from hal.drivers.gpu.allocator import LiveMemory
    from hal.drivers.gpu.completion import Completion
    from hal.drivers.gpu.context import GpuContext
    from hal.drivers.gpu.event_pool import EventPool
    from hal.drivers.gpu.library import Capturer
    from hal.drivers.gpu.modules import LoadedModules
    from hal.drivers.gpu.pending_queue import PendingQueue
    from hal.drivers.gpu.queue import GpuQueue
    from hal.drivers.gpu.staging import StagingPool


class DeviceTeardown:
    def __init__(self, gpu: GpuContext, *, completion: Completion, pending: PendingQueue,
                 queues: Sequence[GpuQueue], events: EventPool, staging: StagingPool, memory: LiveMemory,
                 capturer: Capturer, modules: LoadedModules, graph_resources: weakref.WeakSet) -> None:
        self.gpu = gpu
        self.completion = completion
        self.pending = pending
        self.queues = queues
        self.events = events
        self.staging = staging
        self.memory = memory
        self.capturer = capturer
        self.modules = modules
        #: Graph command buffers' device objects (held weakly: released here if still alive).
        self.graph_resources = graph_resources

    def run(self, cause: BaseException) -> None:
        """Fail parked work with ``cause``, stop the completion thread, wait for the streams and
        retire what ran, then release every driver object of the device. In a forked child the
        objects are the parent's: only the parked work fails."""
        self.pending.close(cause)
        if self.gpu.forked:
            return
        self.completion.stop()
        try:
            self.gpu.make_current()
        except HalError:
            pass
        for q in self.queues:  # no more issues; wait for the streams, retire what ran
            q.drain()
        for fn in self.completion.take_deferred():
            _quietly(fn)
        for resources in list(self.graph_resources):
            _quietly(resources.release)
        _quietly(self.capturer.release)
        self.memory.free_all()  # pool memory is freed in stream order: before the streams go
        for q in self.queues:
            q.destroy()
        self.staging.close()
        self.events.close()
        self.modules.unload_all()
        self.gpu.closed_for_good = True

    def run_apart(self) -> None:
        """The device was collected without ``close()``: run the steps on a thread of their own (see
        the module). At interpreter shutdown no thread starts; the process's end frees everything."""
        cause = FailedPreconditionError(f"device {self.gpu.uri} was dropped without close()")
        try:
            threading.Thread(target=self.run, args=(cause,), name=f"hal-{self.gpu.driver}-teardown",
                             daemon=True).start()
        except RuntimeError:
            pass


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # close releases what it can; a lost context frees the rest itself
        pass
