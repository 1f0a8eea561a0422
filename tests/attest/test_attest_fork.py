# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""fork() without exec: a batch evidence worker belongs to the process that
started it. In a forked child its thread is not there, so every observe,
submit or flush on the inherited worker raises EvidenceForkedError (naming the
ledger, the AK and both pids) before anything is queued, instead of a flush
answering "all quoted" for ids the parent's thread had taken into its batch;
close() there returns at once; a worker created in the child, on a ledger and
quoter opened there, quotes and verifies; the parent's worker goes on.

Each scenario runs in a child made with ``os.fork()``, under SIGALRM with the
default action (pytest-timeout installs a handler of its own), so a hang kills
the child instead of the suite; the child reports through a pipe as JSON and
leaves with ``os._exit``. A real swtpm, never a mock of the TPM. No timing
assertions: the tests wait for states and check outcomes.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.attest import BatchEvidence, attach, verify_evidence
from capseal.errors import EvidenceForkedError, LedgerForkedError
from capseal.keys import UnsafeEphemeralSigner

from ..forking import attempt, in_child
from .test_attest_support import AttestTPM, producer, spec, tpm_a  # noqa: F401

pytestmark = pytest.mark.swtpm

PLANTED = "ab" * 32  # a capsule id the child tries to queue


def _assert_refused(outcome: Any, ledger_path: Path, ak_uri: str, child_pid: int) -> None:
    assert isinstance(outcome, dict), f"the call {outcome} in the forked child"
    assert outcome["type"] == EvidenceForkedError.__name__ and outcome["forked"] and outcome["evidence_error"]
    message = outcome["message"]
    assert str(ledger_path) in message and ak_uri in message
    assert f"process {os.getpid()}" in message and f"process {child_pid}" in message
    assert "Create a new BatchEvidence (or attach()) in this process" in message


def _wait_until(done: Callable[[], bool], what: str) -> None:
    """Wait (up to 30 s) for a state of the parent's worker; not a timing assertion."""
    gate = threading.Event()
    for _ in range(3000):
        if done():
            return
        gate.wait(0.01)
    pytest.fail(f"the parent's worker never {what}")


def _statuses(ledger: Any, ids: list[str], trust: list[str]) -> dict[str, int]:
    return dict(Counter(verify_evidence(ledger.get(c), trust=trust).status for c in ids))


def test_inherited_worker_refuses_every_call_in_the_child_and_the_parent_quotes_its_batch(
        producer: Producer, tpm_a: AttestTPM) -> None:
    """The reviewed defect: the parent's thread has taken the ids into its batch
    (waiting out max_delay), so the child's copy of the buffer is empty and
    flush() said True, "everything queued was quoted", though nothing was."""
    quoter = tpm_a.quoter()
    worker = attach(producer, quoter, max_records=1000, max_delay=60)
    ids = [producer.seal(spec(i)).capsule_id for i in range(5)]
    boundary = producer.epoch_record.capsule_id
    # the worker's queue itself: empty once its thread took the ids (no public view of the queue)
    _wait_until(lambda: not worker._buf and worker.stats.solo_quoted == 1, "took the ids into its batch")
    record = producer.ledger.get(ids[0])
    ak_uri = quoter.ak.ref.uri()

    def child() -> dict[str, Any]:
        seen: dict[str, Any] = {
            "flush": attempt(worker.flush),
            "flush_timeout": attempt(lambda: worker.flush(0.5)),
            "observe": attempt(lambda: worker.observe(record)),
            "observe_id": attempt(lambda: worker.observe_id(PLANTED, 99, False)),
            "observe_boundary": attempt(lambda: worker.observe_id(boundary, 0, True)),
            "submit": attempt(lambda: worker.submit(PLANTED)),
        }
        seen["close"] = attempt(worker.close)  # a wait for the parent's thread would end in the alarm
        seen["close_no_drain"] = attempt(lambda: worker.close(drain=False, timeout=None))
        seen["flush_after_close"] = attempt(worker.flush)
        seen["observe_after_close"] = attempt(lambda: worker.observe_id(PLANTED, 100, False))
        seen["queued"] = len(worker._buf)  # the inherited copy's own queue: nothing was put there
        seen["pid"] = os.getpid()
        return seen

    seen = in_child(child)
    child_pid = seen.pop("pid")
    assert seen.pop("queued") == 0  # nothing went into the child's copy of the queue
    assert seen.pop("close") == "returned" and seen.pop("close_no_drain") == "returned"
    for call, outcome in seen.items():
        assert isinstance(outcome, dict), f"{call} in the forked child: {outcome}"
        _assert_refused(outcome, producer.ledger.path, ak_uri, child_pid)
    # the parent's worker was left alone: its batch is quoted, whole, and verifies
    assert worker.flush(30)
    worker.close()
    assert worker.stats.records_quoted == 5 and worker.stats.failed_batches == 0
    trust = [quoter.identity.public_pem]
    assert _statuses(producer.ledger, [boundary, *ids], trust) == {"verified-software-tpm": 6}
    assert producer.ledger.get(PLANTED) is None


def test_a_worker_closed_before_the_fork_still_refuses_in_the_child(producer: Producer, tpm_a: AttestTPM) -> None:
    """Whatever state the parent left a worker in, the thread that would settle
    it is the parent's: the child's copy claims nothing."""
    quoter = tpm_a.quoter()
    worker = BatchEvidence(producer.ledger, quoter, max_records=100, max_delay=0.01)
    producer.add_id_observer(worker.observe_id)
    producer.seal(spec(1))
    worker.close()

    def child() -> dict[str, Any]:
        return {"flush": attempt(lambda: worker.flush(0.5)), "submit": attempt(lambda: worker.submit(PLANTED)),
                "close": attempt(worker.close), "queued": len(worker._buf), "pid": os.getpid()}

    seen = in_child(child)
    for call in ("flush", "submit"):
        _assert_refused(seen[call], producer.ledger.path, quoter.ak.ref.uri(), seen["pid"])
    assert seen["close"] == "returned" and seen["queued"] == 0


def test_a_worker_created_in_the_child_quotes_and_the_parents_goes_on(tmp_path: Path, tpm_a: AttestTPM) -> None:
    path, other = tmp_path / "l.db", tmp_path / "child.db"
    quoter = tpm_a.quoter()
    producer = Producer("acme.example", "buyer-agent@1.4", UnsafeEphemeralSigner(), path)
    worker = attach(producer, quoter, max_records=100, max_delay=0.01)
    before = [producer.seal(spec(i)).capsule_id for i in range(3)]
    assert worker.flush(30)

    def child() -> dict[str, Any]:
        refused = attempt(worker.flush)
        worker.close()  # let go of the inherited worker and producer (each returns at once)
        producer.close()
        on_inherited = attempt(lambda: BatchEvidence(producer.ledger, quoter))  # that ledger is the parent's
        outcome: dict[str, Any] = {}
        for target in (path, other):
            mine_quoter = tpm_a.quoter()  # the AK read again over a TPM connection of this process
            with Producer("acme.example", "child-agent@1", UnsafeEphemeralSigner(), target) as mine:
                mine_worker = attach(mine, mine_quoter, max_records=100, max_delay=0.01)
                ids = [mine.seal(spec(100 + i)).capsule_id for i in range(3)]
                flushed = mine_worker.flush(30)
                mine_worker.close()
                trust = [mine_quoter.identity.public_pem]
                outcome[str(target)] = {"flushed": flushed, "quoted": mine_worker.stats.records_quoted,
                                        "statuses": _statuses(mine.ledger, [mine.epoch_record.capsule_id, *ids], trust)}
        return {"refused": refused, "on_inherited": on_inherited, "outcome": outcome, "pid": os.getpid()}

    seen = in_child(child, alarm=30)
    _assert_refused(seen["refused"], path, quoter.ak.ref.uri(), seen["pid"])
    on_inherited = seen["on_inherited"]
    assert isinstance(on_inherited, dict) and on_inherited["type"] == LedgerForkedError.__name__
    assert str(path) in on_inherited["message"] and "BatchEvidence()" in on_inherited["message"]
    for target in (path, other):
        assert seen["outcome"][str(target)] == {"flushed": True, "quoted": 3, "statuses": {"verified-software-tpm": 4}}
    # the parent's worker and TPM connection go on
    after = [producer.seal(spec(200 + i)).capsule_id for i in range(3)]
    assert worker.flush(30)
    worker.close()
    trust = [quoter.identity.public_pem]
    assert _statuses(producer.ledger, [producer.epoch_record.capsule_id, *before, *after], trust) == {
        "verified-software-tpm": 7}
    producer.close()
