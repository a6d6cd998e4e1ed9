"""A pluggable hardware abstraction layer: drivers, devices, buffers, command buffers, semaphores.

Importing ``hal`` imports no GPU library; drivers load theirs when first used.
"""

import importlib.metadata

from hal import log  # noqa: F401 - silent loggers before any driver logs
from hal.distribution import NAME as _DISTRIBUTION

try:
    __version__ = importlib.metadata.version(_DISTRIBUTION)
except importlib.metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

from hal import channel_provider, executable, pickling, semaphore, submission  # noqa: F401 - modules of the API reference
from hal.allocator import Allocator, AllocatorStatistics
from hal.buffer import Buffer
from hal.channel import (
    Channel,
    CollectiveMismatchError,
    allocate_symmetric,
    create_channel,
    create_channel_id,
    create_channels,
    split_channels,
)
from hal.command_buffer import BufferRef, CommandBuffer, Slot
from hal.device import Device
from hal.driver import MAX_QUEUE_COUNT, DeviceInfo, Driver, DriverInfo
from hal.errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    HalError,
    IncompatibleError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    StatusCode,
    UnavailableError,
    UnimplementedError,
)
from hal.executable import Executable, ExecutableSpec, Export
from hal.execution import Execution
from hal.library import Gemm, Routine, library_spec
from hal.library_fft import Fft
from hal.registry import (
    DriverFactory,
    PluginProblem,
    create_device,
    get_driver,
    hookimpl,
    list_drivers,
    open_device,
    parse_uri,
    plugin_manager,
    plugin_problems,
    register_driver,
)
from hal.semaphore import Semaphore, wait_all, wait_any
from hal.solver import LU, Cholesky, Eigh, LUSolve, Qr, Svd
from hal.tracing import trace
from hal.types import BufferUsage, CommandBufferMode, CommandBufferState, MemoryAccess, MemoryType

#: The modules a driver author uses beyond the names above (docs/driver-guide.md, section 3): listed in
#: ``__all__`` so that the API reference (pdoc, which follows ``__all__``) documents them too.
REFERENCE_MODULES = ("executable", "log", "pickling", "semaphore", "submission")

__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "Allocator",
    "AllocatorStatistics",
    "Buffer",
    "BufferRef",
    "BufferUsage",
    "CancelledError",
    "Channel",
    "Cholesky",
    "CollectiveMismatchError",
    "CommandBuffer",
    "CommandBufferMode",
    "CommandBufferState",
    "DataLossError",
    "DeadlineExceededError",
    "Device",
    "DeviceInfo",
    "Driver",
    "DriverFactory",
    "DriverInfo",
    "Eigh",
    "Executable",
    "ExecutableSpec",
    "Execution",
    "Export",
    "FailedPreconditionError",
    "Fft",
    "Gemm",
    "HalError",
    "IncompatibleError",
    "InternalError",
    "InvalidArgumentError",
    "LU",
    "LUSolve",
    "MAX_QUEUE_COUNT",
    "MemoryAccess",
    "MemoryType",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "PluginProblem",
    "Qr",
    "ResourceExhaustedError",
    "Routine",
    "Semaphore",
    "Slot",
    "StatusCode",
    "Svd",
    "UnavailableError",
    "UnimplementedError",
    "allocate_symmetric",
    "create_channel",
    "create_channel_id",
    "create_channels",
    "create_device",
    "get_driver",
    "hookimpl",
    "library_spec",
    "list_drivers",
    "open_device",
    "parse_uri",
    "plugin_manager",
    "plugin_problems",
    "register_driver",
    "split_channels",
    "trace",
    "wait_all",
    "wait_any",
    *REFERENCE_MODULES,
]
