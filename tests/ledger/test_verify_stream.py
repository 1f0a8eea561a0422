"""``verify_ledger`` and ``capseal verify`` on a ledger read as a stream: the
records checked in worker processes give the very report one process gives,
the reports are handed on in seq order without being kept, and the text
report is a summary (counts per finding code, the first records not ok), with
a progress bar on a terminal only."""

from __future__ import annotations

import json
import os
import pty
import select
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import capseal
from capseal import Producer
from capseal.audit import RecordReport
from capseal.keys import UnsafeEphemeralSigner
from tests.conftest import PostgresServer


def _busy_ledger(target: str | Path) -> None:
    """A ledger with store-level findings: a supersedes over a refusal, two
    supersedes over one parent, an open planned effect, a confirmed flow."""
    with Producer("acme", "buyer@1", UnsafeEphemeralSigner(), target) as p:
        for i in range(30):
            p.seal({"action_id": f"fyi-{i}", "action_type": "fyi"})
        planned = p.planned("pay-1", effect_type="send_payment")  # stays open
        blocked = p.refused(p.planned("pay-2", effect_type="send_payment"), verdict_class="blocked", reason={"r": 1})
        p.resolved(blocked, decision="accept", approver="human")
        p.seal({"action_id": "again", "action_type": "fyi"}, parent=blocked, relation="supersedes")
        p.confirmed(p.dispatched(p.planned("po-1", effect_type="write_order")), response={"id": "O-1"})
        assert planned.capsule_id


def test_the_workers_give_the_report_one_process_gives(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _busy_ledger(path)
    with sqlite3.connect(path) as db:  # one body edited behind capseal's back: its row hash breaks
        db.execute("DROP TRIGGER records_no_update")
        db.execute("UPDATE records SET body = CAST(replace(body, 'fyi-7', 'fyi-X') AS BLOB) WHERE seq = 9")
    alone = capseal.verify_ledger(path, jobs=1)
    shared = capseal.verify_ledger(path, jobs=2)
    assert shared.to_dict() == alone.to_dict()
    codes = alone.finding_counts
    assert codes["concurrent_supersedes"] == 1 and codes["effect_outcome_missing"] == 1
    assert codes["signer_not_pinned"] == alone.counts()["ok"]
    assert not alone.ok and any(f.code == "ledger_chain_broken" and "seq 9" in f.detail for f in alone.findings)
    assert alone.counts()["not_ok"] == 1 and codes["capsule_id_mismatch"] == 1


def test_id_tables_on_file_give_the_report_the_tables_in_memory_give(tmp_path: Path, monkeypatch: Any) -> None:
    from capseal.ledger import _idindex

    path = tmp_path / "l.db"
    _busy_ledger(path)
    in_memory = capseal.verify_ledger(path, jobs=2)
    made: list[Any] = []
    real = _idindex._File

    def counted(size: int) -> Any:
        made.append(size)
        return real(size)

    monkeypatch.setattr(_idindex, "MEMORY_IDS", 0)  # every table in a file, in the workers forked after it too
    monkeypatch.setattr(_idindex, "_File", counted)
    on_file = capseal.verify_ledger(path, jobs=2)
    assert len(made) >= 3  # the chain's ids, the capsules' facts, the superseded parents
    assert on_file.to_dict() == in_memory.to_dict()
    codes = on_file.finding_counts
    assert codes["concurrent_supersedes"] == 1 and codes["effect_outcome_missing"] == 1


def test_reports_are_handed_on_in_order_and_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _busy_ledger(path)
    seen: list[RecordReport] = []
    passes: set[str] = set()
    report = capseal.verify_ledger(path, keep_records=False, on_record=seen.append, jobs=2,
                                   progress=lambda name, done, total: passes.add(name))
    kept = capseal.verify_ledger(path)
    assert report.ok and report.records == [] and report.counts() == kept.counts()
    assert [r.to_dict() for r in seen] == [r.to_dict() for r in kept.records]
    assert [r.seq for r in seen] == list(range(1, len(seen) + 1)) and passes == {"chains", "records"}
    assert report.signers == kept.signers and report.finding_counts == kept.finding_counts


def _not_trusted_ledger(tmp_path: Path, n: int) -> tuple[Path, Path]:
    path = tmp_path / "l.db"
    with Producer("acme", "buyer@1", UnsafeEphemeralSigner(), path) as p:
        for i in range(n):
            p.seal({"action_id": f"a-{i}", "action_type": "fyi"})
    other = UnsafeEphemeralSigner()  # pinned, and never signed anything here: every record is not ok
    pem = tmp_path / "other.pem"
    from cryptography.hazmat.primitives import serialization

    pem.write_bytes(other.public_key.public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return path, pem


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "capseal", "verify", *args], capture_output=True, text=True,
                          timeout=120)


def test_the_text_report_is_a_summary_and_v_lists_every_record(tmp_path: Path) -> None:
    path, pem = _not_trusted_ledger(tmp_path, 30)
    summary = _cli(str(path), "--trust", str(pem))
    assert summary.returncode == 1
    out = summary.stdout
    assert out.splitlines()[0].startswith("NOT OK") and "31 records, 0 ok, 31 not ok" in out.splitlines()[0]
    assert out.count("  seq ") == 20 and "… and 11 more record(s) not ok (-v lists them)" in out
    assert "findings by code (records): signer_not_trusted ×31" in out
    listed = _cli(str(path), "--trust", str(pem), "-v")
    assert listed.stdout.count("  seq ") == 31 and "more record(s) not ok" not in listed.stdout
    with_evidence = _cli(str(path), "--trust", str(pem), "--evidence")
    assert with_evidence.stdout.count("  seq ") == 20 and "evidence: no-evidence=31" in with_evidence.stdout
    assert "\r" not in summary.stderr + summary.stdout  # piped: no progress bar


def _on_a_terminal(*args: str) -> str:
    """What ``capseal verify`` writes to a terminal (a pseudo-terminal)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "capseal", "verify", *args], stdin=slave, stdout=slave,
                            stderr=slave, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(60)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


def test_a_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    path, _ = _not_trusted_ledger(tmp_path, 5)
    shown = _on_a_terminal(str(path))
    assert "rows/s" in shown and "chains" in shown and "records" in shown and "\r" in shown
    assert "ok (signers not pinned)" in shown
    as_json = _on_a_terminal(str(path), "--json")
    assert "rows/s" not in as_json and json.loads(as_json[as_json.index("{"):])["ok"] is True


def test_capseal_verify_reads_a_server_ledger(postgres: PostgresServer) -> None:
    url = postgres.new_url()
    _busy_ledger(url)
    proc = _cli(url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "effect_outcome_missing ×1" in proc.stdout and postgres.password not in proc.stdout
    assert json.loads(_cli(url, "--json").stdout)["counts"]["ok"] == capseal.verify_ledger(url).counts()["records"]


def test_json_is_the_kept_report_streamed_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _busy_ledger(path)
    with sqlite3.connect(path) as db:  # one record not ok, so the report says what is wrong with it
        db.execute("DROP TRIGGER records_no_update")
        db.execute("UPDATE records SET body = CAST(replace(body, 'fyi-3', 'fyi-Y') AS BLOB) WHERE seq = 5")
    kept = capseal.verify_ledger(path)
    proc = _cli(str(path), "--json")
    assert proc.returncode == 1
    assert proc.stdout == json.dumps(kept.to_dict(), indent=2, ensure_ascii=False) + "\n"  # the same bytes
    assert len(json.loads(proc.stdout)["records"]) == kept.counts()["records"] > 30
    both = _cli(str(path), str(path), "--json")  # several targets: each report inside the one object
    assert [t["report"] for t in json.loads(both.stdout)["targets"]] == [kept.to_dict()] * 2
    empty = tmp_path / "empty.db"
    Producer("acme", "buyer@1", UnsafeEphemeralSigner(), empty).close()
    assert json.loads(_cli(str(empty), "--json").stdout)["records"] == capseal.verify_ledger(empty).to_dict()["records"]


def test_json_never_holds_the_reports_in_memory(tmp_path: Path, monkeypatch: Any) -> None:
    from capseal._internal.cli import verify as cli_verify

    path, _ = _not_trusted_ledger(tmp_path, 40)
    reports: list[Any] = []
    real = capseal.audit.verify_ledger

    def watched(*args: Any, **kwargs: Any) -> Any:
        reports.append(real(*args, **kwargs))
        return reports[-1]

    monkeypatch.setattr(capseal.audit, "verify_ledger", watched)
    writes: list[int] = []

    class Out:
        def write(self, text: str) -> None:
            writes.append(len(text))
            chunks.append(text)

    chunks: list[str] = []
    monkeypatch.setattr(sys, "stdout", Out())
    args = cli_verify.argparse.Namespace(target=[str(path)], json=True, evidence=False, ak=None, ak_hardware=None,
                                         ek_root=None, trust=None, verbose=False)
    assert cli_verify.cmd_verify(args) == 0
    assert reports[0].records == []  # the verifier handed each report on and kept none
    report = json.loads("".join(chunks))
    assert len(report["records"]) == 41 and report["counts"]["ok"] == 41
    assert max(writes) < 2000  # written a record at a time, never as one text


def test_a_record_deep_in_a_batch_is_found_by_the_workers_as_alone(tmp_path: Path, monkeypatch: Any) -> None:
    from capseal import _verify_walk

    monkeypatch.setattr(_verify_walk, "BATCH", 64)  # read by the workers forked after it is set
    path = tmp_path / "l.db"
    with Producer("acme", "buyer@1", UnsafeEphemeralSigner(), path) as p:
        for i in range(200):
            p.seal({"action_id": f"a-{i}", "action_type": "fyi"})
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER records_no_update")
        # deep in the third batch: a capsule edited (its id no longer its own), a signature cut
        db.execute("UPDATE records SET body = CAST(replace(body, 'a-150\"', 'a-15X\"') AS BLOB) WHERE seq = 152")
        body = db.execute("SELECT body FROM records WHERE seq = 170").fetchone()[0]
        record = json.loads(body)
        signature = record["capsule"]["signature"]
        record["capsule"]["signature"] = signature[:-2] + ("00" if signature[-2:] != "00" else "01")  # always another
        db.execute("UPDATE records SET body = ? WHERE seq = 170", (json.dumps(record, sort_keys=True,
                                                                           separators=(",", ":")).encode(),))
    alone = capseal.verify_ledger(path, jobs=1)
    shared = capseal.verify_ledger(path, jobs=2)
    assert shared.to_dict() == alone.to_dict()
    bad = {r.seq: {f.code for f in r.findings} for r in alone.records if not r.ok}
    assert set(bad) == {152, 170}
    assert "capsule_id_mismatch" in bad[152] and "envelope_signature_invalid" in bad[170]
