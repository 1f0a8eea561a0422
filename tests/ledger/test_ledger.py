"""The ledger: append-only, hash-chained, durable, safe under concurrent writers,
and exported/imported byte for byte."""

from __future__ import annotations

import io
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import LedgerBusyError, LedgerCorruptError, LedgerError, MalformedJSONError
from capseal.keys import UnsafeEphemeralSigner
from tests.engines import Engine


def _fill(path: Path | str, n: int = 20) -> list[capseal.SealedRecord]:
    out = []
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        for i in range(n):
            planned = p.planned(f"po-{i}", effect_type="write_order", request={"sku": f"A{i}", "qty": i})
            out += [planned, p.confirmed(planned, response={"order": f"O-{i}"})]
    return out


def test_rows_cannot_be_updated_or_deleted(engine: Engine) -> None:
    path = engine.new()
    _fill(path, 2)
    with pytest.raises(engine.refusal, match="append-only"):
        engine.execute(path, "UPDATE records SET body = ? WHERE seq = 1", (b"\x00",))
    with pytest.raises(engine.refusal, match="append-only"):
        engine.execute(path, "DELETE FROM records WHERE seq = 2")
    if engine.postgres:  # a server's table can also be emptied at once
        with pytest.raises(engine.refusal, match="append-only"):
            engine.execute(path, "TRUNCATE records CASCADE")
    with Ledger(path, readonly=True) as ledger:
        assert ledger.count() == 5 and ledger.check_chain() == []


def test_tampering_behind_the_triggers_is_detected(engine: Engine) -> None:
    path = engine.new()
    _fill(path, 3)
    assert capseal.verify_ledger(path).ok
    engine.allow_edits(path)
    body = engine.execute(path, "SELECT body FROM records WHERE seq = 3")[0][0]
    engine.execute(path, "UPDATE records SET body = ? WHERE seq = 3", (bytes(body).replace(b"po-0", b"po-9"),))
    report = capseal.verify_ledger(path)
    assert not report.ok
    assert any(f.code == "ledger_chain_broken" and "seq 3" in f.detail for f in report.findings)
    bad = [r for r in report.records if not r.ok]
    assert [r.seq for r in bad] == [3]  # the edited capsule no longer matches its id or signature
    assert {f.code for f in bad[0].findings} >= {"capsule_id_mismatch"}


def test_export_import_is_byte_identical(engine: Engine) -> None:
    path = engine.new()
    records = _fill(path, 5)
    with Ledger(path) as ledger:
        ledger.add_evidence(records[1].capsule_id, {"kind": "test-evidence", "note": "beside, not inside"})
        first = io.BytesIO()
        ledger.export_jsonl(first)
    copy_at = engine.new("copy")
    with Ledger.import_jsonl(io.BytesIO(first.getvalue()), copy_at) as copy:
        second = io.BytesIO()
        copy.export_jsonl(second)
        assert copy.evidence_history(records[1].capsule_id) == [None, {"kind": "test-evidence", "note": "beside, not inside"}]
    assert first.getvalue() == second.getvalue()
    assert capseal.verify_ledger(copy_at).ok


def test_import_refuses_a_tampered_export_and_leaves_no_file(engine: Engine) -> None:
    path = engine.new()
    _fill(path, 3)
    buf = io.BytesIO()
    with Ledger(path) as ledger:
        ledger.export_jsonl(buf)
    lines = buf.getvalue().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"po-0", b"po-7")
    bad = engine.new("bad")
    with pytest.raises(LedgerCorruptError, match="line 3"):
        Ledger.import_jsonl(io.BytesIO(b"".join(lines)), bad)
    assert not engine.holds_ledger(bad)
    with pytest.raises(MalformedJSONError, match="line 1"):
        Ledger.import_jsonl(io.BytesIO(b"{not json\n"), engine.new("bad2"))
    with pytest.raises(LedgerError, match="import builds a new ledger"):  # never into a ledger that is there
        Ledger.import_jsonl(io.BytesIO(buf.getvalue()), path)


def test_evidence_slot_history_is_append_only(engine: Engine) -> None:
    path = engine.new()
    records = _fill(path, 1)
    cid = records[0].capsule_id
    with Ledger(path) as ledger:
        before = ledger.get(cid)
        assert before is not None and before.hardware_evidence is None
        with pytest.raises(ValueError, match="never"):
            ledger.add_evidence(cid, {})
        ledger.add_evidence(cid, {"kind": "k", "n": 1})
        ledger.add_evidence(cid, {"kind": "k", "n": 2})
        after = ledger.get(cid)
        assert after is not None and after.hardware_evidence == {"kind": "k", "n": 2}
        assert ledger.evidence_history(cid) == [None, {"kind": "k", "n": 1}, {"kind": "k", "n": 2}]
        assert after.capsule == records[0].capsule  # the capsule itself never changes
        with pytest.raises(LedgerError, match="no record"):
            ledger.add_evidence("0" * 64, {"kind": "k"})


def test_threads_share_group_commits(engine: Engine) -> None:
    path = engine.new()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        errors: list[BaseException] = []

        def worker(t: int) -> None:
            try:
                for i in range(150):
                    p.seal({"action_id": f"t{t}-{i}", "action_type": "fyi"})
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        # pipelined submits from one thread share fsyncs too
        pendings = [p.submit({"action_id": f"s{i}", "action_type": "fyi"}) for i in range(300)]
        p.flush()
        assert all(x.result().seq is not None for x in pendings)
        stats = p.ledger.stats
        assert stats.records == 8 * 150 + 300 + 1
        assert stats.commits < stats.records  # several records per fsynced commit
    with Ledger(path) as ledger:
        assert ledger.count() == 8 * 150 + 300 + 1
        assert [e.seq for e in ledger.entries()] == list(range(1, ledger.count() + 1))
        assert ledger.check_chain() == []


def test_two_processes_append_to_one_ledger(engine: Engine) -> None:
    path = engine.new("shared")
    script = (
        "import sys; from capseal import Producer; from capseal.keys import UnsafeEphemeralSigner\n"
        "with Producer('acme', sys.argv[2], UnsafeEphemeralSigner(), sys.argv[1]) as p:\n"
        "    for i in range(150): p.seal({'action_id': f'{sys.argv[2]}-{i}', 'action_type': 'fyi'})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(path), f"agent-{k}"]) for k in range(2)]
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    with Ledger(path) as ledger:
        assert ledger.count() == 2 * 151
        assert ledger.check_chain() == []
    assert capseal.verify_ledger(path).ok


def test_processes_creating_one_ledger_at_once_all_open_it(tmp_path: Path) -> None:
    """Processes that create the same new ledger at the same moment all open it.
    Each holds a shared lock on the new file when it asks for the exclusive lock
    that switching to WAL needs, and SQLite answers one of them "database is
    locked" at once, without waiting; that was reported as "not a capseal
    ledger" (about one round in four failed here)."""
    script = (
        "import sys; from capseal import Ledger\n"
        "for line in sys.stdin:\n"
        "    try:\n"
        "        Ledger(line.strip()).close(); print('ok', flush=True)\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc, flush=True)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    failures = []
    try:
        for r in range(40):
            path = tmp_path / f"new-{r}.db"
            for proc in procs:  # the four get the path within microseconds of each other
                assert proc.stdin is not None
                proc.stdin.write(f"{path}\n")
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.flush()
            for proc in procs:
                assert proc.stdout is not None
                answer = proc.stdout.readline().strip()
                if answer != "ok":
                    failures.append(answer)
            with sqlite3.connect(path) as db:
                assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        assert [proc.wait(timeout=60) for proc in procs] == [0] * 4
    assert failures == []


def test_a_lock_held_too_long_is_busy_not_corrupt(tmp_path: Path) -> None:
    """A ledger another connection keeps locked past ``lock_timeout`` gives
    LedgerBusyError naming the file, never "not a capseal ledger"; nothing is
    written, and it works once the lock is gone."""
    new = tmp_path / "new.db"
    holder = sqlite3.connect(new, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # a new file, locked in rollback mode
    with pytest.raises(LedgerBusyError, match="new.db stayed locked by another connection for 0.2 s"):
        Ledger(new, lock_timeout=0.2)
    holder.execute("ROLLBACK")
    holder.close()
    with Ledger(new, lock_timeout=0.2) as ledger:
        assert ledger.count() == 0

    path = tmp_path / "l.db"
    _fill(path, 1)
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), Ledger(path, lock_timeout=0.2)) as p:
        before = p.ledger.count()
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process writing, for longer than the timeout
        with pytest.raises(LedgerBusyError, match="append to l.db failed: another connection kept it locked for 0.2 s"):
            p.seal({"action_id": "while-locked", "action_type": "fyi"})
        first = next(p.ledger.entries()).record_id
        history = p.ledger.evidence_history(first)
        with pytest.raises(LedgerBusyError, match="evidence write to l.db failed: another connection kept it locked"):
            p.ledger.add_evidence(first, {"kind": "k"})
        holder.execute("ROLLBACK")
        holder.close()
        assert p.ledger.count() == before
        p.seal({"action_id": "after", "action_type": "fyi"})
        added = [e.action_id for e in p.ledger.entries()][before:]
        assert len(added) == 2 and added[1] == "after"  # the epoch's boundary went in with it, as a pair
        assert p.ledger.evidence_history(first) == history  # the refused evidence write left nothing
    assert capseal.verify_ledger(path).ok
    with pytest.raises(ValueError, match="lock_timeout"):
        Ledger(tmp_path / "x.db", lock_timeout=-1)


def test_not_a_ledger(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(LedgerCorruptError):
        Ledger(junk)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t(x)")
    with pytest.raises(LedgerCorruptError):
        Ledger(other, readonly=True)
    report = capseal.verify_ledger(junk)  # not SQLite (or a damaged header): the file's fault, not "could not run"
    assert not report.ok and report.findings[0].code == "ledger_not_capseal"
    assert "junk.db is not a capseal ledger" in report.findings[0].detail
    report = capseal.verify_ledger(other)
    assert not report.ok and report.findings[0].code == "ledger_not_capseal" and "it holds t" in report.findings[0].detail


def test_a_path_no_ledger_can_be_opened_at_is_a_ledger_error_naming_it(tmp_path: Path) -> None:
    """A missing directory or a directory given as the ledger is LedgerError
    naming the path (sqlite3.OperationalError 'unable to open database file'
    before, which `capseal seal` called an internal error); ':memory:' is
    refused for what it is (it failed as a WAL journal mode), and nothing is
    created anywhere."""
    for bad in (tmp_path / "missing" / "l.db", tmp_path):
        for readonly in (False, True):
            with pytest.raises(LedgerError, match=str(bad)) as info:
                Ledger(bad, readonly=readonly)
            assert type(info.value) is LedgerError
        with pytest.raises(LedgerError, match=str(bad)):
            Producer("acme", "agent@1", UnsafeEphemeralSigner(), bad)
    with pytest.raises(LedgerError, match="':memory:' would keep nothing"):
        Ledger(":memory:")
    with pytest.raises(LedgerError, match="':memory:' would keep nothing"):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), ":memory:")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert not Path(":memory:").exists()


def test_a_pair_goes_in_whole_or_not_at_all(engine: Engine) -> None:
    """``submit_pair`` (an epoch boundary and the epoch's first record): a
    refusal of either, decided in the commit, undoes the other, whatever else
    the group holds; the chain stays whole."""
    from capseal.errors import DuplicateRecordError
    from capseal.ledger import LedgerEntry

    def entry(n: int, action: str) -> LedgerEntry:
        return LedgerEntry(record_id=f"{n:064x}", record_type="test", epistemic_type="producer_claim",
                           body=b'{"n":%d}' % n, action_id=action)

    with Ledger(engine.new()) as ledger:
        ledger.append(entry(1, "taken"))
        before = ledger.count()
        # the follower is a duplicate: the lead written for it is undone
        lead, follower = ledger.submit_pair(entry(2, "lead-1"), entry(3, "taken"), wake=False)
        with pytest.raises(DuplicateRecordError, match="taken"):
            follower.result()
        with pytest.raises(DuplicateRecordError):
            lead.result()
        # the lead is a duplicate: its follower is not written either
        lead, follower = ledger.submit_pair(entry(4, "taken"), entry(5, "follower-2"), wake=False)
        with pytest.raises(LedgerError, match="which was refused"):
            follower.result()
        assert ledger.count() == before
        assert ledger.entry(f"{2:064x}") is None and ledger.entry(f"{5:064x}") is None
        # a refused pair amid records that are written, all in one group
        plain_a = ledger.submit(entry(6, "plain-a"), wake=False)
        lead, follower = ledger.submit_pair(entry(7, "lead-3"), entry(8, "taken"), wake=False)
        plain_b = ledger.submit(entry(9, "plain-b"), wake=False)
        good_lead, good_follower = ledger.submit_pair(entry(10, "lead-4"), entry(11, "follower-4"), wake=False)
        ledger.flush()
        assert [p.result().record_id for p in (plain_a, plain_b, good_lead, good_follower)] == \
            [f"{n:064x}" for n in (6, 9, 10, 11)]
        assert lead.error is not None and follower.error is not None
        assert ledger.count() == before + 4
        assert [e.seq for e in ledger.entries()] == list(range(1, before + 5))
        assert ledger.check_chain() == []


def test_one_unreadable_row_does_not_hide_the_others(engine: Engine) -> None:
    """A row whose links column is not JSON, or whose body nests too deeply to
    parse, fails on its own; verify_ledger still reads and reports every row."""
    path = engine.new()
    _fill(path, 3)
    engine.allow_edits(path)
    engine.execute(path, "UPDATE records SET links = 'not json' WHERE seq = 2")
    engine.execute(path, "UPDATE records SET body = ? WHERE seq = 4", (b"[" * 100000 + b"]" * 100000,))
    report = capseal.verify_ledger(path)
    assert not report.ok
    assert not any(f.code == "ledger_unreadable" for f in report.findings)
    assert len(report.records) == 7
    chain = " ".join(f.detail for f in report.findings if f.code == "ledger_chain_broken")
    assert "seq 2" in chain and "seq 4" in chain
    assert not [r for r in report.records if r.seq == 4][0].ok
    assert [r for r in report.records if r.seq == 6][0].ok  # an untouched row verifies


@pytest.mark.parametrize("value", [9_000_000_000_000_000, "the body as text"])
def test_a_record_body_edited_to_another_type_is_damage_not_bytes(tmp_path: Path, value: object) -> None:
    """A record body edited at the SQL level to an integer N was read as
    ``bytes(N)``, N zero bytes: the verifier of a crafted file tried to
    allocate them (here 9 PB: a MemoryError; a few GB would be allocated),
    and text was a bare TypeError. Both are LedgerCorruptError naming the
    record, never converted; verify_ledger reports that record as damaged
    and every other record as usual (it reported the whole file unreadable)."""
    path = tmp_path / "l.db"
    _fill(path, 2)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER records_no_update")
        db.execute("UPDATE records SET body = ? WHERE seq = 3", (value,))
    with Ledger(path, readonly=True) as ledger:
        with pytest.raises(LedgerCorruptError, match="record 3 is damaged .*not a blob"):
            list(ledger.entries())
    report = capseal.verify_ledger(path)
    assert not report.ok
    assert not any(f.code == "ledger_unreadable" for f in report.findings)
    assert any(f.code == "ledger_chain_broken" and "seq 3: damaged row" in f.detail and "not a blob" in f.detail
               for f in report.findings), report.findings
    assert len(report.records) == 5
    bad = [r for r in report.records if not r.ok]
    assert [r.seq for r in bad] == [3] and bad[0].findings[0].code == "record_unreadable"
    assert "not a blob" in bad[0].findings[0].detail
