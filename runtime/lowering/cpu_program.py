"""One dispatch per recording on the CPU drivers: a numpy "program" executable.

A CPU driver runs a command buffer's commands one after another anyway, so
the kernels of a recording can run inside a single dispatch: the program
executable receives every slot of the binding table as a binding and calls
each kernel's numpy function on the views it needs, in the recorded
(topological) order. This skips the driver's per-dispatch work, the main
cost of small arrays on the CPU. The command buffer still binds only slots,
so graph-cache replays and rt.compile work unchanged. RUNTIME_CPU_PROGRAM=0
records every kernel as its own dispatch instead.

Replays are lean: a reusable command buffer hands the program the same list of
byte views while its binding table is unchanged (hal/drivers/local), so the
second run with one list binds every kernel to its views once (a kernel's
`prepare(workgroups, views, constants)` returns a callable with its numpy views
and `out=` arrays made, a C-level `functools.partial` for the common kernels)
and later runs call those in order. Floating-point warnings are ignored for the
whole run, set once through numpy's context variable (an `np.errstate` scope
costs ~70 bytecodes of Python, about a microsecond a run).
"""

from __future__ import annotations

import functools
import itertools
from collections import deque as _drain
from itertools import chain
from operator import call

import numpy as np

import hal
from hal import env

_ids = itertools.count(1)
_BUCKETS = tuple(range(8, 129, 8)) + (256, 512, 1024, 2048, 4096)  # bindings per program dispatch


try:  # numpy >= 2: the floating-point error state is a context variable holding an "extobj"
    from numpy._core._ufunc_config import _extobj_contextvar as _EXTOBJ
    from numpy._core._ufunc_config import _make_extobj
except ImportError:  # numpy 1.x: np.errstate
    _EXTOBJ = None
#: The caller's extobj -> the same with every floating-point error ignored (its buffer size and
#: error callback kept). A few entries: a new one only when the caller's state changes.
_IGNORING: dict = {}


def _ignoring(current):
    ignoring = _IGNORING.get(current)
    if ignoring is None:
        if len(_IGNORING) >= 16:
            _IGNORING.clear()
        ignoring = _IGNORING[current] = _make_extobj(all="ignore")  # (built on `current`)
    return ignoring


def enabled() -> bool:
    return env.switch("RUNTIME_CPU_PROGRAM", True)


def binding_bucket(n: int) -> int | None:
    for b in _BUCKETS:
        if n <= b:
            return b
    return None


class Program:
    """The kernels of one recording: (function, binding slots, constants, workgroups) in order."""

    __slots__ = ("steps", "pid", "seen", "bound", "calls")

    def __init__(self) -> None:
        self.steps: list = []
        self.pid = next(_ids)
        self.seen = None  # the views list of the latest run
        self.bound = None  # the views list `calls` are bound to
        self.calls: list = []

    def add_dispatch(self, fn, slots: tuple, constants: list, workgroups, offsets: dict | None = None) -> None:
        """A kernel's step; ``offsets``: byte offsets into some of its bindings, by binding index."""
        if offsets:
            fn = _at_offsets(fn, [offsets.get(i, 0) for i in range(len(slots))])
        self.steps.append((fn, slots, list(constants), workgroups))

    def add_fill(self, slot: int, nbytes: int, pattern: int, pattern_length: int) -> None:
        dtype = {1: np.uint8, 2: np.uint16, 4: np.uint32}[pattern_length]

        def fill(workgroups, views, constants):
            np.frombuffer(views[0], dtype=dtype, count=nbytes // pattern_length)[...] = pattern

        def prepare(workgroups, views, constants):
            return functools.partial(np.copyto, np.frombuffer(views[0], dtype=dtype, count=nbytes // pattern_length),
                                     dtype(pattern))

        fill.prepare = prepare
        self.steps.append((fill, (slot,), [], (1, 1, 1)))

    def run(self, views) -> None:
        if _EXTOBJ is None:
            with np.errstate(all="ignore"):
                self._run(views)
            return
        current = _EXTOBJ.get()
        ignoring = _IGNORING.get(current)  # (the usual case without a call)
        token = _EXTOBJ.set(ignoring if ignoring is not None else _ignoring(current))
        try:
            if views is self.bound:  # (the replay of a bound table, without the call of _run)
                _drain(map(call, self.calls), maxlen=0)
            else:
                self._run(views)
        finally:
            _EXTOBJ.reset(token)

    def _run(self, views) -> None:
        if views is not self.bound:
            if views is not self.seen:  # new views: run as they are (a one-off table pays no binding)
                self.seen = views
                for fn, slots, constants, workgroups in self.steps:
                    fn(workgroups, [views[s] for s in slots], constants)
                return
            self.calls = list(chain.from_iterable(_bind(step, views) for step in self.steps))
            self.bound = views
        _drain(map(call, self.calls), maxlen=0)  # the calls made by C, one after another


def _at_offsets(fn, offsets: list):
    """``fn`` given its bindings from byte ``offsets`` on."""
    def at(workgroups, views, constants):
        return fn(workgroups, [memoryview(v).cast("B")[o:] if o else v for v, o in zip(views, offsets)], constants)

    return at


def _bind(step, views) -> tuple:
    """One step as callables of no arguments bound to `views`, to be called in order (a prepared
    kernel may be several C-level calls: a mean is a sum, then a division)."""
    fn, slots, constants, workgroups = step
    mine = [views[s] for s in slots]
    prepare = getattr(fn, "prepare", None)
    call = prepare(workgroups, mine, constants) if prepare is not None else None
    if call is None:
        return (functools.partial(fn, workgroups, mine, list(constants)),)
    return call if type(call) is tuple else (call,)


def program_executable(ctx) -> hal.Executable:
    """The interpreter executable: one export per binding-count bucket, constant 0 = program id."""
    exe = ctx.executables.get("cpu-program")
    if exe is None:
        programs = ctx.programs

        def make(bucket):
            def interpret(workgroups, bindings, constants):
                programs[constants[0]].run(bindings)
            return interpret

        code = {f"program_{b}": make(b) for b in _BUCKETS}
        exports = [hal.Export(f"program_{b}", (1, 1, 1), b, 1) for b in _BUCKETS]
        exe = ctx.device.load_executable(hal.ExecutableSpec("numpy", code, exports))
        ctx.executables["cpu-program"] = exe
    return exe
