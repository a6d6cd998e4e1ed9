"""Kernel sources: one CUDA C string and one set of numpy callables per (op, dtypes), loaded once per device."""

from __future__ import annotations

import hal
from hal import env

from .cuda_common import COMMON, CUDA_PRELUDE, HIP_PRELUDE

WORKGROUP = 256


class KernelSource:
    """The exports of one (op, dtypes) kernel family in every executable format."""

    __slots__ = ("key", "exports", "_cuda", "_numpy", "_cuda_fn", "_numpy_fn")

    def __init__(self, key: tuple, exports: list, cuda_fn, numpy_fn) -> None:
        self.key = key
        self.exports = exports  # list[hal.Export]
        self._cuda_fn = cuda_fn  # () -> kernel body C source (without prelude)
        self._numpy_fn = numpy_fn  # () -> {export name: callable}
        self._cuda = None
        self._numpy = None

    @property
    def name(self) -> str:
        return "_".join(str(k) for k in self.key)

    def body(self) -> str:
        """The family's kernels without the shared prelude (the compile tests put many in one program)."""
        return self._cuda_fn()

    def cuda_source(self) -> str:
        if self._cuda is None:
            self._cuda = CUDA_PRELUDE + COMMON + self._cuda_fn()
        return self._cuda

    def hip_source(self) -> str:
        return HIP_PRELUDE + COMMON + self._cuda_fn()

    def numpy_code(self) -> dict:
        if self._numpy is None:
            self._numpy = self._numpy_fn()
        return self._numpy

    def specs(self, formats: tuple) -> list:
        out = []
        for fmt in formats:
            if fmt == "numpy":
                out.append(hal.ExecutableSpec("numpy", self.numpy_code(), self.exports))
            elif fmt == "cuda-c":
                out.append(hal.ExecutableSpec("cuda-c", self.cuda_source(), self.exports))
            elif fmt == "hip-c":
                out.append(hal.ExecutableSpec("hip-c", self.hip_source(), self.exports))
        return out


#: Kernel sources kept for the next recording that wants them, the least recently used dropped first
#: (a dropped one is built again when wanted: distinct fused kernels are as many as distinct graphs).
SOURCES_KEPT = env.integer("RUNTIME_KERNEL_SOURCES", 2048, minimum=16)
#: Loaded executables a device context keeps, likewise. A recording holds the executables it runs
#: (its command buffer does), so dropping one here unloads it only once no cached graph runs it; the
#: device's own executable cache (hal.device.EXECUTABLE_CACHE_ENTRIES) may keep it a while longer.
EXECUTABLES_KEPT = env.integer("RUNTIME_EXECUTABLES", 256, minimum=16)

_sources: dict = {}  # key -> KernelSource, least recently used first


def source(key: tuple, build) -> KernelSource:
    """The KernelSource for `key`, built by `build()` unless it is kept (SOURCES_KEPT)."""
    src = _sources.pop(key, None)
    if src is None:
        src = build()
        while len(_sources) >= SOURCES_KEPT:  # (shared by every device's thread: one may evict it first)
            _sources.pop(next(iter(_sources)), None)
    _sources[key] = src  # (the most recently used last)
    return src


def executable(ctx, src: KernelSource) -> hal.Executable:
    """The loaded executable of `src` on ctx's device, loaded unless the context keeps it (EXECUTABLES_KEPT,
    the least recently used dropped first)."""
    cache = ctx.executables
    key = src.key
    exe = cache.pop(key, None)
    if exe is None:
        formats = (ctx.gpu_format, "numpy") if ctx.is_gpu else ("numpy",)
        exe = ctx.device.load_executable(src.specs(formats))
        while len(cache) >= EXECUTABLES_KEPT:
            del cache[next(iter(cache))]
    cache[key] = exe
    return exe


class ZeroedScratch(int):
    """A planner's scratch size (an entry of its "temps") whose buffer must hold zeros before the
    recording's first submission, and which its commands leave zero again (counters, as a split
    reduction's tickets). The recording owns it, so the zeros carry over from one submission to
    the next; see ``lowering/plan.py``."""

    __slots__ = ()


def checked_pair(op: str, dt, nconst: int, cuda, numpy_fn, threads: int = WORKGROUP) -> KernelSource:
    """The family of an op that reads flat element indices (gather, scatter_add), in two exports:
    ``{op}_{code}`` binds the output, the values and the indices, which it clamps (checked on the host);
    ``{op}_checked_{code}`` binds a fourth, the status word it sets for an index out of range (computed on
    the device). ``cuda(dt, name, checked)`` gives their C, ``numpy_fn(dt, checked)`` each one's numpy form."""
    key = (op, dt.name)
    name, checked = _pair_name(op, dt, False), _pair_name(op, dt, True)
    return source(key, lambda: KernelSource(
        key, [hal.Export(name, (threads, 1, 1), 3, nconst), hal.Export(checked, (threads, 1, 1), 4, nconst)],
        lambda: cuda(dt, name, checked), lambda: {name: numpy_fn(dt, False), checked: numpy_fn(dt, True)}))


def _pair_name(op: str, dt, checked: bool) -> str:
    return f"{op}_checked_{dt.code}" if checked else f"{op}_{dt.code}"


def checked_pair_dispatch(src: KernelSource, op: str, dt, checked: bool, n: int, constants: list,
                          workgroups: int | None = None) -> tuple:
    """A plan's dispatch of one of ``checked_pair``'s exports over `n` items (in ``workgroups``, by
    default a grid-stride loop's of WORKGROUP threads): the output, inputs 0 and 1, and the checked
    one's status word (input 2)."""
    roles = [("out",), ("in", 0), ("in", 1), ("in", 2)] if checked else [("out",), ("in", 0), ("in", 1)]
    count = grid_1d(n) if workgroups is None else workgroups
    return ("dispatch", src, _pair_name(op, dt, checked), (count, 1, 1), constants, roles)


def rows_of(node, layouts: list) -> tuple[int, int, int]:
    """(rows, n, offset) of a node computed along the rows of its one contiguous input: n the length of
    its last axis, offset where its elements start."""
    (shape, _, offset), = layouts
    n = shape[-1]
    return node.size // n, n, offset


#: A grid's workgroups at most (each kernel loops over the items past it).
MAX_WORKGROUPS = 65535 * 16


def grid_1d(n: int, threads: int = WORKGROUP) -> int:
    """Workgroups of ``threads`` for a grid-stride loop over n items."""
    return min((n + threads - 1) // threads, MAX_WORKGROUPS)


def row_chunks(n: int, rows: int, min_chunk: int, workgroups: int) -> tuple[int, int]:
    """(C, chunk): rows of n elements cut into C chunks of at least ``min_chunk`` elements, about
    ``workgroups`` chunks over all ``rows``; each chunk whole vectors of 4, so that every chunk of an
    aligned row starts aligned. (1, n) where a row stays whole."""
    C = min(-(-n // min_chunk), max(1, workgroups // max(rows, 1)))
    if C <= 1:
        return 1, n
    chunk = -(-n // C)
    chunk = -(-chunk // 4) * 4
    return -(-n // chunk), chunk


def u32(v: int) -> int:
    return v & 0xFFFFFFFF


def s32(v: int) -> int:
    return v - (1 << 32) if v >= (1 << 31) else v
