"""A GPU driver library's hot calls made from C, when the extension was built and is allowed.

The vendor bindings convert each argument, build a status enum and a result tuple on every
call; on the calls every submission makes (a stream command buffer's kernel launches, graph
launch, event record / query / synchronize, stream waits) that costs about as much as the
driver's own work. ``hal.drivers._native`` (``_native.c``, built at install when a C compiler
is there) resolves those functions from the driver library with ``dlopen``/``dlsym`` at run
time and takes handles as integers, so nothing vendor-specific is needed to build it. It also
keeps ``activate``'s per-thread "is this context current already" check, which every batch of
calls makes, in C; a switch still runs the shim's own method.

Unset, the native calls serve where the extension loads and the Python calls elsewhere;
``HAL_NATIVE=0`` turns them off (the pure-Python calls, which pass the same CTS); ``HAL_NATIVE=1``
makes a missing or unloadable extension an error instead of a fallback.
Which one a device uses is in its ``DeviceInfo.properties["native_calls"]``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from hal import env
from hal.errors import UnavailableError

_log = logging.getLogger(__name__)
T = TypeVar("T")

#: The shared calls, in the order of ``_native.Calls``' arguments.
CALLS = ("launch", "graph_launch", "event_record", "event_query", "event_synchronize", "stream_wait_event")


def mode() -> str:
    """``HAL_NATIVE``: "auto" (unset: native where it loads), "on" or "off"."""
    value = env.text("HAL_NATIVE")
    if value is None:
        return "auto"
    return "on" if env.parse_switch(value, "HAL_NATIVE") else "off"


def optional(what: str, make: Callable[[], T], errors: tuple[type[BaseException], ...] = (ImportError,)) -> T | None:
    """``make()`` (a C extension's object, set up), or None where ``HAL_NATIVE`` turns it off or
    ``make`` raises one of ``errors`` (then the reason is logged; with ``HAL_NATIVE=1`` it is an
    UnavailableError naming ``what``). The native driver calls load so."""
    wanted = mode()
    if wanted == "off":
        return None
    try:
        return make()
    except errors as exc:
        if wanted == "on":
            raise UnavailableError(f"HAL_NATIVE=1 but {what} cannot be used: {exc}") from exc
        _log.info("%s not used (%s): the Python code serves", what, exc)
        return None


def load(library: str, functions: dict[str, str]) -> Any | None:
    """The native ``Calls`` of ``library`` (``functions``: each of ``CALLS`` -> its symbol), or None
    where it is turned off, not built or cannot resolve them (then the reason is logged)."""
    def make() -> Any:
        from hal.drivers import _native

        return _native.Calls(library, **{name: functions[name] for name in CALLS})

    return optional("the native calls", make, (ImportError, OSError))
