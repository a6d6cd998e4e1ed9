"""Environment switches: one helper, one set of words, used everywhere the project reads a switch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hal
from hal import env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("word, expected", [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("False", False), ("no", False), ("off", False),
])
def test_switch_words(monkeypatch, word, expected):
    monkeypatch.setenv("HAL_TEST_SWITCH", word)
    assert env.switch("HAL_TEST_SWITCH", not expected) is expected


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_or_blank_switch_is_the_default(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("HAL_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("HAL_TEST_SWITCH", value)
    assert env.switch("HAL_TEST_SWITCH", True) is True
    assert env.switch("HAL_TEST_SWITCH", False) is False


@pytest.mark.parametrize("word", ["2", "enable", "fasle", "y"])
def test_other_words_are_an_error_naming_the_variable(monkeypatch, word):
    monkeypatch.setenv("HAL_TEST_SWITCH", word)
    with pytest.raises(hal.InvalidArgumentError, match=f"HAL_TEST_SWITCH={word!r} is not a switch"):
        env.switch("HAL_TEST_SWITCH", True)


def test_integer_settings(monkeypatch):
    monkeypatch.setenv("HAL_TEST_INT", " 12 ")
    assert env.integer("HAL_TEST_INT", 3) == 12
    monkeypatch.setenv("HAL_TEST_INT", "twelve")
    with pytest.raises(hal.InvalidArgumentError, match="HAL_TEST_INT='twelve' is not an integer"):
        env.integer("HAL_TEST_INT", 3)
    monkeypatch.setenv("HAL_TEST_INT", "0")
    with pytest.raises(hal.InvalidArgumentError, match="HAL_TEST_INT=0 is below its minimum 1"):
        env.integer("HAL_TEST_INT", 3, minimum=1)
    monkeypatch.delenv("HAL_TEST_INT")
    assert env.integer("HAL_TEST_INT", 3) == 3


def test_runtime_switches_use_the_same_words(monkeypatch):
    from runtime.lowering import cpu_program

    # RUNTIME_GRAPH_CACHE is read at import: tests/runtime/test_graph_cache.py checks its words in a
    # fresh interpreter.
    for module, name in ((cpu_program, "RUNTIME_CPU_PROGRAM"),):
        monkeypatch.setenv(name, "no")
        assert module.enabled() is False
        monkeypatch.setenv(name, "On")
        assert module.enabled() is True
        monkeypatch.setenv(name, "nah")
        with pytest.raises(hal.InvalidArgumentError, match=name):
            module.enabled()


def test_no_module_reads_the_environment_by_itself():
    """Every environment variable goes through hal.env (tests may set variables for subprocesses)."""
    readers = re.compile(r"os\.environ\.get|os\.getenv|os\.environ\[")
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("hal", "runtime", "examples", "benchmarks")
        for path in (ROOT / package).rglob("*.py")
        if path.name != "env.py" and readers.search(path.read_text())
    ]
    assert offenders == []
