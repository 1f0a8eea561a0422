"""The verifier's fast paths give the strict paths' answers: a profile
envelope matched byte for byte against the one its key makes (its signature
checked by libsodium, cryptography deciding a refusal), and a stored body
taken as canonical when it is storage JSON of its own reading. Each is held
against the strict path over every one-bit change of real bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from capseal import _sodium, envelope
from capseal.audit import _ambiguous_body
from capseal.canonical import capsule_id
from capseal.envelope import EnvelopeResult, sign_envelope, verify_profile_envelope
from capseal.keys import UnsafeEphemeralSigner


def _strict(cid: str, data: Any) -> EnvelopeResult:
    return envelope._verify_profile(cid, data, EnvelopeResult())


def _same(a: EnvelopeResult, b: EnvelopeResult) -> None:
    assert (a.ok, a.findings, a.public_key, a.alg, a.kid) == (b.ok, b.findings, b.public_key, b.alg, b.kid)


def _signed() -> tuple[str, bytes]:
    cid = capsule_id({"action_id": "fast-1", "action_type": "fyi"})
    return cid, sign_envelope(UnsafeEphemeralSigner(), bytes.fromhex(cid)).cose


def test_every_one_bit_change_of_an_envelope_gets_the_strict_answer() -> None:
    cid, data = _signed()
    good = verify_profile_envelope(cid, data)
    assert good.ok and good.public_key is not None
    _same(good, _strict(cid, data))
    for i in range(len(data)):
        for bit in (0, 7):
            changed = data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1:]
            got = verify_profile_envelope(cid, changed)
            _same(got, _strict(cid, changed))
            assert not got.ok or changed == data
    other = capsule_id({"action_id": "fast-2", "action_type": "fyi"})
    for cid_given in (other, cid.upper(), cid[:-1], " " + cid[1:], "zz" + cid[2:]):
        _same(verify_profile_envelope(cid_given, data), _strict(cid_given, data))
    for value in (data + b"\x00", data[:-1], bytearray(data), data.hex(), None):
        _same(verify_profile_envelope(cid, value), _strict(cid, value))


def test_a_signature_libsodium_refuses_is_decided_by_cryptography(monkeypatch: pytest.MonkeyPatch) -> None:
    cid, data = _signed()
    monkeypatch.setattr(_sodium, "verifier", lambda: (lambda sig, msg, key: False))
    assert verify_profile_envelope(cid, data).ok  # cryptography accepts it: authored
    bad = data[:-1] + bytes([data[-1] ^ 1])
    _same(verify_profile_envelope(cid, bad), _strict(cid, bad))
    monkeypatch.setattr(_sodium, "verifier", lambda: None)  # no libsodium on the system
    assert verify_profile_envelope(cid, data).ok
    assert not verify_profile_envelope(cid, bad).ok


def test_a_small_order_key_is_refused_as_on_the_strict_path() -> None:
    cid, data = _signed()
    key_at = envelope._KEY_AT
    neutral = bytes([1]) + bytes(31)
    weak = data[:key_at] + neutral + data[key_at + 32:]
    got = verify_profile_envelope(cid, weak)
    _same(got, _strict(cid, weak))
    assert [f.code for f in got.findings] == ["envelope_kid_weak"]


BODIES = [
    b'{"a":1,"b":[true,null,"x"]}',
    b'{"b":1,"a":2}',  # reordered
    b'{"a": 1}',  # spacing
    b'{"a":1,"a":2}',  # a duplicate member, Python keeps the last
    b'{"a":{"b":1,"b":1}}',  # a duplicate that writes back the same way
    b'{"a":NaN}',
    b'{"a":Infinity}',
    b'{"a":-Infinity}',
    b'{"a":"NaN"}',
    b'{"a":1.5}',
    b'{"a":"\\ud800"}',  # a lone surrogate: no UTF-8 form
    b'{"a":"\\u00e9"}',  # an escape storage JSON writes as the character
    '{"a":"\u00e9"}'.encode(),
    b'\xef\xbb\xbf{"a":1}',  # a byte-order mark
    b'{"a":1}\n',
    b"[1,2]",
    b"{}",
    b"[" * 5000 + b"]" * 5000,
]


@pytest.mark.parametrize("body", BODIES, ids=range(len(BODIES)))
def test_a_body_read_once_gets_the_strict_verdict(body: bytes) -> None:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        parsed = None
    assert _ambiguous_body(body, parsed) == _ambiguous_body(body)


def _deep(n: int) -> Any:
    value: Any = "x"
    for _ in range(n):
        value = [value]
    return value


EXTRAS: list[Any] = [
    {},
    {"x-note": "caf\u00e9 \U0001f600"},
    {"x-note": {"\U0001f600": 1, "\uffff": 2}},  # keys outside the BMP: the reference serializer's order
    {"x-note": {"b": [1, -2, 9007199254740991], "a": None}},
    {"x-note": "\ud800"},  # a lone surrogate: no UTF-8 form
    {"x-note": _deep(3000)},  # deeper than the C encoder goes
    {"x-note": 1.5},
    {"x-note": 2**60},
    {"signature": {"\U0001f600": 1}},  # a local-only member holding what the id never covers
]


@pytest.mark.parametrize("extra", EXTRAS, ids=range(len(EXTRAS)))
def test_the_id_verify_recomputes_is_the_one_capsule_id_gives(extra: dict[str, Any]) -> None:
    from capseal.verify import verify

    capsule = {"spec_version": "1", "format_version": "4", "canonicalization_id": "jcs", "action_id": "a-1",
               "action_type": "fyi", "operator": "acme", "developer": "d@1", "timestamp": "2026-01-01T00:00:00Z",
               "capsule_id": "0" * 64}
    capsule.update(extra)
    result = verify(capsule)
    try:
        expected: str | None = capsule_id(capsule)
    except Exception as exc:  # noqa: BLE001 - the verifier's finding names it
        expected = None
        if not any(f.code in ("float_in_digest_field", "unsafe_integer_in_digest_field") for f in result.findings):
            assert f"{type(exc).__name__}: {exc}" in [f.detail for f in result.findings
                                                       if f.code == "capsule_id_uncomputable"]
    assert result.capsule_id == expected
    assert any(f.code == "capsule_id_mismatch" for f in result.findings) == (expected is not None)
