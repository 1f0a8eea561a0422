"""Property tests: random builder input either raises a typed capseal error or
produces a capsule the reference verifier accepts — never anything else, and
never an overclaim."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
import pytest
from hypothesis import given
from hypothesis import strategies as st

from capseal import Producer
from capseal.errors import CapsealError
from capseal.keys import UnsafeEphemeralSigner

text = st.sampled_from(["write_order", "send_payment", "com.example.t", "x-custom", "bogus", "", "runtime_claimed",
                        "gate_executed", "hardware_tee_attested"])
json_leaf = st.none() | st.booleans() | st.integers(min_value=-(2**60), max_value=2**60) | st.text(max_size=5) | st.floats(allow_nan=True)
json_value = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=8)
HEX = st.sampled_from(["a" * 64, "0123456789abcdef" * 4, "c" * 64, "d" * 64])


@st.composite
def valid_specs(draw: Any) -> dict[str, Any]:
    """Specs a conforming producer may seal (by construction)."""
    status = draw(st.sampled_from([None, "planned", "dispatched", "confirmed", "failed", "reverted"]))
    dispatched = status not in (None, "planned")
    verdicts = ["executed", "timeout", "errored", None] if dispatched else ["blocked", "denied", "deferred", "resolved", "timeout", None]
    if status == "confirmed":
        verdicts = ["executed", "timeout", None]
    spec: dict[str, Any] = {"action_id": draw(st.text(min_size=1, max_size=8)), "action_type": draw(st.sampled_from(["decide", "fyi"]))}
    if status is not None:
        effect: dict[str, Any] = {"status": status}
        if draw(st.booleans()):
            effect["type"] = draw(st.sampled_from(["write_order", "send_payment", "inference_completion", "com.example.t", "x-custom"]))
        if draw(st.booleans()):
            effect["irreversibility_class"] = draw(st.sampled_from(["two_way", "one_way_recoverable", "one_way_terminal"]))
        if dispatched:
            if draw(st.booleans()):
                effect["request_digest"] = draw(HEX)
            if status == "confirmed" or (status in ("failed", "reverted") and draw(st.booleans())):
                effect["response_digest"] = draw(HEX)
            effect["effect_attestation"] = draw(st.sampled_from(["gate_executed", "runtime_claimed", "host_served_observed"]))
        if draw(st.booleans()):
            effect["external_ref"] = draw(st.text(min_size=1, max_size=5))
        spec["effect"] = effect
    verdict = draw(st.sampled_from(verdicts))
    if verdict is not None or draw(st.booleans()):
        approver = draw(st.sampled_from(["human", "policy", "counterparty"]))
        disposition: dict[str, Any] = {"decision": draw(st.sampled_from(["accept", "reject", "needs_input", "deferred"])),
                                       "approver": approver, "human_disposed": approver == "human" and draw(st.booleans())}
        if verdict is not None:
            disposition["verdict_class"] = verdict
        if draw(st.booleans()):
            disposition["reason_digest"] = draw(HEX)
        spec["disposition"] = disposition
    parent = draw(HEX)
    if draw(st.booleans()):
        spec["chain"] = {"parent_capsule_id": parent, "relation": draw(st.sampled_from(["follows", "confirms", "supersedes", "duplicates"]))}
    if draw(st.booleans()):
        spec["references"] = [
            {"type": t, "digest_alg": "SHA-256", "digest": d, "citation_purpose": cp}
            for t, d, cp in draw(st.lists(st.tuples(st.sampled_from(["agent-action-capsule", "com.example.doc"]),
                                                    st.sampled_from(["e" * 64, "f" * 64]),
                                                    st.sampled_from(["ran_under", "acted_on", "responds_to", "x-judged_from"])),
                                          min_size=1, max_size=3))
        ]
    if draw(st.booleans()):
        cp: dict[str, Any] = {"initiator_ref": draw(HEX)}
        rung = draw(st.sampled_from(["unilateral", "ack", "full"]))
        if rung != "unilateral":
            cp.update(counterparty_ref=draw(HEX), correlator=draw(st.text(min_size=1, max_size=4)), substantive=rung == "full")
        spec["cross_party"] = cp
    if draw(st.booleans()):
        spec["constraints"] = [{"id": "com.example.rule", "result": draw(st.sampled_from(["pass", "fail", "n/a"])),
                                "severity": "high", "blocking": draw(st.booleans())}]
    if draw(st.booleans()):
        spec["x-ext"] = draw(st.recursive(st.booleans() | st.integers(-1000, 1000) | st.text(max_size=4),
                                          lambda c: st.lists(c, min_size=1, max_size=3), max_leaves=5))
    return spec


def _mutations() -> list[Any]:
    """Each breaks one producer rule; the producer must refuse with a typed error."""
    def float_in(s: dict[str, Any]) -> None:
        s["x-amount"] = 12.5

    def unsafe_int(s: dict[str, Any]) -> None:
        s["x-count"] = 2**60

    def overclaim(s: dict[str, Any]) -> None:
        s["assurance"] = {"attestation_mode": "anchored", "effect_mode": "confirmed", "ledger_mode": "anchored"}

    def bad_approver(s: dict[str, Any]) -> None:
        s["disposition"] = {"decision": "accept", "approver": "robot", "human_disposed": False}

    def dishonest_human(s: dict[str, Any]) -> None:
        s["disposition"] = {"decision": "accept", "approver": "policy", "human_disposed": True}

    def null_member(s: dict[str, Any]) -> None:
        s["epoch_id"] = None

    def unknown_member(s: dict[str, Any]) -> None:
        s["notes"] = "free text"

    def legacy_relation(s: dict[str, Any]) -> None:
        s["chain"] = {"parent_capsule_id": "a" * 64, "relation": "resolves"}

    def planned_with_digest(s: dict[str, Any]) -> None:
        s["effect"] = {"status": "planned", "request_digest": "a" * 64}

    def confirmed_without_response(s: dict[str, Any]) -> None:
        s["effect"] = {"status": "confirmed", "effect_attestation": "gate_executed"}

    def unregistered_attestation(s: dict[str, Any]) -> None:
        s["effect"] = {"status": "confirmed", "response_digest": "a" * 64, "effect_attestation": "hardware_tee_attested"}

    def empty_list(s: dict[str, Any]) -> None:
        s["references"] = []

    def never_dispatch_with_effect(s: dict[str, Any]) -> None:
        s["effect"] = {"status": "dispatched", "effect_attestation": "runtime_claimed"}
        s["disposition"] = {"decision": "reject", "approver": "policy", "human_disposed": False, "verdict_class": "denied"}

    return [float_in, unsafe_int, overclaim, bad_approver, dishonest_human, null_member, unknown_member,
            legacy_relation, planned_with_digest, confirmed_without_response, unregistered_attestation, empty_list,
            never_dispatch_with_effect]


MUTATIONS = _mutations()


@st.composite
def specs(draw: Any) -> tuple[dict[str, Any], list[str]]:
    spec = draw(valid_specs())
    applied = draw(st.lists(st.sampled_from(MUTATIONS), max_size=2, unique=True)) if draw(st.booleans()) else []
    for mutate in applied:
        mutate(spec)
    return spec, [m.__name__ for m in applied]


@pytest.fixture(scope="module")
def producer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Producer]:
    with Producer("acme", "prop-agent@1", UnsafeEphemeralSigner(), Path(tmp_path_factory.mktemp("prop")) / "p.db") as p:
        yield p


_serial = itertools.count()


def _check_sealed(capsule: dict[str, Any]) -> None:
    result = ref.verify(capsule)
    assert result.ok, [(f.code, f.detail) for f in result.findings if f.severity == "error"]
    assert not [f for f in result.findings if f.severity == "error"]
    assert "assurance_overclaim" not in [f.code for f in result.findings]
    assert capsule["assurance"] == result.assurance | ({} if "cross_party" in capsule else {})


@given(case=specs())
def test_random_specs_are_sealed_honestly_or_refused(producer: Producer, case: tuple[dict[str, Any], list[str]]) -> None:
    spec, mutations = case
    spec["action_id"] = f"{spec['action_id']}-{next(_serial)}"  # unique per example
    before = producer.ledger.count()
    try:
        record = producer.seal(spec)
    except CapsealError:
        assert producer.ledger.count() == before  # refused: nothing written
        return
    assert not mutations, f"a spec broken by {mutations} was sealed"
    _check_sealed(record.capsule)


def test_every_mutation_is_refused(producer: Producer) -> None:
    base = {"action_id": "m", "action_type": "decide"}
    for i, mutate in enumerate(MUTATIONS):
        spec = dict(base, action_id=f"mut-{i}")
        mutate(spec)
        with pytest.raises(CapsealError):
            producer.seal(spec)


@given(
    action_id=st.text(max_size=6),
    effect_type=st.none() | text,
    request=json_value,
    response=json_value,
    attestation=text,
    outcome=st.sampled_from(["confirmed", "failed", "dispatched", "refused"]),
    verdict=st.sampled_from(["denied", "blocked", "timeout", "errored", "executed", "x-odd"]),
)
def test_random_lifecycle_calls(producer: Producer, action_id: str, effect_type: str | None, request: Any,
                                response: Any, attestation: str, outcome: str, verdict: str) -> None:
    try:
        planned = producer.planned(action_id, effect_type=effect_type, request=request)
        _check_sealed(planned.capsule)
        if outcome == "confirmed":
            record = producer.confirmed(planned, response=response, effect_attestation=attestation)
        elif outcome == "failed":
            record = producer.failed(planned, response=response, effect_attestation=attestation)
        elif outcome == "dispatched":
            record = producer.dispatched(planned, effect_attestation=attestation)
        else:
            record = producer.refused(planned, verdict_class=verdict)
    except CapsealError:
        return
    _check_sealed(record.capsule)


no_float_value = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(alphabet=st.characters(exclude_categories=["Cs"]),
                                                                max_size=4), c, min_size=1, max_size=3),
    max_leaves=8)


@given(spec=valid_specs(), extension=st.none() | st.dictionaries(st.text(max_size=3), no_float_value, min_size=1,
                                                                  max_size=3))
def test_the_stored_body_is_the_plain_serialization(producer: Producer, spec: dict[str, Any],
                                                   extension: dict[str, Any] | None) -> None:
    """The ledger row's body, made from the parts serialized once, is
    byte for byte json.dumps (sorted) of the record as sealed; the capsule
    read back is the one returned."""
    from capseal.record import RECORD_VERSION, storage_json

    spec["action_id"] = f"{next(_serial)}-{spec['action_id']}"  # unique before any NUL SQLite's json_extract cuts at
    spec.pop("chain", None)  # its parent would not be in this ledger
    if extension is not None:
        spec["x-prop"] = extension
    record = producer.seal(spec)
    plain = storage_json({"record_version": RECORD_VERSION, "capsule": record.capsule,
                             "envelopes": [e.to_json() for e in record.envelopes]})
    stored = producer.ledger.entry(record.capsule_id)
    assert stored is not None and stored.body == plain
    again = producer.ledger.get(record.capsule_id)
    assert again is not None and again.capsule == record.capsule
