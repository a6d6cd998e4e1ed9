"""The runtime's structure, checked on its source (``ast``), and its public types, checked by mypy.

- no import circle among the runtime's modules (imports under ``if TYPE_CHECKING:`` aside): the graph
  (node fields, storage, device context) at the bottom, the op builders above it, the lowering above
  those, ``Array`` and ``rt.compile`` at the top;
- at most 5 reads of another object's underscore attributes (``x._name``, ``x`` not ``self``/``cls``);
- ``Array``'s operators and methods are declared in array.py only: no module assigns to them;
- no import statement runs inside a function (an optional third-party module under
  ``try: ... except ImportError`` aside);
- ``runtime.__all__`` is a literal list;
- a type checker reads the public hints: ``x + 1`` is an Array, ``rt.zeros``, ``rt.sum`` and
  ``rt.compile`` are exported in strict mode.
"""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys
import textwrap

import pytest

import runtime as rt

PACKAGE = pathlib.Path(rt.__file__).resolve().parent
ROOT = PACKAGE.parent


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests/: the shared source readers
from source_structure import import_circles as _circles  # noqa: E402
from source_structure import imports_of as _imports  # noqa: E402
from source_structure import modules_of  # noqa: E402
from source_structure import private_reads as _private_reads  # noqa: E402
from source_structure import type_checking_nodes as _type_checking_nodes  # noqa: E402


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name (a package's for its ``__init__``) -> file."""
    return modules_of(PACKAGE, ROOT)


def import_circles() -> list[set[str]]:
    """Sets of runtime modules (packages' ``__init__`` aside) that import each other in a loop."""
    return _circles(_modules())


def private_reads() -> list[str]:
    """``file:line: expression`` of each use of another object's underscore attribute."""
    return _private_reads(list(_modules().values()), ROOT)


def test_the_runtime_has_no_import_circle():
    assert import_circles() == []


def test_the_layers_import_downwards_only():
    """The bottom (the graph: nodes, storage, device context) imports no op builder, lowering or Array;
    the op builders import no lowering and no Array; only array.py, compile.py and the package import Array."""
    modules = {name: _imports(name, path) for name, path in _modules().items()}
    bottom = ("runtime.graph", "runtime.device", "runtime.buffer_cache", "runtime.graph_cache", "runtime.dtypes",
              "runtime.shapes", "runtime.errors")
    above_bottom = ("runtime.ops", "runtime.autodiff", "runtime.array_api", "runtime.indexing", "runtime.lowering",
                    "runtime.array", "runtime.compile")
    for name in bottom:
        assert not any(m.startswith(above_bottom) for m in modules[name]), name
    for name in ("runtime.ops", "runtime.autodiff", "runtime.array_api", "runtime.indexing", "runtime.random"):
        assert not any(m.startswith(("runtime.lowering", "runtime.array.", "runtime.compile")) or m == "runtime.array"
                       for m in modules[name]), name
    importers = sorted(name for name, imported in modules.items() if "runtime.array.Array" in imported)
    assert importers == ["runtime", "runtime.compile"], importers


def test_few_reads_of_other_objects_underscore_attributes():
    reads = private_reads()
    assert len(reads) <= 5, "\n".join(reads)


def test_array_methods_are_declared_in_array_py_only():
    patched = []
    for name, path in _modules().items():
        if name == "runtime.array":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                        target.value.id in ("Array", "A", "Node"):
                    patched.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(target)}")
    for path in _modules().values():  # setattr(Array, ...) anywhere
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in ("Array", "Node"):
                patched.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert patched == []


def test_no_imports_inside_functions():
    """Imports run once, at the top of a module (an optional third-party import under ``try`` aside)."""
    found = []
    for path in _modules().values():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_nodes(tree)
        optional = {id(sub) for node in ast.walk(tree) if isinstance(node, ast.Try) and any(
            "ImportError" in ast.unparse(h.type) for h in node.handlers if h.type is not None)
            for stmt in node.body for sub in ast.walk(stmt)}
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skipped | optional:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_all_is_a_literal_list_of_the_public_names():
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    assigned = [node for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)]
    assert len(assigned) == 1
    value = assigned[0].value
    assert isinstance(value, ast.List) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                               for e in value.elts)
    names = [e.value for e in value.elts]
    assert len(names) == len(set(names))
    assert all(hasattr(rt, name) for name in names)
    assert {"Array", "zeros", "sum", "compile", "eval", "grad", "random", "float32"} <= set(names)


SNIPPET = """
    import numpy as np

    import runtime as rt

    x = rt.array(np.ones(3, np.float32))
    reveal_type(x + 1)
    reveal_type(1.0 * x)
    reveal_type((x @ x).sum(axis=0))
    reveal_type(rt.zeros((3,)))
    reveal_type(rt.sum(x))
    reveal_type(rt.exp(x) - x[0])


    def double(w: rt.Array) -> rt.Array:
        return w * 2


    step = rt.compile(double)
    reveal_type(step(x))
    reveal_type(step.stats["calls"])
    reveal_type(rt.grad(double)(x))
"""


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (the test extra has it)")
def test_mypy_reads_the_public_types(tmp_path: pathlib.Path):
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(SNIPPET))
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--cache-dir", str(tmp_path),
                           str(snippet)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    revealed = [line.split("Revealed type is ", 1)[1].strip('"') for line in done.stdout.splitlines()
                if "Revealed type is" in line]
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == [], done.stdout
    assert revealed == ["runtime.array.Array"] * 7 + ["int", "Any"], done.stdout
