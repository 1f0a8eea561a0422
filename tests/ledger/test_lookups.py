"""The columns a ledger looks records up by (``action_id``, ``stream``,
``tag``) are outside the row hash: the producer's refusals and its epoch
chain read a capsule's values from its hashed body, and a column edited in
the file is reported by the verifier and refused by an import."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import DuplicateRecordError, InputError, LedgerCorruptError
from capseal.keys import UnsafeEphemeralSigner


def _edit_columns(path: Path) -> None:
    """What someone holding the file can do without touching a row hash."""
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER records_no_update")
        db.execute("UPDATE records SET action_id = 'moved-' || action_id WHERE action_id IN ('a-1', 'ep-1/opens')")
        db.execute("UPDATE records SET tag = NULL, stream = 'elsewhere' WHERE tag = 'epoch_boundary'")


def test_edited_lookup_columns_fool_neither_the_producer_nor_the_verifier(tmp_path: Path) -> None:
    """After such an edit a new producer sealed the same action id again and
    opened the same epoch id again (the lookups read the columns), its new
    epoch no longer chained to the previous one, and the ledger verified."""
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path, epoch_id="ep-1") as p:
        boundary = p.epoch_record
        p.seal({"action_id": "a-1", "action_type": "fyi"})
        p.seal({"action_id": "a-2", "action_type": "fyi"})
    assert capseal.verify_ledger(path).ok
    _edit_columns(path)

    report = capseal.verify_ledger(path)
    assert not report.ok
    edited = {r.seq: [f.detail for f in r.findings if f.code == "ledger_column_mismatch"] for r in report.records}
    assert {seq for seq, found in edited.items() if found} == {1, 2}
    assert "action_id 'moved-ep-1/opens' where its body gives 'ep-1/opens'" in edited[1][0]
    assert "tag None where its body gives 'epoch_boundary'" in edited[1][0]

    with pytest.raises(InputError, match="epoch_id 'ep-1' was opened before"):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), path, epoch_id="ep-1")
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        before = p.ledger.count()
        with pytest.raises(DuplicateRecordError):
            p.seal({"action_id": "a-1", "action_type": "fyi"})
        assert p.ledger.count() == before  # neither the record nor its epoch's boundary went in
        p.seal({"action_id": "a-3", "action_type": "fyi"})
        assert p.epoch_record.capsule["chain"]["parent_capsule_id"] == boundary.capsule_id  # the epoch chain holds
    report = capseal.verify_ledger(path)
    assert {r.seq for r in report.records if not r.ok} == {1, 2}  # the edited rows, and only they


def test_a_lookup_for_another_record_type_still_reads_its_column(tmp_path: Path) -> None:
    """The ledger's own records (not capsules) keep their given action ids."""
    from capseal.ledger import LedgerEntry

    with Ledger(tmp_path / "l.db") as ledger:
        ledger.append(LedgerEntry(f"{1:064x}", "note", "producer_claim", b'{"n":1}', action_id="n-1"))
        assert ledger.has_action_id("n-1") and not ledger.has_action_id("n-2")
        with pytest.raises(DuplicateRecordError, match="action_id 'n-1'"):
            ledger.append(LedgerEntry(f"{2:064x}", "note", "producer_claim", b'{"n":2}', action_id="n-1"))


def test_an_export_with_edited_lookup_columns_is_not_imported(tmp_path: Path) -> None:
    """An export's action_id, stream and tag are outside the row hashes it
    checks: an edited one was imported as it was."""
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        p.seal({"action_id": "a-1", "action_type": "fyi"})
    out = io.BytesIO()
    with Ledger(path, readonly=True) as ledger:
        ledger.export_jsonl(out)
    lines = out.getvalue().splitlines(keepends=True)
    with Ledger.import_jsonl(io.BytesIO(b"".join(lines)), tmp_path / "copy.db") as copy:  # the export as it is
        again = io.BytesIO()
        copy.export_jsonl(again)
    assert again.getvalue() == out.getvalue()
    item = json.loads(lines[1])
    item["header"]["action_id"] = "a-2"
    edited = lines[:1] + [json.dumps(item, separators=(",", ":")).encode() + b"\n"]
    with pytest.raises(LedgerCorruptError, match="line 2: seq 2: its action_id, stream and tag"):
        Ledger.import_jsonl(io.BytesIO(b"".join(edited)), tmp_path / "edited.db")
    assert not (tmp_path / "edited.db").exists()
