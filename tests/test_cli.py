"""The ``hal`` command line: listing, dumping, JSON and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hal import cli

ROOT = Path(__file__).resolve().parent.parent


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_list_drivers_text_names_every_driver(capsys):
    code, out, _ = run_cli(capsys, "--list-drivers")
    assert code == 0
    for name in ("local-task", "local-sync"):
        assert name in out
    assert "[available]" in out


def test_list_drivers_json_has_reasons_for_unavailable(capsys):
    code, out, _ = run_cli(capsys, "--list-drivers", "--json")
    assert code == 0
    drivers = json.loads(out)
    names = [d["name"] for d in drivers]
    assert {"local-task", "local-sync"} <= set(names)
    for entry in drivers:
        assert set(entry) == {"name", "summary", "available", "reason"}
        assert entry["available"] == (entry["reason"] is None)


def test_dump_devices_json_is_valid_and_describes_local_devices(capsys):
    code, out, _ = run_cli(capsys, "--dump-devices", "--json")
    assert code == 0
    document = json.loads(out)
    by_driver = {d["driver"]: d for d in document["devices"]}
    assert {"local-task", "local-sync"} <= set(by_driver)
    device = by_driver["local-task"]
    assert device["uri"] == "local-task://0"
    assert device["properties"]["memory_total"] > 0
    for entry in document["unavailable_drivers"]:
        assert entry["reason"]


def test_dump_devices_for_one_driver(capsys):
    code, out, _ = run_cli(capsys, "--dump-devices", "--driver", "local-sync")
    assert code == 0
    assert "local-sync://0" in out and "local-task://0" not in out
    assert "memory_total" in out


def test_unknown_driver_exits_nonzero_with_known_names(capsys):
    code, _, err = run_cli(capsys, "--dump-devices", "--driver", "no-such-driver")
    assert code == cli.EXIT_ERROR
    assert "no-such-driver" in err and "local-task" in err


def test_unavailable_driver_exits_with_unavailable_code(capsys):
    unavailable = [d for d in __import__("hal").list_drivers() if not d.available]
    if not unavailable:
        pytest.skip("every driver is available on this machine")
    code, _, err = run_cli(capsys, "--dump-devices", "--driver", unavailable[0].name)
    assert code == cli.EXIT_UNAVAILABLE
    assert unavailable[0].reason in err


def test_requires_an_action():
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2


def test_python_dash_m_hal_runs_the_same_cli():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "hal", "--dump-devices", "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert any(d["driver"] == "local-task" for d in json.loads(proc.stdout)["devices"])


def run_hal(*argv: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS")}
    full_env.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "hal", *argv], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=120)


def test_version_is_the_package_version(capsys):
    import importlib.metadata

    import hal
    import runtime

    assert hal.__version__ == importlib.metadata.version("hal-gpu") == runtime.__version__
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"hal (hal-gpu) {hal.__version__}"


@pytest.mark.parametrize("argv", [["--bogus"], ["--list-drivers", "--bogus"], ["--list-drivers", "extra"]])
def test_unknown_arguments_are_reported_as_unrecognized(capsys, argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == cli.EXIT_USAGE
    assert f"unrecognized arguments: {argv[-1]}" in capsys.readouterr().err


def test_conflicting_actions_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--list-drivers", "--dump-devices"])
    assert info.value.code == cli.EXIT_USAGE
    assert "not allowed with argument" in capsys.readouterr().err


def test_help_documents_exit_codes(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code in (cli.EXIT_OK, cli.EXIT_ERROR, cli.EXIT_USAGE, cli.EXIT_UNAVAILABLE):
        assert f"\n  {code}  " in out


def test_list_drivers_with_driver_filters(capsys):
    code, out, _ = run_cli(capsys, "--list-drivers", "--driver", "local-sync", "--json")
    assert code == 0
    assert [d["name"] for d in json.loads(out)] == ["local-sync"]
    code, out, _ = run_cli(capsys, "--list-drivers", "--driver", "local-sync")
    assert code == 0 and out.startswith("local-sync") and "local-task" not in out


def test_list_drivers_with_unknown_driver_is_an_error(capsys):
    code, out, err = run_cli(capsys, "--list-drivers", "--driver", "no-such-driver")
    assert code == cli.EXIT_ERROR and out == ""
    assert err.strip() == ("hal: NOT_FOUND: no driver named 'no-such-driver'; known drivers: "
                           + ", ".join(d.name for d in __import__("hal").list_drivers()))


@pytest.mark.parametrize("reader", ["head -c 1", "true"])  # `true` closes the pipe before hal writes
def test_json_piped_into_a_reader_that_stops_ends_quietly(reader):
    proc = subprocess.run(
        f"{sys.executable} -m hal --dump-devices --json | {reader}; echo \" exit=${{PIPESTATUS[0]}}\"",
        shell=True, capture_output=True, text=True, executable="/bin/bash",
        env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=120)
    assert proc.stdout == ("{" if reader.startswith("head") else "") + " exit=0\n"
    assert proc.stderr == ""


def test_plugin_problems_are_shown_by_list_drivers():
    proc = run_hal("--list-drivers", HAL_PLUGINS="no_such_plugin_module")
    assert proc.returncode == 0
    assert "local-task" in proc.stdout
    assert proc.stderr.strip().startswith("hal: plugin HAL_PLUGINS module 'no_such_plugin_module': cannot import")


@pytest.mark.parametrize("action", ["--list-drivers", "--dump-devices"])
@pytest.mark.parametrize(("redirect", "message"), [(">&-", "hal: standard output is closed"),
                                                  ("> /dev/full", "hal: cannot write the output: No space left")])
def test_an_output_that_cannot_be_written_is_one_line_and_an_error(action, redirect, message):
    if redirect.endswith("/dev/full") and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    proc = subprocess.run(f"{sys.executable} -m hal {action} --json {redirect}", shell=True, capture_output=True,
                          text=True, executable="/bin/bash", env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
                          timeout=120)
    assert proc.returncode == cli.EXIT_ERROR
    assert proc.stderr.strip() == message or proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("uri", ["local-sync://0", "local-sync://cpu0", "local-sync://", "local-sync:0"])
def test_driver_takes_a_device_uri(capsys, uri):
    code, out, _ = run_cli(capsys, "--dump-devices", "--driver", uri)
    assert code == 0 and "local-sync://0" in out and "local-task" not in out
    code, out, _ = run_cli(capsys, "--list-drivers", "--driver", uri)
    assert code == 0 and out.startswith("local-sync")


def test_driver_uri_of_a_missing_device_is_not_found(capsys):
    code, out, err = run_cli(capsys, "--dump-devices", "--driver", "local-sync://7")
    assert code == cli.EXIT_ERROR and out == ""
    assert err.strip() == "hal: NOT_FOUND: driver 'local-sync' has no device '7'"
    for key in ("\u00b2", "\u0966"):  # a superscript two (int() refused it: a traceback), a Devanagari zero
        code, out, err = run_cli(capsys, "--dump-devices", "--driver", f"local-sync://{key}")
        assert code == cli.EXIT_ERROR and out == ""
        assert err.strip() == f"hal: NOT_FOUND: driver 'local-sync' has no device {key!r}"
