"""A failing driver is reported against that driver, typed, and the others still work; driver names that
collide or are missing are reported, never silently dropped or replaced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hal
from examples.minimal_driver import MinimalDriver

ROOT = Path(__file__).resolve().parent.parent

BROKEN_PLUGIN = """
import hal
from examples.minimal_driver import MinimalDriver


class QueryRaises(MinimalDriver):
    name = "query-raises"

    def _query_devices(self):
        raise RuntimeError("the vendor library crashed")


class TakesLocalTask(MinimalDriver):
    name = "local-task"


class Nameless(MinimalDriver):
    name = ""


@hal.hookimpl
def hal_register_drivers():
    return [hal.DriverFactory("query-raises", "raises from its device query", QueryRaises, 10),
            hal.DriverFactory("local-task", "a second driver named local-task", TakesLocalTask, 1000),
            hal.DriverFactory("", "no name", Nameless)]
"""


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "broken_plugin.py").write_text(BROKEN_PLUGIN)
    env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS")}
    env.update(HAL_PLUGINS="broken_plugin", PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)


class _Raising(MinimalDriver):
    raised: BaseException = RuntimeError("boom")

    def _query_devices(self):
        raise self.raised


@pytest.mark.parametrize(("raised", "expected"), [(RuntimeError("boom"), hal.InternalError),
                                                  (MemoryError(), hal.ResourceExhaustedError),
                                                  (KeyError("x"), hal.InternalError)])
def test_an_untyped_failure_of_a_driver_hook_is_typed_and_names_the_driver(raised, expected):
    class Raising(_Raising):
        name = f"raises-{type(raised).__name__.lower()}"

    Raising.raised = raised
    hal.register_driver(Raising)
    with pytest.raises(expected, match=Raising.name) as info:
        hal.get_driver(Raising.name).query_devices()
    assert info.value.__cause__ is raised
    with pytest.raises(expected, match=Raising.name):
        hal.create_device(Raising.name)
    with hal.create_device("local-task") as dev:  # the other drivers are unaffected
        assert dev.info.driver == "local-task"


def test_a_driver_whose_create_device_raises_is_typed():
    class CreateRaises(MinimalDriver):
        name = "create-raises"

        def _create_device(self, info, **options):
            raise RuntimeError("can't start new thread")

    hal.register_driver(CreateRaises)
    with pytest.raises(hal.InternalError, match="create-raises.*can't start new thread"):
        hal.create_device("create-raises")


def test_a_driver_that_fails_to_load_is_unavailable_with_the_reason():
    def load():
        raise ImportError("no module named vendor_sdk")

    hal.register_driver(hal.DriverFactory("fails-to-load", "its module does not import", load))
    info = {d.name: d for d in hal.list_drivers()}["fails-to-load"]
    assert not info.available and "vendor_sdk" in info.reason
    with pytest.raises(hal.UnavailableError, match="vendor_sdk"):
        hal.get_driver("fails-to-load")


def test_dump_devices_lists_the_others_and_reports_the_failing_driver(tmp_path):
    proc = run(tmp_path, "-m", "hal", "--dump-devices", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert "local-task://0" in {d["uri"] for d in document["devices"]}
    reasons = {d["driver"]: d["reason"] for d in document["unavailable_drivers"]}
    assert "the vendor library crashed" in reasons["query-raises"]
    assert "Traceback" not in proc.stderr
    text = run(tmp_path, "-m", "hal", "--dump-devices")
    assert text.returncode == 0 and "local-sync://0" in text.stdout and "query-raises" in text.stdout
    one = run(tmp_path, "-m", "hal", "--dump-devices", "--driver", "query-raises")
    assert one.returncode == 1 and "INTERNAL" in one.stderr and "Traceback" not in one.stderr


def test_plugin_name_collisions_and_missing_names_are_reported(tmp_path):
    proc = run(tmp_path, "-c", textwrap.dedent("""
        import hal
        problems = [str(p) for p in hal.plugin_problems()]
        print("\\n".join(problems))
        assert hal.get_driver("local-task").summary != "a second driver named local-task"
        assert "" not in [d.name for d in hal.list_drivers()]
    """))
    assert proc.returncode == 0, proc.stderr
    assert "registers driver 'local-task', a name built-in plugin" in proc.stdout
    assert "this one is ignored" in proc.stdout
    assert "registers a driver without a name" in proc.stdout
    listing = run(tmp_path, "-m", "hal", "--list-drivers")
    assert "registers driver 'local-task'" in listing.stderr


def test_register_driver_refuses_a_taken_name_unless_asked_to_replace():
    class Impostor(MinimalDriver):
        name = "local-sync"
        summary = "not the built-in"

    with pytest.raises(hal.AlreadyExistsError, match="'local-sync' is already registered.*replace=True"):
        hal.register_driver(Impostor, priority=1000)
    assert hal.get_driver("local-sync").summary != "not the built-in"

    class First(MinimalDriver):
        name = "replace-me"

    class Second(MinimalDriver):
        name = "replace-me"
        summary = "the second"

    hal.register_driver(First)
    hal.register_driver(First)  # the same class again: an update, not a collision
    with pytest.raises(hal.AlreadyExistsError):
        hal.register_driver(Second)
    hal.register_driver(Second, replace=True)
    assert hal.get_driver("replace-me").summary == "the second"


@pytest.mark.parametrize("name", ["", "   ", None, "a://b"])
def test_register_driver_refuses_a_driver_without_a_name(name):
    class Nameless(MinimalDriver):
        pass

    Nameless.name = name
    with pytest.raises(hal.InvalidArgumentError, match="needs a name"):
        hal.register_driver(Nameless)
    assert "" not in [d.name for d in hal.list_drivers()]
