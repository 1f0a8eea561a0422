"""Reading JSON values that may be anything: numbers, equality, and floats.

Every helper here returns an answer for any value it is given (a huge integer,
a NaN, a cycle, nesting thousands deep) and never raises: the readers build on
them, and a reader degrades a bad value into a defect.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

__all__ = [
    "INT32_MAX",
    "MAX_DEPTH",
    "is_number",
    "finite",
    "whole_count",
    "truncated_int",
    "json_equal",
    "key_text",
    "brief",
    "members",
    "floats_in",
]

INT32_MAX = 2**31 - 1
#: how deep a walk over a record goes before it stops (deeper nesting is reported, not followed)
MAX_DEPTH = 256


def is_number(value: Any) -> bool:
    """A JSON number: an int or a float, never a boolean.

    Args:
        value: any value.

    Returns:
        True for an int or a float that is not a boolean.
    """
    return type(value) is int or type(value) is float


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, NaN, ±inf, or too big for a float).

    Args:
        value: any value.

    Returns:
        The finite float, or None.
    """
    if not is_number(value):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


def whole_count(value: Any) -> int | None:
    """A count: a number with an integral value no larger than 2³¹−1 in size, else None.

    Args:
        value: any value.

    Returns:
        The count, or None.
    """
    if type(value) is int:
        return value if -INT32_MAX <= value <= INT32_MAX else None
    number = finite(value)
    if number is None or not number.is_integer() or abs(number) > INT32_MAX:
        return None
    return int(number)


def truncated_int(value: Any) -> int | None:
    """A number truncated towards zero to an integer within 2³¹−1 in size, else None.

    Args:
        value: any value.

    Returns:
        The integer, or None.
    """
    if type(value) is int:
        return value if -INT32_MAX <= value <= INT32_MAX else None
    number = finite(value)
    if number is None or abs(number) >= INT32_MAX + 1:
        return None
    return int(number)


def _same_float(a: float, b: float) -> bool:
    # a boxed double's equality: NaN equals NaN, 0.0 is not -0.0
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def json_equal(a: Any, b: Any, *, max_depth: int = MAX_DEPTH) -> bool | None:
    """Deep equality of two parsed JSON values, strict about types: key order is
    ignored, list order matters, and a boolean, an integer and a float are never
    equal to one another (``1`` is not ``1.0``: they are different literals).
    None when the values nest deeper than ``max_depth`` or hold a cycle.

    Args:
        a: a parsed JSON value.
        b: another.
        max_depth: how deep to compare.

    Returns:
        True or False, or None when the values cannot be compared.
    """
    stack: list[tuple[Any, Any, int]] = [(a, b, 0)]
    on_path: set[tuple[int, int]] = set()
    visits = 0
    while stack:
        x, y, depth = stack.pop()
        visits += 1
        if x is y and type(x) is not float:  # the very same value (a NaN is compared below)
            continue
        if depth > max_depth or visits > 1_000_000:
            return None
        if type(x) is not type(y):
            if not (isinstance(x, dict) and isinstance(y, dict)) and not (isinstance(x, list) and isinstance(y, list)):
                return False
        if isinstance(x, dict):
            if not isinstance(y, dict) or len(x) != len(y):
                return False
            pair = (id(x), id(y))
            if pair in on_path:
                return None
            on_path.add(pair)
            for k, v in x.items():
                if k not in y:
                    return False
                stack.append((v, y[k], depth + 1))
        elif isinstance(x, list):
            if not isinstance(y, list) or len(x) != len(y):
                return False
            pair = (id(x), id(y))
            if pair in on_path:
                return None
            on_path.add(pair)
            stack.extend((u, v, depth + 1) for u, v in zip(x, y))
        elif type(x) is float:
            if not _same_float(x, y):
                return False
        elif x != y:
            return False
    return True


def brief(value: Any) -> str:
    """A short, safe rendering of any value for a note or a check's detail: JSON
    literals as JSON, a string quoted (cut at 60 characters), a huge integer or
    a container by what it is; never a repr that could recurse or fail.

    Args:
        value: any value.

    Returns:
        A short text naming it.
    """
    if value is None or type(value) is bool:
        return "null" if value is None else "true" if value else "false"
    if type(value) is int:
        return str(value) if abs(value) < 10**18 else "a very large integer"
    if type(value) is float:
        return repr(value)
    if isinstance(value, str):
        return repr(value[:60] + ("…" if len(value) > 60 else ""))
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def key_text(key: Any) -> str:
    """A member name as it appears in a defect path (a non-string key by its repr).

    Args:
        key: a member name (a string, or anything a caller put there).

    Returns:
        The name as text.
    """
    return key if isinstance(key, str) else repr(key)


def members(value: Any, path: str, *, max_depth: int = MAX_DEPTH) -> Iterator[tuple[str, str, Any]]:
    """``(path, field, value)`` of every member of ``value``, depth first: the
    path of the object holding it and its member name (``name[i]`` for an
    element of a list held at ``name``). Stops at ``max_depth`` and at cycles.

    Args:
        value: a parsed JSON value.
        path: its own path.
        max_depth: how deep to walk.

    Returns:
        An iterator of ``(path, field, value)``.
    """
    # each entry: the node, the path of the object holding it, and its name there
    stack: list[tuple[Any, str, str, int]] = [(value, path, "", 0)]
    seen: set[int] = set()
    while stack:
        node, holder, name, depth = stack.pop()
        if depth > max_depth or not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        where = f"{holder}.{name}" if name else holder
        if isinstance(node, dict):
            entries = [(where, key_text(k), v) for k, v in node.items()]
        else:  # an element of a list belongs to the object holding the list
            entries = [(holder, f"{name}[{i}]", v) for i, v in enumerate(node)]
        children = []
        for at, field, v in entries:
            yield at, field, v
            if isinstance(v, (dict, list)):
                children.append((v, at, field, depth + 1))
        stack.extend(reversed(children))


def floats_in(value: Any, path: str, *, max_depth: int = MAX_DEPTH) -> Iterator[tuple[str, str]]:
    """``(path, field)`` of every float in ``value`` (see :func:`members`).

    Args:
        value: a parsed JSON value.
        path: its own path.
        max_depth: how deep to walk.

    Returns:
        An iterator of ``(path, field)``.
    """
    return ((at, field) for at, field, v in members(value, path, max_depth=max_depth) if type(v) is float)
