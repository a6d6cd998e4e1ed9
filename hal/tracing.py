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
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hal import env

#: The one check hook sites make. True only while a trace is being recorded.
ENABLED = False

_T = TypeVar("_T")
_log = logging.getLogger(__name__)
_lock = threading.Lock()
_recorder: _Recorder | None = None


class _Recorder:
    """Events of one trace, streamed to its file as they come.

    The file is open from the start (a path that cannot be written is rejected then, not at exit) and
    receives the events in batches of ``BATCH``, so memory stays bounded however long the run; the
    thread names and the closing brackets are written by ``close()``. Its keys come before
    ``traceEvents`` so that the array can stay open while events arrive.
    """

    BATCH = 512

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - open for the trace's lifetime
        except OSError as exc:
            from hal.errors import InvalidArgumentError

            raise InvalidArgumentError(f"cannot write a trace to {str(path)!r}: {exc.strerror or exc}") from None
        self.file.write('{"displayTimeUnit": "ns", "otherData": {"producer": "hal.trace"}, "traceEvents": [\n')
        self.pid = os.getpid()
        self.pending: list[dict[str, Any]] = []
        self.written = 0
        self.lock = threading.Lock()
        self.threads: dict[int, str] = {}
        self.tracks: dict[str, int] = {}
        self.nvtx = _nvtx_module()
        self.sigterm_handler_installed = False

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
        with self.lock:
            self.pending.append(event)
            if len(self.pending) >= self.BATCH:
                self._write_pending()

    def _write_pending(self) -> None:
        """Append the pending events to the file (the caller holds ``lock``)."""
        events, self.pending = self.pending, []
        if not events or self.file.closed:
            return
        text = ",\n".join(json.dumps(event) for event in events)
        try:
            self.file.write(text if not self.written else ",\n" + text)
            self.file.flush()
        except OSError as exc:  # a full disk: the trace ends here, the program goes on
            _log.warning("trace %s: cannot write events, tracing stops here: %s", self.path, exc)
            self.file.close()
            return
        self.written += len(events)

    def close(self) -> None:
        """Write what is pending, the thread names and the closing brackets: the file is complete JSON."""
        names = {**self.threads, **{tid: name for name, tid in self.tracks.items()}}
        with self.lock:
            self.pending += [{"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "args": {"name": name}}
                             for tid, name in names.items()]
            self.pending.append({"ph": "M", "name": "process_name", "pid": self.pid, "args": {"name": "hal"}})
            self._write_pending()
            if self.file.closed:
                return
            try:
                self.file.write("\n]}\n")
                self.file.close()
            except OSError as exc:
                _log.warning("trace %s: cannot finish the file: %s", self.path, exc)


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
    """Start recording a trace to ``path``, streamed to it until ``stop()``; one trace at a time.

    InvalidArgumentError if ``path`` cannot be written (a directory, a missing permission). While a trace
    is on, SIGTERM (when the program has no handler of its own) ends the program as ``sys.exit(143)``
    does, so the trace is completed on the way out, as it is on SIGINT's KeyboardInterrupt.
    """
    global ENABLED, _recorder
    with _lock:
        if _recorder is not None:
            from hal.errors import FailedPreconditionError

            raise FailedPreconditionError(f"a trace to {_recorder.path} is already being recorded")
        recorder = _Recorder(Path(path))
        recorder.sigterm_handler_installed = _install_sigterm_handler()
        _recorder = recorder
        ENABLED = True


def stop() -> Path | None:
    """Stop recording and complete the trace file; returns its path (None when no trace was on)."""
    global ENABLED, _recorder
    with _lock:
        recorder, _recorder = _recorder, None
        ENABLED = False
    if recorder is None:
        return None
    if recorder.sigterm_handler_installed and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    recorder.close()
    return recorder.path


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # Unwinds the main thread as sys.exit does: finally blocks, then atexit (HAL_TRACE's stop()).
    raise SystemExit(128 + signum)


def _install_sigterm_handler() -> bool:
    """SIGTERM's default kills the process with no clean-up: while tracing, exit through Python instead."""
    if threading.current_thread() is not threading.main_thread():
        return False  # only the main thread may set handlers
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False  # the program handles SIGTERM itself
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return True


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
    """``HAL_TRACE=out.json``: trace the whole run, completed at interpreter exit (SIGTERM and SIGINT too)."""
    path = env.text("HAL_TRACE")
    if path is None or env.is_off(path):
        return
    try:
        start(path)
    except Exception as exc:
        from hal.errors import HalError

        if isinstance(exc, HalError):
            raise HalError(exc.code, f"HAL_TRACE={path!r}: {exc.message}") from None
        raise
    atexit.register(stop)


_start_from_environment()
