"""CUDA graph command buffer (``hal.drivers.gpu.graph_command_buffer`` over the shim):
kernel nodes (``CUDA_KERNEL_NODE_PARAMS``), memset nodes, memcpy nodes (1-D
``CUDA_MEMCPY3D`` over unified addresses), barriers lowered to empty nodes, direct
edges or a no-op kernel (``hal_join``), ``cuGraphInstantiate`` once, ``cuGraphLaunch``
per submission and in-place rebinding with ``cuGraphExec{Kernel,Memset,Memcpy}NodeSetParams``.
Reusable command buffers use it unless ``command_buffer="stream"``.
"""

from hal.drivers.gpu.graph_command_buffer import EDGE_LIMIT, JOIN_KINDS, GraphCommandBuffer, choose_join

CudaGraphCommandBuffer = GraphCommandBuffer

__all__ = ["EDGE_LIMIT", "JOIN_KINDS", "CudaGraphCommandBuffer", "choose_join"]
