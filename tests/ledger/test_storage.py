"""The storage seam: the SQLite engine implements capseal.ledger.storage, and
the Ledger (with everything built on it: the producer, the audit, export and
import) reaches its engine only through those Protocols."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import DuplicateRecordError, LedgerError, MalformedJSONError
from capseal.keys import UnsafeEphemeralSigner

# _ledger and _sqlite, private on purpose: the seam's injection point (open_storage) and the engine behind it
from capseal.ledger import GENESIS, LedgerEntry, _ledger, _sqlite, batch_root, row_hash, storage

SHARED = {"format": "test-quote", "quote": "00"}


def _members(protocol: type) -> set[str]:
    """The names a Protocol declares (methods and attributes), its own only."""
    names = {n for n in vars(protocol) if not n.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


class _Only:
    """The engine seen only through a Protocol: any other member is an
    AttributeError, and every call is counted."""

    def __init__(self, target: Any, allowed: set[str], calls: dict[str, int]) -> None:
        self._target, self._allowed, self._calls = target, allowed, calls

    def __getattr__(self, name: str) -> Any:
        if name not in self._allowed:
            raise AttributeError(f"{name!r} is not part of the storage seam")
        value = getattr(self._target, name)
        if not callable(value) or not hasattr(value, "__self__"):  # an attribute, or a lock
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self._calls[name] = self._calls.get(name, 0) + 1
            result = value(*args, **kwargs)
            return _transaction_only(result, self._calls) if name == "write" else result

        return call


def _transaction_only(context: Any, calls: dict[str, int]) -> Any:
    @contextmanager
    def seen() -> Iterator[Any]:
        with context as tx:
            yield _Only(tx, _members(storage.Transaction), calls)

    return seen()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Every Ledger opened in the test gets its engine through the seam only."""
    seen: dict[str, int] = {}
    real: Callable[..., storage.Storage] = _ledger.open_storage

    def through_the_seam(ledger: Ledger, **options: Any) -> storage.Storage:
        return _Only(real(ledger, **options), _members(storage.Storage), seen)  # type: ignore[return-value]

    monkeypatch.setattr(_ledger, "open_storage", through_the_seam)
    return seen


def test_the_sqlite_engine_implements_the_storage_protocols(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.db") as ledger:
        engine = ledger._storage  # private on purpose: the engine itself is what is checked here
        assert isinstance(engine, _sqlite.SQLiteStorage) and isinstance(engine, storage.Storage)
        assert all(hasattr(engine, name) for name in _members(storage.Storage))
        with engine.write_lock, engine.write("testing") as tx:
            assert all(hasattr(tx, name) for name in _members(storage.Transaction))
            assert tx.records_head() == (0, GENESIS) and tx.evidence_head() == (0, GENESIS)


def test_the_ledger_works_through_the_seam_alone(tmp_path: Path, calls: dict[str, int]) -> None:
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:  # its first seal writes a pair
        records = [p.seal({"action_id": f"a-{i}", "action_type": "fyi"}) for i in range(4)]
        first = p.ledger.entry(records[0].capsule_id)
        assert first is not None
        with pytest.raises(DuplicateRecordError):
            p.ledger.append(LedgerEntry(first.record_id, first.record_type, first.epistemic_type, first.body))
        ids = [r.capsule_id for r in records]
        p.ledger.add_evidence(ids[0], {"format": "test-slot"})
        root, _ = batch_root(ids[1:])
        p.ledger.add_evidence_batch(ids[1:], root, SHARED)
        ledger = p.ledger
        assert ledger.count() == 5 and ledger.has_action_id("a-2") and ledger.has_record(ids[3])
        assert [r.capsule_id for r in ledger.records()][1:] == ids  # after the epoch boundary
        assert ledger.evidence_history(ids[0]) == [None, {"format": "test-slot"}]
        slot = ledger.current_evidence(ids[2])
        assert slot is not None and slot["binding"]["leaf_index"] == 1
        assert ledger.last_tagged("epoch_boundary", "acme\x1fagent@1") is not None
        assert ledger.check_chain() == []
        out = io.BytesIO()
        assert ledger.export_jsonl(out) == 5 + 2
    with Ledger.import_jsonl(io.BytesIO(out.getvalue()), tmp_path / "copy.db") as copy:
        again = io.BytesIO()
        copy.export_jsonl(again)
    assert again.getvalue() == out.getvalue()
    assert capseal.verify_ledger(path).ok  # the audit's reader goes through the seam too
    used = {"open", "write", "snapshot", "count", "record_rows", "record_row", "has_record", "has_action_id",
            "last_tagged", "evidence_rows", "evidence_states", "evidence_index_rows", "integrity_check",
            "recorded_heads", "close", "records_head", "add_records", "record_seqs", "evidence_head",
            "add_evidence"}
    assert used <= set(calls), used - set(calls)


def test_a_batch_root_is_not_hashed_again_for_its_own_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """batch_root() hands its checked ids to add_evidence_batch() in the value
    it returns; the same root for other ids is checked in full."""
    from capseal import merkle

    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as p:
        ids = [p.seal({"action_id": f"a-{i}", "action_type": "fyi"}).capsule_id for i in range(4)]
        root, _ = batch_root(ids)
        hashed: list[int] = []
        real = merkle.root_and_path

        def counted(*args: Any) -> Any:
            hashed.append(1)
            return real(*args)

        monkeypatch.setattr(merkle, "root_and_path", counted)
        p.ledger.add_evidence_batch(ids, root, SHARED)
        assert hashed == []
        with pytest.raises(ValueError, match="do not hash to its merkle_root"):
            p.ledger.add_evidence_batch(ids[::-1], root, SHARED)
        assert hashed == [1]
        p.ledger.add_evidence_batch(ids, bytes(root), SHARED)  # plain bytes: hashed, and right
        assert hashed == [1, 1]
        assert len(list(p.ledger.evidence_entries())) == 2


def test_evidence_for_a_read_only_ledger_is_a_typed_refusal(tmp_path: Path) -> None:
    """It was sqlite3.OperationalError ("attempt to write a readonly database")."""
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        record = p.seal({"action_id": "a", "action_type": "fyi"})
    with Ledger(path, readonly=True) as ledger:
        with pytest.raises(LedgerError, match="read-only"):
            ledger.add_evidence(record.capsule_id, {"format": "test-slot"})
        assert list(ledger.evidence_entries()) == []


def test_an_import_whose_links_are_not_objects_is_refused(tmp_path: Path) -> None:
    """A forged export (row hashes recomputed) whose links are a string was
    imported, leaving a ledger whose check_chain fails."""
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        p.seal({"action_id": "a", "action_type": "fyi"})
        out = io.BytesIO()
        p.ledger.export_jsonl(out)
    lines, prev = [], GENESIS
    for line in out.getvalue().splitlines():
        item = json.loads(line)
        h = item["header"]
        h["links"] = "not links" if h["seq"] == 2 else h["links"]
        header = {k: h[k] for k in ("seq", "record_id", "record_type", "epistemic_type", "links", "nonce")}
        h["prev_hash"] = prev
        h["row_hash"] = prev = row_hash(prev, header, capseal.record.storage_json(item["record"]))
        lines.append(json.dumps(item).encode())
    with pytest.raises(MalformedJSONError, match="line 2: missing or malformed field 'links'"):
        Ledger.import_jsonl(io.BytesIO(b"\n".join(lines) + b"\n"), tmp_path / "copy.db")
    assert not (tmp_path / "copy.db").exists()
