"""``capseal referee``: the seed's three regimes as case files through a real
``capseal referee rule`` subprocess, the book across runs, re-ask, book show,
exit codes, and bad input that leaves the book unchanged."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from capseal.canonical import json_digest
from capseal.ledger import Ledger

from .world import A_TEXT, NO_ELIGIBLE, OFF, ONE_CALL, REQUEST, World

CLI = str(Path(sys.executable).parent / "capseal")


def referee(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, "referee", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def rule_json(case: Path, *extra: str) -> dict[str, Any]:
    proc = referee("rule", str(case), "--json", *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


def test_the_seeds_three_regimes_give_exactly_its_answers(world: World) -> None:
    off = world.write_case("operator_off_calls_nothing_and_says_so",
                           world.case(settings={"adjudicate_differing_twins": False, "referee_bar_days": None}))
    one = world.write_case("differing_pair_triggers_one_call", world.case())
    none = world.write_case("no_eligible_referee", world.case(roster=("node-a", "node-b")))
    assert rule_json(off) == OFF
    assert rule_json(one) == ONE_CALL
    assert rule_json(none) == NO_ELIGIBLE
    # the one line printed is the seed's line, byte for byte
    assert referee("rule", str(one), "--json").stdout.strip() == (
        '{"counts_against":"node-b","referee_calls":1,"row":{"referee":"node-c","state":"adjudicated","tier":1,'
        '"verdict":"contradicted:node-b"}}')
    text = referee("rule", str(one))
    assert text.returncode == 0
    assert "both halves present, disagreeing (they split at word 3)" in text.stdout
    assert "selected tier 1 from node-c" in text.stdout and "signed by node-c's announced key" in text.stdout
    assert "answer   " + json.dumps(ONE_CALL, sort_keys=True, separators=(",", ":")) in text.stdout


def test_an_unset_switch_is_off_in_a_case_file(world: World) -> None:
    unset = world.write_case("unset", world.case(settings={"adjudicate_differing_twins": None, "referee_bar_days": None}))
    assert rule_json(unset) == OFF
    missing = world.case()
    del missing["settings"]
    assert rule_json(world.write_case("missing", missing)) == OFF


def test_a_book_kept_across_runs_calls_once_and_shows_what_it_holds(world: World) -> None:
    case = world.write_case("case", world.case())
    book = world.tmp / "book.db"
    first = referee("rule", str(case), "--json", "--book", str(book))
    assert json.loads(first.stdout) == ONE_CALL and "one-off key" in first.stderr
    again = rule_json(case, "--book", str(book))
    assert again == {**ONE_CALL, "referee_calls": 0}
    shown = referee("book", "show", str(book), "--json")
    assert shown.returncode == 0, shown.stderr
    pairs = json.loads(shown.stdout)["pairs"]
    assert len(pairs) == 1 and pairs[0]["row"] == ONE_CALL["row"] and pairs[0]["verified"] and pairs[0]["called"]
    assert pairs[0]["pair_state"] == "halves_disagree" and pairs[0]["rows"] == 2
    text = referee("book", "show", str(book))
    assert "both halves present, disagreeing" in text.stdout and "spent" in text.stdout
    verified = subprocess.run([CLI, "verify", str(book)], capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_reask_selects_again_after_no_eligible_referee_and_only_then(world: World) -> None:
    book = world.tmp / "book.db"
    key = world.key_uri("book-keeper")
    nobody = world.case(roster=("node-a", "node-b"))
    nobody_path = world.write_case("nobody", nobody)
    assert rule_json(nobody_path, "--book", str(book), "--key", key) == NO_ELIGIBLE
    later = copy.deepcopy(nobody)
    later["roster"].append({"node_id": "node-c", "model_hash": later["roster"][0]["model_hash"],
                            "weights_digest": later["roster"][0]["weights_digest"], "announced_key": world.pem("node-c"),
                            "blocked": False})
    later_path = world.write_case("later", later)
    assert rule_json(later_path, "--book", str(book), "--key", key) == NO_ELIGIBLE  # not retried on its own
    asked = referee("reask", str(later_path), "--book", str(book), "--key", key, "--json")
    assert json.loads(asked.stdout) == ONE_CALL, asked.stderr
    again = referee("reask", str(later_path), "--book", str(book), "--key", key, "--json")
    assert json.loads(again.stdout) == {**ONE_CALL, "referee_calls": 0}
    assert "one-off key" not in asked.stderr
    assert referee("reask", str(later_path)).returncode == 2  # --book is required


def test_twins_that_agree_and_an_orphan_are_kept_distinct_in_what_the_cli_prints(world: World) -> None:
    agree = world.write_case("agree", world.case(halves=(("node-a", A_TEXT), ("node-b", " 1,  2, 3, 4, 5"))))
    book = world.tmp / "book.db"
    out = referee("rule", str(agree), "--book", str(book))
    assert "both halves present, agreeing" in out.stdout and '"reason":"twins_agree"' in out.stdout
    from capseal.judge.referee import Book

    with Book(book, world.signer("book-keeper")) as kept:
        ref = world.referee(kept)
        held = ref.hold(world.load(world.half("node-d", A_TEXT), "node-d", A_TEXT), twin_bracket_id="bracket-7")
    shown = referee("book", "show", str(book))
    assert "one half unavailable (an orphan: a defined state, not tampering)" in shown.stdout
    assert held.capsule_id[:16] in shown.stdout and "both halves present, agreeing" in shown.stdout
    orphans = json.loads(referee("book", "show", str(book), "--json").stdout)["orphans"]
    assert [o["pair_state"] for o in orphans] == ["one_half_unavailable"]


def _count(book: Path) -> int:
    with Ledger(book, readonly=True) as ledger:
        return ledger.count()


def test_bad_input_gets_a_typed_error_naming_it_and_the_book_is_unchanged(world: World) -> None:
    book = world.tmp / "book.db"
    good = world.case()
    assert rule_json(world.write_case("good", good), "--book", str(book)) == ONE_CALL
    before = _count(book)

    one_half = copy.deepcopy(good)
    one_half["pair"]["halves"] = one_half["pair"]["halves"][:1]
    other_request = {**REQUEST, "seed": 99}
    different = copy.deepcopy(good)
    different["pair"]["halves"][1]["record"] = world.half("node-b", "1, 2, 3, 999 5", request=other_request).to_json()
    different["pair"]["halves"][1]["capsule_id"] = different["pair"]["halves"][1]["record"]["capsule"]["capsule_id"]
    forged = copy.deepcopy(good)
    forged["pair"]["halves"][1]["record"]["capsule"]["action_id"] = "forged"
    wrong_text = copy.deepcopy(good)
    wrong_text["pair"]["halves"][0]["text"] = "1, 2, 3, 4, 6"
    refused = {"one-half": (one_half, "not_a_pair", "$.pair.halves"),
               "different": (different, "twins_differ_in_request", "$.pair.halves[1]"),
               "forged": (forged, "half_forged", "$.pair.halves[1].record"),
               "wrong-text": (wrong_text, "answer_not_the_signed_body", "$.pair.halves[0].text")}
    for name, (case, reason, path) in refused.items():
        proc = referee("rule", str(world.write_case(name, case)), "--book", str(book))
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
        assert reason in proc.stderr and path in proc.stderr and proc.stdout == "", (name, proc.stderr)
        assert "Traceback" not in proc.stderr

    non_integer = copy.deepcopy(good)
    non_integer["settings"]["referee_bar_days"] = 1.5
    unknown = copy.deepcopy(good)
    unknown["settings"]["adjudicate_all_the_things"] = True
    stringy = copy.deepcopy(good)
    stringy["settings"]["adjudicate_differing_twins"] = "on"
    zero = copy.deepcopy(good)
    zero["settings"]["referee_bar_days"] = 0
    unreadable = {"non-integer-D": (non_integer, "$.settings.referee_bar_days"),
                  "unknown-setting": (unknown, "$.settings.adjudicate_all_the_things"),
                  "string-switch": (stringy, "$.settings.adjudicate_differing_twins"),
                  "zero-D": (zero, "$.settings.referee_bar_days")}
    for name, (case, path) in unreadable.items():
        proc = referee("rule", str(world.write_case(name, case)), "--book", str(book))
        assert proc.returncode == 2 and path in proc.stderr and "Traceback" not in proc.stderr, (name, proc.stderr)
    (world.tmp / "not-json.json").write_text("{not json")
    for unreadable_file in (world.tmp / "not-json.json", world.tmp / "missing.json"):
        proc = referee("rule", str(unreadable_file), "--book", str(book))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert _count(book) == before


def test_a_case_file_names_a_digest_that_is_its_own(world: World) -> None:
    case = world.case()
    assert case["pair"]["request_digest"] == json_digest(REQUEST)
    lied = copy.deepcopy(case)
    lied["pair"]["halves"][0]["capsule_id"] = "0" * 64
    proc = referee("rule", str(world.write_case("lied", lied)))
    assert proc.returncode == 1 and "capsule_id" in proc.stderr
