"""A stand-in for the device's API shim in the vendor solver tests: records the copies and uploads a
solver plan makes (``memcpy``, ``mem_alloc``, ``memcpy_htod``) in the library stand-in's call list."""

from __future__ import annotations


class RecordingApi:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def memcpy_dtod_async(self, dst, src, size, stream) -> None:
        self.calls.append(("memcpy", dst, src, size, stream))

    def mem_alloc(self, size) -> int:
        self.calls.append(("mem_alloc", size))
        return 1 << 30

    def memcpy_htod(self, dst, host, size) -> None:
        self.calls.append(("memcpy_htod", dst, host, size))
