"""CUDA memory, through the GPU-generic allocator (``hal.drivers.gpu.allocator``) over the shim:

- device-local buffers: ``cuMemAlloc``;
- host-visible buffers: ``cuMemHostAlloc(PORTABLE | DEVICEMAP)`` pinned memory, mapped
  for the host through a memoryview of its host address, used by the device at
  ``cuMemHostGetDevicePointer``;
- ``queue_alloca``: ``cuMemAllocAsync`` from the device's default memory pool
  (release threshold set at device creation), freed by ``queue_dealloca`` with
  ``cuMemFreeAsync`` in stream order;
- frees of released buffers wait for the submissions made before the release.
"""

from hal.drivers.gpu.allocator import DEVICE_MEMORY, HOST_MEMORY, Allocation, GpuAllocator

CudaAllocator = GpuAllocator

__all__ = ["DEVICE_MEMORY", "HOST_MEMORY", "Allocation", "CudaAllocator"]
