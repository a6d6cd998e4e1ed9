"""Executables: compiled kernels with named exports, and the specs they are made from."""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hal.checks import check_int
from hal.errors import InvalidArgumentError
from hal.pickling import not_picklable

if TYPE_CHECKING:
    from hal.device import Device


@dataclasses.dataclass(frozen=True)
class Export:
    """One entry point: its name, workgroup (block) size, and how many bindings and uint32 constants it takes."""

    name: str
    workgroup_size: tuple[int, int, int] = (1, 1, 1)
    bindings: int = 0
    constants: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise InvalidArgumentError(f"export name must be an identifier, got {self.name!r}")
        size = self.workgroup_size
        if isinstance(size, int):
            size = (size,)
        if not isinstance(size, Sequence) or not 1 <= len(size) <= 3:
            raise InvalidArgumentError(f"export {self.name!r}: workgroup_size must be 1-3 ints, got {size!r}")
        size = tuple(check_int(s, f"export {self.name!r} workgroup_size", minimum=1) for s in size)
        object.__setattr__(self, "workgroup_size", size + (1,) * (3 - len(size)))
        object.__setattr__(self, "bindings", check_int(self.bindings, f"export {self.name!r} bindings"))
        object.__setattr__(self, "constants", check_int(self.constants, f"export {self.name!r} constants"))


@dataclasses.dataclass(frozen=True, eq=False)
class ExecutableSpec:
    """What to load: a format (``cuda-c``, ``ptx``, ``cubin``, ``hip-c``, ``hsaco``, ``numpy``),
    its code and exports."""

    format: str
    code: Any
    exports: Sequence[Export]
    options: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.format, str) or not self.format:
            raise InvalidArgumentError(f"executable format must be a non-empty string, got {self.format!r}")
        exports = tuple(self.exports) if isinstance(self.exports, Sequence) else None
        if not exports or not all(isinstance(e, Export) for e in exports):
            raise InvalidArgumentError(
                f"executable exports must be a non-empty sequence of hal.Export, got {self.exports!r}")
        names = [e.name for e in exports]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"executable export names must be unique, got {names}")
        object.__setattr__(self, "exports", exports)
        if self.options is not None and not isinstance(self.options, Mapping):
            raise InvalidArgumentError(f"executable options must be a mapping, got {self.options!r}")

    def cache_key(self) -> tuple:
        """Content key: equal specs share one executable; callables key by identity."""
        code = self.code
        if isinstance(code, str):
            code_key: object = hashlib.sha256(code.encode()).hexdigest()
        elif isinstance(code, (bytes, bytearray, memoryview)):
            code_key = hashlib.sha256(bytes(code)).hexdigest()
        elif isinstance(code, Mapping) and self.format == "library":  # routines are values
            code_key = tuple(sorted((str(k), v) for k, v in code.items()))
        elif isinstance(code, Mapping):
            code_key = tuple(sorted((str(k), id(v)) for k, v in code.items()))
        else:
            code_key = id(code)
        options = self.options or {}
        try:
            options_key: object = hashlib.sha256(pickle.dumps(sorted(options.items()))).hexdigest()
        except Exception:  # unpicklable option values: fall back to identity
            options_key = id(self.options)
        return (self.format, code_key, self.exports, options_key)


class Executable:
    """A loaded executable; drivers subclass it to hold their module/function handles."""

    __reduce_ex__ = not_picklable("a hal.Executable", "load its ExecutableSpec again in the other process")

    def __init__(self, device: Device, spec: ExecutableSpec) -> None:
        self.device = device
        self.format = spec.format
        self.exports: tuple[Export, ...] = tuple(spec.exports)
        self._index = {export.name: i for i, export in enumerate(self.exports)}
        #: Per export, the library routine it stands for (``hal.library``); None for kernels.
        self.routines: tuple[Routine, ...] | None = routines_of(spec) if spec.format == "library" else None

    def export(self, name_or_index: str | int) -> tuple[int, Export]:
        """(ordinal, Export) for an export name or ordinal; InvalidArgumentError if unknown."""
        if isinstance(name_or_index, str):
            index = self._index.get(name_or_index)
            if index is None:
                raise InvalidArgumentError(
                    f"executable has no export {name_or_index!r}; exports: {sorted(self._index)}")
            return index, self.exports[index]
        name_or_index = check_int(name_or_index, "dispatch export ordinal")
        if not 0 <= name_or_index < len(self.exports):
            raise InvalidArgumentError(
                f"export ordinal {name_or_index} out of range for {len(self.exports)} exports")
        return name_or_index, self.exports[name_or_index]

    def __repr__(self) -> str:
        return f"<hal.Executable {self.format} exports={[e.name for e in self.exports]}>"




#: A ``numpy``-format kernel: ``fn(workgroups, bindings, constants)``, bindings as writable byte views.
NumpyKernel = Callable[[tuple[int, int, int], list[memoryview], list[int]], None]


def numpy_functions(spec: ExecutableSpec) -> list[NumpyKernel]:
    """The ``numpy`` format's callables in export order; InvalidArgumentError when the code does not fit.

    ``code`` is one callable (a single export) or a mapping of export name to callable.
    ``Device.load_executable`` checks this before a driver sees the spec; a driver calls it to get
    the functions (the check has one home, here).
    """
    code = spec.code
    if callable(code) and not isinstance(code, Mapping):
        if len(spec.exports) != 1:
            raise InvalidArgumentError(
                f"a numpy executable with {len(spec.exports)} exports needs a mapping of export name to callable")
        functions = [code]
    elif isinstance(code, Mapping):
        missing = [e.name for e in spec.exports if e.name not in code]
        if missing:
            raise InvalidArgumentError(f"numpy executable code has no callable for exports {missing}")
        functions = [code[e.name] for e in spec.exports]
    else:
        raise InvalidArgumentError(
            f"numpy executable code must be a callable or a mapping of callables, got {type(code).__name__}")
    for export, fn in zip(spec.exports, functions):
        if not callable(fn):
            raise InvalidArgumentError(f"numpy export {export.name!r} is not callable: {fn!r}")
    return functions


from hal.library import Routine, routines_of  # noqa: E402
