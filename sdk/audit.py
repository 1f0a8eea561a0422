"""Ledger verification: every record, every signature, the hash chains. Never raises.

``verify_ledger(path)`` runs, for a capseal ledger:
  * the ledger's own integrity: both hash chains (records and evidence), seq
    continuity, header/body agreement (record id = capsule id, epistemic type);
  * the file's (:func:`capseal.ledger.file_findings`): SQLite's integrity check, each chain
    against the head the ledger recorded (rows lost from its end), the lookup
    columns against the bodies; a damaged file is reported as such, with every
    record that can still be read;
  * Class-1 verification of each capsule with the store-level checks (parent
    existence, concurrent supersedes, duplicates) — see ``verify.py``;
  * each signature: the inline AAC profile envelope (``signature``/``key_id``)
    and every envelope in ``envelopes[]``; a plain COSE_Sign1 is verified under
    the key its kid names, looked up in the custody statements the ledger's own
    epoch-boundary capsules carry, or in ``trusted_keys``;
  * optionally (``evidence=True``) the hardware-evidence slot of each record.

Authorization is policy (-05 §3.2): the report names the key that signed each
record (``signers``, with what each key's own custody statement says). With no
``trusted_keys`` every signed record carries a ``signer_not_pinned`` warning and
the report is not ``pinned``: ``ok`` then says the records are intact under the
keys named, not whose keys those are. Pass ``trusted_keys`` (public keys, PEMs,
kids, or ``capseal.trust.read_trust_file``'s result) to make a record that no
pinned key signed an error (``signer_not_trusted``).
"""

from __future__ import annotations

import importlib
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._signatures import KeyDirectory, check_signatures, custody_findings, custody_of, not_pinned
from ._verify_walk import StoreFacts, Walk, capsule_facts, is_open, store_findings
from .canonical import is_hex64
from .errors import InputError, LedgerCorruptError, MalformedJSONError
from .findings import Finding
from .ledger import (
    AuditLedger,
    ChainTail,
    Ledger,
    StoredEntry,
    as_url,
    column_findings,
    empty_finding,
    failure_finding,
    file_findings,
    is_database_url,
)
from .record import epistemic_type_for_capsule, storage_json, strict_json
from .verify import verify

__all__ = ["RecordReport", "LedgerReport", "verify_ledger", "KeyDirectory", "RECORD_VERIFIERS", "open_effects",
           "OPEN_EFFECT", "check_signatures", "not_pinned"]

#: record_type prefix -> "module:function(entry, context) -> RecordReport" for non-capsule records.
RECORD_VERIFIERS: dict[str, str] = {"judge:": "capseal.judge.verify:verify_entry",
                                    "referee:": "capseal.judge.referee.book:verify_entry"}


@dataclass
class RecordReport:
    """What the verifier concluded about one stored record."""

    seq: int
    record_id: str
    record_type: str
    ok: bool
    findings: list[Finding] = field(default_factory=list)
    signature: str = "unclaimed"  # authored | invalid | unclaimed | unverifiable
    signer_kid: str | None = None
    evidence: str | None = None  # set when evidence was checked (capseal.attest)
    pinned: bool = False  # signed by a key the caller trusts (never without trusted keys)

    def to_dict(self) -> dict[str, Any]:
        """This record's report as JSON.

        Returns:
            A JSON object; ``evidence`` only when the evidence was checked.
        """
        out = {
            "seq": self.seq, "record_id": self.record_id, "record_type": self.record_type, "ok": self.ok,
            "signature": self.signature, "signer_kid": self.signer_kid, "signer_pinned": self.pinned,
            "findings": [f.to_dict() for f in self.findings],
        }
        if self.evidence is not None:
            out["evidence"] = self.evidence
        return out


@dataclass
class SignerSummary:
    """One key that signed records of a ledger: how many, whether it is pinned,
    and what its (signed) custody statement says, when the ledger holds one."""

    kid: str
    records: int = 0
    pinned: bool = False
    label: str = ""
    custody: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """This signer as JSON.

        Returns:
            A JSON object; ``label`` and ``custody`` only when known.
        """
        out: dict[str, Any] = {"kid": self.kid, "records": self.records, "pinned": self.pinned}
        if self.label:
            out["label"] = self.label
        if self.custody:
            out["custody"] = self.custody
        return out


@dataclass
class LedgerReport:
    """What ``verify_ledger`` concluded. ``ok``: every record intact and signed
    and no error; ``pinned``: trusted keys were given (``anchors`` of them),
    so every record that is ok was signed by one of them. An ok report that
    is not pinned says only that each record is intact under the key named
    in ``signers``."""

    path: str
    ok: bool
    records: list[RecordReport] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    signers: list[SignerSummary] = field(default_factory=list)
    anchors: int = 0
    #: finding code -> how many records carry it
    finding_counts: dict[str, int] = field(default_factory=dict)
    _tally: dict[str, int] | None = field(default=None, repr=False, compare=False)

    def start_tally(self) -> dict[str, int]:
        """The counts a verifier fills as it goes (then :meth:`counts` gives
        them, whether or not ``records`` holds every record)."""
        self._tally = {"records": 0, "ok": 0, "not_ok": 0}
        return self._tally

    @property
    def pinned(self) -> bool:
        return self.anchors > 0

    def trust(self) -> dict[str, Any]:
        """The signers and whether a trust anchor pinned them (for reports).

        Returns:
            ``{"anchors", "pinned", "signers"}`` as JSON.
        """
        return {"anchors": self.anchors, "pinned": self.pinned, "signers": [s.to_dict() for s in self.signers]}

    def counts(self) -> dict[str, int]:
        """How many records there are, by outcome.

        Returns:
            ``records``, ``ok``, ``not_ok``, and one ``signature:<verdict>``
            (and ``evidence:<status>``) count per verdict seen.
        """
        if self._tally is not None:
            return dict(self._tally)
        out = {"records": len(self.records), "ok": sum(r.ok for r in self.records)}
        out["not_ok"] = out["records"] - out["ok"]
        for r in self.records:
            out[f"signature:{r.signature}"] = out.get(f"signature:{r.signature}", 0) + 1
            if r.evidence is not None:
                out[f"evidence:{r.evidence}"] = out.get(f"evidence:{r.evidence}", 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """The whole report as JSON (what ``capseal verify --json`` prints).

        Returns:
            A JSON object: path, ok, counts, trust, findings and records.
        """
        return {
            "path": self.path, "ok": self.ok, "counts": self.counts(), "trust": self.trust(),
            "findings": [f.to_dict() for f in self.findings],
            "finding_counts": dict(sorted(self.finding_counts.items())),
            "records": [r.to_dict() for r in self.records],
        }


#: the code of the info finding on a planned or dispatched effect whose outcome is not in the ledger
OPEN_EFFECT = "effect_outcome_missing"


def open_effects(capsules: list[dict[str, Any]]) -> dict[int, Finding]:
    """The open items of a ledger's capsules: each effect still ``planned``
    or ``dispatched`` that no capsule chains to, so no outcome (confirmed,
    failed, a refusal, a resolution) was recorded for it. Never raises.

    Args:
        capsules: the ledger's capsules, in ledger order.

    Returns:
        Index in ``capsules`` -> an info finding saying so.
    """
    children: set[str] = set()
    for capsule in capsules:
        chain = capsule.get("chain")
        parent = chain.get("parent_capsule_id") if isinstance(chain, Mapping) else None
        if isinstance(parent, str):
            children.add(parent)
    out: dict[int, Finding] = {}
    for i, capsule in enumerate(capsules):
        effect = capsule.get("effect")
        status = effect.get("status") if isinstance(effect, Mapping) else None
        if status in ("planned", "dispatched") and capsule.get("capsule_id") not in children:
            out[i] = Finding(OPEN_EFFECT, f"an open item: this {status} effect has no outcome in the ledger (no "
                             "capsule chains to it)", severity="info")
    return out


def verify_ledger(
    path: str | Path,
    *,
    trusted_keys: Iterable[Any] = (),
    evidence: bool = False,
    evidence_trust: Any = None,
    on_record: Callable[[RecordReport], object] | None = None,
    keep_records: bool = True,
    jobs: int | None = None,
    progress: Callable[[str, int, int], object] | None = None,
) -> LedgerReport:
    """Verify a whole ledger file. Never raises; ``ok`` gates everything.

    The records are read as a stream in two passes inside one snapshot,
    keeping of each record only its id, in 16 bytes (in a temporary file
    past a quarter of a million ids, so memory does not grow with the
    ledger, unless ``keep_records``, the default, keeps every record's
    report), the
    signature checks shared among worker processes on a large ledger.

    A file that is damaged, empty or not a capseal ledger is reported as such
    (``ledger_corrupt``, ``ledger_empty``, ``ledger_not_capseal``), and every
    record that can still be read is verified; ``ledger_unreadable`` says
    only that it could not be read here (missing, locked, no permission, a
    format this capseal does not read).

    Args:
        path: the ledger file.
        trusted_keys: the signing keys the caller pins (public keys, PEMs,
            kids, :class:`capseal.trust.TrustedKey`); none given, every
            signature is reported as not pinned.
        evidence: also verify each record's hardware-evidence slot.
        evidence_trust: the AK trust policy for the slots (see
            ``capseal.attest.TrustPolicy.coerce``).
        on_record: called with each record's report, in seq order, as it is done.
        keep_records: keep every record's report in ``records`` (False: only
            the counts, ``finding_counts`` and ``signers`` are kept).
        jobs: worker processes for the record checks (None: one per CPU on a
            ledger of a few thousand records or more; 1: none).
        progress: called now and then with (pass, rows done, rows in all);
            the passes are ``"chains"`` and ``"records"``.

    Returns:
        A :class:`LedgerReport`; unusable trusted keys are its
        ``trusted_keys_unusable`` finding.
    """
    report = LedgerReport(path=str(as_url(path)) if is_database_url(path) else str(path), ok=False)
    empty = empty_finding(path)
    if empty is not None:
        report.findings.append(empty)
        return report
    try:
        keys = KeyDirectory(trusted_keys)
    except InputError as exc:  # the caller's anchors, never blamed on the ledger
        report.findings.append(Finding("trusted_keys_unusable", str(exc)))
        return report
    report.anchors = len(keys.trusted or ())
    try:
        with AuditLedger(path) as ledger:
            with ledger.snapshot():
                walk = Walk(ledger, facts_of=_facts_of, check=lambda e: check(e), jobs=jobs, progress=progress)
                check = _checker(keys, walk.facts)
                try:
                    _verify_open_ledger(ledger, report, keys, evidence, evidence_trust, walk, keep_records, on_record)
                finally:  # the id tables' files now, not when the collector gets to them
                    walk.facts.close()
    except Exception as exc:  # never raise: report why it could not run
        report.findings.append(failure_finding(exc))
        report.ok = False
        return report
    report.ok = not any(f.severity == "error" for f in report.findings) and report.counts()["not_ok"] == 0
    return report


def _verify_open_ledger(ledger: Ledger, report: LedgerReport, keys: KeyDirectory, evidence: bool, evidence_trust: Any,
                        walk: Walk, keep: bool, on_record: Callable[[RecordReport], object] | None) -> None:
    """Both passes of ``walk`` over ``ledger`` (inside its snapshot), into ``report``."""
    tail = ChainTail(ledger)
    for problem in walk.chains(tail.add):  # rows SQLite cannot read are among these
        report.findings.append(Finding("ledger_chain_broken", problem))
    report.findings.extend(file_findings(ledger, tail))
    for custody in walk.facts.custody:
        keys.learn_from_custody(custody)
    signed_custody: dict[str, Mapping[str, Any]] = {}
    signers: dict[str, SignerSummary] = {}
    tally = report.start_tally()
    for e, checked in walk.records():
        if e.damage is not None:
            rr = RecordReport(e.seq, e.record_id, e.record_type, False,
                              [Finding("record_unreadable", f"the row is damaged ({e.damage})")])
        elif checked is not None:
            found, signature, kid, custody, body_problem = checked
            rr = RecordReport(e.seq, e.record_id, e.record_type, False, found, signature, kid)
            if custody is not None and kid is not None:  # a custody statement comes with the kid that signed it
                signed_custody.setdefault(kid, custody)
            if evidence and e.record_type == "capsule":
                _check_evidence(ledger, e, rr, evidence_trust)
            _finish(rr, body_problem, keys)
        else:
            rr = _verify_other(e, ledger, keys)
            if any(e.record_type.startswith(prefix) for prefix in RECORD_VERIFIERS):  # records capseal writes
                rr.findings.extend(column_findings(e, _parsed(e.body)))
            _finish(rr, _ambiguous_body(e.body), keys)
        _tally(tally, report.finding_counts, rr)
        if rr.signature == "authored" and rr.signer_kid is not None:
            s = signers.get(rr.signer_kid)
            if s is None:
                s = signers[rr.signer_kid] = SignerSummary(rr.signer_kid, pinned=keys.pinned(rr.signer_kid),
                                                           label=keys.labels.get(rr.signer_kid, ""))
            s.records += 1
        if keep:
            report.records.append(rr)
        if on_record is not None:
            on_record(rr)
    for s in signers.values():
        c = signed_custody.get(s.kid, {})
        s.custody = {k: c[k] for k in ("backend", "key_store", "software_device") if k in c}
    report.signers = list(signers.values())


def _finish(rr: RecordReport, body_problem: str | None, keys: KeyDirectory) -> None:
    """A record's last finding (a body not in canonical form), its verdict and whether a pinned key signed it."""
    if body_problem is not None:
        rr.findings.append(Finding("record_body_not_canonical", body_problem))
    rr.ok = not any(f.severity == "error" for f in rr.findings) and rr.signature in ("authored",)
    rr.pinned = rr.signature == "authored" and keys.pinned(rr.signer_kid)


def _tally(tally: dict[str, int], by_code: dict[str, int], rr: RecordReport) -> None:
    """Count one record into the report's counts, and its finding codes into ``by_code``."""
    tally["records"] += 1
    tally["ok" if rr.ok else "not_ok"] += 1
    for key in (f"signature:{rr.signature}", *((f"evidence:{rr.evidence}",) if rr.evidence is not None else ())):
        tally[key] = tally.get(key, 0) + 1
    for code in {f.code for f in rr.findings}:
        by_code[code] = by_code.get(code, 0) + 1


def _facts_of(e: StoredEntry) -> tuple[Any, ...]:
    """A capsule row's store facts (in a worker of the walk's first pass)."""
    capsule = _capsule_of(_capsule_body(e))
    return capsule_facts(capsule, custody_of(capsule))


def _checker(keys: KeyDirectory, facts: StoreFacts) -> Callable[[StoredEntry], Any]:
    """The check of one capsule row (in a worker of the walk's second pass): its
    report's findings, signature verdict and signer kid, the custody statement
    its signer signed (or None), and why its body is not canonical (or None)."""
    members = facts.members()
    kids: dict[str, str] = {}

    def check(e: StoredEntry) -> Any:
        body = _capsule_body(e)
        capsule = _capsule_of(body)
        own = e.record_type == "capsule"
        if own:  # this ledger's own capsules are checked as one store (chains, parents)
            result = verify(capsule, store=members)
            result.findings.extend(store_findings(capsule, e.seq, facts))
        else:  # kept as received from another producer: checked on its own (its chain is in its producer's ledger)
            result = verify(capsule)
        signed: dict[str, Mapping[str, Any]] = {}
        rr = _capsule_report(e, capsule, body, result, keys, signed)
        status = is_open(capsule, facts) if own else None
        if status is not None:
            rr.findings.append(Finding(OPEN_EFFECT, f"an open item: this {status} effect has no outcome in the "
                                       "ledger (no capsule chains to it)", severity="info"))
        if not own:
            rr.findings.append(Finding("capsule_received", "kept as received from another producer, checked on its "
                                       "own: its chain is in its producer's ledger", severity="info"))
        kid = rr.signer_kid
        if kid is not None:  # one string for every record a key signed: sent back from a worker once a batch
            kid = kids.setdefault(kid, kid)
        return rr.findings, rr.signature, kid, next(iter(signed.values()), None), _ambiguous_body(e.body, body)

    return check


def _capsule_body(entry: StoredEntry) -> dict[str, Any]:
    try:
        body = entry.record()
    except (ValueError, RecursionError):  # unreadable: this record fails, the others are still read
        return {}
    return body if isinstance(body, dict) else {}


def _capsule_of(body: Mapping[str, Any]) -> dict[str, Any]:
    capsule = body.get("capsule")
    return capsule if isinstance(capsule, dict) else {}


def _capsule_report(e: StoredEntry, capsule: dict[str, Any], body: Mapping[str, Any], result: Any,
                    keys: KeyDirectory, signed_custody: dict[str, Mapping[str, Any]]) -> RecordReport:
    """One capsule row's report: its Class-1 ``result``, store header, signatures and lookup columns."""
    rr = RecordReport(seq=e.seq, record_id=e.record_id, record_type=e.record_type, ok=result.ok,
                      findings=list(result.findings))
    rr.findings.extend(custody_findings(custody_of(capsule), keys))
    if capsule.get("capsule_id") != e.record_id or not is_hex64(e.record_id):
        rr.findings.append(Finding("header_mismatch", "the store header's record_id is not the capsule's id"))
    if e.epistemic_type != epistemic_type_for_capsule(capsule):  # EL -00 §4.1: fixed at commit, never upgraded
        rr.findings.append(Finding("header_mismatch", f"the store header's epistemic_type {e.epistemic_type!r} is not "
                                   f"the capsule's ({epistemic_type_for_capsule(capsule)!r})"))
    envelopes = body.get("envelopes", [])
    verdict, kid, sig_findings = check_signatures(capsule, envelopes if isinstance(envelopes, list) else [], keys,
                                                  capsule_id_hex=result.capsule_id)
    rr.signature, rr.signer_kid = verdict, kid
    custody = custody_of(capsule)
    if verdict == "authored" and kid is not None and isinstance(custody, Mapping) and custody.get("kid") == kid:
        signed_custody.setdefault(kid, custody)  # what a key says of itself, under its own signature
    rr.findings.extend(sig_findings)
    if verdict == "unclaimed":
        rr.findings.append(Finding("record_unsigned", "every record in a capseal ledger is signed; this one is not"))
    rr.findings.extend(column_findings(e, body))
    return rr


def _parsed(body: bytes) -> Any:
    """A stored body as JSON, or None when it is not (its own finding says so)."""
    try:
        return strict_json(body, "the stored body")
    except MalformedJSONError:
        return None


def _ambiguous_body(body: bytes, parsed: Any = None) -> str | None:
    """Why a stored body is not the one form capseal writes (compact,
    key-sorted JSON, no NaN, no duplicate member), or None. Such bytes can
    read two ways: with a duplicate member, a reader keeping the first sees
    another capsule than one keeping the last (Python's), and the row hash
    covers the bytes, not a reading of them.

    ``parsed``: the body as ``json.loads`` read it, when the caller has it.
    Bytes that are storage JSON of that reading hold no duplicate member
    (written back, the reading would have one member fewer) and, without the
    tokens NaN and Infinity, no constant; only other bytes are read again,
    strictly, to say what is wrong."""
    if parsed and b"NaN" not in body and b"Infinity" not in body:
        try:
            if storage_json(parsed) == body:
                return None
        except (TypeError, ValueError, RecursionError):  # not storage JSON: the strict reading below says why
            pass
    try:
        parsed = strict_json(body, "the stored body")
    except MalformedJSONError as exc:
        return str(exc)
    try:
        written = storage_json(parsed)
    except UnicodeEncodeError:  # an escaped lone surrogate: a string no UTF-8 text holds
        return ("the stored body holds a lone UTF-16 surrogate (an escape such as \\ud800), which no UTF-8 text "
                "holds and capseal never writes: readers could disagree on what it says")
    if written != body:
        return ("the stored body is not in capseal's canonical form (reordered keys or other spacing): readers "
                "could disagree on what it says")
    return None


def _verify_other(entry: StoredEntry, ledger: Ledger, keys: KeyDirectory) -> RecordReport:
    for prefix, target in RECORD_VERIFIERS.items():
        if entry.record_type.startswith(prefix):
            try:
                module_name, _, fn_name = target.partition(":")
                fn: Callable[..., RecordReport] = getattr(importlib.import_module(module_name), fn_name)
                return fn(entry, ledger=ledger, keys=keys)
            except Exception as exc:  # never raise
                return RecordReport(entry.seq, entry.record_id, entry.record_type, False,
                                    [Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}")])
    return RecordReport(entry.seq, entry.record_id, entry.record_type, False,
                        [Finding("record_type_unknown", f"no verifier for record type {entry.record_type!r}")])


def evidence_of(record: Any, trust: Any) -> tuple[str, list[Finding]]:
    """A record's evidence status and findings (``capseal.attest``), for a
    ledger's records and for record files alike; ``not-checked`` with a
    warning when capseal.attest cannot be loaded here. Never raises.

    Args:
        record: the sealed record.
        trust: the AK trust policy (see ``capseal.attest.TrustPolicy.coerce``).

    Returns:
        ``(status, findings)``.
    """
    try:
        from capseal.attest import evidence_status
    except (ImportError, AttributeError) as exc:
        return "not-checked", [Finding("evidence_unavailable", f"capseal.attest cannot check evidence here: {exc}",
                                       severity="warning")]
    status, findings = evidence_status(record, trust=trust)
    return status, list(findings)


def _check_evidence(ledger: Ledger, e: StoredEntry, rr: RecordReport, trust: Any) -> None:
    """A capsule row's hardware-evidence slot, into its report."""
    try:
        record = ledger.get(e.record_id)
    except (LedgerCorruptError, ValueError, RecursionError, sqlite3.DatabaseError) as exc:  # an edited row: this record fails, the others are read
        rr.evidence = "unreadable"
        rr.findings.append(Finding("evidence_unreadable", str(exc)))
        return
    rr.evidence, findings = evidence_of(record, trust)
    rr.findings.extend(findings)
