"""Drivers and devices: listing, availability, URIs, creation, info and closing."""

from __future__ import annotations

import threading

import pytest

import hal

from .helpers import WAIT_TIMEOUT, allocate_with, execute

LOCAL_DRIVERS = ["local-sync", "local-task"]
DEFAULT_PREFERENCE = ["cuda", "hip", "local-task"]


def _unavailable_drivers() -> list[hal.DriverInfo]:
    return [info for info in hal.list_drivers() if not info.available]


# -- the registry (independent of the driver under test) --------------------------


def test_list_drivers_describes_every_driver():
    infos = hal.list_drivers()
    names = [info.name for info in infos]
    assert len(names) == len(set(names))
    for name in LOCAL_DRIVERS:
        assert name in names
    for info in infos:
        assert isinstance(info, hal.DriverInfo)
        assert isinstance(info.summary, str) and info.summary
        assert isinstance(info.available, bool)
        if info.available:
            assert info.reason is None
        else:
            assert isinstance(info.reason, str) and info.reason


@pytest.mark.parametrize("name", LOCAL_DRIVERS)
def test_local_drivers_are_always_available(name):
    info = {i.name: i for i in hal.list_drivers()}[name]
    assert info.available and info.reason is None
    assert hal.get_driver(name).name == name


def test_unknown_driver_is_not_found_and_lists_known_drivers():
    with pytest.raises(hal.NotFoundError) as info:
        hal.get_driver("no-such-driver")
    message = str(info.value)
    assert "no-such-driver" in message
    for known in hal.list_drivers():
        assert known.name in message


def test_unknown_driver_uri_is_not_found():
    with pytest.raises(hal.NotFoundError):
        hal.create_device("no-such-driver://0")


class _NeverAvailableDriver(hal.Driver):
    name = "cts-never-available"
    summary = "a driver whose probe always fails"

    def _probe(self):
        return False, "the cts test device is unplugged"

    def _query_devices(self):
        raise AssertionError("never queried while unavailable")

    def _create_device(self, info, **options):
        raise AssertionError("never created while unavailable")


def test_unavailable_driver_reports_its_reason():
    driver = _NeverAvailableDriver()
    assert driver.available() == (False, "the cts test device is unplugged")
    assert driver.info() == hal.DriverInfo(driver.name, driver.summary, False, "the cts test device is unplugged")
    for call in (driver.query_devices, driver.create_device):
        with pytest.raises(hal.UnavailableError) as error:
            call()
        assert "the cts test device is unplugged" in str(error.value)
    # Registered drivers that cannot run on this machine (GPU drivers without a GPU).
    for info in _unavailable_drivers():
        with pytest.raises(hal.UnavailableError) as error:
            hal.get_driver(info.name)
        assert info.reason in str(error.value)
        with pytest.raises(hal.UnavailableError) as error:
            hal.create_device(info.name)
        assert info.reason in str(error.value)


def test_default_device_prefers_gpus_then_local_task(monkeypatch):
    monkeypatch.delenv("HAL_DEVICE", raising=False)
    available = {info.name for info in hal.list_drivers() if info.available}
    expected = next(name for name in DEFAULT_PREFERENCE if name in available)
    with hal.create_device() as dev:
        assert dev.driver_name == expected


def test_error_codes_match_classes():
    assert hal.HalError(hal.StatusCode.OUT_OF_RANGE, "x").__class__ is hal.OutOfRangeError
    assert hal.InvalidArgumentError("bad").code == hal.StatusCode.INVALID_ARGUMENT
    assert isinstance(hal.AbortedError("a"), hal.HalError)


# -- the driver under test ----------------------------------------------------------


def test_query_devices(hal_driver, driver_name):
    devices = hal_driver.query_devices()
    assert devices, "an available driver has at least one device"
    assert [d.ordinal for d in devices] == list(range(len(devices)))
    assert len({d.id for d in devices}) == len(devices)
    for info in devices:
        assert isinstance(info, hal.DeviceInfo)
        assert info.driver == driver_name
        assert isinstance(info.id, str) and info.id
        assert isinstance(info.name, str) and info.name
        assert info.uri.startswith(driver_name)
        assert isinstance(info.properties, dict)


def test_query_devices_is_stable(hal_driver):
    first = [(d.ordinal, d.id, d.uri) for d in hal_driver.query_devices()]
    second = [(d.ordinal, d.id, d.uri) for d in hal_driver.query_devices()]
    assert first == second


def test_create_device_by_name(hal_driver, driver_name, device_options):
    dev = hal.create_device(driver_name, **device_options)
    try:
        assert dev.driver_name == driver_name
        assert dev.info.driver == driver_name
        assert dev.info.id == hal_driver.query_devices()[0].id
    finally:
        dev.close()


def test_create_device_by_ordinal_uri(hal_driver, driver_name, device_options):
    for info in hal_driver.query_devices():
        with hal.create_device(f"{driver_name}://{info.ordinal}", **device_options) as dev:
            assert dev.info.ordinal == info.ordinal
            assert dev.info.id == info.id


def test_create_device_by_id_uri(hal_driver, driver_name, device_options):
    for info in hal_driver.query_devices():
        with hal.create_device(f"{driver_name}://{info.id}", **device_options) as dev:
            assert dev.info.id == info.id
            assert dev.info.ordinal == info.ordinal


def test_create_device_by_reported_uri(hal_driver, device_options):
    for info in hal_driver.query_devices():
        with hal.create_device(info.uri, **device_options) as dev:
            assert dev.info.id == info.id


def test_create_device_through_the_driver_object(hal_driver, device_options):
    info = hal_driver.query_devices()[0]
    with hal_driver.create_device(info.ordinal, **device_options) as dev:
        assert dev.info.id == info.id


@pytest.mark.parametrize("key", ["9999", "no-such-device-id"])
def test_unknown_device_is_not_found(hal_driver, driver_name, key):
    with pytest.raises(hal.NotFoundError):
        hal.create_device(f"{driver_name}://{key}")


def test_hal_device_environment_variable(monkeypatch, hal_driver, driver_uri, device_options, driver_name):
    monkeypatch.setenv("HAL_DEVICE", driver_uri)
    with hal.create_device(**device_options) as dev:
        assert dev.driver_name == driver_name


def test_device_info_and_limits(device, driver_name):
    info = device.info
    assert isinstance(info, hal.DeviceInfo)
    assert info.driver == driver_name == device.driver_name
    assert isinstance(info.uri, str) and info.uri
    limits = device.limits
    counts = tuple(limits["max_workgroup_count"])
    assert len(counts) == 3 and all(isinstance(c, int) and c >= 1 for c in counts)
    assert isinstance(limits["max_workgroup_size"], int) and limits["max_workgroup_size"] >= 64


def test_device_is_a_context_manager(make_device):
    dev = make_device()
    with dev as entered:
        assert entered is dev
        buf = allocate_with(dev, b"\x01" * 8)
        execute(dev, lambda cb: cb.fill_buffer(buf, 0x02, 1))
        assert dev.read(buf) == b"\x02" * 8
    with pytest.raises(hal.FailedPreconditionError):
        dev.allocator.allocate(8)


def _load_kernels(dev):
    from .kernels import load_kernels

    return load_kernels(dev)


CLOSED_DEVICE_CALLS = {
    "allocate": lambda dev, buf: dev.allocator.allocate(16),
    "create_semaphore": lambda dev, buf: dev.create_semaphore(0),
    "create_command_buffer": lambda dev, buf: dev.create_command_buffer(),
    "load_executable": lambda dev, buf: _load_kernels(dev),
    "queue_barrier": lambda dev, buf: dev.queue_barrier(),
    "queue_execute": lambda dev, buf: dev.queue_execute([]),
    "queue_alloca": lambda dev, buf: dev.queue_alloca(16),
    "write": lambda dev, buf: dev.write(buf, b"\x00"),
    "read": lambda dev, buf: dev.read(buf),
    "wait_idle": lambda dev, buf: dev.wait_idle(),
}


@pytest.mark.parametrize("call", list(CLOSED_DEVICE_CALLS))
def test_closed_device_rejects_use(make_device, call):
    dev = make_device()
    buf = dev.allocator.allocate(16)
    dev.close()
    with pytest.raises(hal.FailedPreconditionError):
        CLOSED_DEVICE_CALLS[call](dev, buf)


def test_close_waits_for_queued_work(make_device):
    dev = make_device()
    sem = dev.create_semaphore(0)
    buf = allocate_with(dev, bytes(64))
    cb = dev.create_command_buffer()
    with cb.record():
        cb.fill_buffer(buf, 0x5A, 1)
    dev.queue_execute([cb], signal=[(sem, 1)])
    dev.close()
    assert sem.value == 1


def test_close_fails_work_parked_on_unreached_waits(make_device):
    dev = make_device()
    gate, done = dev.create_semaphore(0), dev.create_semaphore(0)
    buf = allocate_with(dev, bytes(8))
    cb = dev.create_command_buffer()
    with cb.record():
        cb.fill_buffer(buf, 1, 1)
    dev.queue_execute([cb], wait=[(gate, 1)], signal=[(done, 1)])
    closer = threading.Thread(target=dev.close, daemon=True)
    closer.start()
    closer.join(WAIT_TIMEOUT)
    if closer.is_alive():
        gate.signal(1)  # unblock the hung close before failing
        pytest.fail("close() waits forever for work whose waits nothing will reach")
    with pytest.raises(hal.AbortedError):
        done.wait(1, timeout=WAIT_TIMEOUT)


def test_two_devices_are_independent(make_device):
    first, second = make_device(), make_device()
    a = allocate_with(first, bytes(32))
    b = allocate_with(second, bytes(32))
    execute(first, lambda cb: cb.fill_buffer(a, 0x11, 1))
    execute(second, lambda cb: cb.fill_buffer(b, 0x22, 1))
    assert first.read(a) == b"\x11" * 32
    assert second.read(b) == b"\x22" * 32
    first.close()
    execute(second, lambda cb: cb.fill_buffer(b, 0x33, 1))
    assert second.read(b) == b"\x33" * 32
