"""Device spans of traced submissions: GPU time of each submission, on the trace's clock.

Only while a trace is recorded (``hal.tracing.ENABLED``): ``begin`` records a timing event on the
queue's stream before a submission's commands, ``end`` one after them, and the span is emitted when
the submission retires (both events have completed by then). Timing events are separate from the
pool of untimed events the queue uses otherwise, so a run without a trace records none.

Device time is mapped onto the host clock by one anchor per queue and trace: a timing event
recorded and synchronised once, read against the host clock right after.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from hal import tracing
from hal.errors import HalError

if TYPE_CHECKING:
    from hal.drivers.gpu.queue import GpuQueue
    from hal.drivers.gpu.submission import Submission

#: queue -> (trace session, anchor event, host time of the anchor in µs)
_anchors: weakref.WeakKeyDictionary[GpuQueue, tuple[int, Any, float]] = weakref.WeakKeyDictionary()


def _anchor(queue: GpuQueue) -> tuple[Any, float]:
    session = tracing.session()
    known = _anchors.get(queue)
    if known is not None and known[0] == session:
        return known[1], known[2]
    api = queue.api
    event = api.timing_event_create()
    api.event_record(event, queue.stream)
    api.event_synchronize(event)
    host = tracing.now_us()
    _anchors[queue] = (session, event, host)
    return event, host


def begin(queue: GpuQueue) -> Any:
    """Called with the queue's lock held, before the submission's commands are issued."""
    anchor, host = _anchor(queue)
    start = queue.api.timing_event_create()
    queue.api.event_record(start, queue.stream)
    return start, anchor, host


def end(queue: GpuQueue, sub: Submission, started: Any) -> None:
    """Called after the commands: the span is emitted when ``sub`` retires."""
    api = queue.api
    start, anchor, host = started
    stop = api.timing_event_create()
    api.event_record(stop, queue.stream)
    track = f"{queue.context.uri} queue {queue.index} (device)"
    name = f"submission ({len(sub.command_buffers)} command buffers)" if sub.command_buffers else "barrier"

    def emit() -> None:
        try:
            begin_us = host + api.event_elapsed_ms(anchor, start) * 1000.0
            end_us = host + api.event_elapsed_ms(anchor, stop) * 1000.0
        except HalError:
            return  # the work failed: no device time to show
        finally:
            api.event_destroy(start)
            api.event_destroy(stop)
        tracing.device_span(track, name, begin_us, end_us, seq=sub.seq)

    sub.hold(emit)
