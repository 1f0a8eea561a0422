"""`capseal seal` and `capseal ledger …` on files that are not (or no
longer) what they should be, through real `capseal` processes: a foreign
file is refused untouched, a missing record is exit 1, and every `ledger`
subcommand has a JSON and a text form."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

CLI = str(Path(sys.executable).parent / "capseal")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "k.pem"
    assert run("keys", "create", f"file:{path}", "--alg", "ed25519").returncode == 0
    return path


def _seal(key: Path, ledger: Path, spec_dir: Path) -> subprocess.CompletedProcess[str]:
    spec = spec_dir / "spec.json"
    spec.write_text(json.dumps([{"action_id": "po-1", "action_type": "fyi"}, {"action_id": "po-2", "action_type": "fyi"}]))
    return run("seal", str(spec), "--key", f"file:{key}", "--ledger", str(ledger), "--operator", "acme",
               "--developer", "a@1")


def _state(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_foreign_file_is_refused_and_left_untouched(key: Path, tmp_path: Path, kind: str) -> None:
    """`capseal seal --ledger other.sqlite` added capseal's tables to an
    unrelated database (and switched it to WAL)."""
    other = tmp_path / "files" / "other.sqlite"
    other.parent.mkdir()
    if kind == "sqlite":
        with sqlite3.connect(other) as db:
            db.execute("CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT)")
            db.execute("INSERT INTO customers(name) VALUES ('ada')")
        db.close()
    else:
        other.write_text('{"not": "a ledger"}')
    before = _state(other.parent)
    proc = _seal(key, other, tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert f"{other} is not a capseal ledger" in proc.stderr and "nothing was written to it" in proc.stderr
    if kind == "sqlite":
        assert "customers" in proc.stderr
    assert _state(other.parent) == before  # no table, no -wal/-shm/-head, not a byte changed

    from capseal import Ledger
    from capseal.errors import NotALedgerError

    with pytest.raises(NotALedgerError, match="other.sqlite"):
        Ledger(other)
    assert _state(other.parent) == before


def test_an_empty_file_becomes_a_ledger(key: Path, tmp_path: Path) -> None:
    empty = tmp_path / "l.db"
    empty.write_bytes(b"")
    assert _seal(key, empty, tmp_path).returncode == 0
    assert run("verify", str(empty)).returncode == 0


def test_ledger_show_of_a_missing_record_is_exit_1(key: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    assert _seal(key, ledger, tmp_path).returncode == 0
    rows = json.loads(run("ledger", "show", str(ledger), "--json").stdout)
    assert [r["header"]["seq"] for r in rows] == [1, 2, 3]
    rid = rows[1]["header"]["record_id"]
    shown = run("ledger", "show", str(ledger), "--id", rid, "--json")
    assert shown.returncode == 0 and [r["header"]["record_id"] for r in json.loads(shown.stdout)] == [rid]
    text = run("ledger", "show", str(ledger), "--id", rid)
    assert text.returncode == 0 and "po-1" in text.stdout
    for form in ((), ("--json",)):
        proc = run("ledger", "show", str(ledger), "--id", "nope", *form)
        assert proc.returncode == 1 and f"no record nope in {ledger}" in proc.stderr
    assert json.loads(run("ledger", "show", str(ledger), "--id", "nope", "--json").stdout) == []


def test_ledger_show_marks_a_damaged_row_and_exits_1(key: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    assert _seal(key, ledger, tmp_path).returncode == 0
    with sqlite3.connect(ledger) as db:
        db.execute("DROP TRIGGER records_no_update")
        db.execute("UPDATE records SET body = CAST(body AS TEXT) WHERE seq = 2")
    db.close()
    proc = run("ledger", "show", str(ledger))
    assert proc.returncode == 1 and "DAMAGED" in proc.stdout and "po-2" in proc.stdout
    assert "seq 2: its body is stored as text" in proc.stderr
    rows = json.loads(run("ledger", "show", str(ledger), "--json").stdout)
    assert [("damage" in r) for r in rows] == [False, True, False]


def test_ledger_export_and_import_have_a_json_and_a_text_form(key: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    assert _seal(key, ledger, tmp_path).returncode == 0
    out = tmp_path / "e.jsonl"
    proc = run("ledger", "export", str(ledger), "-o", str(out), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"ledger": str(ledger), "output": str(out), "lines": 3}
    proc = run("ledger", "export", str(ledger), "--json")  # the export on stdout, the summary beside it
    assert proc.stdout.encode() == out.read_bytes() and json.loads(proc.stderr)["lines"] == 3
    proc = run("ledger", "export", str(ledger), "-o", str(tmp_path / "t.jsonl"))
    assert proc.returncode == 0 and proc.stderr.strip() == "exported 3 lines"
    proc = run("ledger", "import", str(out), str(tmp_path / "copy.db"), "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == {"ledger": str(tmp_path / "copy.db"), "source": str(out), "records": 3}
    proc = run("ledger", "import", str(out), str(tmp_path / "copy2.db"))
    assert proc.returncode == 0 and proc.stderr.strip() == f"imported 3 records into {tmp_path / 'copy2.db'}"
