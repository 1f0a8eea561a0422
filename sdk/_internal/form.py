"""A capsule serialized once, for the three forms sealing needs: the RFC 8785
bytes its id is made from, the copy the record holds, and the ledger row's
storage JSON, with :mod:`capseal.canonical`'s checks made on the way (the
plain path, ``CAPSEAL_NO_DIRECT=1``, makes each form on its own).

The capsule is encoded once, with a stand-in in the sorted place of each
local-only member (``capsule_id``, ``key_id``, ``signature``); the text is
cut there into the parts both the bytes hashed and the stored form are
joined from. Why NaN stands in: the capsule holds no float (the walk refuses
them) and a string's text escapes its quotes, so ``"capsule_id":NaN`` is
found nowhere in the text but at the stand-in.
"""

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
    _Bad,
    _encode,
    _not_json,
    _walk,
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

#: the local-only members, in sorted order
_LOCAL_SORTED = tuple(sorted(LOCAL_ONLY_FIELDS))
_STAND_IN = float("nan")
_STAND_IN_TEXTS = tuple(f"{_encode_string(name)}:NaN" for name in _LOCAL_SORTED)

if _c_make_encoder is not None:
    # for a copy made by the walk: its keys are in order already and it holds no cycle
    # (a fresh tree), so no sorting and no cycle markers; reentrant (it keeps no state)
    _encode_in_order = _c_make_encoder(None, _not_json, _encode_string, None, ":", ",", False, False, True)
else:  # pragma: no cover
    def _encode_in_order(value: Any, _level: int) -> tuple[str]:
        return (json.dumps(value, separators=(",", ":"), ensure_ascii=False),)


def _members_text(members: dict[str, Any]) -> str:
    """The members of an object as sorted JSON text, without the braces ("" for none)."""
    return sorted_json(members)[1:-1] if members else ""


def _parts_in_order(copy: dict[str, Any]) -> tuple[str, str, str, str]:
    """The members of ``copy`` (made by the walk: keys in order, no float) as
    JSON text, split where the local-only members go: one run of the encoder,
    with the stand-ins in their sorted places, cut out of the text."""
    items = list(copy.items())
    for name in reversed(_LOCAL_SORTED):  # from the last: each insertion leaves the earlier places as they were
        items.insert(bisect_left(items, (name,)), (name, _STAND_IN))  # (name,) sorts just before (name, ...)
    text = "".join(_encode_in_order(dict(items), 0))
    # each stand-in has "{" or "," before it and "," or "}" after it; the parts go without those
    a = text.find(_STAND_IN_TEXTS[0])
    b = text.find(_STAND_IN_TEXTS[1], a)
    c = text.find(_STAND_IN_TEXTS[2], b)
    a_end, b_end, c_end = a + len(_STAND_IN_TEXTS[0]), b + len(_STAND_IN_TEXTS[1]), c + len(_STAND_IN_TEXTS[2])
    return text[1:a - 1], text[a_end + 1:b - 1], text[b_end + 1:c - 1], text[c_end + 1:-1]


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
        first, after_id, after_kid, last = self._parts
        pieces = [first, f'"capsule_id":{_encode_string(capsule_id)}', after_id]
        if key_id is not None:
            pieces.append(f'"key_id":{_encode_string(key_id)}')
        pieces.append(after_kid)
        if signature is not None:
            pieces.append(f'"signature":{_encode_string(signature)}')
        pieces.append(last)
        return "{" + ",".join([p for p in pieces if p]) + "}"


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
    if "capsule_id" in capsule or "signature" in capsule or "key_id" in capsule:
        raise ValueError("a capsule's form is made without capsule_id, signature and key_id")
    limit = DEPTH_LIMIT if max_depth is None else max_depth
    try:
        try:
            slow, copy = _walk(capsule, limit, True)
        except _Bad:
            check_json(capsule, path, max_depth=max_depth)  # names what is wrong, as canonical_bytes does
            raise AssertionError("unreachable: the walk and check_json disagree") from None
        if slow:
            # JCS orders such keys by UTF-16 code units: the reference bytes, and the copy as they parse
            # back; the stored form (sorted by code points) is encoded apart
            data = canonical_bytes_reference(capsule, path=path)
            copy = json.loads(data)
            items = sorted(copy.items())
            keys = [k for k, _ in items]
            cuts = [0, *(bisect_left(keys, name) for name in _LOCAL_SORTED), len(keys)]
            first, after_id, after_kid, last = (_members_text(dict(items[i:j])) for i, j in zip(cuts, cuts[1:]))
            parts = (first, after_id, after_kid, last)
        else:
            parts = _parts_in_order(copy)
            data = _encode("{" + ",".join([p for p in parts if p]) + "}", capsule, path)
    except RecursionError:
        raise NonJSONValueError("the value nests too deeply to be canonicalized", path=path) from None
    return CapsuleForm(copy, data, parts)
