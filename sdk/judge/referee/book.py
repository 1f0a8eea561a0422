"""The book of pairs (P2–P6): kept in the capseal ledger, once per pair, across restarts.

Every outcome this node reaches for a pair is one signed ledger record of type
``referee:book-row`` (epistemic type ``producer_claim``, no links), appended
and durable before the call returns. Its body (the ledger row's JSON) is::

    {"book_version": "capseal-referee-book/1",
     "pair": {"twin_bracket_id": str | null, "request_digest": hex, "node_ids": [a, b]},  # sorted
     "capsule_ids": [half A, half B],
     "row": {...the row exactly as the rules write it...},
     "called": bool,                  # the pair's one call was made (spent)
     "at": "YYYY-MM-DDTHH:MM:SSZ",    # this node's clock
     "pair_state": "halves_agree" | "halves_disagree",
     "prior": hex | null,             # record id of this pair's previous row in this book
     "in_flight": {"referee": node, "tier": 1 | 2},  # only on the row written before a call
     "ruling_id": hex,                # only when an adjudication/v1 was sealed
     "statement_id": hex,             # only when the referee signed a statement
     "action_id": "referee-call:<pair id>",  # only on the row written before a call
     "envelopes": [...]}              # the book keeper's signature (not part of the record id)

The record id is the JSON digest of that body without ``envelopes``; the
signature (COSE_Sign1, as for judgment records) covers it and the store header.

* P2 — a pair whose call was made returns its stored row with 0 calls; an
  unanswered call is spent, never retried, and no other referee is tried.
* P3 — ``no_eligible_referee`` does not spend the call; nothing retries it on
  its own, only an operator re-ask selects again.
* P6 — the row for a call is written **before** the call (``called: true``,
  ``row: referee_unreachable``, ``in_flight: {referee, tier}``), under the
  ledger's unique action id ``referee-call:<pair id>``: a node that stops
  mid-call has spent it, and two processes cannot both make it. SQLite commits
  a row whole or not at all, so a crash leaves no half-written row.

A half held without its twin (an orphan: one half unavailable, a defined state,
never tampering) is a ``referee:held-half`` record: ``{"book_version",
"half": {twin_bracket_id, request_digest, node_id, capsule_id}, "pair_state":
"one_half_unavailable", "at", "envelopes"}``.

:func:`verify_entry` is the ``capseal.audit`` hook for both record types.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capseal.canonical import MAX_DEPTH, check_json, is_hex64, json_digest
from capseal.errors import DuplicateRecordError, LedgerCorruptError, MalformedJSONError, RefereeInputError
from capseal.findings import Finding
from capseal.judge.envelope import header_commitment, sign_judgment, verify_judgment_envelope
from capseal.ledger import Ledger, LedgerEntry, StoredEntry
from capseal.model import check_timestamp
from capseal.record import RECEIVED_CAPSULE, epistemic_type_for_capsule, storage_json, strict_json

from .halves import Half, check_id
from .pairs import Pair, PairKey, pair_id_of, pair_key_json
from .vocab import BOOK_ROW_TYPE, BOOK_VERSION, HELD_HALF_TYPE, PAIR_STATES, TIERS, row_problem

__all__ = ["Book", "BookRow", "HeldHalf", "CallClaimed", "verify_entry", "keep_record", "EPISTEMIC_TYPE"]

EPISTEMIC_TYPE = "producer_claim"


class CallClaimed(Exception):
    """Another writer made this pair's one call first (its in-flight row is in)."""


@dataclass(frozen=True)
class BookRow:
    """One row of the book as stored."""

    record_id: str
    seq: int
    key: PairKey
    capsule_ids: tuple[str, ...]
    row: dict[str, Any]
    called: bool
    at: str
    pair_state: str
    prior: str | None
    in_flight: dict[str, Any] | None = None
    ruling_id: str | None = None
    statement_id: str | None = None

    @property
    def pair_id(self) -> str:
        """The pair's id (the digest of its key)."""
        return pair_id_of(self.key)

    def to_json(self) -> dict[str, Any]:
        """The row as ``book show --json`` prints it.

        Returns:
            ``{record_id, seq, pair_id, pair, capsule_ids, row, called, at,
            pair_state}``, with ``in_flight``, ``ruling_id`` and ``statement_id``
            when set.
        """
        out: dict[str, Any] = {"record_id": self.record_id, "seq": self.seq, "pair_id": self.pair_id,
                               "pair": pair_key_json(self.key), "capsule_ids": list(self.capsule_ids),
                               "row": dict(self.row), "called": self.called, "at": self.at,
                               "pair_state": self.pair_state}
        for name in ("in_flight", "ruling_id", "statement_id"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


@dataclass(frozen=True)
class HeldHalf:
    """A half held while its twin is unavailable (an orphan)."""

    record_id: str
    seq: int
    twin_bracket_id: str | None
    request_digest: str
    node_id: str
    capsule_id: str
    at: str

    def to_json(self) -> dict[str, Any]:
        """The held half as ``book show --json`` prints it.

        Returns:
            ``{record_id, twin_bracket_id, request_digest, node_id, capsule_id,
            pair_state, at}``.
        """
        return {"record_id": self.record_id, "twin_bracket_id": self.twin_bracket_id,
                "request_digest": self.request_digest, "node_id": self.node_id, "capsule_id": self.capsule_id,
                "pair_state": "one_half_unavailable", "at": self.at}


def keep_record(ledger: Ledger, half: Half) -> None:
    """Keep a half's sealed record in ``ledger`` as received (once, under the
    stream ``received:<node>``), so what cites it resolves there; the record
    is never changed.

    Args:
        ledger: the ledger.
        half: the half whose record is kept.

    Raises:
        capseal.errors.LedgerError: the ledger refused the row.
    """
    if ledger.has_record(half.capsule_id):
        return
    # another producer's capsule: kept as received, outside this ledger's own chains and action ids
    entry = LedgerEntry(record_id=half.capsule_id, record_type=RECEIVED_CAPSULE,
                        epistemic_type=epistemic_type_for_capsule(half.capsule), body=storage_json(half.record_json()))
    try:
        ledger.append(entry)
    except DuplicateRecordError:
        pass  # kept meanwhile by another writer: the same bytes


def _is_time(value: Any) -> bool:
    try:
        check_timestamp(value)
    except (ValueError, TypeError):
        return False
    return isinstance(value, str)


def _body_problem(body: Any) -> str | None:
    """Why a book-row body is not one the book writes; None when it is."""
    if not isinstance(body, Mapping) or body.get("book_version") != BOOK_VERSION:
        return f"a book row is an object with book_version {BOOK_VERSION!r}"
    required = {"book_version", "pair", "capsule_ids", "row", "called", "at", "pair_state", "prior", "envelopes"}
    optional = {"in_flight", "ruling_id", "statement_id", "action_id"}
    keys = set(body)
    if required - keys or keys - required - optional:
        return f"a book row holds {sorted(required)} and optionally {sorted(optional)}"
    pair = body["pair"]
    if not isinstance(pair, Mapping) or set(pair) != {"twin_bracket_id", "request_digest", "node_ids"}:
        return "pair is {twin_bracket_id, request_digest, node_ids}"
    nodes = pair["node_ids"]
    if not (isinstance(nodes, list) and len(nodes) == 2 and all(isinstance(n, str) and n for n in nodes)
            and nodes == sorted(nodes)):
        return "pair.node_ids are the two node ids, sorted"
    if pair["twin_bracket_id"] is not None and not isinstance(pair["twin_bracket_id"], str):
        return "pair.twin_bracket_id is a string or null"
    if not is_hex64(pair["request_digest"]):
        return "pair.request_digest is a 64-hex digest"
    ids = body["capsule_ids"]
    if not (isinstance(ids, list) and len(ids) == 2 and all(is_hex64(i) for i in ids)):
        return "capsule_ids are the two halves' capsule ids"
    problem = row_problem(body["row"])
    if problem is not None:
        return f"row: {problem}"
    if not isinstance(body["called"], bool):
        return "called is true or false"
    if not _is_time(body["at"]):
        return "at is an RFC 3339 UTC timestamp"
    if body["pair_state"] not in PAIR_STATES[:2]:
        return "pair_state is halves_agree or halves_disagree"
    if body["prior"] is not None and not is_hex64(body["prior"]):
        return "prior is a record id or null"
    for name in ("ruling_id", "statement_id"):
        if name in body and not is_hex64(body[name]):
            return f"{name} is a record id"
    if "action_id" in body and not (isinstance(body["action_id"], str) and body["action_id"].startswith(
            "referee-call:") and "in_flight" in body):
        return "action_id is referee-call:<pair id>, on the row written before a call"
    row = body["row"]
    if "in_flight" in body:
        flight = body["in_flight"]
        if not (isinstance(flight, Mapping) and set(flight) == {"referee", "tier"} and isinstance(flight["referee"], str)
                and type(flight["tier"]) is int and flight["tier"] in TIERS):
            return "in_flight is {referee, tier}"
        if not body["called"] or row.get("reason") != "referee_unreachable":
            return "an in-flight row is called, with reason referee_unreachable until the call returns"
    if row.get("state") == "adjudicated" and ("ruling_id" not in body or not body["called"]):
        return "an adjudicated row is a called one and names its ruling"
    if row.get("reason") in ("referee_unreachable", "referee_cannot_sign") and not body["called"]:
        return f"{row.get('reason')} is the row of a call that was made"
    return None


def _held_problem(body: Any) -> str | None:
    if not isinstance(body, Mapping) or body.get("book_version") != BOOK_VERSION:
        return f"a held half is an object with book_version {BOOK_VERSION!r}"
    if set(body) != {"book_version", "half", "pair_state", "at", "envelopes"}:
        return "a held half holds book_version, half, pair_state, at and envelopes"
    half = body["half"]
    if not (isinstance(half, Mapping) and set(half) == {"twin_bracket_id", "request_digest", "node_id", "capsule_id"}
            and (half["twin_bracket_id"] is None or isinstance(half["twin_bracket_id"], str))
            and is_hex64(half["request_digest"]) and isinstance(half["node_id"], str) and half["node_id"]
            and is_hex64(half["capsule_id"])):
        return "half is {twin_bracket_id, request_digest, node_id, capsule_id}"
    if body["pair_state"] != "one_half_unavailable":
        return "a held half's pair_state is one_half_unavailable"
    if not _is_time(body["at"]):
        return "at is an RFC 3339 UTC timestamp"
    return None


def _row_of(entry: StoredEntry, body: Mapping[str, Any]) -> BookRow:
    pair = body["pair"]
    return BookRow(
        record_id=entry.record_id, seq=entry.seq,
        key=(pair["twin_bracket_id"], pair["request_digest"], (pair["node_ids"][0], pair["node_ids"][1])),
        capsule_ids=tuple(body["capsule_ids"]), row=dict(body["row"]), called=body["called"], at=body["at"],
        pair_state=body["pair_state"], prior=body["prior"], in_flight=body.get("in_flight"),
        ruling_id=body.get("ruling_id"), statement_id=body.get("statement_id"))


def _unsigned(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "envelopes"}


class Book:
    """The comparing node's book of pairs, in its capseal ledger.

    ``ledger`` is a :class:`~capseal.ledger.Ledger` or a path (opened, and
    closed by :meth:`close`); ``signer`` is the book keeper's key (any
    ``capseal.keys.Signer``). A book opened without a signer reads only.

    Args:
        ledger: a Ledger, or the path of one to open.
        signer: the book keeper's key (None: read only).

    Raises:
        RefereeInputError: ``ledger`` is neither a Ledger nor a path.
        LedgerError: no ledger can be opened at the path.
    """

    def __init__(self, ledger: Ledger | str | os.PathLike[str], signer: Any = None) -> None:
        if not isinstance(ledger, (Ledger, str, os.PathLike)):
            raise RefereeInputError(f"a book is kept in a Ledger or a ledger path, not {type(ledger).__name__}",
                                    path="$.book")
        self._owns = not isinstance(ledger, Ledger)
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(Path(ledger))
        self.signer = signer

    def close(self) -> None:
        """Close the ledger, when the book opened it."""
        if self._owns:
            self.ledger.close()

    def __enter__(self) -> Book:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading

    def _bodies(self, record_type: str) -> Iterator[tuple[StoredEntry, dict[str, Any]]]:
        for entry in self.ledger.entries():
            if entry.record_type != record_type:
                continue
            try:
                body = strict_json(entry.body, f"book record {entry.seq}")
            except MalformedJSONError as exc:
                raise LedgerCorruptError(f"{self.ledger.path}: {exc}") from None
            problem = _body_problem(body) if record_type == BOOK_ROW_TYPE else _held_problem(body)
            if problem is not None:
                raise LedgerCorruptError(f"{self.ledger.path}: book record {entry.seq} is malformed: {problem}")
            yield entry, body

    def rows(self) -> list[BookRow]:
        """Every book row, oldest first.

        Returns:
            The :class:`BookRow` list.

        Raises:
            LedgerCorruptError: a book row the book does not write.
        """
        return [_row_of(entry, body) for entry, body in self._bodies(BOOK_ROW_TYPE)]

    def history(self, key: PairKey) -> list[BookRow]:
        """The rows of one pair, oldest first.

        Args:
            key: the pair's key.

        Returns:
            Its rows (empty for a pair the book never saw).

        Raises:
            LedgerCorruptError: a book row the book does not write.
        """
        return [r for r in self.rows() if r.key == key]

    def latest(self, key: PairKey) -> BookRow | None:
        """The pair's latest row.

        Args:
            key: the pair's key.

        Returns:
            That row, or None for a pair the book never saw.

        Raises:
            LedgerCorruptError: a book row the book does not write.
        """
        rows = self.history(key)
        return rows[-1] if rows else None

    def spent(self, key: PairKey) -> BookRow | None:
        """P2: the latest row of a pair whose one call was made.

        Args:
            key: the pair's key.

        Returns:
            That row, or None when the call was not made.

        Raises:
            LedgerCorruptError: a book row the book does not write.
        """
        called = [r for r in self.history(key) if r.called]
        return called[-1] if called else None

    def held(self) -> list[HeldHalf]:
        """Halves held without their twin (orphans and those since paired), oldest first.

        Returns:
            The :class:`HeldHalf` list.

        Raises:
            LedgerCorruptError: a held-half record the book does not write.
        """
        out = []
        for entry, body in self._bodies(HELD_HALF_TYPE):
            h = body["half"]
            out.append(HeldHalf(entry.record_id, entry.seq, h["twin_bracket_id"], h["request_digest"], h["node_id"],
                                h["capsule_id"], body["at"]))
        return out

    def orphans(self) -> list[HeldHalf]:
        """Held halves whose twin has not come: no book row of their bracket and
        request names their node.

        Returns:
            The :class:`HeldHalf` list.

        Raises:
            LedgerCorruptError: a record the book does not write.
        """
        rows = self.rows()
        return [h for h in self.held()
                if not any(r.key[0] == h.twin_bracket_id and r.key[1] == h.request_digest and h.node_id in r.key[2]
                           for r in rows)]

    # ------------------------------------------------------------------ writing

    def _append(self, body: dict[str, Any], record_type: str, action_id: str | None = None) -> StoredEntry:
        if self.signer is None:
            raise RefereeInputError("this book was opened without a signer; it can be read only", path="$.book")
        if action_id is not None:  # in the hashed body: the ledger's action_id column must be what the body says
            body = {**body, "action_id": action_id}
        check_json(body, max_depth=MAX_DEPTH)
        record_id = json_digest(body)
        envelope = sign_judgment(self.signer, bytes.fromhex(record_id), header_commitment(record_type, EPISTEMIC_TYPE, ()))
        stored = {**body, "envelopes": [envelope.to_json()]}
        entry = LedgerEntry(record_id=record_id, record_type=record_type, epistemic_type=EPISTEMIC_TYPE,
                            body=storage_json(stored), action_id=action_id)
        return self.ledger.append(entry)

    def keep_record(self, half: Half) -> None:
        """Keep a half's sealed record in the ledger as received (see :func:`keep_record`).

        Args:
            half: the half.
        """
        keep_record(self.ledger, half)

    def write(self, pair: Pair, row: Mapping[str, Any], *, called: bool, at: str, in_flight: Mapping[str, Any] | None = None,
              ruling_id: str | None = None, statement_id: str | None = None, claim: bool = False) -> BookRow:
        """Append one row for ``pair``; durable on return.

        Args:
            pair: the pair.
            row: the row as the rules write it.
            called: the pair's one call was made.
            at: this node's clock (RFC 3339 UTC).
            in_flight: ``{referee, tier}`` on the row written before a call.
            ruling_id: the adjudication/v1 record id, when one was sealed.
            statement_id: the referee's signed statement, when it made one.
            claim: this is the row written before the call: the ledger's
                unique action id makes it the pair's only one.

        Returns:
            The stored :class:`BookRow`.

        Raises:
            CallClaimed: ``claim`` and the pair's call was already made.
            RefereeInputError: no signer, or a row the rules do not write.
        """
        latest = self.latest(pair.key)
        body: dict[str, Any] = {
            "book_version": BOOK_VERSION, "pair": pair_key_json(pair.key), "capsule_ids": pair.capsule_ids,
            "row": dict(row), "called": called, "at": at, "pair_state": pair.state,
            "prior": latest.record_id if latest is not None else None,
        }
        for name, value in (("in_flight", in_flight), ("ruling_id", ruling_id), ("statement_id", statement_id)):
            if value is not None:
                body[name] = dict(value) if isinstance(value, Mapping) else value
        problem = _body_problem({**body, "envelopes": []})
        if problem is not None:
            raise RefereeInputError(f"not a book row: {problem}", path="$.row")
        json_digest(body)  # a row that cannot be digested is refused before anything is kept
        for half in pair.halves:
            self.keep_record(half)
        try:
            stored = self._append(body, BOOK_ROW_TYPE, f"referee-call:{pair.pair_id}" if claim else None)
        except DuplicateRecordError:
            if claim:
                raise CallClaimed(pair.pair_id) from None
            raise
        return _row_of(stored, {**body, "envelopes": []})

    def hold(self, half: Half, *, twin_bracket_id: str | None, at: str) -> HeldHalf:
        """Keep a half whose twin has not come (an orphan), and its record.

        Args:
            half: the half.
            twin_bracket_id: the host's bracket id, or None.
            at: this node's clock.

        Returns:
            The stored :class:`HeldHalf` (the one already held, when it was).

        Raises:
            RefereeInputError: no signer, or a bracket id the rules cannot key by.
        """
        for held in self.held():
            if held.capsule_id == half.capsule_id:
                return held
        if twin_bracket_id is not None:
            check_id(twin_bracket_id, "twin_bracket_id", "$.twin_bracket_id", empty=True)
        body = {"book_version": BOOK_VERSION, "pair_state": "one_half_unavailable", "at": at,
                "half": {"twin_bracket_id": twin_bracket_id, "request_digest": half.request_digest or "",
                         "node_id": half.node_id, "capsule_id": half.capsule_id}}
        problem = _held_problem({**body, "envelopes": []})
        if problem is not None:
            raise RefereeInputError(f"not a held half: {problem}", path="$.half")
        json_digest(body)
        self.keep_record(half)
        stored = self._append(body, HELD_HALF_TYPE)
        return next(h for h in self.held() if h.record_id == stored.record_id)


def verify_entry(entry: StoredEntry, *, ledger: Ledger, keys: Any) -> Any:
    """``capseal.audit`` hook: a ``RecordReport`` for one ``referee:`` ledger row.
    Checks the body's shape, that the record id is its digest, the type, that
    what it names resolves (the halves, the ruling, the prior row), and the
    book keeper's signature. Never raises.

    Args:
        entry: the stored row.
        ledger: the ledger it is in.
        keys: the verifier's key directory (``trusted`` turns an unknown signer into an error).

    Returns:
        A ``capseal.audit.RecordReport``.
    """
    from capseal.audit import RecordReport

    report = RecordReport(entry.seq, entry.record_id, entry.record_type, False)
    try:
        _verify(entry, ledger, keys, report)
    except Exception as exc:  # never raise
        report.findings.append(Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}"))
    report.ok = report.signature == "authored" and not any(f.severity == "error" for f in report.findings)
    return report


def _verify(entry: StoredEntry, ledger: Ledger, keys: Any, report: Any) -> None:
    add = report.findings.append
    if entry.record_type not in (BOOK_ROW_TYPE, HELD_HALF_TYPE):
        add(Finding("record_type_unknown", f"{entry.record_type!r} is not a referee record type"))
        return
    try:
        body = strict_json(entry.body, "the book record")
    except MalformedJSONError as exc:
        add(Finding("record_malformed", str(exc)))
        return
    problem = _body_problem(body) if entry.record_type == BOOK_ROW_TYPE else _held_problem(body)
    if problem is not None:
        add(Finding("book_row_malformed", problem))
        return
    digest = json_digest(_unsigned(body))
    if digest != entry.record_id:
        add(Finding("record_digest_mismatch", "the stored book record does not hash to its record id (it changed after it was written)"))
    if entry.epistemic_type != EPISTEMIC_TYPE:
        add(Finding("epistemic_type_mismatch", f"a book record is a producer_claim, the header says {entry.epistemic_type!r}"))
    if entry.links:
        add(Finding("link_malformed", "a book record carries no links"))
    named = list(body["capsule_ids"]) if entry.record_type == BOOK_ROW_TYPE else [body["half"]["capsule_id"]]
    for name in ("ruling_id", "statement_id", "prior"):
        if isinstance(body.get(name), str):
            named.append(body[name])
    for target in named:
        if ledger.entry(target) is None:
            add(Finding("book_reference_unresolved", f"{target[:16]}… named by the book record is not in this ledger"))
    envelopes = body["envelopes"]
    if not isinstance(envelopes, list) or not envelopes:
        add(Finding("record_unsigned", "every book record is signed; this one is not"))
        return
    commitment = header_commitment(entry.record_type, entry.epistemic_type, [dict(x) for x in entry.links])
    verdict, kid = "unclaimed", None
    for env in envelopes:
        authored, env_kid, findings = verify_judgment_envelope(env, bytes.fromhex(digest), commitment)
        report.findings.extend(findings)
        if not authored:
            verdict = "invalid"
        elif verdict == "unclaimed":
            verdict, kid = "authored", env_kid
    trusted = getattr(keys, "trusted", None)
    if verdict == "authored" and trusted is not None and kid not in trusted:
        add(Finding("signer_not_trusted", f"signed by {kid}, which is not among the trusted keys"))
    report.signature, report.signer_kid = verdict, kid
