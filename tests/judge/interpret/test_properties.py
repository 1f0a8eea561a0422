"""Property tests: random and mutated maps never raise, never reach the reader-failure
fallback, leave the input unchanged byte for byte, and give a summary that mentions
exactly the tokens in the fields (for the value and for each of its items)."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from capseal.judge.interpret import read
from capseal.judge.interpret.dispatch import READER_FAILURE

from .conftest import ALL_STORED, stored
from .oracle import disagreements
from .test_precedence import mesh, vector

#: member names the readers look for, so random maps reach the readers' branches
MEMBERS = (
    "aggregated", "individual", "individualByName", "seats", "decision", "compositeAttempts", "subVerdicts", "status",
    "reasonCode", "reasoning", "score", "checks", "metadata", "aggregation", "strategy", "errorPolicy", "passCount",
    "failCount", "eligibleCount", "kind", "tier", "basis", "name", "relation", "policy", "disposition", "verdict",
    "record_version", "result_version", "claims", "cases", "parties", "sufficiency", "state", "row", "book_version",
    "value", "min", "max", "position", "verdictKey", "keySource", "failure", "failureCode",
)
TOKENS = (
    "pass", "fail", "abstain", "error", "not_applicable", "PASS", "FAIL", "met", "not_met", "corroborated",
    "contradicted:node-b", "tier", "own", "undecided", "individual_rejection", "tier_outcome", "cascade_tier",
    "REJECT_ON_ANY_FAIL", "used", "stage_failed", "consensus", "propagate", "evaluation-report/v1", "adjudication/v1",
    "evidence-result-v0", "human-rating/v1", "adjudicated", "not_adjudicated", "SATISFIED", "GAP",
    "passed", "ACCEPTED", "it's", "a (b", "x [y] z", "\ud800", "\x00", "",
)
text = st.one_of(st.sampled_from(TOKENS), st.text(alphabet=st.sampled_from("ab '()[]:\\\"\n\ud800\x00é"), max_size=8))
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), text, st.just(10**400))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.one_of(st.sampled_from(MEMBERS), text), inner, max_size=5)),
    max_leaves=25,
)


def fixtures() -> list[Any]:
    return [stored(name) for name in ALL_STORED] + [
        vector("judge/evaluation-report/pos-example-org-evaluation-report.json"),
        vector("judge/adjudication/pos-example-org-twin-adjudication.json"),
        vector("judge/human-rating/pos-example-org-human-rating.json"),
        vector("judge/calibration-summary/pos-example-org-calibration-summary.json"),
        vector("judge/close/pos-example-org-close-linked.json"),
        vector("evidence-result/pos-example-org-claims-result.json"),
        mesh("contradicted:node-b", "CONTRADICTED"),
        {"book_version": "capseal-referee-book/1", "pair": {"node_ids": ["node-a", "node-b"]}, "called": True,
         "row": {"state": "adjudicated", "referee": "node-c", "tier": 1, "verdict": "contradicted:node-b"}},
    ]


FIXTURES = fixtures()


def containers(value: Any) -> list[Any]:
    """Every object and list in ``value``, outermost first."""
    out, stack = [], [value]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            out.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return out


@st.composite
def mutated(draw: Any) -> Any:
    value = copy.deepcopy(draw(st.sampled_from(FIXTURES)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        places = containers(value)
        target = places[draw(st.integers(min_value=0, max_value=len(places) - 1))]
        if isinstance(target, dict) and target:
            key = draw(st.sampled_from(sorted(target, key=str)))
            action = draw(st.sampled_from(("replace", "delete", "add")))
            if action == "replace":
                target[key] = draw(json_values)
            elif action == "delete":
                del target[key]
            else:
                target[draw(st.one_of(st.sampled_from(MEMBERS), text))] = draw(json_values)
        elif isinstance(target, list) and target:
            index = draw(st.integers(min_value=0, max_value=len(target) - 1))
            target[index] = draw(json_values)
        elif isinstance(target, list):
            target.append(draw(json_values))
    return value


def check(value: Any) -> None:
    before = json.dumps(value, ensure_ascii=True)
    kept = copy.deepcopy(value)
    reading = read(value)  # never raises
    assert json.dumps(value, ensure_ascii=True) == before  # unchanged byte for byte
    assert json.dumps(kept, ensure_ascii=True) == before
    for i in [reading.interpretation, *(item.interpretation for item in reading.items)]:
        assert not [d for d in i.defects if d.note.startswith(READER_FAILURE)], i.defects
        assert disagreements(i) == [], i.summary
        json.dumps(i.to_json(), ensure_ascii=True, allow_nan=False)  # the serialised form is plain JSON
        i.summary.encode("utf-8")


@given(json_values)
def test_random_values_never_raise_are_not_modified_and_summaries_agree(value: Any) -> None:
    check(value)


@given(st.dictionaries(st.sampled_from(MEMBERS), json_values, max_size=8))
def test_random_maps_never_raise_are_not_modified_and_summaries_agree(value: Any) -> None:
    check(value)


@given(mutated())
def test_mutated_records_never_raise_are_not_modified_and_summaries_agree(value: Any) -> None:
    check(value)


def test_hostile_values_never_raise() -> None:
    cyclic: dict[str, Any] = {"aggregated": {"status": "pass"}}
    cyclic["compositeAttempts"] = [{"name": "loop", "relation": "meta_member", "disposition": "used", "verdict": cyclic}]
    cyclic["decision"] = {"kind": "tier", "tier": "loop", "basis": "tier_outcome"}
    deep: Any = {"aggregated": {"status": "pass", "reasoning": "r", "checks": []}}
    for _ in range(5000):
        deep = {"aggregated": {"status": "pass", "reasoning": "r", "checks": [], "metadata": {"x": deep}},
                "compositeAttempts": [deep]}
    listed: Any = []
    for _ in range(100_000):
        listed = [listed]
    body: dict[str, Any] = {"record_version": "evaluation-report/v1", "cases": [{"verdict": "met", "deep": listed}]}
    body["self"] = body
    for value in (cyclic, deep, listed, body, object(), b"\xff", "not json", 10**5000, float("nan")):
        reading = read(value)
        assert reading.interpretation.summary and reading.interpretation.reading_support in ("SUPPORTED", "UNDETERMINED", "CONTRADICTED")
