"""The HIP driver: availability probe, device enumeration and device creation.

Available when hip-python imports, the HIP runtime library (libamdhip64) loads,
it has every entry point the installed hip-python calls for the driver's
functions, ``hipInit`` succeeds and at least one device exists; otherwise
unavailable with the reason, which names the runtime found (version and file).
hip-python loads the library at its first call, so a missing ROCm shows as the
loader's ``RuntimeError`` there; on a machine with the runtime but no AMD GPU,
``hipGetDeviceCount`` reports ``hipErrorNoDevice``.
"""

from __future__ import annotations

import threading
from importlib import metadata
from typing import Any

from hal.distribution import install_hint
from hal.driver import DeviceInfo, Driver
from hal.drivers.hip.executable_cache import compiler_properties
from hal.drivers.hip.plugin import SUMMARY
from hal.errors import HalError


def format_version(version: int) -> str:
    """HIP_VERSION (major * 10,000,000 + minor * 100,000 + patch) as ``major.minor.patch``."""
    return f"{version // 10_000_000}.{version // 100_000 % 100}.{version % 100_000}"


def _hip_python() -> str:
    try:
        return f"hip-python {metadata.version('hip-python')}"
    except metadata.PackageNotFoundError:
        return "hip-python"


class _Unavailable(Exception):
    """Why HIP cannot be used here (the probe's reason)."""


def _loaded_runtime(load_api) -> tuple[Any, str]:
    """The shim with libamdhip64 loaded, and what was found (version and file)."""
    try:
        api = load_api()
    except ImportError as exc:
        raise _Unavailable(f"hip-python is not installed ({exc}); {install_hint('hip')} on a ROCm machine") from None
    try:
        version = api.runtime_version()
    except HalError as exc:
        raise _Unavailable(f"the HIP runtime failed: {exc}") from None
    except Exception as exc:  # hip-python's loader: "failed to dlopen 'libamdhip64.so'"
        raise _Unavailable(
            f"HIP runtime library not found (libamdhip64.so): {exc}; install ROCm, or put the directory "
            "holding libamdhip64.so on LD_LIBRARY_PATH"
        ) from None
    return api, f"HIP runtime {format_version(version)} ({api.library_path() or 'libamdhip64'})"


def _device_count(api: Any, found: str) -> int:
    try:
        return api.device_count()
    except HalError as exc:
        if getattr(exc, "api_code", "") == "hipErrorNoDevice":
            raise _Unavailable(f"no HIP device: {exc}; {found}") from None
        raise _Unavailable(f"hipGetDeviceCount failed: {exc}; {found}") from None
    except Exception as exc:
        raise _Unavailable(f"the HIP runtime failed: {type(exc).__name__}: {exc}; {found}") from None


def probe(load_api) -> tuple[bool, str | None]:
    """(available, reason) using ``load_api()`` to get the shim (injectable for tests).

    The reason for a runtime found but unusable names it and says why: no device, or
    entry points the installed hip-python calls that this (older) runtime lacks."""
    try:
        api, found = _loaded_runtime(load_api)
        missing = api.missing_entry_points()
        if missing:
            found += (
                f" lacks {', '.join(missing)}, which {_hip_python()} calls (it binds a newer ROCm), "
                "so it cannot drive a device"
            )
        if _device_count(api, found) < 1:
            raise _Unavailable(f"no HIP device: hipGetDeviceCount reports 0 devices; {found}")
        if missing:
            raise _Unavailable(found)
        try:
            api.init()
        except HalError as exc:
            raise _Unavailable(f"hipInit failed: {exc}; {found}") from None
    except _Unavailable as why:
        return False, str(why)
    return True, None


def _shim():
    """The process-wide HIP shim (imports hip-python: ImportError when it is not installed)."""
    from hal.drivers.hip.api import get_api

    return get_api()


class HipDriver(Driver):
    """HIP devices are plain ordinals (``hipSetDevice``); their static properties are read once."""

    name = "hip"
    summary = SUMMARY

    def __init__(self) -> None:
        super().__init__()
        self._properties_lock = threading.Lock()
        self._properties: dict[int, dict[str, Any]] = {}  # ordinal -> what does not change

    def _probe(self) -> tuple[bool, str | None]:
        return probe(_shim)

    def _static_properties(self, api: Any, ordinal: int) -> dict[str, Any]:
        with self._properties_lock:
            if ordinal not in self._properties:
                props = api.device_properties(ordinal)
                props["memory_pools_supported"] = bool(props["memory_pools_supported"])
                props["can_map_host_memory"] = bool(props["can_map_host_memory"])
                props["driver_version"] = format_version(api.driver_version())
                props["runtime_version"] = format_version(api.runtime_version())
                props.update(compiler_properties())
                self._properties[ordinal] = props
            return self._properties[ordinal]

    def _query_devices(self) -> list[DeviceInfo]:
        api = _shim()
        return [self._device_info(api, ordinal) for ordinal in range(api.device_count())]

    def _device_info(self, api: Any, ordinal: int) -> DeviceInfo:
        api.activate(ordinal)  # hipMemGetInfo reports the current device
        props = {**self._static_properties(api, ordinal), "memory_free": api.memory_info()[0]}
        uuid = props["uuid"]  # rocm-smi's unique id: stable across processes, unlike the ordinal
        return DeviceInfo(self.name, ordinal, uuid, props["name"], f"hip://{uuid}", props)

    def _create_device(self, info: DeviceInfo, **options: Any):
        from hal.drivers.hip.device import create_device

        return create_device(self, info, api=_shim(), options=options)
