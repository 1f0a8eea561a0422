"""Tool arguments and results as exact JSON, ready to digest.

A capsule's digests are taken over canonical JSON (RFC 8785 under the -05
rules), which has no floats and no integers beyond ±(2^53−1). Tool arguments
and results are full of both, so before digesting, :func:`exact_json` writes:

* a float as the string Python's ``repr`` gives it: the shortest decimal
  string that reads back as the same float (``0.1`` → ``"0.1"``, ``2.50`` →
  ``"2.5"``, ``1e21`` → ``"1e+21"``, ``1e-07`` → ``"1e-07"``, ``-0.0`` →
  ``"-0.0"``; NaN and the infinities → ``"nan"``, ``"inf"``, ``"-inf"``); a
  subclass of float (``numpy.float64``) by the same rule, as a float;
* an integer beyond ±(2^53−1) as its decimal string (``"9007199254740993"``);
* a tuple as an array, an integer object key as its decimal string;
* any other object (a pydantic model, a dataclass, a datetime, a UUID, an
  enum, a Decimal) as pydantic's ``to_jsonable_python`` gives it, then by
  the rules above.

A float and the string it is written as digest alike (``{"x": 0.5}`` and
``{"x": "0.5"}``): the digest records the value the tool saw, in one
spelling. What cannot be written so (a set, whose order is not fixed; a
cycle; bytes that are not UTF-8; a lone surrogate; nesting deeper than
:data:`capseal.canonical.MAX_DEPTH`) raises :class:`NotExactJSON`, and the
capsule then records that digest as absent, with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capseal.canonical import MAX_DEPTH, MAX_SAFE_INTEGER, json_digest
from capseal.errors import CapsealError, NonJSONValueError

__all__ = ["NotExactJSON", "exact_json", "exact_float", "digest_of"]


class NotExactJSON(NonJSONValueError):
    """A value :func:`exact_json` cannot write as canonical JSON (the path names where)."""


def exact_float(value: float) -> str:
    """The string a float argument is written as: Python's shortest
    round-trip ``repr`` of it (``float.__repr__``, so a subclass's own repr,
    such as numpy's ``np.float64(0.1)``, is not used).

    Args:
        value: a float (or an instance of a subclass).

    Returns:
        ``repr(float(value))``: ``"0.1"``, ``"1e+21"``, ``"-0.0"``, ``"nan"``, ``"inf"``.
    """
    return float.__repr__(float(value))


def exact_json(value: Any, path: str = "$") -> Any:
    """``value`` as canonical-JSON-ready data (see the module docstring).

    Args:
        value: a tool's arguments or result.
        path: the JSON path named in errors.

    Returns:
        A new value of dicts (string keys), lists, strings, booleans, None
        and safe integers.

    Raises:
        NotExactJSON: ``value`` cannot be written exactly, named by path.
    """
    return _walk(value, path, 0, set())


def digest_of(value: Any) -> tuple[str | None, str | None]:
    """The digest of ``value`` as :func:`exact_json` writes it.

    Args:
        value: a tool's arguments or result.

    Returns:
        ``(digest, None)``, or ``(None, "not_json")`` when it cannot be
        written as exact canonical JSON. Never raises.
    """
    try:
        return json_digest(exact_json(value)), None
    except (CapsealError, RecursionError):
        return None, "not_json"


def _walk(value: Any, path: str, depth: int, on_path: set[int]) -> Any:
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        number = int(value)
        return number if -MAX_SAFE_INTEGER <= number <= MAX_SAFE_INTEGER else str(number)
    if isinstance(value, float):
        return exact_float(value)
    if depth >= MAX_DEPTH:
        raise NotExactJSON(f"nesting deeper than {MAX_DEPTH}", path=path)
    if isinstance(value, Mapping):
        with _entered(value, path, on_path):
            out: dict[str, Any] = {}
            for key, item in value.items():
                name = _key(key, path)
                if name in out:
                    raise NotExactJSON(f"two keys are both written {name!r}", path=path)
                out[name] = _walk(item, f"{path}[{name!r}]", depth + 1, on_path)
            return out
    if isinstance(value, (list, tuple)):
        with _entered(value, path, on_path):
            return [_walk(item, f"{path}[{i}]", depth + 1, on_path) for i, item in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        raise NotExactJSON("a set has no fixed order", path=path)
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise NotExactJSON("bytes that are not UTF-8", path=path) from None
    return _walk(_jsonable(value, path), path, depth + 1, on_path)


def _key(key: Any, path: str) -> str:
    if isinstance(key, str):
        return str.__str__(key)
    if isinstance(key, int) and not isinstance(key, bool):
        return str(int(key))
    raise NotExactJSON(f"an object key of type {type(key).__name__}", path=path)


class _entered:
    """Marks a container as being walked, so a cycle is found instead of looping."""

    def __init__(self, value: Any, path: str, on_path: set[int]) -> None:
        self.ident, self.path, self.on_path = id(value), path, on_path

    def __enter__(self) -> None:
        if self.ident in self.on_path:
            raise NotExactJSON("a cycle (a container holding itself)", path=self.path)
        self.on_path.add(self.ident)

    def __exit__(self, *exc: object) -> None:
        self.on_path.discard(self.ident)


def _jsonable(value: Any, path: str) -> Any:
    from pydantic_core import PydanticSerializationError, to_jsonable_python

    try:
        converted = to_jsonable_python(value, bytes_mode="utf8")
    except (PydanticSerializationError, ValueError, TypeError, RecursionError):
        raise NotExactJSON(f"a {type(value).__name__} that has no JSON form", path=path) from None
    if converted is value or type(converted) is type(value):
        raise NotExactJSON(f"a {type(value).__name__} that has no JSON form", path=path)
    return converted
