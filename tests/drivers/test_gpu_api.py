"""The declared GPU API: the CUDA shim and the simulated GPU implement every call of it, with
the protocol's parameters, and the GPU-generic code speaks no CUDA."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from hal.drivers.cuda.api import CudaApi
from hal.drivers.gpu.api import GpuApi, missing_members, protocol_members

from .fake_gpu import FakeGpuApi

GPU_PACKAGE = Path(__file__).resolve().parents[2] / "hal" / "drivers" / "gpu"


def parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


@pytest.mark.parametrize("shim", [CudaApi, FakeGpuApi], ids=["cuda", "fake"])
def test_shims_implement_every_call_with_its_parameters(shim):
    assert missing_members(shim) == []
    for name in protocol_members():
        declared = getattr(GpuApi, name, None)
        if not callable(declared):
            continue
        assert len(parameters(getattr(shim, name))) == len(parameters(declared)), name


def test_the_protocol_documents_every_call():
    for name in protocol_members():
        member = getattr(GpuApi, name, None)
        if callable(member):
            assert member.__doc__ and member.__doc__.strip(), f"GpuApi.{name} has no contract"


def test_the_simulated_gpu_is_a_gpu_api():
    assert isinstance(FakeGpuApi(), GpuApi)


def test_the_cuda_shim_calls_only_functions_the_bindings_have():
    driver = pytest.importorskip("cuda.bindings.driver")
    source = inspect.getsource(CudaApi)
    for name in set(re.findall(r"\bd(?:river)?\.(cu[A-Z]\w+)", source)):
        assert hasattr(driver, name), name


def test_the_generic_code_speaks_no_cuda():
    """No CUDA function names, CUDA error codes or status tuples in the code of hal/drivers/gpu."""
    for path in GPU_PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # docstrings may name the CUDA lowering as an example; code may not
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body[0].value.value = ""
        code = ast.unparse(tree)
        assert not re.search(r"\bcu[A-Z]\w+|CUDA_|CUresult|\)\[0\]", code), path.name
        if path.name != "status.py":  # where every error gets its api_code; nothing else reads it
            assert "api_code" not in code, path.name
