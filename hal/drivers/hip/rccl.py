"""RCCL behind the HIP driver's channels, through hip-python's bindings (``from hip import rccl``,
installed by ``hip-python[systems]``, the ``hip`` extra).

The same ``CollectiveLibrary`` as CUDA's NCCL (``hal/drivers/gpu/channel.py``), with hip-python's
conventions: each call returns a tuple whose first item is the ``ncclResult_t``; element types and
reductions are the bindings' enums (RCCL keeps NCCL's values); an output argument is the caller's
memory (``ncclCommGetAsyncError``'s result: a ``ctypes.c_int`` here); a unique id is its 128 bytes
viewed as the struct (``ncclUniqueId.fromObj``).

Unlike CUDA's, RCCL's communicators are blocking, and every split is a call of its own outside any
group (``grouped_splits``), because hip-python's ``ncclCommSplit`` returns the new communicator as it
stands when the call returns: a split that completes later (in a group, or of a non-blocking
communicator, whatever the new one's config says) writes its handle into memory the binding has let
go, and the call returns none. A non-blocking communicator could be made (``ncclCommInitRankConfig``
sets its handle at once), but neither the blocking communicator a channel issues on nor any split
could be made from it. So creating a HIP channel, and splitting one, waits for the other ranks in
the call: on helper threads, bounded by the channel's timeout (``init_rank`` and ``split_each`` in
hal/drivers/gpu/channel.py; where hip-python holds the interpreter while RCCL waits, the bound
cannot fire); ``ready`` reads ``ncclCommGetAsyncError`` all the same, and the watchdog's abort of
work in flight past the timeout works on blocking communicators too.

``load()`` imports the bindings when the first channel is made; without them, or without
``librccl``, it raises ``UnavailableError`` saying what to install.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from hal.distribution import install_hint
from hal.drivers.cuda.nccl import DATA_TYPES, IN_PROGRESS, REDUCTIONS, NcclStatus, async_ready, nccl_error
from hal.errors import InternalError, InvalidArgumentError, UnavailableError


class Rccl:
    """The ``CollectiveLibrary`` over hip-python's ``rccl`` module (``bindings``)."""

    #: Communicators are blocking (see the module): channels issue on them directly.
    nonblocking = False
    #: Each split is a call of its own, made before it returns (see the module).
    grouped_splits = False
    #: No symmetric memory windows: ``allocate_symmetric`` gives ordinary buffers.
    symmetric = False

    def __init__(self, bindings: Any) -> None:
        self.bindings = bindings
        version = self._call("ncclGetVersion")
        self.name = f"RCCL {version // 10000}.{version // 100 % 100}.{version % 100}"

    def _call(self, name: str, *args: Any) -> Any:
        try:
            result = getattr(self.bindings, name)(*args)
        except Exception as exc:
            raise nccl_error(name, exc) from exc
        status, *values = result if isinstance(result, tuple) else (result,)
        if int(status) not in (0, IN_PROGRESS):
            raise nccl_error(name, NcclStatus(int(status), f"{getattr(status, 'name', status)}"))
        return values[0] if len(values) == 1 else values or None

    def _dtype(self, name: str) -> Any:
        return self.bindings.ncclDataType_t(DATA_TYPES[name])

    def _op(self, name: str) -> Any:
        return self.bindings.ncclRedOp_t(REDUCTIONS[name])

    def new_id(self) -> bytes:
        unique = self._call("ncclGetUniqueId")
        return bytes(unique.internal)

    def init_rank(self, count: int, id: bytes, rank: int) -> Any:
        size = self.bindings.ncclUniqueId().c_sizeof()
        if len(id) != size:
            raise InvalidArgumentError(f"an RCCL channel id is {size} bytes (hal.create_channel_id), got {len(id)}")
        # (the id's bytes viewed as the struct; RCCL copies it during the call)
        unique = self.bindings.ncclUniqueId.fromObj(bytearray(id))
        comm = self._call("ncclCommInitRank", count, unique, rank)
        if comm is None:
            raise InternalError("ncclCommInitRank returned no communicator")
        return comm

    def ready(self, comm: Any) -> bool:
        state = ctypes.c_int(0)
        self._call("ncclCommGetAsyncError", comm, state)
        return async_ready(state.value, "ncclResult_t {}".format)

    def split(self, comm: Any, color: int | None, key: int, blocking: bool = False,
              max_blocks: int | None = None) -> Any:
        """A blocking communicator (every one is here), made before it returns: never call it in a group.
        (No config goes through hip-python's split: ``max_blocks`` is not applied.)"""
        new = self._call("ncclCommSplit", comm, -1 if color is None else color, key, None)
        if color is None:
            return None
        if new is None:
            raise InternalError("ncclCommSplit returned no communicator (a split in a group is made later, "
                                "and hip-python drops its handle)")
        return new

    def comm_rank(self, comm: Any) -> tuple[int, int]:
        return int(self._call("ncclCommUserRank", comm)), int(self._call("ncclCommCount", comm))

    def group_start(self) -> None:
        self._call("ncclGroupStart")

    def group_end(self) -> None:
        self._call("ncclGroupEnd")

    def destroy(self, comm: Any) -> None:
        self._call("ncclCommDestroy", comm)

    def abort(self, comm: Any) -> None:
        self._call("ncclCommAbort", comm)

    def all_reduce(self, send, recv, count, dtype, op, comm, stream) -> None:
        self._call("ncclAllReduce", send, recv, count, self._dtype(dtype), self._op(op), comm, stream)

    def reduce_scatter(self, send, recv, count, dtype, op, comm, stream) -> None:
        self._call("ncclReduceScatter", send, recv, count, self._dtype(dtype), self._op(op), comm, stream)

    def reduce(self, send, recv, count, dtype, op, root, comm, stream) -> None:
        self._call("ncclReduce", send, recv, count, self._dtype(dtype), self._op(op), root, comm, stream)

    def all_gather(self, send, recv, count, dtype, comm, stream) -> None:
        self._call("ncclAllGather", send, recv, count, self._dtype(dtype), comm, stream)

    def broadcast(self, send, recv, count, dtype, root, comm, stream) -> None:
        self._call("ncclBroadcast", send, recv, count, self._dtype(dtype), root, comm, stream)

    def send(self, buffer, count, dtype, peer, comm, stream) -> None:
        self._call("ncclSend", buffer, count, self._dtype(dtype), peer, comm, stream)

    def recv(self, buffer, count, dtype, peer, comm, stream) -> None:
        self._call("ncclRecv", buffer, count, self._dtype(dtype), peer, comm, stream)


_library: Rccl | None = None
_lock = threading.Lock()


def load() -> Rccl:
    """RCCL through hip-python (one per process); UnavailableError with what to install when it is missing."""
    global _library
    with _lock:
        if _library is not None:
            return _library
        try:
            from hip import rccl as bindings
        except Exception as exc:
            raise UnavailableError(
                f"HIP channels need hip-python's RCCL bindings ({type(exc).__name__}: {exc}); "
                f"{install_hint('hip')} and ROCm's RCCL (librccl.so on the loader's path)") from exc
        try:
            _library = Rccl(bindings)
        except Exception as exc:
            raise UnavailableError(
                f"hip-python cannot use RCCL ({type(exc).__name__}: {exc}); install ROCm's RCCL "
                "(librccl.so on the loader's path)") from exc
        return _library
