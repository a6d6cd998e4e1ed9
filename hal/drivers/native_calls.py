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
from typing import Any

from hal import env
from hal.errors import UnavailableError

_log = logging.getLogger(__name__)

#: The shared calls, in the order of ``_native.Calls``' arguments.
CALLS = ("launch", "graph_launch", "event_record", "event_query", "event_synchronize", "stream_wait_event")


def mode() -> str:
    """``HAL_NATIVE``: "auto" (unset: native where it loads), "on" or "off"."""
    value = env.text("HAL_NATIVE")
    if value is None:
        return "auto"
    return "on" if env.parse_switch(value, "HAL_NATIVE") else "off"


def load(library: str, functions: dict[str, str]) -> Any | None:
    """The native ``Calls`` of ``library`` (``functions``: each of ``CALLS`` -> its symbol), or None
    where it is turned off, not built or cannot resolve them (then the reason is logged)."""
    wanted = mode()
    if wanted == "off":
        return None
    try:
        from hal.drivers import _native

        return _native.Calls(library, **{name: functions[name] for name in CALLS})
    except (ImportError, OSError) as exc:
        if wanted == "on":
            raise UnavailableError(f"HAL_NATIVE=1 but the native calls cannot be used: {exc}") from exc
        _log.info("native driver calls not used (%s): the Python calls serve", exc)
        return None
