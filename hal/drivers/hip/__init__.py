"""``hip``: AMD GPUs through hip-python and hiprtc.

The GPU-generic driver (``hal.drivers.gpu``) over the HIP shim (``api.py``);
this package holds only what is HIP's own: the shim, status mapping, hiprtc
compilation, device properties and the availability probe.
"""
