"""The runtime's C code, ``runtime._native``, where it was built and ``HAL_NATIVE`` allows it.

It holds the Python each op and each eval runs, in C: the eager graph key walk
(``lowering.collect_key`` with ``live_mask``), the node constructors (``array.new_node`` /
``new_view``), the usual cases of binary and unary ops (``ops._binary`` / ``_unary``), the usual
choice and submission of a recording that ran before (``Variants.pick``, ``lowering.submit``, set
up there with ``setup_submit``), ``lowering.attach``, an eval the graph cache holds from the call to
its results' storages (``evaluate``, ``eval_arrays``, set up with ``setup_evaluate``),
``Storage.__del__`` and ``DeviceContext.wait`` (method descriptors set over the Python methods by
``lowering``), and the destructor of DLPack capsules (``interop``). It is built at install where a
C compiler is (``setup.py``); the Python code serves otherwise and with ``HAL_NATIVE=0``, and
``HAL_NATIVE=1`` makes a missing one an error.
"""

from __future__ import annotations

from types import ModuleType

from hal.drivers.native_calls import optional


def load(array_type: type, placeholder_op: str, storage_type: type) -> ModuleType | None:
    """``runtime._native`` set up for ``array_type`` and ``storage_type`` (__slots__ classes), or None."""
    def make() -> ModuleType:
        from . import _native

        _native.setup(array_type, placeholder_op)
        _native.setup_storage(storage_type)
        return _native

    return optional("the runtime's C code", make, (ImportError, TypeError))
