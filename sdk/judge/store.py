"""The judgment store: judgment records in the capseal ledger, beside the capsules.

Every record goes through :class:`~capseal.ledger.Ledger`, so it gets the EL -00
§4 store header (``seq, record_id, record_type, epistemic_type, links`` and 128
fresh random bits), the hash chain and the append-only triggers. For a judgment
record:

* ``record_id`` is the record digest (SHA-256 of the body's JCS bytes): the
  digest other records cite and link to, and the payload of its signature;
* ``record_type`` is ``judge:<record_version>`` (``judge:evaluation-report/v1``…);
* ``epistemic_type`` is copied from the *shape* at commit — there is no
  parameter for it, and nothing afterwards changes it. A misclassified record is
  corrected only by :meth:`JudgmentStore.supersede`: a new record, a new id, a
  ``supersedes`` link; the old record stays and still verifies.

Artifacts (a rubric, a prompt file, a payload, a blind packet) are stored as
``judge:artifact/v1`` records keyed by their content digest, so a citation of
them resolves in the same store. Sealing refuses a record that cites or links to
a digest the store cannot resolve (pass ``external=`` for digests that live in a
peer's store, e.g. a two-party Close's peer Close). The digests a record cites
or links to under ``external=`` are kept in its row (``external``, covered by
its signature), so verifying the ledger later reports them as external rather
than unresolved.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from capseal.canonical import MAX_DEPTH, check_json, is_hex64, json_digest, raw_digest
from capseal.errors import DuplicateRecordError, JudgmentRefusedError
from capseal.ledger import Ledger, LedgerEntry, StoredEntry
from capseal.record import RECEIVED_CAPSULE, storage_json

from ._rows import artifact_content, body_of_entry, cited_digests, declared_external, digest_of_entry
from .citation import Target, computed, listed
from .envelope import JudgmentEnvelope, header_commitment, sign_judgment
from .links import Link, digest_of, link_header, validate_links
from .rules import check_body, epistemic_type_of, raise_first
from .shapes import refuse_unless_blind
from .vocab import (
    ARTIFACT_RECORD_TYPE,
    ARTIFACT_VERSION,
    JUDGMENT_STORE_VERSION,
    RECORD_TYPE_PREFIX,
    record_type_for,
)

__all__ = ["SealedJudgment", "JudgmentStore", "cited_digests", "body_of_entry", "digest_of_entry", "declared_external",
           "artifact_content"]


@dataclass(frozen=True)
class SealedJudgment:
    """A judgment record as stored: body, store header and signatures. Frozen."""

    body: dict[str, Any]
    digest: str
    record_type: str
    epistemic_type: str
    links: tuple[dict[str, str], ...]
    envelopes: tuple[JudgmentEnvelope, ...]
    seq: int
    nonce: str
    signer_kid: str | None = field(default=None)
    #: digests it was sealed citing or linking to in another store (``external=``)
    external: tuple[str, ...] = field(default=())

    @property
    def record_id(self) -> str:
        """The store header's record id: the record digest."""
        return self.digest

    def target(self) -> Target:
        """This record as something another record can cite or link to.

        Returns:
            Its Target (digest recomputed from the body).

        Raises:
            CanonicalizationError: a body with no JCS form (a sealed one has one).
        """
        return Target.of_record(self.body)

    def header(self) -> dict[str, Any]:
        """The record's store header.

        Returns:
            ``{seq, record_id, record_type, epistemic_type, links, nonce}``.
        """
        return {
            "seq": self.seq, "record_id": self.digest, "record_type": self.record_type,
            "epistemic_type": self.epistemic_type, "links": [dict(x) for x in self.links], "nonce": self.nonce,
        }

    def to_json(self) -> dict[str, Any]:
        """The record as a row's reader sees it.

        Returns:
            ``{header, record, envelopes}``, with ``external`` when it was sealed
            citing another store.
        """
        out: dict[str, Any] = {"header": self.header(), "record": self.body, "envelopes": [e.to_json() for e in self.envelopes]}
        if self.external:
            out["external"] = list(self.external)
        return out


class JudgmentStore:
    """Seal judgment records into a ledger with any capseal signer, and read them.

    Args:
        ledger: a :class:`Ledger`, or a path to open one at (closed with the
            store).
        signer: any ``capseal.keys.Signer`` (software, PKCS#11, TPM); None
            opens a store that reads and verifies only.

    Raises:
        LedgerError: the ledger at the path cannot be opened.
    """

    def __init__(self, ledger: Ledger | str, signer: Any = None) -> None:
        self._owns = not isinstance(ledger, Ledger)
        self.ledger = ledger if isinstance(ledger, Ledger) else Ledger(ledger)
        self.signer = signer

    def close(self) -> None:
        """Close the ledger if the store opened it (one passed in stays open)."""
        if self._owns:
            self.ledger.close()

    def __enter__(self) -> JudgmentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading

    def has(self, digest: str) -> bool:
        """Does ``digest`` resolve to a record (capsule, judgment or artifact) here?

        Args:
            digest: 64 lowercase hex.

        Returns:
            True when a row has it as its record id (False for anything that is
            not a digest).

        Raises:
            LedgerError: the ledger cannot be read (closed, damaged).
        """
        return is_hex64(digest) and self.ledger.entry(digest) is not None

    def entry(self, digest: str) -> StoredEntry | None:
        """The ledger row a digest names.

        Args:
            digest: 64 lowercase hex.

        Returns:
            The row, or None (also for anything that is not a digest).

        Raises:
            LedgerError: the ledger cannot be read (closed, damaged).
        """
        return self.ledger.entry(digest) if is_hex64(digest) else None

    def target(self, digest: str, *, type: str | None = None) -> Target:
        """A Target for a stored record, its digest *recomputed* from the stored bytes.

        Args:
            digest: the record's digest.
            type: what it is cited as (default: from the row).

        Returns:
            The Target, with the row's content.

        Raises:
            JudgmentRefusedError: ``citation_unresolved`` (no such row) or
                ``record_digest_mismatch`` (its bytes give another digest).
            ValueError: a malformed row.
            LedgerError: the ledger cannot be read (closed, damaged).
        """
        entry = self.entry(digest)
        if entry is None:
            raise JudgmentRefusedError(f"{digest} does not resolve in this store", rule="citation_unresolved")
        recomputed = digest_of_entry(entry)
        if recomputed != digest:
            raise JudgmentRefusedError(f"stored bytes give {recomputed}, not {digest}", rule="record_digest_mismatch")
        if entry.record_type in ("capsule", RECEIVED_CAPSULE):
            return Target.recorded(type=type or "agent-action-capsule", digest=digest, kind="capsule", content=entry.record()["capsule"])
        stored = body_of_entry(entry)
        if entry.record_type == ARTIFACT_RECORD_TYPE:
            kind, content, _ = artifact_content(stored)
            return Target.recorded(type=type or str(stored.get("artifact_type", "artifact")), digest=digest, kind=kind, content=content)
        body = stored["record"]
        name = str(body.get("record_version") or body.get("result_version")).split("/", 1)[0]
        return Target.recorded(type=type or name, digest=digest, kind="record", content=body)

    def value(self, digest: str) -> Any:
        """The content a digest names.

        Args:
            digest: the record's digest.

        Returns:
            A capsule dict, a judgment body, or an artifact's JSON value, text or
            bytes.

        Raises:
            JudgmentRefusedError: as :meth:`target`.
            ValueError: a malformed row.
        """
        return self.target(digest).content

    def get(self, digest: str) -> SealedJudgment | None:
        """A sealed judgment record by digest.

        Args:
            digest: the record's digest.

        Returns:
            The record, or None for a capsule, an artifact or a miss.

        Raises:
            ValueError: a malformed row.
            LedgerError: the ledger cannot be read (closed, damaged).
        """
        entry = self.entry(digest)
        if entry is None or not entry.record_type.startswith(RECORD_TYPE_PREFIX) or entry.record_type == ARTIFACT_RECORD_TYPE:
            return None
        return self._sealed(entry)

    def judgments(self) -> Iterator[SealedJudgment]:
        """Every sealed judgment record, in ledger order.

        Returns:
            An iterator of records (capsules and artifacts left out).

        Raises:
            ValueError: a malformed row (when it is reached).
            LedgerError: the ledger cannot be read (closed, damaged).
        """
        for entry in self.ledger.entries():
            if entry.record_type.startswith(RECORD_TYPE_PREFIX) and entry.record_type != ARTIFACT_RECORD_TYPE:
                yield self._sealed(entry)

    @staticmethod
    def _sealed(entry: StoredEntry) -> SealedJudgment:
        stored = body_of_entry(entry)
        envs = tuple(JudgmentEnvelope.from_json(e) for e in stored.get("envelopes", []))
        return SealedJudgment(
            body=stored["record"], digest=entry.record_id, record_type=entry.record_type,
            epistemic_type=entry.epistemic_type, links=tuple(entry.links), envelopes=envs,
            seq=entry.seq, nonce=entry.nonce, signer_kid=envs[0].kid if envs else None,
            external=declared_external(stored),
        )

    # ------------------------------------------------------------------ writing

    def _require_signer(self) -> Any:
        if self.signer is None:
            raise JudgmentRefusedError("this store was opened without a signer; it can read and verify only", rule="signer_missing")
        return self.signer

    def put(self, target: Target) -> Target:
        """Keep a Target's content (JSON, text or bytes) as a signed artifact, so
        citations of it resolve here. Idempotent: the same content is kept once.

        Args:
            target: the content, as a Target.

        Returns:
            The Target.

        Raises:
            JudgmentRefusedError: not a Target, a capsule or record Target not
                held here (``artifact_kind``), content changed since the Target was
                made (``record_digest_mismatch``), or ``signer_missing``.
            SignerError: the signer could not sign; nothing was kept.
            LedgerError: the ledger refused the row.
        """
        target = computed(target, "target")
        if target.kind not in ("json", "text", "bytes"):
            if self.has(target.digest):
                return target
            raise JudgmentRefusedError(f"a {target.kind} is kept by its own sealer, not as an artifact", rule="artifact_kind")
        # the digest is signed, so it is recomputed from the very bytes kept
        # (a Target's JSON content is a dict a caller could still change)
        data = target.canonical()
        if raw_digest(data) != target.digest:
            raise JudgmentRefusedError(
                f"the {target.type} artifact's content no longer gives its digest {target.digest[:16]}… "
                "(was it changed after the Target was made?); nothing kept", rule="record_digest_mismatch")
        if self.has(target.digest):
            return target
        if target.kind == "json":
            stored: dict[str, Any] = {"encoding": "json", "content": json.loads(data)}  # from the very bytes digested
        elif target.kind == "text":
            stored = {"encoding": "utf-8", "content": target.content}
        else:
            stored = {"encoding": "base64", "content": base64.b64encode(target.content).decode("ascii")}
        stored = {"record_version": ARTIFACT_VERSION, "artifact_type": target.type, **stored}
        self._append(stored, target.digest, ARTIFACT_RECORD_TYPE, "producer_claim", ())
        return target

    def put_json(self, value: Any, *, type: str) -> Target:
        """Keep a JSON value as an artifact (:meth:`put` of ``Target.of_json``).

        Args:
            value: the JSON value.
            type: what it is.

        Returns:
            Its Target.

        Raises:
            CanonicalizationError: a value with no JCS form.
            JudgmentRefusedError: as :meth:`put`.
            SignerError: the signer could not sign; nothing was kept.
        """
        return self.put(Target.of_json(value, type=type))

    def put_text(self, text: str, *, type: str) -> Target:
        """Keep text as an artifact (:meth:`put` of ``Target.of_text``).

        Args:
            text: the text.
            type: what it is.

        Returns:
            Its Target.

        Raises:
            JudgmentRefusedError: not a str, or as :meth:`put`.
            SignerError: the signer could not sign; nothing was kept.
        """
        return self.put(Target.of_text(text, type=type))

    def put_bytes(self, data: bytes, *, type: str) -> Target:
        """Keep bytes as an artifact (:meth:`put` of ``Target.of_bytes``).

        Args:
            data: the bytes.
            type: what they are.

        Returns:
            Their Target.

        Raises:
            JudgmentRefusedError: not bytes, or as :meth:`put`.
            SignerError: the signer could not sign; nothing was kept.
        """
        return self.put(Target.of_bytes(data, type=type))

    def seal(self, record: Any, *, links: Iterable[Link | dict[str, str]] = (), external: Iterable[str] = ()) -> SealedJudgment:
        """Check, sign and append one judgment record; returns once it is durable.

        Order: refusal engine → epistemic type from the shape → link rules →
        every cited digest and link target resolves (or is listed in
        ``external``) → sign → append. Any refusal leaves the store as it was.

        Args:
            record: a builder model (``EvaluationReport`` …, ``EvidenceResult``)
                or a body dict.
            links: store-header links (Links or ``{type, target}``); a Close's
                body links are mirrored here.
            external: digests it may cite or link to that live in another store
                (kept in its row and signed).

        Returns:
            The sealed record.

        Raises:
            JudgmentRefusedError: the rule the record, a link or a citation
                breaks (``citation_unresolved``, ``link_target_unresolved``,
                ``link_to_self``, ``rated_case_not_blind``,
                ``record_already_sealed``, ``signer_missing`` …).
            SignerError: the signer could not sign; nothing was appended.
            LedgerError: the ledger refused the row.
        """
        body = record.body() if hasattr(record, "body") and callable(record.body) else record
        if not isinstance(body, Mapping):
            raise JudgmentRefusedError("a judgment record is a JSON object", rule="record_not_object")
        body = dict(body)
        raise_first(check_body(body))
        version = body.get("record_version") or body.get("result_version")
        record_type = record_type_for(str(version))
        epistemic_type = epistemic_type_of(body)
        assert epistemic_type is not None  # check_body refused unknown shapes
        header_links = [link_header(x, f"$.links[{i}]") for i, x in enumerate(listed(links, "links"))]
        body_links = [dict(x) for x in body.get("x-evidence-links", [])]
        for bl in body_links:  # close/v1: the body's links are mirrored in the header
            if bl not in header_links:
                header_links.append(bl)
        links_t = validate_links(epistemic_type, header_links, body)
        allowed: set[str] = set()
        for digest in listed(external, "external"):
            if not (isinstance(digest, str) and is_hex64(digest)):
                raise JudgmentRefusedError(f"external= lists 64-hex digests, not {digest!r:.40}",
                                           rule="link_target_malformed", path="$.external")
            allowed.add(digest)
        cited, _ = cited_digests(body)
        for path, digest in cited:
            if digest not in allowed and not self.has(digest):
                raise JudgmentRefusedError(f"cited digest {digest[:16]}… does not resolve in this store (put the cited content first, or list it in external=)", rule="citation_unresolved", path=path)
        case = body.get("case") if version == "human-rating/v1" else None
        if isinstance(case, Mapping) and isinstance(case.get("digest"), str) and self.has(case["digest"]):
            refuse_unless_blind(self.target(case["digest"]))  # a rating built without HumanRating.of is blind too
        for i, item in enumerate(links_t):
            if item["target"] not in allowed and not self.has(item["target"]):
                raise JudgmentRefusedError(f"{item['type']} target {item['target'][:16]}… does not resolve in this store", rule="link_target_unresolved", path=f"$.links[{i}]")
        digest = json_digest(body)
        if any(item["target"] == digest for item in links_t):
            raise JudgmentRefusedError("a record cannot link to itself", rule="link_to_self")
        # what this record cites or links to in another store, kept with it (and
        # signed), so its own ledger verifies it as external and not as missing
        used = {d for _, d in cited} | {item["target"] for item in links_t}
        declared = sorted(d for d in allowed & used if not self.has(d))
        stored: dict[str, Any] = {"record_version": JUDGMENT_STORE_VERSION, "record": body}
        if declared:
            stored["external"] = declared
        sealed = self._append(stored, digest, record_type, epistemic_type, links_t)
        assert isinstance(sealed, SealedJudgment)  # a judgment row, not an artifact's
        return sealed

    def supersede(self, old: SealedJudgment | str, record: Any, *, links: Iterable[Link | dict[str, str]] = (), external: Iterable[str] = ()) -> SealedJudgment:
        """Correct ``old`` (a wrong type, a wrong verdict) the only way the Evidence
        Layer allows: a new record with a ``supersedes`` link to it.

        ``old`` is left as it is and still verifies.

        Args:
            old: the record to correct, or its digest.
            record: the correcting record.
            links: further links.
            external: as :meth:`seal`.

        Returns:
            The new record.

        Raises:
            JudgmentRefusedError: ``old`` is no judgment record here
                (``link_target_unresolved``), or as :meth:`seal`.
            SignerError: the signer could not sign; nothing was appended.
            LedgerError: the ledger refused the row.
        """
        old_digest = digest_of(old)
        if self.get(old_digest) is None:
            raise JudgmentRefusedError(f"{old_digest[:16]}… is no judgment record in this store", rule="link_target_unresolved")
        return self.seal(record, links=[Link.to("supersedes", old_digest), *links], external=external)

    def _append(self, stored: dict[str, Any], digest: str, record_type: str, epistemic_type: str,
                links: tuple[dict[str, str], ...]) -> StoredEntry | SealedJudgment:
        # every record capseal writes nests at most MAX_DEPTH deep, so any verifier can read it back
        check_json(stored, max_depth=MAX_DEPTH)
        signer = self._require_signer()
        commitment = header_commitment(record_type, epistemic_type, links, stored.get("external", ()))
        envelope = sign_judgment(signer, bytes.fromhex(digest), commitment)
        stored = {**stored, "envelopes": [envelope.to_json()]}
        entry = LedgerEntry(record_id=digest, record_type=record_type, epistemic_type=epistemic_type, body=storage_json(stored), links=links)
        try:
            row = self.ledger.append(entry)
        except DuplicateRecordError:
            raise JudgmentRefusedError(
                f"record {digest[:16]}… is already sealed; a sealed record is never re-sealed or re-typed (supersede it instead)",
                rule="record_already_sealed",
            ) from None
        if record_type == ARTIFACT_RECORD_TYPE:
            return row
        return self._sealed(row)
