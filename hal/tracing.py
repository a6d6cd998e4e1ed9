"""Chrome / Perfetto traces of what the HAL and runtime do: ``with hal.trace("out.json"):``, ``HAL_TRACE=out.json``.

The file is the Trace Event Format (JSON) that ui.perfetto.dev and chrome://tracing open: one
complete event ("ph": "X") per host span (queue operations, waits, executable preparation, the
runtime's eval, record and replay), on the thread that ran it, and on GPU drivers one span per
submission on a "device" track, timed with events recorded only while tracing. On ``cuda`` the same
host spans are NVTX ranges when the ``nvtx`` package is importable, so Nsight Systems shows them too.

Zero cost when off: every hook site is guarded by one module-level check, ``if tracing.ENABLED:``,
and nothing else of this module runs.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hal import env

#: The one check hook sites make. True only while a trace is being recorded.
ENABLED = False

_T = TypeVar("_T")
_lock = threading.Lock()
_recorder: _Recorder | None = None


class _Recorder:
    """Events of one trace, kept in memory and written as JSON when the trace ends."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pid = os.getpid()
        self.events: list[dict[str, Any]] = []
        self.threads: dict[int, str] = {}
        self.tracks: dict[str, int] = {}
        self.nvtx = _nvtx_module()

    def thread_id(self) -> int:
        ident = threading.get_ident()
        if ident not in self.threads:
            self.threads[ident] = threading.current_thread().name
        return ident

    def track(self, name: str) -> int:
        """A named timeline of its own (a device queue), shown as a thread in the viewer."""
        with _lock:
            if name not in self.tracks:
                self.tracks[name] = -(len(self.tracks) + 1)  # negative: never a real thread id
            return self.tracks[name]

    def add(self, event: dict[str, Any]) -> None:
        self.events.append(event)  # list.append is atomic under the GIL

    def document(self) -> dict[str, Any]:
        names = {**self.threads, **{tid: name for name, tid in self.tracks.items()}}
        metadata = [
            {"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "args": {"name": name}}
            for tid, name in names.items()
        ]
        metadata.append({"ph": "M", "name": "process_name", "pid": self.pid, "args": {"name": "hal"}})
        return {"traceEvents": metadata + self.events, "displayTimeUnit": "ns", "otherData": {"producer": "hal.trace"}}

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.document()))
        os.replace(tmp, self.path)


def _nvtx_module() -> Any:
    try:
        import nvtx  # type: ignore[import-not-found]
    except ImportError:
        return None
    return nvtx


def session() -> int:
    """An id of the trace being recorded (0: none); anchors of device clocks are kept per session."""
    recorder = _recorder
    return 0 if recorder is None else id(recorder)


def now_us() -> float:
    """The trace clock (perf_counter, microseconds), shared by host spans and device spans."""
    return time.perf_counter_ns() / 1000.0


def start(path: str | os.PathLike[str]) -> None:
    """Start recording a trace to ``path`` (written by ``stop()``); one trace at a time."""
    global ENABLED, _recorder
    with _lock:
        if _recorder is not None:
            from hal.errors import FailedPreconditionError

            raise FailedPreconditionError(f"a trace to {_recorder.path} is already being recorded")
        _recorder = _Recorder(Path(path))
        ENABLED = True


def stop() -> Path | None:
    """Stop recording and write the trace file; returns its path (None when no trace was on)."""
    global ENABLED, _recorder
    with _lock:
        recorder, _recorder = _recorder, None
        ENABLED = False
    if recorder is None:
        return None
    recorder.write()
    return recorder.path


@contextlib.contextmanager
def trace(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Record a Chrome/Perfetto trace of everything the HAL and runtime do inside the block."""
    start(path)
    try:
        yield Path(path)
    finally:
        stop()


@contextlib.contextmanager
def span(name: str, category: str = "hal", **args: Any) -> Iterator[None]:
    """A host span on the calling thread (a no-op when no trace is on)."""
    recorder = _recorder
    if recorder is None:
        yield
        return
    nvtx = recorder.nvtx
    if nvtx is not None:
        nvtx.push_range(name, domain="hal")
    begin = now_us()
    try:
        yield
    finally:
        end = now_us()
        if nvtx is not None:
            nvtx.pop_range(domain="hal")
        event = {
            "name": name,
            "cat": category,
            "ph": "X",
            "ts": begin,
            "dur": end - begin,
            "pid": recorder.pid,
            "tid": recorder.thread_id(),
        }
        if args:
            event["args"] = args
        recorder.add(event)


def call(name: str, function: Callable[..., _T], *args: Any, category: str = "hal", **detail: Any) -> _T:
    """``function(*args)`` inside a host span: what a guarded hook site calls when tracing."""
    with span(name, category, **detail):
        return function(*args)


def traced(name: str, category: str = "hal") -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Decorate a function that is off the hot path (recording, compiling) with a host span.

    The wrapper costs one call and one check when no trace is on; hot paths guard inline instead.
    """

    def decorate(function: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> _T:
            if not ENABLED:
                return function(*args, **kwargs)
            with span(name, category):
                return function(*args, **kwargs)

        return wrapper

    return decorate


def device_span(track: str, name: str, begin_us: float, end_us: float, **args: Any) -> None:
    """A span measured on a device (GPU time mapped onto the trace clock), on its own named track."""
    recorder = _recorder
    if recorder is None:
        return
    event = {
        "name": name,
        "cat": "device",
        "ph": "X",
        "ts": begin_us,
        "dur": max(end_us - begin_us, 0.0),
        "pid": recorder.pid,
        "tid": recorder.track(track),
    }
    if args:
        event["args"] = args
    recorder.add(event)


def _start_from_environment() -> None:
    """``HAL_TRACE=out.json``: trace the whole run, written at interpreter exit."""
    path = env.text("HAL_TRACE")
    if path is None or env.is_off(path):
        return
    start(path)
    atexit.register(stop)


_start_from_environment()
