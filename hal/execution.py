"""Prepared executions: a submission validated once, re-submitted without checks.

``device.prepare(command_buffers, binding_tables)`` checks the command buffers and
their binding tables as ``queue_execute`` would and returns an ``Execution``;
``execution.submit(wait, signal)`` then issues that work again and again, checking
only the fences, which change every time. This is the HAL's word for "a submission
checked once", as a CUDA graph exec or a Vulkan pre-recorded submission is: a loop
that repeats one submission (a training step, a runtime graph-cache hit) pays the
validation once, not per call. ``queue_execute`` is ``prepare`` and one ``submit``.
``device.join(executions)`` makes one execution of several prepared ones, run in order as one
submission (one wait, one signal, one retirement for all), without validating again what they
validated: the batch of pre-recorded command buffers a Vulkan queue submission takes.

An execution holds its command buffers and the buffers they reach (directly or
through its binding tables). Once any of those buffers is released, or the
device closes, ``submit`` refuses with ``FailedPreconditionError``: the device
counts buffer releases (``Device.release_epoch``), so the usual submission
compares one integer, and only after a release does the execution look at its
buffers again. An execution of ONE_SHOT command buffers can be submitted once.

The driver's part is ``Device._prepare_execution``: what the driver can do once
for the whole life of the execution (look up its queue, pick the graph for the
binding table) happens there, and it returns the callable issuing the work.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hal import tracing
from hal.checks import check_sequence
from hal.errors import FailedPreconditionError, InvalidArgumentError
from hal.pickling import not_picklable
from hal.types import CommandBufferState
from hal.validation import check_fences, check_one_shot_once, check_signal_fences

if TYPE_CHECKING:
    from hal.buffer import Buffer
    from hal.command_buffer import Binding, CommandBuffer
    from hal.device import Device
    from hal.semaphore import Fence

#: Issues the prepared work: ``issue(waits, signals)`` with checked fence lists.
Issue = Callable[[list, list], None]

_NO_FENCES = ()
_EXECUTABLE = CommandBufferState.EXECUTABLE
_SUBMITTED = CommandBufferState.SUBMITTED


def held_buffers(command_buffers: Sequence[CommandBuffer], tables: Sequence[list[Binding] | None]) -> list[Buffer]:
    """Every buffer the work reaches, once each: the command buffers' direct references and the
    tables' entries (what must stay live for the execution to run)."""
    seen: dict[int, Buffer] = {}
    for cb in command_buffers:
        for buffer in cb.direct_buffers:
            seen[id(buffer)] = buffer
    for table in tables:
        if table:
            for entry in table:
                seen[id(entry[0])] = entry[0]
    return list(seen.values())


class Execution:
    """Command buffers and binding tables checked once for one queue of one device (see the module)."""

    __slots__ = ("device", "queue", "command_buffers", "binding_tables", "_issue", "_epoch", "_buffers",
                 "_one_shot", "__weakref__")
    __reduce_ex__ = not_picklable("a hal.Execution", "prepare it again in the other process")

    def __init__(self, device: Device, queue: int, command_buffers: list[CommandBuffer],
                 binding_tables: list[list[Binding] | None], issue: Issue, epoch: int,
                 buffers: list[Buffer], one_shot: list[CommandBuffer]) -> None:
        self.device = device
        self.queue = queue
        self.command_buffers: Sequence[CommandBuffer] = tuple(command_buffers)
        #: The checked tables: one list of (buffer, offset, length) per command buffer, or None.
        self.binding_tables: Sequence[list[Binding] | None] = tuple(binding_tables)
        self._issue = issue
        #: The device's release epoch when every buffer in ``_buffers`` was last seen live.
        self._epoch = epoch
        self._buffers = buffers
        self._one_shot = one_shot

    def submit(self, wait: Sequence[Fence] = (), signal: Sequence[Fence] = ()) -> None:
        """Issue the prepared work once every ``wait`` is reached, then signal ``signal``.

        Only the fences are checked. FailedPreconditionError once a buffer the work uses was
        released, the device closed, or (ONE_SHOT command buffers) the execution was submitted.
        """
        device = self.device
        if device.release_epoch != self._epoch:
            self._check_valid()
        waits = [] if wait is _NO_FENCES else check_fences(wait, "wait", device)
        signals = [] if signal is _NO_FENCES else check_signal_fences(signal, device)
        with device.submission_gate:
            if device.closed or self._one_shot:  # (under the gate: no close or other submit races it)
                self._admit()
            if tracing.ENABLED:
                tracing.call("queue_execute", self._issue, waits, signals, device=device.info.uri,
                             command_buffers=len(self.command_buffers))
            else:
                self._issue(waits, signals)

    @property
    def buffers(self) -> Sequence[Buffer]:
        """Every buffer the work reaches (through its command buffers or its tables), once each."""
        return tuple(self._buffers)

    @property
    def valid(self) -> bool:
        """Whether ``submit`` can still issue the work (its buffers live, its device open)."""
        try:
            self._check_valid()
        except FailedPreconditionError:
            return False
        return not any(cb.state is not _EXECUTABLE for cb in self._one_shot)

    def _check_valid(self) -> None:
        device = self.device
        if device.closed:
            raise FailedPreconditionError(f"the execution's device {device.info.uri} is closed")
        epoch = device.release_epoch  # read first: a release during the look below is seen next time
        for buffer in self._buffers:
            if buffer.released:
                raise FailedPreconditionError(
                    f"the execution uses a buffer that was released ({buffer!r}); prepare it again")
        self._epoch = epoch

    def _admit(self) -> None:
        """Refuse once the device is closed; spend the ONE_SHOT command buffers, which run at most
        once, also when threads race (under the gate)."""
        if self.device.closed:
            self._check_valid()
        for cb in self._one_shot:
            if cb.state is not _EXECUTABLE:
                raise FailedPreconditionError("a ONE_SHOT command buffer was already submitted")
        for cb in self._one_shot:
            cb.state = _SUBMITTED

    def __repr__(self) -> str:
        return (f"<hal.Execution of {len(self.command_buffers)} command buffer(s) on queue {self.queue} "
                f"of {self.device.info.uri}>")


def check_joined(device: Device, executions: object) -> tuple[list[Execution], list[CommandBuffer]]:
    """``device.join``'s executions: a non-empty sequence of valid executions of ``device``, all of one
    queue, and no ONE_SHOT command buffer twice among them. Returns (executions, their ONE_SHOT
    command buffers)."""
    if type(executions) is not list:
        executions = check_sequence(executions, "executions", "hal.Execution")
    if not executions:
        raise InvalidArgumentError("join needs at least one hal.Execution")
    queue = None
    one_shot: list[CommandBuffer] = []
    for i, execution in enumerate(executions):  # type: ignore[arg-type]
        if not isinstance(execution, Execution):
            raise InvalidArgumentError(f"executions[{i}] is not a hal.Execution: {execution!r}")
        if execution.device is not device:
            raise InvalidArgumentError(f"executions[{i}] belongs to another device")
        if i and execution.queue != queue:
            raise InvalidArgumentError(f"executions[{i}] is prepared for queue {execution.queue}, "
                                       f"executions[0] for queue {queue}")
        queue = execution.queue
        if not execution.valid:
            raise FailedPreconditionError(
                f"executions[{i}] can no longer be submitted: a buffer it uses was released or its "
                "ONE_SHOT work was submitted")
        one_shot.extend(cb for cb in execution.command_buffers if not cb.reusable)
    check_one_shot_once(one_shot, "the joined executions")
    return list(executions), one_shot  # type: ignore[arg-type]
