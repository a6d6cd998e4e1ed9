"""Status codes and the typed error hierarchy every HAL call raises.

One subclass per status code, so callers can catch exactly the failure they
handle (``except hal.ResourceExhaustedError``) while ``except hal.HalError``
still catches everything the HAL raises.
"""

from __future__ import annotations

import enum


class StatusCode(enum.IntEnum):
    """Canonical status codes (the gRPC/absl set IREE also uses, plus INCOMPATIBLE)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16
    INCOMPATIBLE = 17


#: The subclass of each status code (the first one declared), for ``HalError(code, message)``.
_BY_CODE: dict[StatusCode, type[HalError]] = {}


class HalError(Exception):
    """Base of every error the HAL raises.

    ``HalError(code, message)`` builds the subclass matching ``code``;
    subclasses take the message alone: ``InvalidArgumentError("size must be > 0")``.
    """

    code: StatusCode = StatusCode.UNKNOWN

    def __new__(cls, *args: object) -> HalError:
        if cls is HalError and len(args) == 2 and isinstance(args[0], (StatusCode, int)):
            target = _BY_CODE.get(StatusCode(args[0]), HalError)
            return super().__new__(target)
        return super().__new__(cls)

    def __init__(self, *args: object) -> None:
        if len(args) == 2 and isinstance(args[0], (StatusCode, int)):
            code, message = StatusCode(args[0]), str(args[1])
        elif len(args) == 1:
            code, message = type(self).code, str(args[0])
        else:
            raise TypeError("HalError(code, message) or Subclass(message)")
        super().__init__(message)
        self.code = code
        self.message = message

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        _BY_CODE.setdefault(cls.code, cls)

    def __str__(self) -> str:
        text = f"{self.code.name}: {self.message}"
        cause = self.__cause__
        if cause is not None and str(cause) not in self.message:
            text += f" (caused by {type(cause).__name__}: {cause})"
        return text


class CancelledError(HalError):
    code = StatusCode.CANCELLED


class InvalidArgumentError(HalError):
    code = StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(HalError):
    code = StatusCode.DEADLINE_EXCEEDED


class NotFoundError(HalError):
    code = StatusCode.NOT_FOUND


class AlreadyExistsError(HalError):
    code = StatusCode.ALREADY_EXISTS


class PermissionDeniedError(HalError):
    code = StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(HalError):
    code = StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(HalError):
    code = StatusCode.FAILED_PRECONDITION


class AbortedError(HalError):
    code = StatusCode.ABORTED


class OutOfRangeError(HalError):
    code = StatusCode.OUT_OF_RANGE


class UnimplementedError(HalError):
    code = StatusCode.UNIMPLEMENTED


class InternalError(HalError):
    code = StatusCode.INTERNAL


class UnavailableError(HalError):
    code = StatusCode.UNAVAILABLE


class DataLossError(HalError):
    code = StatusCode.DATA_LOSS


class IncompatibleError(HalError):
    code = StatusCode.INCOMPATIBLE


def aborted_by(cause: BaseException, context: str) -> AbortedError:
    """An AbortedError whose message and ``__cause__`` carry the original failure."""
    err = AbortedError(f"{context}: {type(cause).__name__}: {cause}")
    err.__cause__ = cause
    return err
