"""Tracing: hal.trace("out.json") and HAL_TRACE write a Chrome/Perfetto trace of real work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import hal
import runtime as rt
from hal import tracing

ROOT = Path(__file__).resolve().parent.parent


def spans(document: dict) -> list[dict]:
    return [e for e in document["traceEvents"] if e.get("ph") == "X"]


def check_well_formed(document: dict) -> None:
    """What Perfetto and chrome://tracing need of complete events: numbers, one process, named threads."""
    events = spans(document)
    assert events
    pid = events[0]["pid"]
    named = {e["tid"] for e in document["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"}
    for event in events:
        assert isinstance(event["ts"], float) and isinstance(event["dur"], float) and event["dur"] >= 0
        assert event["pid"] == pid and event["tid"] in named
        assert isinstance(event["name"], str) and isinstance(event["cat"], str)


def test_hal_spans_on_local_task(tmp_path):
    out = tmp_path / "hal.json"
    spec = hal.ExecutableSpec("numpy", lambda w, b, c: None, [hal.Export("noop", bindings=1)])
    with hal.trace(out) as path:
        assert path == out and tracing.ENABLED
        with hal.create_device("local-task") as dev:
            buf = dev.allocator.allocate(64)
            exe = dev.load_executable(spec)
            cb = dev.create_command_buffer()
            with cb.record():
                cb.fill_buffer(buf, pattern=1, pattern_length=4)
                cb.dispatch(exe, "noop", workgroups=(1, 1, 1), bindings=[buf])
            sem = dev.create_semaphore(0)
            dev.queue_execute([cb], signal=[(sem, 1)])
            dev.queue_barrier(wait=[(sem, 1)], signal=[(sem, 2)])
            sem.wait(2, timeout=10)
            later = dev.create_semaphore(0)
            threading.Timer(0.05, later.signal, args=(1,)).start()  # a wait that really blocks
            hal.wait_all([(sem, 2), (later, 1)], timeout=10)
            dev.wait_idle()
    assert not tracing.ENABLED
    document = json.loads(out.read_text())
    check_well_formed(document)
    names = [e["name"] for e in spans(document)]
    for expected in ("prepare_executable", "queue_execute", "queue_barrier", "semaphore.wait", "wait_all", "wait_idle"):
        assert expected in names, (expected, names)
    execute = next(e for e in spans(document) if e["name"] == "queue_execute")
    assert execute["cat"] == "hal" and execute["args"]["device"] == "local-task://0"
    assert execute["tid"] == threading.get_ident()


def test_runtime_spans_eval_record_and_replay(tmp_path):
    out = tmp_path / "runtime.json"
    x = rt.array(np.arange(16, dtype=np.float32), device="local-task")
    step = rt.compile(lambda a: (a * 2.0 + 1.0).sum())
    with hal.trace(out):
        for _ in range(2):
            y = (x * 3.0).sum()
            rt.eval(y)
            z = step(x)
        assert float(z) == float((np.arange(16) * 2 + 1).sum())
    names = [e["name"] for e in spans(json.loads(out.read_text()))]
    assert names.count("rt.eval") >= 2, names
    assert "rt.record" in names and "rt.replay" in names, names
    runtime_spans = [e for e in spans(json.loads(out.read_text())) if e["name"].startswith("rt.")]
    assert {e["cat"] for e in runtime_spans} == {"runtime"}


def test_no_trace_writes_nothing_and_one_trace_at_a_time(tmp_path):
    assert not tracing.ENABLED and tracing.stop() is None
    with hal.trace(tmp_path / "a.json"):
        with pytest.raises(hal.FailedPreconditionError, match="already being recorded"):
            with hal.trace(tmp_path / "b.json"):
                pass
    assert (tmp_path / "a.json").exists() and not (tmp_path / "b.json").exists()


def test_trace_is_written_when_the_block_raises(tmp_path):
    with pytest.raises(hal.InvalidArgumentError):
        with hal.trace(tmp_path / "t.json"):
            with hal.create_device("local-sync") as dev:
                dev.allocator.allocate(-1)
    assert not tracing.ENABLED
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


def test_hal_trace_environment_variable_traces_a_whole_example_run(tmp_path):
    out = tmp_path / "logistic.json"
    env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS")}
    env.update(PYTHONPATH=str(ROOT), HAL_TRACE=str(out))
    proc = subprocess.run(
        [
            sys.executable,
            "examples/logistic_regression.py",
            "--samples",
            "256",
            "--features",
            "8",
            "--steps",
            "5",
            "--device",
            "local-task",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    document = json.loads(out.read_text())
    check_well_formed(document)
    names = {e["name"] for e in spans(document)}
    assert {"rt.eval", "rt.record", "queue_execute", "semaphore.wait", "prepare_executable"} <= names, names
    # spans are on their thread's track: local-task runs submissions on its queue thread, or on the one waiting
    threads = {e["args"]["name"] for e in document["traceEvents"] if e.get("name") == "thread_name"}
    assert "MainThread" in threads


def test_spans_are_nvtx_ranges_when_nvtx_is_importable(tmp_path, monkeypatch):
    calls = []
    fake_nvtx = type(sys)("nvtx")
    fake_nvtx.push_range = lambda message, domain=None: calls.append(("push", message, domain))
    fake_nvtx.pop_range = lambda domain=None: calls.append(("pop", domain))
    monkeypatch.setitem(sys.modules, "nvtx", fake_nvtx)
    with hal.trace(tmp_path / "nvtx.json"):
        with hal.create_device("local-sync") as dev:
            sem = dev.create_semaphore(0)
            dev.queue_barrier(signal=[(sem, 1)])
            sem.wait(1)
    assert ("push", "queue_barrier", "hal") in calls
    assert [c[0] for c in calls].count("push") == [c[0] for c in calls].count("pop") > 0
    depth = 0
    for call in calls:  # every range is closed, innermost first
        depth += 1 if call[0] == "push" else -1
        assert depth >= 0


def test_events_stream_to_the_file_with_bounded_memory(tmp_path):
    out = tmp_path / "long.json"
    with hal.trace(out):
        recorder = tracing._recorder
        for i in range(5 * recorder.BATCH + 7):
            with tracing.span("work", n=i):
                pass
            assert len(recorder.pending) < recorder.BATCH  # never more than one batch in memory
        assert out.stat().st_size > 0 and recorder.written >= 5 * recorder.BATCH  # already on disk
    document = json.loads(out.read_text())
    check_well_formed(document)
    assert [e["args"]["n"] for e in spans(document)] == list(range(5 * recorder.BATCH + 7))


@pytest.mark.parametrize("bad", ["directory", "file as parent"])
def test_a_path_that_cannot_be_written_is_rejected_when_tracing_starts(tmp_path, bad):
    path = tmp_path if bad == "directory" else tmp_path / "a-file" / "trace.json"
    (tmp_path / "a-file").write_text("")
    with pytest.raises(hal.InvalidArgumentError, match="cannot write a trace to"):
        hal.trace(path).__enter__()
    assert not tracing.ENABLED and tracing._recorder is None
    with hal.trace(tmp_path / "good.json"):  # and the next trace starts normally
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "good.json"]  # no stray .tmp


def test_hal_trace_naming_a_directory_is_an_error_at_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS")}
    env.update(PYTHONPATH=str(ROOT), HAL_TRACE=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", "import hal"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert f"INVALID_ARGUMENT: HAL_TRACE={str(tmp_path)!r}: cannot write a trace to" in proc.stderr
    assert list(tmp_path.iterdir()) == []


TRACED_LOOP = """
import sys, time
import numpy as np
import runtime as rt
x = rt.array(np.arange(64, dtype=np.float32), device=sys.argv[1])
for i in range(20):
    rt.eval((x * float(i)).sum())
print("ready", flush=True)
while True:
    rt.eval((x + 1.0).sum())
    time.sleep(0.001)
"""


@pytest.mark.parametrize("device", ["local-task", "local-sync"])
@pytest.mark.parametrize(("signame", "exit_codes"), [("SIGTERM", (143,)), ("SIGINT", (1, -2, 130))])
def test_a_trace_is_completed_when_the_program_is_terminated(tmp_path, device, signame, exit_codes):
    import signal

    out = tmp_path / "killed.json"
    env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS")}
    env.update(PYTHONPATH=str(ROOT), HAL_TRACE=str(out))
    proc = subprocess.Popen([sys.executable, "-c", TRACED_LOOP, device], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(getattr(signal, signame))
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode in exit_codes, proc.stderr.read()
    document = json.loads(out.read_text())
    check_well_formed(document)
    assert "rt.eval" in {e["name"] for e in spans(document)}
