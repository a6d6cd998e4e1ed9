"""Lazy arrays on HAL devices: graphs recorded into reusable command buffers, autodiff, compile.

    import runtime as rt
    x = rt.array(np.ones((1024, 16), np.float32))
    y = (x @ w).sigmoid().sum(axis=0)   # lazy
    rt.eval(y); y.numpy()
"""

from __future__ import annotations

from hal import __version__  # noqa: F401 - one distribution: the runtime's version is the HAL's

from . import random
from .array import Array
from .device import DefaultDevice, default_device, set_default_device  # noqa: F401
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
    ArrayTooLargeError,
    AxisError,
    DeviceFallbackWarning,
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


def array(data, dtype=None, device=None) -> Array:
    """Copy host data (numpy array, scalar, nested list, DLPack object) onto a device."""
    return asarray(data, dtype=dtype, device=device)


def eval(*arrays) -> None:  # noqa: A001
    """Evaluate arrays (and nested lists/tuples/dicts of arrays): one submission per device."""
    for x in arrays:
        if type(x) is not Array:  # containers: flattened (arrays alone, the usual call, need not be)
            _evaluate(_flatten(arrays))
            return
    _evaluate(arrays)


def _flatten(tree) -> list:
    out = []
    pending = [tree]
    while pending:
        x = pending.pop()
        if type(x) is Array:
            out.append(x)
        elif isinstance(x, (list, tuple)):
            pending.extend(reversed(x))
        elif isinstance(x, dict):
            pending.extend(reversed(list(x.values())))
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


from .array_api import (  # noqa: E402,F401 - the array API namespace
    __array_api_version__,
    __array_namespace_info__,
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

concatenate = concat
from .autodiff import grad, value_and_grad  # noqa: E402,F401
from .compile import compile  # noqa: E402,A001,F401
from .interop import from_dlpack  # noqa: E402,F401
from .kernels.matmul import get_float32_matmul_precision, set_float32_matmul_precision  # noqa: E402,F401
from .lowering import evaluate as _evaluate  # noqa: E402 - rt.eval's (lowering needs the modules above)

# Every public name: the op builders, the array API namespace, the dtypes, errors and utilities.
__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not (isinstance(value, type(random)) and name != "random")
                 and name not in ("annotations",))


def _install_methods() -> None:
    """Array methods that build on the namespace functions, and numpy's dispatch protocols."""
    from . import array_api as xp
    from .indexing import getitem
    from .numpy_protocols import array_function, array_ufunc

    A = Array
    A.__getitem__ = getitem
    A.__array_ufunc__ = array_ufunc
    A.__array_function__ = array_function
    A.copy = copy_array
    A.std = lambda s, axis=None, ddof=0, keepdims=False: xp.std(s, axis=axis, correction=ddof, keepdims=keepdims)
    A.var = lambda s, axis=None, ddof=0, keepdims=False: xp.var(s, axis=axis, correction=ddof, keepdims=keepdims)
    A.any = lambda s, axis=None, keepdims=False: xp.any(s, axis=axis, keepdims=keepdims)
    A.all = lambda s, axis=None, keepdims=False: xp.all(s, axis=axis, keepdims=keepdims)
    A.prod = lambda s, axis=None, keepdims=False: xp.prod(s, axis=axis, keepdims=keepdims)
    A.clip = lambda s, *bounds, **named: xp.clip(s, *bounds, **named)
    A.round = lambda s, decimals=0: round(s) if decimals == 0 else _unsupported("round(decimals != 0)")
    A.cumsum = lambda s, axis=None: xp.cumulative_sum(s if axis is not None else reshape(s, (-1,)),
                                                      axis=axis if axis is not None else 0)
    A.sort = lambda s, axis=-1: xp.sort(s, axis=axis)
    A.argsort = lambda s, axis=-1: xp.argsort(s, axis=axis)
    A.ravel = lambda s: reshape(s, (-1,))
    A.swapaxes = swapaxes
    A.take = lambda s, indices, axis=None: xp.take(s if axis is not None else reshape(s, (-1,)), indices,
                                                   axis=axis if axis is not None else 0)


def _unsupported(what: str):
    raise InvalidTypeError(f"{what} is not supported")


_install_methods()
