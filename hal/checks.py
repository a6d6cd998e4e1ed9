"""The HAL's argument checks that need no core class: integers, timeouts, sequences, ranges,
fill patterns, workgroup counts, constants, inline data, queues.

Each check starts with the common well-formed case and raises a ``hal.HalError`` subclass naming
the argument and the value otherwise. Integer arguments accept Python ints and numpy integer
scalars (anything with ``__index__``) and reject bools, floats, strings and None; the common case,
``type(value) is int``, is tested first so it costs one comparison. ``hal.validation`` holds the
checks of buffers, command buffers and binding tables, ``hal.semaphore`` those of fences.
"""

from __future__ import annotations

import math
import operator
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hal.errors import FailedPreconditionError, InvalidArgumentError, OutOfRangeError

if TYPE_CHECKING:
    from hal.buffer import Buffer
    from hal.device import Device
    from hal.executable import Export

MAX_U64 = (1 << 64) - 1
UINT32_MAX = (1 << 32) - 1
_LIST_OR_TUPLE = (list, tuple)
#: Timeouts at or above this many seconds (or math.inf) wait without limit (threading's own bound).
UNLIMITED_TIMEOUT = min(threading.TIMEOUT_MAX, 1e9)


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
    if type(constants) in _LIST_OR_TUPLE and len(constants) == export.constants:
        for value in constants:
            if type(value) is not int or value >> 32:  # (nonzero for a negative value too)
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


def check_queue(device: Device, queue: object) -> int:
    queue = check_int(queue, "queue")
    if queue >= device.queue_count:
        raise InvalidArgumentError(f"queue {queue} does not exist; the device has {device.queue_count}")
    return queue

