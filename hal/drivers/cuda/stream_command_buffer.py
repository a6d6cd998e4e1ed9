"""CUDA stream command buffer (``hal.drivers.gpu.stream_command_buffer`` over the shim):
``cuLaunchKernel`` with pre-packed ``void**`` arguments, ``cuMemsetD8/D16/D32Async``,
``cuMemcpyDtoDAsync`` and ``cuMemcpyHtoDAsync`` from pinned staging, on the queue's
non-blocking stream. One-shot command buffers use it unless ``command_buffer="graph"``.
"""

from hal.drivers.gpu.stream_command_buffer import StreamCommandBuffer

CudaStreamCommandBuffer = StreamCommandBuffer

__all__ = ["CudaStreamCommandBuffer"]
