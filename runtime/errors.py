"""The runtime's validation errors: `hal.HalError` subclasses that are also the builtin exceptions
numpy code catches (`except IndexError`, `except ValueError`, `except TypeError`)."""

from __future__ import annotations

import hal


class InvalidValueError(hal.InvalidArgumentError, ValueError):
    """A value numpy would reject with ValueError: shapes that do not broadcast or reshape, empty reductions."""


class InvalidIndexError(hal.InvalidArgumentError, IndexError):
    """An index out of bounds, or too many or invalid indices."""


class AxisError(hal.InvalidArgumentError, ValueError, IndexError):
    """An axis out of bounds for the array's dimensions (both a ValueError and an IndexError, as numpy's)."""


class InvalidTypeError(hal.InvalidArgumentError, TypeError):
    """An unsupported dtype or operand type, or an op the dtype does not have."""


class ArrayTooLargeError(hal.ResourceExhaustedError):
    """An array larger than the device's largest allocation (out of memory, as the allocation would have
    been), or of more than 2**31 - 1 elements (the most the runtime's kernels address), raised when the op
    making it is built."""


class ScalarOverflowError(hal.InvalidArgumentError, OverflowError):
    """A Python integer that the array's dtype cannot represent (NEP 50)."""


class TracingError(hal.FailedPreconditionError, TypeError):
    """A value was needed while `rt.compile` traced the function (Python control flow on array values)."""


class DeviceFallbackWarning(RuntimeWarning):
    """An unpickled array was put on the default device because its own device is missing here."""
