"""The examples run as documented, validate their arguments and say what each flag does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def example(name: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_PLUGINS")}
    full_env.update(env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, f"examples/{name}.py", *argv], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, timeout=300)


def test_logistic_regression_learns_on_local_task():
    proc = example("logistic_regression", "--samples", "512", "--features", "16", "--steps", "30",
                   "--print-every", "10", "--device", "local-task")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step")] == ["10", "20", "30"]
    accuracy = float(next(line for line in proc.stdout.splitlines() if line.startswith("accuracy")).split()[1])
    assert accuracy > 0.9


def test_custom_kernel_and_list_devices_run():
    proc = example("custom_kernel", "--n", "1000", "--device", "local-sync")
    assert proc.returncode == 0 and "-> OK" in proc.stdout, proc.stdout + proc.stderr
    proc = example("list_devices")
    assert proc.returncode == 0 and "local-task: local-task://0" in proc.stdout, proc.stdout + proc.stderr


def test_distributed_allreduce_on_cpu_devices_of_one_process():
    proc = example("distributed_allreduce", "--local", "3", "--driver", "local-task", "--n", "1000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("expected 6) -> OK") == 3


@pytest.mark.parametrize("name, argv, message", [
    ("logistic_regression", ["--steps", "-5"], "--steps must be at least 1, got -5"),
    ("logistic_regression", ["--steps", "0"], "--steps must be at least 1, got 0"),
    ("logistic_regression", ["--print-every", "0"], "--print-every must be at least 1, got 0"),
    ("logistic_regression", ["--samples", "0"], "--samples must be at least 1, got 0"),
    ("logistic_regression", ["--features", "-1"], "--features must be at least 1, got -1"),
    ("logistic_regression", ["--lr", "nan"], "--lr must be a positive number, got nan"),
    ("logistic_regression", ["--lr", "-1"], "--lr must be a positive number, got -1.0"),
    ("logistic_regression", ["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    ("custom_kernel", ["--n", "0"], "--n must be at least 1, got 0"),
])
def test_bad_arguments_are_usage_errors(name, argv, message):
    proc = example(name, *argv)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines()[-1].endswith(f"error: {message}")


@pytest.mark.parametrize("name", ["logistic_regression", "custom_kernel"])
def test_unknown_device_is_one_line_naming_its_origin(name):
    proc = example(name, "--device", "no-such-driver://0")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"{name}.py: --device 'no-such-driver://0': NOT_FOUND: no driver named")
    proc = example(name, HAL_DEVICE="local-task://5")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"{name}.py: NOT_FOUND: HAL_DEVICE='local-task://5': driver 'local-task' has no")


@pytest.mark.parametrize("name", ["logistic_regression", "custom_kernel"])
def test_every_flag_has_help_with_its_default(name):
    proc = example(name, "--help")
    assert proc.returncode == 0
    options = proc.stdout.split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", options)[1:]
    for entry in entries:
        if entry.startswith("-h"):
            continue
        assert "default: " in " ".join(entry.split()), entry


@pytest.mark.parametrize("symmetric", [[], ["--symmetric-mb", "1"]])
def test_data_parallel_mlp_on_cpu_devices_of_one_process(symmetric):
    proc = example("data_parallel_mlp", "--driver", "local-task", "--local", "3", "--small", "--steps", "3",
                   "--batch", "16", *symmetric)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "on 3 ranks" in proc.stdout and "ranks identical: True -> OK" in proc.stdout
