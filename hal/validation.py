"""The HAL core's checks of buffers, buffer references, command buffers and binding tables.

Public methods of the core objects call these before any driver hook runs; hot paths call them
too (each check starts with the common well-formed case), they never inline a second copy. A bad
argument raises a ``hal.HalError`` subclass whose message names the argument and the value, before
anything is changed. The checks that need no core class live in ``hal.checks`` and the fence
checks in ``hal.semaphore``; this module re-exports both, so ``hal.validation`` names every check.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hal.buffer import (  # noqa: F401  (re-exported)
    check_binding,
    check_buffer,
    is_live_buffer_of,
    split_buffer_range,
)
from hal.checks import (  # noqa: F401  (re-exported)
    MAX_U64,
    UINT32_MAX,
    UNLIMITED_TIMEOUT,
    check_constants,
    check_int,
    check_live,
    check_pattern,
    check_queue,
    check_range,
    check_sequence,
    check_u64,
    check_update_data,
    check_workgroups,
    deadline_from,
)
from hal.command_buffer import (  # noqa: F401  (re-exported)
    CommandBuffer,
    check_buffer_ref,
    check_no_overlap,
    check_slot_uses,
)
from hal.errors import FailedPreconditionError, InvalidArgumentError
from hal.semaphore import check_fences, check_signal_fences, check_signals  # noqa: F401  (re-exported)
from hal.types import CommandBufferState

if TYPE_CHECKING:
    from hal.command_buffer import Binding
    from hal.device import Device

_EXECUTABLE = CommandBufferState.EXECUTABLE


# -- submissions ----------------------------------------------------------------------------------
def check_command_buffers(device: Device, command_buffers: object) -> tuple[list, list, bool]:
    """(command buffers, the one-shot ones among them, whether any takes a binding table)."""
    if isinstance(command_buffers, CommandBuffer):
        command_buffers = [command_buffers]
    elif type(command_buffers) is list:
        command_buffers = list(command_buffers)  # the driver's own: the caller's list may change later
    else:
        command_buffers = list(check_sequence(command_buffers, "command_buffers", "hal.CommandBuffer"))
    one_shot = []
    uses_tables = False
    for i, cb in enumerate(command_buffers):  # type: ignore[arg-type]
        if not isinstance(cb, CommandBuffer):
            raise InvalidArgumentError(f"command_buffers[{i}] is not a hal.CommandBuffer: {cb!r}")
        if cb.device is not device:
            raise InvalidArgumentError(f"command_buffers[{i}] belongs to another device")
        state = cb.state
        if state is not _EXECUTABLE:
            if state is CommandBufferState.SUBMITTED:
                raise FailedPreconditionError(f"command_buffers[{i}] is ONE_SHOT and was already submitted")
            raise FailedPreconditionError(f"command_buffers[{i}] is {state.value}; end() it before submitting")
        if not cb.reusable:
            one_shot.append(cb)
        if cb.binding_capacity:
            uses_tables = True
    check_one_shot_once(one_shot, "one submission")
    return command_buffers, one_shot, uses_tables  # type: ignore[return-value]


def check_one_shot_once(one_shot: list[CommandBuffer], where: str) -> None:
    """A ONE_SHOT command buffer runs once: FailedPreconditionError if it appears twice ``where``."""
    if len(one_shot) > 1 and len({id(cb) for cb in one_shot}) != len(one_shot):
        raise FailedPreconditionError(f"a ONE_SHOT command buffer appears twice in {where}")


def check_direct_buffers(cb: CommandBuffer, index: int) -> None:
    """Buffers a recording references directly (not through a slot) are all still live."""
    for buffer in cb.direct_buffers:
        if buffer.released:
            raise FailedPreconditionError(
                f"command_buffers[{index}] references a buffer that was released ({buffer!r}); "
                "it cannot be submitted")


def check_binding_tables(device: Device, command_buffers: list[CommandBuffer],
                         binding_tables: object) -> list[list[Binding] | None]:
    """Resolve and check one binding table per command buffer as a whole, against every slot use."""
    if binding_tables is None:
        binding_tables = [None] * len(command_buffers)
    else:
        binding_tables = check_sequence(binding_tables, "binding_tables", "binding tables")
    if len(binding_tables) != len(command_buffers):  # type: ignore[arg-type]
        raise InvalidArgumentError(
            f"binding_tables must be None or hold one table per command buffer "
            f"({len(command_buffers)}), got {len(binding_tables)}")  # type: ignore[arg-type]
    resolved: list[list[Binding] | None] = []
    # A command buffer given the same table object again (a batch repeating a recording) gets the same
    # resolved table: drivers recognise a table they were last bound with by identity.
    seen: dict[tuple[int, int], list[Binding]] = {}
    for i, (cb, table) in enumerate(zip(command_buffers, binding_tables)):  # type: ignore[call-overload]
        again = seen.get((id(cb), id(table)))
        if again is not None:
            resolved.append(again)
            continue
        capacity = cb.binding_capacity
        if capacity == 0:
            if table:
                raise InvalidArgumentError(f"binding_tables[{i}] given for a command buffer with binding_capacity 0")
            resolved.append(None)
            continue
        if table is None:
            raise InvalidArgumentError(
                f"command_buffers[{i}] has binding_capacity {capacity} and needs a binding table")
        table = check_sequence(table, f"binding_tables[{i}]", "buffers or (buffer, offset, length)")
        if len(table) < capacity:
            raise InvalidArgumentError(
                f"binding_tables[{i}] has {len(table)} entries; the command buffer needs {capacity}")
        entries = [check_binding(entry, device, f"binding_tables[{i}][{j}]") for j, entry in enumerate(table)]
        check_slot_uses(cb, entries, i)
        resolved.append(entries)
        seen[id(cb), id(table)] = entries
    return resolved


