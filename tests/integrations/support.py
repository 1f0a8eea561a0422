"""What every adapter's tests check in a ledger: each tool call's planned and
outcome capsules, paired and chained; the reference verifier's verdict; no
raw tool input or output in the file's bytes; and the faults they inject."""

from __future__ import annotations

import ctypes
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
from agent_action_capsule.producer_envelope import verify_record_signature

from capseal import verify_ledger
from capseal.audit import OPEN_EFFECT
from capseal.canonical import json_digest
from capseal.errors import LedgerBusyError, SignerError
from capseal.integrations import EFFECT_TYPE, EXTENSION, exact_json
from capseal.ledger import Ledger

CLI = str(Path(sys.executable).parent / "capseal")


def digest(value: Any) -> str:
    """The digest an adapter writes for ``value`` (exact JSON: floats as repr strings)."""
    return json_digest(exact_json(value))


@dataclass
class Call:
    """One tool call as the ledger holds it."""

    tool: str
    ids: dict[str, Any]
    planned: dict[str, Any]
    outcome: dict[str, Any] | None

    @property
    def status(self) -> str | None:
        return None if self.outcome is None else self.outcome["effect"]["status"]

    @property
    def effect(self) -> dict[str, Any]:
        assert self.outcome is not None
        return dict(self.outcome["effect"])

    @property
    def kind(self) -> str | None:
        return None if self.outcome is None else self.outcome[EXTENSION].get("outcome")


def capsules(path: Path) -> list[dict[str, Any]]:
    with Ledger(path, readonly=True) as ledger:
        return [r.capsule for r in ledger.records()]


def tool_calls(path: Path) -> list[Call]:
    """Every tool call of the ledger, with its outcome, after checking that each
    outcome is chained to its own planned capsule (named after it, the same
    call described, ``confirms`` for a confirmed one, ``follows`` otherwise)
    and that no planned capsule has two outcomes."""
    found = [c for c in capsules(path) if c.get("effect", {}).get("type") == EFFECT_TYPE]
    planned = {c["capsule_id"]: c for c in found if c["effect"]["status"] == "planned"}
    outcomes: dict[str, dict[str, Any]] = {}
    for c in found:
        if c["effect"]["status"] == "planned":
            assert "chain" not in c and "request_digest" not in c["effect"] and "effect_attestation" not in c["effect"]
            continue
        parent = c["chain"]["parent_capsule_id"]
        assert parent in planned, f"{c['action_id']}: an outcome without its planned capsule"
        assert parent not in outcomes, f"{c['action_id']}: a second outcome for one call"
        outcomes[parent] = c
        first = planned[parent]
        status = c["effect"]["status"]
        assert c["action_id"] == f"{first['action_id']}/{status}"
        assert c["chain"]["relation"] == ("confirms" if status == "confirmed" else "follows")
        described = {k: v for k, v in c[EXTENSION].items() if k not in ("outcome", "absent")}
        assert described == {k: v for k, v in first[EXTENSION].items() if k != "absent"}
        if status == "confirmed":
            assert "response_digest" in c["effect"]
    return [Call(p[EXTENSION]["tool"], p[EXTENSION].get("ids", {}), p, outcomes.get(cid)) for cid, p in planned.items()]


def by_call_id(calls: list[Call], name: str = "tool_call_id") -> dict[Any, Call]:
    out = {c.ids[name]: c for c in calls}
    assert len(out) == len(calls), "two calls with one id"
    return out


def assert_reference_accepts(path: Path) -> int:
    """The reference verifier (0.12.0) accepts every capsule and signature, and
    capseal's own ledger verifier says the ledger is ok; returns the count."""
    every = capsules(path)
    for capsule in every:
        result = ref.verify(capsule)
        assert result.ok and not [f for f in result.findings if f.severity == "error"], (capsule["action_id"],
                                                                                           result.findings)
        assert ref.compute_capsule_id(dict(capsule)) == capsule["capsule_id"]
        assert verify_record_signature(capsule) == ("authored", []), capsule["action_id"]
    theirs = ref.verify_store(every)
    assert all(r.ok for r in theirs)
    report = verify_ledger(path)
    assert report.ok, [(r.seq, [f.code for f in r.findings]) for r in report.records if not r.ok]
    return len(every)


def open_items(path: Path) -> list[str]:
    """The action ids ``verify_ledger`` reports as open items."""
    report = verify_ledger(path)
    ids = {r.record_id: r for r in report.records}
    out = []
    for capsule in capsules(path):
        record = ids[capsule["capsule_id"]]
        if any(f.code == OPEN_EFFECT and f.severity == "info" for f in record.findings):
            out.append(capsule["action_id"])
    return out


def cli_verify(path: Path) -> str:
    proc = subprocess.run([CLI, "verify", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def ledger_bytes(path: Path) -> bytes:
    """The ledger file's bytes, with its WAL's (what a reader of the disk sees)."""
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def assert_nothing_raw(path: Path, *raw: str) -> None:
    """None of ``raw`` (tool inputs and outputs) is anywhere in the ledger's bytes."""
    data = ledger_bytes(path)
    for text in raw:
        assert text.encode() not in data, f"{text!r} is in the ledger"


def secret(label: str) -> str:
    """A distinctive value for a tool's input or output, never produced by chance."""
    return f"{label}-{os.urandom(6).hex()}-raw"


# ---------------------------------------------------------------------------- faults


@contextmanager
def ledger_locked(path: Path) -> Iterator[None]:
    """Another connection holds the ledger's write lock: every commit waits its
    lock timeout, then fails with LedgerBusyError (nothing written)."""
    con = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        con.execute("BEGIN IMMEDIATE")
        yield
    finally:
        con.execute("ROLLBACK")
        con.close()


def close_all_sessions(module: str, label: str) -> None:
    """C_CloseAllSessions on the token's slot, through a second handle on the
    module: every session of the slot dies, as when another part of the
    process resets it."""
    import pkcs11

    slot_id = pkcs11.lib(module).get_token(token_label=label).slot.slot_id
    dll = ctypes.CDLL(module)
    dll.C_CloseAllSessions.argtypes = [ctypes.c_ulong]
    dll.C_CloseAllSessions.restype = ctypes.c_ulong
    assert dll.C_CloseAllSessions(slot_id) == 0


@dataclass
class Token:
    """A SoftHSM2 token of the integration tests' own, with an Ed25519 key."""

    uri: str
    pin: str
    dir: Path
    module: str
    label: str

    @contextmanager
    def gone(self, aside: Path) -> Iterator[None]:
        """The token's sessions closed underneath the signer and its storage
        gone, so reconnecting fails too: every signature fails (SignerError)."""
        close_all_sessions(self.module, self.label)
        shutil.move(self.dir, aside)
        try:
            yield
        finally:
            shutil.move(aside, self.dir)


def caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``error`` is, or was raised from, a ``kind`` (a framework may wrap it)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def failures_of(seen: list[Any], stage: str) -> list[Any]:
    return [f for f in seen if f.stage == stage]


def only_keys(mapping: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: mapping[k] for k in keys if k in mapping}


def fault(kind: str, producer: Any, token: Token, tmp_path: Path) -> Any:
    """The fault each adapter's failure tests inject: the ledger locked by
    another connection, or the token's files moved away."""
    return ledger_locked(producer.ledger.path) if kind == "ledger" else token.gone(tmp_path / "token-away")


def assert_planned_failures_did_not_block(seen: list[Any], kind: str, producer: Any, before: int) -> None:
    """Both calls' planned capsules failed with the fault's error, neither call
    was blocked, and nothing was recorded."""
    failures = failures_of(seen, "planned")
    assert len(failures) == 2 and not any(f.blocked for f in failures)
    assert all(isinstance(f.error, LedgerBusyError if kind == "ledger" else SignerError) for f in failures)
    assert producer.ledger.count() == before  # nothing recorded of calls whose planned capsule failed


def assert_blocked_before_running(ran: list[str], seen: list[Any], producer: Any, before: int) -> None:
    """Fail-closed: no tool ran, every failure reported says it blocked, and
    nothing was recorded."""
    assert ran == [] and seen and all(f.blocked for f in seen)
    assert producer.ledger.count() == before


def assert_outcome_lost(path: Path, ran: list[str], seen: list[Any], recorder: Any) -> None:
    """The ledger was locked while lookup_order ran: its outcome and
    cancel_order's planned capsule failed; the ledger holds lookup_order's
    planned capsule alone, an open item for the recorder and ``capseal verify``."""
    assert ran == ["lookup_order", "cancel_order"]
    assert [f.stage for f in seen] == ["outcome", "planned"]
    (lookup,) = tool_calls(path)
    assert lookup.tool == "lookup_order" and lookup.outcome is None
    assert [c.reason for c in recorder.open_calls()] == ["outcome_not_sealed"]
    assert open_items(path) == [lookup.planned["action_id"]]
    assert "open items: 1 planned or dispatched effect(s) with no outcome" in cli_verify(path)
