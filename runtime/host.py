"""Host access to evaluated arrays: zero-copy numpy views of mapped memory where the device allows."""

from __future__ import annotations

import numpy as np

import hal
from hal import interrupts

from . import dtypes as _dt
from .graph import raise_index_errors
from .kernels.numpy_util import strided_view


class _Mapped:
    """Keeps a storage (and its mapping) alive for as long as a numpy array views it."""

    __slots__ = ("storage", "_cm", "__array_interface__")

    def __init__(self, storage, cm, arr: np.ndarray) -> None:
        self.storage = storage
        self._cm = cm
        self.__array_interface__ = arr.__array_interface__

    def __del__(self) -> None:
        cm = self._cm
        self._cm = None
        if cm is not None:
            try:
                cm.__exit__(None, None, None)
            except KeyboardInterrupt:
                interrupts.redeliver()
            except Exception:  # noqa: BLE001 - the buffer may already be gone at shutdown
                pass


def _host_visible(buf) -> bool:
    mt = getattr(buf, "memory_type", None)
    return mt is not None and bool(mt & hal.MemoryType.HOST_VISIBLE)


def to_numpy(a) -> np.ndarray:
    """The value of `a` (evaluated first if pending) as a read-only numpy array."""
    root = a.root
    if root.storage is None:
        a.eval()
    st = root.storage
    ctx = st.ctx
    ctx.wait_storage(st)
    if a.checks is not None:
        raise_index_errors(a, to_numpy)
    strides, offset = a.layout()
    dt = a.dtype
    if st.nbytes == 0 or a.size == 0:
        return np.zeros(a.shape, dtype=dt.numpy)
    buf = st.buffer
    if _host_visible(buf):
        cm = buf.map(hal.MemoryAccess.READ, 0, st.nbytes)
        mv = cm.__enter__()
        raw = np.frombuffer(mv, dtype=np.uint8)
        holder = _Mapped(st, cm, raw)
        base = np.asarray(holder)
    else:
        base = np.frombuffer(ctx.device.read(buf, 0, st.nbytes), dtype=np.uint8)
    view = strided_view(memoryview(base), dt, a.shape, strides, offset)
    if dt is _dt.bfloat16:
        f32 = _dt.from_bfloat16_bits(view)
        bf = _dt.numpy_bfloat16()
        return f32.astype(bf) if bf is not None else f32
    view.flags.writeable = False
    return view
