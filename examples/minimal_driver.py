"""A complete HAL driver in about 90 lines of code: host memory in bytearrays, work run inline.

Register it without installing anything and run the conformance suite on it:

    HAL_PLUGINS=examples.minimal_driver PYTHONPATH=. pytest tests/cts --driver minimal

A packaged driver registers the same plugin through the ``hal.drivers`` entry-point group.
"""

from __future__ import annotations

import hal
from hal.allocator import Allocator
from hal.executable import numpy_functions
from hal.submission import HostSubmissions, run_inline

HOST = (hal.MemoryType.DEVICE_LOCAL | hal.MemoryType.DEVICE_VISIBLE | hal.MemoryType.HOST_LOCAL
        | hal.MemoryType.HOST_VISIBLE | hal.MemoryType.HOST_COHERENT)


class MinimalAllocator(Allocator):
    def _allocate(self, size, memory_type, usage):
        return bytearray(size), HOST  # the allocation object is ours to choose

    def _free(self, allocation):
        pass

    def _map(self, allocation, offset, length, access):
        return memoryview(allocation)[offset:offset + length]


def view(ref: hal.BufferRef, table) -> memoryview:
    """The bytes a (validated) buffer reference names, direct or through the binding table."""
    buffer, offset, length = ref.resolve(table)
    start = buffer.offset + offset
    return memoryview(buffer.allocation)[start:start + length]


class MinimalCommandBuffer(hal.CommandBuffer):
    """Arguments arrive validated; each hook records a closure run at submission."""

    def _begin(self):
        self.ops = []

    def _fill(self, target, pattern, pattern_length):
        chunk = pattern.to_bytes(pattern_length, "little")
        self.ops.append(lambda t: view(target, t).__setitem__(
            slice(None), chunk * (len(view(target, t)) // pattern_length)))

    def _update(self, data, target):
        self.ops.append(lambda t: view(target, t).__setitem__(slice(None), data))

    def _copy(self, source, target):
        self.ops.append(lambda t: view(target, t).__setitem__(slice(None), bytes(view(source, t))))

    def _barrier(self):
        pass  # commands already run in order

    def _dispatch(self, executable, ordinal, export, workgroups, constants, bindings):
        fn = executable.functions[ordinal]
        self.ops.append(lambda t: fn(workgroups, [view(b, t) for b in bindings], list(constants)))


class MinimalExecutable(hal.Executable):
    def __init__(self, device, spec):
        super().__init__(device, spec)
        if self.routines is not None:  # library routines (hal.Gemm): their numpy references
            self.functions = [routine.reference() for routine in self.routines]
        else:
            self.functions = numpy_functions(spec)  # the core validated the numpy code already


class MinimalDevice(hal.Device):
    executable_formats = ("numpy", "library")

    def __init__(self, driver, info):
        super().__init__(driver, info)
        self.allocator = MinimalAllocator(self)
        self.submissions = HostSubmissions()  # the core's bookkeeping of host-completed work

    def _create_semaphore(self, initial_value):
        return hal.Semaphore(self, initial_value)  # the core's host timeline is all we need

    def _create_command_buffer(self, mode, binding_capacity):
        return MinimalCommandBuffer(self, mode, binding_capacity)

    def _prepare_executable(self, spec):
        return MinimalExecutable(self, spec)

    def _write(self, buffer, offset, data):
        memoryview(buffer.allocation)[buffer.offset + offset:][:len(data)] = data

    def _read(self, buffer, offset, length):
        return bytes(memoryview(buffer.allocation)[buffer.offset + offset:][:length])

    def _queue_execute(self, queue, command_buffers, binding_tables, waits, signals):
        def work():
            for cb, table in zip(command_buffers, binding_tables):
                for op in cb.ops:
                    op(table)
        self._submit(waits, signals, work)

    def _queue_alloca(self, queue, size, memory_type, usage, waits, signals):
        buffer = self.allocator.allocate(size, memory_type, usage)
        self._submit(waits, signals, None)
        return buffer

    def _queue_dealloca(self, queue, buffer, waits, signals):
        self._submit(waits, signals, buffer.release)

    def _submit(self, waits, signals, work):
        # Park on the waits; run inline on the thread that reaches the last one; signal or fail.
        self.submissions.submit(waits, signals, work, run_inline)

    def _cancel_parked(self, cause):
        self.submissions.cancel_parked(cause)

    def _wait_idle(self, deadline):
        self.submissions.wait_idle(deadline)


class MinimalDriver(hal.Driver):
    name = "minimal"
    summary = "example driver: bytearrays, inline execution"

    def _probe(self):
        return True, None

    def _query_devices(self):
        return [hal.DeviceInfo(self.name, 0, "minimal0", "minimal host device", "minimal://0",
                               {"recoverable_kernel_faults": True})]

    def _create_device(self, info, **options):
        if options:  # an ignored option would leave the device configured otherwise than asked
            raise hal.InvalidArgumentError(f"minimal takes no device options, got {sorted(options)}")
        return MinimalDevice(self, info)


@hal.hookimpl
def hal_register_drivers():
    return [hal.DriverFactory(MinimalDriver.name, MinimalDriver.summary, MinimalDriver)]
