"""What a driver must do when a conformance test fails: the hooks that carry each concept, and the behaviour.

The plugin adds the entry of a failing test's module to its report, so a driver author reads which
hook to fix without reading the test first. docs/driver-guide.md has each hook's full contract.
"""

from __future__ import annotations

#: CTS module name -> (hooks involved, what the driver must do).
GUIDANCE: dict[str, tuple[tuple[str, ...], str]] = {
    "test_driver": (
        ("Driver._probe", "Driver._query_devices", "Driver._create_device", "Device._close"),
        "report availability without raising (a reason when unavailable), list devices with stable ids and "
        "URIs that create_device accepts, and release everything in close().",
    ),
    "test_device_options": (
        ("Driver._create_device",),
        "reject every device option it does not know with hal.InvalidArgumentError naming the option; "
        "an ignored option leaves the device configured otherwise than the user asked.",
    ),
    "test_allocator": (
        ("Allocator._allocate", "Allocator._free"),
        "return an allocation of at least the requested size and the memory type actually provided, "
        "raise hal.ResourceExhaustedError when out of memory, and free on release (statistics follow).",
    ),
    "test_buffer_mapping": (
        ("Allocator._map", "Allocator._unmap"),
        "map host-visible memory as a writable memoryview of exactly [offset, offset + length); "
        "writes through the view reach the buffer by unmap.",
    ),
    "test_fill": (
        ("CommandBuffer._fill", "Device._queue_execute"),
        "write the 1, 2 or 4-byte little-endian pattern repeatedly over exactly the target range, nothing outside.",
    ),
    "test_update": (
        ("CommandBuffer._update",),
        "copy the inline bytes into the target range at execution time (keep your own copy at record time: "
        "the caller may reuse its buffer).",
    ),
    "test_copy": (
        ("CommandBuffer._copy",),
        "copy exactly the source range to the target range, between different buffers and within one buffer.",
    ),
    "test_dispatch": (
        ("Device._prepare_executable", "CommandBuffer._dispatch", "CommandBuffer._barrier"),
        "run the export over workgroups x workgroup_size invocations with the bindings resolved to the bound "
        "ranges (offset and length) and the constants in order; after a barrier, later commands see earlier "
        "results.",
    ),
    "test_executable_cache": (
        ("Device._prepare_executable",),
        "prepare each format listed in Device.executable_formats; the core caches by content, so prepare "
        "must not keep state that another load of the same spec would need.",
    ),
    "test_command_buffer_state": (
        ("CommandBuffer._begin", "CommandBuffer._end", "Device._create_command_buffer"),
        "record between begin and end; a one-shot command buffer runs once, a reusable one every time it is submitted.",
    ),
    "test_reusable": (
        ("CommandBuffer._dispatch", "CommandBuffer._fill", "CommandBuffer._copy", "Device._queue_execute"),
        "resolve hal.Slot references against the binding table passed to each queue_execute "
        "(ref.resolve(binding_table)), not the one of an earlier submission.",
    ),
    "test_semaphore": (
        ("Device._create_semaphore",),
        "return a hal.Semaphore (or subclass) whose value only increases; waits time out with "
        "hal.DeadlineExceededError and wake on signal.",
    ),
    "test_submission_ordering": (
        ("Device._queue_execute", "Device._wait_idle"),
        "start no work before all its waits are reached, then signal every (semaphore, value) of the submission; "
        "wait_idle returns only after everything submitted completed.",
    ),
    "test_wait_before_signal": (
        ("Device._queue_execute", "Device._cancel_parked"),
        "never block in queue_execute on an unreached wait: park the work (hal.semaphore.FenceWaiter, or "
        "hal.submission.HostSubmissions) and issue it when the value arrives; fail parked work on close.",
    ),
    "test_failure_propagation": (
        ("Device._queue_execute", "Device._cancel_parked"),
        "fail every semaphore that failed work would signal with the original error (HostSubmissions does); "
        "work waiting on a failed semaphore fails in turn, and the device stays usable.",
    ),
    "test_queue_alloca": (
        ("Device._queue_alloca", "Device._queue_dealloca"),
        "return a buffer usable by work ordered after the signal, and free it only once the dealloca's waits "
        "are reached.",
    ),
    "test_errors": (
        ("Device._queue_execute", "CommandBuffer._dispatch"),
        "raise typed hal.HalError subclasses, never bare exceptions, and leave the device usable after any "
        "rejected call (the core validates arguments: do not validate again in hooks).",
    ),
    "test_collectives": (
        ("CommandBuffer._collective", "Device._queue_execute"),
        "give the device a channel factory (device.collectives, hal.channel.ChannelFactory) and run every "
        "collective of a channel in queue order, meeting the other ranks' (hal.channel's table of operands and "
        "in-place rules); fail the submission's semaphores when a rank times out or aborts.",
    ),
    "test_threads": (
        ("Device._queue_execute", "Device._create_semaphore"),
        "accept submissions, waits and signals from several threads at once: guard shared driver state.",
    ),
}


#: The suite is installed without the project's docs: name the guide where it is published, and what the
#: installed package itself holds (the hooks' docstrings).
WHERE_HOOKS_ARE_DESCRIBED = ("each hook's contract: docs/driver-guide.md in the hal-gpu source distribution, "
                             "and `python -m pydoc hal.Device` (hal.Driver, hal.CommandBuffer, ...) where installed")


def advice(module_name: str) -> str:
    """The text shown under a failing test of ``module_name`` (test_fill, ...)."""
    entry = GUIDANCE.get(module_name)
    if entry is None:
        return f"see the test's docstring for the hooks it exercises; {WHERE_HOOKS_ARE_DESCRIBED}"
    hooks, behaviour = entry
    return f"hooks: {', '.join(hooks)}\nthe driver must {behaviour}\n({WHERE_HOOKS_ARE_DESCRIBED})"
