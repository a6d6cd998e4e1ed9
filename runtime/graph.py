"""The op graph's nodes: the fields every array has and the constructors every layer builds arrays with.

An array is a node of the lazy op graph (``op``, ``inputs``, ``params``, ``shape``, ``dtype``, on a
device context ``ctx``), or evaluated data (``storage``), or a strided view of either (``base``,
``strides``, ``offset`` in elements). ``Node`` declares those fields; ``Array`` (array.py) is the one
kind of node there is, with the operators and methods, and the constructors here build instances of
it: the modules below array.py (ops, autodiff, the lowering) make arrays through them without
importing the class whose methods call into them.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

import hal

from . import dtypes as _dt
from .device import DeviceContext, Storage
from .errors import InvalidIndexError

if TYPE_CHECKING:
    from .array import Array

#: The op of a traced placeholder (rt.compile's inputs): no storage, and nothing computes it.
PLACEHOLDER = "placeholder"

#: The functions rt.grad and rt.value_and_grad are running now: a token each, mapped to the thread
#: running it and the ids of the arrays it differentiates with respect to. While one runs, an eval on
#: its thread keeps the graph of the nodes it computes (``lowering.execute.attach``): a value the
#: function evaluates on its way (one it prints or logs, or that an op computing on the host reads)
#: stays differentiable, where clearing its inputs would have cut the gradient off and given zeros
#: silently. (Other threads' evals clear as ever: a loop there keeps no chain of its past values.)
DIFFERENTIATING: dict[int, tuple[int, frozenset]] = {}


def _targets_here() -> frozenset | None:
    """The ids the functions being differentiated on this thread differentiate with respect to (None:
    no such function runs here)."""
    here = threading.get_ident()
    found = [ids for thread, ids in list(DIFFERENTIATING.values()) if thread == here]
    return frozenset().union(*found) if found else None


def keeps_graph() -> bool:
    """Whether an eval on this thread keeps its nodes' graph (a differentiated function runs here)."""
    here = threading.get_ident()
    return any(thread == here for thread, _ in list(DIFFERENTIATING.values()))


def differentiated(x: Node) -> bool:
    """Whether a function rt.grad is running on this thread differentiates through `x` (its graph
    reaches one of the function's differentiated arguments): an op without a gradient rule refuses
    such an `x`."""
    if not DIFFERENTIATING or not (x.dtype.is_float or x.dtype.is_complex):
        return False
    targets = _targets_here()
    if targets is None:
        return False
    seen: set = set()
    stack = [x]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if id(node) in targets:
            return True
        stack.extend(node.inputs)
        if node.base is not None:
            stack.append(node.base)
    return False


class Node:
    """The fields of an array (see the module); instances are always of its subclass ``Array``.

    Nodes that run a kernel (or are evaluated data) are *roots*: they own storage once evaluated and
    keep ``base`` None (not a reference to themselves, so that reference counting frees them and
    recycles their buffers without the cycle collector). Views keep ``op``/``inputs`` for autodiff.
    """

    __slots__ = ("op", "inputs", "params", "shape", "dtype", "ctx", "base", "strides", "offset", "storage",
                 "checks", "__weakref__")

    op: str | None
    inputs: tuple
    params: Any
    shape: tuple
    dtype: _dt.DType
    ctx: DeviceContext
    base: Array | None
    strides: tuple | None
    offset: int
    storage: Storage | None
    #: The status words of the checked gathers this array's value depends on (None: none), inherited by
    #: every array made from it: reading the value raises IndexError if one of them was set.
    checks: tuple | None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        global _array_type
        _array_type = cls


#: The class the constructors build: ``Array``, once array.py declared it.
_array_type: type[Array]


def new_node(op: str | None, inputs: tuple, params: Any, shape: tuple, dtype: _dt.DType, ctx: DeviceContext,
             storage: Storage | None = None) -> Array:
    """A root node that one kernel computes (or, with `storage`, an evaluated array)."""
    a = _array_type.__new__(_array_type)
    a.op = op
    a.inputs = inputs
    a.params = params
    a.shape = shape
    a.dtype = dtype
    a.ctx = ctx
    a.base = None
    a.strides = None
    a.offset = 0
    a.storage = storage
    checks = None
    for inp in inputs:
        c = inp.checks
        if c is not None and c is not checks:
            checks = c if checks is None else merge_checks(checks, c)
    a.checks = checks
    return a


def new_view(op: str, src: Node, params: Any, shape: tuple, strides: tuple, offset: int) -> Array:
    """A strided window onto `src`'s root (no kernel, no copy)."""
    a = _array_type.__new__(_array_type)
    a.op = op
    a.inputs = (src,)
    a.params = params
    a.shape = shape
    a.dtype = src.dtype
    a.ctx = src.ctx
    base = src.base
    a.base = src if base is None else base
    a.strides = strides
    a.offset = offset
    a.storage = None
    a.checks = src.checks
    return a


#: Status words an array carries before those its device has written are read and the clean ones dropped
#: (an array updated from gathers step after step, and never read, would otherwise carry one a step).
MAX_CHECKS = 8


def merge_checks(a: tuple, b: tuple) -> tuple:
    """The status words of both tuples, each once (compared by identity: arrays compare elementwise)."""
    merged = a + tuple(s for s in b if not any(s is t for t in a))
    return merged if len(merged) <= MAX_CHECKS else _unsettled(merged)


def _unsettled(checks: tuple) -> tuple:
    """`checks` without the status words already written and read clean (reading one that the device
    has written waits for nothing; one still to be written, or set, stays)."""
    kept = []
    for status in checks:
        st = status.storage
        if st is not None and st.sem is st.ctx.semaphore:
            ctx = st.ctx
            try:
                written = st.ready <= ctx.completed or st.ready <= ctx.semaphore.value
            except hal.HalError:  # a failed timeline: its reads raise; leave it to them
                written = False
            if written and not np.frombuffer(ctx.device.read(st.buffer, 0, 4), np.uint32)[0]:
                continue
        kept.append(status)
    return tuple(kept)


def raise_index_errors(a: Node, read) -> None:
    """IndexError if a checked gather that `a`'s value depends on met an out-of-range index; `read(status)`
    is the status word's value on the host (waiting for the work that writes it). Passed checks are
    forgotten, so the status words can be freed; a failed one stays and raises again."""
    checks = a.checks
    if checks is None:
        return
    for status in checks:
        if read(status)[0]:
            raise InvalidIndexError(
                "index out of bounds: an integer array index evaluated on the device is out of range for the "
                "axis it indexes (rt.take's mode='clip' or mode='wrap' clips or wraps indices instead)")
    a.checks = None
    base = a.base
    if base is not None and base.checks is checks:
        base.checks = None


#: new_evaluated(shape, dtype, ctx, storage): an array whose contents `storage` holds. A partial of
#: new_node, so every replay output costs one Python call, not two.
new_evaluated = functools.partial(new_node, None, (), None)


def root_of(a: Node) -> Node:
    """The array owning the storage `a` views (`a` itself unless it is a view)."""
    base = a.base
    return a if base is None else base


def upload(data: np.ndarray, dtype: _dt.DType, ctx: DeviceContext) -> Array:
    """Copy host data into a fresh device buffer (synchronous; the buffer is idle)."""
    shape = tuple(data.shape)
    ctx.check_fits(shape, dtype)  # (before the host copy: the data may be a broadcast view)
    host = np.ascontiguousarray(_dt.convert_host(data, dtype))
    nbytes = host.nbytes
    buf, bucket = ctx.buffers.acquire(nbytes)
    if nbytes:
        ctx.device.write(buf, host.reshape(-1).view(np.uint8))
    storage = Storage(buf, bucket, ctx, 0, nbytes)
    return new_evaluated(shape, dtype, ctx, storage)


def constant(value: bool | int | float | complex, dtype: _dt.DType, ctx: DeviceContext) -> Array:
    """A cached evaluated 0-d array holding a Python scalar (used for weak scalar operands)."""
    # Floats by their hex form: -0.0 and 0.0 compare (and hash) equal but are different constants.
    tv = type(value)
    if tv is float:
        key = (dtype, value.hex())
    elif tv is complex:
        key = (dtype, value.real.hex(), value.imag.hex())
    else:
        key = (tv, value, dtype)
    cache = ctx.constants
    arr = cache.get(key)
    if arr is None:
        if dtype is _dt.bfloat16:
            host = np.array(value, dtype=np.float32)
        else:
            with np.errstate(over="ignore"):
                host = np.array(value, dtype=dtype.storage)
        arr = upload(host, dtype, ctx)
        arr.params = host  # an evaluated array's params are free: the value, for folding (autodiff.py)
        keep_constant(cache, key, arr)
    return arr


def keep_constant(cache: dict, key: object, entry: object) -> None:
    """Put `entry` in a context's constant cache, dropping its oldest entry at 4,096."""
    if len(cache) >= 4096:
        cache.pop(next(iter(cache)))
    cache[key] = entry
