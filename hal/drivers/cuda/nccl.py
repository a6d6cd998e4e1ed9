"""NCCL behind the CUDA driver's channels, through NVIDIA's nccl4py bindings (``nccl.bindings.nccl``).

``load()`` imports the bindings when the first channel is made (never at ``import hal``) and
gives the ``CollectiveLibrary`` of ``hal/drivers/gpu/channel.py``; without nccl4py, or without
the NCCL library it opens (the ``nvidia-nccl-cu13`` wheel, or the one PyTorch installs), it
raises ``UnavailableError`` saying what to install (the ``nccl`` extra).

The bindings take raw device addresses, the communicator object and the stream as an integer
(``int(CUstream)``); element types and reductions are NCCL's ``ncclDataType_t`` / ``ncclRedOp_t``.
Symmetric memory (NCCL 2.27 and later: ``symmetric``) is ``ncclMemAlloc``'s memory registered with
``ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)``; a split's block cap is its config's
``maxCTAs``, in clusters of one block (``cgaClusterSize = 1``: a cluster of Hopper's default four would
need four SMs of one GPC free at once).
Communicators are non-blocking (``ncclConfig_t.blocking = 0``) and share their resources with
their splits (``splitShare = 1``): calls return at once, the bindings take ``ncclInProgress`` for
success, and ``ready`` polls ``ncclCommGetAsyncError``. ``split(..., blocking=True)`` makes the
blocking communicator a channel issues its collectives on (``nonblocking``: see
``hal/drivers/gpu/channel.py``).
NCCL's failures (``NCCLError``) become ``hal`` errors: invalid arguments and usage are
``InvalidArgumentError``, a timeout ``DeadlineExceededError``, everything else ``InternalError``,
each naming the call and NCCL's message.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

from hal.distribution import install_hint
from hal.drivers.gpu.channel import poll_ready
from hal.errors import DeadlineExceededError, HalError, InternalError, InvalidArgumentError, UnavailableError

#: ncclDataType_t of each element type NCCL reduces (bytes move as uint8).
DATA_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7,
              "float64": 8, "bfloat16": 9}
#: ncclRedOp_t of each reduction.
REDUCTIONS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
#: ncclResult_t values with an error of their own.
_INVALID = (4, 5)  # ncclInvalidArgument, ncclInvalidUsage
_TIMEOUT = 8
#: ncclResult_t of an operation of a non-blocking communicator still under way.
IN_PROGRESS = 7
#: ncclCommWindowRegister's flag for a window every rank registers alike (symmetric kernels).
WIN_COLL_SYMMETRIC = 1
#: The first NCCL with symmetric memory windows.
SYMMETRIC_VERSION = 22700


def _checked(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with NCCL's exceptions turned into hal errors naming ``name``."""

    @functools.wraps(function)
    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except HalError:
            raise
        except Exception as exc:
            raise nccl_error(name, exc) from exc

    return call


#: How long a close waits for a communicator's finalize (its work is complete by then) before aborting it.
FINALIZE_SECONDS = 30.0


class NcclStatus(Exception):
    """A non-zero ``ncclResult_t`` a binding returned rather than raised (``status``), for ``nccl_error``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def async_ready(status: int, describe: Callable[[int], str]) -> bool:
    """``CollectiveLibrary.ready`` from ``ncclCommGetAsyncError``'s ``status``: False while in
    progress, True when done, the hal error of any other result (``describe`` names it)."""
    if status == IN_PROGRESS:
        return False
    if status:
        raise nccl_error("ncclCommGetAsyncError", NcclStatus(status, describe(status)))
    return True


def nccl_error(name: str, exc: BaseException) -> HalError:
    code = getattr(exc, "status", None)
    if code is None:
        code = getattr(exc, "result", None)
    try:
        code = int(code)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        code = None
    message = f"{name}: {exc}"
    if code in _INVALID:
        return InvalidArgumentError(message)
    if code == _TIMEOUT:
        return DeadlineExceededError(message)
    return InternalError(message)


class Nccl:
    """The ``CollectiveLibrary`` over ``nccl.bindings.nccl`` (``bindings``)."""

    #: Communicators are non-blocking: channels issue on a blocking split (see CollectiveLibrary).
    nonblocking = True
    #: nccl4py fills in a split's communicator when its group completes.
    grouped_splits = True

    def __init__(self, bindings: Any) -> None:
        self.bindings = b = bindings
        version = b.get_version()
        self.name = f"NCCL {version // 10000}.{version // 100 % 100}.{version % 100}" if version >= 10000 else \
            f"NCCL {version // 1000}.{version // 100 % 10}.{version % 100}"
        self._get_unique_id = _checked("ncclGetUniqueId", b.get_unique_id)
        self._init_rank = _checked("ncclCommInitRankConfig", b.comm_init_rank_config)
        self._async_error = _checked("ncclCommGetAsyncError", b.comm_get_async_error)
        self._split = _checked("ncclCommSplit", b.comm_split)
        self._finalize = _checked("ncclCommFinalize", b.comm_finalize)
        #: (blocking, max_blocks) -> the ncclConfig_t of communicators made so (see ``config``).
        self._configs: dict[tuple[bool, int | None], Any] = {}
        self._config = self.config(False, None)
        self.symmetric = version >= SYMMETRIC_VERSION and hasattr(b, "comm_window_register")
        if self.symmetric:
            self.mem_alloc = _checked("ncclMemAlloc", b.mem_alloc)
            self.mem_free = _checked("ncclMemFree", b.mem_free)
            self._window_register = _checked("ncclCommWindowRegister", b.comm_window_register)
            self.window_deregister = _checked("ncclCommWindowDeregister", b.comm_window_deregister)
        self._count = _checked("ncclCommCount", b.comm_count)
        self._user_rank = _checked("ncclCommUserRank", b.comm_user_rank)
        self.group_start = _checked("ncclGroupStart", b.group_start)
        self.group_end = _checked("ncclGroupEnd", b.group_end)
        self._destroy = _checked("ncclCommDestroy", b.comm_destroy)
        self._abort = _checked("ncclCommAbort", b.comm_abort)
        self._all_reduce = _checked("ncclAllReduce", b.all_reduce)
        self._reduce_scatter = _checked("ncclReduceScatter", b.reduce_scatter)
        self._reduce = _checked("ncclReduce", b.reduce)
        self._all_gather = _checked("ncclAllGather", b.all_gather)
        self._broadcast = _checked("ncclBroadcast", b.broadcast)
        self._send = _checked("ncclSend", b.send)
        self._recv = _checked("ncclRecv", b.recv)

    def config(self, blocking: bool, max_blocks: int | None) -> Any:
        """The config of communicators made here (kept alive: NCCL reads it at init): non-blocking ones
        share resources with their splits; ``max_blocks`` caps a collective's blocks, one a cluster."""
        key = (blocking, max_blocks)
        config = self._configs.get(key)
        if config is None:
            config = self.bindings.Config()
            config.blocking = int(blocking)
            if not blocking:
                config.split_share = 1
            if max_blocks is not None:
                config.max_ctas = max_blocks
                config.cga_cluster_size = 1
            config = self._configs.setdefault(key, config)
        return config

    # -- communicators -----------------------------------------------------------------------
    def new_id(self) -> bytes:
        return bytes(self._get_unique_id())

    def init_rank(self, count: int, id: bytes, rank: int) -> Any:
        if len(id) != 128:
            raise InvalidArgumentError(f"an NCCL channel id is 128 bytes (hal.create_channel_id), got {len(id)}")
        return self._init_rank(count, self.bindings.UniqueId.from_buffer(bytearray(id)), rank, self._config.ptr)

    def ready(self, comm: Any) -> bool:
        return async_ready(int(self._async_error(comm)), self.bindings.get_error_string)

    def split(self, comm: Any, color: int | None, key: int, blocking: bool = False,
              max_blocks: int | None = None) -> Any:
        config = self.config(blocking, max_blocks)
        new = self._split(comm, -1 if color is None else color, key, config.ptr)
        # (not ``new`` itself: a non-blocking split's handle is still null here, filled in once
        # ``comm`` is ready again)
        return None if color is None else new

    def comm_rank(self, comm: Any) -> tuple[int, int]:
        return int(self._user_rank(comm)), int(self._count(comm))

    def destroy(self, comm: Any) -> None:
        """Finalize (flush, wait for it: a non-blocking finalize returns at once), then destroy."""
        self._finalize(comm)
        try:
            poll_ready(self, [comm], time.monotonic() + FINALIZE_SECONDS, lambda: None, "ncclCommFinalize")
        except DeadlineExceededError:
            self._abort(comm)
            return
        self._destroy(comm)

    def abort(self, comm: Any) -> None:
        self._abort(comm)

    # -- symmetric memory (``symmetric``: mem_alloc, mem_free and window_deregister are set above) -----
    def window_register(self, comm: Any, ptr: int, size: int) -> Any:
        return self._window_register(comm, ptr, size, WIN_COLL_SYMMETRIC)

    # -- operations (inside the caller's group) ------------------------------------------------------
    def all_reduce(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any, stream: Any) -> None:
        self._all_reduce(send, recv, count, DATA_TYPES[dtype], REDUCTIONS[op], comm, int(stream))

    def reduce_scatter(self, send: int, recv: int, count: int, dtype: str, op: str, comm: Any, stream: Any) -> None:
        self._reduce_scatter(send, recv, count, DATA_TYPES[dtype], REDUCTIONS[op], comm, int(stream))

    def reduce(self, send: int, recv: int, count: int, dtype: str, op: str, root: int, comm: Any,
               stream: Any) -> None:
        self._reduce(send, recv, count, DATA_TYPES[dtype], REDUCTIONS[op], root, comm, int(stream))

    def all_gather(self, send: int, recv: int, count: int, dtype: str, comm: Any, stream: Any) -> None:
        self._all_gather(send, recv, count, DATA_TYPES[dtype], comm, int(stream))

    def broadcast(self, send: int, recv: int, count: int, dtype: str, root: int, comm: Any, stream: Any) -> None:
        self._broadcast(send, recv, count, DATA_TYPES[dtype], root, comm, int(stream))

    def send(self, buffer: int, count: int, dtype: str, peer: int, comm: Any, stream: Any) -> None:
        self._send(buffer, count, DATA_TYPES[dtype], peer, comm, int(stream))

    def recv(self, buffer: int, count: int, dtype: str, peer: int, comm: Any, stream: Any) -> None:
        self._recv(buffer, count, DATA_TYPES[dtype], peer, comm, int(stream))


_library: Nccl | None = None
_lock = threading.Lock()


def load() -> Nccl:
    """NCCL through nccl4py (one per process); UnavailableError with what to install when it is missing."""
    global _library
    with _lock:
        if _library is not None:
            return _library
        try:
            from nccl.bindings import nccl as bindings
        except Exception as exc:  # not installed, or its extension fails to import
            raise UnavailableError(
                f"CUDA channels need nccl4py ({type(exc).__name__}: {exc}); {install_hint('nccl')} "
                "installs nccl4py and NCCL (nvidia-nccl-cu13)") from exc
        try:
            library = Nccl(bindings)
        except Exception as exc:  # the NCCL library itself is missing (cuda.pathfinder cannot find libnccl)
            raise UnavailableError(
                f"nccl4py cannot open the NCCL library ({type(exc).__name__}: {exc}); install nvidia-nccl-cu13 "
                f"({install_hint('nccl')})") from exc
        _library = library
        return library
