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

from cryptography.hazmat.primitives import serialization

from .canonical import capsule_id, hex_bytes, is_hex64
from .envelope import PLAIN, PROFILE, verify_cose_sign1, verify_profile_envelope
from .errors import InputError, LedgerCorruptError, MalformedJSONError
from .findings import Finding
from .ledger import (
    AuditLedger,
    Ledger,
    StoredEntry,
    as_url,
    column_findings,
    empty_finding,
    failure_finding,
    file_findings,
    is_database_url,
)
from .record import RECEIVED_CAPSULE, dumps_canonical, epistemic_type_for_capsule, strict_json
from .trust import trusted_keys
from .verify import verify, verify_store

__all__ = ["RecordReport", "LedgerReport", "verify_ledger", "KeyDirectory", "RECORD_VERIFIERS", "open_effects",
           "OPEN_EFFECT"]

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

    @property
    def pinned(self) -> bool:
        return self.anchors > 0

    def trust(self) -> dict[str, Any]:
        """The signers and whether a trust anchor pinned them (for reports)."""
        return {"anchors": self.anchors, "pinned": self.pinned, "signers": [s.to_dict() for s in self.signers]}

    def counts(self) -> dict[str, int]:
        out = {"records": len(self.records), "ok": sum(r.ok for r in self.records)}
        out["not_ok"] = out["records"] - out["ok"]
        for r in self.records:
            out[f"signature:{r.signature}"] = out.get(f"signature:{r.signature}", 0) + 1
            if r.evidence is not None:
                out[f"evidence:{r.evidence}"] = out.get(f"evidence:{r.evidence}", 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "ok": self.ok, "counts": self.counts(), "trust": self.trust(),
            "findings": [f.to_dict() for f in self.findings],
            "records": [r.to_dict() for r in self.records],
        }


class KeyDirectory:
    """kid (hex) -> public key, from custody statements and caller-trusted keys.

    ``trusted`` is None when no trust anchor was given (every signature is
    then reported as not pinned), else the set of pinned kids."""

    def __init__(self, trusted: Iterable[Any] | None = ()) -> None:
        self._keys: dict[str, Any] = {}
        self.trusted: set[str] | None = None
        self.labels: dict[str, str] = {}
        pinned = trusted_keys(trusted) if trusted is not None else []  # None: no anchors, as ()
        if pinned:
            self.trusted = set()
            for key in pinned:
                if key.public_key is not None:
                    self._keys[key.kid] = key.public_key
                if key.label:
                    self.labels[key.kid] = key.label
                self.trusted.add(key.kid)

    def learn_from_custody(self, custody: Any) -> None:
        if not isinstance(custody, Mapping):
            return
        kid, spki = custody.get("kid"), custody.get("public_key")
        if not isinstance(kid, str) or not isinstance(spki, str):
            return
        try:
            from capseal.keys import kid_for

            key = serialization.load_der_public_key(bytes.fromhex(spki))
            if kid_for(key) != kid:  # a custody statement cannot introduce a key under another kid
                return
        except Exception:  # any bad key (cryptography's UnsupportedAlgorithm is no ValueError): none learnt
            return
        self._keys.setdefault(kid, key)  # a trusted key given by the caller is never replaced

    def get(self, kid: str) -> Any:
        return self._keys.get(kid)

    def pinned(self, kid: str | None) -> bool:
        """Is ``kid`` one of the trusted keys?"""
        return self.trusted is not None and kid in self.trusted


def not_pinned(signers: Iterable[str]) -> Finding:
    """The warning for a signature no trust anchor pins."""
    kids = ", ".join(dict.fromkeys(signers))
    return Finding("signer_not_pinned", f"signed by {kids}, which no trust anchor pins (no trusted keys were given): "
                   "the record is intact under that key, and nothing says whose key it is", severity="warning")


def _custody_of(capsule: Mapping[str, Any]) -> Any:
    """The custody statement of an epoch-boundary capsule (the only place a
    producer writes one); None for any other capsule."""
    disposition = capsule.get("disposition")
    if not isinstance(disposition, Mapping) or disposition.get("verdict_class") != "epoch_boundary":
        return None
    ma = capsule.get("model_attestation")
    ca = ma.get("compute_attestation") if isinstance(ma, Mapping) else None
    return ca.get("x-capseal-key-custody") if isinstance(ca, Mapping) else None


def check_signatures(capsule: Mapping[str, Any], envelopes: list[Any], keys: KeyDirectory) -> tuple[str, str | None, list[Finding]]:
    """Verify a capsule record's inline profile envelope and its envelopes[].
    Returns (verdict, signer kid, findings). Never raises.

    Each signature is checked on its own (-05: a capsule has zero or more
    envelopes, each verifying by itself), and the verdict does not depend on
    their order: ``invalid`` if any fails, else ``authored`` if any verifies
    (the kid returned is a trusted one when trusted keys are given and one
    signed), else ``unverifiable`` if one names a key nobody gave us, else
    ``unclaimed``. Kids are returned in lower-case hex."""
    findings: list[Finding] = []
    try:
        cid = capsule_id(capsule)
    except Exception as exc:
        return "invalid", None, [Finding("signature_uncheckable", f"capsule id cannot be computed: {exc}")]
    invalid, unverifiable = False, False
    signers: list[str] = []  # every kid whose signature verified, in order
    has_sig, has_kid = "signature" in capsule, "key_id" in capsule
    inline = hex_bytes(capsule.get("signature"))
    if has_sig != has_kid:
        findings.append(Finding("envelope_malformed", "signature and key_id appear together or not at all"))
        invalid = True
    elif has_sig:
        result = verify_profile_envelope(cid, inline)
        key_id = hex_bytes(capsule.get("key_id"))
        if not result.ok:
            findings.extend(result.findings)
            invalid = True
        elif key_id is None or result.public_key != key_id:
            findings.append(Finding("key_id_mismatch", "key_id is not the key that signed the envelope"))
            invalid = True
        else:
            signers.append(key_id.hex())
    for i, env in enumerate(envelopes):
        if not isinstance(env, Mapping):
            findings.append(Finding("envelope_malformed", f"envelopes[{i}] is not an object"))
            invalid = True
            continue
        cose = hex_bytes(env.get("cose"))
        if cose is None:
            findings.append(Finding("envelope_malformed", f"envelopes[{i}].cose is not hex"))
            invalid = True
            continue
        profile, env_kid = env.get("profile"), hex_bytes(env.get("kid"))
        if profile == PROFILE:
            result = verify_profile_envelope(cid, cose)
            if not result.ok or result.public_key is None or result.public_key != env_kid:
                findings.extend(result.findings or [Finding("key_id_mismatch", f"envelopes[{i}].kid is not the signing key")])
                invalid = True
            elif has_sig and inline != cose:
                findings.append(Finding("envelope_inconsistent", f"envelopes[{i}] differs from the inline signature"))
                invalid = True
            else:
                signers.append(result.public_key.hex())
        elif profile == PLAIN:
            key = keys.get(env_kid.hex()) if env_kid is not None else None
            if key is None or env_kid is None:
                findings.append(Finding("signer_key_unknown", f"envelopes[{i}]: no public key known for kid {env.get('kid')}; pass it as a trusted key", severity="warning"))
                unverifiable = True
                continue
            result = verify_cose_sign1(cose, key, payload=bytes.fromhex(cid))
            if not result.ok:
                findings.extend(result.findings)
                invalid = True
            elif result.kid is not None and result.kid != env_kid:
                findings.append(Finding("key_id_mismatch", f"envelopes[{i}] protected kid differs from the record's kid"))
                invalid = True
            else:
                signers.append(env_kid.hex())
        else:
            findings.append(Finding("envelope_profile_unknown", f"envelopes[{i}].profile {profile!r} is not known", severity="warning"))
    verdict = "invalid" if invalid else "authored" if signers else "unverifiable" if unverifiable else "unclaimed"
    trusted_signers = [k for k in signers if keys.trusted is not None and k in keys.trusted]
    kid = (trusted_signers or signers)[0] if signers else None
    if keys.trusted is None:
        if verdict == "authored":
            findings.append(not_pinned(signers))
    else:
        if verdict == "authored" and not trusted_signers:
            findings.append(Finding("signer_not_trusted", f"signed by {', '.join(dict.fromkeys(signers))}, none of them "
                                    "among the trusted keys"))
        elif verdict in ("unclaimed", "unverifiable"):  # trusted keys were asked for: no signature by one is an error
            findings.append(Finding("signer_not_trusted", "trusted keys were given, but this capsule carries no signature "
                                    f"a trusted key makes (signature {verdict})"))
    return verdict, kid, findings


def _custody_findings(custody: Any, keys: KeyDirectory) -> list[Finding]:
    """A custody statement's TPM2_Certify (the signing key certified by an AK)
    is re-verified here, not only when it was recorded. Never raises."""
    if not isinstance(custody, Mapping) or "tpm_certify" not in custody:
        return []
    try:
        from capseal.keys._tpm_certify import verify_certify
    except ImportError as exc:
        return [Finding("custody_certify_unchecked", f"tpm2-pytss is needed to check the TPM2_Certify: {exc}", severity="warning")]
    kid = custody.get("kid")
    problems = verify_certify(custody["tpm_certify"], public_key=keys.get(kid) if isinstance(kid, str) else None)
    return [Finding("custody_certify_invalid", f"TPM2_Certify in the custody statement: {p}") for p in problems]


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
) -> LedgerReport:
    """Verify a whole ledger file. Never raises; ``ok`` gates everything.

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
                _verify_open_ledger(ledger, report, keys, evidence, evidence_trust)
    except Exception as exc:  # never raise: report why it could not run
        report.findings.append(failure_finding(exc))
        report.ok = False
        return report
    report.ok = not any(f.severity == "error" for f in report.findings) and all(r.ok for r in report.records)
    return report


def _verify_open_ledger(ledger: Ledger, report: LedgerReport, keys: KeyDirectory, evidence: bool, evidence_trust: Any) -> None:
    for problem in ledger.check_chain():  # rows SQLite cannot read are among these
        report.findings.append(Finding("ledger_chain_broken", problem))
    entries: list[StoredEntry] = list(ledger.entries(damaged=[]))
    report.findings.extend(file_findings(ledger, entries))
    capsule_entries = [e for e in entries if e.record_type == "capsule" and e.damage is None]
    received_entries = [e for e in entries if e.record_type == RECEIVED_CAPSULE and e.damage is None]
    bodies = {e.seq: _capsule_body(e) for e in capsule_entries + received_entries}
    capsules = [_capsule_of(bodies[e.seq]) for e in capsule_entries]
    for capsule in capsules:
        custody = _custody_of(capsule)
        if custody is not None:
            keys.learn_from_custody(custody)
    signed_custody: dict[str, Mapping[str, Any]] = {}
    by_seq: dict[int, RecordReport] = {}
    # this ledger's own capsules are checked as one store (chains, parents); a capsule kept
    # as received from another producer is checked on its own (its chain is in its producer's ledger)
    checked = list(zip(capsule_entries, capsules, verify_store(capsules)))
    checked += [(e, _capsule_of(bodies[e.seq]), verify(_capsule_of(bodies[e.seq]))) for e in received_entries]
    still_open = open_effects(capsules)  # by index in capsules, which checked begins with
    for index, (e, capsule, result) in enumerate(checked):
        rr = _capsule_report(e, capsule, bodies[e.seq], result, keys, signed_custody)
        if index in still_open:
            rr.findings.append(still_open[index])
        if e.record_type == RECEIVED_CAPSULE:
            rr.findings.append(Finding("capsule_received", "kept as received from another producer, checked on its "
                                       "own: its chain is in its producer's ledger", severity="info"))
        by_seq[e.seq] = rr
    if evidence:
        _check_evidence(ledger, capsule_entries, by_seq, evidence_trust)
    for e in entries:
        if e.damage is not None:
            report.records.append(RecordReport(e.seq, e.record_id, e.record_type, False,
                                               [Finding("record_unreadable", f"the row is damaged ({e.damage})")]))
            continue
        if e.record_type in ("capsule", RECEIVED_CAPSULE):
            rr = by_seq[e.seq]
        else:
            rr = _verify_other(e, ledger, keys)
            if any(e.record_type.startswith(prefix) for prefix in RECORD_VERIFIERS):  # records capseal writes
                rr.findings.extend(column_findings(e, _parsed(e.body)))
        body_problem = _ambiguous_body(e.body)
        if body_problem is not None:
            rr.findings.append(Finding("record_body_not_canonical", body_problem))
        rr.ok = not any(f.severity == "error" for f in rr.findings) and rr.signature in ("authored",)
        rr.pinned = rr.signature == "authored" and keys.pinned(rr.signer_kid)
        report.records.append(rr)
    report.signers = _signers(report.records, keys, signed_custody)


def _signers(records: list[RecordReport], keys: KeyDirectory, custody: dict[str, Mapping[str, Any]]) -> list[SignerSummary]:
    """Every key that signed a record, in order of first use, with the custody
    statement the key itself signed (an epoch-boundary capsule it authored)."""
    out: dict[str, SignerSummary] = {}
    for r in records:
        if r.signature != "authored" or r.signer_kid is None:
            continue
        s = out.get(r.signer_kid)
        if s is None:
            c = custody.get(r.signer_kid, {})
            s = out[r.signer_kid] = SignerSummary(
                r.signer_kid, pinned=keys.pinned(r.signer_kid), label=keys.labels.get(r.signer_kid, ""),
                custody={k: c[k] for k in ("backend", "key_store", "software_device") if k in c})
        s.records += 1
    return list(out.values())


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
    rr.findings.extend(_custody_findings(_custody_of(capsule), keys))
    if capsule.get("capsule_id") != e.record_id or not is_hex64(e.record_id):
        rr.findings.append(Finding("header_mismatch", "the store header's record_id is not the capsule's id"))
    if e.epistemic_type != epistemic_type_for_capsule(capsule):  # EL -00 §4.1: fixed at commit, never upgraded
        rr.findings.append(Finding("header_mismatch", f"the store header's epistemic_type {e.epistemic_type!r} is not "
                                   f"the capsule's ({epistemic_type_for_capsule(capsule)!r})"))
    envelopes = body.get("envelopes", [])
    verdict, kid, sig_findings = check_signatures(capsule, envelopes if isinstance(envelopes, list) else [], keys)
    rr.signature, rr.signer_kid = verdict, kid
    custody = _custody_of(capsule)
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


def _ambiguous_body(body: bytes) -> str | None:
    """Why a stored body is not the one form capseal writes (compact,
    key-sorted JSON, no NaN, no duplicate member), or None. Such bytes can
    read two ways: with a duplicate member, a reader keeping the first sees
    another capsule than one keeping the last (Python's), and the row hash
    covers the bytes, not a reading of them."""
    try:
        parsed = strict_json(body, "the stored body")
    except MalformedJSONError as exc:
        return str(exc)
    if dumps_canonical(parsed) != body:
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
    warning when capseal.attest cannot be loaded here. Never raises."""
    try:
        from capseal.attest import evidence_status  # type: ignore[attr-defined]
    except (ImportError, AttributeError) as exc:
        return "not-checked", [Finding("evidence_unavailable", f"capseal.attest cannot check evidence here: {exc}",
                                       severity="warning")]
    status, findings = evidence_status(record, trust=trust)
    return status, list(findings)


def _check_evidence(ledger: Ledger, entries: list[StoredEntry], by_seq: dict[int, RecordReport], trust: Any) -> None:
    for e in entries:
        rr = by_seq[e.seq]
        try:
            record = ledger.get(e.record_id)
        except (LedgerCorruptError, ValueError, RecursionError, sqlite3.DatabaseError) as exc:  # an edited row: this record fails, the others are read
            rr.evidence = "unreadable"
            rr.findings.append(Finding("evidence_unreadable", str(exc)))
            continue
        rr.evidence, findings = evidence_of(record, trust)
        rr.findings.extend(findings)
