"""Lazy arrays on HAL devices: graphs recorded into reusable command buffers, autodiff, compile.

    import runtime as rt
    x = rt.array(np.ones((1024, 16), np.float32))
    y = (x @ w).sigmoid().sum(axis=0)   # lazy
    rt.eval(y); y.numpy()
"""

from __future__ import annotations

from . import random
from .array import Array
from .device import default_device, set_default_device
from .dtypes import (  # noqa: F401 - the namespace
    DType,
    bfloat16,
    bool_,
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
from .errors import (  # noqa: F401 - the namespace
    AxisError,
    InvalidIndexError,
    InvalidTypeError,
    InvalidValueError,
    ScalarOverflowError,
    TracingError,
)
from .ops import (  # noqa: F401 - the namespace
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
    sum,
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


def array(data, dtype=None, device=None) -> Array:
    """Copy host data (numpy array, scalar, nested list, DLPack object) onto a device."""
    return asarray(data, dtype=dtype, device=device)


def eval(*arrays) -> None:  # noqa: A001
    """Evaluate arrays (and nested lists/tuples/dicts of arrays): one submission per device."""
    from .lowering import evaluate
    evaluate(_flatten(arrays))


def _flatten(tree) -> list:
    out = []
    stack = [tree]
    while stack:
        x = stack.pop()
        if type(x) is Array:
            out.append(x)
        elif isinstance(x, (list, tuple)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
    return out


def graph_cache_stats(device=None) -> dict:
    """Graph cache counters: hits, misses, entries, bytes, evictions (all devices unless one is given)."""
    from .device import _contexts, context_for
    ctxs = [context_for(device)] if device is not None else list(_contexts.values())
    total = {"hits": 0, "misses": 0, "entries": 0, "bytes": 0, "evictions": 0}
    for ctx in ctxs:
        for k, v in ctx.graphs.stats().items():
            total[k] += v
    return total


def clear_graph_cache(device=None) -> None:
    from .device import _contexts, context_for
    ctxs = [context_for(device)] if device is not None else list(_contexts.values())
    for ctx in ctxs:
        ctx.graphs.clear()


def synchronize(device=None) -> None:
    """Wait until everything submitted to the device has finished."""
    from .device import context_for
    ctx = context_for(device)
    ctx.wait(ctx.submitted)
    ctx.refresh()


from .autodiff import grad, value_and_grad  # noqa: E402
from .compile import compile  # noqa: E402,A001
from .interop import from_dlpack  # noqa: E402

__all__ = [
    "Array", "DType", "abs", "absolute", "add", "arange", "argmax", "argmin", "array", "asarray", "astype",
    "bfloat16", "bool", "bool_", "broadcast_to", "clear_graph_cache", "compile", "contiguous", "default_device",
    "div", "divide", "equal", "eval", "exp", "expand_dims", "float16", "float32", "from_dlpack", "full", "grad",
    "graph_cache_stats", "greater", "greater_equal", "int32", "less", "less_equal", "log", "matmul", "max",
    "maximum", "mean", "min", "minimum", "mul", "multiply", "neg", "negative", "not_equal", "ones", "ones_like",
    "pow", "power", "random", "reshape", "set_default_device", "sigmoid", "sqrt", "squeeze", "sub", "subtract",
    "sum", "swapaxes", "synchronize", "tanh", "transpose", "true_divide", "value_and_grad", "where", "zeros",
    "zeros_like",
]
