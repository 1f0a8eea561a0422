"""Canonical form: the fast path equals RFC 8785 (``rfc8785``) byte for byte, and
every non-canonical value is refused with a typed error naming its JSON path."""

from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import example, given
from hypothesis import strategies as st

from capseal.canonical import (
    MAX_SAFE_INTEGER,
    canonical_bytes,
    canonical_bytes_reference,
    capsule_id,
    json_digest,
)
from capseal.errors import FloatInDigestError, NonJSONValueError, UnsafeIntegerError

# keys and strings drawn from all of Unicode (surrogates excluded: not encodable),
# with non-BMP characters and control characters over-represented
text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12) | st.sampled_from(
    ["", "a", "\U0001f600", "\ue000", "\uffff", "\U00010000x", "é", "\x00\x1f\x7f", '"\\/', "\u2028\u2029"]
)
safe_int = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
json_values = st.recursive(
    st.none() | st.booleans() | safe_int | text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(text, children, max_size=5),
    max_leaves=30,
)


@given(json_values)
@example({"\U0001f600": 1, "\ue000": 2})  # the case where code-point order differs from UTF-16 order
@example({"a": -0})
def test_fast_path_equals_rfc8785(value: object) -> None:
    assert canonical_bytes(value) == rfc8785.dumps(value) == canonical_bytes_reference(value)  # type: ignore[arg-type]


def test_non_bmp_key_order_is_utf16() -> None:
    value = {"\U0001f600": 1, "\ue000": 2}
    assert canonical_bytes(value) == '{"\U0001f600":1,"\ue000":2}'.encode()  # UTF-16: D83D < E000


@pytest.mark.parametrize(
    ("value", "error", "path"),
    [
        ({"effect": {"amount": 12.5}}, FloatInDigestError, "$.effect.amount"),
        ({"a": [1, {"b": 1.0}]}, FloatInDigestError, "$.a[1].b"),
        ({"a": float("nan")}, FloatInDigestError, "$.a"),
        ({"n": MAX_SAFE_INTEGER + 1}, UnsafeIntegerError, "$.n"),
        ({"n": [-MAX_SAFE_INTEGER - 1]}, UnsafeIntegerError, "$.n[0]"),
        ({"weird key": {"x": 2**64}}, UnsafeIntegerError, '$["weird key"].x'),
        ({1: "non-string key"}, NonJSONValueError, "$"),
        ({"b": b"bytes"}, NonJSONValueError, "$.b"),
        ({"s": "lone \ud800 surrogate"}, NonJSONValueError, "$.s"),
    ],
)
def test_refusals_name_the_path(value: object, error: type[Exception], path: str) -> None:
    with pytest.raises(error) as info:
        canonical_bytes(value)
    assert info.value.path == path  # type: ignore[attr-defined]
    assert path in str(info.value)


def test_boundary_integers_are_accepted() -> None:
    assert canonical_bytes({"a": MAX_SAFE_INTEGER, "b": -MAX_SAFE_INTEGER}) == (
        b'{"a":9007199254740991,"b":-9007199254740991}'
    )


def test_absent_null_empty_are_different_ids() -> None:
    base = {"format_version": "4", "canonicalization_id": "jcs", "action_id": "a"}
    ids = {capsule_id(base), capsule_id({**base, "references": []}), capsule_id({**base, "references": None}),
           capsule_id({**base, "references": {}})}
    assert len(ids) == 4


def test_capsule_id_excludes_only_top_level_local_fields() -> None:
    base = {"format_version": "4", "canonicalization_id": "jcs", "action_id": "a", "x-n": {"signature": "kept"}}
    with_local = {**base, "capsule_id": "0" * 64, "signature": "ab", "key_id": "cd"}
    assert capsule_id(base) == capsule_id(with_local)
    assert capsule_id(base) != capsule_id({**base, "x-n": {}})


def test_json_digest_matches_manual() -> None:
    import hashlib

    value = {"b": [1, "x"], "a": True}
    assert json_digest(value) == hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_hex_bytes_reads_digits_only() -> None:
    from capseal.canonical import hex_bytes

    assert hex_bytes("00aBff") == b"\x00\xab\xff"
    for bad in ("", "abc", "ab cd", "ab\n", " ab", "0x00", "zz", b"00", None, 12):
        assert hex_bytes(bad) is None, bad


def test_check_structure_passes_numbers_and_names_what_is_not_json() -> None:
    """check_json stops at the first float; check_structure looks past numbers
    for what cannot be walked at all (the judge rules ask it after a float)."""
    from capseal.canonical import check_structure

    check_structure({"rate": 0.85, "big": 2**60, "xs": [1.5, {"k": None}]})
    with pytest.raises(NonJSONValueError, match="not a string") as caught:
        check_structure({"rate": 0.85, "pin": {1: "x"}})
    assert caught.value.path == "$.pin"
    with pytest.raises(NonJSONValueError, match="nest deeper than 3"):
        check_structure({"a": [[[1.0]]]}, max_depth=3)
    with pytest.raises(NonJSONValueError, match="bytes"):
        check_structure([0.5, b"x"])
