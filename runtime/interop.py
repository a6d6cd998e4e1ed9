"""DLPack and __cuda_array_interface__: zero-copy exchange with numpy, PyTorch and CuPy.

Exports hand out the array's device memory itself (a legacy `dltensor`
capsule built with ctypes); the capsule keeps the storage alive until the
consumer calls the deleter. Imports copy into a runtime buffer.

The exports take the array (``Array.__dlpack__`` and the others call them) and use its own
methods to evaluate it, copy it or view it on the host.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

import hal

from . import dtypes as _dt
from .device import context_for
from .errors import InvalidTypeError, InvalidValueError
from .graph import Node, raise_index_errors, upload
from .host import to_numpy

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM = 1, 2, 3, 10
_DL_CODE = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]

_alive: dict = {}  # address of a DLManagedTensor -> everything it points into


@_Deleter
def _delete(managed) -> None:
    _alive.pop(ctypes.addressof(managed.contents), None)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Capsules handed out that may still be unconsumed: address of their tensor -> the capsule.
#
# The capsules have no destructor. A consumer that refuses a capsule (numpy, for a CUDA device)
# releases it with its error pending, and Python code run then (a ctypes callback) would replace that
# error with a SystemError. Instead, each export looks at the capsules handed out before
# (`release_dropped_capsules`): one that nothing else references any more was either consumed (renamed
# "used_dltensor": its consumer calls the tensor's deleter when done) or never will be (its tensor is
# dropped here).
_handed: dict[int, object] = {}
# sys.getrefcount of a value only its dict references, read as release_dropped_capsules reads it.
_probe = {0: object()}
_UNREFERENCED = sys.getrefcount(_probe[0])
del _probe


def release_dropped_capsules() -> None:
    """Forget the capsules nothing references any more; drop the tensors of those never consumed."""
    for addr in list(_handed):
        if sys.getrefcount(_handed[addr]) <= _UNREFERENCED:
            capsule = _handed.pop(addr)
            if _PyCapsule_IsValid(capsule, b"dltensor"):  # not consumed, and no one can any more
                _alive.pop(addr, None)


def make_capsule(data_ptr: int, device: tuple, shape: tuple, strides_elems: tuple, dtype, keepalive):
    """A legacy DLPack capsule over existing memory; `keepalive` lives until the consumer deletes it."""
    ndim = len(shape)
    managed = DLManagedTensor()
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides_elems)
    t = managed.dl_tensor
    t.data = data_ptr
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(_DL_CODE[dtype.kind] if dtype is not _dt.bfloat16 else 4, dtype.itemsize * 8, 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _delete
    addr = ctypes.addressof(managed)
    release_dropped_capsules()
    _alive[addr] = (managed, shape_arr, strides_arr, keepalive)
    capsule = _PyCapsule_New(addr, b"dltensor", None)
    _handed[addr] = capsule
    return capsule


def _cuda_ordinal(ctx) -> int | None:
    info = ctx.device.info
    if info.driver == "cuda":
        return info.ordinal
    return None


def device_pointer(buffer) -> int:
    """The device address of a HAL buffer (UnimplementedError where the driver has none)."""
    return buffer.device_address


def _ready_storage(a):
    if a.root.storage is None:
        a.eval()
    st = a.root.storage
    st.ctx.wait_storage(st)
    if a.checks is not None:
        raise_index_errors(a, to_numpy)
    return st


def dlpack_device(a) -> tuple:
    ordinal = _cuda_ordinal(a.ctx)
    if ordinal is not None:
        return (KDL_CUDA, ordinal)
    if a.ctx.is_gpu:
        return (KDL_ROCM, a.ctx.device.info.ordinal)
    return (KDL_CPU, 0)


def to_dlpack(a, stream=None, max_version=None, dl_device=None, copy=None):
    st = _ready_storage(a)
    strides, offset = a.layout()
    dev = dlpack_device(a)
    if dl_device is not None and tuple(dl_device) != dev:
        # To the host the standard allows a copy (unless copy=False): the GPU array read back.
        if tuple(dl_device) != (KDL_CPU, 0) or copy is False:
            why = " and copy=False forbids the copy to the host" if tuple(dl_device) == (KDL_CPU, 0) else ""
            raise BufferError(f"array is on DLPack device {dev}, not {tuple(dl_device)}{why}")
        return _host_capsule(a, a.numpy())
    if copy:
        return to_dlpack(a.copy(), stream, max_version, dl_device, False)
    if dev[0] == KDL_CPU:
        return _host_capsule(a, a.numpy())  # zero-copy view of mapped memory that keeps the storage alive
    ptr = device_pointer(st.buffer) + offset * a.dtype.itemsize
    return make_capsule(ptr, dev, a.shape, strides, a.dtype, (st, a))


def _host_capsule(a, host: np.ndarray):
    """A CPU capsule of ``host``, the host memory holding ``a``'s elements (kept alive with it)."""
    ptr = host.__array_interface__["data"][0]
    strides = tuple(s // a.dtype.itemsize for s in host.strides) if host.size else (0,) * a.ndim
    return make_capsule(ptr, (KDL_CPU, 0), a.shape, strides, a.dtype, host)


def cuda_array_interface(a) -> dict:
    if _cuda_ordinal(a.ctx) is None:
        raise AttributeError("__cuda_array_interface__ is only available for arrays on a cuda device")
    st = _ready_storage(a)
    strides, offset = a.layout()
    dt = a.dtype
    typestr = "<V2" if dt is _dt.bfloat16 else dt.storage.str
    return {"shape": a.shape, "typestr": typestr,
            "data": (device_pointer(st.buffer) + offset * dt.itemsize, False),
            "strides": tuple(s * dt.itemsize for s in strides), "version": 3, "stream": None}


def from_dlpack(obj, /, *, device=None, copy=None):
    """An Array holding a copy of any DLPack-exporting object (numpy, torch, cupy, another runtime Array)."""
    if isinstance(obj, Node):
        return obj
    if not hasattr(obj, "__dlpack__"):
        raise InvalidTypeError(f"from_dlpack takes an object with __dlpack__ (a DLPack producer), got "
                               f"{type(obj).__name__}")
    ctx = context_for(device)
    dev = obj.__dlpack_device__() if hasattr(obj, "__dlpack_device__") else (KDL_CPU, 0)
    if dev[0] in (KDL_CPU, KDL_CUDA_HOST):
        try:
            host = np.from_dlpack(obj)
        except (ValueError, TypeError) as exc:  # (BufferError, the protocol's refusal, passes through)
            raise InvalidValueError(f"{type(obj).__name__}.__dlpack__ did not give a DLPack capsule numpy reads: "
                                    f"{exc}") from None
    elif hasattr(obj, "cpu"):
        host = np.asarray(obj.cpu())  # torch-like tensors
    elif hasattr(obj, "get"):
        host = obj.get()  # cupy
    else:
        raise hal.UnimplementedError(f"cannot import a DLPack tensor from device type {dev[0]}")
    return upload(host, _dt.from_numpy(host.dtype), ctx)

