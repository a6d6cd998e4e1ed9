"""Lazy arrays on HAL devices: graphs recorded into reusable command buffers, autodiff, compile.

    import runtime as rt
    x = rt.array(np.ones((1024, 16), np.float32))
    y = (x @ w).sigmoid().sum(axis=0)   # lazy
    rt.eval(y); y.numpy()
"""

from __future__ import annotations

from typing import Any

from hal import __version__ as __version__  # one distribution: the runtime's version is the HAL's

from . import distributed, nn, random
from . import fft as fft
from . import linalg as linalg
from .array import Array
from .array_api import (
    __array_api_version__ as __array_api_version__,
)
from .array_api import (
    __array_namespace_info__ as __array_namespace_info__,
)
from .array_api import (
    all,
    any,
    argsort,
    broadcast_arrays,
    can_cast,
    clip,
    concat,
    conj,
    count_nonzero,
    cumulative_prod,
    cumulative_sum,
    diff,
    e,
    empty,
    empty_like,
    eye,
    finfo,
    flip,
    iinfo,
    imag,
    inf,
    isdtype,
    linspace,
    matrix_transpose,
    meshgrid,
    moveaxis,
    nan,
    newaxis,
    nonzero,
    permute_dims,
    pi,
    prod,
    real,
    repeat,
    result_type,
    roll,
    searchsorted,
    sort,
    stack,
    std,
    sum,
    take,
    take_along_axis,
    tensordot,
    tile,
    tril,
    triu,
    unique_all,
    unique_counts,
    unique_inverse,
    unique_values,
    unstack,
    var,
    vecdot,
)
from .autodiff import grad, value_and_grad
from .compile import compile
from .device import DefaultDevice, context_for, contexts, default_device, set_default_device
from .dtypes import (
    DType,
    bfloat16,
    bool_,
    complex64,
    complex128,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from .errors import (
    ArrayTooLargeError,
    AxisError,
    DeviceFallbackWarning,
    InvalidIndexError,
    InvalidTypeError,
    InvalidValueError,
    ScalarOverflowError,
    TracingError,
)
from .graph import Node
from .interop import from_dlpack
from .kernels.matmul import get_float32_matmul_precision, set_float32_matmul_precision
from .lowering.evaluate import evaluate
from .ops import (
    abs,
    absolute,
    acos,
    acosh,
    add,
    arange,
    argmax,
    argmin,
    asarray,
    asin,
    asinh,
    astype,
    atan,
    atan2,
    atanh,
    bitwise_and,
    bitwise_invert,
    bitwise_or,
    bitwise_xor,
    broadcast_to,
    ceil,
    contiguous,
    copy_array,
    copysign,
    cos,
    cosh,
    div,
    divide,
    equal,
    exp,
    expand_dims,
    expm1,
    floor,
    floor_divide,
    full,
    full_like,
    greater,
    greater_equal,
    hypot,
    isfinite,
    isinf,
    isnan,
    left_shift,
    less,
    less_equal,
    log,
    log1p,
    log2,
    log10,
    logaddexp,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    mul,
    multiply,
    neg,
    negative,
    nextafter,
    not_equal,
    ones,
    ones_like,
    positive,
    pow,
    power,
    reciprocal,
    remainder,
    reshape,
    right_shift,
    round,
    sigmoid,
    sign,
    signbit,
    sin,
    sinh,
    sqrt,
    square,
    squeeze,
    sub,
    subtract,
    swapaxes,
    tan,
    tanh,
    transpose,
    true_divide,
    trunc,
    where,
    zeros,
    zeros_like,
)

bool = bool_  # noqa: A001
bitwise_left_shift = left_shift
bitwise_right_shift = right_shift
concatenate = concat

# Every public name: the op builders, the array API namespace, the dtypes, errors and utilities.
__all__ = [
    "Array", "ArrayTooLargeError", "AxisError", "DType", "DefaultDevice", "DeviceFallbackWarning",
    "InvalidIndexError", "InvalidTypeError", "InvalidValueError", "ScalarOverflowError", "TracingError", "abs",
    "absolute", "acos", "acosh", "add", "all", "any", "arange", "argmax", "argmin", "argsort", "array", "asarray",
    "asin", "asinh", "astype", "atan", "atan2", "atanh", "bfloat16", "bitwise_and", "bitwise_invert",
    "bitwise_left_shift", "bitwise_or", "bitwise_right_shift", "bitwise_xor", "bool", "bool_", "broadcast_arrays",
    "broadcast_to", "can_cast", "ceil", "clear_graph_cache", "clip", "compile", "complex128", "complex64",
    "concat", "concatenate", "conj",
    "contiguous", "copy_array", "copysign", "cos", "cosh", "count_nonzero", "cumulative_prod", "cumulative_sum",
    "default_device", "diff", "distributed", "div", "divide", "e", "empty", "empty_like", "equal", "eval", "exp",
    "expand_dims",
    "expm1", "eye", "finfo", "flip", "float16", "float32", "float64", "floor", "floor_divide", "from_dlpack", "full",
    "fft",
    "full_like", "get_float32_matmul_precision", "grad", "graph_cache_stats", "greater", "greater_equal", "hypot",
    "iinfo", "imag", "inf", "int16", "int32", "int64", "int8", "isdtype", "isfinite", "isinf", "isnan", "left_shift",
    "less", "less_equal", "linalg",
    "linspace", "log", "log10", "log1p", "log2", "logaddexp", "logical_and", "logical_not",
    "logical_or", "logical_xor", "matmul", "matrix_transpose", "max", "maximum", "mean", "meshgrid", "min",
    "minimum", "moveaxis", "mul", "multiply", "nan", "neg", "negative", "newaxis", "nextafter", "nn", "nonzero",
    "not_equal", "ones", "ones_like", "permute_dims", "pi", "positive", "pow", "power", "prod", "random", "real",
    "reciprocal", "remainder", "repeat", "reshape", "result_type", "right_shift", "roll", "round", "searchsorted",
    "set_default_device", "set_float32_matmul_precision", "sigmoid", "sign", "signbit", "sin", "sinh", "sort",
    "sqrt", "square", "squeeze", "stack", "std", "sub", "subtract", "sum", "swapaxes", "synchronize", "take",
    "take_along_axis", "tan", "tanh", "tensordot", "tile", "transpose", "tril", "triu", "true_divide", "trunc",
    "uint16", "uint32", "uint64", "uint8", "unique_all", "unique_counts", "unique_inverse", "unique_values",
    "unstack", "value_and_grad", "var", "vecdot", "where", "zeros", "zeros_like",
]


def array(data: Any, dtype: Any = None, device: Any = None) -> Array:
    """Copy host data (numpy array, scalar, nested list, DLPack object) onto a device."""
    return asarray(data, dtype=dtype, device=device)


def eval(*arrays: Any) -> None:  # noqa: A001
    """Evaluate arrays (and nested lists/tuples/dicts of arrays): one command buffer per device, handed
    to the device at once, or, while earlier work may still run there, queued and handed over with
    the next submission (several to one: ``RUNTIME_SUBMIT_BATCH``, and work moving at most
    ``RUNTIME_SUBMIT_BATCH_BYTES``) or by any read of or wait for it."""
    for x in arrays:
        if not isinstance(x, Node):  # containers: flattened (arrays alone, the usual call, need not be)
            evaluate(_flatten(arrays))
            return
    evaluate(arrays)


def _flatten(tree: Any) -> list:
    out = []
    pending = [tree]
    while pending:
        x = pending.pop()
        if isinstance(x, Node):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            pending.extend(reversed(x))
        elif isinstance(x, dict):
            pending.extend(reversed(list(x.values())))
    return out


def graph_cache_stats(device: Any = None) -> dict:
    """Graph cache counters: hits, misses, entries, bytes, evictions (all devices unless one is given)."""
    ctxs = [context_for(device)] if device is not None else contexts()
    total = {"hits": 0, "misses": 0, "entries": 0, "bytes": 0, "evictions": 0}
    for ctx in ctxs:
        for k, v in ctx.graphs.stats().items():
            total[k] += v
    return total


def clear_graph_cache(device: Any = None) -> None:
    """Drop the recordings of every graph (of one device, if given)."""
    ctxs = [context_for(device)] if device is not None else contexts()
    for ctx in ctxs:
        # Under the lock an evaluation holds from its cache pick to its submission: a recording it
        # picked is not dropped under it (it raised "this computation's recording was released").
        with ctx.lock:
            ctx.graphs.clear()


def synchronize(device: Any = None) -> None:
    """Wait until everything submitted to the device has finished."""
    ctx = context_for(device)
    ctx.wait(ctx.submitted)
    ctx.refresh()
