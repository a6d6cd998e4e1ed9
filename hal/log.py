"""The project's loggers: ``hal``, ``hal.drivers.<name>`` and ``runtime``.

They carry a ``NullHandler``, so nothing is printed unless the program configures logging
(``logging.basicConfig(level=logging.DEBUG)`` shows driver probing, plugin loading, device creation,
executable compiles and cache hits, graph-cache evictions).
"""

from __future__ import annotations

import logging

for _name in ("hal", "runtime"):
    logging.getLogger(_name).addHandler(logging.NullHandler())


def driver_logger(driver_name: str) -> logging.Logger:
    """``hal.drivers.<name>``, the name written as a module name (``local-task`` -> ``local_task``)."""
    return logging.getLogger("hal.drivers." + driver_name.replace("-", "_"))
