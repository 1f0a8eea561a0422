"""The PostgreSQL engine's own promises, on a real server (hardware/postgres.sh):
typed errors naming what is wrong (never the password), a database that is not
a ledger refused untouched, a server restarted mid-run, exports moving between
the two engines byte for byte, and duplicates refused across processes."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import (
    DuplicateRecordError,
    InputError,
    LedgerAccessDeniedError,
    LedgerBusyError,
    LedgerError,
    LedgerUnavailableError,
    MissingExtraError,
    NotALedgerError,
)
from capseal.judge import JudgmentStore
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import redact_url
from tests.conftest import PostgresServer


def _fill(target: str, n: int, developer: str = "agent@1") -> list[capseal.SealedRecord]:
    with Producer("acme", developer, UnsafeEphemeralSigner(), target) as p:
        return [p.seal({"action_id": f"{developer}-{i}", "action_type": "fyi"}) for i in range(n)]


def test_a_wrong_password_an_unreachable_server_and_no_database_are_typed_and_name_no_password(
        postgres: PostgresServer) -> None:
    wrong = "Wr0ng-pa55-Zq9"
    url = postgres.url(password=wrong)
    with pytest.raises(LedgerAccessDeniedError) as denied:
        Ledger(url)
    for text in (str(denied.value), repr(denied.value), denied.value.diagnostics()):
        assert wrong not in text and postgres.password not in text
    assert "postgres:***@" in str(denied.value) and "password authentication failed" in str(denied.value)
    with pytest.raises(LedgerAccessDeniedError):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), url)
    nowhere = postgres.url().replace(f"host={postgres.host}", f"host={postgres.host}-gone")
    with pytest.raises(LedgerUnavailableError, match="cannot be reached") as gone:
        Ledger(nowhere)
    assert postgres.password not in str(gone.value) and "-gone" in str(gone.value)
    with pytest.raises(LedgerError, match="no such database") as missing:
        Ledger(postgres.url(database="no_such_db"))
    assert postgres.password not in str(missing.value)
    with pytest.raises(LedgerError, match="search_path names does not exist"):
        Ledger(postgres.url("no_such_schema"))
    report = capseal.verify_ledger(url)  # a verifier reports, never raises, and never shows it either
    assert not report.ok and report.findings[0].code == "ledger_unreadable"
    assert wrong not in str(report.to_dict()) and report.path == redact_url(url)


def test_the_password_is_never_shown(postgres: PostgresServer) -> None:
    url = postgres.new_url()
    with Ledger(url) as ledger:
        for text in (repr(ledger), str(ledger.path), ledger.path.name, repr(ledger.path), ledger._storage.name):
            assert postgres.password not in text and "***" in text
    assert redact_url("postgresql://u:p%40ss@h/db?password=x&sslmode=require") == \
        "postgresql://u:***@h/db?password=***&sslmode=require"


def test_a_database_that_is_not_a_ledger_is_refused_untouched(postgres: PostgresServer) -> None:
    url = postgres.new_url()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int)")
    for readonly in (False, True):
        with pytest.raises(NotALedgerError, match="not a capseal ledger: its schema holds other tables \\(orders\\)"):
            Ledger(url, readonly=readonly)
    with pytest.raises(NotALedgerError):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), url)
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()").fetchall()
    assert tables == [("orders",)]  # nothing was added
    report = capseal.verify_ledger(url)
    assert not report.ok and report.findings[0].code == "ledger_not_capseal"
    with pytest.raises(NotALedgerError):
        Ledger.import_jsonl(io.BytesIO(b""), url)


def test_without_psycopg_a_server_ledger_names_the_extra(tmp_path: Any) -> None:
    script = ("import sys; sys.modules['psycopg'] = None\n"
              "from capseal import Ledger\nfrom capseal.errors import MissingExtraError\n"
              "Ledger(str(sys.argv[1])).close()\n"
              "try:\n    Ledger('postgresql://u:secret@/db')\n"
              "except MissingExtraError as exc:\n    print('refused', exc.diagnostics())\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "l.db")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused" in out.stdout and "capseal[postgres]" in out.stdout and "secret" not in out.stdout
    assert issubclass(MissingExtraError, ImportError)


def test_a_head_lock_held_too_long_is_busy(postgres: PostgresServer) -> None:
    url = postgres.new_url()
    _fill(url, 1)
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), Ledger(url, lock_timeout=0.2)) as p:
        before = p.ledger.count()
        with psycopg.connect(url) as holder:  # another host's writer, holding the head for too long
            holder.execute("SELECT * FROM heads WHERE chain = 'records' FOR UPDATE")
            with pytest.raises(LedgerBusyError, match="another writer kept it locked for 0.2 s"):
                p.seal({"action_id": "while-locked", "action_type": "fyi"})
            holder.rollback()
        assert p.ledger.count() == before
        p.seal({"action_id": "after", "action_type": "fyi"})
        assert p.ledger.count() == before + 2 and p.ledger.check_chain() == []


def test_exports_move_between_the_engines_byte_for_byte(postgres: PostgresServer, tmp_path: Any) -> None:
    from capseal.ledger import batch_root

    url = postgres.new_url()
    records = _fill(url, 6)
    with Ledger(url) as ledger:
        ids = [r.capsule_id for r in records]
        ledger.add_evidence(ids[0], {"format": "test-slot"})
        root, _ = batch_root(ids[1:4])
        ledger.add_evidence_batch(ids[1:4], root, {"format": "test-quote", "quote": "00"})
        from_pg = io.BytesIO()
        ledger.export_jsonl(from_pg)
    with Ledger.import_jsonl(io.BytesIO(from_pg.getvalue()), tmp_path / "copy.db") as file_copy:
        from_file = io.BytesIO()
        file_copy.export_jsonl(from_file)
        assert file_copy.current_evidence(ids[2]) is not None
    assert from_file.getvalue() == from_pg.getvalue()
    back = postgres.new_url()
    with Ledger.import_jsonl(io.BytesIO(from_file.getvalue()), back) as pg_copy:
        again = io.BytesIO()
        pg_copy.export_jsonl(again)
        assert pg_copy.evidence_history(ids[0]) == [None, {"format": "test-slot"}]
        assert pg_copy.check_chain() == []
    assert again.getvalue() == from_pg.getvalue()
    assert capseal.verify_ledger(back).ok and capseal.verify_ledger(tmp_path / "copy.db").ok
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), back) as p:  # an imported ledger goes on
        p.seal({"action_id": "after-import", "action_type": "fyi"})
        assert p.ledger.check_chain() == []


_RACER = r"""
import sys
from capseal import Producer
from capseal.errors import DuplicateRecordError, InputError
from capseal.keys import UnsafeEphemeralSigner
url, who = sys.argv[1], sys.argv[2]
sys.stdin.readline()  # all start together
won = refused = 0
with Producer("acme", f"racer-{who}@1", UnsafeEphemeralSigner(), url) as p:
    for i in range(60):
        try:
            p.seal({"action_id": f"shared-{i}", "action_type": "fyi"})
            won += 1
        except DuplicateRecordError:
            refused += 1
try:  # an epoch is opened by its first record (its boundary goes in with it)
    with Producer("acme", f"epoch-{who}@1", UnsafeEphemeralSigner(), url, epoch_id="the-one-epoch") as p:
        p.seal({"action_id": f"first-of-{who}", "action_type": "fyi"})
    epoch = "opened"
except (InputError, DuplicateRecordError):
    epoch = "refused"
print(won, refused, epoch, flush=True)
"""


def test_duplicates_are_refused_across_processes(postgres: PostgresServer) -> None:
    """Four processes seal the same 60 action ids and open the same epoch id
    at once: each action id and the epoch id is stored exactly once."""
    url = postgres.new_url()
    Ledger(url).close()
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, url, str(k)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for k in range(4)]
    time.sleep(1.0)  # each has its producer open
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [proc.communicate(timeout=120)[0].split() for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), results
    assert sum(int(r[0]) for r in results) == 60 and sum(int(r[1]) for r in results) == 3 * 60
    assert sorted(r[2] for r in results) == ["opened", "refused", "refused", "refused"]
    with Ledger(url, readonly=True) as ledger:
        actions = [e.action_id for e in ledger.entries() if e.action_id and e.action_id.startswith("shared-")]
        assert sorted(actions) == sorted(f"shared-{i}" for i in range(60))
        assert ledger.check_chain() == []
    assert capseal.verify_ledger(url).ok


_CREATOR = r"""
import sys
from capseal import Ledger
sys.stdin.readline()
Ledger(sys.argv[1]).close()
print("ok", flush=True)
"""


def test_processes_creating_one_ledger_at_once_all_open_it(postgres: PostgresServer) -> None:
    url = postgres.new_url()
    procs = [subprocess.Popen([sys.executable, "-c", _CREATOR, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    time.sleep(0.8)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert [o[0].strip() for o in outs] == ["ok"] * 4, [o[1][-300:] for o in outs]
    with Ledger(url) as ledger:
        assert ledger.count() == 0 and ledger.check_chain() == []


def test_the_key_functions_never_run_in_a_parallel_plan(postgres: PostgresServer) -> None:
    """The lookup functions catch errors (a subtransaction each call), which
    PostgreSQL refuses inside a parallel operation: a large ledger's index
    build or a parallel scan then failed ("cannot start subtransactions during
    a parallel operation"). Labelled PARALLEL UNSAFE, they are never planned
    into one, even when parallel plans are forced."""
    url = postgres.new_url()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), url) as p:
        for i in range(5):
            p.seal({"action_id": f"par-{i}", "action_type": "fyi"})
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET force_parallel_mode = on; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; "
                     "SET min_parallel_table_scan_size = 0")
        for function in ("capseal_member(body, 'capsule', 'action_id')", "capseal_action_key(body)",
                         "capseal_column_key(action_id, action_id_json)"):
            found = conn.execute(f"SELECT count(*) FROM records WHERE {function} LIKE 'par-%%'").fetchone()
            assert found is not None and found[0] == 5, function


def test_a_server_restarted_mid_run(postgres: PostgresServer) -> None:
    """The server stops as in a crash (``pg_ctl stop -m immediate``) while a
    producer seals from four threads, and stays down until a seal is refused:
    every acknowledged record is there after the restart, each record refused
    meanwhile got a typed error and is not there (nothing half-written) unless
    its error says it may be (a COMMIT whose answer was lost), and the same
    producer goes on without a restart of the process."""
    url = postgres.new_url()
    acknowledged: list[str] = []
    refused: list[tuple[str, BaseException]] = []
    stop = threading.Event()
    lock = threading.Lock()
    # a short lock timeout: a COMMIT whose answer was lost looks for its rows for 2 s, not 30
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), Ledger(url, lock_timeout=2.0)) as p:
        def worker(t: int) -> None:
            i = 0
            while not stop.is_set():
                action = f"t{t}-{i}"
                i += 1
                try:
                    p.seal({"action_id": action, "action_type": "fyi"})
                    with lock:
                        acknowledged.append(action)
                except LedgerError as exc:
                    with lock:
                        refused.append((action, exc))
                    time.sleep(0.02)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        try:
            while len(acknowledged) < 100:
                time.sleep(0.01)
            postgres.crash()
            down = time.monotonic() + 30
            while not refused and time.monotonic() < down:  # down until the producer has met it
                time.sleep(0.05)
            postgres.start()
            before = len(acknowledged)
            deadline = time.monotonic() + 60
            while len(acknowledged) < before + 100:  # the same producer, in the same process, goes on
                assert time.monotonic() < deadline, refused[-3:]
                time.sleep(0.01)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
    assert refused, "the restart refused nothing: it happened between two commits"
    assert all(isinstance(exc, LedgerUnavailableError) for _, exc in refused), {type(e).__name__: str(e)[:200] for _, e in refused}
    assert all(postgres.password not in str(exc) for _, exc in refused)
    with Ledger(url, readonly=True) as ledger:
        stored = {e.action_id for e in ledger.entries()}
        assert set(acknowledged) <= stored
        maybe = {action for action, exc in refused if "may or may not be stored" in str(exc)}
        assert not stored & ({action for action, _ in refused} - maybe)
        assert ledger.check_chain() == []
    assert capseal.verify_ledger(url).ok


def test_the_judgment_store_on_a_server(postgres: PostgresServer) -> None:
    from capseal.judge import Case, EvaluationReport, JudgePin, Target, link

    signer = UnsafeEphemeralSigner()
    url = postgres.new_url()
    with Producer("example-org", "refund-agent@1.0", signer, url) as producer:
        act = producer.seal({"action_id": "refund-1", "action_type": "fyi"})
        store = JudgmentStore(producer.ledger, signer)
        prompt = store.put_text("Grade the act.\n", type="judge-prompt")
        rubric = store.put_json({"rubric_id": "r", "criteria": [{"id": "C1"}]}, type="rubric")
        pin = JudgePin.pin(model_id="judge@1", prompt=prompt, sampling={"temperature_micros": 0})
        body = EvaluationReport(record_id="er-1", generated_at="2026-05-01T12:00:00Z", contract_ref="ec:c@1",
                                judge_pin=pin, cases=[Case.of("c1", "met", acts=[Target.of_capsule(act)],
                                                              method=rubric)])
        sealed = store.seal(body, links=[link("cites", Target.of_capsule(act))])
        assert store.get(sealed.digest) == sealed
        assert [j.digest for j in store.judgments()] == [sealed.digest]
    report = capseal.verify_ledger(url)
    assert report.ok, report.to_dict()
    assert any(r.record_type.startswith("judge:") and r.signature == "authored" for r in report.records)


def test_a_producer_refuses_a_closed_server_ledger_it_was_given(postgres: PostgresServer) -> None:
    ledger = Ledger(postgres.new_url())
    ledger.close()
    with pytest.raises(LedgerError):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), ledger)
    with pytest.raises(InputError, match="or a postgresql:// URL"):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), 42)  # type: ignore[arg-type]
    with pytest.raises(DuplicateRecordError):
        url = postgres.new_url()
        with Producer("acme", "agent@1", UnsafeEphemeralSigner(), url) as p:
            p.seal({"action_id": "once", "action_type": "fyi"})
            p.seal({"action_id": "once", "action_type": "fyi"})
