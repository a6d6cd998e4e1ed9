"""A small content-addressed disk cache for compiled code (cubin, hsaco).

Keys are hashed; files are written atomically so concurrent processes can
share the directory. ``HAL_CACHE_DIR`` picks the place; ``HAL_CACHE_DIR=off``
disables it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from hal import env

_log = logging.getLogger(__name__)


def cache_root() -> Path | None:
    configured = env.text("HAL_CACHE_DIR")
    if configured is not None and env.is_off(configured):
        return None
    if configured is not None:
        return Path(configured)
    base = env.text("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hal"


class DiskCache:
    def __init__(self, namespace: str) -> None:
        root = cache_root()
        self.directory = None if root is None else root / namespace

    def _path(self, key: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / hashlib.sha256(key.encode()).hexdigest()

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except OSError:
            _log.debug("disk cache miss: %s", path)
            return None
        _log.debug("disk cache hit: %s (%d bytes)", path, len(data))
        return data

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
                tmp.write(data)
            os.replace(tmp.name, path)
        except OSError:
            pass  # a read-only or full cache directory only costs a recompile
