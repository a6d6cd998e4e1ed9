"""The command buffer state machine: INITIAL -> RECORDING -> EXECUTABLE (-> SUBMITTED)."""

from __future__ import annotations

import numpy as np
import pytest

import hal

from .helpers import allocate_with, read_u32, submit_and_wait

State = hal.CommandBufferState
Mode = hal.CommandBufferMode

COMMANDS = {
    "fill": lambda cb, buf, exe: cb.fill_buffer(buf, 1, 1),
    "update": lambda cb, buf, exe: cb.update_buffer(bytes(16), (buf, 0, 16)),
    "copy": lambda cb, buf, exe: cb.copy_buffer((buf, 0, 16), (buf, 32, 16)),
    "barrier": lambda cb, buf, exe: cb.execution_barrier(),
    "dispatch": lambda cb, buf, exe: cb.dispatch(exe, "cts_add_one", workgroups=1, constants=[4], bindings=[buf]),
}


def test_states_of_a_one_shot_buffer(device):
    cb = device.create_command_buffer()
    assert cb.state == State.INITIAL
    cb.begin()
    assert cb.state == State.RECORDING
    cb.end()
    assert cb.state == State.EXECUTABLE
    submit_and_wait(device, [cb])
    assert cb.state == State.SUBMITTED


def test_states_of_a_reusable_buffer(device):
    cb = device.create_command_buffer(mode=Mode.REUSABLE)
    with cb.record():
        assert cb.state == State.RECORDING
    assert cb.state == State.EXECUTABLE
    submit_and_wait(device, [cb])
    assert cb.state == State.EXECUTABLE


@pytest.mark.parametrize("command", list(COMMANDS))
def test_recording_before_begin_fails(device, kernels, command):
    buf = allocate_with(device, bytes(64))
    cb = device.create_command_buffer()
    with pytest.raises(hal.FailedPreconditionError):
        COMMANDS[command](cb, buf, kernels)
    assert cb.state == State.INITIAL


@pytest.mark.parametrize("command", list(COMMANDS))
def test_recording_after_end_fails(device, kernels, command):
    buf = allocate_with(device, bytes(64))
    cb = device.create_command_buffer()
    cb.begin()
    cb.end()
    with pytest.raises(hal.FailedPreconditionError):
        COMMANDS[command](cb, buf, kernels)
    submit_and_wait(device, [cb])
    assert device.read(buf) == bytes(64), "a rejected command must not run"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_recording_after_submit_fails(device, kernels, command):
    buf = allocate_with(device, bytes(64))
    cb = device.create_command_buffer()
    cb.begin()
    cb.end()
    submit_and_wait(device, [cb])
    with pytest.raises(hal.FailedPreconditionError):
        COMMANDS[command](cb, buf, kernels)


def test_begin_twice_fails(device):
    cb = device.create_command_buffer()
    cb.begin()
    with pytest.raises(hal.FailedPreconditionError):
        cb.begin()
    assert cb.state == State.RECORDING


def test_begin_after_end_fails_for_one_shot(device):
    cb = device.create_command_buffer()
    cb.begin()
    cb.end()
    with pytest.raises(hal.FailedPreconditionError):
        cb.begin()


def test_end_without_begin_fails(device):
    cb = device.create_command_buffer()
    with pytest.raises(hal.FailedPreconditionError):
        cb.end()
    assert cb.state == State.INITIAL


def test_end_twice_fails(device):
    cb = device.create_command_buffer()
    cb.begin()
    cb.end()
    with pytest.raises(hal.FailedPreconditionError):
        cb.end()
    assert cb.state == State.EXECUTABLE


@pytest.mark.parametrize("mode", [Mode.ONE_SHOT, Mode.REUSABLE])
def test_submitting_an_initial_buffer_fails(device, mode):
    cb = device.create_command_buffer(mode=mode)
    sem = device.create_semaphore(0)
    with pytest.raises(hal.FailedPreconditionError):
        device.queue_execute([cb], signal=[(sem, 1)])
    assert sem.value == 0 and sem.failure is None


@pytest.mark.parametrize("mode", [Mode.ONE_SHOT, Mode.REUSABLE])
def test_submitting_a_recording_buffer_fails(device, mode):
    buf = allocate_with(device, bytes(16))
    cb = device.create_command_buffer(mode=mode)
    cb.begin()
    cb.fill_buffer(buf, 0xFF, 1)
    sem = device.create_semaphore(0)
    with pytest.raises(hal.FailedPreconditionError):
        device.queue_execute([cb], signal=[(sem, 1)])
    assert sem.value == 0
    assert device.read(buf) == bytes(16)


def test_resubmitting_a_one_shot_buffer_fails(device):
    buf = allocate_with(device, np.zeros(4, np.uint32))
    cb = device.create_command_buffer()
    with cb.record():
        cb.fill_buffer(buf, 7, 4)
    submit_and_wait(device, [cb])
    device.write(buf, bytes(16))
    with pytest.raises(hal.FailedPreconditionError):
        device.queue_execute([cb])
    assert device.read(buf) == bytes(16)


def test_bad_buffer_among_good_ones_submits_nothing(device):
    good_buf = allocate_with(device, bytes(8))
    good = device.create_command_buffer()
    with good.record():
        good.fill_buffer(good_buf, 0x42, 1)
    bad = device.create_command_buffer()
    sem = device.create_semaphore(0)
    with pytest.raises(hal.FailedPreconditionError):
        device.queue_execute([good, bad], signal=[(sem, 1)])
    assert device.read(good_buf) == bytes(8)
    assert good.state == State.EXECUTABLE
    submit_and_wait(device, [good])
    assert device.read(good_buf) == b"\x42" * 8


def test_empty_command_buffer_executes(device):
    cb = device.create_command_buffer()
    with cb.record():
        pass
    sem = submit_and_wait(device, [cb])
    assert sem.value == 1


def test_record_context_manager_records_commands(device, kernels):
    buf = allocate_with(device, np.zeros(8, np.uint32))
    cb = device.create_command_buffer()
    with cb.record():
        cb.dispatch(kernels, "cts_iota", workgroups=1, constants=[8], bindings=[buf])
    submit_and_wait(device, [cb])
    np.testing.assert_array_equal(read_u32(device, buf), np.arange(8, dtype=np.uint32))
