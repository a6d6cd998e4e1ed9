"""What the core checks at submission, on every driver: one-shot command buffers run at most once
(also when threads race), directly referenced buffers are live, binding tables are checked as a
whole against every command that uses them, and objects of a closed device refuse use."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import hal

from .helpers import MAPPABLE, WAIT_TIMEOUT, allocate_with, random_bytes, read_u32, record, submit_and_wait

Mode = hal.CommandBufferMode
Slot = hal.Slot
ORIGINAL = random_bytes(64, seed=12)


def _add_one(kernels, cb, ref, n=16):
    cb.dispatch(kernels, "cts_add_one", workgroups=1, constants=[n], bindings=[ref])


# -- one-shot command buffers under threads ---------------------------------------------------------

@pytest.mark.parametrize("threads", [2, 8])
def test_one_shot_runs_at_most_once_when_threads_submit_it_together(device, kernels, threads):
    for _ in range(20):
        _race_one_shot(device, kernels, threads)


def _race_one_shot(device, kernels, threads):
    buf = allocate_with(device, bytes(64))
    cb = record(device, lambda cb: _add_one(kernels, cb, buf))
    sems = [device.create_semaphore(0) for _ in range(threads)]
    start = threading.Barrier(threads)
    accepted, rejected, bugs = [], [], []

    def submit(sem: hal.Semaphore) -> None:
        start.wait()
        try:
            device.queue_execute([cb], signal=[(sem, 1)])
        except hal.FailedPreconditionError:
            rejected.append(sem)
        except BaseException as exc:
            bugs.append(exc)
        else:
            accepted.append(sem)

    workers = [threading.Thread(target=submit, args=(s,)) for s in sems]
    for w in workers:
        w.start()
    for w in workers:
        w.join(WAIT_TIMEOUT)
    assert not bugs, bugs
    assert len(accepted) == 1 and len(rejected) == threads - 1
    accepted[0].wait(1, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf)[:16], np.ones(16, np.uint32))
    for sem in rejected:
        assert sem.current_value == 0 and sem.failure is None
    buf.release()


def test_reusable_submitted_by_racing_threads_runs_every_time(device, kernels):
    buf = allocate_with(device, bytes(64))
    cb = record(device, lambda cb: _add_one(kernels, cb, buf), mode=Mode.REUSABLE)
    threads, each = 4, 10
    sem = device.create_semaphore(0)
    lock = threading.Lock()
    counter = [0]
    start = threading.Barrier(threads)

    def submit() -> None:
        start.wait()
        for _ in range(each):
            with lock:  # values must increase in submission order on the one semaphore
                counter[0] += 1
                device.queue_execute([cb], signal=[(sem, counter[0])])

    workers = [threading.Thread(target=submit) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(WAIT_TIMEOUT)
    sem.wait(threads * each, timeout=WAIT_TIMEOUT)
    np.testing.assert_array_equal(read_u32(device, buf)[:16], np.full(16, threads * each, np.uint32))


# -- released buffers referenced directly by reusable command buffers -----------------------------------

def _direct_commands(kernels):
    """Recordings that reference a buffer (or a view of it) directly, by the command using it."""
    return {
        "fill": lambda cb, victim, other: cb.fill_buffer(victim, 0x7, 1),
        "update": lambda cb, victim, other: cb.update_buffer(b"\x01" * 16, (victim, 0, 16)),
        "copy-source": lambda cb, victim, other: cb.copy_buffer((victim, 0, 16), (other, 0, 16)),
        "copy-target": lambda cb, victim, other: cb.copy_buffer((other, 0, 16), (victim, 0, 16)),
        "dispatch": lambda cb, victim, other: _add_one(kernels, cb, victim, 4),
    }


@pytest.mark.parametrize("released", ["root", "view"])
@pytest.mark.parametrize("command", ["fill", "update", "copy-source", "copy-target", "dispatch"])
def test_reusable_referencing_a_released_buffer_is_rejected(device, kernels, command, released):
    root = device.allocator.allocate(64)
    device.write(root, ORIGINAL)
    victim = root if released == "root" else root.subspan(0, 32)
    other = allocate_with(device, ORIGINAL)
    body = _direct_commands(kernels)[command]
    cb = record(device, lambda cb: body(cb, victim, other), mode=Mode.REUSABLE)
    submit_and_wait(device, [cb])  # runs while the buffer is live
    device.write(other, ORIGINAL)
    victim.release()
    sem = device.create_semaphore(0)
    with pytest.raises(hal.FailedPreconditionError) as info:
        device.queue_execute([cb], signal=[(sem, 1)])
    assert "released" in str(info.value)
    assert sem.current_value == 0 and sem.failure is None
    assert device.read(other) == ORIGINAL
    if released == "view":
        root.release()
    other.release()


def test_releasing_an_unrelated_buffer_keeps_a_reusable_submittable(device, kernels):
    buf = allocate_with(device, bytes(64))
    cb = record(device, lambda cb: _add_one(kernels, cb, buf), mode=Mode.REUSABLE)
    submit_and_wait(device, [cb])
    device.allocator.allocate(32).release()
    submit_and_wait(device, [cb])
    np.testing.assert_array_equal(read_u32(device, buf)[:16], np.full(16, 2, np.uint32))


def test_table_entry_released_between_identical_submissions_is_rejected(device, kernels):
    buf = allocate_with(device, bytes(64))
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=Mode.REUSABLE, binding_capacity=1)
    submit_and_wait(device, [cb], binding_tables=[[buf]])
    submit_and_wait(device, [cb], binding_tables=[[buf]])
    buf.release()
    with pytest.raises(hal.FailedPreconditionError):
        device.queue_execute([cb], binding_tables=[[buf]])


def test_table_mutated_in_place_is_checked_again(device, kernels):
    good, short = allocate_with(device, bytes(64)), allocate_with(device, bytes(8))
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0, 0, 64)), mode=Mode.REUSABLE, binding_capacity=1)
    table = [good]
    submit_and_wait(device, [cb], binding_tables=[table])
    table[0] = short  # same list object, new contents
    with pytest.raises(hal.OutOfRangeError):
        device.queue_execute([cb], binding_tables=[table])
    assert device.read(short) == bytes(8)


def test_alternating_tables_run_on_their_own_buffers_and_a_released_entry_is_rejected(device, kernels):
    """Double-buffered tables (A, B, A, B, ...) are each validated once while nothing is released: every
    submission still runs on its own table's buffers, and a release invalidates what was remembered."""
    bufs = [allocate_with(device, bytes(64)) for _ in range(5)]
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=Mode.REUSABLE, binding_capacity=1)
    for _ in range(3):
        for buf in bufs:
            submit_and_wait(device, [cb], binding_tables=[[buf]])
    for buf in bufs:
        np.testing.assert_array_equal(read_u32(device, buf)[:16], np.full(16, 3, np.uint32))
    bufs[1].release()
    with pytest.raises(hal.FailedPreconditionError):
        device.queue_execute([cb], binding_tables=[[bufs[1]]])
    submit_and_wait(device, [cb], binding_tables=[[bufs[2]]])  # validated again, still runs
    np.testing.assert_array_equal(read_u32(device, bufs[2])[:16], np.full(16, 4, np.uint32))
    table = [bufs[3]]
    submit_and_wait(device, [cb], binding_tables=[table])
    submit_and_wait(device, [cb], binding_tables=[[bufs[4]]])
    table[0] = bufs[1]  # an earlier table mutated in place (to a released buffer): checked again
    with pytest.raises(hal.FailedPreconditionError):
        device.queue_execute([cb], binding_tables=[table])


def test_one_reusable_command_buffer_several_times_in_one_submission(device, kernels):
    """A submission may hold the same reusable command buffer more than once, with the same or other
    tables: each occurrence runs in order on its own table's buffers. Repeating such a batch (as a
    runtime queueing replays does) is recognised per command buffer, and a buffer released since is
    still caught in any position of the batch."""
    a, b, c = (allocate_with(device, bytes(64)) for _ in range(3))
    add = record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=Mode.REUSABLE, binding_capacity=1)
    double = record(device, lambda cb: (_add_one(kernels, cb, Slot(0)), cb.execution_barrier(),
                                        _add_one(kernels, cb, Slot(0))), mode=Mode.REUSABLE, binding_capacity=1)
    batch = [add, add, double, add, double]
    tables = [[a], [b], [a], [a], [c]]
    expected = {id(a): 0, id(b): 0, id(c): 0}
    for _ in range(3):
        submit_and_wait(device, list(batch), binding_tables=[list(t) for t in tables])
        for cb, (buf,) in zip(batch, tables):
            expected[id(buf)] += 2 if cb is double else 1
        for buf in (a, b, c):
            np.testing.assert_array_equal(read_u32(device, buf)[:16], np.full(16, expected[id(buf)], np.uint32))
    spare = allocate_with(device, bytes(64))
    spare.release()
    for position in range(len(batch)):
        stale = [list(t) for t in tables]
        stale[position] = [spare]
        with pytest.raises(hal.FailedPreconditionError, match="released"):
            device.queue_execute(list(batch), binding_tables=stale)
    submit_and_wait(device, list(batch), binding_tables=[list(t) for t in tables])  # still usable
    np.testing.assert_array_equal(read_u32(device, a)[:16], np.full(16, expected[id(a)] + 4, np.uint32))
    with pytest.raises(hal.InvalidArgumentError):
        device.queue_execute(list(batch), binding_tables=[list(t) for t in tables[:-1]])


@pytest.mark.parametrize("mode", [Mode.ONE_SHOT, Mode.REUSABLE])
@pytest.mark.parametrize("repeat", [1, 2])
def test_lists_changed_by_the_caller_after_submission_do_not_change_the_work(device, kernels, mode, repeat):
    """The submission keeps what it was given: clearing or refilling the caller's command-buffer list,
    binding table and fence lists while the work waits to be issued changes nothing."""
    target, decoy = allocate_with(device, bytes(64)), allocate_with(device, bytes(64))
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=mode, binding_capacity=1)
    gate, done, other = device.create_semaphore(0), device.create_semaphore(0), device.create_semaphore(0)
    for turn in range(1, repeat + 1 if mode is Mode.REUSABLE else 2):
        cbs, table, wait, signal = [cb], [target], [(gate, turn)], [(done, turn)]
        device.queue_execute(cbs, wait=wait, signal=signal, binding_tables=[table])
        cbs.clear()
        table[0] = decoy
        wait[0] = (gate, 0)
        signal[0] = (other, turn)
        gate.signal(turn)
        done.wait(turn, timeout=WAIT_TIMEOUT)
    runs = repeat if mode is Mode.REUSABLE else 1
    np.testing.assert_array_equal(read_u32(device, target)[:16], np.full(16, runs, np.uint32))
    assert device.read(decoy) == bytes(64)
    assert other.value == 0


# -- binding tables checked as a whole -------------------------------------------------------------------

def _slot_copy(capacity=2, source=Slot(0), target=Slot(1)):
    def body(cb):
        cb.copy_buffer(source, target)
    return body


@pytest.mark.parametrize(("src_len", "dst_len"), [(32, 16), (16, 32), (4, 64)])
def test_slot_copy_with_entries_of_different_lengths_is_rejected(device, src_len, dst_len):
    src = allocate_with(device, ORIGINAL[:src_len])
    dst = allocate_with(device, bytes(dst_len))
    cb = record(device, _slot_copy(), mode=Mode.REUSABLE, binding_capacity=2)
    sem = device.create_semaphore(0)
    with pytest.raises(hal.InvalidArgumentError) as info:
        device.queue_execute([cb], signal=[(sem, 1)], binding_tables=[[src, dst]])
    assert str(src_len) in str(info.value) and str(dst_len) in str(info.value)
    assert device.read(dst) == bytes(dst_len) and sem.current_value == 0


def test_slot_copy_with_entry_ranges_of_different_lengths_is_rejected(device):
    big = allocate_with(device, ORIGINAL)
    out = allocate_with(device, bytes(64))
    cb = record(device, _slot_copy(), mode=Mode.REUSABLE, binding_capacity=2)
    with pytest.raises(hal.InvalidArgumentError):
        device.queue_execute([cb], binding_tables=[[(big, 0, 24), (out, 0, 16)]])
    submit_and_wait(device, [cb], binding_tables=[[(big, 8, 16), (out, 0, 16)]])
    assert device.read(out) == ORIGINAL[8:24] + bytes(48)


def test_slot_copy_of_equal_entries_copies(device):
    src, dst = allocate_with(device, ORIGINAL), allocate_with(device, bytes(64))
    cb = record(device, _slot_copy(), mode=Mode.REUSABLE, binding_capacity=2)
    submit_and_wait(device, [cb], binding_tables=[[src, dst]])
    assert device.read(dst) == ORIGINAL


def test_slot_copy_overlapping_in_one_buffer_is_rejected(device):
    buf = allocate_with(device, ORIGINAL)
    cb = record(device, _slot_copy(), mode=Mode.REUSABLE, binding_capacity=2)
    with pytest.raises(hal.InvalidArgumentError) as info:
        device.queue_execute([cb], binding_tables=[[(buf, 0, 32), (buf, 16, 32)]])
    assert "overlap" in str(info.value)
    assert device.read(buf) == ORIGINAL


def test_slot_copy_with_fixed_length_longer_than_an_entry_is_out_of_range(device):
    src, dst = allocate_with(device, ORIGINAL), allocate_with(device, bytes(8))
    cb = record(device, _slot_copy(source=Slot(0, 0, 16), target=Slot(1, 0, 16)), mode=Mode.REUSABLE,
                binding_capacity=2)
    with pytest.raises(hal.OutOfRangeError):
        device.queue_execute([cb], binding_tables=[[src, dst]])
    assert device.read(dst) == bytes(8)


def test_slot_fill_through_a_misaligned_entry_is_rejected(device):
    buf = allocate_with(device, ORIGINAL)
    cb = record(device, lambda cb: cb.fill_buffer(Slot(0), 0xAABBCCDD, 4), mode=Mode.REUSABLE, binding_capacity=1)
    with pytest.raises(hal.InvalidArgumentError) as info:
        device.queue_execute([cb], binding_tables=[[(buf, 2, 8)]])
    assert "align" in str(info.value)
    assert device.read(buf) == ORIGINAL


def test_table_entry_lacking_the_usage_a_command_needs_is_rejected(device, kernels):
    transfer_only = device.allocator.allocate(64, usage=hal.BufferUsage.TRANSFER | hal.BufferUsage.MAPPING)
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=Mode.REUSABLE, binding_capacity=1)
    with pytest.raises(hal.FailedPreconditionError) as info:
        device.queue_execute([cb], binding_tables=[[transfer_only]])
    assert "usage" in str(info.value)
    transfer_only.release()


@pytest.mark.parametrize("entry", ["buffer", None, 7, 1.5, ("tuple",)], ids=["str", "None", "int", "float", "tuple"])
def test_table_entry_that_is_not_a_buffer_is_invalid_argument(device, kernels, entry):
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=Mode.REUSABLE, binding_capacity=1)
    with pytest.raises(hal.InvalidArgumentError) as info:
        device.queue_execute([cb], binding_tables=[[entry]])
    assert "binding_tables[0][0]" in str(info.value)


def test_table_entry_of_another_device_is_invalid_argument(device, kernels, make_device):
    other = make_device()
    foreign = other.allocator.allocate(64)
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0)), mode=Mode.REUSABLE, binding_capacity=1)
    with pytest.raises(hal.InvalidArgumentError) as info:
        device.queue_execute([cb], binding_tables=[[foreign]])
    assert "another device" in str(info.value)


def test_rejected_table_leaves_a_good_table_usable(device, kernels):
    buf, short = allocate_with(device, bytes(64)), allocate_with(device, bytes(8))
    cb = record(device, lambda cb: _add_one(kernels, cb, Slot(0, 0, 64)), mode=Mode.REUSABLE, binding_capacity=1)
    with pytest.raises(hal.OutOfRangeError):
        device.queue_execute([cb], binding_tables=[[short]])
    submit_and_wait(device, [cb], binding_tables=[[buf]])
    np.testing.assert_array_equal(read_u32(device, buf)[:16], np.ones(16, np.uint32))


# -- objects of a closed device ----------------------------------------------------------------------------

RECORDING_AFTER_CLOSE = {
    "fill_buffer": lambda cb, buf, exe: cb.fill_buffer(buf, 0, 1),
    "update_buffer": lambda cb, buf, exe: cb.update_buffer(b"\x00" * 4, (buf, 0, 4)),
    "copy_buffer": lambda cb, buf, exe: cb.copy_buffer((buf, 0, 4), (buf, 8, 4)),
    "execution_barrier": lambda cb, buf, exe: cb.execution_barrier(),
    "dispatch": lambda cb, buf, exe: cb.dispatch(exe, "cts_add_one", 1, [1], [buf]),
    "end": lambda cb, buf, exe: cb.end(),
}


@pytest.mark.parametrize("call", list(RECORDING_AFTER_CLOSE))
def test_recording_into_an_open_command_buffer_of_a_closed_device_is_refused(make_device, call):
    from .kernels import load_kernels

    dev = make_device()
    exe = load_kernels(dev)
    buf = dev.allocator.allocate(16)
    cb = dev.create_command_buffer()
    cb.begin()
    dev.close()
    with pytest.raises(hal.FailedPreconditionError) as info:
        RECORDING_AFTER_CLOSE[call](cb, buf, exe)
    assert "closed" in str(info.value)


BUFFER_USE_AFTER_CLOSE = {
    "map": lambda buf: buf.map().__enter__(),
    "subspan": lambda buf: buf.subspan(0, 8),
    "device_address": lambda buf: buf.device_address,
}


@pytest.mark.parametrize("call", list(BUFFER_USE_AFTER_CLOSE))
def test_buffers_of_a_closed_device_refuse_use(make_device, call):
    dev = make_device()
    buf = dev.allocator.allocate(16, memory_type=MAPPABLE)
    dev.close()
    with pytest.raises(hal.FailedPreconditionError):
        BUFFER_USE_AFTER_CLOSE[call](buf)


def test_statistics_after_close_report_nothing_live(make_device):
    dev = make_device()
    kept = [dev.allocator.allocate(1024) for _ in range(3)]
    assert dev.allocator.statistics().live_buffers == 3
    dev.close()
    stats = dev.allocator.statistics()
    assert stats.live_buffers == 0 and stats.bytes_allocated == 0
    assert stats.bytes_peak >= 3 * 1024
    for buf in kept:
        buf.release()  # a no-op after close, never an error
    assert dev.allocator.statistics().live_buffers == 0


def test_release_after_close_is_quiet_and_idempotent(make_device):
    dev = make_device()
    buf = dev.allocator.allocate(64)
    view = buf.subspan(0, 16)
    dev.close()
    view.release()
    buf.release()
    buf.release()
    assert buf.released and view.released


def test_closing_does_not_disturb_another_device(make_device, kernels, device):
    doomed = make_device()
    doomed_buf = doomed.allocator.allocate(64)
    buf = allocate_with(device, bytes(64))
    doomed.close()
    doomed_buf.release()
    cb = record(device, lambda cb: _add_one(kernels, cb, buf))
    submit_and_wait(device, [cb])
    np.testing.assert_array_equal(read_u32(device, buf)[:16], np.ones(16, np.uint32))
