"""Group commit across threads: a leader lets callers under way join its
commit; a lone caller commits at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal._internal.sealing import utc_now
from capseal.errors import InputError
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import _commit


@pytest.fixture
def long_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader waits up to a minute for callers under way: what these tests
    check then depends on who is under way, never on how fast a thread runs."""
    monkeypatch.setattr(_commit, "GATHER_MIN", 60.0)
    monkeypatch.setattr(_commit, "GATHER_MAX", 60.0)


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.001)


def test_a_seal_under_way_joins_the_commit_of_another_thread(tmp_path: Path, long_gather: None) -> None:
    """Thread "slow" is inside seal() (held in its clock) when thread "fast"
    seals: fast leads the commit, waits for slow's record and commits both
    with one fsync."""
    gate, held = threading.Event(), threading.Event()

    def clock() -> str:
        if threading.current_thread().name == "slow" and not gate.is_set():
            held.set()
            gate.wait(30)
        return utc_now()

    with Producer("acme", "group@1", UnsafeEphemeralSigner(), tmp_path / "g.db", clock=clock) as p:
        p.seal({"action_id": "first", "action_type": "decide"})  # the epoch's boundary goes in with it
        stats = p.ledger.stats
        commits, records = stats.commits, stats.records
        results: dict[str, Any] = {}

        def seal(name: str) -> None:
            try:
                results[name] = p.seal({"action_id": name, "action_type": "decide"})
            except BaseException as exc:  # noqa: BLE001 - reported below
                results[name] = exc

        slow = threading.Thread(target=seal, args=("slow",), name="slow")
        fast = threading.Thread(target=seal, args=("fast",), name="fast")
        slow.start()
        assert held.wait(30)
        fast.start()
        _until(lambda: p.ledger._commits._gathering, "fast leads and waits for slow")
        gate.set()
        slow.join(30)
        fast.join(30)
        assert sorted(results) == ["fast", "slow"]
        assert all(r.capsule["action_id"] == name for name, r in results.items()), results
        assert (stats.commits - commits, stats.records - records) == (1, 2)
        assert p.ledger._commits._arriving == 0
        assert {e.record_id for e in p.ledger.entries()} >= {r.capsule_id for r in results.values()}


def test_a_lone_caller_commits_at_once(tmp_path: Path, long_gather: None) -> None:
    """Nobody under way: no waiting, even when a leader would wait a minute
    for a caller under way; a refused seal leaves nobody counted under way."""
    with Producer("acme", "group@1", UnsafeEphemeralSigner(), tmp_path / "g.db") as p:
        with pytest.raises(InputError):
            p.seal({"action_id": "bad", "action_type": "decide", "timestamp": 5})
        start = time.monotonic()
        for i in range(3):
            p.seal({"action_id": f"lone-{i}", "action_type": "decide"})
        assert time.monotonic() - start < 30
        assert p.ledger._commits._arriving == 0
        assert p.ledger.stats.commits == 3  # the boundary went in with the first


def test_a_leader_waits_no_longer_than_the_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller under way that never queues does not hold a commit up past
    the bound: the leader commits what is queued."""
    monkeypatch.setattr(_commit, "GATHER_MIN", 0.05)
    monkeypatch.setattr(_commit, "GATHER_MAX", 0.05)
    with Producer("acme", "group@1", UnsafeEphemeralSigner(), tmp_path / "g.db") as p:
        with p.ledger.arriving():
            record = p.seal({"action_id": "alone", "action_type": "decide"})
            assert p.ledger.entry(record.capsule_id) is not None
        assert p.ledger._commits._arriving == 0
