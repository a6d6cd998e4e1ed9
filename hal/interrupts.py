"""Ctrl-C that lands in a finalizer.

Python prints and drops an exception raised in ``__del__`` or a weakref callback, a
KeyboardInterrupt included: a program interrupted while a finalizer of ours ran would go on as
if nothing happened. Finalizers catch it and call ``redeliver``, which interrupts the main thread
again a moment later, once the finalizer has returned (interrupting it at once would raise inside
the finalizer again, and be dropped again).
"""

from __future__ import annotations

import _thread
import threading
import weakref
from collections.abc import Callable
from typing import Any

#: Seconds after which a caught interrupt is delivered again.
DELAY = 0.01


def redeliver() -> None:
    """Deliver the KeyboardInterrupt a finalizer caught to the main thread again, shortly."""
    timer = threading.Timer(DELAY, _thread.interrupt_main)
    timer.daemon = True
    timer.start()


def finalize(obj: object, fn: Callable[..., Any], *args: Any) -> weakref.finalize:
    """``weakref.finalize(obj, fn, *args)`` whose callback delivers a KeyboardInterrupt it caught to the
    main thread again (``redeliver``): Python drops whatever a weakref callback raises. Called
    directly (a release before the object is garbage), the interrupt comes back the same way."""
    return weakref.finalize(obj, _delivering_interrupts, fn, *args)


def _delivering_interrupts(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except KeyboardInterrupt:
        redeliver()
