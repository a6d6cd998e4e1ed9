"""Shape arithmetic: broadcasting, axes, strides (in elements), views and index parsing."""

from __future__ import annotations

import operator

from .errors import AxisError, InvalidIndexError, InvalidTypeError, InvalidValueError

MAX_DIMS = 8


def contiguous_strides(shape: tuple) -> tuple:
    strides = []
    acc = 1
    for dim in reversed(shape):
        strides.append(acc)
        acc *= dim
    return tuple(reversed(strides))


def size_of(shape: tuple) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def index_of(value, what: str) -> int:
    """``value`` as an int (ints, bools, numpy integers: ``operator.index``); InvalidTypeError naming
    ``what`` for anything else (floats included, as numpy refuses them)."""
    try:
        return operator.index(value)
    except TypeError:
        raise InvalidTypeError(f"{what} must be an integer, got {type(value).__name__}") from None


def sequence_of(values, what: str) -> list:
    """``values`` (a list, tuple, array or other iterable that is not a string) as a list;
    InvalidTypeError naming ``what`` for anything else."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidTypeError(f"{what} must be a sequence, got {type(values).__name__}")
    return list(values)


def check_shape(shape) -> tuple:
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise InvalidTypeError(f"shape must be a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in shape):
        raise InvalidValueError(f"negative dimension in shape {shape}")
    if len(shape) > MAX_DIMS:
        raise InvalidValueError(f"at most {MAX_DIMS} dimensions are supported, got {len(shape)}")
    return shape


#: broadcast_shapes' answers by their shapes (an elementwise op of a broadcast operand asks each time
#: it is built: a layer norm's four broadcasts were an eighth of its eager evaluation's bytecodes).
_BROADCASTS: dict = {}
#: The answers kept at most (the memo is emptied when full).
BROADCASTS_KEPT = 4096


def broadcast_shapes(*shapes: tuple) -> tuple:
    """numpy's broadcast of ``shapes``; InvalidValueError for shapes that do not broadcast."""
    try:
        shape = _BROADCASTS.get(shapes)
    except TypeError:  # (an unhashable dimension: computed, and refused, below)
        return _broadcast(shapes)
    if shape is None:
        shape = tuple(int(d) for d in _broadcast(shapes))  # (numpy integers hash as the ints they equal)
        if len(_BROADCASTS) >= BROADCASTS_KEPT:
            _BROADCASTS.clear()
        _BROADCASTS[shapes] = shape
    return shape


def _broadcast(shapes: tuple) -> tuple:
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dim = 1
        for s in shapes:
            j = i - (ndim - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == dim or d == 1:
                continue
            if dim == 1:
                dim = d
            else:
                raise InvalidValueError(
                    f"shapes {' '.join(map(str, shapes))} cannot be broadcast together")
        out.append(dim)
    return tuple(out)


def broadcast_strides(shape: tuple, strides: tuple, out_shape: tuple) -> tuple:
    """Strides of a view of `shape`/`strides` broadcast to `out_shape` (0 on broadcast dims)."""
    lead = len(out_shape) - len(shape)
    res = [0] * lead
    for d, st, od in zip(shape, strides, out_shape[lead:]):
        res.append(st if d == od and d != 1 else 0)
    return tuple(res)


def normalize_axis(axis: int, ndim: int) -> int:
    try:
        axis = operator.index(axis)
    except TypeError:
        raise InvalidTypeError(f"axis must be an int, got {axis!r}") from None
    if not -ndim <= axis < ndim:
        raise AxisError(f"axis {axis} is out of bounds for array of dimension {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(axis, ndim: int) -> tuple:
    """axis int | tuple | None -> sorted tuple of distinct non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(normalize_axis(a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise InvalidValueError(f"repeated axis in {axis}")
        return tuple(sorted(axes))
    return (normalize_axis(axis, ndim),)


def reshape_target(shape: tuple, newshape, size: int) -> tuple:
    if isinstance(newshape, int):
        newshape = (newshape,)
    try:
        newshape = tuple(operator.index(d) for d in newshape)
    except TypeError:
        raise InvalidTypeError(f"shape must be ints, got {newshape!r}") from None
    unknown = [i for i, d in enumerate(newshape) if d == -1]
    if len(unknown) > 1:
        raise InvalidValueError("can only specify one unknown dimension")
    if any(d < -1 for d in newshape):
        raise InvalidValueError(f"invalid shape {newshape}")
    if unknown:
        known = size_of(tuple(d for d in newshape if d != -1))
        if known == 0 or size % known:
            raise InvalidValueError(f"cannot reshape array of size {size} into shape {newshape}")
        newshape = tuple(size // known if d == -1 else d for d in newshape)
    if size_of(newshape) != size:
        raise InvalidValueError(f"cannot reshape array of size {size} into shape {newshape}")
    return check_shape(newshape)


def reshape_strides(shape: tuple, strides: tuple, newshape: tuple):
    """Strides that view `shape`/`strides` as `newshape` without a copy, or None if impossible."""
    if size_of(shape) == 0:
        return contiguous_strides(newshape)
    old = [(d, s) for d, s in zip(shape, strides) if d != 1]
    new_strides = []
    oi = 0
    ni = 0
    new_dims = list(newshape)
    res = [0] * len(new_dims)
    # Walk groups of old dims whose product equals a group of new dims.
    while ni < len(new_dims):
        if new_dims[ni] == 1:
            res[ni] = 0
            ni += 1
            continue
        if oi >= len(old):
            return None
        group_old = [old[oi]]
        prod_old = old[oi][0]
        oi += 1
        group_new = [ni]
        prod_new = new_dims[ni]
        ni += 1
        while prod_old != prod_new:
            if prod_old < prod_new:
                if oi >= len(old):
                    return None
                group_old.append(old[oi])
                prod_old *= old[oi][0]
                oi += 1
            else:
                while ni < len(new_dims) and new_dims[ni] == 1:
                    group_new.append(ni)
                    ni += 1
                if ni >= len(new_dims):
                    return None
                group_new.append(ni)
                prod_new *= new_dims[ni]
                ni += 1
        # The old group must be contiguous among itself.
        for (_, s0), (d1, s1) in zip(group_old, group_old[1:]):
            if s0 != d1 * s1:
                return None
        stride = group_old[-1][1]
        for idx in reversed(group_new):
            res[idx] = stride
            stride *= new_dims[idx]
    del new_strides
    return tuple(res)


def collapse(shape: tuple, strides_list: list) -> tuple:
    """Merge adjacent dims that are contiguous for every operand; drop size-1 dims."""
    dims = [i for i, d in enumerate(shape) if d != 1]
    if not dims:
        return (), [() for _ in strides_list]
    out_shape = [shape[dims[0]]]
    out_strides = [[s[dims[0]]] for s in strides_list]
    for i in dims[1:]:
        d = shape[i]
        if all(os[-1] == s[i] * d for os, s in zip(out_strides, strides_list)):
            out_shape[-1] *= d
            for os, s in zip(out_strides, strides_list):
                os[-1] = s[i]
        else:
            out_shape.append(d)
            for os, s in zip(out_strides, strides_list):
                os.append(s[i])
    return tuple(out_shape), [tuple(s) for s in out_strides]


def single_stride(shape: tuple, strides: tuple) -> int | None:
    """The one stride of dims that collapse into one (``collapse``; 0 for none of more than one
    element), or None where they do not."""
    cshape, (cstr,) = collapse(shape, [strides])
    if not cshape:
        return 0
    return cstr[0] if len(cshape) == 1 else None


#: Key types taken as they are, with no ellipsis or new axis to expand (bool is not int here: x[True]
#: is a mask).
_PLAIN_KEYS = frozenset((slice, int))


def plain_key(key: tuple) -> bool:
    """Whether every entry of `key` is a slice or an int (not a bool, None, Ellipsis or array): the
    usual basic index, checked in C."""
    return all(map(_PLAIN_KEYS.__contains__, map(type, key)))


def parse_index(key, shape: tuple, strides: tuple, offset: int):
    """Basic indexing -> (new shape, new strides, new offset, per-axis slice info).

    The slice info is a list over the source axes of (start, step, count, keep):
    `keep` False for an integer index (the axis disappears).
    """
    if not isinstance(key, tuple):
        key = (key,)
    if len(key) <= len(shape) and plain_key(key):  # (nothing to expand: the axes left are taken whole below)
        expanded: list | tuple = key
    else:
        n_ellipsis = sum(1 for k in key if k is Ellipsis)
        if n_ellipsis > 1:
            raise InvalidIndexError("an index can only have a single ellipsis ('...')")
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        if n_real > len(shape):
            raise InvalidIndexError(
                f"too many indices for array: array is {len(shape)}-dimensional, but {n_real} were indexed")
        expanded = []
        for k in key:
            if k is Ellipsis:
                expanded.extend([slice(None)] * (len(shape) - n_real))
            else:
                expanded.append(k)
        if n_ellipsis == 0:
            expanded.extend([slice(None)] * (len(shape) - n_real))
    new_shape, new_strides, info = [], [], []
    axis = 0
    for k in expanded:
        if k is None:
            new_shape.append(1)
            new_strides.append(0)
            continue
        dim, st = shape[axis], strides[axis]
        if isinstance(k, slice):
            try:
                start, stop, step = k.indices(dim)
            except TypeError:
                raise InvalidTypeError(f"slice bounds and steps must be integers or None, got {k!r}") from None
            except ValueError as exc:  # a zero step
                raise InvalidValueError(f"{exc} ({k!r})") from None
            count = len(range(start, stop, step))
            if count <= 1:
                step = 1  # (one element or none: the step moves nowhere, and a huge one would overflow a stride)
            offset += start * st if count else 0
            new_shape.append(count)
            new_strides.append(st * step)
            info.append((start if count else 0, step, count, True))
        else:
            try:
                idx = operator.index(k)
            except TypeError:
                raise InvalidIndexError(
                    f"only integers, slices, None and Ellipsis are valid indices, got {k!r}") from None
            if not -dim <= idx < dim:
                raise InvalidIndexError(
                    f"index {idx} is out of bounds for axis {axis} with size {dim}")
            idx %= dim
            offset += idx * st
            info.append((idx, 1, 1, False))
        axis += 1
    for dim, st in zip(shape[axis:], strides[axis:]):  # (axes the key left whole)
        new_shape.append(dim)
        new_strides.append(st)
        info.append((0, 1, dim, True))
    return tuple(new_shape), tuple(new_strides), offset, info
