"""Kernel arguments packed once per command buffer into ``void**`` arrays.

A launch through ``cuLaunchKernel``/``hipModuleLaunchKernel`` takes an array of
pointers, one per kernel parameter, each pointing at the parameter's value. The
tuple form of the Python bindings packs that array on every launch (7.6 µs a
launch against 5.3 µs with a pre-packed address on an H100), so a command buffer
packs every dispatch's arguments at ``end()``: one uint64 array of values (one
8-byte slot per parameter: binding pointers, uint32 constants in the low half),
and one uint64 array of the slots' addresses. A launch then passes one int.

Slots stay writable: a binding that goes through a binding-table Slot is
patched in place before each submission (the driver copies the values at launch
or at ``exec_set_kernel_params`` time, so patching never races the GPU).
"""

from __future__ import annotations

import numpy as np


class ArgArena:
    """Argument slots of many dispatches; ``add`` while recording, ``pack`` once at the end."""

    __slots__ = ("pending", "values", "pointers", "_values_address", "_pointers_address")

    def __init__(self) -> None:
        #: The slots added since the last pack (recording appends to it directly).
        self.pending: list[int] = []
        self.values: np.ndarray | None = None
        self.pointers: np.ndarray | None = None
        self._values_address = 0
        self._pointers_address = 0

    def add(self, pointers: list[int], constants: tuple[int, ...]) -> int:
        """Reserve slots for one dispatch's arguments; returns the index of its first slot."""
        start = len(self.pending)
        self.pending.extend(pointers)
        self.pending.extend(constants)
        return start

    @property
    def next_index(self) -> int:
        """The slot index the next ``add`` starts at."""
        return len(self.pending)

    def pack(self) -> None:
        """Build the value and address arrays (after the last ``add``)."""
        count = len(self.pending)
        self.values = np.array(self.pending, dtype=np.uint64) if count else np.zeros(1, np.uint64)
        self._values_address = self.values.ctypes.data
        self.pointers = (np.arange(max(count, 1), dtype=np.uint64) * np.uint64(8)
                         + np.uint64(self._values_address))
        self._pointers_address = self.pointers.ctypes.data
        self.pending = []

    def params_address(self, start: int, count: int) -> int:
        """The ``void**`` to pass for a dispatch whose slots begin at ``start`` (0 without parameters)."""
        return self._pointers_address + 8 * start if count else 0

    def set(self, index: int, value: int) -> None:
        self.values[index] = value  # type: ignore[index]
