"""Every argument and state check of the HAL core, each in one place.

Public methods of the core objects call these before any driver hook runs; hot
paths call them too (each check starts with the common well-formed case), they
never inline a second copy. A bad argument raises a ``hal.HalError`` subclass
whose message names the argument and the value, before anything is changed.

Integer arguments accept Python ints and numpy integer scalars (anything with
``__index__``) and reject bools, floats, strings and None. The common case,
``type(value) is int``, is tested first so it costs one comparison.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hal.errors import FailedPreconditionError, InvalidArgumentError, OutOfRangeError
from hal.types import BufferUsage, CommandBufferState

if TYPE_CHECKING:
    from hal.device import Device
    from hal.executable import Export

MAX_U64 = (1 << 64) - 1
UINT32_MAX = (1 << 32) - 1
#: Timeouts at or above this many seconds (or math.inf) wait without limit (threading's own bound).
UNLIMITED_TIMEOUT = min(threading.TIMEOUT_MAX, 1e9)

_EXECUTABLE = CommandBufferState.EXECUTABLE


# -- scalars ---------------------------------------------------------------------------------
def check_int(value: object, what: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """An int (numpy integers included; bools, floats, str, None excluded) in [minimum, maximum]."""
    if type(value) is not int:
        if isinstance(value, bool) or type(value).__name__ == "bool_":
            raise InvalidArgumentError(f"{what} must be an integer, got bool {value!r}")
        try:
            value = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise InvalidArgumentError(f"{what} must be an integer, got {type(value).__name__} {value!r}") from None
    if value < minimum:  # type: ignore[operator]
        raise InvalidArgumentError(f"{what} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:  # type: ignore[operator]
        raise InvalidArgumentError(f"{what} must be <= {maximum}, got {value}")
    return value  # type: ignore[return-value]


def check_u64(value: object, what: str) -> int:
    """A timeline value: an integer in [0, 2**64-1]."""
    if type(value) is int and 0 <= value <= MAX_U64:
        return value
    return check_int(value, what, maximum=MAX_U64)


def deadline_from(timeout: object) -> float | None:
    """The monotonic deadline of ``timeout`` seconds; None (no limit) for None, math.inf or huge values."""
    if timeout is None:
        return None
    if type(timeout) is not float and type(timeout) is not int:
        if isinstance(timeout, (bool, str, bytes)) or type(timeout).__name__ == "bool_":
            raise InvalidArgumentError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
        try:
            timeout = float(timeout)  # type: ignore[arg-type]  # numpy scalars, Decimal, Fraction
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"timeout must be None or a number of seconds >= 0, got {type(timeout).__name__} {timeout!r}") from None
    if not timeout >= 0:  # also rejects NaN
        raise InvalidArgumentError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    if timeout >= UNLIMITED_TIMEOUT or math.isinf(timeout):
        return None
    return time.monotonic() + timeout


def check_sequence(value: object, what: str, of: str = "values") -> Sequence:
    """A list, tuple or other non-string Sequence."""
    if type(value) is list or type(value) is tuple:
        return value  # type: ignore[return-value]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidArgumentError(f"{what} must be a sequence of {of}, got {type(value).__name__} {value!r}")
    return value


# -- buffers -------------------------------------------------------------------------------------
def is_live_buffer_of(buffer: object, device: Device) -> bool:
    """Whether ``buffer`` is a whole hal.Buffer of ``device`` that is not released (the fast path)."""
    return type(buffer) is Buffer and buffer.device is device and not buffer.released  # type: ignore[union-attr]


def check_buffer(buffer: object, device: Device, what: str) -> Buffer:
    """A live hal.Buffer of ``device``."""
    if not isinstance(buffer, Buffer):
        raise InvalidArgumentError(f"{what} must be a hal.Buffer, got {type(buffer).__name__} {buffer!r}")
    check_live(buffer, what)
    if buffer.device is not device:
        raise InvalidArgumentError(f"{what} belongs to another device ({buffer.device!r})")
    return buffer


def check_live(buffer: Buffer, what: str) -> None:
    if buffer.released:
        raise FailedPreconditionError(f"{what} has been released and can no longer be used")
    if buffer.device.closed:
        raise FailedPreconditionError(f"{what} belongs to a closed device ({buffer.device.info.uri})")


def check_range(buffer: Buffer, offset: object, length: object, what: str) -> tuple[int, int]:
    """``[offset, offset+length)`` inside ``buffer``; ``length=None`` means to its end."""
    offset = check_int(offset, f"{what} offset")
    size = buffer.size
    if offset > size:
        raise OutOfRangeError(f"{what} offset {offset} is past the end of a buffer of {size} bytes")
    length = size - offset if length is None else check_int(length, f"{what} length")
    if offset + length > size:
        raise OutOfRangeError(f"{what} [{offset}, {offset + length}) exceeds the buffer size of {size} bytes")
    return offset, length


def split_buffer_range(ref: object, what: str) -> tuple[Buffer, object, object]:
    """(buffer, offset, length) of ``Buffer`` or ``(Buffer, offset[, length])``, unchecked."""
    if isinstance(ref, Buffer):
        return ref, 0, None
    if isinstance(ref, tuple) and len(ref) in (2, 3) and isinstance(ref[0], Buffer):
        return ref[0], ref[1], (ref[2] if len(ref) == 3 else None)
    raise InvalidArgumentError(f"{what} must be a Buffer or a (Buffer, offset, length) tuple, got {ref!r}")


def check_binding(entry: object, device: Device, what: str) -> tuple[Buffer, int, int]:
    """A binding-table entry resolved to (buffer, offset, length)."""
    if is_live_buffer_of(entry, device):
        return entry, 0, entry.size  # type: ignore[return-value,union-attr]
    buffer, offset, length = split_buffer_range(entry, what)
    check_buffer(buffer, device, what)
    offset, length = check_range(buffer, offset, length, what)
    return buffer, offset, length


def check_buffer_ref(cb: CommandBuffer, ref: object, what: str, usage: BufferUsage,
                     alignment: int = 1) -> BufferRef:
    """A command's buffer operand: a Buffer, (Buffer, offset[, length]) or hal.Slot."""
    if isinstance(ref, Slot):
        return _slot_ref(cb, ref, what, usage, alignment)
    buffer, offset, length = split_buffer_range(ref, what)
    check_buffer(buffer, cb.device, what)
    if usage not in buffer.usage:
        raise FailedPreconditionError(f"{what} usage {buffer.usage} lacks {usage}")
    offset, length = check_range(buffer, offset, length, what)
    if alignment > 1 and ((buffer.offset + offset) % alignment or length % alignment):
        raise InvalidArgumentError(
            f"{what} offset {offset} and length {length} must be multiples of the "
            f"{alignment}-byte pattern length")
    return BufferRef(buffer, None, offset, length)


def _slot_ref(cb: CommandBuffer, slot: Slot, what: str, usage: BufferUsage, alignment: int) -> BufferRef:
    if cb.binding_capacity == 0:
        raise InvalidArgumentError(f"{what} uses {slot!r} but the command buffer has binding_capacity 0")
    index = check_int(slot.index, f"{what} slot index")
    if index >= cb.binding_capacity:
        raise InvalidArgumentError(
            f"{what} slot index {index} is not below the binding capacity {cb.binding_capacity}")
    offset = check_int(slot.offset, f"{what} slot offset")
    length = None if slot.length is None else check_int(slot.length, f"{what} slot length")
    if alignment > 1 and (offset % alignment or (length is not None and length % alignment)):
        raise InvalidArgumentError(
            f"{what} slot offset {offset} and length {length} must be multiples of the "
            f"{alignment}-byte pattern length")
    return BufferRef(None, index, offset, length)


# -- commands -----------------------------------------------------------------------------------
def check_pattern(pattern: object, pattern_length: object) -> tuple[int, int]:
    """A fill pattern of 1, 2 or 4 bytes that fits its length."""
    if type(pattern_length) is not int:
        pattern_length = check_int(pattern_length, "fill pattern_length")
    if pattern_length not in (1, 2, 4):
        raise InvalidArgumentError(f"fill pattern_length must be 1, 2 or 4, got {pattern_length!r}")
    if type(pattern) is not int:
        pattern = check_int(pattern, "fill pattern")
    if pattern < 0 or pattern >> (8 * pattern_length):
        raise InvalidArgumentError(
            f"fill pattern {pattern:#x} does not fit in pattern_length {pattern_length} bytes")
    return pattern, pattern_length  # type: ignore[return-value]


def check_workgroups(workgroups: object, limits: tuple[int, int, int]) -> tuple[int, int, int]:
    """A 3-D workgroup count within the device limits from an int or 1-3 ints."""
    if type(workgroups) is tuple and len(workgroups) == 3:
        x, y, z = workgroups
        if type(x) is int and type(y) is int and type(z) is int and 0 <= x <= limits[0] \
                and 0 <= y <= limits[1] and 0 <= z <= limits[2]:
            return workgroups  # type: ignore[return-value]
    if hasattr(workgroups, "__index__"):
        grid: tuple = (workgroups, 1, 1)
    elif isinstance(workgroups, Sequence) and not isinstance(workgroups, (str, bytes)) \
            and 1 <= len(workgroups) <= 3:
        grid = tuple(workgroups) + (1,) * (3 - len(workgroups))
    else:
        raise InvalidArgumentError(f"dispatch workgroups must be an int or 1-3 ints, got {workgroups!r}")
    counts = []
    for axis, (count, limit) in enumerate(zip(grid, limits)):
        count = check_int(count, f"dispatch workgroups[{axis}]")
        if count > limit:
            raise InvalidArgumentError(
                f"dispatch workgroups[{axis}] = {count} exceeds the device limit {limit}")
        counts.append(count)
    return tuple(counts)  # type: ignore[return-value]


def check_constants(export: Export, constants: object) -> tuple[int, ...]:
    """The export's uint32 constants (negative int32 values wrap to their bits)."""
    if (type(constants) is tuple or type(constants) is list) and len(constants) == export.constants:
        for value in constants:
            if type(value) is not int or not 0 <= value <= UINT32_MAX:
                break
        else:
            return tuple(constants)
    constants = check_sequence(constants, "dispatch constants", "ints")
    if len(constants) != export.constants:
        raise InvalidArgumentError(
            f"export {export.name!r} takes {export.constants} constants, got {len(constants)}")
    values = []
    for i, value in enumerate(constants):
        if isinstance(value, float):
            raise InvalidArgumentError(
                f"dispatch constant {i} must be an int (pass floats as their uint32 bits), got {value!r}")
        value = check_int(value, f"dispatch constant {i}", minimum=-(1 << 31), maximum=UINT32_MAX)
        values.append(value & UINT32_MAX)
    return tuple(values)


def check_update_data(data: object, limit: int) -> bytes:
    try:
        payload = memoryview(data).cast("B").tobytes()  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(
            f"update data must be bytes-like or a contiguous array, got {type(data).__name__}") from None
    if len(payload) > limit:
        raise InvalidArgumentError(f"update data is {len(payload)} bytes; update_buffer takes at most {limit}")
    return payload


def check_no_overlap(src: BufferRef, dst: BufferRef, what: str = "copy") -> None:
    """Direct copy ranges must not overlap within one allocation."""
    if src.buffer is None or dst.buffer is None or src.buffer.root is not dst.buffer.root:
        return
    a = src.buffer.offset + src.offset
    b = dst.buffer.offset + dst.offset
    if a < b + dst.length and b < a + src.length:  # type: ignore[operator]
        raise InvalidArgumentError(
            f"{what} source [{a}, {a + src.length}) and target [{b}, {b + dst.length}) "  # type: ignore[operator]
            "overlap in the same allocation")


# -- submissions ----------------------------------------------------------------------------------
def check_queue(device: Device, queue: object) -> int:
    queue = check_int(queue, "queue")
    if queue >= device.queue_count:
        raise InvalidArgumentError(f"queue {queue} does not exist; the device has {device.queue_count}")
    return queue


def check_fences(fences: object, what: str, device: Device | None = None) -> list[Fence]:
    """A fence list: a sequence of (Semaphore, int in [0, 2**64-1]) pairs of ``device``."""
    if type(fences) is list or type(fences) is tuple:
        if not fences:
            return []
        for pair in fences:  # the common case: well-formed (Semaphore, int) pairs of this device
            if type(pair) is not tuple or len(pair) != 2:
                break
            sem, value = pair
            if type(value) is not int or not 0 <= value <= MAX_U64 or not isinstance(sem, Semaphore) \
                    or (device is not None and sem.device is not device):
                break
        else:
            return list(fences)
    elif fences is None:
        return []
    return _check_fences_slowly(fences, what, device)


def _check_fences_slowly(fences: object, what: str, device: Device | None) -> list[Fence]:
    fences = check_sequence(fences, what, "(Semaphore, value) pairs")
    result = []
    for i, pair in enumerate(fences):
        if not isinstance(pair, Sequence) or isinstance(pair, (str, bytes)) or len(pair) != 2 \
                or not isinstance(pair[0], Semaphore):
            raise InvalidArgumentError(f"{what}[{i}] must be a (Semaphore, value) pair, got {pair!r}")
        value = check_u64(pair[1], f"{what}[{i}] value")
        if device is not None and pair[0].device is not device:
            raise InvalidArgumentError(f"{what}[{i}] semaphore belongs to another device ({pair[0].device!r})")
        result.append((pair[0], value))
    return result


def check_signals(signals: list[Fence]) -> None:
    """Each signal value is above its semaphore's current value (a failed one takes anything)."""
    for sem, value in signals:
        if value <= sem.current_value and sem.failure is None:
            raise InvalidArgumentError(
                f"signal[{signals.index((sem, value))}] value {value} is not above the semaphore's "
                f"current value {sem.current_value}")


def check_signal_fences(fences: object, device: Device) -> list[Fence]:
    """A submission's signal list: ``check_fences`` and ``check_signals`` in one. The usual list of
    one well-formed pair whose value is above its semaphore's is recognised in one pass; anything
    else takes the two checks, which report what is wrong."""
    if type(fences) is list and len(fences) == 1:
        pair = fences[0]
        if type(pair) is tuple and len(pair) == 2:
            sem, value = pair
            if type(value) is int and isinstance(sem, Semaphore) and sem.device is device \
                    and sem.current_value < value <= MAX_U64 and sem.failure is None:
                return [pair]
    signals = check_fences(fences, "signal", device)
    check_signals(signals)
    return signals


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
    if len(one_shot) > 1 and len({id(cb) for cb in one_shot}) != len(one_shot):
        raise FailedPreconditionError("a ONE_SHOT command buffer appears twice in one submission")
    return command_buffers, one_shot, uses_tables  # type: ignore[return-value]


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
    for i, (cb, table) in enumerate(zip(command_buffers, binding_tables)):  # type: ignore[call-overload]
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
    return resolved


def check_slot_uses(cb: CommandBuffer, table: Sequence[Binding], index: int = 0) -> None:
    """Every use of a slot in ``cb`` fits the entry ``table`` gives it: usage, range, alignment,
    and commands whose operands come from two entries (copies) agree on length and do not overlap."""
    for use in cb.slot_uses:
        ref = use.ref
        buffer, base, size = table[ref.slot]  # type: ignore[index]
        if use.usage not in buffer.usage:
            raise FailedPreconditionError(
                f"binding_tables[{index}] entry {ref.slot} (used as {use.what}) lacks usage {use.usage}")
        length = size - ref.offset if ref.length is None else ref.length
        if ref.offset + length > size or length < 0:
            raise OutOfRangeError(
                f"{use.what} [{ref.offset}, {ref.offset + length}) exceeds binding_tables[{index}] entry "
                f"{ref.slot} of {size} bytes")
        if use.alignment > 1 and ((buffer.offset + base + ref.offset) % use.alignment or length % use.alignment):
            raise InvalidArgumentError(
                f"{use.what} through binding_tables[{index}] entry {ref.slot} is not aligned to the "
                f"{use.alignment}-byte pattern length")
    for src, dst in cb.slot_copies:
        s_buffer, s_offset, s_length = src.resolve(table)
        d_buffer, d_offset, d_length = dst.resolve(table)
        if s_length != d_length:
            raise InvalidArgumentError(
                f"copy source length {s_length} differs from target length {d_length} "
                f"through binding_tables[{index}] (entries {src.slot}, {dst.slot})")
        check_no_overlap(BufferRef(s_buffer, None, s_offset, s_length), BufferRef(d_buffer, None, d_offset, d_length))
    for routine, checked, refs in cb.slot_routines:
        routine.check_lengths(checked, [ref.resolve(table)[2] for ref in refs])


# The checked classes import this module's checks once they are defined (see their modules' ends).
from hal.buffer import Buffer  # noqa: E402
from hal.command_buffer import Binding, BufferRef, CommandBuffer, Slot  # noqa: E402
from hal.semaphore import Fence, Semaphore  # noqa: E402
