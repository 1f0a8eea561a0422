"""A ledger file's layout: which indexes keep its refusals and lookups.

``data/layout1.sqlite3`` was written by the capseal before the layout row
existed (a capsule's action id indexed from its body and from its column):
five records (an epoch boundary, two capsules, a capsule whose action id
holds a NUL, a note keyed by its action_id column) and one evidence row. It
must open, read, verify and take appends, brought to this layout by its
first write-open, whole or not at all."""

from __future__ import annotations

import io
import shutil
import sqlite3
from pathlib import Path

import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import DuplicateRecordError, LedgerCorruptError, LedgerFormatError
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import LedgerEntry
from tests.conftest import PostgresServer

FIRST_LAYOUT = Path(__file__).parent / "data" / "layout1.sqlite3"


def _old(tmp_path: Path) -> Path:
    path = tmp_path / "old.db"
    shutil.copyfile(FIRST_LAYOUT, path)
    return path


def _schema(path: Path) -> tuple[set[str], str | None]:
    with sqlite3.connect(path) as db:
        names = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master")}
        row = db.execute("SELECT value FROM meta WHERE key = 'layout'").fetchone()
    return names, None if row is None else str(row[0])


def _verifies(path: Path | str, records: int) -> None:
    """verify_ledger finds nothing but what the fixture is made of: a key
    nobody pinned, and the note (a record type it does not know)."""
    report = capseal.verify_ledger(path)
    assert set(report.finding_counts) <= {"signer_not_pinned", "record_type_unknown"}, report.to_dict()
    assert len(report.records) == records


def test_a_new_ledger_keys_each_action_id_once(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        p.seal({"action_id": "a-1", "action_type": "fyi"})
    names, layout = _schema(path)
    assert layout == "2"
    assert "records_action_id_key" in names and "records_capsule_action_id" not in names
    assert "sqlite_autoindex_records_2" not in names  # no unique index of the column of its own
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'head'").fetchone()[0].startswith("2 ")


def test_a_ledger_of_the_first_layout_is_read_as_it_is(tmp_path: Path) -> None:
    path = _old(tmp_path)
    with Ledger(path, readonly=True) as ledger:
        assert ledger.count() == 5 and ledger.check_chain() == []
        assert ledger.has_action_id("old-1") and ledger.has_action_id("note-7")
        assert ledger.has_action_id("nul\x00one")
        assert not ledger.has_action_id("nul\x00two") and not ledger.has_action_id("nul")
        assert not ledger.has_action_id("old-3")
    _verifies(path, 5)
    assert _schema(path) == _schema(FIRST_LAYOUT)  # reading wrote nothing
    assert path.read_bytes() == FIRST_LAYOUT.read_bytes()


def test_a_ledger_of_the_first_layout_takes_appends_after_its_first_write_open(tmp_path: Path) -> None:
    path = _old(tmp_path)
    names, layout = _schema(path)
    assert layout is None and "records_capsule_action_id" in names
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        names, layout = _schema(path)
        assert layout == "2" and "records_action_id_key" in names and "records_capsule_action_id" not in names
        before = p.ledger.count()
        for taken in ("old-1", "old-2", "nul\x00one", "note-7"):
            with pytest.raises(DuplicateRecordError):
                p.seal({"action_id": taken, "action_type": "fyi"})
        assert p.ledger.count() == before
        p.seal({"action_id": "nul\x00two", "action_type": "fyi"})  # one key per id, after the NUL too
        p.seal({"action_id": "new-1", "action_type": "fyi"})
        with pytest.raises(DuplicateRecordError, match="action_id 'note-7'"):
            p.ledger.append(LedgerEntry(f"{8:064x}", "note", "producer_claim", b'{"action_id":"note-7","n":8}', action_id="note-7"))
        p.ledger.append(LedgerEntry(f"{9:064x}", "note", "producer_claim", b'{"action_id":"note-9","n":9}', action_id="note-9"))
        assert p.ledger.count() == before + 4  # the new epoch's boundary, two capsules, a note
    with Ledger(path, readonly=True) as ledger:
        assert ledger.check_chain() == []
        out = io.BytesIO()
        ledger.export_jsonl(out)
    _verifies(path, 9)
    with Ledger.import_jsonl(io.BytesIO(out.getvalue()), tmp_path / "copy.db") as copy:
        again = io.BytesIO()
        copy.export_jsonl(again)
        assert copy.has_action_id("nul\x00one") and copy.has_action_id("nul\x00two")
    assert again.getvalue() == out.getvalue()
    assert _schema(tmp_path / "copy.db")[1] == "2"


def test_a_migration_that_cannot_finish_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    """A first-layout file whose ids cannot all be keys of the one index (a
    capsule's column edited away from its body's id, which a note then took)
    is refused, typed, with nothing changed."""
    path = _old(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER records_no_update")
        db.execute("UPDATE records SET action_id = 'moved' WHERE action_id = 'old-1'")
        seq = db.execute("SELECT max(seq) FROM records").fetchone()[0]
        row = db.execute("SELECT prev_hash, row_hash FROM records WHERE seq = ?", (seq,)).fetchone()
        db.execute("INSERT INTO records(seq, record_id, record_type, epistemic_type, links, nonce, action_id, "
                   "body, prev_hash, row_hash) VALUES (?, ?, 'note', 'producer_claim', '[]', '00', 'old-1', "
                   "X'7B7D', ?, ?)", (seq + 1, f"{99:064x}", row[1], row[1]))
    edited = path.read_bytes()
    with pytest.raises(LedgerCorruptError, match="carry one action_id.*nothing was written"):
        Ledger(path)
    names, layout = _schema(path)
    assert layout is None and "records_capsule_action_id" in names and "records_action_id_key" not in names
    assert path.read_bytes() == edited


def test_an_index_of_the_first_layout_put_back_is_taken_away_again(tmp_path: Path) -> None:
    """An earlier capseal appending to a file of this layout puts its body
    index back; the next write-open takes it away (one index entry per id)."""
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        p.seal({"action_id": "a-1", "action_type": "fyi"})
    with sqlite3.connect(path) as db:
        db.execute("CREATE UNIQUE INDEX records_capsule_action_id ON records(json_extract(CAST(body AS TEXT), "
                   "'$.capsule.action_id')) WHERE record_type = 'capsule'")
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        with pytest.raises(DuplicateRecordError):
            p.seal({"action_id": "a-1", "action_type": "fyi"})
    assert "records_capsule_action_id" not in _schema(path)[0]


@pytest.mark.parametrize("readonly", [False, True])
def test_a_layout_of_a_later_capseal_is_refused_untouched(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        p.seal({"action_id": "a-1", "action_type": "fyi"})
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '3' WHERE key = 'layout'")
    before = path.read_bytes()
    with pytest.raises(LedgerFormatError, match="layout '3', which a later capseal wrote"):
        Ledger(path, readonly=readonly)
    assert path.read_bytes() == before


# the first layout's PostgreSQL objects, as the capseal of ad9e51a made them (a ledger made now is
# taken back to them: the column's UNIQUE constraint, the body index, no action_id_json, no layout row)
_PG_FIRST_LAYOUT = (
    "DROP INDEX records_action_id_key",
    "ALTER TABLE records DROP COLUMN action_id_json",
    "ALTER TABLE records ADD CONSTRAINT records_action_id_key UNIQUE (action_id)",
    "CREATE UNIQUE INDEX records_capsule_action_id ON records ((capseal_member(body, 'capsule', 'action_id'))) "
    "WHERE record_type = 'capsule'",
    "DROP FUNCTION capseal_column_key, capseal_action_key, capseal_token_key",
    "DELETE FROM meta WHERE key = 'layout'",
)


def test_a_postgres_ledger_of_the_first_layout_is_read_then_brought_to_this_one(postgres: PostgresServer) -> None:
    import psycopg

    url = postgres.new_url()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), url) as p:
        p.seal({"action_id": "old-1", "action_type": "fyi"})
        p.ledger.append(LedgerEntry(f"{7:064x}", "note", "producer_claim", b'{"action_id":"note-7","n":7}',
                                    action_id="note-7"))
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in _PG_FIRST_LAYOUT:
            conn.execute(sql)
    with Ledger(url, readonly=True) as ledger:
        assert ledger.has_action_id("old-1") and ledger.has_action_id("note-7")
        assert not ledger.has_action_id("old-1\x00") and not ledger.has_action_id("old-2")
        assert ledger.check_chain() == []
    _verifies(url, 3)
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), url) as p:
        for taken in ("old-1", "note-7"):
            with pytest.raises(DuplicateRecordError):
                p.seal({"action_id": taken, "action_type": "fyi"})
        p.seal({"action_id": "old-1\x00a", "action_type": "fyi"})
        p.seal({"action_id": "old-1\x00b", "action_type": "fyi"})
        with pytest.raises(DuplicateRecordError):
            p.seal({"action_id": "old-1\x00a", "action_type": "fyi"})
        with pytest.raises(DuplicateRecordError, match="action_id 'note-7'"):
            p.ledger.append(LedgerEntry(f"{8:064x}", "note", "producer_claim", b'{"action_id":"note-7","n":8}',
                                        action_id="note-7"))
        assert p.ledger.has_action_id("old-1\x00b") and not p.ledger.has_action_id("old-1\x00c")
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'layout'").fetchone() == ("2",)
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'records_capsule_action_id' AND "
                            "relnamespace = current_schema()::regnamespace").fetchone() == (0,)
    _verifies(url, 6)
