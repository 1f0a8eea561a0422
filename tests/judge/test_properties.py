"""Property tests: the checker and the verifier never raise, whatever they are given."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from capseal.judge import check_body, check_judgment_capsule, check_links, verify_entry
from capseal.judge.schema import render_path
from capseal.record import storage_json

from .conftest import JUDGE, load

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**60), 2**60), st.text(max_size=12), st.floats(allow_nan=False))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=5)), max_leaves=20)
BASE = load(JUDGE / "evaluation-report" / "pos-example-org-evaluation-report.json")
KEYS = ["record_version", "epistemic_type", "cases", "judge_pin", "contract_ref", "generated_at", "record_id"]


@settings(max_examples=120, deadline=None)
@given(json_values)
def test_check_body_never_raises(value: Any) -> None:
    for v in check_body(value):
        assert v.rule and v.path.startswith("$")


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(KEYS), json_values)
def test_check_body_names_a_rule_for_every_edit(key: str, value: Any) -> None:
    body = {**BASE, key: value}
    violations = check_body(body)
    if type(value) is not type(BASE[key]):  # a value of another JSON type is never a legal edit
        assert violations and all(v.rule for v in violations)


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_judgment_capsule_checker_never_raises(value: Any) -> None:
    check_judgment_capsule(value if isinstance(value, dict) else {"x": value}, preimages={"rubric": value, "judge_parameters": value})


@settings(max_examples=60, deadline=None)
@given(json_values, st.lists(json_values, max_size=3))
def test_link_checker_never_raises(etype: Any, links: list[Any]) -> None:
    check_links(etype, links)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_values, etype=st.text(max_size=20), rtype=st.sampled_from(["judge:evaluation-report/v1", "judge:artifact/v1", "judge:evidence-result/v0", "judge:x"]))
def test_verify_entry_never_raises(world: Any, body: Any, etype: str, rtype: str) -> None:
    entry = world.store.ledger.entry(world.rubric_t.digest)
    forged = dataclasses.replace(entry, body=storage_json({"record_version": "capseal-judgment/1", "record": body, "envelopes": [body]}), epistemic_type=etype, record_type=rtype)
    report = verify_entry(forged, ledger=world.store.ledger, keys=None)
    assert report.ok is False


def test_render_path_quotes_odd_members() -> None:
    assert render_path(("cases", 0, "x-evidence-links", "a b")) == '$.cases[0]["x-evidence-links"]["a b"]'
