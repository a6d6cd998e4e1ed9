"""Executables on the CPU drivers: exports are callables ``fn(workgroups, bindings, constants)``.

The ``numpy`` format gives them as its code; a ``library`` executable's routines run their numpy
reference (``hal.library``), which uses numpy's BLAS for products.
"""

from __future__ import annotations

from hal.executable import Executable, ExecutableSpec, NumpyKernel, numpy_functions


class NumpyExecutable(Executable):
    def __init__(self, device, spec: ExecutableSpec) -> None:
        super().__init__(device, spec)
        if self.routines is not None:
            self.functions: list[NumpyKernel] = [routine.reference() for routine in self.routines]
        else:
            self.functions = numpy_functions(spec)  # validated by the core's load_executable
