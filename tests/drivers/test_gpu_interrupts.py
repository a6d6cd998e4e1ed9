"""A KeyboardInterrupt landing anywhere in submission, host waits or retirement loses no work.

A Ctrl-C reaches the main thread wherever CPython runs signal handlers: at a function's entry
and as each call returns. Here it is injected on the test's thread by a profile function that
raises KeyboardInterrupt at the n-th such point of the HAL's own code, n drawn at random over
the whole operation: a prepared submit and its wait, a one-shot command buffer recorded and executed, a
barrier waiting on another semaphore, work parked on a value a host signal reaches, a graph
re-submitted with two tables in turn, a wait alone, a value read. An interrupted call may have
taken effect or not; what must hold afterwards, whatever happened:

- every value a submission that returned normally signals is reached, or its semaphore failed
  (then with the interrupt as the cause: interrupted issuing fails the work it could not issue);
- nothing stays outstanding, in flight or parked: ``wait_idle`` returns and every later wait does;
- nothing is printed as an exception a thread swallowed (a lost retirement, an empty deque);
- the device works on.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

import hal

from .fake_gpu import FakeGpuApi

HAL_DIR = str(Path(hal.__file__).resolve().parent)
#: Seconds a wait may take before the test calls the work lost.
PATIENCE = 20


class Interrupt:
    """Raises KeyboardInterrupt at the ``at``-th point of this thread's HAL code where CPython runs
    signal handlers, once; ``at=None`` only counts the points (``points``).

    Those points are a function's entry and the return of each call (the handler then runs as
    part of the call instruction, inside whatever ``try`` or ``with`` holds it). A profile
    function sees both: the entry of a HAL function, the return of any function a HAL frame
    called (Python or C); raising there unwinds from exactly those places. (Backward jumps,
    the other such point, follow a call in every loop of the code under test.) Finalizers are
    left alone: Python itself reports and drops an exception raised in one ("Exception
    ignored"), whatever the finalizer does."""

    def __init__(self, at: int | None) -> None:
        self.at = at
        self.points = 0
        self.fired = False

    def _profile(self, frame, event, arg):
        if event == "call":
            if not _is_hal(frame):
                return
        elif event == "return":
            if frame.f_back is None or not _is_hal(frame.f_back):
                return
        elif event == "c_return":
            if not _is_hal(frame):
                return
        else:
            return
        if _in_finalizer(frame):
            return
        self.points += 1
        if self.points == self.at:
            self.fired = True
            raise KeyboardInterrupt  # (a profile function that raises is removed: one interrupt)

    def __enter__(self) -> Interrupt:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def _is_hal(frame) -> bool:
    return frame.f_code.co_filename.startswith(HAL_DIR)


def _in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__" or frame.f_code.co_filename.endswith(("weakref.py", "_weakrefset.py")):
            return True
        frame = frame.f_back
    return False


def add_one(workgroups, bindings, constants):
    np.frombuffer(bindings[0], np.uint32, count=1)[:] += 1


EXPORTS = [hal.Export("add_one", (1, 1, 1), bindings=1)]


class Scenario:
    """The operations, on one device; ``promised`` holds the fences of submissions that returned."""

    def __init__(self, dev: hal.Device, rng: random.Random) -> None:
        self.dev = dev
        self.rng = rng
        self.exe = dev.load_executable(hal.ExecutableSpec("numpy", {"add_one": add_one}, EXPORTS))
        self.buf = dev.allocator.allocate(64)
        self.sems = [dev.create_semaphore(0) for _ in range(3)]
        #: The last value used per semaphore: every submission signals a new one.
        self.used = {id(sem): 0 for sem in self.sems}
        self.promised: list[tuple[hal.Semaphore, int]] = []
        #: The values parked work waits for: an interrupt may have kept the signal from being sent.
        self.gates: list[tuple[hal.Semaphore, int]] = []
        cb = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE)
        with cb.record():
            cb.dispatch(self.exe, 0, 1, [], [self.buf])
        self.prepared = dev.prepare([cb])
        tables = [[dev.allocator.allocate(64)] for _ in range(2)]
        graph = dev.create_command_buffer(hal.CommandBufferMode.REUSABLE, binding_capacity=1)
        with graph.record():
            graph.dispatch(self.exe, 0, 1, [], [hal.Slot(0)])
            graph.execution_barrier()
            graph.dispatch(self.exe, 0, 1, [], [hal.Slot(0)])
        self.tabled = [dev.prepare([graph], [table]) for table in tables]
        self.turn = 0
        self.operations = [self.prepared_round_trip, self.one_shot_round_trip, self.chained, self.parked,
                           self.tables_in_turn, self.wait_alone, self.value_read]

    def next_fence(self) -> tuple[hal.Semaphore, int]:
        sem = self.rng.choice(self.sems)
        self.used[id(sem)] += 1
        return sem, self.used[id(sem)]

    def submitted(self, fence) -> None:
        self.promised.append(fence)

    def prepared_round_trip(self) -> None:
        sem, value = fence = self.next_fence()
        self.prepared.submit(signal=[fence])
        self.submitted(fence)
        sem.wait(value, timeout=PATIENCE)

    def one_shot_round_trip(self) -> None:
        cb = self.dev.create_command_buffer()
        with cb.record():
            cb.dispatch(self.exe, 0, 1, [], [self.buf])
            cb.dispatch(self.exe, 0, 1, [], [self.buf])
        sem, value = fence = self.next_fence()
        self.dev.queue_execute([cb], signal=[fence])
        self.submitted(fence)
        sem.wait(value, timeout=PATIENCE)

    def chained(self) -> None:
        first = self.next_fence()
        self.prepared.submit(signal=[first])
        self.submitted(first)
        sem, value = second = self.next_fence()
        if second[0] is first[0]:
            self.dev.queue_barrier(wait=[first], signal=[second])  # (stream order covers the wait)
        else:
            self.prepared.submit(wait=[first], signal=[second])
        self.submitted(second)
        sem.wait(value, timeout=PATIENCE)

    def parked(self) -> None:
        gate, opening = self.next_fence()
        sem, value = fence = self.next_fence()
        if sem is gate:
            return
        self.gates.append((gate, opening))
        self.dev.queue_barrier(wait=[(gate, opening)], signal=[fence])  # parked until the signal below
        gate.signal(opening)
        self.submitted(fence)
        sem.wait(value, timeout=PATIENCE)

    def tables_in_turn(self) -> None:
        self.turn ^= 1
        sem, value = fence = self.next_fence()
        self.tabled[self.turn].submit(signal=[fence])
        self.submitted(fence)
        sem.wait(value, timeout=PATIENCE)

    def wait_alone(self) -> None:
        if self.promised:
            sem, value = self.rng.choice(self.promised[-8:])
            if sem.failure is None:
                sem.wait(value, timeout=PATIENCE)

    def value_read(self) -> None:
        for sem in self.sems:
            if sem.failure is None:
                sem.value  # noqa: B018 - retires what completed (retire_completed)

    def replace_failed(self) -> None:
        """A semaphore an interrupted issue failed carries the interrupt; later work uses a new one."""
        for i, sem in enumerate(self.sems):
            if sem.failure is not None:
                cause = sem.failure
                while isinstance(cause, hal.AbortedError) and cause.__cause__ is not None:
                    cause = cause.__cause__
                assert isinstance(cause, KeyboardInterrupt), f"a semaphore failed with {sem.failure!r}"
                self.sems[i] = fresh = self.dev.create_semaphore(0)
                self.used[id(fresh)] = 0


def check_nothing_lost(dev, scenario: Scenario) -> None:
    for sub in list(dev.completion.outstanding.values()):  # each is in flight or parked
        assert sub.retired or any(sub in q.inflight for q in dev.queues) or dev.pending.holds(sub), sub
    for gate, opening in scenario.gates:  # the host signals an interrupt kept from being sent
        if gate.failure is None and gate.current_value < opening:
            gate.signal(opening)
    dev.wait_idle(timeout=PATIENCE)
    assert not dev.completion.outstanding, "submissions stayed outstanding"
    assert not any(q.inflight for q in dev.queues), "submissions stayed in flight"
    assert len(dev.pending) == 0, "submissions stayed parked"
    for sem, value in scenario.promised:
        assert sem.failure is not None or sem.current_value >= value, f"value {value} was lost ({sem!r})"
    sem = dev.create_semaphore(0)  # the device works on
    scenario.prepared.submit(signal=[(sem, 1)])
    sem.wait(1, timeout=PATIENCE)


@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_interrupts_anywhere_lose_no_work(fake_driver, mode, capfd):
    rng = random.Random(f"interrupts-{mode}")
    with fake_driver.create_device(command_buffer=mode) as dev:
        scenario = Scenario(dev, rng)
        events = {}
        for operation in scenario.operations:  # how many events each has, uninterrupted
            with Interrupt(None) as count:
                operation()
            events[operation] = max(count.points, 1)
        interrupted = 0
        for _ in range(400):
            operation = rng.choice(scenario.operations)
            try:
                with Interrupt(rng.randint(1, events[operation])) as interrupt:
                    operation()
            except KeyboardInterrupt:
                assert interrupt.fired
                interrupted += 1
            except hal.AbortedError:
                pass  # waited on a semaphore an earlier interrupt failed
            scenario.replace_failed()
        assert interrupted > 300
        check_nothing_lost(dev, scenario)
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]


def test_an_interrupted_event_wait_leaves_the_work_to_the_next_waiter(fake_driver):
    """Ctrl-C while a host waiter blocks on the event: the work completes and is retired later."""
    with fake_driver.create_device(command_buffer="stream") as dev:
        api: FakeGpuApi = dev.api
        sem = dev.create_semaphore(0)
        synchronize = api.event_synchronize

        def interrupted(event):
            synchronize(event)  # the event completed, then the interrupt arrives
            raise KeyboardInterrupt

        api.event_synchronize = interrupted
        try:
            dev.queue_barrier(signal=[(sem, 1)])
            with pytest.raises(KeyboardInterrupt):
                sem.wait(1)
        finally:
            del api.event_synchronize
        assert len(dev.queues[0].inflight) == 1 and sem.current_value == 0
        sem.wait(1, timeout=PATIENCE)  # the next waiter retires it
        assert not dev.queues[0].inflight and not dev.completion.outstanding
