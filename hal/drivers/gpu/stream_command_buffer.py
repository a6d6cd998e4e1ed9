"""Stream command buffer: recorded commands issued one by one on a queue's stream.

Recording resolves addresses and ``end()`` packs kernel arguments, so issuing
is a loop of prepared calls (``GpuApi.prepare_launch`` with the packed ``void**``,
``prepare_memset``, ``prepare_copy``, ``prepare_upload``; each the API function
and its complete arguments, built once) run by the shim's ``run_prepared``.
The call list is built once per queue, when an execution of the buffer is
prepared, and reused by every later submission of a reusable buffer; only commands
through binding-table slots are resolved at submission. Barriers need nothing: a stream runs its work in order.

``update_buffer`` payloads are copied at ``end()`` into one pinned staging block
that stays alive until the submission using it completed.
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from hal.command_buffer import Binding
from hal.drivers.gpu.library import LibraryCall
from hal.drivers.gpu.recording import Command, Copy, Dispatch, Fill, RecordingCommandBuffer, SlotDispatch, Update


class StreamCommandBuffer(RecordingCommandBuffer):
    kind = "stream"

    def __init__(self, device, mode, binding_capacity: int) -> None:
        super().__init__(device, mode, binding_capacity)
        #: Per queue index: the prepared calls (see _segments_for).
        self._segments: dict[int, list[tuple[list[Any], Command | None]]] = {}
        self._staging: tuple[int, int] | None = None
        self._release_staging: weakref.finalize | None = None

    def _pack_staging(self) -> None:
        if not self.staging_size:
            return
        payload = self.staging_payload()
        device = self.device
        host, capacity = device.staging.acquire(len(payload))
        ctypes.memmove(host, payload, len(payload))
        self._staging = (host, capacity)
        # A reusable buffer keeps its block until it is garbage (no submission holds it then).
        self._release_staging = weakref.finalize(self, device.release_later, device.staging.release, host, capacity)

    def _segments_for(self, queue) -> list[tuple[list[Any], Command | None]]:
        """The commands as runs of prepared calls (``GpuApi.prepare_*``), each run followed by the
        command through binding-table slots that ends it (None for the last run): slot commands
        are resolved at each submission, everything else was resolved once."""
        api = self.device.api
        stream = queue.stream
        staging = self._staging[0] if self._staging else 0
        segments: list[tuple[list[Any], Command | None]] = []
        calls: list[Any] = []
        append = calls.append
        prepare_launch = api.prepare_launch
        params = self.args.params_address(0, 1)  # ArgArena.params_address, inlined: per dispatch
        for level in self.levels:
            for command in level:
                kind = type(command)
                if kind is Dispatch or kind is SlotDispatch:
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
                    append(api.prepare_upload(target.ptr, staging + command.staging_offset, command.length, stream))
                else:
                    segments.append((calls, command))
                    calls = []
                    append = calls.append
        segments.append((calls, None))
        return segments

    def issuer(self, queue, table: Sequence[Binding] | None) -> Callable[[], None] | None:
        """What issues this command buffer on ``queue`` with ``table`` (called once per submission,
        with the queue's lock held): with no command through a binding-table slot, its one run of
        prepared calls, the shim's ``run_prepared`` itself."""
        segments = self._segments.get(queue.index)
        if segments is None:
            segments = self._segments[queue.index] = self._segments_for(queue)
        if self.slot_dispatches:  # (serialized: a launch copies the patched arguments before returning)
            return self.serialized(functools.partial(self._issue_patched, segments, table, queue.stream))
        if len(segments) == 1:
            return functools.partial(self.device.api.run_prepared, segments[0][0])
        return functools.partial(self._issue_segments, segments, table, queue.stream)

    def _issue_patched(self, segments: list[tuple[list[Any], Command | None]], table: Sequence[Binding] | None,
                       stream: Any) -> None:
        self.patch_slot_args(table)
        self._issue_segments(segments, table, stream)

    def _issue_segments(self, segments: list[tuple[list[Any], Command | None]], table: Sequence[Binding] | None,
                        stream: Any) -> None:
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
            api.memcpy_htod_async(dst, self._staging[0] + command.staging_offset, command.length, stream)  # type: ignore[index]

    def retired(self) -> None:
        super().retired()
        if self._release_staging is not None:
            self._release_staging()  # the one submission completed: the block can serve others
            self._release_staging = None
