"""The compiled-code disk cache: shared atomically, bounded by HAL_CACHE_MAX_BYTES with least-recently-used
eviction across its namespaces."""

from __future__ import annotations

import os
import time

import pytest

import hal
from hal.disk_cache import DEFAULT_MAX_BYTES, DiskCache, cache_root, max_bytes


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("HAL_CACHE_MAX_BYTES", raising=False)
    return tmp_path


def size_of(directory) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def test_entries_round_trip_and_the_default_bound(cache_dir):
    cache = DiskCache("cuda")
    assert cache.get("k") is None
    cache.put("k", b"image")
    assert cache.get("k") == b"image"
    assert max_bytes() == DEFAULT_MAX_BYTES == 1 << 30


def test_the_least_recently_used_entries_go_first_across_namespaces(cache_dir, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", "3000")
    cuda, hip = DiskCache("cuda"), DiskCache("hip")
    for i, cache in enumerate((cuda, hip, cuda)):
        cache.put(f"k{i}", bytes(1000))
        stamp = time.time() - 100 + i  # distinct ages, oldest first, whatever the clock's resolution
        os.utime(cache._path(f"k{i}"), (stamp, stamp))
    assert cuda.get("k0") is not None  # used now: the newest
    cuda.put("k3", bytes(1000))
    assert size_of(cache_dir) <= 3000
    assert hip.get("k1") is None  # the least recently used went
    assert cuda.get("k0") is not None and cuda.get("k2") is not None and cuda.get("k3") is not None


def test_an_entry_larger_than_the_bound_is_kept_alone(cache_dir, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", "100")
    cache = DiskCache("cuda")
    cache.put("small", bytes(50))
    cache.put("large", bytes(500))
    assert cache.get("large") == bytes(500) and cache.get("small") is None


def test_files_being_written_by_another_process_are_left_alone(cache_dir, monkeypatch):
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", "10")
    (cache_dir / "cuda").mkdir()
    partial = cache_dir / "cuda" / "tmpabc123"
    partial.write_bytes(bytes(100))
    DiskCache("cuda").put("k", b"12345")
    assert partial.exists()


@pytest.mark.parametrize("bad", ["0", "-5", "lots"])
def test_a_bad_bound_is_an_error_naming_the_variable(cache_dir, monkeypatch, bad):
    monkeypatch.setenv("HAL_CACHE_MAX_BYTES", bad)
    with pytest.raises(hal.InvalidArgumentError, match="HAL_CACHE_MAX_BYTES"):
        max_bytes()


def test_the_default_directory_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.delenv("HAL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "hal"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == __import__("pathlib").Path.home() / ".cache" / "hal"
    monkeypatch.setenv("HAL_CACHE_DIR", "off")
    assert cache_root() is None
