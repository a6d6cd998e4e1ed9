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
