"""Verify judgment records: integrity, shape, type, what they cite. Never raises.

A verifier checks that a judgment is *intact and well-formed* — never whether it
is *right*. For one record it checks:

1. the digest: the stored body still hashes to the record id;
2. the shape: every rule of the refusal engine (``rules.check_body``), each
   failure reported under its rule name;
3. the type: the header's ``epistemic_type`` is the one the shape fixes and the
   ``record_type`` names the shape; links are of the six types, ``adjudicates``
   only on an adjudication record, a Close's body links are in its header;
4. what it cites: every citation, Result evidence digest and link target
   resolves in the store, and the digest is recomputed from the bytes it
   resolves to (a cited act or rubric edited in the store no longer gives the
   digest cited: ``citation_digest_mismatch``, ``link_target_digest_mismatch``).
   Other digest refs (a pin's prompt) are recomputed when the store publishes
   their preimage and reported as information when it does not. A digest the
   record was sealed citing in another store (``external=`` at seal time, kept
   in its row and signed) is reported as ``citation_external`` (information),
   never as unresolved;
5. the signature: a COSE_Sign1 over the record digest whose protected header
   commits to the store header (type, links and what was declared external)
   — ``authored``, ``invalid`` or ``unclaimed``, with the signer's kid. With
   ``trusted_keys`` a key outside them is an error (``signer_not_trusted``);
   without, a valid signature is reported as ``signer_not_pinned`` (a
   warning: the record is intact under the key named, and nothing says whose
   key that is — anyone can re-sign an edited record under a key of their own).

``verify_entry`` is the hook ``capseal.audit.verify_ledger`` calls for every
``judge:`` row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from capseal.canonical import is_hex64, json_digest
from capseal.errors import CanonicalizationError
from capseal.findings import Finding, HasFindings
from capseal.ledger import Ledger, StoredEntry

from .envelope import header_commitment, verify_judgment_envelope
from .rules import check_body, check_links, epistemic_type_of
from .store import (
    JudgmentStore,
    SealedJudgment,
    artifact_content,
    body_of_entry,
    cited_digests,
    declared_external,
    digest_of_entry,
)
from .vocab import ARTIFACT_RECORD_TYPE, ARTIFACT_VERSION, JUDGMENT_STORE_VERSION, RECORD_TYPE_PREFIX, record_type_for

__all__ = ["JudgmentReport", "verify_judgment", "verify_entry"]


@dataclass
class JudgmentReport(HasFindings):
    """What a verifier says of one judgment record (integrity, never correctness)."""

    ok: bool
    record_id: str | None
    record_type: str | None
    epistemic_type: str | None
    signature: str = "unclaimed"  # authored | invalid | unclaimed
    signer_kid: str | None = None
    findings: list[Finding] = field(default_factory=list)
    pinned: bool = False  # signed by one of the trusted keys (never when none were given)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON (the CLI's and the audit's form).

        Returns:
            ``{ok, record_id, record_type, epistemic_type, signature, signer_kid,
            signer_pinned, findings, note}``.
        """
        return {
            "ok": self.ok, "record_id": self.record_id, "record_type": self.record_type,
            "epistemic_type": self.epistemic_type, "signature": self.signature, "signer_kid": self.signer_kid,
            "signer_pinned": self.pinned,
            "findings": [f.to_dict() for f in self.findings],
            "note": "verified: signature, shape, type, citations — not whether the judgment is right",
        }


def _ledger_of(store: Any) -> Ledger | None:
    if isinstance(store, JudgmentStore):
        return store.ledger
    if isinstance(store, Ledger):
        return store
    return None


def verify_judgment(record: Any, store: Any, *, trusted_keys: Iterable[Any] = (), external: Iterable[str] = ()) -> JudgmentReport:
    """Verify one judgment record against ``store`` (a JudgmentStore or Ledger).

    Args:
        record: a :class:`SealedJudgment`, a stored ledger row, or a record digest.
        store: the JudgmentStore or Ledger holding it and what it cites.
        trusted_keys: the signing keys the caller pins (public keys, PEMs,
            kids, ``capseal.trust.TrustedKey``): a record none of them signed
            is an error. None given, a valid signature is reported as not
            pinned (``signer_not_pinned``, a warning; ``pinned`` stays False).
        external: digests the caller knows live in another store, beside
            those the record declared external when it was sealed.

    Returns:
        A :class:`JudgmentReport` (never raises): ``ok`` when intact, well-formed,
        resolving and signed; ``pinned`` when signed by a trusted key."""
    try:
        ledger = _ledger_of(store)
        if ledger is None:
            return JudgmentReport(False, None, None, None, findings=[Finding("store_unusable", f"{type(store).__name__} is not a JudgmentStore or Ledger")])
        digest = record.digest if isinstance(record, SealedJudgment) else record.record_id if isinstance(record, StoredEntry) else record
        if not isinstance(digest, str):
            return JudgmentReport(False, None, None, None, findings=[Finding("record_unusable", f"cannot verify a {type(record).__name__}")])
        entry = ledger.entry(digest) if is_hex64(digest) else None
        if entry is None:
            return JudgmentReport(False, digest, None, None, findings=[Finding("record_not_in_store", f"{digest} is not in this store")])
        from capseal.audit import KeyDirectory
        from capseal.errors import InputError

        try:
            keys = KeyDirectory(trusted_keys)
        except InputError as exc:  # the caller's anchors, never blamed on the record
            return JudgmentReport(False, digest, entry.record_type, entry.epistemic_type,
                                  findings=[Finding("trusted_keys_unusable", str(exc))])
        report = _verify(entry, ledger, keys, set(external))
        if isinstance(record, SealedJudgment):
            _compare_copy(record, entry, report)
        report.ok = report.signature == "authored" and not report.errors
        report.pinned = report.signature == "authored" and keys.pinned(report.signer_kid)
        return report
    except Exception as exc:  # never raise
        return JudgmentReport(False, None, None, None, findings=[Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}")])


def _compare_copy(record: SealedJudgment, entry: StoredEntry, report: JudgmentReport) -> None:
    """A caller's in-memory copy must be what the store holds (it cannot be edited)."""
    try:
        digest: str | None = json_digest(record.body)
    except CanonicalizationError:  # a float put in the copy: it has no digest, so it is not the stored record
        digest = None
    if digest != entry.record_id:
        report.findings.append(Finding("record_copy_differs", "the record given differs from the stored record (its body was changed)"))
    links = [dict(x) if isinstance(x, Mapping) else x for x in record.links]
    if (record.epistemic_type, record.record_type, links) != (entry.epistemic_type, entry.record_type, [dict(x) for x in entry.links]):
        report.findings.append(Finding("record_copy_differs", "the record given carries another type or other links than the stored one"))


def verify_entry(entry: StoredEntry, *, ledger: Ledger, keys: Any) -> Any:
    """The hook ``capseal.audit.verify_ledger`` calls for each ``judge:`` row.
    Never raises.

    Args:
        entry: the ledger row.
        ledger: the ledger holding it and what it cites.
        keys: the audit's ``KeyDirectory`` (the caller's trusted keys).

    Returns:
        A ``capseal.audit.RecordReport``: ``ok`` when intact, well-formed,
        resolving and signed (``verifier_internal_error`` if the check itself
        failed).
    """
    from capseal.audit import RecordReport

    try:
        report = _verify(entry, ledger, keys, set())
    except Exception as exc:  # never raise
        return RecordReport(entry.seq, entry.record_id, entry.record_type, False, [Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}")])
    ok = report.signature == "authored" and not report.errors
    return RecordReport(entry.seq, entry.record_id, entry.record_type, ok, report.findings, signature=report.signature, signer_kid=report.signer_kid)


def _verify(entry: StoredEntry, ledger: Ledger, keys: Any, external: set[str]) -> JudgmentReport:
    report = JudgmentReport(False, entry.record_id, entry.record_type, entry.epistemic_type)
    add = report.findings.append
    try:
        stored = body_of_entry(entry)
    except ValueError as exc:
        add(Finding("record_malformed", str(exc)))
        return report
    declared: tuple[str, ...] = ()
    if entry.record_type == ARTIFACT_RECORD_TYPE:
        digest = _check_artifact(entry, stored, add)
    elif entry.record_type.startswith(RECORD_TYPE_PREFIX):
        try:
            declared = declared_external(stored)
        except ValueError as exc:
            add(Finding("record_malformed", str(exc)))
            return report
        digest = _check_judgment(entry, stored, ledger, external, set(declared), add)
    else:
        add(Finding("record_type_unknown", f"{entry.record_type!r} is not a judge: record type"))
        return report
    if digest is None:
        return report
    _check_signature(entry, stored, digest, keys, report, declared)
    return report


def _check_artifact(entry: StoredEntry, stored: Mapping[str, Any], add: Any) -> str | None:
    if stored.get("record_version") != ARTIFACT_VERSION:
        add(Finding("record_malformed", f"an artifact row is {ARTIFACT_VERSION}"))
        return None
    try:
        from capseal.canonical import raw_digest

        digest = raw_digest(artifact_content(stored)[2])
    except Exception as exc:
        add(Finding("record_malformed", f"artifact content unreadable: {exc}"))
        return None
    if digest != entry.record_id:
        add(Finding("record_digest_mismatch", "the artifact's content does not hash to its record id"))
    if entry.epistemic_type != "producer_claim":
        add(Finding("epistemic_type_mismatch", f"an artifact is a producer_claim, the header says {entry.epistemic_type!r}"))
    if entry.links:
        add(Finding("link_malformed", "an artifact carries no links"))
    return digest


def _check_judgment(entry: StoredEntry, stored: Mapping[str, Any], ledger: Ledger, external: set[str],
                    declared: set[str], add: Any) -> str | None:
    if stored.get("record_version") != JUDGMENT_STORE_VERSION or not isinstance(stored.get("record"), dict):
        add(Finding("record_malformed", f"a judgment row is {JUDGMENT_STORE_VERSION} with a record object"))
        return None
    body = stored["record"]
    try:
        digest = json_digest(body)
    except Exception as exc:
        add(Finding("float_in_record", f"the body cannot be canonicalized: {exc}"))
        return None
    if digest != entry.record_id:
        add(Finding("record_digest_mismatch", "the stored body does not hash to its record id (it changed after sealing)"))
    for v in check_body(body):  # the shape: every rule, named
        add(Finding(v.rule, f"{v.message} (at {v.path})", severity=v.severity))
    fixed = epistemic_type_of(body)
    if fixed is not None and entry.epistemic_type != fixed:
        add(Finding("epistemic_type_mismatch", f"the shape fixes {fixed!r}; the header says {entry.epistemic_type!r} (a type is never changed after commit)"))
    version = body.get("record_version") or body.get("result_version")
    try:
        expected_type = record_type_for(str(version))
    except KeyError:
        expected_type = None
    if expected_type is not None and entry.record_type != expected_type:
        add(Finding("record_type_mismatch", f"the body is {version}, the header says {entry.record_type!r}"))
    links = [dict(x) for x in entry.links]
    for v in check_links(entry.epistemic_type, links, body):
        add(Finding(v.rule, f"{v.message} (at {v.path})"))
    for bl in body.get("x-evidence-links", []) if isinstance(body.get("x-evidence-links"), list) else []:
        if bl not in links:
            add(Finding("evidence_links_not_in_header", f"body link {bl} is missing from the store header"))
    resolve = _Resolver(ledger)
    cited, referenced = cited_digests(body)
    for path, d in cited:
        found = resolve(d)
        if found is None:
            if d in declared or d in external:
                add(_external(f"{path} cites {d[:16]}…", d in declared))
            else:
                add(Finding("citation_unresolved", f"{path} cites {d[:16]}…, which does not resolve in this store"))
        elif found != d:
            add(Finding("citation_digest_mismatch", f"{path} cites {d[:16]}…, but the stored bytes it resolves to give "
                        f"{_gives(found)} (the cited record changed after it was cited)"))
    for path, d in referenced:
        found = resolve(d)
        if found is None:
            if is_hex64(d):
                add(Finding("preimage_not_in_store", f"{path} names {d[:16]}…, whose preimage this store does not publish", severity="info"))
        elif found != d:
            add(Finding("citation_digest_mismatch", f"{path} names {d[:16]}…, but the stored bytes it resolves to give "
                        f"{_gives(found)} (the preimage changed after it was named)"))
    for i, link in enumerate(links):
        target = link.get("target")
        if not isinstance(target, str):
            continue  # check_links names a malformed target
        found = resolve(target)
        what = f"links[{i}] ({link.get('type')}) points at {target[:16]}…"
        if found is None:
            if target in declared or target in external:
                add(_external(what, target in declared))
            else:
                add(Finding("link_target_unresolved", f"{what}, which does not resolve in this store"))
        elif found != target:
            add(Finding("link_target_digest_mismatch", f"{what}, but the stored bytes there give {_gives(found)} "
                        "(the linked record changed after it was linked)"))
    return digest


def _gives(found: str) -> str:
    return f"{found[:16]}…" if found else "no digest (the row cannot be read)"


def _external(what: str, declared: bool) -> Finding:
    who = "declared external when it was sealed" if declared else "listed as external by the caller"
    return Finding("citation_external", f"{what}, {who}: it lives in another store, where it is to be checked",
                   severity="info")


class _Resolver:
    """A digest's stored row, its digest recomputed from the row's bytes (once
    per digest): the digest, another digest (the row was changed), the empty
    string (the row cannot be read), or None (no row)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._seen: dict[str, str | None] = {}

    def __call__(self, digest: str) -> str | None:
        if digest not in self._seen:
            entry = self._ledger.entry(digest) if is_hex64(digest) else None
            if entry is None:
                self._seen[digest] = None
            else:
                try:
                    self._seen[digest] = digest_of_entry(entry)
                except Exception:  # an unreadable row gives no digest: it is not what was cited
                    self._seen[digest] = ""
        return self._seen[digest]


def _check_signature(entry: StoredEntry, stored: Mapping[str, Any], digest: str, keys: Any, report: JudgmentReport,
                     declared: tuple[str, ...] = ()) -> None:
    envelopes = stored.get("envelopes", [])
    if not isinstance(envelopes, list) or not envelopes:
        report.findings.append(Finding("record_unsigned", "every record in a capseal store is signed; this one is not"))
        return
    try:
        commitment = header_commitment(entry.record_type, entry.epistemic_type, [dict(x) for x in entry.links], declared)
    except CanonicalizationError as exc:
        # a damaged header (a float or unsafe integer in its links) has no
        # commitment to check the signature against: it cannot be what was signed
        report.findings.append(Finding("header_commitment_mismatch", f"the store header cannot be canonicalized ({exc}), so it is not what was signed at commit"))
        report.signature = "invalid"
        return
    verdict, signers = "unclaimed", []
    for env in envelopes:
        authored, env_kid, findings = verify_judgment_envelope(env, bytes.fromhex(digest), commitment)
        report.findings.extend(findings)
        if not authored:
            verdict = "invalid"
        else:
            signers.append(env_kid)
            if verdict == "unclaimed":
                verdict = "authored"
    trusted = getattr(keys, "trusted", None)
    pinned = [k for k in signers if trusted is not None and k in trusted]
    kid = (pinned or signers)[0] if signers else None
    if verdict == "authored":
        if trusted is None:
            from capseal.audit import not_pinned

            report.findings.append(not_pinned(str(k) for k in signers))
        elif not pinned:
            report.findings.append(Finding("signer_not_trusted", f"signed by {kid}, which is not among the trusted keys"))
    report.signature, report.signer_kid = verdict, kid
