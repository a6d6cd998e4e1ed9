"""The ``numpy`` executable format on the CPU drivers: exports are callables ``fn(workgroups, bindings, constants)``."""

from __future__ import annotations

from hal.executable import Executable, ExecutableSpec, NumpyKernel, numpy_functions


class NumpyExecutable(Executable):
    def __init__(self, device, spec: ExecutableSpec) -> None:
        super().__init__(device, spec)
        self.functions: list[NumpyKernel] = numpy_functions(spec)  # validated by the core's load_executable
