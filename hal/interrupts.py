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

#: Seconds after which a caught interrupt is delivered again.
DELAY = 0.01


def redeliver() -> None:
    """Deliver the KeyboardInterrupt a finalizer caught to the main thread again, shortly."""
    timer = threading.Timer(DELAY, _thread.interrupt_main)
    timer.daemon = True
    timer.start()
