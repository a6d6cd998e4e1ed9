"""The conformance suite's pytest plugin: driver selection for every test that runs against a HAL device.

Loaded by the repository's tests/conftest.py (shared with the differential tests) and, for the
installed suite, by ``python -m hal_cts`` (``pytest -p hal_cts.plugin --pyargs hal_cts``).

Options:

  --driver NAME_OR_URI        repeatable; "local-task", "cuda", "cuda://1", ...
  --driver-option KEY=VALUE   repeatable; passed to hal.create_device(uri, **options).
                              "NAME:KEY=VALUE" applies to driver NAME only.
  --run-fault-tests           also run tests that make a GPU kernel fault
                              (a device fault can leave a GPU context unusable).
  --allow-unavailable         a driver named with --driver (or HAL_CTS_DRIVERS) that is
                              unavailable here is reported as skipped instead of an error.

Without --driver, the HAL_CTS_DRIVERS environment variable (comma or space
separated) selects the drivers; without either, every driver that
hal.list_drivers() reports is selected. A driver named on purpose that is not
available on this machine is one usage error (a run that tested nothing must not
pass), unless --allow-unavailable is given; then, as for the drivers selected by
default, its tests show up as skipped carrying the driver's reason, never as
passed ones (summarised in one line per driver at the end of the run). A name no
plugin registers is one usage error.

Any test or fixture that asks for `driver_uri` is parametrized over the
selected drivers; `device` gives such a test one device per driver and module.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import hal
from hal import env

from .guidance import advice
from .helpers import faults_recoverable

_SELECTION = pytest.StashKey[list[str]]()
_OPTIONS = pytest.StashKey[list[tuple[str | None, str, object]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hal", "HAL driver selection")
    group.addoption(
        "--driver",
        action="append",
        default=[],
        metavar="NAME",
        help="HAL driver name or device URI to test (repeatable; default: $HAL_CTS_DRIVERS or every driver)",
    )
    group.addoption(
        "--driver-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option for hal.create_device (repeatable); NAME:KEY=VALUE limits it to driver NAME",
    )
    group.addoption(
        "--allow-unavailable",
        action="store_true",
        default=False,
        help="report the tests of a named driver that is unavailable here as skipped instead of failing the run",
    )
    group.addoption(
        "--run-fault-tests",
        action="store_true",
        default=False,
        help="also run tests that make a GPU kernel fault on purpose",
    )


def _parse_value(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return text


def _parse_driver_option(text: str) -> tuple[str | None, str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise pytest.UsageError(f"--driver-option expects KEY=VALUE or NAME:KEY=VALUE, got {text!r}")
    driver, colon, bare_key = key.rpartition(":")
    if colon and driver:
        return driver, bare_key, _parse_value(value)
    return None, key, _parse_value(value)


def _selected_uris(config: pytest.Config) -> list[str]:
    chosen = list(config.getoption("--driver"))
    if not chosen:
        chosen = [s for s in re.split(r"[,\s]+", env.text("HAL_CTS_DRIVERS") or "") if s]
    if not chosen:
        chosen = [info.name for info in hal.list_drivers()]
    # Keep the order given, drop repeats.
    return list(dict.fromkeys(chosen))


def _check_registered(uris: list[str]) -> None:
    """A driver name no plugin registers is a usage error: one line, before any test runs."""
    known = [info.name for info in hal.list_drivers()]
    for uri in uris:
        name = driver_name_of(uri)
        if name not in known:
            problems = "".join(f"; plugin {p}" for p in hal.plugin_problems())
            raise pytest.UsageError(
                f"--driver {uri!r}: no HAL driver named {name!r} (known: {', '.join(known)})" + problems
            )


def _check_available(config: pytest.Config, uris: list[str]) -> None:
    """A driver named on purpose must run here: its tests all skipped would make a run that tested nothing."""
    if config.getoption("--allow-unavailable") or not (config.getoption("--driver") or env.text("HAL_CTS_DRIVERS")):
        return
    infos = {info.name: info for info in hal.list_drivers()}
    for uri in uris:
        info = infos[driver_name_of(uri)]
        if not info.available:
            raise pytest.UsageError(f"--driver {uri!r}: driver {info.name!r} is unavailable here: {info.reason} "
                                    "(pass --allow-unavailable to report its tests as skipped instead)")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SELECTION] = _selected_uris(config)
    _check_registered(config.stash[_SELECTION])
    _check_available(config, config.stash[_SELECTION])
    config.stash[_OPTIONS] = [_parse_driver_option(o) for o in config.getoption("--driver-option")]
    config.addinivalue_line("markers", "gpu_fault: makes a GPU kernel fault; needs --run-fault-tests on GPU drivers")


def pytest_report_header(config: pytest.Config) -> str:
    return "hal drivers under test: " + ", ".join(config.stash[_SELECTION])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "driver_uri" in metafunc.fixturenames:
        uris = metafunc.config.stash[_SELECTION]
        metafunc.parametrize("driver_uri", uris, ids=uris, scope="module")


def driver_name_of(uri: str) -> str:
    return uri.split("://", 1)[0]


@pytest.fixture(scope="module")
def driver_name(driver_uri: str) -> str:
    return driver_name_of(driver_uri)


@pytest.fixture(scope="module")
def hal_driver(driver_name: str) -> hal.Driver:
    """The driver under test; skips (with the driver's reason) when it is unavailable."""
    infos = {info.name: info for info in hal.list_drivers()}
    if driver_name not in infos:
        known = ", ".join(sorted(infos)) or "none"
        pytest.fail(f"no HAL driver named {driver_name!r} is registered (known: {known})", pytrace=False)
    info = infos[driver_name]
    if not info.available:
        pytest.skip(f"driver {driver_name!r} unavailable: {info.reason}")
    return hal.get_driver(driver_name)


@pytest.fixture(scope="module")
def device_options(request: pytest.FixtureRequest, driver_name: str) -> dict[str, object]:
    options: dict[str, object] = {}
    for only_for, key, value in request.config.stash[_OPTIONS]:
        if only_for is None or only_for == driver_name:
            options[key] = value
    return options


@pytest.fixture(scope="module")
def shared_device(hal_driver: hal.Driver, driver_uri: str, device_options: dict[str, object]) -> Iterator[hal.Device]:
    """One device per driver and module (device creation is slow on GPUs)."""
    dev = hal.create_device(driver_uri, **device_options)
    try:
        yield dev
    finally:
        dev.close()


def assert_device_usable(dev: hal.Device) -> None:
    """A queue round trip: fails if a test left the device unusable."""
    sem = dev.create_semaphore(0)
    dev.queue_barrier(signal=[(sem, 1)])
    sem.wait(1, timeout=30)


@pytest.fixture
def device(shared_device: hal.Device) -> Iterator[hal.Device]:
    """The driver's shared device; after the test it must still run queue work."""
    yield shared_device
    assert_device_usable(shared_device)


@pytest.fixture
def make_device(
    hal_driver: hal.Driver, driver_uri: str, device_options: dict[str, object]
) -> Iterator[Callable[..., hal.Device]]:
    """A factory of fresh devices for the driver under test, closed after the test."""
    created: list[hal.Device] = []

    def make(**extra: object) -> hal.Device:
        dev = hal.create_device(driver_uri, **{**device_options, **extra})
        created.append(dev)
        return dev

    yield make
    for dev in created:
        try:
            dev.close()
        except hal.HalError:
            pass  # closed by the test itself


@pytest.fixture
def fault_tests_allowed(request: pytest.FixtureRequest, shared_device: hal.Device) -> bool:
    """Whether the driver survives a kernel fault; skips fault tests on the others unless --run-fault-tests.

    A GPU kernel fault usually ends the GPU context for the rest of the process, so
    there fault tests run only when asked for, on their own (``-m gpu_fault``).
    """
    if faults_recoverable(shared_device):  # the driver declares it in its device properties
        return True
    if not request.config.getoption("--run-fault-tests"):
        pytest.skip("a GPU kernel fault can leave the context unusable; pass --run-fault-tests to run it")
    return False


_SUITE_DIR = Path(__file__).resolve().parent


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """A failing conformance test says which hooks carry the behaviour and what the driver must do."""
    report = yield
    module = getattr(item, "module", None)
    if report.failed and module is not None and Path(module.__file__).resolve().parent == _SUITE_DIR:
        report.sections.append(("what the driver must do", advice(module.__name__.rpartition(".")[2])))
    return report


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Skips summarised by reason, one line each (a driver unavailable here is one line, not one per test).

    The per-test skip lines of ``-rs`` are what this replaces: the project runs with ``-rfEX``.
    """
    if "s" in config.option.reportchars or "a" in config.option.reportchars:
        return  # the user asked for the per-test lines
    reasons = Counter(_skip_reason(r) for r in terminalreporter.stats.get("skipped", ()) if r.when != "teardown")
    if not reasons:
        return
    terminalreporter.section("skipped, by reason", sep="-")
    for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
        terminalreporter.line(f"{count:5d} skipped: {reason}")
