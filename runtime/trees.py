"""Trees of arrays: tuples, lists, dicts and namedtuples nesting runtime arrays, as rt.compile takes
arguments and returns results and rt.grad takes parameters (JAX's pytrees, MLX's trees).

``flatten(tree, leaves)`` appends the arrays to ``leaves`` and returns the structure with each
array replaced by its index (anything else kept as a constant); ``unflatten(spec, leaves)`` builds
the same structure over other leaves (a namedtuple as its own type).
"""

from __future__ import annotations

from collections.abc import Iterator

from .errors import InvalidTypeError
from .graph import Node


def flatten(tree, leaves: list):
    """Structure of nested tuples/lists/dicts/namedtuples with Array leaves replaced by their index."""
    if isinstance(tree, Node):
        leaves.append(tree)
        return len(leaves) - 1
    if isinstance(tree, tuple):
        body = tuple(flatten(t, leaves) for t in tree)
        if type(tree) is not tuple and hasattr(tree, "_fields"):  # a namedtuple: rebuilt as its own type
            return ("n", (type(tree), body))
        return ("t", body)
    if isinstance(tree, list):
        return ("l", tuple(flatten(t, leaves) for t in tree))
    if isinstance(tree, dict):
        return ("d", tuple((k, flatten(v, leaves)) for k, v in tree.items()))
    return ("c", tree)


def unflatten(spec, leaves: list, constants: bool = True):
    """The structure ``spec`` over ``leaves``; its constants as they were, or None (``constants=False``:
    a gradient tree has no value where the parameters held no array)."""
    if isinstance(spec, int):
        return leaves[spec]
    kind, body = spec
    if kind == "t":
        return tuple(unflatten(s, leaves, constants) for s in body)
    if kind == "l":
        return [unflatten(s, leaves, constants) for s in body]
    if kind == "d":
        return {k: unflatten(s, leaves, constants) for k, s in body}
    if kind == "n":
        cls, fields = body
        return cls(*(unflatten(s, leaves, constants) for s in fields))
    return body if constants else None


def constants(spec) -> list:
    """The values of ``spec`` that are not arrays, in order (what ``flatten`` kept as constants)."""
    if isinstance(spec, int):
        return []
    kind, body = spec
    if kind in ("t", "l"):
        return [c for s in body for c in constants(s)]
    if kind == "d":
        return [c for _, s in body for c in constants(s)]
    if kind == "n":
        return [c for s in body[1] for c in constants(s)]
    return [body]


def check_result(spec) -> None:
    """A result holds its arrays in tuples, lists, dicts and namedtuples: an array anywhere else (a
    set, an object's attribute) would hand every call the trace's placeholders, and a generator or
    iterator would be the same spent object at every call. Refused with the reason, at the trace."""
    if isinstance(spec, int):
        return
    kind, body = spec
    if kind in ("t", "l"):
        for s in body:
            check_result(s)
    elif kind == "d":
        for _, s in body:
            check_result(s)
    elif kind == "n":
        for s in body[1]:
            check_result(s)
    elif isinstance(body, Iterator):
        raise InvalidTypeError(f"rt.compile: the function returned a {type(body).__name__}: return its values "
                               "in a tuple or a list")
    else:
        inside = body if isinstance(body, (set, frozenset)) else getattr(body, "__dict__", {}).values()
        if any(isinstance(v, Node) for v in inside):
            raise InvalidTypeError(f"rt.compile: the function returned arrays inside a {type(body).__name__}: "
                                   "return arrays in tuples, lists, dicts or namedtuples")
