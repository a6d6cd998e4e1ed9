"""close() racing submissions, host signals and other closes.

The contract: a queue operation that runs concurrently with close() is either rejected with
FailedPreconditionError or accepted, and then each of its signals is reached or failed; nothing
accepted is silently dropped, nothing hangs, nothing crashes. Work parked on unreached waits fails
its semaphores at close, also when a host ``signal()`` races the close. Each test runs many
randomized interleavings (seeded, so a failure reproduces).
"""

from __future__ import annotations

import random
import threading
import time

import pytest

import hal

from .helpers import WAIT_TIMEOUT, allocate_with

ITERATIONS = 200
JOIN_TIMEOUT = 30.0


class Outcomes:
    """What each racing thread saw: accepted fences, typed rejections, and anything else (a bug)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.accepted: list[tuple[hal.Semaphore, int]] = []
        self.rejected = 0
        self.bugs: list[BaseException] = []

    def attempt(self, call, fence: tuple[hal.Semaphore, int] | None) -> None:
        try:
            call()
        except hal.FailedPreconditionError:
            with self.lock:
                self.rejected += 1
        except BaseException as exc:  # anything else is a contract violation
            with self.lock:
                self.bugs.append(exc)
        else:
            if fence is not None:
                with self.lock:
                    self.accepted.append(fence)


def _jitter(rng: random.Random) -> None:
    """A random short delay: none, a thread switch, or a few tens of microseconds of spinning."""
    choice = rng.random()
    if choice < 0.3:
        return
    if choice < 0.6:
        time.sleep(0)
        return
    end = time.perf_counter() + rng.random() * 50e-6
    while time.perf_counter() < end:
        pass


def _run_threads(targets) -> None:
    threads = [threading.Thread(target=t, daemon=True) for t in targets]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t for t in threads if t.is_alive()]
    assert not hung, f"{len(hung)} racing threads still blocked after {JOIN_TIMEOUT} s (a hang)"


def _assert_settled(outcomes: Outcomes) -> None:
    assert not outcomes.bugs, f"untyped or unexpected errors: {outcomes.bugs[:3]!r}"
    for sem, value in outcomes.accepted:
        # After close() a wait never blocks: it returns (reached), or raises AbortedError (failed).
        assert sem.failure is not None or sem.current_value >= value, (
            f"accepted work signalling {value} was dropped: the semaphore is at {sem.current_value} and not failed")
        if sem.failure is None:
            sem.wait(value, timeout=WAIT_TIMEOUT)
        else:
            with pytest.raises(hal.AbortedError):
                sem.wait(value, timeout=WAIT_TIMEOUT)


def _submitter(dev: hal.Device, rng: random.Random, outcomes: Outcomes, gate: hal.Semaphore,
               buf: hal.Buffer, count: int):
    def run() -> None:
        for _ in range(count):
            _jitter(rng)
            sem = None
            try:
                sem = dev.create_semaphore(0)
            except hal.FailedPreconditionError:
                outcomes.rejected += 1
                continue
            except BaseException as exc:
                outcomes.bugs.append(exc)
                continue
            waits = [(gate, 1)] if rng.random() < 0.4 else []
            kind = rng.choice(["execute", "barrier", "alloca"])
            if kind == "execute":
                def call(sem=sem, waits=waits) -> None:
                    cb = dev.create_command_buffer()
                    with cb.record():
                        cb.fill_buffer(buf, 0x5A, 1)
                    dev.queue_execute([cb], wait=waits, signal=[(sem, 1)])
            elif kind == "barrier":
                def call(sem=sem, waits=waits) -> None:
                    dev.queue_barrier(wait=waits, signal=[(sem, 1)])
            else:
                def call(sem=sem, waits=waits) -> None:
                    dev.queue_alloca(64, wait=waits, signal=[(sem, 1)])
            outcomes.attempt(call, (sem, 1))
    return run


def test_close_races_submissions_and_host_signals(make_device):
    """Submitters, a host signaller and close() interleaved at random; every accepted
    submission settles, every rejection is a FailedPreconditionError."""
    total_accepted = total_rejected = 0
    for iteration in range(ITERATIONS):
        rng = random.Random(iteration)
        dev = make_device()
        gate = dev.create_semaphore(0)
        buf = allocate_with(dev, bytes(64))
        outcomes = Outcomes()
        signaller_rng = random.Random(rng.random())
        closer_rng = random.Random(rng.random())

        def signal_gate(rng=signaller_rng, gate=gate, outcomes=outcomes) -> None:
            _jitter(rng)
            outcomes.attempt(lambda: gate.signal(1), None)

        def close(rng=closer_rng, dev=dev, outcomes=outcomes) -> None:
            _jitter(rng)
            outcomes.attempt(dev.close, None)

        submitters = [_submitter(dev, random.Random(rng.random()), outcomes, gate, buf, 3) for _ in range(2)]
        _run_threads([*submitters, signal_gate, close])
        assert dev.closed
        _assert_settled(outcomes)
        total_accepted += len(outcomes.accepted)
        total_rejected += outcomes.rejected
    # The interleavings covered both sides of the race.
    assert total_accepted > 0 and total_rejected > 0, (total_accepted, total_rejected)


def test_parked_work_fails_when_a_host_signal_races_close(make_device):
    """Work parked on a wait that a host signal() reaches while close() runs: it either ran
    (its signal reached) or failed, and the signal() either succeeded or was refused."""
    ran = failed = 0
    for iteration in range(ITERATIONS):
        rng = random.Random(1000 + iteration)
        dev = make_device()
        gate, done = dev.create_semaphore(0), dev.create_semaphore(0)
        buf = allocate_with(dev, bytes(16))
        cb = dev.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buf, 0x11, 1)
        dev.queue_execute([cb], wait=[(gate, 1)], signal=[(done, 1)])
        outcomes = Outcomes()
        first, second = random.Random(rng.random()), random.Random(rng.random())

        def signal_gate(rng=first, gate=gate, outcomes=outcomes) -> None:
            _jitter(rng)
            outcomes.attempt(lambda: gate.signal(1), None)

        def close(rng=second, dev=dev, outcomes=outcomes) -> None:
            _jitter(rng)
            outcomes.attempt(dev.close, None)

        _run_threads([signal_gate, close])
        outcomes.accepted.append((done, 1))
        _assert_settled(outcomes)
        if done.failure is None:
            ran += 1
        else:
            failed += 1
            assert isinstance(done.failure, hal.HalError)
    assert ran + failed == ITERATIONS


def test_concurrent_closes_all_return(make_device):
    for iteration in range(ITERATIONS // 4):
        rng = random.Random(2000 + iteration)
        dev = make_device()
        sem = dev.create_semaphore(0)
        dev.queue_barrier(wait=[(sem, 1)], signal=[(sem, 2)])  # parked: close must fail it
        outcomes = Outcomes()
        rngs = [random.Random(rng.random()) for _ in range(4)]

        def close(rng, dev=dev, outcomes=outcomes) -> None:
            _jitter(rng)
            outcomes.attempt(dev.close, None)

        _run_threads([lambda r=r: close(r) for r in rngs])
        assert not outcomes.bugs and outcomes.rejected == 0, outcomes.bugs
        assert dev.closed
        with pytest.raises(hal.AbortedError):
            sem.wait(2)


def test_one_shot_submitted_while_closing_runs_at_most_once(make_device, kernels):
    """A one-shot command buffer raced by submitters and close(): at most one submission is accepted."""
    for iteration in range(ITERATIONS // 4):
        rng = random.Random(3000 + iteration)
        dev = make_device()
        buf = allocate_with(dev, bytes(16))
        cb = dev.create_command_buffer()
        with cb.record():
            cb.fill_buffer(buf, 0x22, 1)
        outcomes = Outcomes()
        sems = [dev.create_semaphore(0) for _ in range(3)]
        rngs = [random.Random(rng.random()) for _ in range(4)]

        def submit(rng, sem, dev=dev, cb=cb, outcomes=outcomes) -> None:
            _jitter(rng)
            outcomes.attempt(lambda: dev.queue_execute([cb], signal=[(sem, 1)]), (sem, 1))

        def close(rng=rngs[3], dev=dev, outcomes=outcomes) -> None:
            _jitter(rng)
            outcomes.attempt(dev.close, None)

        _run_threads([*(lambda r=r, s=s: submit(r, s) for r, s in zip(rngs, sems)), close])
        _assert_settled(outcomes)
        assert len(outcomes.accepted) <= 1


QUEUE_CALLS_AFTER_CLOSE = {
    "queue_execute": lambda dev, cb, sem: dev.queue_execute([cb], signal=[(sem, 1)]),
    "queue_barrier": lambda dev, cb, sem: dev.queue_barrier(signal=[(sem, 1)]),
    "queue_alloca": lambda dev, cb, sem: dev.queue_alloca(64, signal=[(sem, 1)]),
    "begin_recording": lambda dev, cb, sem: dev.create_command_buffer().begin(),
    "semaphore_signal": lambda dev, cb, sem: sem.signal(1),
    "semaphore_fail": lambda dev, cb, sem: sem.fail("after close"),
    "semaphore_wait_unreached": lambda dev, cb, sem: sem.wait(1, timeout=WAIT_TIMEOUT),
}


@pytest.mark.parametrize("call", list(QUEUE_CALLS_AFTER_CLOSE))
def test_objects_made_before_close_refuse_use_after_it(make_device, call):
    dev = make_device()
    sem = dev.create_semaphore(0)
    buf = allocate_with(dev, bytes(16))
    cb = dev.create_command_buffer()
    with cb.record():
        cb.fill_buffer(buf, 1, 1)
    dev.close()
    with pytest.raises(hal.FailedPreconditionError) as info:
        QUEUE_CALLS_AFTER_CLOSE[call](dev, cb, sem)
    assert "closed" in str(info.value)
    assert sem.current_value == 0 and sem.failure is None


def test_reached_values_stay_readable_after_close(make_device):
    dev = make_device()
    sem = dev.create_semaphore(0)
    dev.queue_barrier(signal=[(sem, 3)])
    sem.wait(3, timeout=WAIT_TIMEOUT)
    dev.close()
    sem.wait(3)  # reached before close: returns at once
    assert sem.value == 3


def test_host_signal_after_close_cannot_release_parked_work(make_device):
    dev = make_device()
    gate, done = dev.create_semaphore(0), dev.create_semaphore(0)
    buf = allocate_with(dev, bytes(16))
    cb = dev.create_command_buffer()
    with cb.record():
        cb.fill_buffer(buf, 0x33, 1)
    dev.queue_execute([cb], wait=[(gate, 1)], signal=[(done, 1)])
    dev.close()
    with pytest.raises(hal.FailedPreconditionError):
        gate.signal(1)
    with pytest.raises(hal.AbortedError) as info:
        done.wait(1)
    assert "closed" in str(info.value)
