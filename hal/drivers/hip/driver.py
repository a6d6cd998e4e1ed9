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

from hal.driver import DeviceInfo, Driver
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


def probe(load_api) -> tuple[bool, str | None]:
    """(available, reason) using ``load_api()`` to get the shim (injectable for tests)."""
    try:
        api = load_api()
    except ImportError as exc:
        return False, f"hip-python is not installed ({exc}); pip install 'pyhal[hip]' on a ROCm machine"
    try:
        version = api.runtime_version()
    except HalError as exc:
        return False, f"the HIP runtime failed: {exc}"
    except Exception as exc:  # hip-python's loader: "failed to dlopen 'libamdhip64.so'"
        return False, (
            f"HIP runtime library not found (libamdhip64.so): {exc}; install ROCm, or put "
            "the directory holding libamdhip64.so on LD_LIBRARY_PATH"
        )
    found = f"HIP runtime {format_version(version)} ({api.library_path() or 'libamdhip64'})"
    missing = api.missing_entry_points()
    unusable = (
        (
            f"{found} lacks {', '.join(missing)}, which {_hip_python()} calls (it binds a newer ROCm), "
            "so it cannot drive a device"
        )
        if missing
        else ""
    )
    try:
        count = api.device_count()
    except HalError as exc:
        if getattr(exc, "api_code", "") == "hipErrorNoDevice":
            return False, f"no HIP device: {exc}; {unusable or found}"
        return False, f"hipGetDeviceCount failed: {exc}; {unusable or found}"
    except Exception as exc:
        return False, f"the HIP runtime failed: {type(exc).__name__}: {exc}; {unusable or found}"
    if count < 1:
        return False, f"no HIP device: hipGetDeviceCount reports 0 devices; {unusable or found}"
    if unusable:
        return False, unusable
    try:
        api.init()
    except HalError as exc:
        return False, f"hipInit failed: {exc}; {found}"
    return True, None


class HipDriver(Driver):
    name = "hip"
    summary = SUMMARY

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._static: dict[int, dict[str, Any]] = {}

    @property
    def api(self):
        from hal.drivers.hip.api import get_api

        return get_api()

    def _probe(self) -> tuple[bool, str | None]:
        from hal.drivers.hip.api import get_api

        return probe(get_api)

    def _static_properties(self, ordinal: int) -> dict[str, Any]:
        with self._lock:
            props = self._static.get(ordinal)
            if props is None:
                api = self.api
                props = api.device_properties(ordinal)
                props["memory_pools_supported"] = bool(props["memory_pools_supported"])
                props["can_map_host_memory"] = bool(props["can_map_host_memory"])
                props["driver_version"] = format_version(api.driver_version())
                props["runtime_version"] = format_version(api.runtime_version())
                try:
                    from hal.drivers.hip.executable_cache import FORMATS, compiler_identity

                    props["compiler"] = compiler_identity()
                    props["executable_formats"] = list(FORMATS)
                except HalError as exc:
                    props["compiler"] = f"unavailable ({exc.message})"
                    props["executable_formats"] = ["hsaco"]
                self._static[ordinal] = props
            return props

    def _query_devices(self) -> list[DeviceInfo]:
        api = self.api
        infos = []
        for ordinal in range(api.device_count()):
            props = dict(self._static_properties(ordinal))
            api.activate(ordinal)
            props["memory_free"], _ = api.memory_info()
            uuid = props["uuid"]
            infos.append(DeviceInfo(self.name, ordinal, uuid, props["name"], f"hip://{uuid}", props))
        return infos

    def _create_device(self, info: DeviceInfo, **options: Any):
        from hal.drivers.hip.device import create_device

        return create_device(self, info, api=self.api, options=options)
