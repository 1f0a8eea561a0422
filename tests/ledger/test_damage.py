"""A damaged ledger is reported, never a crash and never a pass: real bit
flips, truncations, deleted tail rows, a removed -wal and columns edited to
another type, each in a real ledger file, each through `capseal verify` (exit
1 with a named finding; exit 2 only when the file could not be read at all)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capseal import Ledger, Producer
from capseal.errors import DuplicateRecordError, LedgerCorruptError
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import LedgerEntry

CLI = str(Path(sys.executable).parent / "capseal")


def _fill(path: Path, n: int, prefix: str = "a") -> None:
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        for i in range(n):
            p.seal({"action_id": f"{prefix}-{i}", "action_type": "fyi"})


def _verify(path: Path) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run([CLI, "verify", str(path), "--json"], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else {}


def _codes(report: dict[str, Any]) -> set[str]:
    return {f["code"] for f in report.get("findings", [])}


def _flip(path: Path, offset: int, bit: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ bit]))


def _page_of(path: Path, name: str) -> tuple[int, int]:
    """The byte offset of the root page of table or index ``name``, and the page size."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name=?", (name,)).fetchone()[0]
    return (root - 1) * size, size


def test_a_hash_that_is_not_hex_is_a_problem_not_a_value_error(tmp_path: Path) -> None:
    """One flipped bit turns a hex digit of a stored row hash into a letter
    that is not hex: check_chain raised a bare ValueError (from
    bytes.fromhex) and the verifier reported the whole file unreadable."""
    path = tmp_path / "l.db"
    _fill(path, 3)
    with Ledger(path, readonly=True) as ledger:
        stored = [e.row_hash for e in ledger.entries()][1]
    data = path.read_bytes()
    digit = next(i for i, ch in enumerate(stored) if ch in "abcdef")  # a-f ^ 0x10 is q-v: not hex
    _flip(path, data.index(stored.encode()) + digit, 0x10)
    with Ledger(path, readonly=True) as ledger:
        problems = ledger.check_chain()
    assert any("not 64 hex digits" in p for p in problems), problems
    code, report = _verify(path)
    assert code == 1 and "ledger_chain_broken" in _codes(report)
    assert report["counts"]["records"] == 4 and report["counts"]["ok"] >= 2  # the other rows are still verified


def test_a_truncated_ledger_is_reported_with_what_is_left(tmp_path: Path) -> None:
    """A ledger cut short (a copy interrupted, a full disk) was refused as a
    whole ('database disk image is malformed', exit 2, no record shown)."""
    path = tmp_path / "l.db"
    _fill(path, 30)
    size = path.stat().st_size
    assert _verify(path)[0] == 0
    with open(path, "r+b") as fh:
        fh.truncate(size * 2 // 3 // 4096 * 4096)
    code, report = _verify(path)
    assert code == 1, report
    assert {"ledger_integrity_failed", "ledger_tail_missing"} <= _codes(report)
    assert "ledger_unreadable" not in _codes(report)
    assert report["counts"]["ok"] > 0 and report["counts"]["records"] < 31  # what is left, each verified


@pytest.mark.parametrize("edit", ["body = CAST(body AS TEXT)", "record_id = CAST(record_id AS BLOB)",
                                  "row_hash = CAST(row_hash AS BLOB)", "nonce = x'00'"])
def test_a_column_of_another_type_fails_its_row_only(tmp_path: Path, edit: str) -> None:
    """A column edited to another storage class (TEXT for the blob body, a
    blob where text belongs) made `capseal verify` exit 2 and hide every
    other record."""
    path = tmp_path / "l.db"
    _fill(path, 3)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER records_no_update")
        db.execute(f"UPDATE records SET {edit} WHERE seq = 3")
    code, report = _verify(path)
    assert code == 1, report
    assert "ledger_unreadable" not in _codes(report) and "ledger_chain_broken" in _codes(report)
    assert len(report["records"]) == 4
    bad = [r["seq"] for r in report["records"] if not r["ok"]]
    assert bad == [3], report["records"]


def test_an_empty_or_header_damaged_ledger_is_a_damaged_ledger_not_json(tmp_path: Path) -> None:
    """A 0-byte ledger, or one whose SQLite header has a flipped bit, was read
    as a JSON file ('not JSON', exit 2)."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    code, report = _verify(empty)
    assert code == 1 and _codes(report) == {"ledger_empty"}, report
    path = tmp_path / "l.db"
    _fill(path, 2)
    _flip(path, 3, 0x01)  # "SQLite format 3": 'L' becomes 'M'
    code, report = _verify(path)
    assert code == 1 and _codes(report) == {"ledger_not_capseal"}, report
    assert "header is damaged" in report["findings"][0]["detail"]


def test_a_flipped_bit_in_the_record_id_index_is_found(tmp_path: Path) -> None:
    """SQLite's integrity check never ran: a bit flipped in an index entry
    passed verification, and the index then missed the record, so the same
    record went in a second time. Now the check finds the damage; a capsule
    is still refused (its action id, read from its body, is indexed apart),
    and another record let in twice is named."""
    path = tmp_path / "l.db"
    _fill(path, 3)
    note = LedgerEntry(f"{7:064x}", "note", "producer_claim", b'{"n":7}')
    with Ledger(path) as ledger:
        ledger.append(note)
        first = next(ledger.entries())
    start, size = _page_of(path, "sqlite_autoindex_records_1")
    for rid in (first.record_id, note.record_id):
        page = path.read_bytes()[start : start + size]
        at = page.index(rid.encode()) + 10
        _flip(path, start + at, 0x01 if chr(page[at]) in "0123456789bcde" else 0x02)  # another hex digit
    code, report = _verify(path)
    assert code == 1 and "ledger_integrity_failed" in _codes(report), report
    assert any("sqlite_autoindex_records_1" in f["detail"] for f in report["findings"])
    with Ledger(path) as ledger:
        with pytest.raises(DuplicateRecordError, match="its capsule's action_id"):
            ledger.append(LedgerEntry(first.record_id, first.record_type, first.epistemic_type, first.body))
        ledger.append(note)  # only the damaged index stood in its way
    code, report = _verify(path)
    assert code == 1 and any("stored twice" in f["detail"] for f in report["findings"]), report


def test_rows_deleted_from_the_end_are_found_and_not_covered_up(tmp_path: Path) -> None:
    """Rows deleted from the end (behind the triggers) left a shorter chain
    that verified, and the next append went on from it."""
    path = tmp_path / "l.db"
    _fill(path, 4)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER records_no_delete")
        db.execute("DELETE FROM records WHERE seq > 3")
    code, report = _verify(path)
    assert code == 1 and "ledger_tail_missing" in _codes(report), report
    details = " ".join(f["detail"] for f in report["findings"] if f["code"] == "ledger_tail_missing")
    assert "ends at seq 3" in details and "recorded seq 5" in details and "meta head" in details
    Path(f"{path}-head").unlink()  # the meta head alone still tells
    assert "ledger_tail_missing" in _codes(_verify(path)[1])
    with pytest.raises(LedgerCorruptError, match="rows were lost from its end.*nothing was written"):
        _fill(path, 1, prefix="after")
    with Ledger(path, readonly=True) as ledger:
        assert ledger.count() == 3


_CHILD = """
import os, sys
from capseal import Producer
from capseal.keys import UnsafeEphemeralSigner
path = sys.argv[1]
with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
    for i in range(3):
        p.seal({"action_id": f"first-{i}", "action_type": "fyi"})
p = Producer("acme", "agent@1", UnsafeEphemeralSigner(), path)
for i in range(3):
    p.seal({"action_id": f"second-{i}", "action_type": "fyi"})
os._exit(0)  # acknowledged, durable in the -wal, never checkpointed into the main file
"""


def test_a_lost_wal_tail_is_found(tmp_path: Path) -> None:
    """Records acknowledged into the -wal and lost with it (the -wal removed
    before it was checkpointed, or the main file copied alone) left a ledger
    that verified, and appends went on from it."""
    path = tmp_path / "l.db"
    subprocess.run([sys.executable, "-c", _CHILD, str(path)], check=True, timeout=120)
    assert Path(f"{path}-wal").stat().st_size > 0
    with Ledger(path, readonly=True) as ledger:
        assert ledger.count() == 8
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink()
    code, report = _verify(path)
    assert code == 1 and "ledger_tail_missing" in _codes(report), report
    details = " ".join(f["detail"] for f in report["findings"] if f["code"] == "ledger_tail_missing")
    assert "ends at seq 4" in details and "recorded seq 8" in details and "l.db-head" in details
    with pytest.raises(LedgerCorruptError, match="rows were lost from its end") as refused:
        _fill(path, 1, prefix="after")
    assert "l.db-head aside" in refused.value.hint
    with Ledger(path, readonly=True) as ledger:
        assert ledger.count() == 4
    os.rename(f"{path}-head", tmp_path / "lost-head")  # the loss accepted: the ledger goes on from what is left
    _fill(path, 1, prefix="after")
    assert _verify(path)[0] == 0


def test_evidence_deleted_from_the_end_is_found(tmp_path: Path) -> None:
    """The evidence chain's last row deleted (with its index row) brought a
    record's earlier slot back, and verified."""
    path = tmp_path / "l.db"
    _fill(path, 2)
    with Ledger(path) as ledger:
        rid = next(ledger.entries()).record_id
        ledger.add_evidence(rid, {"kind": "test-evidence", "n": 1})
        ledger.add_evidence(rid, None)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER evidence_no_delete")
        db.execute("DROP TRIGGER evidence_members_no_delete")
        db.execute("DELETE FROM evidence WHERE eid = 2")
        db.execute("DELETE FROM evidence_members WHERE eid = 2")
    code, report = _verify(path)
    assert code == 1 and "ledger_tail_missing" in _codes(report), report
    assert any("evidence chain ends at evidence 1" in f["detail"] for f in report["findings"])


def test_a_ledger_made_anew_where_one_was_deleted_is_not_held_to_its_head(tmp_path: Path) -> None:
    """The head file names the ledger it was written for: a ledger deleted
    without its head file, and made anew at that path, is a new ledger."""
    path = tmp_path / "l.db"
    _fill(path, 4)
    path.unlink()
    assert Path(f"{path}-head").exists()
    _fill(path, 1)
    code, report = _verify(path)
    assert code == 0 and _codes(report) == set(), report


def test_exporting_a_damaged_ledger_is_a_typed_error(tmp_path: Path) -> None:
    """`capseal ledger export` of a ledger with a damaged page said "internal error"."""
    path = tmp_path / "l.db"
    _fill(path, 30)
    with open(path, "r+b") as fh:  # the header of a page in the middle of the records
        fh.seek(path.stat().st_size // 2 // 4096 * 4096)
        fh.write(b"\xff" * 16)
    code, report = _verify(path)
    assert code == 1 and report["counts"]["ok"] > 20, report  # the other records are still verified
    proc = subprocess.run([CLI, "ledger", "export", str(path), "-o", str(tmp_path / "e.jsonl")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr
    assert "is damaged" in proc.stderr and "the export is not whole" in proc.stderr
