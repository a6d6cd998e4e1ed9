"""Run a function in a forked child and get back what it returned (or the repr of what it raised)."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

import pytest

needs_fork = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                                reason="os.fork is unavailable (or unsafe) on this platform")


def in_forked_child(fn: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    """``fn()`` run in a child forked from this process; its result must pickle. An exception in the
    child comes back as ``("raised", type name, message)``; a child that does not answer within
    ``timeout_s`` is killed and the test fails."""
    import select
    import signal

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer, then leave at once (no atexit, no pytest teardown)
        os.close(read_end)
        try:
            try:
                answer: Any = ("returned", fn())
            except BaseException as exc:  # noqa: BLE001 (reported to the parent)
                answer = ("raised", type(exc).__name__, str(exc))
            os.write(write_end, pickle.dumps(answer))
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], timeout_s)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the forked child did not answer within {timeout_s} s")
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    answer = pickle.loads(b"".join(chunks))
    return answer[1] if answer[0] == "returned" else answer
