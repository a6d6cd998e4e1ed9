"""Recorded commands issued one by one on a queue's stream.

Recording resolved addresses and ``end()`` packed kernel arguments, so issuing is a loop of
prepared calls (``GpuApi.prepare_launch`` with the packed ``void**``, ``prepare_memset``,
``prepare_copy``, ``prepare_upload``; each the API function and its complete arguments, built
once) run by the shim's ``run_prepared``. The call list is built once per queue and reused by
every later submission of a reusable buffer; only commands through binding-table slots, and
library calls (which may plan, or grow their workspace), are issued at submission. A kernel's
arguments through slots are written when the table differs from the one they hold (a prepared
execution hands the same table object at each submission). Barriers need nothing: a stream runs
its work in order.

Stream command buffers issue this way; so does a graph command buffer holding a library call that
cannot be captured into a graph (a solver that waits on its own results while it runs), or one kernel
alone (graph_command_buffer.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from hal.command_buffer import Binding
from hal.drivers.gpu.library import LibraryCall
from hal.drivers.gpu.recording import Command, Copy, DirectDispatch, Fill, SlotDispatch, Update

if TYPE_CHECKING:
    from hal.drivers.gpu.recording import RecordingCommandBuffer

#: A run of prepared calls and the command issued after it (None after the last run).
Segment = tuple[list[Any], "Command | None"]


class StreamIssue:
    """Issues a command buffer's commands on queues' streams; update payloads are read from the
    staging block at ``staging`` (pinned host memory, or device memory when ``staging_on_device``).
    The command buffer holds it and passes itself to each call (held here, it would make a reference
    cycle, and command buffers would wait for the cyclic collector to release their resources)."""

    def __init__(self, device: Any, staging: int, staging_on_device: bool) -> None:
        self.device = device
        self.staging = staging
        self.staging_on_device = staging_on_device
        #: Per queue index: the prepared calls (see segments_for).
        self._segments: dict[int, list[Segment]] = {}
        #: The binding table whose addresses the argument slots hold now (None: none known). A
        #: prepared execution hands its one table object at every submission, so a command buffer
        #: re-submitted with its table (a runtime recording's usual replay) patches nothing.
        self._patched_table: Sequence[Binding] | None = None

    def segments_for(self, cb: RecordingCommandBuffer, queue) -> list[Segment]:
        """The commands as runs of prepared calls, each run followed by the command that ends it
        (None for the last run): slot commands are resolved at each submission, everything else
        was resolved once."""
        api = self.device.api
        stream = queue.stream
        staging = self.staging
        upload = api.prepare_copy if self.staging_on_device else api.prepare_upload
        segments: list[Segment] = []
        calls: list[Any] = []
        append = calls.append
        prepare_launch = api.prepare_launch
        params = cb.args.params_address(0, 1)  # ArgArena.params_address, inlined: per dispatch
        for level in cb.levels:
            for command in level:
                kind = type(command)
                if kind is DirectDispatch:
                    function, grid, block, start, count = command
                    append(prepare_launch(function, grid, block, stream, params + 8 * start if count else 0))
                    continue
                if kind is SlotDispatch:
                    append(prepare_launch(command.function, command.grid, command.block, stream,
                                          params + 8 * command.arg_start if command.arg_count else 0))
                    continue
                if kind is LibraryCall:  # issued by the library itself (it may plan, or grow its workspace)
                    segments.append((calls, command))
                    calls = []
                    append = calls.append
                    continue
                target = command.target
                if kind is Fill and target.slot is None:
                    size = command.element_size
                    append(api.prepare_memset(target.ptr, command.value, size, target.length // size, stream))
                elif kind is Copy and command.source.slot is None and target.slot is None:
                    append(api.prepare_copy(target.ptr, command.source.ptr, target.length, stream))
                elif kind is Update and target.slot is None:
                    append(upload(target.ptr, staging + command.staging_offset, command.length, stream))
                else:
                    segments.append((calls, command))
                    calls = []
                    append = calls.append
        segments.append((calls, None))
        return segments

    def issuer(self, cb: RecordingCommandBuffer, queue, table: Sequence[Binding] | None) -> Callable[[], None]:
        """What issues the commands on ``queue`` with ``table`` (see ``RecordingCommandBuffer.issuer``):
        with no command through a binding-table slot, its one run of prepared calls, the shim's
        ``run_prepared`` itself."""
        segments = self._segments_of(cb, queue)
        if cb.slot_dispatches:  # (serialized: a launch copies the patched arguments before returning)
            return cb.serialized(functools.partial(self._issue_patched, cb, segments, table, queue.stream))
        if len(segments) == 1:
            return functools.partial(self.device.api.run_prepared, segments[0][0])
        if len(segments) == 2 and not segments[0][0]:  # one command alone, issued at submission
            command = segments[0][1]
            if type(command) is LibraryCall and not command.slots:  # (a lone collective, or GEMM)
                return functools.partial(command.issue, self.device, queue.stream, None)
        return functools.partial(self._issue_segments, segments, table, queue.stream)

    def issue(self, cb: RecordingCommandBuffer, queue, table: Sequence[Binding] | None) -> None:
        """Issue the commands now, from an issue already serialized (``RecordingCommandBuffer.serialized``)."""
        segments = self._segments_of(cb, queue)
        if cb.slot_dispatches:
            self._issue_patched(cb, segments, table, queue.stream)
        else:
            self._issue_segments(segments, table, queue.stream)

    def _segments_of(self, cb: RecordingCommandBuffer, queue) -> list[Segment]:
        segments = self._segments.get(queue.index)
        if segments is None:
            segments = self._segments[queue.index] = self.segments_for(cb, queue)
        return segments

    def _issue_patched(self, cb: RecordingCommandBuffer, segments: list[Segment], table: Sequence[Binding] | None,
                       stream: Any) -> None:
        if table is not self._patched_table or table is None:
            self._patched_table = None  # (a patch cut short by an interrupt leaves no table known)
            cb.patch_slot_args(table)
            self._patched_table = table
        self._issue_segments(segments, table, stream)

    def _issue_segments(self, segments: list[Segment], table: Sequence[Binding] | None, stream: Any) -> None:
        run_prepared = self.device.api.run_prepared
        for calls, command in segments:
            if calls:
                run_prepared(calls)
            if command is not None:
                self._issue_through_slots(command, table, stream)

    def _issue_through_slots(self, command: Command, table: Sequence[Binding] | None, stream: Any) -> None:
        api = self.device.api
        kind = type(command)
        if kind is Fill:
            ptr, length = command.target.resolve(table)
            if length:
                size = command.element_size
                api.memset_async(ptr, command.value, size, length // size, stream)
        elif kind is Copy:
            src, src_length = command.source.resolve(table)
            dst, dst_length = command.target.resolve(table)
            length = min(src_length, dst_length)
            if length:
                api.memcpy_dtod_async(dst, src, length, stream)
        elif kind is LibraryCall:
            command.issue(self.device, stream, table)
        elif kind is Update:
            dst, _ = command.target.resolve(table)
            copy = api.memcpy_dtod_async if self.staging_on_device else api.memcpy_htod_async
            copy(dst, self.staging + command.staging_offset, command.length, stream)
