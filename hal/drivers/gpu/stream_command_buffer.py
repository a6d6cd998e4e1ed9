"""Stream command buffer: recorded commands issued one by one on a queue's stream (``StreamIssue``).

``update_buffer`` payloads are copied at ``end()`` into one pinned staging block
that stays alive until the submission using it completed.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable, Sequence

from hal import interrupts
from hal.command_buffer import Binding
from hal.drivers.gpu.recording import RecordingCommandBuffer
from hal.drivers.gpu.stream_issue import StreamIssue


class StreamCommandBuffer(RecordingCommandBuffer):
    kind = "stream"

    def __init__(self, device, mode, binding_capacity: int) -> None:
        super().__init__(device, mode, binding_capacity)
        #: Issues the commands (made at ``end()``, with the staging block packed).
        self._issue: StreamIssue | None = None
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
        self._release_staging = interrupts.finalize(self, device.release_later, device.staging.release, host,
                                                     capacity)

    def _recorded(self) -> None:
        self._issue = StreamIssue(self.device, self._staging[0] if self._staging else 0, staging_on_device=False)

    def issuer(self, queue, table: Sequence[Binding] | None) -> Callable[[], None] | None:
        """What issues this command buffer on ``queue`` with ``table`` (``StreamIssue.issuer``)."""
        return self._issue.issuer(self, queue, table)  # type: ignore[union-attr]

    def retired(self) -> None:
        super().retired()
        if self._release_staging is not None:
            self._release_staging()  # the one submission completed: the block can serve others
            self._release_staging = None
