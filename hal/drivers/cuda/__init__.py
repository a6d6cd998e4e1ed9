"""``cuda``: NVIDIA GPUs through ``cuda.bindings`` (driver API + NVRTC).

The GPU-generic logic lives in ``hal.drivers.gpu``; this package supplies the
API shim (``api.py``), result-code mapping (``status.py``), NVRTC compilation
(``executable_cache.py``), device properties (``driver.py``) and the device.
"""
