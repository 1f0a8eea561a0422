"""Canonical JSON (RFC 8785 JCS), digests and the -05 ``capsule_id``.

-05 §2: a digest is the lowercase-hex SHA-256 of UTF8(JCS(value)) over the *entire*
value; floats are forbidden and integers outside ±(2^53−1) must be strings. We check
those rules in one walk *before* canonicalizing, so the error names the JSON path.

Speed: for values made of strings, integers, booleans, null, arrays and
objects, ``json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)``
produces the JCS bytes except for key order when a key holds a character outside the
BMP (JCS sorts by UTF-16 code units, Python by code points). The walk notices such
keys and sends those values to ``rfc8785``, which stays the reference; the fast path
is property-tested byte-equal against it (tests/core/test_canonical.py).

A capsule being sealed is serialized once, with these checks made on the way
(``capseal._internal.form``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from json.encoder import encode_basestring as _encode_string
from typing import Any

import rfc8785

from .errors import FloatInDigestError, NonJSONValueError, UnsafeIntegerError, shown

__all__ = [
    "MAX_SAFE_INTEGER",
    "LOCAL_ONLY_FIELDS",
    "check_json",
    "canonical_bytes",
    "canonical_bytes_reference",
    "json_digest",
    "raw_digest",
    "capsule_id",
    "capsule_id_bytes",
    "is_hex64",
    "sorted_json",
]

MAX_SAFE_INTEGER = 2**53 - 1

#: Deepest nesting of objects and arrays the producer seals into a capsule.
#: Why a fixed bound: the serializer recurses, so without one the limit would
#: be Python's recursion limit minus however deep the caller already is, and
#: the producer could seal a capsule that a verifier, called from deeper,
#: cannot hash. Verifiers and digests of other content take any depth the
#: interpreter can serialize (a typed error past that).
MAX_DEPTH = 200

#: Top-level members of a local record that are never part of ``capsule_id`` (-05 §5.1).
LOCAL_ONLY_FIELDS = frozenset({"capsule_id", "signature", "key_id"})

_HEX64 = re.compile(r"[0-9a-f]{64}").fullmatch


_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+").fullmatch


def hex_bytes(value: Any) -> bytes | None:
    """The bytes of a hex string of digits only (either case), else None.
    Why not ``bytes.fromhex`` alone: it also takes whitespace, so "ab cd"
    would read as the same bytes as "abcd" (the reference reads digits only).

    Args:
        value: any value.

    Returns:
        The bytes, or None for anything but a string of hex digit pairs.
    """
    return bytes.fromhex(value) if type(value) is str and _HEX(value) is not None else None


def is_hex64(value: Any) -> bool:
    """True for a 64-character lowercase hex string (a SHA-256 digest in -05 form).

    Args:
        value: any value.

    Returns:
        Whether it is one.
    """
    return type(value) is str and _HEX64(value) is not None


def _child(path: str, key: str) -> str:
    if key.isidentifier():
        return f"{path}.{key}"
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


#: Deepest nesting a digest's value may have when the caller sets no bound of
#: its own. Why a bound at all: a value that contains itself (``x = []``,
#: ``x.append(x)``) has no end, and the walk must stop somewhere to say so.
DEPTH_LIMIT = 10_000

#: Most objects, arrays and members one value may hold, counted as they are
#: walked. Why: a value that shares its parts (``a = [a, a]`` sixty times
#: over) is small in memory but serializes to more members than any machine
#: holds; the walk refuses it instead of never returning.
MAX_MEMBERS = 10_000_000


def _walk(value: Any, limit: int, copy: bool) -> tuple[bool, Any]:
    """The -05 JSON rules, checked in one walk with no paths, optionally
    copying as it goes.

    Args:
        value: the value.
        limit: deepest nesting of objects and arrays allowed (the root is 1).
        copy: also return a copy made as the checks run: every object a new
            dict with its keys in code-point order, every array a list (as the
            sorted JSON text parses back). Each container is copied before its
            members are checked, so what is checked is what the copy holds,
            whatever another thread does to ``value`` meanwhile; an object's
            keys are sorted once they are known to be plain strings (a str
            subclass would compare by code of its own). The root must be an
            object.

    Returns:
        Whether some key holds a character outside the BMP (JCS orders such
        keys apart from Python's sort), and the copy (None without ``copy``).

    Raises:
        _Bad: at the first value that is not canonical -05 JSON (a bare
            marker: :func:`_locate` names it); ``_TooLarge`` past
            :data:`MAX_MEMBERS`.
    """
    t = type(value)
    if t is not dict and (copy or (t is not list and t is not tuple)):
        if copy or not (t is str or t is bool or value is None or t is int):
            raise _Bad
        if t is int and (value > MAX_SAFE_INTEGER or value < -MAX_SAFE_INTEGER):
            raise _Bad
        return False, None
    slow = False
    budget = MAX_MEMBERS
    root: list[Any] = [None]
    # (a container, the copy its copy goes into, under which key or index, its depth)
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    pop = stack.pop
    push = stack.append
    while stack:
        v, parent, slot, depth = pop()
        if depth > limit:
            raise _Bad
        budget -= len(v) + 1
        if budget < 0:
            raise _TooLarge
        if type(v) is dict:
            if copy:
                items: Any = list(v.items())
                out: Any = {}  # filled below, in key order; its members' copies replace them
                parent[slot] = out
            else:
                items, out = v.items(), None
            for k, item in items:
                if type(k) is not str:
                    raise _Bad
                if not k.isascii() and max(k) > "\uffff":
                    slow = True
                ti = type(item)
                if ti is str or ti is bool or item is None:
                    continue
                if ti is int:
                    if item > MAX_SAFE_INTEGER or item < -MAX_SAFE_INTEGER:
                        raise _Bad
                    continue
                if ti is dict or ti is list or ti is tuple:
                    push((item, out, k, depth + 1))
                    continue
                raise _Bad
            if copy:
                items.sort()  # distinct str keys: only keys are compared
                out.update(items)
        else:
            if copy:
                out = list(v)
                parent[slot] = out
            else:
                out = v
            for i, item in enumerate(out):
                ti = type(item)
                if ti is str or ti is bool or item is None:
                    continue
                if ti is int:
                    if item > MAX_SAFE_INTEGER or item < -MAX_SAFE_INTEGER:
                        raise _Bad
                    continue
                if ti is dict or ti is list or ti is tuple:
                    push((item, out, i, depth + 1))
                    continue
                raise _Bad
    return slow, root[0]


def _scan(value: Any, max_depth: int | None = None) -> bool:
    """:func:`_walk` without a copy: True if a non-BMP key needs the
    reference serializer; raises a bare ``_Bad`` at the first non-canonical
    value (``_TooLarge`` past :data:`MAX_MEMBERS`)."""
    return _walk(value, DEPTH_LIMIT if max_depth is None else max_depth, False)[0]


class _Bad(Exception):
    pass


class _TooLarge(_Bad):
    pass


def check_json(value: Any, path: str = "$", *, max_depth: int | None = None) -> bool:
    """Refuse anything that cannot be canonical -05 JSON; name the path.

    The common case pays for no path strings: paths are computed only once
    something is wrong.

    Args:
        value: the value to check.
        path: where ``value`` is, for the error (``$`` by default).
        max_depth: deepest nesting allowed (None: what the interpreter can walk).

    Returns:
        True when some object key holds a non-BMP character (the fast
        serializer would order it differently from JCS), so the caller must
        use ``rfc8785``; else False.

    Raises:
        CanonicalizationError: a value that is not canonical -05 JSON, named
            by its path: FloatInDigestError (a float), UnsafeIntegerError (an
            integer beyond ±(2^53−1)), NonJSONValueError (anything else: a
            non-string key, a lone surrogate, a cycle, too deep or too large).
    """
    try:
        return _scan(value, max_depth)
    except _TooLarge:
        raise _too_large(path) from None
    except _Bad:
        _locate(value, path, max_depth=max_depth)
        raise AssertionError("unreachable: _scan and _locate disagree") from None


def _too_large(path: str) -> NonJSONValueError:
    return NonJSONValueError(f"the value holds more than {MAX_MEMBERS:,} objects, arrays and members "
                             "(or shares its parts so often that it would serialize to that many)", path=path)


def check_structure(value: Any, path: str = "$", *, max_depth: int | None = None) -> None:
    """``check_json``'s type and nesting rules without its number rules:
    NonJSONValueError for a non-string key, a value that is not JSON, or
    nesting past ``max_depth``; floats and unsafe integers pass. Why: a caller
    that reports a float and then must know whether the value can be walked at
    all (the judge rules) would otherwise stop at the float, as check_json does,
    and miss a non-string key behind it.

    Args:
        value: the value to check.
        path: where ``value`` is, for the error.
        max_depth: deepest nesting allowed (None: what the interpreter can walk).

    Raises:
        NonJSONValueError: the first such value, named by its path.
    """
    _locate(value, path, max_depth=max_depth, numbers=False)


def _locate(value: Any, path: str, *, max_depth: int | None = None, numbers: bool = True) -> None:
    """Walk with paths and raise the typed error for the first bad value, in
    document order (with ``numbers`` False, floats and unsafe integers are not
    bad). Iterative, with the containers of the current path remembered, so a
    value that contains itself is named as a cycle instead of recursing
    without end."""
    limit = DEPTH_LIMIT if max_depth is None else max_depth
    budget = MAX_MEMBERS
    on_path: set[int] = set()
    # (value, path, depth) to check, or (None, None, id) to leave a container
    stack: list[tuple[Any, str | None, int]] = [(value, path, 1)]
    while stack:
        v, p, depth = stack.pop()
        if p is None:
            on_path.discard(depth)
            continue
        t = type(v)
        if t is dict or t is list or t is tuple:
            if id(v) in on_path:
                raise NonJSONValueError("the value contains itself (a reference cycle)", path=p[:200])
            if depth > limit:
                raise NonJSONValueError(f"objects and arrays nest deeper than {limit} levels", path=p[:200])
            budget -= len(v) + 1
            if budget < 0:
                raise _too_large(path)
            on_path.add(id(v))
            stack.append((None, None, id(v)))
            if t is dict:
                children = []
                for k, item in v.items():
                    if type(k) is not str:
                        raise NonJSONValueError(f"object key {shown(k)} is not a string", path=p)
                    children.append((item, _child(p, k), depth + 1))
            else:
                children = [(item, f"{p}[{i}]", depth + 1) for i, item in enumerate(v)]
            stack.extend(reversed(children))
            continue
        _check_scalar(v, p, numbers)


def _check_scalar(v: Any, p: str, numbers: bool) -> None:
    """The typed error for a scalar that is not canonical -05 JSON, if it is not."""
    t = type(v)
    if t is str or v is None or t is bool:
        return
    if t is int:
        if numbers and (v > MAX_SAFE_INTEGER or v < -MAX_SAFE_INTEGER):
            digits = str(v) if v.bit_length() <= 200 else f"of {v.bit_length()} bits"  # str() refuses > 4300 digits
            raise UnsafeIntegerError(f"integer {digits} is outside ±{MAX_SAFE_INTEGER}", path=p)
        return
    if isinstance(v, float):
        if not numbers:
            return
        raise FloatInDigestError(f"floating-point value {v!r}", path=p)
    if isinstance(v, int):
        raise NonJSONValueError(f"integer subclass {t.__name__} is not plain JSON; pass int()", path=p)
    raise NonJSONValueError(f"value of type {t.__name__} is not JSON", path=p)


try:  # the C encoder json.dumps itself runs, called without the encoder object dumps builds each time
    from json.encoder import c_make_encoder as _c_make_encoder  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - CPython has it
    _c_make_encoder = None

_not_json = json.JSONEncoder().default  # the TypeError json.dumps raises for a value it cannot encode


def sorted_json(value: Any) -> str:
    """Compact, key-sorted JSON text with non-ASCII characters kept as they are.

    Args:
        value: any value ``json.dumps`` encodes.

    Returns:
        Exactly ``json.dumps(value, sort_keys=True, separators=(",", ":"),
        ensure_ascii=False)`` (capseal's storage JSON, and the JCS text of a
        value with no key outside the BMP and no float).

    Raises:
        TypeError, ValueError: as ``json.dumps`` (a value it cannot encode, a cycle).
    """
    if _c_make_encoder is None:  # pragma: no cover
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "".join(_c_make_encoder({}, _not_json, _encode_string, None, ":", ",", True, False, True)(value, 0))


def _fast(value: Any) -> str:
    return sorted_json(value)


def _encode(text: str, value: Any, path: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise NonJSONValueError(
            "string holds a lone UTF-16 surrogate, which has no UTF-8 form",
            path=_surrogate_path(value, path),
        ) from None


def _surrogate_path(value: Any, path: str) -> str:
    """The path of the first string (or key) holding a lone surrogate, in
    document order; "" if none. Iterative: the value may nest deeply."""
    stack: list[tuple[Any, str, bool]] = [(value, path, False)]  # (value, path, is a key)
    while stack:
        v, p, is_key = stack.pop()
        if isinstance(v, str):
            if not _utf8_ok(v):
                return f"{p}<key>" if is_key else p
        elif isinstance(v, dict):
            children: list[tuple[Any, str, bool]] = []
            for k, item in v.items():
                children.append((k, p, True))
                children.append((item, _child(p, k) if isinstance(k, str) else p, False))
            stack.extend(reversed(children))
        elif isinstance(v, (list, tuple)):
            stack.extend(reversed([(item, f"{p}[{i}]", False) for i, item in enumerate(v)]))
    return ""


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def canonical_bytes(value: Any, *, max_depth: int | None = None, path: str = "$") -> bytes:
    """UTF-8 JCS bytes of ``value`` after the -05 number and type checks
    (and, with ``max_depth``, refusing deeper nesting: the producer's bound).
    This is the one RFC 8785 form capseal hashes and signs.

    Args:
        value: a JSON value.
        max_depth: deepest nesting allowed (None: what the interpreter can serialize).
        path: where an error says ``value`` is (see :func:`json_digest`).

    Returns:
        The canonical UTF-8 bytes.

    Raises:
        CanonicalizationError: a value that is not canonical -05 JSON, named
            by its path: FloatInDigestError (a float), UnsafeIntegerError (an
            integer beyond ±(2^53−1)), NonJSONValueError (anything else: a
            non-string key, a lone surrogate, a cycle, too deep or too large).
    """
    try:
        if check_json(value, path, max_depth=max_depth):
            return canonical_bytes_reference(value, path=path)
        return _encode(_fast(value), value, path)
    except RecursionError:
        raise NonJSONValueError("the value nests too deeply to be canonicalized", path=path) from None


def canonical_bytes_reference(value: Any, *, path: str = "$") -> bytes:
    """JCS via the ``rfc8785`` package (the reference; slower). Checks first.

    Args:
        value: a JSON value.
        path: where an error says ``value`` is.

    Returns:
        The canonical UTF-8 bytes, equal to :func:`canonical_bytes`'s.

    Raises:
        CanonicalizationError: a value that is not canonical -05 JSON, named
            by its path: FloatInDigestError (a float), UnsafeIntegerError (an
            integer beyond ±(2^53−1)), NonJSONValueError (anything else: a
            non-string key, a lone surrogate, a cycle, too deep or too large).
    """
    check_json(value, path)
    try:
        return rfc8785.dumps(value)
    except rfc8785.CanonicalizationError as exc:  # pragma: no cover - guarded above
        raise NonJSONValueError(str(exc), path=path) from None
    except UnicodeEncodeError:
        raise NonJSONValueError(
            "string holds a lone UTF-16 surrogate", path=_surrogate_path(value, path)
        ) from None


def json_digest(value: Any, *, path: str = "$") -> str:
    """-05 JSON-DIGEST: lowercase-hex SHA-256 of UTF8(JCS(value)).

    ``path`` names ``value`` in an error: the producer passes the argument's
    name (``request``, ``response``, ``reason``), since a value digested apart
    from the capsule has no place in it.

    Args:
        value: a JSON value.
        path: where an error says ``value`` is.

    Returns:
        64 lowercase hex characters.

    Raises:
        CanonicalizationError: a value that is not canonical -05 JSON, named
            by its path: FloatInDigestError (a float), UnsafeIntegerError (an
            integer beyond ±(2^53−1)), NonJSONValueError (anything else: a
            non-string key, a lone surrogate, a cycle, too deep or too large).
    """
    return hashlib.sha256(canonical_bytes(value, path=path)).hexdigest()


def raw_digest(data: bytes) -> str:
    """Lowercase-hex SHA-256 of raw bytes (prompts, files, TPM blobs).

    Args:
        data: the bytes.

    Returns:
        64 lowercase hex characters.
    """
    return hashlib.sha256(data).hexdigest()


def _preimage(capsule: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in capsule.items() if k not in LOCAL_ONLY_FIELDS}


def capsule_id_bytes(capsule: Mapping[str, Any]) -> bytes:
    """Raw 32-byte capsule id: SHA-256 over JCS of the capsule minus the
    top-level ``capsule_id``, ``signature`` and ``key_id`` (-05 §5.1). Nested
    members with those names are hashed like any other member.

    Args:
        capsule: the capsule.

    Returns:
        The 32 bytes of the id.

    Raises:
        CanonicalizationError: a value that is not canonical -05 JSON, named
            by its path: FloatInDigestError (a float), UnsafeIntegerError (an
            integer beyond ±(2^53−1)), NonJSONValueError (anything else: a
            non-string key, a lone surrogate, a cycle, too deep or too large).
    """
    return hashlib.sha256(canonical_bytes(_preimage(capsule))).digest()


def _capsule_id_scanned(capsule: Mapping[str, Any]) -> str:
    """:func:`capsule_id` of a capsule :func:`_scan` has just passed whole,
    finding no key outside the BMP: its members are canonical -05 JSON, so
    the checks are not made again (the same bytes, the same errors)."""
    value = _preimage(capsule)
    try:
        return hashlib.sha256(_encode(_fast(value), value, "$")).hexdigest()
    except RecursionError:
        raise NonJSONValueError("the value nests too deeply to be canonicalized", path="$") from None


def capsule_id(capsule: Mapping[str, Any]) -> str:
    """Hex capsule id (see :func:`capsule_id_bytes`).

    Args:
        capsule: the capsule.

    Returns:
        64 lowercase hex characters.

    Raises:
        CanonicalizationError: as :func:`capsule_id_bytes`.
    """
    return capsule_id_bytes(capsule).hex()
