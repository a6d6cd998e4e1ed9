"""Shared helpers of the runtime tests."""

from __future__ import annotations

import numpy as np

import hal
import runtime as rt


def runtime_devices() -> list[str]:
    available = {info.name for info in hal.list_drivers() if info.available}
    return [name for name in ("local-sync", "local-task", "cuda") if name in available]


DEVICES = runtime_devices()


def rand(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    """Random host data of a runtime dtype's numpy type, kept in ranges every op is defined on."""
    if dtype in ("bool", rt.bool_):
        return rng.random(shape) > 0.5
    if dtype in ("int32", rt.int32):
        return rng.integers(-5, 6, size=shape).astype(np.int32)
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype in ("float16", rt.float16):
        return x.astype(np.float16)
    return x


TOL = {"float32": (1e-5, 1e-5), "float16": (2e-3, 2e-3), "bfloat16": (2e-2, 2e-2), "int32": (0, 0), "bool": (0, 0)}
