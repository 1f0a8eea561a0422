"""Several processes on one ledger file: imports racing other writers, a
killed import, readers of a ledger being created, and whole-ledger reads
(check_chain, export, verify_ledger) while other processes write records and
evidence. Each test failed on the code before it (found by a review)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import LedgerCorruptError, LedgerError
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import _transfer  # its grace time for a temp file without a lock, set to 0 below

_WORKER = r'''
import sys
from capseal import Ledger, Producer
from capseal.keys import UnsafeEphemeralSigner
from capseal.errors import CapsealError
for line in sys.stdin:
    kind, target = line.split()
    try:
        if kind == "import":
            with open(sys.argv[1], "rb") as fh:
                Ledger.import_jsonl(fh, target).close()
            print("ok", flush=True)
        elif kind == "seal":
            with Producer("acme", "p", UnsafeEphemeralSigner(), target) as p:
                p.seal({"action_id": "sealed-" + target[-10:], "action_type": "fyi"})
            print("ok", flush=True)
        else:
            raise SystemExit(f"unknown command {kind}")
    except CapsealError as exc:
        print("typed", type(exc).__name__, str(exc).replace("\n", " ")[:200], flush=True)
    except Exception as exc:
        print("UNTYPED", type(exc).__name__, str(exc).replace("\n", " ")[:200], flush=True)
'''


@contextmanager
def _workers(n: int, *args: str) -> Iterator[list[subprocess.Popen[str]]]:
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(n)]
    try:
        yield procs
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        assert [proc.wait(timeout=60) for proc in procs] == [0] * n


def _at_once(procs: list[subprocess.Popen[str]], commands: list[str]) -> list[str]:
    """Hand each worker its command within microseconds of the others; their answers."""
    for proc, command in zip(procs, commands):
        assert proc.stdin is not None
        proc.stdin.write(command + "\n")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.flush()
    answers = []
    for proc in procs:
        assert proc.stdout is not None
        answers.append(proc.stdout.readline().strip())
    return answers


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of 150 records."""
    folder = tmp_path_factory.mktemp("export")
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), folder / "src.db") as p:
        for i in range(150):
            p.submit({"action_id": f"a-{i}", "action_type": "fyi"})
        p.flush()
        out = folder / "src.jsonl"
        with out.open("wb") as fh:
            p.ledger.export_jsonl(fh)
    return out


def test_an_import_never_deletes_a_ledger_another_process_made(tmp_path: Path, export: Path) -> None:
    """Import checked that the path was free, then built the ledger there and,
    on failure, deleted the path: a second importer, or a producer that made
    the same new ledger meanwhile, lost its file (with records acknowledged as
    durable). Now the import is built aside and linked into place."""
    lost: list[str] = []
    with _workers(2, str(export)) as procs:
        for r in range(24):
            target = tmp_path / f"t-{r:03d}.db"
            other = "import" if r % 2 == 0 else "seal"
            answers = _at_once(procs, [f"import {target}", f"{other} {target}"])
            assert not [a for a in answers if a.startswith("UNTYPED")], answers
            if not target.exists():
                lost.append(f"round {r}: {answers}")
                continue
            with Ledger(target, readonly=True) as ledger:
                assert ledger.check_chain() == []
                ids = {e.action_id for e in ledger.entries()}
            if other == "seal" and answers[1] == "ok":
                assert f"sealed-{str(target)[-10:]}" in ids, answers  # the producer's durable record is there
            if answers[0] == "ok":
                assert {f"a-{i}" for i in range(150)} <= ids
            else:
                assert answers[0].startswith("typed LedgerError"), answers
    assert lost == []


def _half_import(target: Path, export: Path) -> tuple[subprocess.Popen[bytes], list[bytes]]:
    """An import into ``target`` in another process, fed the first half of
    ``export`` and then waiting for the rest inside its transaction, once its
    temp file exists. Returns the process and the export's lines."""
    script = "import sys; from capseal import Ledger; Ledger.import_jsonl(sys.stdin.buffer, sys.argv[1]).close()"
    proc = subprocess.Popen([sys.executable, "-c", script, str(target)], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    lines = export.read_bytes().splitlines(keepends=True)
    proc.stdin.write(b"".join(lines[: len(lines) // 2]))
    proc.stdin.flush()
    deadline = time.monotonic() + 30
    while not list(target.parent.glob(".capseal-import-*")):
        assert time.monotonic() < deadline, "the import never started"
        time.sleep(0.01)
    return proc, lines


def test_a_killed_import_leaves_no_ledger(tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An import killed half-way used to leave an empty, valid ledger at the
    path, so a retry was refused ("already exists"); its hidden temp files
    stayed for good. The next import in the directory deletes them."""
    target = tmp_path / "imported.db"
    proc, _ = _half_import(target, export)
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not target.exists()
    assert list(tmp_path.glob(".capseal-import-*"))  # what the kill left
    monkeypatch.setattr(_transfer, "_IMPORT_GRACE", 0.0)  # the files are fresh: none would be swept
    with export.open("rb") as fh:
        with Ledger.import_jsonl(fh, target) as ledger:
            assert ledger.count() == 151
    assert list(tmp_path.glob(".capseal-import-*")) == []  # swept by the next import: nobody held its lock
    with pytest.raises(LedgerError, match="already exists"):
        with export.open("rb") as fh:
            Ledger.import_jsonl(fh, target)
    assert capseal.verify_ledger(target).ok


def test_an_import_under_way_is_never_swept(tmp_path: Path, export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another import in the same directory leaves a live import's temp file
    alone (it holds a lock on it), however old the file is."""
    monkeypatch.setattr(_transfer, "_IMPORT_GRACE", 0.0)  # the files are fresh: none would be swept
    first = tmp_path / "first.db"
    proc, lines = _half_import(first, export)
    assert proc.stdin is not None
    pending = sorted(tmp_path.glob(".capseal-import-*"))
    with export.open("rb") as fh, Ledger.import_jsonl(fh, tmp_path / "second.db") as second:
        assert second.count() == 151
    assert all(p.exists() for p in pending)
    proc.stdin.write(b"".join(lines[len(lines) // 2:]))
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0
    with Ledger(first, readonly=True) as ledger:
        assert ledger.count() == 151
    assert list(tmp_path.glob(".capseal-import-*")) == []


def test_a_reader_never_takes_a_ledger_being_created_for_a_damaged_one(tmp_path: Path) -> None:
    """The schema and the format row were written in separate transactions, so
    a reader opening the new file in between got "not a capseal ledger". Now
    they appear together; an empty file is "no ledger yet", not damage."""
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(LedgerError, match="holds no ledger yet") as caught:
        Ledger(empty, readonly=True)
    assert not isinstance(caught.value, LedgerCorruptError)

    script = ("import sys; from capseal import Ledger\n"
              "for line in sys.stdin:\n"
              "    Ledger(line.strip()).close(); print('ok', flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    damaged: list[str] = []
    try:
        for r in range(30):
            path = tmp_path / f"new-{r}.db"
            proc.stdin.write(f"{path}\n")
            proc.stdin.flush()
            deadline = time.monotonic() + 10
            while not path.exists():
                assert time.monotonic() < deadline
            for _ in range(50):  # open it over and over while it is being made
                try:
                    Ledger(path, readonly=True).close()
                except LedgerCorruptError as exc:
                    damaged.append(str(exc))
                except LedgerError as exc:
                    assert "holds no ledger yet" in str(exc)
            assert proc.stdout.readline().strip() == "ok"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert damaged == []


_EVIDENCE_WRITER = r'''
import sys, time
from capseal import Producer
from capseal.keys import UnsafeEphemeralSigner
end = time.monotonic() + float(sys.argv[3])
with Producer("acme", sys.argv[2], UnsafeEphemeralSigner(), sys.argv[1]) as p:
    i = 0
    while time.monotonic() < end:
        record = p.seal({"action_id": f"{sys.argv[2]}-{i}", "action_type": "fyi"})
        p.ledger.add_evidence(record.capsule_id, {"kind": "test", "i": i})
        i += 1
'''


def test_whole_ledger_reads_are_consistent_while_others_write(tmp_path: Path) -> None:
    """check_chain, export and verify_ledger read records, then evidence, then
    the evidence index, each in its own snapshot: evidence committed in
    between named records they had not seen, and a healthy ledger read as
    broken (about 1 call in 20 here). Now each reads one snapshot."""
    path = tmp_path / "l.db"
    with Producer("acme", "init", UnsafeEphemeralSigner(), path) as p:
        p.seal({"action_id": "init", "action_type": "fyi"})
    writers = [subprocess.Popen([sys.executable, "-c", _EVIDENCE_WRITER, str(path), f"w{k}", "6"]) for k in range(2)]
    problems: list[str] = []
    calls = 0
    try:
        time.sleep(0.5)  # the writers are under way
        while any(w.poll() is None for w in writers):
            calls += 1
            with Ledger(path, readonly=True) as ledger:
                problems += ledger.check_chain()
                buf = io.BytesIO()
                ledger.export_jsonl(buf)
            buf.seek(0)
            copy = tmp_path / f"copy-{calls}.db"
            try:
                Ledger.import_jsonl(buf, copy).close()
            except LedgerError as exc:
                problems.append(f"export does not import: {exc}")
            for suffix in ("", "-wal", "-shm"):
                Path(str(copy) + suffix).unlink(missing_ok=True)
            if calls % 4 == 0:  # the costliest of the three (it checks every signature)
                report = capseal.verify_ledger(path)
                if not report.ok:
                    problems.append(f"verify_ledger: {[f.code for f in report.findings]}")
    finally:
        assert [w.wait(timeout=60) for w in writers] == [0, 0]
    assert calls >= 8
    assert problems == []
    assert capseal.verify_ledger(path).ok
    assert os.path.exists(path)


# --------------------------------------------------------------------------- second review of these fixes


def _fill(path: Path, n: int) -> None:
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        for i in range(n):
            p.submit({"action_id": f"f-{i}", "action_type": "fyi"})
        p.flush()


def _paused_check(path: Path, check: Callable[[Ledger], object]) -> tuple[Ledger, threading.Thread, threading.Event]:
    """A ledger of 10 records at ``path`` and a thread running ``check(ledger)``,
    returned once that thread's first query has read for real and waits for
    the event returned: a snapshot held open at a chosen moment."""
    _fill(path, 10)
    ledger = Ledger(path)
    inside, resume = threading.Event(), threading.Event()
    # private on purpose: the pause goes between two of the engine's queries (no public hook places it there)
    real_query = ledger._storage._query  # type: ignore[attr-defined]

    def pausing_query(sql: str, args: tuple[object, ...] = ()) -> list[object]:
        rows = real_query(sql, args)  # the real read; the pause only places what the test does between two
        if threading.current_thread().name == "checker" and not inside.is_set():
            inside.set()
            resume.wait(30)
        return rows

    ledger._storage._query = pausing_query  # type: ignore[attr-defined]
    checker = threading.Thread(target=check, args=(ledger,), name="checker")
    checker.start()
    assert inside.wait(30)
    return ledger, checker, resume


def _fork_a_producer(path: Path) -> tuple[int, int, int]:
    """Fork a process that seals c1-0..4 into ``path`` with a Producer of its
    own (as the README allows), says so, waits for the go-ahead, then seals
    c2-0..4. Returns (pid, the fd to wait on, the fd to go ahead with)."""
    first_half, go_on = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            with Producer("acme", "child", UnsafeEphemeralSigner(), path) as child:
                for i in range(5):
                    child.seal({"action_id": f"c1-{i}", "action_type": "fyi"})
                os.write(first_half[1], b"x")
                os.read(go_on[0], 1)
                for i in range(5):
                    child.seal({"action_id": f"c2-{i}", "action_type": "fyi"})
            code = 0
        finally:
            os._exit(code)
    return pid, first_half[0], go_on[1]


def _assert_the_forked_records_kept(path: Path, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with Ledger(path, readonly=True) as after:
        ids = {e.action_id for e in after.entries()}
        assert {f"c1-{i}" for i in range(5)} | {f"c2-{i}" for i in range(5)} <= ids
        assert after.check_chain() == []


def test_a_fork_during_a_snapshot_keeps_the_forked_process_records(tmp_path: Path) -> None:
    """A fork taken while another thread's check_chain() held its snapshot
    connection: that connection was not handed to the fork machinery, so the
    forked process's own new ledger took no file locks, the parent's close()
    deleted the -wal, and the child's later records were lost."""
    path = tmp_path / "l.db"
    problems: list[str] = []
    ledger, checker, forked = _paused_check(path, lambda ledger: problems.extend(ledger.check_chain()))
    pid, first_half, go_on = _fork_a_producer(path)
    forked.set()
    checker.join(30)
    os.read(first_half, 1)
    ledger.close()  # while the forked process has the file open
    os.write(go_on, b"x")
    _assert_the_forked_records_kept(path, pid)
    assert problems == []


def test_whole_ledger_reads_of_a_closed_ledger_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _fill(path, 3)
    ledger = Ledger(path)
    ledger.close()
    for read in (ledger.check_chain, lambda: ledger.export_jsonl(io.BytesIO()), ledger.count):
        with pytest.raises(LedgerError, match="is closed"):
            read()


@pytest.mark.parametrize("folder", ["a#b", "a?b", "c%41"])
def test_paths_with_uri_characters_read_their_own_file(tmp_path: Path, folder: str) -> None:
    """Snapshots and read-only opens use SQLite URIs: a '#', '?' or '%' in the
    path cut it short or decoded it, reading another file ('c%41' is 'cA')."""
    decoy = tmp_path / "cA" / "l.db"
    decoy.parent.mkdir()
    _fill(decoy, 20)
    path = tmp_path / folder / "l.db"
    path.parent.mkdir()
    _fill(path, 3)
    with Ledger(path) as ledger:
        assert ledger.check_chain() == []
        assert ledger.export_jsonl(io.BytesIO()) == ledger.count() == 4
    with Ledger(path, readonly=True) as ledger:
        assert ledger.count() == 4 and ledger.check_chain() == []
    report = capseal.verify_ledger(path)
    assert report.ok and report.counts()["records"] == 4
    assert not (tmp_path / "a").exists()  # no stray file where a cut-short URI pointed


def test_imports_to_long_names_and_dangling_links(tmp_path: Path, export: Path) -> None:
    long_name = tmp_path / ("x" * 240 + ".db")
    with export.open("rb") as fh, Ledger.import_jsonl(fh, long_name) as ledger:
        assert ledger.count() == 151
    dangling = tmp_path / "link.db"
    dangling.symlink_to(tmp_path / "nowhere.db")
    with export.open("rb") as fh, pytest.raises(LedgerError, match="already exists"):
        Ledger.import_jsonl(fh, dangling)
    assert not (tmp_path / "nowhere.db").exists()
    assert not list(tmp_path.glob(".capseal-import-*"))
    with export.open("rb") as fh, pytest.raises(LedgerError, match="cannot import into .*No such file or directory"):
        Ledger.import_jsonl(fh, tmp_path / "no-such-dir" / "l.db")  # an OSError naming the temp file before


def test_reopening_a_ledger_restores_a_dropped_append_only_trigger(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "l.db"
    _fill(path, 2)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER records_no_update")
    Ledger(path).close()
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute("UPDATE records SET body = x'00' WHERE seq = 1")


def test_a_fork_after_close_during_a_snapshot_keeps_the_forked_process_records(tmp_path: Path) -> None:
    """close() on one thread while another thread's snapshot was open: close()
    took the ledger off the fork machinery's list at once, so a fork before
    the snapshot ended inherited its connection unhandled, the forked
    process's ledger on the file took no file locks, and a later open and
    close in the parent deleted the -wal it was appending to."""
    path = tmp_path / "l.db"
    ended: list[BaseException] = []

    def check(ledger: Ledger) -> None:
        try:
            ledger.check_chain()
        except LedgerError as exc:  # closed under it: refused, typed
            ended.append(exc)

    ledger, checker, resume = _paused_check(path, check)
    ledger.close()  # the snapshot's connection stays open on the checker thread
    pid, first_half, go_on = _fork_a_producer(path)
    resume.set()
    checker.join(30)
    assert [type(e).__name__ for e in ended] == ["LedgerClosedError"]
    os.read(first_half, 1)
    Ledger(path).close()  # the parent opens and closes the file meanwhile
    os.write(go_on, b"x")
    _assert_the_forked_records_kept(path, pid)


def test_reads_inside_a_snapshot_see_one_state_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _fill(path, 3)
    with Ledger(path) as reader, Producer("acme", "other@1", UnsafeEphemeralSigner(), path) as writer:
        with reader.snapshot():
            before = reader.count()
            writer.seal({"action_id": "meanwhile", "action_type": "fyi"})
            assert reader.count() == before  # the same snapshot
            assert "meanwhile" not in {e.action_id for e in reader.entries()}
        assert reader.count() == before + 2  # the writer's epoch boundary and its record
