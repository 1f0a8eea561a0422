"""A capsule serialized once, for the three forms sealing needs: the RFC 8785
bytes its id is made from, the copy the record holds, and the ledger row's
storage JSON, with :mod:`capseal.canonical`'s checks made on the way (the
plain path, ``CAPSEAL_NO_DIRECT=1``, makes each form on its own)."""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring as _encode_string
from typing import Any

from ..canonical import (
    DEPTH_LIMIT,
    LOCAL_ONLY_FIELDS,
    MAX_MEMBERS,
    MAX_SAFE_INTEGER,
    _Bad,
    _encode,
    _not_json,
    _TooLarge,
    canonical_bytes_reference,
    check_json,
    sorted_json,
)
from ..errors import NonJSONValueError

try:  # the C encoder json.dumps uses (absent on interpreters without _json)
    from json.encoder import c_make_encoder as _c_make_encoder  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover
    _c_make_encoder = None

__all__ = ["CapsuleForm", "capsule_form"]

# ---------------------------------------------------------------------------- a capsule, serialized once

#: where a capsule's top-level members split around its local-only members, in sorted order
_LOCAL_SORTED = tuple(sorted(LOCAL_ONLY_FIELDS))

if _c_make_encoder is not None:
    # for a copy made by _copy_sorted: its keys are in order already and it holds no cycle
    # (a fresh tree), so no sorting and no cycle markers; reentrant (it keeps no state)
    _encode_in_order = _c_make_encoder(None, _not_json, _encode_string, None, ":", ",", False, False, True)
else:  # pragma: no cover
    def _encode_in_order(value: Any, _level: int) -> tuple[str]:
        return (json.dumps(value, separators=(",", ":"), ensure_ascii=False),)


def _members_text(members: dict[str, Any], in_order: bool) -> str:
    """The members of an object as JSON text, without the braces ("" for none)."""
    if not members:
        return ""
    text = "".join(_encode_in_order(members, 0)) if in_order else sorted_json(members)
    return text[1:-1]


def _copy_sorted(value: Any, limit: int) -> tuple[dict[str, Any], bool]:
    """:func:`_scan`'s checks, and a copy of ``value`` made as they run:
    every object with its keys in code-point order, every array a list (as
    the sorted JSON text would parse back). Returns the copy and whether a
    key holds a non-BMP character; raises a bare ``_Bad`` (``_TooLarge``) at
    the first value :func:`_scan` refuses, which :func:`check_json` then names."""
    if type(value) is not dict:
        raise _Bad
    slow = False
    budget = MAX_MEMBERS
    root: list[Any] = [None]
    # (value, where its copy goes, its key or index there, depth)
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
            try:
                items = sorted(v.items())  # distinct keys: only keys are compared
            except TypeError:  # keys of types that do not compare (refused below either way)
                raise _Bad from None
            out: Any = dict(items)
            parent[slot] = out
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
        else:
            out = list(v)
            parent[slot] = out
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
    return root[0], slow


@dataclass(frozen=True)
class CapsuleForm:
    """A capsule without its local-only members, serialized once.

    Attributes:
        value: a copy of the capsule as its canonical bytes parse back (its
            own objects and lists; the caller's may change without changing it).
        data: the canonical (JCS) bytes, hashed into ``capsule_id``.
    """

    value: dict[str, Any]
    data: bytes
    _parts: tuple[str, str, str, str]  # the members sorting before, between and after the local-only ones

    def stored_text(self, capsule_id: str, signature: str | None = None, key_id: str | None = None) -> str:
        """The capsule with its local-only members, as sorted storage JSON.

        Args:
            capsule_id: its id (hex).
            signature, key_id: the inline AAC profile envelope's, when there is one.

        Returns:
            Exactly :func:`sorted_json` of :attr:`value` with those members added.
        """
        local = {"capsule_id": capsule_id, "key_id": key_id, "signature": signature}
        pieces = [self._parts[0]]
        for name, part in zip(_LOCAL_SORTED, self._parts[1:]):
            member = local[name]
            if member is not None:
                pieces.append(f"{_encode_string(name)}:{_encode_string(member)}")
            pieces.append(part)
        return "{" + ",".join(p for p in pieces if p) + "}"


def capsule_form(capsule: Mapping[str, Any], *, max_depth: int | None = None, path: str = "$") -> CapsuleForm:
    """The canonical form of a capsule being sealed (see the module docstring).

    Args:
        capsule: the capsule, without ``capsule_id``, ``signature`` and ``key_id``.
        max_depth: refuse deeper nesting (the producer's bound), as :func:`canonical_bytes`.
        path: where an error says the capsule is.

    Returns:
        The copy, its canonical bytes (those of :func:`canonical_bytes`) and
        its stored form.

    Raises:
        FloatInDigestError, UnsafeIntegerError, NonJSONValueError: as :func:`canonical_bytes`.
        NonJSONValueError: also for a capsule that is not a dict.
        ValueError: the capsule holds a local-only member.
    """
    if type(capsule) is not dict:
        raise NonJSONValueError(f"a capsule is a JSON object, not {type(capsule).__name__}", path=path)
    if any(name in capsule for name in LOCAL_ONLY_FIELDS):
        raise ValueError("a capsule's form is made without capsule_id, signature and key_id")
    limit = DEPTH_LIMIT if max_depth is None else max_depth
    try:
        try:
            copy, slow = _copy_sorted(capsule, limit)
        except _Bad:
            check_json(capsule, path, max_depth=max_depth)  # names what is wrong, as canonical_bytes does
            raise AssertionError("unreachable: _copy_sorted and check_json disagree") from None
        if slow:
            # JCS orders such keys by UTF-16 code units: the reference bytes, and the copy as they parse
            # back; the stored form (sorted by code points) is encoded apart
            data = canonical_bytes_reference(capsule, path=path)
            copy = json.loads(data)
            items = sorted(copy.items())
        else:
            items = list(copy.items())
        keys = [k for k, _ in items]
        cuts = [0, *(bisect_left(keys, name) for name in _LOCAL_SORTED), len(keys)]
        parts = tuple(_members_text(dict(items[a:b]), not slow) for a, b in zip(cuts, cuts[1:]))
        if not slow:
            data = _encode("{" + ",".join(p for p in parts if p) + "}", capsule, path)
    except RecursionError:
        raise NonJSONValueError("the value nests too deeply to be canonicalized", path=path) from None
    return CapsuleForm(copy, data, parts)  # type: ignore[arg-type]
