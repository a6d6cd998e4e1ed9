"""Device options: a driver rejects the options it does not know instead of ignoring them.

``hal.create_device(uri, **options)`` hands the options to the driver's ``_create_device`` hook;
an option it silently dropped (a typo such as ``queue_cout=2``) would leave the user with a device
configured otherwise than asked.
"""

from __future__ import annotations

import threading

import pytest

import hal


def test_unknown_device_option_is_rejected(make_device):
    with pytest.raises(hal.InvalidArgumentError, match="no_such_option_for_cts"):
        make_device(no_such_option_for_cts=1)


def test_device_is_usable_after_a_rejected_option(make_device):
    with pytest.raises(hal.InvalidArgumentError):
        make_device(no_such_option_for_cts=True)
    dev = make_device()
    sem = dev.create_semaphore(0)
    dev.queue_barrier(signal=[(sem, 1)])
    sem.wait(1, timeout=30)


@pytest.mark.parametrize("count", [0, -1, 10**6, 2**70, 1.5, "2", True, None])
def test_queue_count_is_bounded_and_checked_before_any_resource(make_device, count):
    threads = threading.active_count()
    with pytest.raises(hal.InvalidArgumentError, match="queue_count"):
        make_device(queue_count=count)
    assert threading.active_count() <= threads  # no queue thread was started for the rejected device
    dev = make_device()
    sem = dev.create_semaphore(0)
    dev.queue_barrier(signal=[(sem, 1)])
    sem.wait(1, timeout=30)


def test_the_largest_queue_count_is_accepted(make_device):
    try:
        dev = make_device(queue_count=hal.MAX_QUEUE_COUNT)
    except hal.InvalidArgumentError as exc:  # a driver without queue options rejects it as any unknown option
        assert "queue_count" in str(exc)
        return
    assert dev.queue_count == hal.MAX_QUEUE_COUNT
    sem = dev.create_semaphore(0)
    dev.queue_barrier(signal=[(sem, 1)], queue=hal.MAX_QUEUE_COUNT - 1)
    sem.wait(1, timeout=30)
