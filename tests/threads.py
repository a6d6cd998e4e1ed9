"""Functions run at once, a thread each: ranks of a channel made as processes would make them, or
callers racing each other."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def in_threads(functions: Sequence[Callable[[], Any]], timeout: float = 30, reraise: bool = False) -> list:
    """Call each of ``functions`` on a thread of its own, every thread started before any is joined:
    their results in order, an exception in place of the result of the function that raised it
    (``reraise``: the first such exception raised instead). A thread still running after
    ``timeout`` seconds fails the test."""
    results: list = [None] * len(functions)

    def run(i: int) -> None:
        try:
            results[i] = functions[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(functions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if reraise:
        for result in results:
            if isinstance(result, BaseException):
                raise result
    return results
