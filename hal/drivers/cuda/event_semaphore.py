"""CUDA timeline semaphores (``hal.drivers.gpu.event_semaphore`` over the shim): timepoints are
``CUevent``s (``CU_EVENT_DISABLE_TIMING``, pooled) recorded with ``cuEventRecord`` after each
submission; device waits are ``cuStreamWaitEvent``; the completion thread and low-latency host
waits use ``cuEventSynchronize``/``cuEventQuery``. ``cuLaunchHostFunc`` is never used.
"""

from hal.drivers.gpu.event_semaphore import EventPool, EventSemaphore, Timepoint

CudaSemaphore = EventSemaphore

__all__ = ["CudaSemaphore", "EventPool", "Timepoint"]
