"""Typed, strict model of a -05 capsule (pydantic v2), the producer's gate.

Why a model *and* a verifier: the verifier (``verify.py``) reads arbitrary bytes
and reports; this model refuses, before anything is signed, every capsule a
conforming producer MUST NOT emit — including rules the Class-1 checks leave to
the producer (the status/digest table, honest ``human_disposed``, namespaced
extensions, registered chain relations, no ``null`` standing in for "absent").

Conventions:
  * strict mode: no silent coercion (``"1"`` is not ``1``, ``1`` is not ``True``);
  * ``null``, ``{}`` and ``[]`` are refused where they would mean "none": leave
    the member out (-05 §5.5.6: absent is missing information, an empty value is
    a claim that is hashed into the id);
  * the model validates a plain ``dict``; capseal hashes that dict, never a
    re-serialization, so extension members are hashed exactly as given.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

from .assurance import derive_effect_mode
from .errors import CapsuleValidationError
from .vocab import (
    CHAIN_RELATIONS,
    CITATION_PURPOSES,
    EFFECT_ATTESTATIONS,
    PRODUCER_NEVER_DISPATCH,
    REGISTRIES,
    SPEC_VERSION,
)

__all__ = [
    "Hex64",
    "Timestamp",
    "Effect",
    "ExpiryPolicy",
    "Disposition",
    "Chain",
    "Retention",
    "LogCoordinates",
    "Reference",
    "TypedRef",
    "CrossParty",
    "ProvenanceMode",
    "Constraint",
    "ModelAttestation",
    "SelfReportedReasoning",
    "Assurance",
    "Compliance",
    "Capsule",
    "validate_capsule",
    "is_namespaced",
    "check_timestamp",
]

_TS = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$")  # [0-9]: \d takes any script's digits


def check_timestamp(value: str) -> str:
    """Is ``value`` an RFC 3339 UTC timestamp as -05 writes them (``Z``, an
    optional fraction of up to nine digits, a real calendar date)?

    Args:
        value: the text.

    Returns:
        ``value`` unchanged.

    Raises:
        ValueError: it is not one (the message says why, without the value).
        TypeError: it is not a str.
    """
    if not _TS.fullmatch(value):  # not match: "$" also matches before a final newline
        raise ValueError("must be an RFC 3339 UTC timestamp ending in 'Z', e.g. 2026-10-01T12:00:00Z")
    leap = value[17:19] == "60"  # RFC 3339 §5.7: a leap second, the last second of a UTC day
    if leap and value[11:16] != "23:59":
        raise ValueError("has second 60 away from 23:59 (a leap second ends a UTC day)")
    try:
        datetime.fromisoformat(value[:17] + "59" if leap else value[:19])  # datetime knows no second 60
    except ValueError:
        raise ValueError("is not a valid calendar date/time") from None
    return value


_NAMESPACED_RE = r"^(x-.+|[^:]+:.+|[A-Za-z0-9-]+(\.[A-Za-z0-9_-]+)+)$"
_is_namespaced = re.compile(_NAMESPACED_RE).fullmatch  # as pydantic's pattern: no final newline
Namespaced = Annotated[str, StringConstraints(pattern=_NAMESPACED_RE)]


def is_namespaced(value: str) -> bool:
    """-05 §9.1: new identifiers carry a URI or reverse-DNS prefix (or ``x-``).

    Args:
        value: the identifier.

    Returns:
        Whether it is namespaced.
    """
    return _is_namespaced(value) is not None


# Registry values as native Literal types (validated in Rust, no Python call per
# field); tests/test_vocab.py holds them equal to ``vocab.REGISTRIES``. Where a
# registry admits new values, a namespaced one (x-…, com.example.…, urn:…) passes.
EffectType = Literal["inference_completion", "send_payment", "write_order"] | Namespaced
Irreversibility = Literal["one_way_consequential", "one_way_recoverable", "one_way_terminal", "two_way"]
EffectAttestation = Literal["gate_executed", "host_served_observed", "runtime_claimed"]
Decision = Literal["accept", "deferred", "needs_input", "reject"]
VerdictClass = (
    Literal["blocked", "deferred", "denied", "engine_failure", "epoch_boundary", "errored", "escalated", "executed",
            "expired", "hitl_dispatched", "needs_decision", "resolved", "timeout"]
    | Namespaced
)
Relation = Literal["confirms", "duplicates", "epoch_opens", "follows", "supersedes"]
CitationPurpose = (
    Literal["acted_on", "corroborates_source_time", "counterparty_half", "counterparty_inclusion", "ran_under", "responds_to"]
    | Literal["judged_from", "calibrated_against"]  # pending registration (vocab.PENDING)
    | Namespaced
)


Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Timestamp = Annotated[str, AfterValidator(check_timestamp)]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]
SafeInt = Annotated[int, Field(ge=-(2**53 - 1), le=2**53 - 1)]


class _Block(BaseModel):
    """Common strictness for every block.

    Optional members are typed without ``None`` and default to ``None``: pydantic
    does not validate defaults, so an absent member is fine while an explicit
    ``null`` fails the strict type check ("absent" and ``null`` are different
    capsules). Containers carry ``min_length=1`` so ``[]``/``{}`` cannot stand
    in for "none" either.
    """

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Effect(_Block):
    """§5.3 Effect Record, with the status/digest/attestation table enforced."""

    status: Literal["planned", "dispatched", "confirmed", "failed", "reverted"]
    type: EffectType = None  # type: ignore[assignment]
    request_digest: Hex64 = None  # type: ignore[assignment]
    response_digest: Hex64 = None  # type: ignore[assignment]
    external_ref: NonEmpty = None  # type: ignore[assignment]
    irreversibility_class: Irreversibility = None  # type: ignore[assignment]
    effect_attestation: EffectAttestation = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _table(self) -> Effect:
        s = self.status
        if s == "planned":
            if self.request_digest or self.response_digest:
                raise ValueError("a planned effect carries no request_digest or response_digest (§5.3)")
            if self.effect_attestation:
                raise ValueError("a planned effect carries no effect_attestation (the planned carve, §5.3)")
            return self
        if s == "dispatched" and self.response_digest:
            raise ValueError("a dispatched effect has no response_digest yet (§5.3)")
        if s == "confirmed" and not self.response_digest:
            raise ValueError("a confirmed effect needs response_digest over the response actually received (§5.3)")
        if not self.effect_attestation:
            raise ValueError(f"effect_attestation is required once an effect is {s} (§5.3); one of {sorted(EFFECT_ATTESTATIONS)}")
        return self


class ExpiryPolicy(_Block):
    ttl_seconds: Annotated[int, Field(ge=0, le=2**53 - 1)]
    on_expiry: Literal["expired", "escalated"]


class Disposition(_Block):
    """§5.5 disposition: closed approver set, honest human_disposed."""

    decision: Decision
    approver: Literal["human", "policy", "counterparty"]
    human_disposed: bool
    authority: NonEmpty = None  # type: ignore[assignment]
    verdict_class: VerdictClass = None  # type: ignore[assignment]
    reason_digest: Hex64 = None  # type: ignore[assignment]
    expiry_policy: ExpiryPolicy = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _honest(self) -> Disposition:
        if self.human_disposed and self.approver != "human":
            raise ValueError(f"human_disposed is true only when a human acted; approver is {self.approver!r} (§5.5)")
        if self.expiry_policy is not None and "deferred" not in (self.decision, self.verdict_class):
            raise ValueError("expiry_policy belongs to deferrals only (§5.5)")
        return self


class Chain(_Block):
    """§5.5.4: exactly one parent; producers emit registered relations only."""

    parent_capsule_id: Hex64
    relation: Relation


class Retention(_Block):
    declarant: NonEmpty
    retained_until: Timestamp = None  # type: ignore[assignment]
    not_retained_after: Timestamp = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _bound(self) -> Retention:
        if self.retained_until is None and self.not_retained_after is None:
            raise ValueError("retention needs retained_until or not_retained_after (§5.5.6)")
        return self


class LogCoordinates(_Block):
    log_id: NonEmpty
    leaf_index: Annotated[int, Field(ge=0, le=2**53 - 1)]
    inclusion_proof: Annotated[list[Hex64], Field(min_length=1)] | NonEmpty


class TypedRef(_Block):
    """CPB typed digest reference ``{type, digest_alg, digest}``."""

    type: NonEmpty
    digest_alg: NonEmpty
    digest: NonEmpty


class Reference(_Block):
    """§5.5.5 identity reference, optionally with purpose, retention, log coordinates
    and namespaced extra members."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    type: NonEmpty
    digest_alg: NonEmpty
    digest: NonEmpty
    citation_purpose: CitationPurpose = None  # type: ignore[assignment]
    retention: Retention = None  # type: ignore[assignment]
    log_coordinates: LogCoordinates = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _shape(self) -> Reference:
        for key in self.__pydantic_extra__ or {}:
            if not is_namespaced(key):
                raise ValueError(f"extra reference member {key!r} must be namespaced")
        if self.type == "agent-action-capsule" and self.digest_alg == "SHA-256" and not re.fullmatch(r"[0-9a-f]{64}", self.digest):
            raise ValueError("a capsule reference's digest is a 64-hex capsule id")
        return self


class CrossParty(_Block):
    """§5.4.1: the rung is derived from these bytes alone."""

    initiator_ref: Hex64
    counterparty_ref: Hex64 = None  # type: ignore[assignment]
    correlator: NonEmpty = None  # type: ignore[assignment]
    substantive: bool = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _correlated(self) -> CrossParty:
        if self.counterparty_ref is not None and self.correlator is None:
            raise ValueError("correlator is required with counterparty_ref (§5.4.1)")
        if self.substantive and self.counterparty_ref is None:
            raise ValueError("substantive is true only for a co-signed result with counterparty_ref (§5.4.1)")
        return self


class ProvenanceMode(_Block):
    mode: Literal["contemporaneous", "backfilled"]
    source_ref: TypedRef = None  # type: ignore[assignment]
    source_asserted_at: Timestamp = None  # type: ignore[assignment]
    import_batch: NonEmpty = None  # type: ignore[assignment]
    imported_at: Timestamp = None  # type: ignore[assignment]
    time_rung: Literal["self_attested", "witnessed"] = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _complete(self) -> ProvenanceMode:
        fields = (self.source_ref, self.source_asserted_at, self.import_batch, self.imported_at)
        if self.mode == "backfilled":
            if any(f is None for f in fields):
                raise ValueError("a backfilled record needs source_ref, source_asserted_at, import_batch and imported_at (§5.4.3)")
            if self.imported_at == self.source_asserted_at:
                raise ValueError("imported_at equal to source_asserted_at is the laundering shape (§5.4.3)")
        elif any(f is not None for f in fields) or self.time_rung is not None:
            raise ValueError("source fields and time_rung apply only when mode is backfilled (§5.4.3)")
        return self


class Constraint(_Block):
    """§8.1 constraint result; the evaluated content enters only as a digest."""

    id: Namespaced
    check_type: Namespaced = None  # type: ignore[assignment]
    method: NonEmpty = None  # type: ignore[assignment]
    result: Literal["pass", "fail", "n/a"]
    severity: NonEmpty
    blocking: bool
    evidence_digest: Hex64 = None  # type: ignore[assignment]


JSONScalar = str | int | bool
JSONValue = Any  # nested values are checked by the canonical walk (no floats)


class ModelAttestation(_Block):
    model_id: NonEmpty = None  # type: ignore[assignment]
    provider: NonEmpty = None  # type: ignore[assignment]
    compute_attestation: Annotated[dict[str, JSONValue], Field(min_length=1)] = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _pair(self) -> ModelAttestation:
        if (self.model_id is None) != (self.provider is None):
            raise ValueError("model_id and provider appear together or not at all")
        if self.model_id is None and self.compute_attestation is None:
            raise ValueError("model_attestation needs model_id/provider or compute_attestation")
        return self


class SelfReportedReasoning(_Block):
    digest: Hex64


class Assurance(_Block):
    attestation_mode: Literal["self_attested", "anchored"]
    effect_mode: Literal["not_applicable", "dispatched_unconfirmed", "confirmed"]
    ledger_mode: Literal["standalone", "chained", "anchored"]
    cross_party_rung: Literal["unilateral_fallback", "acknowledged_receipt", "full_bilateral"] = None  # type: ignore[assignment]


class Compliance(_Block):
    framework_tags: Annotated[list[Namespaced], Field(min_length=1)]


class Capsule(_Block):
    """A complete -05 capsule as capseal will seal it (``capsule_id`` optional:
    it is computed by the sealer)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    spec_version: Literal["draft-mih-scitt-agent-action-capsule-05"]
    format_version: Literal["4"]
    canonicalization_id: Literal["jcs"]
    capsule_id: Hex64 = None  # type: ignore[assignment]
    action_id: NonEmpty
    action_type: Literal["fyi", "decide"]
    operator: NonEmpty
    developer: NonEmpty
    timestamp: Timestamp
    epoch_id: NonEmpty = None  # type: ignore[assignment]
    domain: Annotated[str, AfterValidator(lambda v: _domain(v))] = None  # type: ignore[assignment]
    provenance: Literal["gate", "runtime", "collector"] = None  # type: ignore[assignment]
    provenance_mode: ProvenanceMode = None  # type: ignore[assignment]
    effect: Effect = None  # type: ignore[assignment]
    assurance: Assurance = None  # type: ignore[assignment]
    disposition: Disposition = None  # type: ignore[assignment]
    chain: Chain = None  # type: ignore[assignment]
    cross_party: CrossParty = None  # type: ignore[assignment]
    constraints: Annotated[list[Constraint], Field(min_length=1)] = None  # type: ignore[assignment]
    references: Annotated[list[Reference], Field(min_length=1)] = None  # type: ignore[assignment]
    model_attestation: ModelAttestation = None  # type: ignore[assignment]
    self_reported_reasoning: SelfReportedReasoning = None  # type: ignore[assignment]
    compliance: Compliance = None  # type: ignore[assignment]

    @model_validator(mode="after")
    def _cross_block(self) -> Capsule:
        for key in self.__pydantic_extra__ or {}:
            if key in ("_sd", "_sd_alg"):
                raise ValueError(f"{key} is reserved for selective disclosure (§9.2); capseal does not generate it")
            if key in ("signature", "key_id"):
                raise ValueError(f"{key} is written by the sealer, not the caller")
            if not is_namespaced(key):
                raise ValueError(f"unknown member {key!r}: extension members must be namespaced (x-…, com.example.…, urn:…)")
            value = (self.__pydantic_extra__ or {})[key]
            if value is None or (isinstance(value, (dict, list)) and not value):
                raise ValueError(f"{key}: null or an empty value is hashed as a claim; leave the member out")
        verdict = self.disposition.verdict_class if self.disposition else None
        dispatched = self.effect is not None and self.effect.status != "planned"
        if verdict in PRODUCER_NEVER_DISPATCH and dispatched:
            raise ValueError(f"verdict_class {verdict!r} never dispatches; the effect must be absent or planned (§5.5.2)")
        # errored pairs with dispatched_unconfirmed (§5.5.2): the mode assurance derives, not a second copy of its rule
        if verdict == "errored" and derive_effect_mode(
                None if self.effect is None else {"status": self.effect.status, "response_digest": self.effect.response_digest}
        ) != "dispatched_unconfirmed":
            raise ValueError("verdict_class 'errored' pairs with a dispatched, unconfirmed effect (effect_mode "
                             "dispatched_unconfirmed, §5.5.2)")
        if verdict == "epoch_boundary" and self.action_type != "fyi":
            raise ValueError("an epoch-boundary capsule is action_type 'fyi' (§5.2)")
        parent = self.chain.parent_capsule_id if self.chain else None
        has_corroboration = False
        for i, ref in enumerate(self.references or ()):
            if parent is not None and ref.digest == parent and ref.digest_alg == "SHA-256":
                raise ValueError(f"references[{i}] names the chain parent; a reference must not (§5.5.5)")
            if ref.citation_purpose == "corroborates_source_time":
                has_corroboration = True
        pm = self.provenance_mode
        if pm is not None and pm.time_rung == "witnessed" and not has_corroboration:
            raise ValueError("time_rung 'witnessed' needs a corroborates_source_time reference (§5.4.3)")
        return self


def _domain(value: str) -> str:
    if value in ("action", "memory", "reasoning") or value.startswith("x-"):
        return value
    raise ValueError(f"domain {value!r} is not action|memory|reasoning or an x- value")


def _json_path(loc: tuple[int | str, ...]) -> str:
    path = "$"
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part in ("str", "int", "bool", "list", "dict", "function-after", "constrained-str") or part.startswith(("function-", "literal[", "nullable[")):
            continue
        else:
            path += f".{part}"
    return path


def validate_capsule(capsule: dict[str, Any]) -> Capsule:
    """Validate a capsule dict against the producer model.

    Args:
        capsule: the capsule, as parsed from JSON.

    Returns:
        The typed capsule.

    Raises:
        CapsuleValidationError: every broken rule, each with its JSON path.
    """
    try:
        return Capsule.model_validate(capsule)
    except ValidationError as exc:
        errors = []
        for err in exc.errors(include_url=False):
            msg = err["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, "):]
            errors.append((_json_path(tuple(err["loc"])), msg))
        raise CapsuleValidationError(_collapse_type_errors(errors, capsule), hint=_hint(capsule)) from None


_PLAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*").fullmatch


def _unregistered_effect_type(capsule: dict[str, Any]) -> str | None:
    """The effect type if it is neither registered nor namespaced (a plain name), else None."""
    effect = capsule.get("effect")
    value = effect.get("type") if isinstance(effect, dict) else None
    if isinstance(value, str) and value not in REGISTRIES["effect.type"] and not is_namespaced(value) and _PLAIN_NAME(value):
        return value
    return None


def _collapse_type_errors(errors: list[tuple[str, str]], capsule: dict[str, Any]) -> list[tuple[str, str]]:
    """One message for an unregistered effect type, naming the namespaced form
    to use, in place of pydantic's two (the registry, then the pattern)."""
    value = _unregistered_effect_type(capsule)
    if value is None:
        return errors
    said = f"{value!r} is not a registered effect type ({', '.join(sorted(REGISTRIES['effect.type']))}); an extension type " \
           f"is namespaced, e.g. 'x-{value.replace('_', '-')}'"
    kept = [(p, m) for p, m in errors if p != "$.effect.type"]
    return [("$.effect.type", said), *kept]


def _hint(capsule: dict[str, Any]) -> str | None:
    value = _unregistered_effect_type(capsule)
    if value is None:
        return None
    return (f"use effect_type='x-{value.replace('_', '-')}': an effect type outside the registry is namespaced "
            "(x-…, reverse DNS or a URI; -05 §9.1)")


# re-exported for builders
_ = (CHAIN_RELATIONS, CITATION_PURPOSES, SPEC_VERSION)
