"""Registers the ``hip`` driver without importing hip-python.

The probe reports why HIP cannot be used here: hip-python missing, the HIP
runtime failing to initialise (``hipErrorNoDevice`` on a machine without an AMD
GPU), or no device; with a device present it reports that this build has no HIP
driver implementation.
"""

from __future__ import annotations

from typing import Any

from hal.driver import DeviceInfo, Driver
from hal.registry import DriverFactory, hookimpl

SUMMARY = "AMD GPUs through HIP (hip-python) and hiprtc"


def _status_name(result: Any) -> str:
    return getattr(result, "name", None) or str(result)


def probe_hip(import_hip=None) -> tuple[bool, str]:
    """(False, reason): HIP is never available in this build; the reason says what is missing."""
    try:
        hip = import_hip() if import_hip is not None else _import_hip()
    except ImportError as exc:
        return False, f"hip-python is not installed ({exc}); pip install 'pyhal[hip]' on a ROCm machine"
    except Exception as exc:  # the HIP runtime library itself failed to load
        return False, f"the HIP runtime could not be loaded: {type(exc).__name__}: {exc}"
    try:
        result = hip.hipInit(0)
        status = result[0] if isinstance(result, tuple) else result
        if int(status) != 0:
            return False, f"hipInit failed: {_status_name(status)}"
        result = hip.hipGetDeviceCount()
        status, count = result[0], result[1]
        if int(status) != 0:
            return False, f"hipGetDeviceCount failed: {_status_name(status)}"
    except Exception as exc:
        return False, f"the HIP runtime failed: {type(exc).__name__}: {exc}"
    if count < 1:
        return False, "no HIP device: hipGetDeviceCount reports 0 devices (hipErrorNoDevice)"
    return False, f"{count} HIP device(s) found, but this build has no HIP driver implementation yet"


def _import_hip():
    from hip import hip

    return hip


class HipDriver(Driver):
    name = "hip"
    summary = SUMMARY

    def _probe(self) -> tuple[bool, str | None]:
        return probe_hip()

    def _query_devices(self) -> list[DeviceInfo]:  # unreachable: never available
        return []

    def _create_device(self, info: DeviceInfo, **options: Any):  # unreachable: never available
        raise NotImplementedError


@hookimpl
def hal_register_drivers():
    return [DriverFactory("hip", SUMMARY, HipDriver, 90)]
