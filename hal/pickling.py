"""HAL objects stand for resources of this process (device memory, queues, threads, driver handles):
pickling one would copy a handle that means nothing elsewhere. Each says so with a typed error naming
what to send instead, rather than failing on whichever lock it happens to hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from hal.errors import UnimplementedError


class NotPicklableError(UnimplementedError, TypeError):
    """A HAL object was pickled (or copied through pickling's protocol). Also a TypeError, as Python's own
    "cannot pickle" errors are, so code catching those keeps working."""


def not_picklable(what: str, instead: str) -> Callable[[object, int], NoReturn]:
    """A ``__reduce_ex__`` that refuses with NotPicklableError, saying what can be pickled instead."""

    def __reduce_ex__(self: object, protocol: int) -> NoReturn:
        raise NotPicklableError(f"{what} cannot be pickled or copied: it is a resource of this process; {instead}")

    return __reduce_ex__
