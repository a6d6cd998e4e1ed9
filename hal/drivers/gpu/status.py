"""Errors shared by the GPU drivers and the table-driven mapping of API result codes.

Each driver lists its API's result codes by name in a ``StatusTable``; ``raise_for``
turns a failing code into the typed HalError, carrying the API function that
failed and the driver's own description of the error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hal.errors import HalError, InternalError, InvalidArgumentError


class DeviceLostError(InternalError):
    """A sticky device fault (illegal address, trap, ...): the GPU context is unusable from now on."""


class CompileError(InvalidArgumentError):
    """Kernel source that does not compile; the message carries the compiler's log."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class StatusTable:
    """Maps an API's result codes to HalError classes.

    ``classes`` maps code names to error classes; codes in ``sticky`` mean the
    context is lost (DeviceLostError); unknown codes become InternalError.
    ``describe(code)`` returns the API's error string (it may need the driver
    library, so it must not raise).
    """

    def __init__(self, api_name: str, classes: dict[str, type[HalError]], sticky: Iterable[str],
                 describe: Callable[[object], str]) -> None:
        self.api_name = api_name
        self.classes = classes
        self.sticky = frozenset(sticky)
        self.describe = describe

    def error_class(self, code_name: str) -> type[HalError]:
        if code_name in self.sticky:
            return DeviceLostError
        return self.classes.get(code_name, InternalError)

    def error(self, code: object, function: str, detail: str = "") -> HalError:
        name = getattr(code, "name", None) or str(code)
        value = int(code)  # type: ignore[call-overload]
        text = self.describe(code)
        message = f"{function} failed: {name} ({value})"
        if text and text != name:
            message += f": {text}"
        if detail:
            message += f"; {detail}"
        error = self.error_class(name)(message)
        error.api_function = function  # type: ignore[attr-defined]
        error.api_code = name  # type: ignore[attr-defined]
        return error
