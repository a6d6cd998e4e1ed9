"""Per-opcode tracing for the benchmarks' bytecode counts.

Python 3.12 reports no opcode events during a process's first tracing session when the tracer
turns them on from its call event (``frame.f_trace_opcodes = True``): the counts of whatever is
measured first read zero. One short session before any count avoids it (``prime``).
"""

from __future__ import annotations

import sys

_primed = False


def prime() -> None:
    """Run one throwaway opcode-tracing session (once a process)."""
    global _primed
    if _primed:
        return
    _primed = True

    def tracer(frame, event, arg):
        frame.f_trace_opcodes = True
        return tracer

    sys.settrace(tracer)
    try:
        (lambda: None)()
    finally:
        sys.settrace(None)
