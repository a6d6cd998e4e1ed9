"""The HAL's structure, checked on its source: no import circles among the GPU-generic modules, the
core's no larger than the one between executables and library routines, and no code reading another
object's underscore attributes (``x._name`` with ``x`` not ``self``, ``cls`` or ``super()``)."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _module_name(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Modules ``path`` imports (anywhere but under ``if TYPE_CHECKING:``), as dotted names."""
    tree = ast.parse(path.read_text())
    skipped = {id(sub) for node in ast.walk(tree)
               if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}
    package = _module_name(path).rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_circles(folder: pathlib.Path) -> list[set[str]]:
    """Sets of modules of ``folder`` (its package ``__init__`` aside) that import each other in a loop."""
    modules = {_module_name(p): _imports(p) for p in folder.glob("*.py") if p.name != "__init__.py"}
    graph = {m: [o for o in modules if o != m and o in imported] for m, imported in modules.items()}
    reach = {m: _reachable(graph, m) for m in graph}
    circles: list[set[str]] = []
    for m in graph:
        circle = {o for o in reach[m] if m in reach[o]} | {m}
        if len(circle) > 1 and circle not in circles:
            circles.append(circle)
    return circles


def _reachable(graph: dict[str, list[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = list(graph[start])
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph[node])
    return seen


def private_reads(folder: pathlib.Path) -> list[str]:
    """``file:line: expression`` of each read of another object's underscore attribute under ``folder``."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if isinstance(owner, ast.Name) and path.stem in ("event_semaphore",) and owner.id == "Semaphore":
                continue  # a subclass calling its base's hook on itself (Semaphore._advance(self, ...))
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_import_circles_among_the_gpu_generic_modules():
    assert import_circles(ROOT / "hal" / "drivers" / "gpu") == []


def test_the_core_has_one_small_import_circle_at_most():
    circles = import_circles(ROOT / "hal")
    assert sum(len(circle) for circle in circles) <= 2, circles


def test_the_hal_reads_no_other_objects_underscore_attributes():
    reads = private_reads(ROOT / "hal")
    assert len(reads) <= 5, "\n".join(reads)
