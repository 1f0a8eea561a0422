"""``capseal interpret LEDGER|FILE [--json] [--id ID]`` as a real subprocess: every
judgment record with its interpretation beside the original; exit 0 when every record
was read, 1 when one reads CONTRADICTED, 2 when the input could not be read."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import Ledger

from .conftest import EXAMPLE_ONE, EXAMPLE_TWO
from .world import append_book_row, book_entry, build, stored_verdict

CLI = str(Path(sys.executable).parent / "capseal")
VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "judge-data" / "vectors"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, "interpret", *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_a_ledger_reads_with_every_record_beside_its_interpretation(sealed: Any, tmp_path: Path) -> None:
    before = sealed.path.read_bytes()
    proc = run(str(sealed.path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert list(out) == ["interpretVersion", "source", "records", "items"]
    assert len(out["records"]) == 12 and len(out["items"]) == 12
    with Ledger(sealed.path, readonly=True) as ledger:
        for record in out["records"]:
            entry = ledger.entry(record["header"]["record_id"])
            assert entry is not None and record["record"] == entry.record() and record["header"] == entry.header()
            assert set(record["interpretation"]) >= {"reading", "readingSupport", "summary"}
    assert [i["itemSlug"] for i in out["items"][:2]] == ["er-A-1009/case A-1009/C1", "er-A-1009/case A-1009/C2"]
    assert sealed.path.read_bytes() == before  # read-only


def test_the_text_form_prints_each_record_its_summary_and_items(sealed: Any) -> None:
    proc = run(str(sealed.path))
    assert proc.returncode == 0, proc.stderr
    assert "judge:evaluation-report/v1" in proc.stdout and "REJECTED (SUPPORTED)" in proc.stdout
    assert "item er-A-1009/case A-1009/C1: ACCEPTED (SUPPORTED)" in proc.stdout
    assert "Source: the capseal record form 'calibration-summary/v1'" in proc.stdout


def test_id_selects_one_record_by_digest_or_record_id(sealed: Any) -> None:
    by_digest = json.loads(run(str(sealed.path), "--json", "--id", sealed.report.digest).stdout)
    by_name = json.loads(run(str(sealed.path), "--json", "--id", "er-A-1009").stdout)
    assert by_digest == {**by_name, "source": by_digest["source"]} and len(by_digest["records"]) == 1
    missing = run(str(sealed.path), "--id", "no-such-record")
    assert missing.returncode == 2 and missing.stderr.startswith("capseal: error:") and "no-such-record" in missing.stderr


def test_exit_1_when_a_record_reads_contradicted(tmp_path: Path) -> None:
    path = tmp_path / "judged.db"
    build(path, UnsafeEphemeralSigner())
    assert run(str(path)).returncode == 0
    with Ledger(path) as ledger:  # a spent-call row whose entry says no call was made contradicts itself
        append_book_row(ledger, book_entry({"state": "not_adjudicated", "reason": "referee_unreachable"}, called=False,
                                           at="2026-10-01T13:00:00Z"))
    proc = run(str(path), "--json")
    assert proc.returncode == 1
    supports = [r["interpretation"]["readingSupport"] for r in json.loads(proc.stdout)["records"]]
    assert supports.count("CONTRADICTED") == 1
    contradicting_file = tmp_path / "neg.json"
    shutil.copy(VECTORS / "evidence-result" / "neg-met-with-sufficiency-gap.json", contradicting_file)
    assert run(str(contradicting_file)).returncode == 1


def test_exit_2_when_the_input_cannot_be_read(tmp_path: Path) -> None:
    missing = run(str(tmp_path / "nothing.db"))
    assert missing.returncode == 2 and missing.stderr.startswith("capseal: error:")
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json\n")
    assert run(str(garbage)).returncode == 2
    broken = tmp_path / "broken.db"
    broken.write_bytes(b"SQLite format 3\x00" + b"\xff" * 200)
    proc = run(str(broken))
    assert proc.returncode == 2 and proc.stderr.startswith("capseal: error:")


def test_a_file_of_one_record_an_array_or_json_lines(tmp_path: Path) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps(stored_verdict(EXAMPLE_ONE)))
    out = json.loads(run(str(one), "--json").stdout)
    assert [r["interpretation"]["reading"] for r in out["records"]] == ["UNDECIDED"] and out["records"][0]["header"] is None
    array = tmp_path / "array.json"
    array.write_text(json.dumps([stored_verdict(EXAMPLE_ONE), stored_verdict(EXAMPLE_TWO)]))
    assert [r["interpretation"]["reading"] for r in json.loads(run(str(array), "--json").stdout)["records"]] == ["UNDECIDED", "REJECTED"]
    book = tmp_path / "book.jsonl"
    book.write_text("\n".join(json.dumps(book_entry(row, called=called)) for row, called in (
        ({"state": "adjudicated", "referee": "node-c", "tier": 1, "verdict": "contradicted:node-b"}, True),
        ({"state": "not_adjudicated", "reason": "off"}, False))) + "\n")
    out = json.loads(run(str(book), "--json").stdout)
    assert [r["interpretation"]["reading"] for r in out["records"]] == ["REJECTED", None]
    assert [i["interpretation"]["reading"] for i in out["items"]] == ["ACCEPTED", "REJECTED"]


def test_an_experiment_file_is_re_exported_with_interpretations_beside_its_verdicts(tmp_path: Path) -> None:
    document = {"experimentId": "x", "items": [{"itemSlug": "one", "passed": False, "verdict": stored_verdict(EXAMPLE_ONE)},
                                               {"itemSlug": "never", "verdict": None}], "counts": {}}
    path = tmp_path / "experiment.json"
    path.write_text(json.dumps(document))
    proc = run(str(path), "--json")
    assert proc.returncode == 0
    again = json.loads(proc.stdout)
    assert again["items"][0]["interpretation"]["reading"] == "UNDECIDED" and again["items"][1]["interpretation"] is None
    for item in again["items"]:
        del item["interpretation"]
    assert again == document
