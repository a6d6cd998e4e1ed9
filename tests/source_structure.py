"""Reading a package's structure from its source (``ast``): what each module imports, the import
circles among modules, and reads of other objects' underscore attributes. The architecture tests of
the HAL (tests/test_architecture.py) and of the runtime (tests/runtime/test_layering.py) use these."""

from __future__ import annotations

import ast
import pathlib


def modules_of(package: pathlib.Path, root: pathlib.Path, recursive: bool = True) -> dict[str, pathlib.Path]:
    """Dotted module name (a package's for its ``__init__``) -> file, for the modules under ``package``."""
    out = {}
    for path in sorted(package.rglob("*.py") if recursive else package.glob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:`` (imports there are for type checkers only)."""
    return {id(sub) for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for sub in ast.walk(node)}


def imports_of(name: str, path: pathlib.Path) -> set[str]:
    """Modules ``path`` (module ``name``) imports anywhere but under ``if TYPE_CHECKING:``, dotted."""
    tree = ast.parse(path.read_text())
    skipped = type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_circles(modules: dict[str, pathlib.Path]) -> list[set[str]]:
    """Sets of ``modules`` (packages' ``__init__`` aside) that import each other in a loop."""
    imports = {name: imports_of(name, path) for name, path in modules.items() if path.name != "__init__.py"}
    graph = {m: [o for o in imports if o != m and o in imported] for m, imported in imports.items()}
    reach: dict[str, set[str]] = {}
    for start in graph:
        seen: set[str] = set()
        stack = list(graph[start])
        while stack:
            m = stack.pop()
            if m not in seen:
                seen.add(m)
                stack.extend(graph[m])
        reach[start] = seen
    circles: list[set[str]] = []
    for m in graph:
        circle = {o for o in reach[m] if m in reach[o]} | {m}
        if len(circle) > 1 and circle not in circles:
            circles.append(circle)
    return circles


def private_reads(paths: list[pathlib.Path], root: pathlib.Path) -> list[str]:
    """``file:line: expression`` of each read of another object's underscore attribute (``x._name``
    with ``x`` not ``self``, ``cls`` or ``super()``, nor a class calling its base's hook on itself)."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            if isinstance(owner, ast.Name) and owner.id == "Semaphore" and path.stem == "event_semaphore":
                continue  # Semaphore._advance(self, ...): the subclass calling its base's hook on itself
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found
