"""fork() without exec: a Producer, Ledger or TPM signer belongs to the process
that opened it. In a forked child each refuses with a typed error naming the
ledger path (or the TCTI) and both pids, before anything is signed, queued or
written; close() there returns at once and writes nothing; a new one opened in
the child works, on a new path or the same one; the parent goes on.

Each scenario runs in a child made with ``os.fork()``, under SIGALRM with the
default action (pytest-timeout installs a handler of its own), so a hang kills
the child instead of the suite; the child reports through a pipe as JSON and
leaves with ``os._exit``. Real SQLite files and a real swtpm, never mocks."""

from __future__ import annotations

import gc
import os
import signal
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from capseal import Ledger, Producer, verify_ledger
from capseal.errors import LedgerForkedError, SignerForkedError
from capseal.keys import UnsafeEphemeralSigner, open_signer
from capseal.ledger import LedgerEntry

from ..forking import ForkedChild, attempt, held_elsewhere, in_child

KEY = 0x81000C01  # a handle of our own on the shared session swtpm
FYI = {"action_type": "fyi"}


def _rows(path: Path) -> int:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM records").fetchone()[0])


def _assert_refused(outcome: Any, path: Path, child_pid: int) -> None:
    assert isinstance(outcome, dict), f"the call {outcome} in the forked child"
    assert outcome["type"] == LedgerForkedError.__name__ and outcome["forked"] and outcome["ledger_error"]
    message = outcome["message"]
    assert str(path) in message and f"process {os.getpid()}" in message and f"process {child_pid}" in message
    assert "Open a new Ledger (or Producer) in this process" in message


# ---------------------------------------------------------------------------- software key


def test_inherited_producer_refuses_everything_in_the_child_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    producer = Producer("acme", "buyer-agent@1.4", UnsafeEphemeralSigner(), path)
    planned = producer.planned("po-1", effect_type="write_order", request={"sku": "A1"})
    producer.submit({"action_id": "n-1", **FYI}).result()
    before = _rows(path)

    def child() -> dict[str, Any]:
        seen: dict[str, Any] = {
            "seal": attempt(lambda: producer.seal({"action_id": "c-1", **FYI})),
            "submit": attempt(lambda: producer.submit({"action_id": "c-2", **FYI})),
            "confirmed": attempt(lambda: producer.confirmed(planned, response={"order": "O-1"})),
            "refused": attempt(lambda: producer.refused(action_id="c-3", verdict_class="blocked")),
            "flush": attempt(producer.flush),
            "rotate_epoch": attempt(producer.rotate_epoch),
        }
        seen["close"] = attempt(producer.close)  # a wait for the parent's threads would end in the alarm
        seen["seal_after_close"] = attempt(lambda: producer.seal({"action_id": "c-4", **FYI}))
        seen["pid"] = os.getpid()
        return seen

    seen = in_child(child)
    for call in ("seal", "submit", "confirmed", "refused", "flush", "rotate_epoch", "seal_after_close"):
        _assert_refused(seen[call], path, seen["pid"])
    assert seen["close"] == "returned"
    assert _rows(path) == before  # nothing went in through the inherited connection
    producer.confirmed(planned, response={"order": "O-1"})  # the parent goes on
    producer.submit({"action_id": "n-2", **FYI}).result()
    producer.close()
    assert _rows(path) == before + 2
    assert verify_ledger(path).ok


def test_inherited_ledger_refuses_every_call_in_the_child(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    stored = ledger.append(LedgerEntry("a" * 64, "note", "producer_claim", b'{"n":1}'))
    pending = ledger.submit(LedgerEntry("b" * 64, "note", "producer_claim", b'{"n":2}'))
    pending.result()

    def entry(n: int) -> LedgerEntry:
        return LedgerEntry(f"{n:064x}", "note", "producer_claim", b'{"child":true}')

    def child() -> dict[str, Any]:
        seen: dict[str, Any] = {
            "append": attempt(lambda: ledger.append(entry(1))),
            "append_many": attempt(lambda: ledger.append_many([entry(2), entry(3)])),
            "submit": attempt(lambda: ledger.submit(entry(4))),
            "flush": attempt(ledger.flush),
            "result": attempt(pending.result),
            "add_evidence": attempt(lambda: ledger.add_evidence(stored.record_id, None)),
            "count": attempt(ledger.count),
            "entry": attempt(lambda: ledger.entry(stored.record_id)),
            "entries": attempt(lambda: list(ledger.entries())),
            "check_chain": attempt(ledger.check_chain),
            "close": attempt(ledger.close),
            "count_after_close": attempt(ledger.count),
            "pid": os.getpid(),
        }
        return seen

    seen = in_child(child)
    assert seen.pop("close") == "returned"
    child_pid = seen.pop("pid")
    for call, outcome in seen.items():
        assert isinstance(outcome, dict), f"{call} in the forked child"
        _assert_refused(outcome, path, child_pid)
    assert _rows(path) == 2
    ledger.append(entry(5))  # the parent's ledger is untouched and goes on
    assert ledger.count() == 3 and ledger.check_chain() == []
    ledger.close()


def test_a_child_letting_go_of_an_inherited_producer_deletes_nobodys_records(tmp_path: Path) -> None:
    """The child's copies of the connections are never closed the ordinary
    way: closing one there ran SQLite's last-connection WAL checkpoint, which
    then deleted the ``-wal`` file by name, and with it records another
    process had committed."""
    path = tmp_path / "l.db"
    held = [Producer("acme", "buyer-agent@1.4", UnsafeEphemeralSigner(), path)]
    held[0].seal({"action_id": "p-1", **FYI})  # the epoch capsule and this one
    go_read, go_write = os.pipe()

    def let_go() -> None:
        os.read(go_read, 1)
        held.clear()  # as at the end of a child that exits normally: the producer is freed
        gc.collect()

    child = ForkedChild(let_go, alarm=20)
    held.pop().close()  # the parent's ledger is closed (its WAL checkpointed and removed)

    kept: list[Producer] = []

    def other_writer() -> None:  # commits, then dies without closing: its WAL holds the records
        kept.append(Producer("acme", "other-agent@1", UnsafeEphemeralSigner(), path))
        kept[0].seal({"action_id": "o-1", **FYI})

    in_child(other_writer)
    os.write(go_write, b"x")
    child.result()
    os.close(go_read)
    os.close(go_write)
    assert _rows(path) == 4
    report = verify_ledger(path)
    assert report.ok, report


def test_a_new_producer_opened_in_the_child_works_on_the_same_path_and_a_new_one(tmp_path: Path) -> None:
    path, other = tmp_path / "l.db", tmp_path / "child.db"
    producer = Producer("acme", "buyer-agent@1.4", UnsafeEphemeralSigner(), path)
    producer.seal({"action_id": "p-1", **FYI})

    def child() -> dict[str, Any]:
        refused = attempt(lambda: producer.seal({"action_id": "c-0", **FYI}))
        producer.close()  # let go of the inherited one (returns at once)
        counts = {}
        for target in (path, other):
            with Producer("acme", "child-agent@1", UnsafeEphemeralSigner(), target) as mine:
                planned = mine.planned("c-1", effect_type="write_order")
                mine.confirmed(planned, response={"order": "O-9"})
                mine.submit({"action_id": "c-2", **FYI})
                mine.flush()
            report = verify_ledger(target)
            counts[str(target)] = (report.ok, _rows(target))
        return {"refused": refused, "counts": counts, "pid": os.getpid()}

    seen = in_child(child)
    _assert_refused(seen["refused"], path, seen["pid"])
    assert seen["counts"] == {str(path): [True, 2 + 4], str(other): [True, 4]}
    producer.seal({"action_id": "p-2", **FYI})  # behind the child's records (another process appended)
    producer.close()
    assert _rows(path) == 2 + 4 + 1
    assert verify_ledger(path).ok


# ---------------------------------------------------------------------------- TPM (swtpm)


@pytest.fixture(scope="module")
def tpm_uri(swtpm: Any) -> str:
    from capseal.keys.tpm import create_key, list_keys

    uri = f"tpm2:handle=0x{KEY:08x}?tcti={swtpm.tcti}"
    if not any(e["handle"] == f"0x{KEY:08x}" for e in list_keys(f"tpm2:?tcti={swtpm.tcti}")):
        create_key(uri, "p256").close()
    return uri


def test_pipelined_tpm_producer_refuses_in_the_child_without_hanging(tpm_uri: str, tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    signer = open_signer(tpm_uri)
    producer = Producer("acme", "buyer-agent@1.4", signer, path)
    assert signer.external_device
    for n in range(5):  # the signing pipeline and the ledger's committer run now
        producer.submit({"action_id": f"p-{n}", **FYI})
    producer.flush()
    before = _rows(path)

    def child() -> dict[str, Any]:
        seen: dict[str, Any] = {
            "submit": attempt(lambda: producer.submit({"action_id": "c-1", **FYI})),
            "seal": attempt(lambda: producer.seal({"action_id": "c-2", **FYI})),
            "flush": attempt(producer.flush),
        }
        seen["close"] = attempt(lambda: producer.close(timeout=5))
        seen["pid"] = os.getpid()
        return seen

    seen = in_child(child, alarm=20)
    for call in ("submit", "seal", "flush"):
        _assert_refused(seen[call], path, seen["pid"])
    assert seen["close"] == "returned"
    assert _rows(path) == before
    for n in range(5, 10):  # the parent's pipeline and TPM connection go on
        producer.submit({"action_id": f"p-{n}", **FYI})
    producer.close()
    signer.close()
    assert _rows(path) == before + 5
    assert verify_ledger(path).ok


def test_tpm_signer_in_the_child_says_fork_and_one_opened_there_works(tpm_uri: str, swtpm: Any,
                                                                       tmp_path: Path) -> None:
    signer = open_signer(tpm_uri)
    signer.sign(b"parent, before")

    def child() -> dict[str, Any]:
        inherited = attempt(lambda: signer.sign(b"child"))
        signer.close()  # returns at once; sends the parent's connection nothing
        mine = open_signer(tpm_uri)
        with Producer("acme", "child-agent@1", mine, tmp_path / "child.db") as producer:
            for n in range(3):
                producer.submit({"action_id": f"c-{n}", **FYI})
        mine.close()
        report = verify_ledger(tmp_path / "child.db")
        return {"inherited": inherited, "ok": report.ok, "rows": _rows(tmp_path / "child.db"),
                "pid": os.getpid()}

    seen = in_child(child, alarm=30)
    outcome = seen["inherited"]
    assert isinstance(outcome, dict) and outcome["type"] == SignerForkedError.__name__
    assert outcome["forked"] and outcome["unavailable"]  # still a SignerUnavailableError
    message = outcome["message"]
    assert swtpm.tcti in message and "forked" in message and "closed" not in message
    assert f"process {os.getpid()}" in message and f"({seen['pid']})" in message
    assert "Open the signer again in this process" in message
    assert (seen["ok"], seen["rows"]) == (True, 4)
    signature = signer.sign(b"parent, after")  # the parent's connection was left alone
    assert signature.signature and signer.kid
    signer.close()


# ---------------------------------------------------------------------------- the same file, after the fork


def _entry(n: int) -> LedgerEntry:
    return LedgerEntry(f"{n:064x}", "note", "producer_claim", b'{"n":%d}' % n)


def _parent_closes_while_the_fork_appends(parent: Ledger, path_in_the_fork: Path) -> None:
    """The fork opens its own ledger on the parent's file (by ``path_in_the_fork``)
    and appends; the parent closes its own (SQLite's last-connection
    checkpoint) while the fork appends more. Every append must stay."""
    opened, closed = os.pipe(), os.pipe()

    def child() -> int:
        with Ledger(path_in_the_fork) as mine:
            mine.append(_entry(100))
            os.write(opened[1], b"o")
            os.read(closed[0], 1)  # the parent has closed its ledger
            mine.append(_entry(101))
            mine.append(_entry(102))
        return 3

    running = ForkedChild(child, alarm=30)
    os.read(opened[0], 1)
    parent.close()
    os.write(closed[1], b"c")
    assert running.result() == 3
    for fd in (*opened, *closed):
        os.close(fd)


def test_the_parent_closing_while_the_child_appends_to_the_same_file_loses_nothing(tmp_path: Path) -> None:
    """The inherited connections' lock records once made the fork's new
    connection take no OS locks, so the parent's close deleted the -wal under
    it: appends that returned were gone."""
    path = tmp_path / "l.db"
    parent = Ledger(path)
    parent.append(_entry(1))
    _parent_closes_while_the_fork_appends(parent, path)
    assert _rows(path) == 4
    _assert_chain_intact(path)


def _assert_chain_intact(path: Path) -> None:
    with Ledger(path, readonly=True) as ledger:
        assert ledger.check_chain() == []


_POOL_STARTED: Any = None  # a multiprocessing Event the fork-pool workers inherit


def _seal_in_pool_worker(args: tuple[str, int]) -> int:
    path, worker = args
    with Producer("acme", f"worker-{worker}@1", UnsafeEphemeralSigner(), path) as mine:
        for n in range(15):
            mine.seal({"action_id": f"w{worker}-{n}", **FYI})
            _POOL_STARTED.set()  # the parent closes its producer while the workers go on
            time.sleep(0.005)
    return 15 + 1  # and its epoch capsule


def test_fork_pool_workers_sealing_into_the_parents_file_lose_nothing(tmp_path: Path) -> None:
    """README's pattern: fork-pool workers each open a Producer on the file the
    parent uses, and the parent closes its own while they seal. Every record
    whose seal() returned is in the file (about half were lost)."""
    import multiprocessing

    global _POOL_STARTED
    context = multiprocessing.get_context("fork")
    _POOL_STARTED = context.Event()
    path = tmp_path / "l.db"
    parent = Producer("acme", "parent@1", UnsafeEphemeralSigner(), path)
    parent.seal({"action_id": "p-1", **FYI})
    with context.Pool(2) as pool:
        sealed = pool.map_async(_seal_in_pool_worker, [(str(path), w) for w in range(2)], chunksize=1)
        assert _POOL_STARTED.wait(60)
        parent.close()
        acknowledged = sum(sealed.get(120)) + 2
    assert _rows(path) == acknowledged
    assert verify_ledger(path).ok


def test_forks_taken_while_the_parent_commits_open_the_same_file_at_once(tmp_path: Path) -> None:
    """A thread appends without pause while the parent forks: the fork waits
    for the transaction under way, so no fork holds a copy of SQLite's write
    lock, and each fork's own ledger on the same file appends at once (it
    once failed after SQLite's 30 s busy timeout, or hung in connect)."""

    path = tmp_path / "l.db"
    parent = Ledger(path)
    stop, appended = threading.Event(), [0]

    def append_without_pause() -> None:
        n = 1_000_000
        while not stop.is_set():
            parent.append(_entry(n))
            n += 1
            appended[0] += 1

    thread = threading.Thread(target=append_without_pause)
    thread.start()
    mine_total = 0
    try:
        for k in range(8):
            def child(k: int = k) -> int:
                parent.close()  # lets go of the inherited copy (nothing is written)
                with Ledger(path, group_window=0) as mine:
                    mine.append(_entry(k))
                    mine.submit(_entry(100 + k)).result()
                return 2
            mine_total += in_child(child, alarm=25)  # the old 30 s busy timeout would end in the alarm
    finally:
        stop.set()
        thread.join()
    parent.close()
    assert _rows(path) == appended[0] + mine_total
    _assert_chain_intact(path)


def test_a_fork_taken_mid_transaction_refuses_every_ledger_in_the_fork(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transaction that outlives the fork's wait (here a thread holds the
    ledger's write lock, as a stuck commit would): the thread inside SQLite
    may hold SQLite's process-wide mutexes, copied held into the fork, so no
    ledger may be opened there, that file or another, each refusal saying
    why. (Letting only that file be refused, a fork that then opened another
    one hung whenever the parent's thread had been inside SQLite.)"""

    from capseal import process

    monkeypatch.setattr(process, "FORK_WAIT", 0.3)
    path, other = tmp_path / "l.db", tmp_path / "other.db"
    parent = Ledger(path)
    parent.append(_entry(1))
    # private on purpose: a stuck commit, made by holding the engine's write lock from another thread
    with held_elsewhere(parent._storage.write_lock):
        seen = in_child(lambda: {"same": attempt(lambda: Ledger(path)), "other": attempt(lambda: Ledger(other))})
    for name in ("same", "other"):
        refused = seen[name]
        assert isinstance(refused, dict) and refused["type"] == LedgerForkedError.__name__, refused
        assert str(path) in refused["message"] and "in use in the parent" in refused["message"]
    assert not other.exists()
    parent.append(_entry(3))
    parent.close()
    assert _rows(path) == 2
    _assert_chain_intact(path)


def test_letting_go_in_the_fork_never_checkpoints_another_writers_wal(tmp_path: Path) -> None:
    """No process holds the file when the fork lets go of what it inherited:
    the parent closed its ledger, and another writer committed 5 records and
    was killed (they are in its -wal only). Letting go must not checkpoint
    from the fork's stale copy and delete that -wal: with the wrong SQLite
    option set (DEFENSIVE, 1010, for NO_CKPT_ON_CLOSE, 1006) it did, and the
    5 acknowledged records were gone."""
    path = tmp_path / "l.db"
    parent = Ledger(path)
    parent.append(_entry(1))
    go_read, go_write = os.pipe()

    def open_it_later() -> int:
        os.read(go_read, 1)
        with Ledger(path) as mine:
            seen = mine.count()
            mine.append(_entry(100))
        return seen

    child = ForkedChild(open_it_later, alarm=30)
    parent.close()

    def commit_then_die() -> None:
        writer = Ledger(path)
        for n in range(2, 7):
            writer.append(_entry(n))  # durable: in the -wal, not checkpointed
        os.kill(os.getpid(), signal.SIGKILL)

    killed = os.fork()
    if killed == 0:
        try:
            commit_then_die()
        finally:
            os._exit(1)
    assert os.waitpid(killed, 0)[1] == signal.SIGKILL
    os.write(go_write, b"g")
    assert child.result() == 6
    os.close(go_read)
    os.close(go_write)
    assert _rows(path) == 7
    _assert_chain_intact(path)


def test_a_ledger_opened_by_a_relative_path_is_let_go_of_after_a_chdir(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent opened "l.db" in its directory of the time and moved on; the
    fork opens the same file by another path. Its inherited connections must
    still be found (by the file SQLite opened, not the path as typed now), or
    its new connection takes no OS locks and the parent's close deletes the
    -wal under it."""
    monkeypatch.chdir(tmp_path)
    parent = Ledger("l.db")
    parent.append(_entry(1))
    monkeypatch.chdir("/")
    _parent_closes_while_the_fork_appends(parent, tmp_path / "l.db")
    assert _rows(tmp_path / "l.db") == 4


def test_a_fork_from_a_commit_callback_does_not_wait_on_its_own_commit(tmp_path: Path) -> None:
    """A commit listener (it runs after the COMMIT, on the committing thread,
    which holds the write lock) forks: the fork does not wait for that lock
    (it once waited 10 s and then refused the file, saying a transaction was
    running), and the fork opens the same file and appends."""
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    children: list[ForkedChild] = []

    def fork_once(stored: list[Any]) -> None:
        if not children:
            def child() -> int:
                with Ledger(path) as mine:
                    mine.append(_entry(100))
                    return mine.count()
            children.append(ForkedChild(child, alarm=30))

    ledger.add_commit_listener(fork_once)
    ledger.append(_entry(1))
    assert children[0].result() == 2
    ledger.append(_entry(2))
    ledger.close()
    assert _rows(path) == 3
    _assert_chain_intact(path)


def test_a_fork_inside_a_transaction_on_the_committing_thread_refuses_the_file(tmp_path: Path) -> None:
    """A fork made on the committing thread while its transaction runs (a
    signal handler or a finaliser can; here SQLite's own trace callback, on
    the INSERT): the fork does not wait on its own lock, and that file counts
    as in use: opening it in the fork is refused. (Counting every fork from
    that thread as between statements let the fork close a connection copied
    mid-transaction, which rolled back into the WAL index the parent shares:
    integrity_check then found broken indexes.)"""
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    ledger.append(_entry(1))
    children: list[ForkedChild] = []

    def fork_mid_transaction(statement: str) -> None:
        if statement.startswith("INSERT INTO records") and not children:
            children.append(ForkedChild(lambda: attempt(lambda: Ledger(path)), alarm=20))

    # private on purpose: the writing connection's trace hook places the fork inside the transaction
    ledger._storage._db.set_trace_callback(fork_mid_transaction)  # type: ignore[attr-defined]
    ledger.append(_entry(2))
    ledger._storage._db.set_trace_callback(None)  # type: ignore[attr-defined]
    refused = children[0].result()
    assert isinstance(refused, dict) and refused["type"] == LedgerForkedError.__name__, refused
    assert "in use in the parent" in refused["message"]
    ledger.append(_entry(3))
    ledger.close()
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert _rows(path) == 3


def test_forks_while_other_threads_open_and_close_ledgers_never_hang(tmp_path: Path) -> None:
    """Ledgers opened while a fork looks at the open ones were not waited for:
    their sqlite3.connect ran during the fork, the fork inherited SQLite's
    process-wide mutex held, and its own first SQLite call hung (about one
    fork in four here). The registry lock orders each opening before or
    after the fork."""

    kept = [Ledger(tmp_path / f"k{i}.db") for i in range(150)]  # a longer look at the open ones
    stop = threading.Event()

    def open_and_close(i: int) -> None:
        while not stop.is_set():
            Ledger(tmp_path / f"c{i}.db").close()

    threads = [threading.Thread(target=open_and_close, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(30):
            def child() -> int:
                with Ledger(tmp_path / "k0.db") as mine:
                    return mine.count()
            assert in_child(child, alarm=10) == 0  # a hang ends in the alarm and fails here
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for ledger in kept:
            ledger.close()


def test_a_fork_that_carries_on_from_a_commit_callback_never_commits(tmp_path: Path) -> None:
    """A commit listener forks and the fork simply returns from it (as a
    daemonising helper would): the fork is then the committer's copy, with
    records queued. It must not go on committing them through the inherited
    connection (it did: BEGIN, INSERT, ROLLBACK, over and over, never
    exiting); it ends instead."""
    path = tmp_path / "l.db"
    ledger = Ledger(path)
    parent = os.getpid()
    sql_read, sql_write = os.pipe()
    # private on purpose: the writing connection's trace hook shows any SQL the fork runs on it
    ledger._storage._db.set_trace_callback(  # type: ignore[attr-defined]
        lambda sql: os.getpid() != parent and os.write(sql_write, sql[:40].encode() + b"\n"))
    forked: list[int] = []

    def fork_and_carry_on(stored: list[Any]) -> None:
        if forked:
            return
        on_the_committer = threading.current_thread() is not threading.main_thread()
        for n in range(100, 120):
            ledger.submit(_entry(n))  # queued for the committer meanwhile
        pid = os.fork()
        if pid == 0:
            if not on_the_committer:  # a copy of pytest itself must never carry on
                os._exit(3)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(10)
            return  # the fork carries on as the committer
        forked.append(pid)

    ledger.add_commit_listener(fork_and_carry_on)
    ledger.submit(_entry(1))  # committed by the committer thread: this one only waits, without leading
    for _ in range(2000):
        if forked:
            break
        time.sleep(0.005)
    ledger.flush()
    _, status = os.waitpid(forked[0], 0)
    assert os.waitstatus_to_exitcode(status) != 3, "the listener ran on the main thread"
    ledger._storage._db.set_trace_callback(None)  # type: ignore[attr-defined]
    os.close(sql_write)
    child_sql = os.read(sql_read, 65536)
    os.close(sql_read)
    assert not os.WIFSIGNALED(status), "the fork did not end (killed by its alarm)"
    assert child_sql == b""
    ledger.close()
    assert _rows(path) == 21
    _assert_chain_intact(path)
