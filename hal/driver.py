"""Drivers: discover devices of one kind and create them."""

from __future__ import annotations

import abc
import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hal.checks import check_int
from hal.device import register_open
from hal.errors import HalError, InternalError, NotFoundError, ResourceExhaustedError, UnavailableError
from hal.log import driver_logger
from hal.pickling import not_picklable

if TYPE_CHECKING:
    from hal.device import Device


@dataclasses.dataclass(frozen=True)
class DriverInfo:
    name: str
    summary: str
    available: bool
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    driver: str
    ordinal: int
    id: str
    name: str
    uri: str
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def selected_by(self, key: str) -> bool:
        """Whether a URI's device part names this device: its id, or its ordinal in ASCII digits
        (``str.isdigit`` also takes superscripts and other scripts' digits, which ``int`` refuses
        or reads as another number)."""
        return key == self.id or (key.isascii() and key.isdigit() and int(key) == self.ordinal)


_T = TypeVar("_T")

#: The most queues a device may have: each queue is a thread or a stream, so an unbounded count would
#: exhaust the process before any check of the driver's ran (IREE's queue affinity is a 64-bit mask too).
MAX_QUEUE_COUNT = 64


def check_common_options(options: dict[str, Any]) -> None:
    """The options every driver reads, checked before a driver takes any resource for them."""
    if "queue_count" in options:
        options["queue_count"] = check_int(options["queue_count"], "queue_count", minimum=1, maximum=MAX_QUEUE_COUNT)


class Driver(abc.ABC):
    """A device family. ``available()`` never raises: a missing library or device is a reason."""

    __reduce_ex__ = not_picklable("a hal.Driver", "pickle its name (driver.name) and call hal.get_driver(name)")

    name: str = ""
    summary: str = ""

    def __init__(self) -> None:
        self._probe_lock = threading.Lock()
        self._probed: tuple[bool, str | None] | None = None

    def available(self) -> tuple[bool, str | None]:
        """(True, None), or (False, why not): cached after the first probe."""
        with self._probe_lock:
            if self._probed is None:
                try:
                    self._probed = self._probe()
                except Exception as exc:  # a probe must report, never raise
                    self._probed = (False, f"{type(exc).__name__}: {exc}")
                driver_logger(self.name).debug("probe: %s", "available" if self._probed[0] else self._probed[1])
            return self._probed

    def info(self) -> DriverInfo:
        ok, reason = self.available()
        return DriverInfo(self.name, self.summary, ok, reason)

    def _require_available(self) -> None:
        ok, reason = self.available()
        if not ok:
            raise UnavailableError(f"driver {self.name!r} is unavailable: {reason}")

    def query_devices(self) -> list[DeviceInfo]:
        self._require_available()
        return self._reported("query its devices", self._query_devices)

    def _reported(self, what: str, hook: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run a driver hook; an untyped exception it raises becomes a HalError naming this driver, so
        callers (the CLI, a listing of every driver) can tell one failing driver from the others."""
        try:
            return hook(*args, **kwargs)
        except HalError:
            raise
        except MemoryError as exc:  # an allocation the driver made
            raise ResourceExhaustedError(f"driver {self.name!r} ran out of memory trying to {what}") from exc
        except Exception as exc:
            raise InternalError(f"driver {self.name!r} failed to {what}: {type(exc).__name__}: {exc}") from exc

    def create_device(self, device: int | str | None = None, **options: Any) -> Device:
        """Create a device by ordinal, stable id, or (None) the first one."""
        check_common_options(options)
        info = self.resolve_device(device)
        driver_logger(self.name).debug("creating device %s (%s) options=%r", info.uri, info.name, options)
        created = self._reported(f"create device {info.uri}", self._create_device, info, **options)
        register_open(created)
        return created

    def resolve_device(self, device: int | str | None = None) -> DeviceInfo:
        """The device an ordinal, stable id or (None) the first one names, without creating it
        (``NotFoundError`` if there is none)."""
        self._require_available()
        devices = self._reported("query its devices", self._query_devices)
        if not devices:
            raise NotFoundError(f"driver {self.name!r} has no devices")
        if device is None or device == "":
            info = devices[0]
        else:
            key = str(device)
            matches = [d for d in devices if d.selected_by(key)]
            if not matches:
                known = ", ".join(f"{d.ordinal} ({d.id})" for d in devices)
                raise NotFoundError(f"driver {self.name!r} has no device {key!r}; devices: {known}")
            info = matches[0]
        return info

    # -- hooks ---------------------------------------------------------------------
    @abc.abstractmethod
    def _probe(self) -> tuple[bool, str | None]: ...

    @abc.abstractmethod
    def _query_devices(self) -> list[DeviceInfo]: ...

    @abc.abstractmethod
    def _create_device(self, info: DeviceInfo, **options: Any) -> Device: ...
