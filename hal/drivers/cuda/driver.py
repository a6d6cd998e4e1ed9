"""The CUDA driver: availability probe, device enumeration and device creation.

Available when ``cuda.bindings`` imports, the driver library loads, ``cuInit``
succeeds, the driver is new enough and at least one device exists; otherwise
unavailable with the reason. Without a GPU, ``cuda.bindings`` imports but
``cuInit`` raises the library loader's "not found" error instead of returning a
CUresult: that is caught and reported.
"""

from __future__ import annotations

import threading
from typing import Any

from hal.distribution import install_hint
from hal.driver import DeviceInfo, Driver
from hal.errors import HalError

#: Oldest driver (cuDriverGetVersion) whose graph and memory-pool calls the driver uses.
MIN_DRIVER_VERSION = 12000


def format_version(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def probe(load_api) -> tuple[bool, str | None]:
    """(available, reason) using ``load_api()`` to get the shim (injectable for tests)."""
    try:
        api = load_api()
    except ImportError as exc:
        return False, f"cuda-bindings is not installed ({exc}); {install_hint('cuda')}"
    try:
        api.init()
    except HalError as exc:
        code = getattr(exc, "api_code", "")
        if code == "CUDA_ERROR_NO_DEVICE":
            return False, f"no CUDA device: {exc}"
        if code in ("CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"):
            return False, f"the NVIDIA driver is too old for this CUDA: {exc}"
        return False, f"cuInit failed: {exc}"
    except Exception as exc:  # the loader raises when libcuda.so is missing (no NVIDIA driver)
        return False, f"the NVIDIA driver library (libcuda) could not be loaded: {type(exc).__name__}: {exc}"
    try:
        version = api.driver_version()
        if version < MIN_DRIVER_VERSION:
            return False, (f"the NVIDIA driver supports CUDA {format_version(version)}; the cuda driver needs "
                           f"{format_version(MIN_DRIVER_VERSION)} or newer")
        if api.device_count() < 1:
            return False, "no CUDA device: cuDeviceGetCount reports 0 devices"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return True, None


class CudaDriver(Driver):
    name = "cuda"
    summary = "NVIDIA GPUs through the CUDA driver API (cuda.bindings) and NVRTC"

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._contexts: dict[int, tuple[Any, Any]] = {}  # ordinal -> (CUdevice, primary context)
        self._static: dict[int, dict[str, Any]] = {}

    @property
    def api(self):
        from hal.drivers.cuda.api import get_api

        return get_api()

    def _probe(self) -> tuple[bool, str | None]:
        from hal.drivers.cuda.api import get_api

        return probe(get_api)

    # -- contexts ------------------------------------------------------------------------
    def context(self, ordinal: int) -> tuple[Any, Any]:
        """(CUdevice, primary context) of a device. The driver retains each primary context once,
        for the life of the process (as the CUDA runtime does), so devices and queries stay cheap."""
        with self._lock:
            entry = self._contexts.get(ordinal)
            if entry is None:
                handle = self.api.device(ordinal)
                entry = self._contexts[ordinal] = (handle, self.api.primary_context_retain(handle))
            return entry

    # -- devices -----------------------------------------------------------------------------
    def _static_properties(self, ordinal: int, handle: Any) -> dict[str, Any]:
        props = self._static.get(ordinal)
        if props is None:
            api = self.api
            attrs = api.device_attributes(handle)
            major, minor = attrs["compute_capability_major"], attrs["compute_capability_minor"]
            props = {
                "name": api.device_name(handle),
                "uuid": api.device_uuid(handle),
                "compute_capability": f"{major}.{minor}",
                "arch": f"sm_{major}{minor}",
                "memory_total": api.device_total_memory(handle),
                "driver_version": format_version(api.driver_version()),
                "pci_bus_id": api.pci_bus_id(handle),
                **attrs,
                "memory_pools_supported": bool(attrs.get("memory_pools_supported")),
                "unified_addressing": bool(attrs.get("unified_addressing")),
                "can_map_host_memory": bool(attrs.get("can_map_host_memory")),
                # whether submissions make their driver calls from C (hal/drivers/native_calls.py)
                "native_calls": api.native is not None,
            }
            try:
                from hal.drivers.cuda.executable_cache import FORMATS, nvrtc_version

                major, minor = nvrtc_version()
                props["nvrtc_version"] = f"{major}.{minor}"
                props["executable_formats"] = list(FORMATS)
            except HalError as exc:
                props["nvrtc_version"] = f"unavailable ({exc.message})"
                props["executable_formats"] = ["cubin", "ptx"]
            self._static[ordinal] = props
        return props

    def _query_devices(self) -> list[DeviceInfo]:
        api = self.api
        infos = []
        for ordinal in range(api.device_count()):
            handle, context = self.context(ordinal)
            props = dict(self._static_properties(ordinal, handle))
            api.activate(context)
            props["memory_free"], _ = api.memory_info()
            uuid = props["uuid"]
            infos.append(DeviceInfo(self.name, ordinal, uuid, props["name"], f"cuda://{uuid}", props))
        return infos

    def _create_device(self, info: DeviceInfo, **options: Any):
        from hal.drivers.cuda.device import create_device

        handle, context = self.context(info.ordinal)
        return create_device(self, info, api=self.api, handle=handle, context=context, options=options)
