"""GPU-generic driver logic shared by the CUDA and HIP drivers.

Everything here is written against a thin API shim (``hal/drivers/cuda/api.py``
for CUDA): streams, events, graphs, memory and modules. A driver supplies the
shim and a few API-specific pieces (status codes, compiler, device properties);
the semaphores, submission queue, command buffers, barrier lowering, kernel
argument packing and the completion thread come from this package.
"""
