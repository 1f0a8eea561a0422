"""Issue 5 item 2: typed links — six closed types, {type, target: digest},
``adjudicates`` only on an adjudication record, and a link never changes its target."""

from __future__ import annotations

import json

import pytest

from capseal.canonical import capsule_id
from capseal.errors import JudgmentRefusedError
from capseal.judge import (
    LINK_TYPES,
    Adjudication,
    Case,
    Close,
    EvaluationReport,
    JudgePin,
    Link,
    Reconcile,
    ReconcileTallies,
    Target,
    check_links,
    link,
    verify_judgment,
)

from .conftest import NOW, World


def report(world: World, record_id: str = "er-1") -> EvaluationReport:
    pin = JudgePin.pin(model_id="judge@1", prompt=world.prompt_t, sampling={"temperature_micros": 0})
    return EvaluationReport(record_id=record_id, generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin,
                            cases=[Case.of("c1", "met", acts=[world.act_t], method=world.rubric_t)])


def adjudication(world: World) -> Adjudication:
    pin = JudgePin.pin(model_id="referee@1", prompt=world.prompt_t, sampling={"seed": 1})
    return Adjudication.ruling(record_id="adj-1", adjudicated_at=NOW, verdict="corroborated", basis=pin, parties=[world.act_t])


def test_the_six_link_types_and_nothing_else() -> None:
    assert LINK_TYPES == ("cites", "adjudicates", "supersedes", "acknowledges", "rebuts", "closes")
    target = "ab" * 32
    for t in LINK_TYPES:
        assert Link.to(t, target).header() == {"type": t, "target": target}
    for bad in ("confirms", "judged_from", "adjudicate", ""):
        with pytest.raises(JudgmentRefusedError) as caught:
            Link.to(bad, target)
        assert caught.value.rule == "link_type_unknown"


@pytest.mark.parametrize("target", ["AB" * 32, "ab" * 31, "zz" * 32, 42])
def test_a_link_target_is_a_64_hex_digest(target: object) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        Link.to("cites", target)
    assert caught.value.rule == "link_target_malformed"


def test_a_link_is_frozen() -> None:
    lk = link("cites", "ab" * 32)
    with pytest.raises((AttributeError, ValueError)):  # frozen: pydantic refuses any assignment
        lk.target = "cd" * 32  # type: ignore[misc]
    assert lk.target == "ab" * 32


def test_adjudicates_only_on_an_adjudication_record(world: World) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        world.store.seal(report(world), links=[link("adjudicates", world.act_t)])
    assert caught.value.rule == "adjudicates_requires_adjudication"
    for etype in ("semantic_judgment", "producer_claim", "derived_metric", "human_report", "observed_event"):
        assert [v.rule for v in check_links(etype, [{"type": "adjudicates", "target": "ab" * 32}])] == ["adjudicates_requires_adjudication"]
    sealed = world.store.seal(adjudication(world), links=[link("adjudicates", world.act_t)])
    assert sealed.epistemic_type == "adjudication"
    assert sealed.links == ({"type": "adjudicates", "target": world.act.capsule_id},)
    assert verify_judgment(sealed, world.store).ok


def test_close_body_link_cannot_be_adjudicates() -> None:
    head = Target.of_json({"head": 1}, type="store-head")
    close = Close.of(record_id="close-1", closed_at=NOW, period=(NOW, NOW), counts_by_kind={"capsule": 1}, head=head)
    body = close.body()
    body["x-evidence-links"] = [{"type": "adjudicates", "target": "ab" * 32}]
    from capseal.judge import check_body

    assert "adjudicates_requires_adjudication" in {v.rule for v in check_body(body)}


def test_a_link_never_changes_its_target(world: World) -> None:
    ledger = world.store.ledger
    before = ledger.entry(world.act.capsule_id)
    assert before is not None
    sealed = world.store.seal(report(world), links=[link("cites", world.act_t)])
    world.store.supersede(sealed, report(world, "er-2"))
    after = ledger.entry(world.act.capsule_id)
    assert after is not None
    assert after.body == before.body  # the target's bytes
    assert (after.record_id, after.row_hash, after.links, after.epistemic_type) == (before.record_id, before.row_hash, before.links, before.epistemic_type)
    assert capsule_id(json.loads(after.body)["capsule"]) == world.act.capsule_id  # and its digest
    old = world.store.get(sealed.digest)
    assert old is not None and old.body == sealed.body and old.links == sealed.links


def test_links_must_resolve_and_are_not_duplicated(world: World) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        world.store.seal(report(world), links=[link("cites", "ab" * 32)])
    assert caught.value.rule == "link_target_unresolved"
    with pytest.raises(JudgmentRefusedError) as caught:
        world.store.seal(report(world), links=[link("cites", world.act_t), link("cites", world.act_t)])
    assert caught.value.rule == "link_duplicate"
    sealed = world.store.seal(report(world), links=[link("rebuts", "ab" * 32)], external=["ab" * 32])
    result = verify_judgment(sealed, world.store)  # declared external when sealed: external, not unresolved
    assert result.ok and "citation_external" in result.codes() and "link_target_unresolved" not in result.codes()
    assert verify_judgment(sealed, world.store, external=["ab" * 32]).ok


def test_two_party_close_carries_its_peer_link_in_body_and_header(world: World) -> None:
    peer = Target.of_json({"peer": "close"}, type="close")
    head = Target.of_json({"head": 1}, type="store-head")
    tallies = ReconcileTallies(matched=3, a_only=0, b_only=1, conflicting=0, insufficient=0, unresolved=0)
    close = Close.of(record_id="close-1", closed_at=NOW, period=("2026-09-01T00:00:00Z", NOW), counts_by_kind={"capsule": 2},
                     head=head, reconcile=Reconcile(tallies=tallies, status="UNILATERAL"), peer_close=peer)
    assert close.body()["x-evidence-links"] == [{"type": "cites", "target": peer.digest}]
    sealed = world.store.seal(close, external=[peer.digest])
    assert sealed.epistemic_type == "producer_claim"
    assert sealed.links == ({"type": "cites", "target": peer.digest},)
    assert verify_judgment(sealed, world.store, external=[peer.digest]).ok
