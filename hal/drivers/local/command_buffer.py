"""CPU command buffers: each command becomes a closure over the binding table.

Execution on the CPU is sequential, so barriers need no work; a command
buffer runs its closures in recording order.

A dispatch of a reusable command buffer keeps the byte views it handed its
kernel for the last binding table: replayed with an equal table (the same
buffers and ranges; the core has checked they are live), it hands the kernel
the very same list of views again, without resolving a slot or making a view.
Kernels may rely on that identity to keep work prepared for those views (the
runtime's CPU program does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hal.command_buffer import Binding, BufferRef, CommandBuffer
from hal.drivers.local.allocator import span
from hal.executable import Executable, Export

Op = Callable[[Sequence[Binding] | None], None]
_PATTERN_DTYPES = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}


def _bytes(ref: BufferRef, table: Sequence[Binding] | None) -> np.ndarray:
    buffer, offset, length = ref.resolve(table)
    return span(buffer, offset, length)


class LocalCommandBuffer(CommandBuffer):
    def __init__(self, device, mode, binding_capacity) -> None:
        super().__init__(device, mode, binding_capacity)
        self.ops: list[Op] = []

    def execute(self, table: Sequence[Binding] | None) -> None:
        for op in self.ops:
            op(table)

    def _fill(self, target: BufferRef, pattern: int, pattern_length: int) -> None:
        dtype = _PATTERN_DTYPES[pattern_length]

        def fill(table):
            _bytes(target, table).view(dtype)[:] = pattern

        self.ops.append(fill)

    def _update(self, data: bytes, target: BufferRef) -> None:
        source = np.frombuffer(data, dtype=np.uint8)

        def update(table):
            _bytes(target, table)[:] = source

        self.ops.append(update)

    def _copy(self, source: BufferRef, target: BufferRef) -> None:
        def copy(table):
            _bytes(target, table)[:] = _bytes(source, table)

        self.ops.append(copy)

    def _barrier(self) -> None:
        pass  # commands run one after another on the CPU

    def _dispatch(self, executable: Executable, ordinal: int, export: Export,
                  workgroups: tuple[int, int, int], constants: tuple[int, ...],
                  bindings: list[BufferRef]) -> None:
        function = executable.functions[ordinal]  # type: ignore[attr-defined]
        values = list(constants)
        if not self.reusable:
            def dispatch(table):
                function(workgroups, [memoryview(_bytes(ref, table)) for ref in bindings], list(values))

            self.ops.append(dispatch)
            return
        last: list = [None, None]  # [the table the views were made for, the views]

        def replay(table):
            if table != last[0] or last[1] is None:
                last[1] = [memoryview(_bytes(ref, table)) for ref in bindings]
                last[0] = None if table is None else type(table)(table)  # a snapshot (the caller may reuse a list)
            function(workgroups, last[1], list(values))

        self.ops.append(replay)
