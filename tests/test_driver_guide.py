"""The driver guide's promise: the ~100-line example driver passes the whole conformance suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_minimal_example_driver_passes_the_cts():
    env = {k: v for k, v in os.environ.items() if k not in ("HAL_DEVICE", "HAL_CTS_DRIVERS")}
    env.update(HAL_PLUGINS="examples.minimal_driver", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/cts",
            "--driver",
            "minimal",
            "--run-fault-tests",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary, summary
    # Collectives are optional (the example has none): their tests, and only theirs, skip saying so.
    reasons = [line for line in proc.stdout.splitlines() if re.match(r"\s*\d+ skipped: ", line)]
    assert all("has no collective operations" in line for line in reasons), reasons
    assert ("skipped" in summary) == bool(reasons), summary
    assert int(summary.split(" passed")[0].split()[-1]) >= 150, summary


# -- the guide stays true to the code ---------------------------------------------------------------

GUIDE = ROOT / "docs" / "driver-guide.md"
SHIPPED_DRIVER_MODULES = [
    "examples.minimal_driver",
    "hal.drivers.local.device",
    "hal.drivers.local.allocator",
    "hal.drivers.local.command_buffer",
    "hal.drivers.local.executable",
    "hal.drivers.local_task.driver",
    "hal.drivers.local_sync.driver",
    "hal.drivers.gpu.device",
    "hal.drivers.gpu.allocator",
    "hal.drivers.gpu.stream_command_buffer",
    "hal.drivers.gpu.graph_command_buffer",
    "hal.drivers.gpu.event_semaphore",
    "hal.drivers.gpu.executable_cache",
    "hal.drivers.cuda.driver",
]


def hook_bases() -> list[type]:
    import hal
    from hal.allocator import Allocator

    return [hal.Driver, hal.Device, Allocator, hal.CommandBuffer, hal.Semaphore]


def declared_hooks() -> dict[type, list[str]]:
    """Per abstract class: its abstract methods and the underscore methods a shipped driver overrides."""
    import importlib
    import inspect

    classes = []
    for name in SHIPPED_DRIVER_MODULES:
        module = importlib.import_module(name)
        classes += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    hooks = {}
    for base in hook_bases():
        own = [n for n, v in vars(base).items() if n.startswith("_") and not n.startswith("__") and callable(v)]
        hooks[base] = [
            n
            for n in own
            if n in getattr(base, "__abstractmethods__", ())
            or any(issubclass(c, base) and c is not base and n in vars(c) for c in classes)
        ]
    return hooks


def guide_sections() -> dict[str, str]:
    text = GUIDE.read_text()
    parts = re.split(r"^### `hal\.(\w+)`$", text, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1].split("\n## ")[0] for i in range(1, len(parts), 2)}


def test_guide_lists_every_hook_with_its_signature():
    import inspect

    sections = guide_sections()
    for base, names in declared_hooks().items():
        assert base.__name__ in sections, f"no section for hal.{base.__name__}"
        section = sections[base.__name__]
        for name in names:
            match = re.search(rf"`{name}\(([^)]*)\)`", section)
            assert match, f"docs/driver-guide.md: hal.{base.__name__} lacks hook {name}"
            documented = [p.strip() for p in match.group(1).split(",") if p.strip()]
            actual = [
                ("**" if p.kind is p.VAR_KEYWORD else "") + p.name
                for p in inspect.signature(vars(base)[name]).parameters.values()
                if p.name != "self"
            ]
            assert documented == actual, f"{base.__name__}.{name}: guide says {documented}, code has {actual}"
        required = re.findall(r"`(_\w+)\([^)]*\)` must", section)
        assert sorted(required) == sorted(getattr(base, "__abstractmethods__", ())), (base.__name__, required)


def test_guide_mentions_the_helpers_drivers_should_use():
    text = GUIDE.read_text()
    for helper in ("HostSubmissions", "FenceWaiter", "numpy_functions", "_cancel_parked", "cancel_parked"):
        assert helper in text, helper


def code_lines(path: Path) -> int:
    """Lines holding code: no blank lines, comments or docstrings."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None:
            first = node.body[0]
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip:
            lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return len(lines)


def test_example_driver_matches_the_line_count_the_guide_claims():
    example = ROOT / "examples" / "minimal_driver.py"
    claims = {int(n) for n in re.findall(r"in about (\d+) lines of code", GUIDE.read_text() + example.read_text())}
    assert len(claims) == 1, f"the guide and the example claim {claims}"
    claim = claims.pop()
    assert abs(code_lines(example) - claim) <= claim * 0.1, (code_lines(example), claim)


def test_cts_guidance_names_hooks_that_exist():
    from cts.guidance import GUIDANCE

    by_name = {base.__name__: base for base in hook_bases()}
    for module, (hooks, _) in GUIDANCE.items():
        assert (ROOT / "tests" / "cts" / f"{module}.py").exists(), module
        for hook in hooks:
            cls, _, method = hook.partition(".")
            assert method in vars(by_name[cls]), f"guidance for {module} names {hook}, which does not exist"


def test_core_checks_numpy_code_before_any_driver_hook():
    import hal
    from examples.minimal_driver import MinimalDevice, MinimalDriver

    prepared = []

    class TrustingDevice(MinimalDevice):
        def _prepare_executable(self, spec):
            prepared.append(spec)
            return super()._prepare_executable(spec)

    class TrustingDriver(MinimalDriver):
        name = "trusting"

        def _create_device(self, info, **options):
            return TrustingDevice(self, info)

    device = TrustingDriver().create_device()
    exports = [hal.Export("a"), hal.Export("b")]
    for code in (42, {"a": print}, {"a": print, "b": "not callable"}, print):
        with pytest.raises(hal.InvalidArgumentError):
            device.load_executable(hal.ExecutableSpec("numpy", code, exports))
    assert prepared == []
    device.load_executable(hal.ExecutableSpec("numpy", {"a": print, "b": print}, exports))
    assert len(prepared) == 1
    device.close()
