"""PyTorch's side of ``workload_bench.py``: the baselines, eager and torch.compile, on the same GPU in
the same process. Everything here runs only where torch with CUDA is importable.
"""

from __future__ import annotations

import numpy as np
from workload_timing import Contender


def load(on_gpu: bool):
    """(torch or None, what the report says about it). The float32 products are IEEE float32 on
    both sides: TF32 is off for PyTorch here, as it is by default for the runtime."""
    if not on_gpu:
        return None, {"status": "not used (a CPU driver's baseline is numpy; --no-torch)"}
    try:
        import torch
    except ImportError as exc:
        return None, {"status": f"absent: {exc}"}
    if not torch.cuda.is_available():
        return None, {"status": "no CUDA device for torch", "version": torch.__version__}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch, {"status": "ok", "version": torch.__version__, "cuda": torch.version.cuda,
                   "device": torch.cuda.get_device_name(), "float32_matmul_precision": "highest",
                   "allow_tf32": torch.backends.cuda.matmul.allow_tf32}


def tensor(torch, host: np.ndarray, dtype: str = "float32", requires_grad: bool = False):
    t = torch.from_numpy(np.ascontiguousarray(host)).to("cuda").to(getattr(torch, dtype))
    return t.requires_grad_(requires_grad)


def to_numpy(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def compiled(torch, fn):
    """torch.compile in its default mode; static shapes, so that a function compiled for several
    shapes (the matmul cases share one) keeps a specialised kernel for each."""
    return torch.compile(fn, dynamic=False)


def contender(torch, fn, args: list) -> Contender:
    def run(count: int) -> None:
        for _ in range(count):
            fn(*args)

    return Contender(run, torch.cuda.synchronize)


def case_contenders(torch, fn, args: list, with_compile: bool) -> dict[str, Contender]:
    out = {"torch_eager": contender(torch, fn, args)}
    if with_compile:
        out["torch_compile"] = contender(torch, compiled(torch, fn), args)
    return out
