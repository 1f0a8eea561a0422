"""The serialised form (the consumer example's key names, in order, nulls explicit), the
example's ``describe`` over it, the re-export, and read-only: the input is byte-equal afterwards."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from typing import Any

from capseal.judge import interpret
from capseal.judge.interpret import read, reexport

from .conftest import ALL_STORED, BUD_EVAL, EXAMPLE_ONE, EXAMPLE_TWO, stored
from .world import stored_verdict

INTERPRETATION_KEYS = ["schemaVersion", "sourceVersion", "reading", "readingSupport", "decidedBy", "root", "stages", "defects", "summary"]
STAGE_KEYS = ["stage", "path", "relation", "policy", "disposition", "reason", "failure", "usedByParent", "status", "reasonCode",
              "reasoning", "evidence", "judges"]
SEAT_KEYS = ["position", "name", "keySource", "status", "reasonCode", "score", "reasoning", "checks"]


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(interpret(value).to_json()))


def test_the_block_has_its_members_in_order_with_nulls_written() -> None:
    i = as_json(stored(EXAMPLE_ONE))
    assert list(i) == INTERPRETATION_KEYS
    assert json.dumps(i["decidedBy"], separators=(",", ":")) == '{"stage":"structure","path":["structure"],"basis":"tier_outcome"}'
    assert list(i["stages"][0]) == STAGE_KEYS and i["stages"][0]["reasonCode"] is None
    assert list(i["stages"][0]["judges"][0]) == SEAT_KEYS
    assert i["stages"][0]["evidence"]["passCount"] == 1 and i["stages"][0]["evidence"]["errorCodeCounts"] == {}
    assert i["defects"] == [] and i["root"]["path"] == [] and i["root"]["stage"] is None


def test_nulls_are_explicit_except_a_null_score_scale() -> None:
    two = as_json(stored(EXAMPLE_TWO))
    assert two["decidedBy"] is None and two["root"]["evidence"] is None and two["stages"][0]["stage"] is None
    assert two["root"]["judges"][0]["keySource"] is None and "scoreScale" not in two["root"]["judges"][0]
    graded = as_json(stored(BUD_EVAL))["root"]["judges"][0]
    assert json.dumps(graded["scoreScale"], separators=(",", ":")) == '{"min":0.0,"max":1.0}'
    assert graded["score"] == 0.7777777777777778 and list(graded)[6] == "scoreScale"


def describe(i: dict[str, Any]) -> list[str]:
    """The consumer example's describe (the interpretation's fields only), collecting lines."""
    lines = []
    d = i["decidedBy"]
    lines.append(f"{i['reading']} ({i['readingSupport']}); decided by {d['stage'] if d else 'not recorded'}")
    for s in [i["root"], *i["stages"]]:
        where = "/".join(s["path"]) or "<root>"
        lines.append(f"  {where} [{s['policy'] or '-'}] {s['status']}" + (f" {s['reasonCode']}" if s["reasonCode"] else "")
                     + f": {s['reasoning']}")
        for j in s["judges"]:
            lines.append(f"    seat {j['position']} {j['name']}: {j['status']}" + (f" ({j['reasonCode']})" if j["reasonCode"] else "")
                         + f" \u2014 {j['reasoning']}")
            lines.extend(f"      [{'x' if c['passed'] else ' '}] {c['name']}: {c['detail']}" for c in j["checks"])
    return lines


def test_describe_prints_every_check_seated_anywhere_without_touching_the_stored_verdict() -> None:
    raw = stored(BUD_EVAL)

    def seated(v: dict[str, Any]) -> int:
        return sum(len(j["checks"]) for j in v["individualByName"].values()) + sum(seated(s) for s in v["subVerdicts"])

    lines = describe(as_json(raw))
    assert sum(1 for line in lines if line.startswith("      [")) == seated(raw) > 0
    assert lines[0] == "ACCEPTED (UNDETERMINED); decided by not recorded"
    assert "      [x] error_handling: error_handling=3/3" in lines


def test_describe_on_example_one_prints_both_judges_reasons() -> None:
    lines = describe(as_json(stored(EXAMPLE_ONE)))
    assert lines[0] == "UNDECIDED (SUPPORTED); decided by structure"
    assert "    seat 0 structure:ddd-review.md: pass \u2014 report present" in lines
    assert "    seat 1 reportStructure: fail \u2014 report has no bounded contexts" in lines
    assert any(line.startswith("  structure [REJECT_ON_ANY_FAIL] abstain: No consensus") for line in lines)


def test_the_input_is_byte_equal_afterwards(sealed: Any) -> None:
    from capseal.judge.interpret import read_source

    values = [stored_verdict(name) for name in ALL_STORED] + [r.original for r in read_source(sealed.path).records]
    for value in values:
        before = json.dumps(value, sort_keys=False)
        kept = copy.deepcopy(value)
        read(value)
        assert json.dumps(value, sort_keys=False) == before and value == kept


def test_a_re_exported_file_parses_equal_except_the_added_interpretation_keys() -> None:
    document = {"experimentId": "x", "items": [
        {"itemId": "1", "itemSlug": "one", "passed": False, "verdict": stored_verdict(EXAMPLE_ONE), "metadata": {}},
        {"itemId": "2", "itemSlug": "two", "verdict": None},
        {"itemId": "3", "itemSlug": "three", "verdict": stored_verdict(EXAMPLE_TWO), "interpretation": "stale"}],
        "counts": {"passes": 0}}
    before = json.dumps(document)
    again = json.loads(json.dumps(reexport(document)))
    assert json.dumps(document) == before  # the input is untouched
    assert again["items"][0]["interpretation"]["reading"] == "UNDECIDED" and again["items"][1]["interpretation"] is None
    for item in again["items"]:
        item.pop("interpretation")
    original = json.loads(before)
    original["items"][2].pop("interpretation")
    assert again == original


def test_the_consumer_example_runs_over_a_re_exported_file() -> None:
    from .examples_consumer import describe as example_describe
    from .examples_consumer import pass_rate, tally

    document = reexport({"items": [{"itemSlug": name, "verdict": stored_verdict(name)} for name in ALL_STORED]})
    items = json.loads(json.dumps(document))["items"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for item in items:
            example_describe(item)
    t = tally(items)
    assert dict(t) == {"passes": 1, "nonPasses": 4, "instrumentFailures": 3, "unverified": 3}
    assert pass_rate(t) == 0.2
    assert "example-0-17-cascade.verdict.json: UNDECIDED (SUPPORTED); decided by structure" in out.getvalue()
