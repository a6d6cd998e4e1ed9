"""The modules a GPU device has loaded and not unloaded yet.

An executable's modules are unloaded when it is collected (its finalizer calls ``unload`` with
its list, on whatever thread the collector runs); the device's close, or its finalizer when it is
dropped without close, unloads the rest (``unload_all``). The registry holds the context, not the
device: an executable's finalizer that held the device would keep it alive for as long as the
device's own cache holds the executable, which is for ever.
"""

from __future__ import annotations

import threading
from typing import Any

from hal.drivers.gpu.context import GpuContext


class LoadedModules:
    def __init__(self, context: GpuContext) -> None:
        self.context = context
        self._modules: dict[int, Any] = {}
        self._lock = threading.RLock()  # (re-entrant: a finalizer may run while it is held)

    def __len__(self) -> int:
        return len(self._modules)

    def register(self, module: Any) -> None:
        """Note a loaded module: unloaded by ``unload`` or, at the latest, by ``unload_all``."""
        with self._lock:
            self._modules[id(module)] = module

    def unload(self, modules: list[Any]) -> None:
        """Unload the modules of a collected executable (its finalizer, on any thread); those
        ``unload_all`` unloaded already are skipped."""
        with self._lock:
            loaded = [m for m in modules if self._modules.pop(id(m), None) is not None]
        modules.clear()
        context = self.context
        for module in loaded:
            context.release_later(context.api.module_unload, module)

    def unload_all(self) -> None:
        """Unload every module still loaded (the device's close); a failure skips that module (a
        lost context frees them itself)."""
        with self._lock:
            modules = list(self._modules.values())
            self._modules.clear()
        unload = self.context.api.module_unload
        for module in modules:
            try:
                unload(module)
            except Exception:
                pass
