"""Environment variables, read one way everywhere: switches take 1/0, true/false, yes/no, on/off.

A value outside those words is an error naming the variable, not a silent default: a typo in
``HAL_PLUGINS_AUTOLOAD=fasle`` must not quietly load every plugin.
"""

from __future__ import annotations

import os

from hal.errors import InvalidArgumentError

ON_WORDS = frozenset({"1", "true", "yes", "on"})
OFF_WORDS = frozenset({"0", "false", "no", "off"})
SWITCH_WORDS = "1/0, true/false, yes/no, on/off"


def text(name: str) -> str | None:
    """The variable's value stripped of blanks; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def parse_switch(value: str, where: str) -> bool:
    """One switch word (any case) as a bool; ``where`` names the value's origin in the error."""
    word = value.strip().lower()
    if word in ON_WORDS:
        return True
    if word in OFF_WORDS:
        return False
    raise InvalidArgumentError(f"{where}={value!r} is not a switch; use one of {SWITCH_WORDS}")


def is_off(value: str) -> bool:
    """Whether a value that is otherwise a path or name says "off" (as ``HAL_CACHE_DIR=off``)."""
    return value.strip().lower() in OFF_WORDS or value.strip().lower() == "none"


def switch(name: str, default: bool) -> bool:
    """A boolean environment switch; ``default`` when unset or blank."""
    value = text(name)
    return default if value is None else parse_switch(value, name)


def integer(name: str, default: int, *, minimum: int = 0) -> int:
    """An integer environment setting of at least ``minimum``; ``default`` when unset or blank."""
    value = text(name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise InvalidArgumentError(f"{name}={value!r} is not an integer") from None
    if number < minimum:
        raise InvalidArgumentError(f"{name}={number} is below its minimum {minimum}")
    return number
