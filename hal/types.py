"""Flag and enum types shared by every HAL object."""

from __future__ import annotations

import enum


class MemoryType(enum.Flag):
    """Where memory lives and who can see it (IREE's memory type bits)."""

    NONE = 0
    DEVICE_LOCAL = enum.auto()
    DEVICE_VISIBLE = enum.auto()
    HOST_LOCAL = enum.auto()
    HOST_VISIBLE = enum.auto()
    HOST_COHERENT = enum.auto()
    HOST_CACHED = enum.auto()


class BufferUsage(enum.Flag):
    """What a buffer may be used for; commands check it."""

    NONE = 0
    TRANSFER = enum.auto()
    DISPATCH_STORAGE = enum.auto()
    MAPPING = enum.auto()
    DEFAULT = TRANSFER | DISPATCH_STORAGE | MAPPING


class MemoryAccess(enum.Flag):
    """How a mapping is going to be used."""

    NONE = 0
    READ = enum.auto()
    WRITE = enum.auto()
    DISCARD = enum.auto()
    ALL = READ | WRITE


class CommandBufferMode(enum.Flag):
    """ONE_SHOT buffers are submitted once; REUSABLE ones any number of times."""

    ONE_SHOT = enum.auto()
    REUSABLE = enum.auto()


class CommandBufferState(enum.Enum):
    INITIAL = "initial"
    RECORDING = "recording"
    EXECUTABLE = "executable"
    SUBMITTED = "submitted"
