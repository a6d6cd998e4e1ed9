"""Stream command buffer: recorded commands issued one by one on a queue's stream.

Recording resolves addresses and ``end()`` packs kernel arguments, so issuing
is a loop of prepared calls (the API function and its complete argument tuple,
built once): ``cuLaunchKernel(function, grid, block, 0, stream, void**, 0)``,
``cuMemsetD8/16/32Async``, ``cuMemcpyDtoDAsync``, ``cuMemcpyHtoDAsync``.
The call list is built once per queue and reused by every later submission of
a reusable buffer; only commands through binding-table slots are resolved at
submission. Barriers need nothing: a stream runs its work in order.

``update_buffer`` payloads are copied at ``end()`` into one pinned staging block
that stays alive until the submission using it completed.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from typing import Any

from hal.command_buffer import Binding
from hal.drivers.gpu.recording import Command, Copy, Dispatch, Fill, RecordingCommandBuffer, Update


class StreamCommandBuffer(RecordingCommandBuffer):
    kind = "stream"

    def __init__(self, device, mode, binding_capacity: int) -> None:
        super().__init__(device, mode, binding_capacity)
        self._calls: dict[int, list[tuple[Any, Any, str]]] = {}
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

    def _calls_for(self, queue) -> list[tuple[Any, Any, str]]:
        """A prepared call per command (the API function, its argument tuple, its name for errors);
        ``(None, command, "")`` for commands through binding-table slots."""
        api = self.device.api
        stream = queue.stream
        staging = self._staging[0] if self._staging else 0
        calls: list[tuple[Any, Any, str]] = []
        append = calls.append
        prepare_launch = api.prepare_launch
        params_address = self.args.params_address
        for level in self.levels:
            for command in level:
                kind = type(command)
                if kind is Dispatch:
                    append(prepare_launch(command.function, command.grid, command.block, stream,
                                          params_address(command.arg_start, command.arg_count)))
                elif kind is Fill:
                    target = command.target
                    if target.slot is None:
                        size = command.element_size
                        calls.append(api.prepare_memset(target.ptr, command.value, size, target.length // size, stream))
                    else:
                        calls.append((None, command, ""))
                elif kind is Copy:
                    source, target = command.source, command.target
                    if source.slot is None and target.slot is None:
                        calls.append(api.prepare_copy(target.ptr, source.ptr, target.length, stream))
                    else:
                        calls.append((None, command, ""))
                elif kind is Update:
                    target = command.target
                    if target.slot is None:
                        calls.append(api.prepare_upload(target.ptr, staging + command.staging_offset, command.length,
                                                        stream))
                    else:
                        calls.append((None, command, ""))
        return calls

    def issue(self, queue, table: Sequence[Binding] | None, submission) -> None:
        calls = self._calls.get(queue.index)
        if calls is None:
            calls = self._calls[queue.index] = self._calls_for(queue)
        if self.slot_dispatches:
            with self.issue_lock:  # cuLaunchKernel copies the patched arguments before returning
                self.patch_slot_args(table)
                self._issue_calls(calls, table, queue.stream)
        else:
            self._issue_calls(calls, table, queue.stream)

    def _issue_calls(self, calls: list[tuple[Any, Any, str]], table: Sequence[Binding] | None, stream: Any) -> None:
        for call, args, name in calls:
            if call is None:
                self._issue_through_slots(args, table, stream)
            else:
                status = call(*args)[0]
                if status:
                    self.device.api.fail(status, name)

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
        elif kind is Update:
            dst, _ = command.target.resolve(table)
            api.memcpy_htod_async(dst, self._staging[0] + command.staging_offset, command.length, stream)  # type: ignore[index]

    def retired(self) -> None:
        if not self.reusable and self._release_staging is not None:
            self._release_staging()  # the one submission completed: the block can serve others
            self._release_staging = None
