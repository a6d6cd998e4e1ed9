"""The repeat of a validated submission made from C (``_replay.c``), where it was built and is allowed.

A loop that submits the same reusable command buffer with the same binding table (a training
step, a runtime graph-cache hit) spends most of its host time in the Python around three driver
calls: recognising the repeat (``hal.device.recall``, ``check_signal_fences``), numbering the
``Submission``, issuing it (``GpuQueue.issue``, the graph command buffer's launch, the event),
and the semaphore's timepoint. ``hal.drivers.gpu._replay.Replay`` makes those same steps from C
for the usual shape of that call, reading the same attributes under the same locks, and hands
every other call, and every step that is not the usual case, to the Python code, which stays the
definition of each rule (see the C file's header).

``install`` binds it as the device instance's ``queue_execute`` (an instance attribute in front of
the class's method): a call then enters C with no Python frame at all. ``HAL_NATIVE`` decides as for
the native driver calls (``hal/drivers/native_calls.py``): unset, it serves where the extension
loads; ``HAL_NATIVE=0`` leaves the Python method; ``HAL_NATIVE=1`` makes a missing extension an error.
A device whose class overrides a step the C code makes (its own ``queue_execute``,
``_queue_execute``, queue or submission class) keeps the Python method.

The same object makes two other repeated steps from C, bound per object: the usual host wait on
a semaphore (``bind_wait``, ``_replay_wait.c``) and the recording of a dispatch like the last one
(``bind_dispatch``, ``_replay_record.c``).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from hal import tracing
from hal.buffer import Buffer
from hal.command_buffer import CommandBuffer, CommandBufferState
from hal.device import Device
from hal.drivers import native_calls
from hal.drivers.gpu import completion, event_semaphore
from hal.drivers.gpu.graph_command_buffer import GraphCommandBuffer
from hal.drivers.gpu.queue import GpuQueue
from hal.drivers.gpu.recording import Dispatch, RecordingCommandBuffer
from hal.drivers.gpu.submission import Submission
from hal.errors import HalError
from hal.semaphore import Semaphore

if TYPE_CHECKING:
    from hal.drivers.gpu.device import GpuDevice


def install(device: GpuDevice) -> bool:
    """Bind the C replay as ``device.queue_execute``; False where it is off, not built, or the
    device's classes change a step it makes (then the Python method serves)."""
    from hal.drivers.gpu.device import GpuDevice

    cls = type(device)
    if cls.queue_execute is not Device.queue_execute or cls._queue_execute is not GpuDevice._queue_execute \
            or any(type(q) is not GpuQueue for q in device.queues):
        return False

    def make() -> object:
        from hal.drivers.gpu import _replay

        return _replay.Replay(device, Device.queue_execute, CommandBuffer, Semaphore, GraphCommandBuffer, Submission,
                              CommandBufferState.EXECUTABLE, tracing, event_semaphore.PRUNE_AT,
                              completion.WAKE_INFLIGHT, event_semaphore.EventSemaphore, Semaphore.wait, HalError,
                              CommandBuffer.dispatch, Dispatch, Buffer, CommandBufferState.RECORDING)

    replay = native_calls.optional("the native replay", make)
    if replay is None:
        return False
    device.queue_execute = replay  # type: ignore[method-assign]
    device.replay = replay  # its other entry points, bound to semaphores and command buffers below
    return True


def bind_wait(device: GpuDevice, sem: Semaphore) -> None:
    """Make the usual host wait on ``sem`` from C (``_replay_wait.c``) where the replay serves:
    ``sem.wait`` becomes the replay's ``wait_on`` with the semaphore bound, an instance attribute
    in front of the class's method (which every other wait still takes)."""
    replay = device.replay
    cls = type(sem)
    if replay is not None and cls.wait is Semaphore.wait and cls._wait is event_semaphore.EventSemaphore._wait:
        sem.wait = partial(replay.wait_on, sem)  # type: ignore[method-assign]


def bind_dispatch(device: GpuDevice, cb: CommandBuffer) -> None:
    """Record the usual dispatch on ``cb`` from C (``_replay_record.c``) where the replay serves:
    ``cb.dispatch`` becomes the replay's ``record_dispatch`` with the command buffer bound."""
    replay = device.replay
    cls = type(cb)
    if replay is not None and cls.dispatch is CommandBuffer.dispatch \
            and cls._dispatch is RecordingCommandBuffer._dispatch:
        cb.dispatch = partial(replay.record_dispatch, cb)  # type: ignore[method-assign]


def uninstall(device: GpuDevice) -> None:
    """Back to the Python method (device close: the replay refers to the device)."""
    device.__dict__.pop("queue_execute", None)
    device.replay = None
