"""Driver plugins: pluggy hooks, the ``hal.drivers`` entry-point group, URIs and device creation.

A plugin (a module or object) implements ``hal_register_drivers`` and returns
``DriverFactory`` records. Plugins come from the built-in list, the ``hal.drivers``
entry-point group of installed distributions, and ``HAL_PLUGINS`` (comma-separated
module names, for drivers that are not installed). Factories are cheap: a driver's module, and so its
GPU library, is imported only when the driver is first asked for.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pluggy

from hal.device import Device
from hal.driver import Driver, DriverInfo
from hal.errors import InvalidArgumentError, NotFoundError, UnavailableError

PROJECT = "hal"
ENTRY_POINT_GROUP = "hal.drivers"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Built-in driver plugins, registered without any install step.
BUILTIN_PLUGINS = (
    "hal.drivers.cuda.plugin",
    "hal.drivers.hip.plugin",
    "hal.drivers.local_task.plugin",
    "hal.drivers.local_sync.plugin",
)


@dataclasses.dataclass(frozen=True)
class DriverFactory:
    """How to make a driver: ``load`` is called once, on first use."""

    name: str
    summary: str
    load: Callable[[], Driver]
    #: Higher wins when choosing the default device (cuda 100, hip 90, local-task 50).
    priority: int = 0


class DriverSpecs:
    @hookspec
    def hal_register_drivers(self) -> list[DriverFactory]:  # type: ignore[empty-body]
        """Return the drivers this plugin provides."""


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._factories: dict[str, DriverFactory] | None = None
        self._drivers: dict[str, Driver] = {}
        self._extra: list[DriverFactory] = []
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(DriverSpecs)

    def _load_plugins(self) -> None:
        for module_name in BUILTIN_PLUGINS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue  # a built-in driver not shipped in this build
            if not self.manager.is_registered(module):
                self.manager.register(module)
        for module_name in filter(None, os.environ.get("HAL_PLUGINS", "").split(",")):
            try:  # plugins named in the environment, for drivers that are not installed packages
                module = importlib.import_module(module_name.strip())
            except ImportError as exc:
                warnings.warn(f"hal: cannot import plugin {module_name!r} from HAL_PLUGINS: {exc}", stacklevel=3)
                continue
            if not self.manager.is_registered(module):
                self.manager.register(module)
        try:
            self.manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except Exception as exc:  # a broken third-party plugin must not break the built-ins
            warnings.warn(f"hal: loading {ENTRY_POINT_GROUP} entry points failed: {exc}", stacklevel=3)

    def factories(self) -> dict[str, DriverFactory]:
        with self._lock:
            if self._factories is None:
                self._load_plugins()
                found: dict[str, DriverFactory] = {}
                for batch in self.manager.hook.hal_register_drivers():
                    for factory in batch or ():
                        found.setdefault(factory.name, factory)
                for factory in self._extra:
                    found[factory.name] = factory
                self._factories = found
            return self._factories

    def register(self, factory: DriverFactory) -> None:
        with self._lock:
            self._extra.append(factory)
            if self._factories is not None:
                self._factories[factory.name] = factory
            self._drivers.pop(factory.name, None)

    def driver(self, name: str) -> Driver:
        with self._lock:
            driver = self._drivers.get(name)
            if driver is not None:
                return driver
            factories = self.factories()
            factory = factories.get(name)
            if factory is None:
                raise NotFoundError(f"no driver named {name!r}; known drivers: {', '.join(sorted(factories))}")
            driver = factory.load()
            self._drivers[name] = driver
            return driver


_registry = _Registry()


def register_driver(driver: DriverFactory | type[Driver], *, priority: int = 0) -> None:
    """Register a driver in-process (without packaging it as an entry point)."""
    if isinstance(driver, type) and issubclass(driver, Driver):
        driver = DriverFactory(driver.name, driver.summary, driver, priority)
    if not isinstance(driver, DriverFactory):
        raise InvalidArgumentError(f"register_driver takes a DriverFactory or a Driver subclass, got {driver!r}")
    _registry.register(driver)


def plugin_manager() -> pluggy.PluginManager:
    """The pluggy manager, for registering plugin objects directly."""
    return _registry.manager


def list_drivers() -> list[DriverInfo]:
    """Every known driver, most preferred first, with availability and the reason if unavailable."""
    factories = sorted(_registry.factories().values(), key=lambda f: (-f.priority, f.name))
    infos = []
    for factory in factories:
        try:
            infos.append(_registry.driver(factory.name).info())
        except Exception as exc:  # a driver whose module fails to import is unavailable, not fatal
            infos.append(DriverInfo(factory.name, factory.summary, False, f"{type(exc).__name__}: {exc}"))
    return infos


def get_driver(name: str) -> Driver:
    """The driver named ``name``: NotFoundError if unknown, UnavailableError if it cannot run here."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"driver name must be a non-empty string, got {name!r}")
    driver = _registry.driver(name)
    ok, reason = driver.available()
    if not ok:
        raise UnavailableError(f"driver {name!r} is unavailable: {reason}")
    return driver


def parse_uri(uri: str) -> tuple[str, str | None]:
    """``name``, ``name://``, ``name://0``, ``name://GPU-...`` -> (driver name, device key or None)."""
    if not isinstance(uri, str) or not uri.strip():
        raise InvalidArgumentError(f"device URI must be a non-empty string, got {uri!r}")
    name, sep, rest = uri.strip().partition("://")
    if not sep and ":" in name:  # "cuda:0" shorthand
        name, _, rest = name.partition(":")
    if not name:
        raise InvalidArgumentError(f"device URI {uri!r} has no driver name")
    return name, (rest or None)


def create_device(uri: str | None = None, **options: Any) -> Device:
    """Create a device from a URI; None: ``HAL_DEVICE`` or else the best available driver."""
    if uri is None:
        uri = os.environ.get("HAL_DEVICE") or None
    if uri is None:
        for info in list_drivers():
            if info.available:
                return _registry.driver(info.name).create_device(None, **options)
        raise UnavailableError("no HAL driver is available")
    name, key = parse_uri(uri)
    return get_driver(name).create_device(key, **options)
