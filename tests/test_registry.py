"""Driver discovery: built-ins, entry points, HAL_PLUGINS, in-process registration, URIs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hal
from hal import registry

ROOT = Path(__file__).resolve().parent.parent


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS")}
    full_env.update(env, PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=120)


def test_builtin_drivers_are_listed_by_preference():
    names = [d.name for d in hal.list_drivers()]
    assert names.index("local-task") < names.index("local-sync")
    for gpu in ("cuda", "hip"):
        if gpu in names:
            assert names.index(gpu) < names.index("local-task")


def test_importing_hal_imports_no_gpu_library():
    proc = python("""
        import sys, hal
        hal.create_device("local-task").close()
        loaded = [m for m in sys.modules if m.startswith(("cuda", "hip", "torch", "cupy"))]
        print(loaded)
        assert not loaded, loaded
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("uri, expected", [
    ("local-task", ("local-task", None)),
    ("local-task://", ("local-task", None)),
    ("local-task://0", ("local-task", "0")),
    ("cuda://GPU-8f2e", ("cuda", "GPU-8f2e")),
    ("hip:1", ("hip", "1")),
])
def test_parse_uri(uri, expected):
    assert hal.parse_uri(uri) == expected


@pytest.mark.parametrize("bad", ["", "   ", "://0", None, 3])
def test_parse_uri_rejects_bad_uris(bad):
    with pytest.raises(hal.InvalidArgumentError):
        hal.parse_uri(bad)


@pytest.mark.parametrize("uri", ["local-task://0", "local-task://cpu0", "local-sync", "local-sync://cpu0"])
def test_create_device_by_ordinal_and_id(uri):
    with hal.create_device(uri) as device:
        assert device.info.driver == hal.parse_uri(uri)[0]
        assert device.info.ordinal == 0 and device.info.id == "cpu0"


def test_unknown_driver_lists_known_ones():
    with pytest.raises(hal.NotFoundError) as info:
        hal.create_device("no-such-driver")
    assert "local-task" in str(info.value)


def test_unknown_device_of_known_driver():
    with pytest.raises(hal.NotFoundError) as info:
        hal.create_device("local-task://7")
    assert "7" in str(info.value)
    # An ordinal is ASCII digits: a superscript two raised int()'s untyped ValueError, a Devanagari
    # zero named device 0.
    for key in ("\u00b2", "\u0966", "\uff10"):
        with pytest.raises(hal.NotFoundError, match="has no device"):
            hal.create_device(f"local-task://{key}")
    with hal.create_device("local-task://00") as device:  # (leading zeros: still ordinal 0)
        assert device.info.ordinal == 0


def test_unavailable_driver_raises_with_reason():
    unavailable = [d for d in hal.list_drivers() if not d.available]
    if not unavailable:
        pytest.skip("every driver is available on this machine")
    with pytest.raises(hal.UnavailableError) as info:
        hal.create_device(unavailable[0].name)
    assert unavailable[0].reason in str(info.value)


def test_default_device_is_the_best_available(monkeypatch):
    monkeypatch.delenv("HAL_DEVICE", raising=False)
    best = next(d for d in hal.list_drivers() if d.available)
    with hal.create_device() as device:
        assert device.info.driver == best.name


def test_hal_device_environment_variable(monkeypatch):
    monkeypatch.setenv("HAL_DEVICE", "local-sync")
    with hal.create_device() as device:
        assert device.info.driver == "local-sync"


def test_unknown_device_options_are_rejected():
    with pytest.raises(hal.InvalidArgumentError):
        hal.create_device("local-task", no_such_option=1)


def test_local_task_queue_count_option():
    with hal.create_device("local-task", queue_count=3) as device:
        assert device.queue_count == 3
        sems = [device.create_semaphore(0) for _ in range(3)]
        for queue, sem in enumerate(sems):
            device.queue_barrier(signal=[(sem, 1)], queue=queue)
        hal.wait_all([(s, 1) for s in sems], timeout=10)
        with pytest.raises(hal.InvalidArgumentError):
            device.queue_barrier(queue=3)


def test_register_driver_class_in_process():
    from examples.minimal_driver import MinimalDriver

    class RenamedDriver(MinimalDriver):
        name = "registered-in-process"

    hal.register_driver(RenamedDriver)
    assert "registered-in-process" in [d.name for d in hal.list_drivers()]
    with hal.create_device("registered-in-process") as device:
        buf = device.allocator.allocate(8)
        device.write(buf, b"abcdefgh")
        assert device.read(buf, 2, 3) == b"cde"


def test_register_driver_rejects_other_objects():
    with pytest.raises(hal.InvalidArgumentError):
        hal.register_driver(object())


def test_hal_plugins_environment_variable_loads_a_driver_module():
    proc = python("""
        import hal
        assert "minimal" in [d.name for d in hal.list_drivers()]
        with hal.create_device("minimal") as dev:
            print(dev.info.uri)
    """, HAL_PLUGINS="examples.minimal_driver")
    assert proc.returncode == 0, proc.stderr
    assert "minimal://0" in proc.stdout


def test_entry_point_group_registers_a_third_party_driver(tmp_path):
    """A distribution advertising ``hal.drivers`` is found without any import by name."""
    package = tmp_path / "thirdparty_driver.py"
    package.write_text(textwrap.dedent("""
        import hal
        from examples.minimal_driver import MinimalDriver

        class ThirdPartyDriver(MinimalDriver):
            name = "third-party"

        @hal.hookimpl
        def hal_register_drivers():
            return [hal.DriverFactory("third-party", "from an entry point", ThirdPartyDriver)]
    """))
    dist = tmp_path / "thirdparty_driver-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-driver\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[hal.drivers]\nthirdparty = thirdparty_driver\n")
    proc = python("""
        import hal
        infos = {d.name: d for d in hal.list_drivers()}
        assert infos["third-party"].available, infos
        with hal.create_device("third-party://0") as dev:
            print(dev.info.driver)
    """, PYTHONPATH=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "third-party" in proc.stdout


def test_plugin_module_that_fails_to_import_is_reported_not_fatal():
    proc = python("""
        import hal
        names = [d.name for d in hal.list_drivers()]
        assert "local-task" in names
        problems = [str(p) for p in hal.plugin_problems()]
        assert any("HAL_PLUGINS module 'no_such_plugin_module': cannot import" in p for p in problems), problems
    """, HAL_PLUGINS="no_such_plugin_module")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", "nothing is printed unless logging is configured"


def fake_distribution(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata finds it: a dist-info folder next to its modules."""
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text("[hal.drivers]\n" + lines)
    for module, code in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(code))


GOOD_PLUGIN = """
    import hal
    from examples.minimal_driver import MinimalDriver

    class GoodDriver(MinimalDriver):
        name = "good-third-party"

    @hal.hookimpl
    def hal_register_drivers():
        return [hal.DriverFactory(GoodDriver.name, "works", GoodDriver)]
"""


@pytest.fixture
def plugin_site(tmp_path):
    """A good third-party driver beside four broken packages, each broken its own way."""
    fake_distribution(tmp_path, "aaa-broken-import", {"broken": "aaa_broken"},
                      {"aaa_broken": "raise RuntimeError('vendor library missing')\n"})
    fake_distribution(tmp_path, "good-driver", {"good": "good_plugin"}, {"good_plugin": GOOD_PLUGIN})
    fake_distribution(tmp_path, "hookless-driver", {"hookless": "hookless_plugin"},
                      {"hookless_plugin": "VALUE = 1\n"})
    fake_distribution(tmp_path, "empty-driver", {"empty": "empty_plugin"}, {"empty_plugin": """
        import hal

        @hal.hookimpl
        def hal_register_drivers():
            return []
    """})
    fake_distribution(tmp_path, "raising-driver", {"raising": "raising_plugin"}, {"raising_plugin": """
        import hal

        @hal.hookimpl
        def hal_register_drivers():
            raise KeyError("config")
    """})
    return tmp_path


def test_one_broken_plugin_package_does_not_stop_the_others(plugin_site):
    proc = python("""
        import logging, hal
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
        with hal.create_device("good-third-party") as dev:
            print("device", dev.info.driver)
        for problem in hal.plugin_problems():
            print("problem", problem)
    """, PYTHONPATH=str(plugin_site))
    assert proc.returncode == 0, proc.stderr
    assert "device good-third-party" in proc.stdout
    problems = [line for line in proc.stdout.splitlines() if line.startswith("problem")]
    expected = {
        "aaa-broken-import": "broken = aaa_broken: cannot load: RuntimeError: vendor library missing",
        "hookless-driver": "hookless = hookless_plugin: registers no driver (no hal_register_drivers",
        "empty-driver": "empty = empty_plugin: registers no driver (its hal_register_drivers returned none)",
        "raising-driver": "raising = raising_plugin: hal_register_drivers raised KeyError",
    }
    for dist, text in expected.items():
        assert any(f"distribution {dist} 1.0, entry point {text}" in line for line in problems), (dist, problems)
    assert len(problems) == len(expected), problems
    # The same problems go to the hal logger as warnings, each naming the distribution.
    for dist in expected:
        assert f"WARNING hal.registry plugin distribution {dist} 1.0" in proc.stderr, proc.stderr


def test_unknown_driver_error_names_plugins_that_failed(plugin_site):
    proc = python("""
        import hal
        try:
            hal.create_device("aaa")
        except hal.NotFoundError as exc:
            print(exc)
    """, PYTHONPATH=str(plugin_site))
    assert "no driver named 'aaa'" in proc.stdout and "aaa-broken-import" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("word", ["0", "false", "no", "off", "OFF"])
def test_plugins_autoload_off_skips_entry_points(plugin_site, word):
    proc = python("""
        import hal
        names = [d.name for d in hal.list_drivers()]
        assert "good-third-party" not in names and "local-task" in names, names
        assert hal.plugin_problems() == [], hal.plugin_problems()
    """, PYTHONPATH=str(plugin_site), HAL_PLUGINS_AUTOLOAD=word)
    assert proc.returncode == 0, proc.stderr


def test_plugins_autoload_rejects_a_word_it_does_not_know(plugin_site):
    proc = python("""
        import hal
        try:
            hal.list_drivers()
        except hal.InvalidArgumentError as exc:
            print(exc)
    """, PYTHONPATH=str(plugin_site), HAL_PLUGINS_AUTOLOAD="fasle")
    assert "HAL_PLUGINS_AUTOLOAD='fasle' is not a switch; use one of 1/0, true/false, yes/no, on/off" in proc.stdout


def test_hal_device_error_names_the_variable(monkeypatch):
    monkeypatch.setenv("HAL_DEVICE", "no-such-driver://0")
    with pytest.raises(hal.NotFoundError, match=r"^NOT_FOUND: HAL_DEVICE='no-such-driver://0': no driver named"):
        hal.create_device()
    monkeypatch.setenv("HAL_DEVICE", "local-task://9")
    with pytest.raises(hal.NotFoundError, match=r"^NOT_FOUND: HAL_DEVICE='local-task://9': driver 'local-task' has no"):
        hal.create_device()


def test_logging_is_silent_by_default_and_tells_what_happens_when_configured():
    quiet = python("""
        import hal
        hal.list_drivers()
        hal.create_device("local-task").close()
    """)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = python("""
        import logging, hal
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")
        hal.list_drivers()
        with hal.create_device("local-task") as dev:
            spec = hal.ExecutableSpec(format="numpy", code=lambda w, b, c: None, exports=[hal.Export("k")])
            dev.load_executable(spec)
            dev.load_executable(spec)
    """)
    assert loud.returncode == 0, loud.stderr
    for line in ("hal.drivers.cuda probe: ", "hal.drivers.local_task probe: available",
                 "hal.drivers.local_task creating device local-task://0",
                 "hal.drivers.local_task preparing numpy executable ['k']",
                 "hal.drivers.local_task executable cache hit: numpy ['k']"):
        assert line in loud.stderr, loud.stderr


def test_driver_probe_that_raises_is_unavailable_with_reason():
    class BrokenDriver(hal.Driver):
        name = "broken-probe"

        def _probe(self):
            raise OSError("libbroken.so: cannot open shared object file")

        def _query_devices(self):
            return []

        def _create_device(self, info, **options):
            raise AssertionError("never called")

    hal.register_driver(BrokenDriver)
    info = {d.name: d for d in hal.list_drivers()}["broken-probe"]
    assert not info.available and "libbroken.so" in info.reason
    with pytest.raises(hal.UnavailableError, match="libbroken.so"):
        hal.get_driver("broken-probe")
    assert registry.get_driver("local-task").available() == (True, None)
