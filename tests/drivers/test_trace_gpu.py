"""GPU device spans in traces, over the simulated GPU API: one span per submission, timed with events
recorded only while tracing, on the host clock."""

from __future__ import annotations

import json

import hal
from hal import tracing


def fill_and_copy(dev: hal.Device, mode: hal.CommandBufferMode) -> hal.CommandBuffer:
    src, dst = dev.allocator.allocate(1024), dev.allocator.allocate(1024)
    cb = dev.create_command_buffer(mode)
    with cb.record():
        cb.fill_buffer(src, pattern=0x01020304, pattern_length=4)
        cb.execution_barrier()
        cb.copy_buffer(src, dst)
    return cb


def count_timing_events(api) -> list[int]:
    created = [0]
    original = api.timing_event_create

    def counting():
        created[0] += 1
        return original()

    api.timing_event_create = counting
    return created


def test_one_device_span_per_submission(fake_driver, tmp_path):
    out = tmp_path / "gpu.json"
    with fake_driver.create_device(command_buffer="graph") as dev:
        created = count_timing_events(dev.api)
        sem = dev.create_semaphore(0)
        untraced = fill_and_copy(dev, hal.CommandBufferMode.REUSABLE)
        dev.queue_execute([untraced], signal=[(sem, 1)])
        sem.wait(1, timeout=30)
        assert created[0] == 0, "no timing events without a trace"
        with hal.trace(out):
            reusable = fill_and_copy(dev, hal.CommandBufferMode.REUSABLE)
            for value in (2, 3, 4):
                dev.queue_execute([reusable], signal=[(sem, value)])
            dev.queue_barrier(signal=[(sem, 5)])
            sem.wait(5, timeout=30)
            dev.wait_idle(timeout=30)
        assert created[0] == 1 + 2 * 4  # one anchor, then a start and an end per submission
    events = json.loads(out.read_text())["traceEvents"]
    device = [e for e in events if e.get("cat") == "device"]
    assert [e["name"] for e in device] == ["submission (1 command buffers)"] * 3 + ["barrier"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name" and e["tid"] == device[0]["tid"]}
    assert tracks == {f"{dev.info.uri} queue 0 (device)"}
    host = {e["name"]: e for e in events if e.get("cat") == "hal"}
    first_submit = min(e["ts"] for e in events if e.get("name") == "queue_execute")
    last_host = max(e["ts"] + e["dur"] for e in events if e.get("cat") == "hal")
    # Device time maps onto the host clock through an anchor event read right after it synchronised:
    # the read can come late on a loaded machine (the waiting thread has to be scheduled), which
    # shifts every device span later by as much. The slack allows for that, not for a wrong mapping.
    slack_us = 25_000.0
    for span in device:
        assert span["dur"] >= 0
        assert first_submit <= span["ts"] and span["ts"] + span["dur"] <= last_host + slack_us
    assert "semaphore.wait" in host and "wait_idle" in host
    assert [e["args"]["seq"] for e in device] == sorted(e["args"]["seq"] for e in device)
    assert not tracing.ENABLED
