"""The ``numpy`` executable format: exports are Python callables ``fn(workgroups, bindings, constants)``."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from hal.errors import InvalidArgumentError
from hal.executable import Executable, ExecutableSpec

NumpyKernel = Callable[[tuple[int, int, int], list[memoryview], list[int]], None]


class NumpyExecutable(Executable):
    def __init__(self, device, spec: ExecutableSpec) -> None:
        super().__init__(device, spec)
        code = spec.code
        if callable(code) and not isinstance(code, Mapping):
            if len(self.exports) != 1:
                raise InvalidArgumentError(
                    f"a numpy executable with {len(self.exports)} exports needs a mapping of export name to callable")
            functions = [code]
        elif isinstance(code, Mapping):
            missing = [e.name for e in self.exports if e.name not in code]
            if missing:
                raise InvalidArgumentError(f"numpy executable code has no callable for exports {missing}")
            functions = [code[e.name] for e in self.exports]
        else:
            raise InvalidArgumentError(
                f"numpy executable code must be a callable or a mapping of callables, got {type(code).__name__}")
        for export, fn in zip(self.exports, functions):
            if not callable(fn):
                raise InvalidArgumentError(f"numpy export {export.name!r} is not callable: {fn!r}")
        self.functions: list[NumpyKernel] = functions
