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


# ---------------------------------------------------------------------------- a capsule serialized once

objects = st.dictionaries((text | st.sampled_from(["capsule", "capsule_ie", "key", "key_ie", "sig", "signaturf", "zz"]))
                          .filter(lambda k: k not in ("capsule_id", "signature", "key_id")), json_values, max_size=8)
local_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=70)


@given(objects, local_text, st.none() | local_text, st.none() | local_text)
@example({"\U0001f600": 1, "\ue000": {"\U0001f600": 2, "\ue000": 3}}, "ab", "cd", "ef")
@example({"a": (1, (2, {"b": ()})), "z": []}, "", None, None)
@example({"a": '"capsule_id":NaN,', 'b"key_id":NaN': {"capsule_id": "x", "signature": [0]}, "s": '"signature":NaN'},
         "ab", None, "cd")  # the stand-ins' text inside the caller's strings and keys
@example({}, "ab", "cd", "ef")
def test_capsule_form_equals_the_plain_path(value: dict[str, object], cid: str, sig: str | None,
                                            kid: str | None) -> None:
    """The bytes hashed are rfc8785's; the copy is what they parse back (key
    order included, at every level); the stored text is json.dumps of the
    copy with the local-only members, sorted."""
    from capseal._internal.form import capsule_form  # private: the fast path checked against the plain one
    from capseal.canonical import sorted_json

    form = capsule_form(value)
    assert form.data == rfc8785.dumps(value) == canonical_bytes(value)  # type: ignore[arg-type]
    parsed = json.loads(form.data)
    assert form.value == parsed
    assert json.dumps(form.value, ensure_ascii=False) == json.dumps(parsed, ensure_ascii=False)  # same order
    local = {"capsule_id": cid, **({} if sig is None else {"signature": sig}), **({} if kid is None else {"key_id": kid})}
    expected = json.dumps({**parsed, **local}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert form.stored_text(cid, sig, kid) == expected == sorted_json({**parsed, **local})


def test_capsule_form_owns_its_copy() -> None:
    from capseal._internal.form import capsule_form

    inner: dict[str, object] = {"b": [1, 2]}
    value = {"x-a": inner, "z": "t"}
    form = capsule_form(value)
    inner["b"].append(3)  # type: ignore[attr-defined]
    inner["c"] = 1
    assert form.value == {"x-a": {"b": [1, 2]}, "z": "t"}
    assert form.stored_text("0" * 64) == '{"capsule_id":"' + "0" * 64 + '","x-a":{"b":[1,2]},"z":"t"}'


hostile = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | text | st.binary(max_size=2),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(text | st.integers(), children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(text.filter(lambda k: k not in ("capsule_id", "signature", "key_id")), hostile, max_size=5),
       st.integers(min_value=1, max_value=4))
def test_capsule_form_refuses_what_canonical_bytes_refuses(value: dict[str, object], depth: int) -> None:
    """The same refusal, with the same message and path, or the same bytes."""
    from capseal._internal.form import capsule_form

    try:
        expected = canonical_bytes(value, max_depth=depth)
    except Exception as exc:  # noqa: BLE001 - compared below
        with pytest.raises(type(exc)) as caught:
            capsule_form(value, max_depth=depth)
        assert str(caught.value) == str(exc)
        assert getattr(caught.value, "path", None) == getattr(exc, "path", None)
    else:
        assert capsule_form(value, max_depth=depth).data == expected


@given(hostile)
def test_sorted_json_is_json_dumps(value: object) -> None:
    from capseal.canonical import sorted_json

    try:
        expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except Exception as exc:  # noqa: BLE001 - compared below
        with pytest.raises(type(exc)):
            sorted_json(value)
    else:
        assert sorted_json(value) == expected


def test_capsule_form_is_refused_for_a_capsule_holding_local_members() -> None:
    from capseal._internal.form import capsule_form

    for name in ("capsule_id", "signature", "key_id"):
        with pytest.raises(ValueError, match="without capsule_id"):
            capsule_form({"a": 1, name: "x"})


def test_storage_json_is_not_the_rfc8785_form_and_keeps_its_earlier_name() -> None:
    """Two names that cannot be confused: ``canonical_bytes`` (RFC 8785, what
    digests and ids are made from) and ``storage_json`` (sorted json.dumps,
    what the ledger stores); ``dumps_canonical`` stays as the earlier name."""
    from capseal.canonical import canonical_bytes
    from capseal.record import dumps_canonical, storage_json

    assert dumps_canonical is storage_json
    value = {"\U0001f600": 1, "\uffff": 2}  # RFC 8785 sorts by UTF-16 code units, json.dumps by code points
    assert storage_json(value) == '{"\uffff":2,"\U0001f600":1}'.encode()
    assert canonical_bytes(value) == '{"\U0001f600":1,"\uffff":2}'.encode()
