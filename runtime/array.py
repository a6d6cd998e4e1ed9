"""The lazy Array: a node of the op graph, or an evaluated buffer, or a strided view of either."""

from __future__ import annotations

import functools
import warnings

import numpy as np

import hal

from . import dtypes as _dt
from .device import DeviceContext, Storage, context_for
from .errors import DeviceFallbackWarning, InvalidTypeError, InvalidValueError
from .shapes import size_of


class Array:
    """A lazily evaluated n-d array on a HAL device.

    Nodes that run a kernel (or are evaluated data) are *roots*: they own
    storage once evaluated. Views (reshape, transpose, broadcast_to, slicing)
    are not scheduled: they describe a strided window (`strides`, `offset`, in
    elements) onto their root's storage and keep `op`/`inputs` for autodiff.
    """

    __slots__ = ("op", "inputs", "params", "shape", "dtype", "ctx", "base", "strides", "offset",
                 "storage", "__weakref__")

    # Tell numpy to defer to our reflected operators (np_array + rt_array).
    __array_priority__ = 100

    op: str | None
    shape: tuple
    dtype: _dt.DType

    @property
    def root(self) -> Array:
        """The array owning the storage this one views (itself unless it is a view).

        Roots keep `base` None rather than a reference to themselves, so that
        arrays are freed by reference counting (and their buffers recycled)
        without waiting for the cycle collector.
        """
        base = self.base
        return self if base is None else base

    @property
    def device(self) -> hal.Device:
        return self.ctx.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return size_of(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_evaluated(self) -> bool:
        return self.root.storage is not None

    def layout(self) -> tuple:
        """(strides, offset) in elements relative to the root's storage."""
        strides = self.strides
        if strides is None:
            strides = _row_major(self.shape)
        return strides, self.offset

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        for i in range(self.shape[0]):
            yield self[i]

    def __bool__(self) -> bool:
        if self.size != 1:
            raise InvalidValueError("The truth value of an array with more than one element is ambiguous.")
        return bool(self._scalar())

    def __complex__(self) -> complex:
        return complex(self._scalar())

    def __float__(self) -> float:
        return float(self._scalar())

    def __int__(self) -> int:
        return int(self._scalar())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError("only integer arrays can be used as an index")
        return int(self._scalar())

    def item(self):
        return self._scalar().item()

    def _scalar(self):
        if self.size != 1:
            raise InvalidTypeError("only arrays of size 1 can be converted to Python scalars")
        return self.numpy().reshape(())[()]

    def __repr__(self) -> str:
        body = np.array2string(self.numpy(), separator=", ", prefix="rt.Array(")
        return f"rt.Array({body}, dtype={self.dtype.name}, device={self.ctx.device.info.uri!r})"

    def __str__(self) -> str:
        return str(self.numpy())

    def __format__(self, spec: str) -> str:
        if not spec:
            return str(self)
        if self.ndim == 0:
            return format(self.item(), spec)
        raise InvalidTypeError(f"unsupported format string {spec!r} for a {self.ndim}-d array")

    def __array__(self, dtype=None, copy=None):
        out = self.numpy()
        if copy:
            out = out.copy()
        if dtype is not None:
            out = out.astype(dtype, copy=False)
        return out

    def __reduce__(self):
        """Pickled as host data and the device's URI: unpickled on that device, or, where it is missing, on
        the default device with a `DeviceFallbackWarning` (turn it into an error with the warnings filter)."""
        return (_unpickle, (np.array(self.numpy()), self.dtype, self.ctx.device.info.uri))

    def __copy__(self) -> Array:
        return self  # arrays are immutable: a copy is the same value

    def __deepcopy__(self, memo) -> Array:
        return self

    def __setitem__(self, key, value) -> None:
        raise InvalidTypeError("runtime arrays are immutable: use x = x.at[key].set(value) (or .add, .multiply, "
                               ".min, .max) for a functional update")

    @property
    def at(self):
        """Functional updates, as in JAX: `x.at[idx].set(v)`, `.add(v)`, `.multiply(v)`, `.min(v)`, `.max(v)`."""
        from .indexing import AtIndexer
        return AtIndexer(self)

    @property
    def mT(self) -> Array:
        from .ops import swapaxes
        if self.ndim < 2:
            raise InvalidValueError("mT needs an array of at least 2 dimensions")
        return swapaxes(self, -1, -2)

    def to_device(self, device, /, *, stream=None) -> Array:
        from .ops import asarray
        return asarray(self, device=device)

    def __array_namespace__(self, *, api_version: str | None = None):
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise InvalidValueError(f"unsupported array API version {api_version!r}")
        import runtime
        return runtime

    def eval(self) -> Array:
        from .lowering import evaluate
        evaluate((self,))
        return self

    def numpy(self) -> np.ndarray:
        """The value as a numpy array (a read-only zero-copy view of mapped memory where possible)."""
        from .host import to_numpy
        return to_numpy(self)

    tolist = lambda self: self.numpy().tolist()  # noqa: E731


def _row_major(shape: tuple) -> tuple:
    """ops._row_major, bound on first use (ops imports this module): a function-level import
    statement costs a trip through the import machinery at every call of layout()."""
    global _row_major
    from .ops import _row_major
    return _row_major(shape)


def _unpickle(host: np.ndarray, dtype: _dt.DType, uri: str) -> Array:
    try:
        ctx = context_for(uri)
    except hal.HalError as exc:  # pickled where that device exists; here it does not (or cannot be opened)
        ctx = context_for(None)
        warnings.warn(f"an unpickled array's device {uri!r} is not usable here ({exc.message}); the array is on "
                      f"the default device {ctx.device.info.uri!r} instead", DeviceFallbackWarning, stacklevel=2)
    return upload(host, dtype, ctx)



def new_node(op: str | None, inputs: tuple, params, shape: tuple, dtype: _dt.DType, ctx: DeviceContext,
             storage: Storage | None = None) -> Array:
    """A root node that one kernel computes (or, with `storage`, an evaluated array)."""
    a = Array.__new__(Array)
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
    return a


def new_view(op: str, src: Array, params, shape: tuple, strides: tuple, offset: int) -> Array:
    a = Array.__new__(Array)
    a.op = op
    a.inputs = (src,)
    a.params = params
    a.shape = shape
    a.dtype = src.dtype
    a.ctx = src.ctx
    a.base = src.root
    a.strides = strides
    a.offset = offset
    a.storage = None
    return a


#: The op of a traced placeholder (rt.compile's inputs): no storage, and nothing computes it.
PLACEHOLDER = "placeholder"
#: new_evaluated(shape, dtype, ctx, storage): an array whose contents `storage` holds. A partial of
#: new_node, so every replay output costs one Python call, not two.
new_evaluated = functools.partial(new_node, None, (), None)


def upload(data: np.ndarray, dtype: _dt.DType, ctx: DeviceContext) -> Array:
    """Copy host data into a fresh device buffer (synchronous; the buffer is idle)."""
    shape = tuple(data.shape)
    host = np.ascontiguousarray(_dt.convert_host(data, dtype))
    nbytes = host.nbytes
    buf, bucket = ctx.buffers.acquire(nbytes)
    if nbytes:
        ctx.device.write(buf, host.reshape(-1).view(np.uint8))
    storage = Storage(buf, bucket, ctx, 0, nbytes)
    return new_evaluated(shape, dtype, ctx, storage)


def constant(value, dtype: _dt.DType, ctx: DeviceContext) -> Array:
    """A cached evaluated 0-d array holding a Python scalar (used for weak scalar operands)."""
    # Floats by their hex form: -0.0 and 0.0 compare (and hash) equal but are different constants.
    key = (dtype, value.hex()) if type(value) is float else (type(value), value, dtype)
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


def keep_constant(cache: dict, key, entry) -> None:
    """Put `entry` in a context's constant cache, dropping its oldest entry at 4,096."""
    if len(cache) >= 4096:
        cache.pop(next(iter(cache)))
    cache[key] = entry


def as_context(device) -> DeviceContext:
    return context_for(device)
