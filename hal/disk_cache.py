"""A small content-addressed disk cache for compiled code (cubin, hsaco).

Keys are hashed; files are written atomically so concurrent processes can
share the directory. ``HAL_CACHE_DIR`` picks the place; ``HAL_CACHE_DIR=off``
disables it. ``HAL_CACHE_MAX_BYTES`` (default 1 GiB) bounds the directory: after a write the least
recently used entries (a hit refreshes an entry's modification time) are removed until it fits.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

from hal import env

_log = logging.getLogger(__name__)

#: The cache directory's default bound, all namespaces together (``HAL_CACHE_MAX_BYTES``).
DEFAULT_MAX_BYTES = 1 << 30
#: The prefix of files being written (tempfile's): never counted or removed, another process owns them.
_PARTIAL_PREFIX = "tmp"


def max_bytes() -> int:
    return env.integer("HAL_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES, minimum=1)


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
        self.root = root
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
        try:
            os.utime(path)  # recently used: the last to be evicted
        except OSError:
            pass
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
            return  # a read-only or full cache directory only costs a recompile
        self.evict(keep=path)

    def evict(self, keep: Path | None = None) -> None:
        """Remove the least recently used entries until the cache directory holds at most ``max_bytes()``."""
        if self.root is None:
            return
        limit = max_bytes()
        entries = []
        for directory, _, names in os.walk(self.root):
            for name in names:
                if name.startswith(_PARTIAL_PREFIX):
                    continue
                path = Path(directory, name)
                try:
                    info = path.stat()
                except OSError:
                    continue  # removed by another process meanwhile
                entries.append((info.st_mtime_ns, info.st_size, path))
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries, key=lambda entry: entry[0]):
            if total <= limit:
                break
            if path == keep:
                continue
            try:
                path.unlink()
            except OSError:
                continue
            total -= size
            _log.debug("disk cache evicted %s (%d bytes)", path, size)
