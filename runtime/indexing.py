"""Indexing with numpy's semantics: basic indices are strided views; integer-array and boolean-mask
indices gather on the device; `x.at[idx].set(v)` is the functional update (arrays are immutable).

Boolean masks have data-dependent shapes: the mask is evaluated and its positions uploaded as
integer indices. Integer indices known on the host are bounds-checked at once (IndexError); indices
computed on the device are checked by the gather kernel, and reading the result raises IndexError
if one was out of range (``array_api.gather_flat``).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

import numpy as np

import hal

from . import dtypes as _dt
from . import ops
from .array_api import flat_nonzero, gather_flat, take, take_add, take_params, take_set, unravel
from .errors import InvalidIndexError, InvalidTypeError, InvalidValueError
from .graph import Node, differentiated
from .kernels import scatter
from .shapes import broadcast_shapes, contiguous_strides, parse_index, plain_key

if TYPE_CHECKING:
    from .array import Array


def _is_bool_scalar(k) -> bool:
    return k is True or k is False or isinstance(k, np.bool_)


def _is_array_index(k) -> bool:
    if isinstance(k, Node):
        return k.ndim > 0 or k.dtype is _dt.bool_
    if isinstance(k, np.ndarray):
        return k.ndim > 0 or k.dtype == np.bool_
    return isinstance(k, list)


def _zero_d_mask(k):
    if (isinstance(k, Node) or isinstance(k, np.ndarray)) and k.ndim == 0 and _is_array_index(k):
        return bool(k.item() if isinstance(k, Node) else k)
    return k


def getitem(x: Array, key) -> Array:
    kind = type(key)
    if kind is slice or kind is int:  # (the usual basic key: no array, mask, boolean or device scalar to look for)
        return ops.getitem(x, (key,))
    if kind is tuple and plain_key(key):  # (the same for a tuple of slices and ints)
        return ops.getitem(x, key)
    key = key if kind is tuple else (key,)
    if any(_is_array_index(k) for k in key):
        if any(np.ndim(k) == 0 for k in key if isinstance(k, Node) or isinstance(k, np.ndarray)):
            key = tuple(_zero_d_mask(k) for k in key)  # a 0-d boolean array masks as True / False
        if len(key) == 1 and isinstance(key[0], Node) and key[0].dtype is _dt.bool_ and key[0].shape == x.shape \
                and x.ndim and key[0].ctx is x.ctx:  # x[mask] over all of x: its elements at the mask's positions
            return gather_flat(x, flat_nonzero(key[0]))
        if any(_is_array_index(k) for k in key):
            return _advanced(x, key)
    if any(_is_bool_scalar(k) for k in key):
        return _bool_scalars(x, key)
    key = tuple(operator.index(k) if isinstance(k, Node) else k for k in key)
    return ops.getitem(x, key)


def _bool_scalars(x: Array, key: tuple) -> Array:
    """x[True] adds an axis of length 1, x[False] one of length 0 (numpy's 0-d boolean masks)."""
    n_real = sum(1 for k in key if k is not None and k is not Ellipsis and not _is_bool_scalar(k))
    basic, empties, pos = [], [], 0
    for k in key:
        if _is_bool_scalar(k):
            basic.append(None)
            if not k:
                empties.append(pos)
            pos += 1
        elif k is Ellipsis:
            basic.append(k)
            pos += x.ndim - n_real
        else:
            basic.append(k)
            pos += 0 if isinstance(k, (int, np.integer)) or isinstance(k, Node) else 1
    out = ops.getitem(x, tuple(basic))
    for p in empties:
        out = out[(slice(None),) * p + (slice(0, 0),)]
    return out


class _Found:
    """An axis's indices found on the device from a boolean mask: in range by construction, so the
    gather they feed is not checked."""

    __slots__ = ("array",)

    def __init__(self, array: Array) -> None:
        self.array = array


def _is_bool_array(k) -> bool:
    return k.dtype is _dt.bool_ if isinstance(k, Node) else np.asarray(k).dtype == np.bool_


def _expand(x: Array, key: tuple) -> list:
    """The key with its ellipsis expanded and boolean arrays replaced by integer arrays (one per
    masked axis; a device mask's positions are found on the device, only their count read)."""
    n_used = 0
    for k in key:
        if k is None or k is Ellipsis:
            continue
        if _is_array_index(k) and _is_bool_array(k):
            n_used += k.ndim if isinstance(k, Node) else np.asarray(k).ndim
        else:
            n_used += 1
    if n_used > x.ndim:
        raise InvalidIndexError(f"too many indices for array: array is {x.ndim}-dimensional, but {n_used} were "
                                "indexed")
    out = []
    axis = 0
    for k in key:
        if k is Ellipsis:
            out += [slice(None)] * (x.ndim - n_used)
            axis += x.ndim - n_used
            continue
        if k is None:
            out.append(None)
            continue
        if _is_array_index(k):
            host = None if isinstance(k, Node) else np.asarray(k)
            is_bool = (k.dtype is _dt.bool_) if host is None else host.dtype == np.bool_
            if is_bool and host is None and k.ctx is not x.ctx:  # (a mask on another device: through the host)
                host = np.asarray(k.numpy())
            if is_bool:
                shape = host.shape if host is not None else k.shape
                if shape != x.shape[axis:axis + len(shape)]:
                    raise InvalidIndexError(f"boolean index of shape {shape} does not match the indexed "
                                            f"dimensions {x.shape[axis:axis + len(shape)]}")
                if host is not None:
                    out += [np.asarray(i, np.int64) for i in np.nonzero(host)]
                else:  # compacted on the device (only the count comes to the host)
                    out += [_Found(i) for i in unravel(flat_nonzero(k), shape)]
                axis += len(shape)
                continue
            if host is not None and host.size and host.dtype.kind not in "iu":
                raise InvalidIndexError(f"arrays used as indices must be of integer type, got {host.dtype}")
            if host is None and not k.dtype.is_int:
                raise InvalidIndexError(f"arrays used as indices must be of integer type, got {k.dtype.name}")
            out.append(host.astype(np.int64) if host is not None else k)
        else:
            out.append(k)
        axis += 1
    out += [slice(None)] * (x.ndim - axis)
    return out


def _advanced(x: Array, key: tuple) -> Array:
    """Integer-array indexing (numpy's rules): the index arrays broadcast together; their dims replace the
    indexed axes where those are adjacent, else lead the result. One index array is a ``take`` along
    its axis (the indices read once, not a flat position an output element)."""
    items = _expand(x, key)
    adv, y, axis_of = _basic_part(x, items)
    if len(adv) == 1 and isinstance(items[adv[0]], (np.ndarray, Node, _Found)):
        k = items[adv[0]]
        if isinstance(k, _Found):  # (positions a mask's compaction found: in range by construction)
            return take(y, k.array, axis=axis_of[adv[0]], mode="clip")
        return take(y, k, axis=axis_of[adv[0]])
    y, flat, bad, out_shape = _advanced_flat(x, key, (items, adv, y, axis_of))
    if flat is None:
        return ops.zeros(out_shape, dtype=x.dtype, device=x.ctx)
    return gather_flat(y, flat, bad)


def _basic_part(x: Array, items: list) -> tuple:
    """(the items that are advanced indices, the view of x its basic items select with each advanced
    axis kept whole, each advanced item's axis in that view)."""
    adv = [i for i, k in enumerate(items) if isinstance(k, (np.ndarray, Node, _Found)) or
           (k is not None and not isinstance(k, slice))]
    basic = []
    axis_of = {}  # item index -> axis of the basic view
    ax = 0
    for i, k in enumerate(items):
        if i in adv:
            basic.append(slice(None))
            axis_of[i] = ax
            ax += 1
        else:
            basic.append(k)
            if k is not None and not isinstance(k, slice):
                continue
            ax += 1
    # (a key of array indices and whole axes reads x itself: a view of all of it would make the gather
    # copy x first, and its gradient pad the cotangent back into x's shape, each a pass over all of x)
    whole = len(basic) == x.ndim and all(type(k) is slice and k == slice(None) for k in basic)
    return adv, x if whole else ops.getitem(x, tuple(basic)), axis_of


def _advanced_flat(x: Array, key: tuple, parts: tuple | None = None) -> tuple:
    """(y, flat, bad, shape) of integer-array indexing: y the view of x that the key's basic items
    select, flat the int64 array (of the result's shape) of each selected element's position in
    y's elements in order, bad None or True where an index computed on the device is out of range;
    flat None for an empty result. ``parts``: the key's items and ``_basic_part``, where known."""
    if parts is None:
        items = _expand(x, key)
        adv, y, axis_of = _basic_part(x, items)
    else:
        items, adv, y, axis_of = parts
    dims = {}
    arrays = []
    bad = None  # True where an index computed on the device is out of range
    for i in adv:
        k = items[i]
        d = y.shape[axis_of[i]]
        if isinstance(k, np.ndarray):
            if k.size and (k.min() < -d or k.max() >= d):
                raise InvalidIndexError(f"index out of bounds for axis with size {d}")
            k = ops.asarray(np.where(k < 0, k + d, k), device=x.ctx)
        elif isinstance(k, _Found):
            k = k.array
        elif isinstance(k, Node):  # computed on the device: checked there (gather_flat)
            k = ops.astype(k, _dt.int64)
            k = ops.where(k < 0, k + d, k)
            out_of_range = ops.logical_or(k < 0, k >= d)
            bad = out_of_range if bad is None else ops.logical_or(bad, out_of_range)
        else:
            idx = operator.index(k)
            if not -d <= idx < d:
                raise InvalidIndexError(f"index {idx} is out of bounds for axis with size {d}")
            k = ops.asarray(np.int64(idx % d), device=x.ctx)
        arrays.append(k)
        dims[i] = d
    bshape = broadcast_shapes(*(a.shape for a in arrays))
    adv_axes = [axis_of[i] for i in adv]
    adjacent = adv_axes == list(range(adv_axes[0], adv_axes[0] + len(adv_axes)))
    rest = [a for a in range(y.ndim) if a not in adv_axes]
    if adjacent:
        first = adv_axes[0]
        out_shape = y.shape[:first] + bshape + y.shape[first + len(adv_axes):]
        nb_lead = first
    else:
        out_shape = bshape + tuple(y.shape[a] for a in rest)
        nb_lead = 0
    y.ctx.check_fits(out_shape, y.dtype)
    strides = contiguous_strides(y.shape)
    nb = len(bshape)
    flat = None
    for a, k in zip(adv_axes, arrays):
        term = ops.broadcast_to(k, bshape) * strides[a]
        term = ops.reshape(term, (1,) * nb_lead + bshape + (1,) * (len(out_shape) - nb_lead - nb))
        flat = term if flat is None else flat + term
    out_axis = [i for i in range(len(out_shape)) if not nb_lead <= i < nb_lead + nb]
    for a, oa in zip(rest, out_axis):
        pos = [1] * len(out_shape)
        pos[oa] = y.shape[a]
        flat = flat + ops.reshape(ops.arange(y.shape[a], dtype=_dt.int64, device=x.ctx), tuple(pos)) * strides[a]
    if 0 in out_shape:
        return y, None, None, out_shape
    if bad is not None:  # over the broadcast index dims, placed as they are in the output
        bad = ops.reshape(ops.broadcast_to(bad, bshape),
                          (1,) * nb_lead + bshape + (1,) * (len(out_shape) - nb_lead - nb))
    return y, ops.broadcast_to(flat, out_shape), bad, out_shape


# ---- functional updates -------------------------------------------------------------------------

class AtIndexer:
    """`x.at[idx]`: the positions of a functional update."""

    __slots__ = ("x",)

    def __init__(self, x: Array) -> None:
        self.x = x

    def __getitem__(self, key) -> _At:
        return _At(self.x, key)


class _At:
    __slots__ = ("x", "key")

    def __init__(self, x: Array, key) -> None:
        self.x = x
        self.key = key

    def set(self, value) -> Array:  # noqa: A003
        return self._update(value, None)

    def add(self, value) -> Array:
        return self._update(value, ops.add)

    def multiply(self, value) -> Array:
        return self._update(value, ops.multiply)

    def min(self, value) -> Array:  # noqa: A003
        return self._update(value, ops.minimum)

    def max(self, value) -> Array:  # noqa: A003
        return self._update(value, ops.maximum)

    def get(self) -> Array:
        return self.x[self.key]

    def _update(self, value, combine) -> Array:
        x = self.x
        key = self.key if isinstance(self.key, tuple) else (self.key,)
        if any(_is_array_index(k) or _is_bool_scalar(k) for k in key):
            if not any(_is_bool_scalar(k) for k in key):
                updated = self._update_on_device(key, value, combine)
                if updated is not None:
                    return updated
            return self._update_on_host(value, combine)
        key = tuple(operator.index(k) if isinstance(k, Node) else k for k in key)
        view = ops.getitem(x, key)
        info = parse_index(key, x.shape, *x.layout())[3]
        v = ops.astype(ops.broadcast_to(ops.asarray(value, device=x.ctx) if not isinstance(value, Node) else value,
                                        view.shape), x.dtype)
        kept = tuple(count for (_, _, count, keep) in info if keep)
        if combine is not None:
            v = ops.astype(combine(view, v), x.dtype)
        placed = ops.pad_slice(ops.reshape(ops.contiguous(v), kept), x.shape, info)
        mask = ops.pad_slice(ops.full(kept, True, device=x.ctx), x.shape, info)
        return ops.where(mask, placed, x)

    def _update_on_device(self, key: tuple, value, combine) -> Array | None:
        """``x.at[key].add(value)`` or ``.set(value)`` with array indices, on the device; None where the host
        does it (other updates, bool arrays' add, keys whose basic items select a view other than x
        itself, more elements than scatter_last counts). Indices computed on the device are checked
        there (reading the result raises IndexError if one was out of range); both are differentiable
        in x and value.

        add: a scatter-add (repeated indices add up, as numpy's ``add.at``). set: each element takes the
        value of the last position that selects it (``ops.scatter_last``; repeated indices leave the
        last value, as numpy's indexed assignment does), gathered there."""
        x = self.x
        if combine is ops.add and x.dtype is not _dt.bool_:
            what = "add"
        elif combine is None and x.size <= scatter.LAST_MAX:
            what = "set"
        else:
            return None
        along = self._along_one_axis(key, value, what)
        if along is not None:
            v, idx, params = along
            if what == "set":
                return take_set(x, v, idx, params)
            return ops.add(x, ops.astype(take_add(v, idx, params, x.shape), x.dtype))
        selected = self._selected(key, value, what)
        if selected is None:
            return None
        flat, bad, v = selected
        if flat is None:
            return x
        if what == "add":
            added = ops.reshape(ops.scatter_add(v, flat, x.size, bad), x.shape)
            return ops.add(x, ops.astype(added, x.dtype))
        if v.size > scatter.LAST_MAX:  # (positions past a uint32's range)
            return None
        last = ops.astype(ops.scatter_last(flat, x.size, bad), _dt.int64)
        picked = gather_flat(ops.contiguous(ops.reshape(v, (-1,))), ops.maximum(ops.subtract(last, 1), 0))
        return ops.reshape(ops.where(last > 0, picked, ops.reshape(x, (-1,))), x.shape)

    def _along_one_axis(self, key: tuple, value, what: str) -> tuple | None:
        """(v, indices, take params) where the key is one index array along an axis of x itself (the
        others whole): the value broadcast to what it selects, in x's dtype, for ``take_add`` or
        ``take_set`` (no flat position an element); None for any other key."""
        x = self.x
        items = _expand(x, key)
        adv, y, axis_of = _basic_part(x, items)
        if len(adv) != 1 or y is not x or not isinstance(items[adv[0]], (np.ndarray, Node)):
            return None
        k, axis = items[adv[0]], axis_of[adv[0]]
        n = x.shape[axis]
        if isinstance(k, np.ndarray):  # (checked here, at once)
            if k.size and (k.min() < -n or k.max() >= n):
                raise InvalidIndexError(f"index out of bounds for axis with size {n}")
            idx, checked = ops.asarray(k, device=x.ctx), False
        elif n == 0 and k.size:
            return None  # (nothing to add to: the general path reports the indices)
        else:
            ops.ctx_of(x, k)  # (indices on another device: the usual error, before any work)
            idx, checked = k, True
        shape = x.shape[:axis] + idx.shape + x.shape[axis + 1:]
        if what == "set" and idx.size > scatter.LAST_MAX:  # (its rank is one plus a position, a uint32)
            return None
        v = self._value(value, shape, what)
        return v, idx, take_params(x.shape, axis, idx.size, "raise", checked)

    def _value(self, value, shape: tuple, what: str) -> Array:
        """The update's value broadcast to the `shape` the indices select, in x's dtype."""
        x = self.x
        v = value if isinstance(value, Node) else ops.asarray(value, device=x.ctx)
        if v.ctx is not x.ctx:
            raise InvalidValueError(f"x.at[...].{what}: the value is on another device than x")
        try:
            v = ops.broadcast_to(v, shape)
        except hal.InvalidArgumentError:
            raise InvalidValueError(f"x.at[...].{what}: a value of shape {v.shape} does not broadcast to the "
                                    f"{shape} elements the indices select") from None
        return ops.astype(v, x.dtype)

    def _selected(self, key: tuple, value, what: str) -> tuple | None:
        """(flat, bad, v) of an update through array indices on the device: the selected elements'
        flat positions in x, True where one computed on the device is out of range (or None), and the
        value broadcast to them, in x's dtype; None where the key's basic items select a view other
        than x itself (the host then does it); (None, None, None) for an empty selection."""
        x = self.x
        y, flat, bad, shape = _advanced_flat(x, key)
        if y is not x and not (y.shape == x.shape and y.layout() == x.layout() and y.root is x.root):
            return None
        if flat is None:
            return None, None, None
        v = self._value(value, shape, what)
        if bad is not None:
            bad = ops.broadcast_to(bad, shape)
        return flat, bad, v

    def _update_on_host(self, value, combine) -> Array:
        """Array indices (which may repeat) updated as numpy's ufunc.at does, on host data (no gradient:
        refused inside a differentiated function rather than cutting the gradient off)."""
        x = self.x
        if differentiated(x) or (isinstance(value, Node) and differentiated(value)):
            raise hal.UnimplementedError("x.at[...] with integer-array or boolean indices has no gradient: the update "
                                         "runs on the host (basic indices and slices are differentiable)")
        host = np.array(np.asarray(x.numpy()))
        key = tuple(np.asarray(k.numpy()) if isinstance(k, Node) else k for k in
                    (self.key if isinstance(self.key, tuple) else (self.key,)))
        val = np.asarray(value.numpy()) if isinstance(value, Node) else np.asarray(value)
        if val.dtype.kind not in "biufc":
            raise InvalidTypeError(f"an update value must be numeric data, got {val.dtype}")
        ufunc = {None: None, ops.add: np.add, ops.multiply: np.multiply, ops.minimum: np.minimum,
                 ops.maximum: np.maximum}[combine]
        try:
            if ufunc is None:
                host[key] = val
            else:
                ufunc.at(host, key, val.astype(host.dtype))
        except IndexError as exc:
            raise InvalidIndexError(str(exc)) from None
        except ValueError as exc:  # values that do not broadcast to what the indices select
            raise InvalidValueError(str(exc)) from None
        return ops.asarray(host, dtype=x.dtype, device=x.ctx)
