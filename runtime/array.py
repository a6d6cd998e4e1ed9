"""The lazy Array: a node of the op graph, or an evaluated buffer, or a strided view of either.

Its fields are the graph node's (``graph.Node``); its operators and methods are all here, each a
call into the module that builds or computes it: ``ops`` (elementwise, reductions, views), the array
API functions (``array_api``), indexing, numpy's protocols, the lowering (``eval``), host reads and
DLPack (``host``, ``interop``).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

import hal

from . import array_api, ops
from . import dtypes as _dt
from .device import context_for
from .errors import DeviceFallbackWarning, InvalidTypeError, InvalidValueError
from .graph import Node, upload
from .host import to_numpy
from .indexing import AtIndexer, getitem
from .interop import cuda_array_interface, dlpack_device, to_dlpack
from .lowering.evaluate import evaluate
from .numpy_protocols import array_function, array_ufunc
from .ops import binary, unary
from .shapes import size_of

if TYPE_CHECKING:
    from types import ModuleType

    from .ops import ArrayLike


class Array(Node):
    """A lazily evaluated n-d array on a HAL device.

    Nodes that run a kernel (or are evaluated data) are *roots*: they own storage once evaluated.
    Views (reshape, transpose, broadcast_to, slicing) are not scheduled: they describe a strided
    window (`strides`, `offset`, in elements) onto their root's storage and keep `op`/`inputs` for
    autodiff. Arrays are immutable; `x.at[idx].set(v)` is the functional update.
    """

    __slots__ = ()

    # Tell numpy to defer to our reflected operators (np_array + rt_array).
    __array_priority__ = 100

    # -- structure ----------------------------------------------------------------------------------
    @property
    def root(self) -> Array:
        """The array owning the storage this one views (itself unless it is a view)."""
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

    def layout(self) -> tuple[tuple, int]:
        """(strides, offset) in elements relative to the root's storage."""
        strides = self.strides
        if strides is None:
            strides = ops.row_major(self.shape)
        return strides, self.offset

    # -- operators ----------------------------------------------------------------------------------
    def __add__(self, other: ArrayLike) -> Array: return binary("add", self, other)
    def __radd__(self, other: ArrayLike) -> Array: return binary("add", other, self)
    def __sub__(self, other: ArrayLike) -> Array: return binary("sub", self, other)
    def __rsub__(self, other: ArrayLike) -> Array: return binary("sub", other, self)
    def __mul__(self, other: ArrayLike) -> Array: return binary("mul", self, other)
    def __rmul__(self, other: ArrayLike) -> Array: return binary("mul", other, self)
    def __truediv__(self, other: ArrayLike) -> Array: return binary("div", self, other)
    def __rtruediv__(self, other: ArrayLike) -> Array: return binary("div", other, self)
    def __floordiv__(self, other: ArrayLike) -> Array: return binary("floor_divide", self, other)
    def __rfloordiv__(self, other: ArrayLike) -> Array: return binary("floor_divide", other, self)
    def __mod__(self, other: ArrayLike) -> Array: return binary("remainder", self, other)
    def __rmod__(self, other: ArrayLike) -> Array: return binary("remainder", other, self)
    def __pow__(self, other: ArrayLike) -> Array: return binary("pow", self, other)
    def __rpow__(self, other: ArrayLike) -> Array: return binary("pow", other, self)
    def __matmul__(self, other: ArrayLike) -> Array: return ops.matmul(self, other)
    def __rmatmul__(self, other: ArrayLike) -> Array: return ops.matmul(other, self)
    def __and__(self, other: ArrayLike) -> Array: return binary("bitwise_and", self, other)
    def __rand__(self, other: ArrayLike) -> Array: return binary("bitwise_and", other, self)
    def __or__(self, other: ArrayLike) -> Array: return binary("bitwise_or", self, other)
    def __ror__(self, other: ArrayLike) -> Array: return binary("bitwise_or", other, self)
    def __xor__(self, other: ArrayLike) -> Array: return binary("bitwise_xor", self, other)
    def __rxor__(self, other: ArrayLike) -> Array: return binary("bitwise_xor", other, self)
    def __lshift__(self, other: ArrayLike) -> Array: return binary("left_shift", self, other)
    def __rlshift__(self, other: ArrayLike) -> Array: return binary("left_shift", other, self)
    def __rshift__(self, other: ArrayLike) -> Array: return binary("right_shift", self, other)
    def __rrshift__(self, other: ArrayLike) -> Array: return binary("right_shift", other, self)
    def __eq__(self, other: ArrayLike) -> Array: return binary("eq", self, other)  # type: ignore[override]
    def __ne__(self, other: ArrayLike) -> Array: return binary("ne", self, other)  # type: ignore[override]
    def __lt__(self, other: ArrayLike) -> Array: return binary("lt", self, other)
    def __le__(self, other: ArrayLike) -> Array: return binary("le", self, other)
    def __gt__(self, other: ArrayLike) -> Array: return binary("gt", self, other)
    def __ge__(self, other: ArrayLike) -> Array: return binary("ge", self, other)
    def __neg__(self) -> Array: return unary("neg", self)
    def __pos__(self) -> Array: return self
    def __abs__(self) -> Array: return unary("abs", self)
    def __invert__(self) -> Array: return unary("bitwise_invert", self)
    def __divmod__(self, other: ArrayLike) -> tuple[Array, Array]:
        return binary("floor_divide", self, other), binary("remainder", self, other)

    def __round__(self, ndigits: int | None = None) -> Array:
        """``round(x)``: half to even, as numpy's; ``round(x, n)``: to ``n`` decimals (``ops.round_to``)."""
        return ops.round(self) if ndigits is None else ops.round_to(self, ndigits)

    def __contains__(self, value: Any) -> bool:
        """``value in x``: whether any element equals ``value`` (numpy's meaning)."""
        return bool(array_api.any(self == value))

    __hash__ = object.__hash__  # (by identity: __eq__ is elementwise)

    def __getitem__(self, key: Any) -> Array: return getitem(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        raise InvalidTypeError("runtime arrays are immutable: use x = x.at[key].set(value) (or .add, .multiply, "
                               ".min, .max) for a functional update")

    @property
    def at(self) -> AtIndexer:
        """Functional updates, as in JAX: `x.at[idx].set(v)`, `.add(v)`, `.multiply(v)`, `.min(v)`, `.max(v)`."""
        return AtIndexer(self)

    # -- methods --------------------------------------------------------------------------------------
    @property
    def T(self) -> Array:  # noqa: N802 - numpy's name
        return ops.transpose(self)

    @property
    def mT(self) -> Array:  # noqa: N802 - the array API's name
        if self.ndim < 2:
            raise InvalidValueError("mT needs an array of at least 2 dimensions")
        return ops.swapaxes(self, -1, -2)

    def reshape(self, *shape: Any, order: str = "C") -> Array:
        return ops.reshape_in_order(self, shape[0] if len(shape) == 1 else shape, order)
    def transpose(self, *axes: Any) -> Array: return ops.transpose(self, axes or None)
    def swapaxes(self, a: int, b: int) -> Array: return ops.swapaxes(self, a, b)
    def broadcast_to(self, shape: tuple) -> Array: return ops.broadcast_to(self, shape)
    def squeeze(self, axis: int | tuple | None = None) -> Array: return ops.squeeze(self, axis)
    def flatten(self) -> Array: return ops.reshape(self, (-1,))
    def ravel(self) -> Array: return ops.reshape(self, (-1,))
    def astype(self, dtype: Any, /, *, copy: bool = True, device: Any = None) -> Array:
        return ops.astype(self, dtype, copy=copy, device=device)
    def copy(self) -> Array: return ops.copy_array(self)
    def exp(self) -> Array: return unary("exp", self)
    def log(self) -> Array: return unary("log", self)
    def sqrt(self) -> Array: return unary("sqrt", self)
    def tanh(self) -> Array: return unary("tanh", self)
    def sigmoid(self) -> Array: return unary("sigmoid", self)
    def abs(self) -> Array: return unary("abs", self)
    def sum(self, axis: Any = None, keepdims: bool = False) -> Array: return ops.sum(self, axis, keepdims)
    def mean(self, axis: Any = None, keepdims: bool = False) -> Array: return ops.mean(self, axis, keepdims)
    def max(self, axis: Any = None, keepdims: bool = False) -> Array: return ops.max(self, axis, keepdims)
    def min(self, axis: Any = None, keepdims: bool = False) -> Array: return ops.min(self, axis, keepdims)
    def argmax(self, axis: Any = None, keepdims: bool = False) -> Array: return ops.argmax(self, axis, keepdims)
    def argmin(self, axis: Any = None, keepdims: bool = False) -> Array: return ops.argmin(self, axis, keepdims)
    def prod(self, axis: Any = None, keepdims: bool = False) -> Array:
        return array_api.prod(self, axis=axis, keepdims=keepdims)
    def any(self, axis: Any = None, keepdims: bool = False) -> Array:
        return array_api.any(self, axis=axis, keepdims=keepdims)
    def all(self, axis: Any = None, keepdims: bool = False) -> Array:
        return array_api.all(self, axis=axis, keepdims=keepdims)
    def std(self, axis: Any = None, ddof: float = 0, keepdims: bool = False) -> Array:
        return array_api.std(self, axis=axis, correction=ddof, keepdims=keepdims)
    def var(self, axis: Any = None, ddof: float = 0, keepdims: bool = False) -> Array:
        return array_api.var(self, axis=axis, correction=ddof, keepdims=keepdims)
    def clip(self, *bounds: Any, **named: Any) -> Array: return array_api.clip(self, *bounds, **named)
    def cumsum(self, axis: int | None = None) -> Array:
        if axis is None:
            return array_api.cumulative_sum(ops.reshape(self, (-1,)), axis=0)
        return array_api.cumulative_sum(self, axis=axis)
    def sort(self, axis: int = -1) -> Array: return array_api.sort(self, axis=axis)
    def argsort(self, axis: int = -1) -> Array: return array_api.argsort(self, axis=axis)
    def take(self, indices: Any, axis: int | None = None) -> Array:
        if axis is None:
            return array_api.take(ops.reshape(self, (-1,)), indices, axis=0)
        return array_api.take(self, indices, axis=axis)
    def round(self, decimals: int = 0) -> Array: return ops.round_to(self, decimals)

    def to_device(self, device: Any, /, *, stream: Any = None) -> Array:
        return ops.asarray(self, device=device)

    def __array_namespace__(self, *, api_version: str | None = None) -> ModuleType:
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12"):
            raise InvalidValueError(f"unsupported array API version {api_version!r}")
        return sys.modules[__package__]  # the runtime package (imported: this module is part of it)

    # -- evaluation and host values -------------------------------------------------------------------
    def eval(self) -> Array:
        evaluate((self,))
        return self

    def numpy(self) -> np.ndarray:
        """The value as a numpy array (a read-only zero-copy view of mapped memory where possible)."""
        return to_numpy(self)

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Any:
        return self._scalar().item()

    def _scalar(self) -> np.ndarray:
        if self.size != 1:
            raise InvalidTypeError("only arrays of size 1 can be converted to Python scalars")
        return self.numpy().reshape(())[()]

    def __len__(self) -> int:
        if not self.shape:
            raise InvalidTypeError("len() of unsized object (a 0-d array)")
        return self.shape[0]

    def __iter__(self) -> Iterator[Array]:
        if not self.shape:  # (at iter(), as numpy: not at the first next())
            raise InvalidTypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self) -> bool:
        if self.size != 1:
            raise InvalidValueError("The truth value of an array with more than one element is ambiguous.")
        return bool(self._scalar())

    def __complex__(self) -> complex:
        return complex(self._scalar())

    def __float__(self) -> float:
        if self.dtype.is_complex:  # (the standard: no silent loss of the imaginary part)
            raise InvalidTypeError(f"float() of a {self.dtype.name} array: take real(x) or imag(x) first")
        return float(self._scalar())

    def __int__(self) -> int:
        if self.dtype.is_complex:
            raise InvalidTypeError(f"int() of a {self.dtype.name} array: take real(x) or imag(x) first")
        return int(self._scalar())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise InvalidTypeError(f"only integer arrays can be used as an index, not {self.dtype.name}")
        return int(self._scalar())

    def __repr__(self) -> str:
        device = self.ctx.device.info.uri
        try:
            values = self.numpy()
        except hal.HalError as exc:  # (a closed device, failed work: the repr says so rather than raise)
            return (f"rt.Array(<unavailable: {type(exc).__name__}: {exc}>, shape={self.shape}, "
                    f"dtype={self.dtype.name}, device={device!r})")
        body = np.array2string(values, separator=", ", prefix="rt.Array(")
        return f"rt.Array({body}, dtype={self.dtype.name}, device={device!r})"

    def __str__(self) -> str:
        return str(self.numpy())

    def __format__(self, spec: str) -> str:
        if not spec:
            return str(self)
        if self.ndim == 0:
            return format(self.item(), spec)
        raise InvalidTypeError(f"unsupported format string {spec!r} for a {self.ndim}-d array")

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.numpy()
        if copy:
            out = out.copy()
        if dtype is not None:
            out = out.astype(dtype, copy=False)
        return out

    # -- numpy's dispatch, DLPack, pickling -----------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return array_ufunc(self, ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return array_function(self, func, types, args, kwargs)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> Any:
        return to_dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return dlpack_device(self)

    @property
    def __cuda_array_interface__(self) -> dict:
        return cuda_array_interface(self)

    def __reduce__(self) -> tuple:
        """Pickled as host data and the device's URI: unpickled on that device, or, where it is missing, on
        the default device with a `DeviceFallbackWarning` (turn it into an error with the warnings filter)."""
        return (_unpickle, (np.array(self.numpy()), self.dtype, self.ctx.device.info.uri))

    def __copy__(self) -> Array:
        return self  # arrays are immutable: a copy is the same value

    def __deepcopy__(self, memo: dict) -> Array:
        return self


def _unpickle(host: np.ndarray, dtype: _dt.DType, uri: str) -> Array:
    try:
        ctx = context_for(uri)
    except hal.HalError as exc:  # pickled where that device exists; here it does not (or cannot be opened)
        ctx = context_for(None)
        warnings.warn(f"an unpickled array's device {uri!r} is not usable here ({exc.message}); the array is on "
                      f"the default device {ctx.device.info.uri!r} instead", DeviceFallbackWarning, stacklevel=2)
    return upload(host, dtype, ctx)
