"""What a store signs is what its bytes give, patterns mean what JSON Schema
means, an adjudication rules only on its parties, and malformed arguments get
typed refusals (found by a review; each test fails on the code before)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from capseal.errors import CapsuleValidationError, JudgmentRefusedError
from capseal.judge import Adjudication, JudgePin, Target, check_body, link, verify_judgment
from capseal.judge.citation import DigestRef
from capseal.model import is_namespaced, validate_capsule

from .conftest import JUDGE, NOW, World, load


def rules_of(body: dict[str, Any]) -> set[str]:
    return {v.rule for v in check_body(body)}


# --------------------------------------------------------------------------- digests of what is kept


def test_a_json_target_keeps_the_content_it_digested(world: World) -> None:
    doc: dict[str, Any] = {"rubric": "v1", "criteria": [{"id": "C1"}]}
    target = Target.of_json(doc, type="rubric")
    doc["rubric"] = "v2"  # the caller's dict changes after the Target was made
    doc["criteria"][0]["id"] = "C2"
    assert target.content == {"rubric": "v1", "criteria": [{"id": "C1"}]}
    world.store.put(target)
    assert world.store.value(target.digest) == {"rubric": "v1", "criteria": [{"id": "C1"}]}
    assert verify_judgment_ledger_ok(world)


def test_a_target_changed_in_place_is_refused_by_put(world: World) -> None:
    target = Target.of_json({"rubric": "v1"}, type="rubric")
    target.content["rubric"] = "v2"  # the content no longer gives the digest the store would sign
    count = world.producer.ledger.count()
    with pytest.raises(JudgmentRefusedError) as caught:
        world.store.put(target)
    assert caught.value.rule == "record_digest_mismatch"
    assert world.producer.ledger.count() == count and not world.store.has(target.digest)
    assert verify_judgment_ledger_ok(world)


def test_capsule_and_record_targets_are_copies(world: World) -> None:
    capsule = copy.deepcopy(world.act.capsule)
    target = Target.of_capsule(capsule)
    capsule["action_id"] = "changed"
    assert target.content["action_id"] == world.act.capsule["action_id"]
    body = load(JUDGE / "evaluation-report" / "pos-example-org-evaluation-report.json")
    record = Target.of_record(body)
    body["cases"][0]["verdict"] = "not_met"
    assert record.content["cases"][0]["verdict"] == "met"


def verify_judgment_ledger_ok(world: World) -> bool:
    import capseal

    return capseal.verify_ledger(world.producer.ledger.path).ok


# --------------------------------------------------------------------------- "$" as JSON Schema means it


@pytest.mark.parametrize(("member", "rule"), [
    ("generated_at", "timestamp_not_rfc3339"),
    ("contract_ref", "contract_ref_unversioned"),
    ("prompt_digest", "digest_malformed"),
])
def test_a_final_newline_does_not_pass_a_pattern(member: str, rule: str) -> None:
    """In Python "$" also matches before a final newline; in JSON Schema
    (ECMA-262) it does not: a 65-character "digest" was sealed and verified."""
    body = load(JUDGE / "evaluation-report" / "pos-example-org-evaluation-report.json")
    assert rules_of(body) == set()
    if member == "prompt_digest":
        body["judge_pin"]["prompt_digest"]["digest"] += "\n"
    else:
        body[member] += "\n"
    assert rule in rules_of(body)


def test_capsule_timestamps_and_namespaced_names_take_no_final_newline(world: World) -> None:
    capsule = copy.deepcopy(world.act.capsule)
    capsule["timestamp"] += "\n"
    with pytest.raises(CapsuleValidationError, match=r"\$\.timestamp"):
        validate_capsule(capsule)
    assert is_namespaced("x-acme") and not is_namespaced("x-acme\n")


# --------------------------------------------------------------------------- adjudications


def _pin() -> JudgePin:
    return JudgePin.pin(model_id="referee@1", prompt=b"Decide.\n", sampling={"seed": 1})


def test_the_referee_is_none_of_the_parties() -> None:
    a, b = Target.of_json({"half": "a"}, type="twin-half"), Target.of_json({"half": "b"}, type="twin-half")
    with pytest.raises(JudgmentRefusedError) as caught:
        Adjudication.ruling(record_id="adj", adjudicated_at=NOW, verdict="contradicted", basis=_pin(),
                            parties=[a, b], contradicted=b, referee=a)
    assert caught.value.rule == "referee_not_independent"
    referee = Target.of_json({"referee": 1}, type="referee")
    ok = Adjudication.ruling(record_id="adj", adjudicated_at=NOW, verdict="contradicted", basis=_pin(),
                             parties=[a, b], contradicted=b, referee=referee)
    body = ok.body()
    assert rules_of(body) == set()
    body["referee"] = dict(body["parties"][0], judge_purpose="referee")
    assert "referee_not_independent" in rules_of(body)  # the verifier's rules, on a body made elsewhere


def test_an_adjudicates_link_points_at_a_party(world: World) -> None:
    ruling = Adjudication.ruling(record_id="adj-1", adjudicated_at=NOW, verdict="corroborated", basis=_pin(),
                                 parties=[world.act_t])
    bystander = world.request_t
    world.assert_seal_refused(ruling, "adjudicates_not_a_party", links=[link("adjudicates", bystander)], external=[ruling.basis.prompt_digest.digest])
    sealed = world.store.seal(ruling, links=[link("adjudicates", world.act_t)], external=[ruling.basis.prompt_digest.digest])
    assert verify_judgment(sealed, world.store, external=[ruling.basis.prompt_digest.digest]).ok


# --------------------------------------------------------------------------- typed refusals


@pytest.mark.parametrize(("links", "external", "rule"), [
    (["cites"], (), "link_target_malformed"),
    ([None], (), "link_target_malformed"),
    ("cites", (), "argument_not_a_list"),
    (5, (), "argument_not_a_list"),
    ((), 5, "argument_not_a_list"),
    ((), "ab" * 32, "argument_not_a_list"),  # one digest as a str would be a set of characters
    ((), ["not-a-digest"], "link_target_malformed"),
    ((), [["x"]], "link_target_malformed"),  # unhashable items: refused by name, not a TypeError
    ((), [{}], "link_target_malformed"),
])
def test_malformed_links_and_external_are_refused(world: World, links: Any, external: Any, rule: str) -> None:
    ruling = Adjudication.ruling(record_id="adj-1", adjudicated_at=NOW, verdict="corroborated", basis=_pin(),
                                 parties=[world.act_t])
    world.assert_seal_refused(ruling, rule, links=links, external=external)


def test_supersede_of_nothing_is_refused(world: World) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        world.store.supersede(None, {"record_version": "x"})  # type: ignore[arg-type]
    assert caught.value.rule == "link_target_malformed"


@pytest.mark.parametrize("call", [
    lambda: Target.of_text(5, type="t"),  # type: ignore[arg-type]
    lambda: Target.of_text("\ud800", type="t"),
    lambda: DigestRef.of_bytes(3),  # type: ignore[arg-type]  # bytes(3) is three zero bytes
    lambda: JudgePin.pin(model_id="m", prompt="\ud800", sampling={"seed": 1}),
])
def test_text_and_bytes_that_are_neither_are_refused(call: Any) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        call()
    assert caught.value.rule == "citation_content_type"


# --------------------------------------------------------------------------- second review of these fixes


def test_a_self_approving_compile_is_refused_by_the_rules_not_only_the_builder(world: World) -> None:
    """The check lived in the builder only: a body dict sealed through the
    store, and the verifier's rules, let it through."""
    body = load(JUDGE / "contract-compile" / "pos-example-org-contract-compile.json")
    assert rules_of(body) == set()
    body["human_approval"]["digest"] = body["contract"]["digest"]
    assert "human_approval_self_certifying" in rules_of(body)
    world.assert_seal_refused(body, "human_approval_self_certifying")


def test_link_rules_never_raise_on_a_malformed_body() -> None:
    from capseal.judge import check_links

    link_ = [{"type": "adjudicates", "target": "ab" * 32}]
    bodies: list[Any] = [{"parties": [{"digest": ["not", "hex"]}]}, {"parties": 5}, 5, "", []]
    for body in bodies:
        assert [v.rule for v in check_links("adjudication", link_, body)] == (
            ["adjudicates_not_a_party"] if isinstance(body, dict) else [])


@pytest.mark.parametrize("stamp", ["2026-09-25T00:00:\uff10\uff10Z", "2026-09-25T00:00:00.\u0967Z", "\u0968026-09-25T00:00:00Z"])
def test_timestamps_take_ascii_digits_only(stamp: str, world: World) -> None:
    from capseal.judge.schema import is_rfc3339

    assert not is_rfc3339(stamp)
    capsule = copy.deepcopy(world.act.capsule)
    capsule["timestamp"] = stamp
    with pytest.raises(CapsuleValidationError):
        validate_capsule(capsule)


@pytest.mark.parametrize("call", [
    lambda store: store.put(None),
    lambda store: DigestRef.of(None),  # type: ignore[arg-type]
])
def test_more_malformed_arguments_are_typed(world: World, call: Any) -> None:
    with pytest.raises(JudgmentRefusedError):
        call(world.store)


@pytest.mark.parametrize("packet", [
    {"case_id": "c", "model": {"verdict": "met"}, "model_verdict_shown": False},
    {"case_id": "c", "notes": [{"judge_verdict": "met"}]},
    {"case_id": "c", "report": {"record_version": "evaluation-report/v1"}},
])
def test_a_verdict_anywhere_in_the_packet_is_not_blind(packet: dict[str, Any]) -> None:
    from capseal.judge import HumanRating

    with pytest.raises(JudgmentRefusedError) as caught:
        HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=Target.of_json(packet, type="rated-case"),
                       label="met")
    assert caught.value.rule == "rated_case_not_blind"


def test_the_store_refuses_a_rating_body_whose_case_it_holds_and_is_not_blind(world: World) -> None:
    from capseal.judge import HumanRating
    from capseal.judge.judges import blind_packet

    packet = world.store.put_json(blind_packet(case_id="c1", acts=[world.act_t], criterion="C1"), type="rated-case")
    rating = HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=packet, label="met")
    body = rating.body()
    body["case"] = dict(body["case"], digest=world.act_t.digest)  # the act itself, not what a rater was shown
    world.assert_seal_refused(body, "rated_case_not_blind")
    assert world.store.seal(rating).epistemic_type == "human_report"


@pytest.mark.parametrize(("ref", "ok"), [
    ("ec:x@1", True),
    ("ec:x\ufeff@1", False),  # ECMA-262 whitespace; Python's \s leaves it out
    ("ec:x\x1c@1", True),  # Python's \s takes U+001C-U+001F and U+0085; ECMA-262's does not
    ("ec:x\x85@1", True),
    ("ec:x y@1", False),
])
def test_contract_refs_follow_ecma_whitespace(ref: str, ok: bool) -> None:
    """The ContractRef pattern ^[^@\\s]+@[^@\\s]+$ means what a JSON Schema
    (ECMA-262) validator makes of it."""
    body = load(JUDGE / "evaluation-report" / "pos-example-org-evaluation-report.json")
    body["contract_ref"] = ref
    assert ("contract_ref_unversioned" not in rules_of(body)) is ok


def test_ecma_digit_and_word_classes() -> None:
    from capseal.judge.schema import _ecma_pattern

    assert _ecma_pattern(r"^\d+$").search("0123") and not _ecma_pattern(r"^\d+$").search("\u0661\u0662")
    assert _ecma_pattern(r"^\w+$").search("a_1") and not _ecma_pattern(r"^\w+$").search("\u00e9")
    assert _ecma_pattern(r"^\S+$").search("ab") and not _ecma_pattern(r"^\S+$").search("a\ufeffb")
    assert _ecma_pattern(r"^a\\s$").search("a\\s")  # an escaped backslash, then a letter s


def test_ecma_negated_classes_inside_a_set() -> None:
    from capseal.judge.schema import _ecma_pattern

    assert _ecma_pattern(r"^[\D]+$").search("ab") and not _ecma_pattern(r"^[\D]+$").search("a1")
    assert _ecma_pattern(r"^[\D]+$").search("\u0661")  # not an ECMA digit
    assert _ecma_pattern(r"^[\W]+$").search("\u00e9") and not _ecma_pattern(r"^[\W]+$").search("a")


@pytest.mark.parametrize(("pattern", "text", "ok"), [
    (r"^[\S]+$", "ab", True),
    (r"^[\S]+$", "a\u00a0b", False),  # ECMA-262 whitespace: not in \S
    (r"^[\S]+$", "a\ufeffb", False),
    (r"^[\S]+$", "a\x1cb\x85", True),  # not ECMA-262 whitespace: in \S
    (r"^[\S]+$", "\U0001f600", True),
    (r"^[a\S]+$", "a\u3000", False),
    (r"^[^\S]+$", "\u2028\ufeff \t", True),  # a negated class of \S: only whitespace
    (r"^[^\S]+$", "\x1c", False),
    (r"^[^\S\n]+$", "\n", False),
])
def test_ecma_non_space_inside_a_set(pattern: str, text: str, ok: bool) -> None:
    """\\S inside a class means ECMA-262's non-whitespace (Python's, even with
    re.ASCII, takes U+00A0 and U+FEFF and leaves out U+001C-U+001F)."""
    from capseal.judge.schema import _ecma_pattern

    assert (_ecma_pattern(pattern).search(text) is not None) is ok
