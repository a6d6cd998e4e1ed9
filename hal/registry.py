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
import importlib.metadata
import logging
import threading
from collections.abc import Callable
from typing import Any

import pluggy

from hal import env
from hal.device import Device, find_open
from hal.driver import Driver, DriverInfo
from hal.errors import AlreadyExistsError, HalError, InvalidArgumentError, NotFoundError, UnavailableError

PROJECT = "hal"
ENTRY_POINT_GROUP = "hal.drivers"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
_log = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class PluginProblem:
    """A plugin that could not be loaded, registers no driver, or registers one under a name that is
    missing or already taken (the driver registered first keeps the name)."""

    source: str  # "distribution hal-foo 1.0, entry point foo = foo.plugin" or "HAL_PLUGINS module foo"
    problem: str

    def __str__(self) -> str:
        return f"{self.source}: {self.problem}"


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._factories: dict[str, DriverFactory] | None = None
        self._drivers: dict[str, Driver] = {}
        self._extra: list[DriverFactory] = []
        self._owners: dict[str, str] = {}  # driver name -> the plugin that registered it, for collision reports
        self._sources: dict[int, str] = {}  # id(plugin) -> where it came from, for third-party plugins
        self.problems: list[PluginProblem] = []
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(DriverSpecs)

    def _report(self, source: str, problem: str) -> None:
        self.problems.append(PluginProblem(source, problem))
        _log.warning("plugin %s: %s", source, problem)

    def _register(self, plugin: object, source: str | None) -> None:
        if self.manager.is_registered(plugin):
            return
        try:
            self.manager.register(plugin)
        except Exception as exc:  # pluggy rejects malformed hook implementations
            self._report(source or repr(plugin), f"cannot register: {type(exc).__name__}: {exc}")
            return
        if source is not None:
            self._sources[id(plugin)] = source
        _log.debug("registered plugin %s", source or getattr(plugin, "__name__", plugin))

    def _load_plugins(self) -> None:
        for module_name in BUILTIN_PLUGINS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue  # a built-in driver not shipped in this build
            self._register(module, None)
        for module_name in filter(None, (m.strip() for m in (env.text("HAL_PLUGINS") or "").split(","))):
            source = f"HAL_PLUGINS module {module_name!r}"
            try:  # plugins named in the environment, for drivers that are not installed packages
                self._register(importlib.import_module(module_name), source)
            except Exception as exc:
                self._report(source, f"cannot import: {type(exc).__name__}: {exc}")
        if not env.switch("HAL_PLUGINS_AUTOLOAD", True):
            _log.debug("HAL_PLUGINS_AUTOLOAD is off: %s entry points not loaded", ENTRY_POINT_GROUP)
            return
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            source = _describe(entry_point)
            try:  # each on its own: one broken package must not stop the others
                plugin = entry_point.load()
            except Exception as exc:
                self._report(source, f"cannot load: {type(exc).__name__}: {exc}")
                continue
            self._register(plugin, source)

    def _collect(self) -> dict[str, DriverFactory]:
        """Every plugin's factories, each plugin's hook called on its own so one that raises loses only itself."""
        found: dict[str, DriverFactory] = {}
        for impl in self.manager.hook.hal_register_drivers.get_hookimpls():
            source = self._sources.get(id(impl.plugin))
            try:
                batch = list(impl.function() or ())
            except Exception as exc:
                self._report(source or impl.plugin_name, f"hal_register_drivers raised {type(exc).__name__}: {exc}")
                continue
            bad = [f for f in batch if not isinstance(f, DriverFactory)]
            if bad:
                self._report(source or impl.plugin_name, f"hal_register_drivers returned non-DriverFactory {bad!r}")
                batch = [f for f in batch if isinstance(f, DriverFactory)]
            if not batch and source is not None:
                self._report(source, "registers no driver (its hal_register_drivers returned none)")
            owner = source or f"built-in plugin {impl.plugin_name}"
            for factory in batch:
                if not isinstance(factory.name, str) or not factory.name.strip():
                    self._report(owner, f"registers a driver without a name ({factory!r}); it is ignored")
                elif factory.name in found:
                    self._report(owner, f"registers driver {factory.name!r}, a name {self._owners[factory.name]} "
                                        "registered first; this one is ignored")
                else:
                    found[factory.name] = factory
                    self._owners[factory.name] = owner
        hooked = {id(impl.plugin) for impl in self.manager.hook.hal_register_drivers.get_hookimpls()}
        for plugin_id, source in self._sources.items():
            if plugin_id not in hooked:
                self._report(source, "registers no driver (no hal_register_drivers hook implementation)")
        return found

    def factories(self) -> dict[str, DriverFactory]:
        with self._lock:
            if self._factories is None:
                self._load_plugins()
                found = self._collect()
                for factory in self._extra:
                    found[factory.name] = factory
                    self._owners[factory.name] = "register_driver"
                self._factories = found
            return self._factories

    def register(self, factory: DriverFactory, replace: bool) -> None:
        with self._lock:
            factories = self.factories()
            taken = factories.get(factory.name)
            if taken is not None and taken.load is not factory.load and not replace:
                raise AlreadyExistsError(
                    f"a driver named {factory.name!r} is already registered ({self._owners[factory.name]}); "
                    "pass replace=True to replace it")
            if taken is not None and taken.load is not factory.load:
                _log.warning("driver %r (%s) replaced by register_driver", factory.name, self._owners[factory.name])
            self._extra = [f for f in self._extra if f.name != factory.name] + [factory]
            factories[factory.name] = factory
            self._owners[factory.name] = "register_driver"
            self._drivers.pop(factory.name, None)

    def driver(self, name: str) -> Driver:
        with self._lock:
            driver = self._drivers.get(name)
            if driver is not None:
                return driver
            factories = self.factories()
            factory = factories.get(name)
            if factory is None:
                known = ", ".join(sorted(factories))
                problems = "".join(f"; plugin {p}" for p in self.problems)
                raise NotFoundError(f"no driver named {name!r}; known drivers: {known}{problems}")
            try:
                driver = factory.load()
            except HalError:
                raise
            except Exception as exc:  # a module that fails to import: this driver is unusable, not the process
                raise UnavailableError(f"driver {name!r} failed to load: {type(exc).__name__}: {exc}") from exc
            self._drivers[name] = driver
            return driver


def _describe(entry_point: importlib.metadata.EntryPoint) -> str:
    dist = entry_point.dist
    owner = f"distribution {dist.name} {dist.version}" if dist is not None else "an unnamed distribution"
    return f"{owner}, entry point {entry_point.name} = {entry_point.value}"


_registry = _Registry()


def plugin_problems() -> list[PluginProblem]:
    """Plugins that failed to load or register no driver (also logged as warnings on the ``hal`` logger)."""
    _registry.factories()
    return list(_registry.problems)


def register_driver(driver: DriverFactory | type[Driver], *, priority: int = 0, replace: bool = False) -> None:
    """Register a driver in-process (without packaging it as an entry point).

    A name another driver has (a built-in, a plugin's, an earlier registration) raises AlreadyExistsError
    unless ``replace=True``; registering the same factory or class again updates it. A driver without a
    name raises InvalidArgumentError.
    """
    if isinstance(driver, type) and issubclass(driver, Driver):
        driver = DriverFactory(driver.name, driver.summary, driver, priority)
    if not isinstance(driver, DriverFactory):
        raise InvalidArgumentError(f"register_driver takes a DriverFactory or a Driver subclass, got {driver!r}")
    if not isinstance(driver.name, str) or not driver.name.strip() or "://" in driver.name:
        raise InvalidArgumentError(f"a driver needs a name (the class attribute `name`, as in device URIs), got "
                                   f"{driver.name!r} for {driver.load!r}")
    _registry.register(driver, replace)


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
    """Create a device from a URI; None: ``HAL_DEVICE`` or else the best available driver.

    A bad ``HAL_DEVICE`` raises the same typed error as a bad ``uri``, its message naming the variable.
    """
    if uri is None:
        from_env = env.text("HAL_DEVICE")
        if from_env is not None:
            try:
                return _create_from_uri(from_env, options)
            except HalError as exc:
                raise HalError(exc.code, f"HAL_DEVICE={from_env!r}: {exc.message}") from None
        for info in list_drivers():
            if info.available:
                return _registry.driver(info.name).create_device(None, **options)
        raise UnavailableError("no HAL driver is available")
    return _create_from_uri(uri, options)


def open_device(uri: str | None = None) -> Device:
    """The device of this process for `uri`: the oldest device created for it (by ``create_device``,
    ``open_device`` or a driver's ``create_device``) that is still open, else a new one.

    ``create_device`` always makes a new device object; ``open_device`` is how users of one device
    share it, so that each sees the others' work on it (a trace or ``wait_idle`` on it covers all of
    it). The runtime resolves its URIs this way. URIs are compared normalized: "local-task",
    "local-task://" and "local-task://0" name one device, as do a GPU's ordinal and stable id. None:
    ``HAL_DEVICE``, else the best available driver's first device, as ``create_device(None)``.
    A device opened here is closed by whoever closes it; callers that did not create it must not.
    """
    with _open_device_lock:
        if uri is None:
            from_env = env.text("HAL_DEVICE")
            if from_env is not None:
                try:
                    return _open_from_uri(from_env)
                except HalError as exc:
                    raise HalError(exc.code, f"HAL_DEVICE={from_env!r}: {exc.message}") from None
            for info in list_drivers():
                if info.available:
                    return _open_on(_registry.driver(info.name), None)
            raise UnavailableError("no HAL driver is available")
        return _open_from_uri(uri)


_open_device_lock = threading.Lock()  # one open_device at a time: two racing for a URI share one device


def _open_from_uri(uri: str) -> Device:
    name, key = parse_uri(uri)
    return _open_on(get_driver(name), key)


def _open_on(driver: Driver, key: str | None) -> Device:
    found = find_open(driver.resolve_device(key).uri)
    return found if found is not None else driver.create_device(key)


def _create_from_uri(uri: str, options: dict[str, Any]) -> Device:
    name, key = parse_uri(uri)
    return get_driver(name).create_device(key, **options)
