"""Device options: a driver rejects the options it does not know instead of ignoring them.

``hal.create_device(uri, **options)`` hands the options to the driver's ``_create_device`` hook;
an option it silently dropped (a typo such as ``queue_cout=2``) would leave the user with a device
configured otherwise than asked.
"""

from __future__ import annotations

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
