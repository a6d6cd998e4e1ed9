"""DLPack / numpy zero-copy on CPU drivers; PyTorch and CuPy on the cuda device where installed."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import numpy as np
import pytest
from rt_helpers import DEVICES, simulated_gpu

import runtime as rt
from runtime import interop

CPU = [d for d in DEVICES if d != "cuda"]


@pytest.mark.parametrize("device", CPU)
def test_numpy_views_mapped_memory_without_copy(device):
    x = rt.array(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)
    a, b = x.numpy(), x.numpy()
    assert a.ctypes.data == b.ctypes.data, "both views alias the device buffer"
    assert not a.flags.writeable
    t = x.T.numpy()
    assert t.ctypes.data == a.ctypes.data and t.strides == (4, 16)


@pytest.mark.parametrize("device", CPU)
def test_dlpack_round_trip_with_numpy(device):
    x = rt.array(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)
    assert x.__dlpack_device__() == (interop.KDL_CPU, 0)
    view = x[:, ::-2].T
    n = np.from_dlpack(view)
    np.testing.assert_array_equal(n, np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-2].T)
    whole = np.from_dlpack(x)
    assert whole.ctypes.data == x.numpy().ctypes.data
    for dt, host in (("int32", np.arange(3, dtype=np.int32)), ("bool", np.array([True, False])),
                     ("float16", np.ones(2, np.float16))):
        back = np.from_dlpack(rt.array(host, device=device))
        np.testing.assert_array_equal(back, host)
        assert back.dtype == host.dtype, dt
    del n, whole, back
    gc.collect()
    interop.release_dropped_capsules()
    assert not interop._alive, "consumed capsules release what they kept alive"
    cap = x.__dlpack__()
    del cap
    interop.release_dropped_capsules()  # (the next export does it too)
    assert not interop._alive, "an unconsumed capsule releases its tensor"


@pytest.mark.parametrize("device", CPU)
def test_from_dlpack(device):
    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    x = rt.from_dlpack(host, device=device)
    np.testing.assert_array_equal(x.numpy(), host)
    y = rt.from_dlpack(np.from_dlpack(x), device=device)
    np.testing.assert_array_equal(y.numpy(), host)


@pytest.mark.parametrize("device", CPU)
def test_from_dlpack_refuses_what_is_not_a_producer(device):
    class NotACapsule:
        def __dlpack__(self, **kwargs):
            return 5

        def __dlpack_device__(self):
            return (1, 0)

    for obj in (None, 1.5, "x", object(), [1, 2]):
        with pytest.raises(rt.InvalidTypeError):
            rt.from_dlpack(obj, device=device)
    with pytest.raises(rt.InvalidValueError):
        rt.from_dlpack(NotACapsule(), device=device)
    with pytest.raises(BufferError):  # the protocol's own refusal, from the producer
        rt.from_dlpack(np.array(["a"]), device=device)
    np.testing.assert_array_equal(rt.from_dlpack(np.ones(2), device=device).numpy(), np.ones(2))


@pytest.mark.parametrize("device", CPU)
def test_no_cuda_array_interface_off_cuda(device):
    x = rt.array(np.ones(2, np.float32), device=device)
    assert not hasattr(x, "__cuda_array_interface__")


needs_cuda = pytest.mark.skipif("cuda" not in DEVICES, reason="no available cuda driver on this machine")


@needs_cuda
def test_torch_zero_copy_on_cuda():
    torch = pytest.importorskip("torch")
    x = rt.array(np.arange(8, dtype=np.float32).reshape(2, 4), device="cuda")
    t = torch.from_dlpack(x)
    assert t.is_cuda
    np.testing.assert_array_equal(t.cpu().numpy(), np.arange(8).reshape(2, 4))
    assert t.data_ptr() == x.__cuda_array_interface__["data"][0]
    tt = torch.from_dlpack(x.T)
    np.testing.assert_array_equal(tt.cpu().numpy(), np.arange(8).reshape(2, 4).T)
    back = rt.from_dlpack(torch.arange(5, device="cuda", dtype=torch.float32), device="cuda")
    np.testing.assert_array_equal(back.numpy(), np.arange(5))


@needs_cuda
def test_cupy_zero_copy_on_cuda():
    cp = pytest.importorskip("cupy")
    x = rt.array(np.arange(6, dtype=np.float32), device="cuda")
    c = cp.asarray(x)  # __cuda_array_interface__
    assert c.data.ptr == x.__cuda_array_interface__["data"][0]
    np.testing.assert_array_equal(cp.asnumpy(c), np.arange(6))
    d = cp.from_dlpack(x[::2])
    np.testing.assert_array_equal(cp.asnumpy(d), np.arange(6)[::2])


@pytest.mark.parametrize("device", CPU)
def test_host_read_path_for_device_local_memory(device, monkeypatch):
    """Memory that cannot be mapped (GPU device-local) is read back with Device.read."""
    from runtime import host
    monkeypatch.setattr(host, "_host_visible", lambda buf: False)
    x = rt.array(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)
    np.testing.assert_array_equal(x.numpy(), np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal((x[:, ::-1].T * 2).numpy(), np.arange(12).reshape(3, 4)[:, ::-1].T * 2)
    b = rt.array(np.array([True, False]), device=device)
    np.testing.assert_array_equal(b.numpy(), [True, False])


def test_a_refused_capsule_gives_the_consumers_error_and_frees_its_tensor():
    """A consumer that refuses a capsule (numpy, for a CUDA device) releases it with its error
    pending: the consumer's own error comes out (not a SystemError), and the tensor the capsule
    still owned is dropped."""
    host = np.arange(4, dtype=np.float32)

    class OnCuda:  # host memory announced as CUDA memory: numpy refuses it
        def __dlpack_device__(self):
            return (interop.KDL_CUDA, 0)

        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return interop.make_capsule(host.ctypes.data, (interop.KDL_CUDA, 0), (4,), (1,), rt.float32, host)

    before = len(interop._alive)
    for _ in range(3):
        with pytest.raises((RuntimeError, BufferError)) as caught:
            np.from_dlpack(OnCuda())
        assert not isinstance(caught.value, SystemError)
    interop.release_dropped_capsules()  # (each export does it too)
    assert len(interop._alive) == before
    # an unconsumed capsule dropped without any error frees its tensor too
    capsule = interop.make_capsule(host.ctypes.data, (interop.KDL_CPU, 0), (4,), (1,), rt.float32, host)
    assert len(interop._alive) == before + 1
    del capsule
    interop.release_dropped_capsules()
    assert len(interop._alive) == before


def test_a_gpu_array_exports_to_the_host_as_a_copy_when_asked():
    """``__dlpack__(dl_device=(kDLCPU, 0))`` of a GPU array gives a host copy (the standard lets a
    producer copy unless copy=False, which raises BufferError), as numpy's from_dlpack asks."""
    device, emulated = simulated_gpu(libraries=False)
    try:
        with emulated:
            x = rt.asarray(np.arange(12, dtype=np.float32).reshape(3, 4), device=device)[:, 1:]
            assert x.__dlpack_device__()[0] != 1  # (a GPU device type, not kDLCPU)
            host = np.from_dlpack(SimpleNamespace(__dlpack__=lambda **kw: x.__dlpack__(dl_device=(1, 0), **kw),
                                                  __dlpack_device__=lambda: (1, 0)))
            np.testing.assert_array_equal(host, np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:])
            with pytest.raises(BufferError, match="copy=False"):
                x.__dlpack__(dl_device=(1, 0), copy=False)
            with pytest.raises(BufferError, match="not \\(2, 1\\)"):
                x.__dlpack__(dl_device=(2, 1))
    finally:
        device.close()


@pytest.mark.parametrize("dtype", [">f4", ">f2", ">i8", ">u8", ">c16", ">i2"])
def test_big_endian_numpy_data_converts_as_numpy_reads_it(dev, dtype):
    """Data of a non-native byte order (files and network formats) was refused as an unsupported
    dtype; it is the same values, stored natively on the device (as JAX and CuPy do)."""
    host = (np.arange(12) * 3 + 1).reshape(3, 4).astype(dtype)
    x = rt.asarray(host, device=dev)
    assert x.dtype.name == np.dtype(dtype).newbyteorder("=").name
    np.testing.assert_array_equal(x.numpy(), host)
    np.testing.assert_array_equal((x + x).numpy(), host + host)
    assert rt.zeros(2, dtype=np.dtype(dtype), device=dev).dtype == x.dtype
