"""GPU-generic driver logic shared by the CUDA and HIP drivers.

Everything here is written against the declared GPU API (``api.py``, a
``typing.Protocol``): streams, events, graphs, memory and modules. A driver
supplies a shim implementing it (``hal/drivers/cuda/api.py``) and what is truly
its own (status codes, compiler, device properties); the semaphores, the
pending-action queue, command buffers, barrier lowering, kernel argument packing
and the completion thread come from this package.
"""
