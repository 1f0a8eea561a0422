"""Class-1 capsule verifier (-05 §6): rederive everything from the bytes, never raise.

Check numbers, finding codes, severities and their order match the reference
verifier (``agent-action-capsule`` 0.12.0); the conformance and interop tests hold
the two equal. capseal runs this on every capsule before it signs it: an error
finding aborts the seal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._internal.switch import plain_path
from .assurance import derive_cross_party_rung, derive_effect_mode
from .canonical import MAX_SAFE_INTEGER, _Bad, _capsule_id_scanned, _scan, capsule_id, is_hex64
from .errors import FloatInDigestError, UnsafeIntegerError
from .findings import Finding, VerificationResult
from .vocab import (
    APPROVERS,
    ATTESTATION_RANK,
    CANONICALIZATION_ID,
    CROSS_PARTY_RANK,
    DOMAINS,
    EFFECT_MODE_RANK,
    FORMAT_VERSION,
    LEDGER_MODE_RANK,
    NEVER_DISPATCH,
    PROVENANCE_MODES,
    PROVENANCE_VALUES,
    REGISTRIES,
    TIME_RUNGS,
)

__all__ = ["verify", "verify_store", "verify_for_seal", "StoreMembers"]

_REQUIRED = (
    "spec_version", "format_version", "capsule_id", "action_id", "action_type",
    "operator", "developer", "timestamp",
)
_BLOCKS = (
    "effect", "assurance", "disposition", "chain", "cross_party",
    "self_reported_reasoning", "provenance_mode",
)
# String-typed block members, in the order check 1 reports them.
_STRING_MEMBERS = (
    ("disposition", "decision"), ("disposition", "verdict_class"),
    ("effect", "status"), ("effect", "type"), ("effect", "irreversibility_class"),
    ("effect", "effect_attestation"), ("effect", "external_ref"),
    ("chain", "relation"), ("cross_party", "correlator"),
    ("assurance", "effect_mode"), ("assurance", "attestation_mode"),
    ("assurance", "ledger_mode"), ("assurance", "cross_party_rung"),
    ("provenance_mode", "source_asserted_at"), ("provenance_mode", "import_batch"),
    ("provenance_mode", "imported_at"),
)
_REGISTRY_FIELDS = (
    ("verdict_class", "disposition", "verdict_class"),
    ("disposition.decision", "disposition", "decision"),
    ("effect.type", "effect", "type"),
    ("irreversibility_class", "effect", "irreversibility_class"),
    ("effect_attestation", "effect", "effect_attestation"),
    ("chain.relation", "chain", "relation"),
)
#: the plain path (``CAPSEAL_NO_DIRECT=1`` when capseal is imported): the capsule id computed from scratch
_PLAIN_PATH = plain_path()
_RETENTION_STRINGS = ("declarant", "retained_until", "not_retained_after")
_BACKFILL_REQUIRED = ("source_ref", "source_asserted_at", "import_batch", "imported_at")


def _is_map(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def _block(capsule: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    value = capsule.get(key)
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else None


def _bad_numbers(value: Any, path: str, out_float: list[str], out_int: list[str]) -> None:
    """Depth-first, in member order: paths of floats and of unsafe integers."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, float):
        out_float.append(path or "<root>")
    elif isinstance(value, int):
        if value > MAX_SAFE_INTEGER or value < -MAX_SAFE_INTEGER:
            out_int.append(path or "<root>")
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _bad_numbers(v, f"{path}.{k}" if path else str(k), out_float, out_int)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _bad_numbers(v, f"{path}[{i}]", out_float, out_int)


def _retention(retention: Any, path: str) -> list[Finding]:
    if not isinstance(retention, Mapping):
        return [Finding("field_not_object", f"{path} must be an object (§5.5.6)", check=1)]
    out: list[Finding] = []
    for name in _RETENTION_STRINGS:
        value = retention.get(name)
        if name == "declarant" and value is None:
            out.append(Finding("missing_required_field", f"{path}.declarant is required (§5.5.6)", check=1))
        elif name in retention and not isinstance(value, str):
            out.append(Finding("field_not_string", f"{path}.{name} must be a string (§5.5.6)", check=1))
    if "retained_until" not in retention and "not_retained_after" not in retention:
        out.append(Finding("retention_empty", f"{path} needs retained_until or not_retained_after (§5.5.6)", check=1))
    return out


def _references(capsule: Mapping[str, Any], chain: Mapping[str, Any] | None) -> dict[int, list[Finding]]:
    """§5.5.5 findings by check number (1, 6, 8); cited records are never resolved."""
    by_check: dict[int, list[Finding]] = {1: [], 6: [], 8: []}
    if capsule.get("format_version") != FORMAT_VERSION or "references" not in capsule:
        return by_check
    refs = capsule["references"]
    if not isinstance(refs, list):
        by_check[1].append(Finding("references_malformed", "references must be an array (§5.5.5)", check=1))
        return by_check
    parent = chain.get("parent_capsule_id") if chain else None
    for i, ref in enumerate(refs):
        path = f"references[{i}]"
        if not isinstance(ref, Mapping):
            by_check[1].append(Finding("reference_malformed", f"{path} must be an object (§5.5.5)", check=1))
            continue
        for name in ("type", "digest_alg", "digest"):
            value = ref.get(name)
            if not isinstance(value, str) or not value:
                by_check[1].append(Finding("reference_malformed", f"{path}.{name} must be a non-empty string (§5.5.5)", check=1))
        digest = ref.get("digest")
        if ref.get("type") == "agent-action-capsule" and ref.get("digest_alg") == "SHA-256":
            if isinstance(digest, str) and digest and not is_hex64(digest):
                by_check[1].append(Finding("reference_malformed", f"{path}.digest must be a capsule id (§5.5.5)", check=1))
            if isinstance(parent, str) and parent and digest == parent:
                by_check[6].append(Finding("reference_duplicates_chain_parent", f"{path} names the chain parent (§5.5.5)", check=6))
        if "citation_purpose" in ref:
            purpose = ref.get("citation_purpose")
            if not isinstance(purpose, str) or not purpose:
                by_check[1].append(Finding("reference_malformed", f"{path}.citation_purpose must be a non-empty string (§5.5.5)", check=1))
            elif purpose not in REGISTRIES["citation_purpose"]:
                by_check[8].append(Finding("unknown_registry_value", f"{path}.citation_purpose {purpose!r} is not registered; informational (§12)", severity="info", check=8))
        if "retention" in ref:
            by_check[1].extend(_retention(ref["retention"], f"{path}.retention"))
        if "log_coordinates" in ref:
            coords = ref.get("log_coordinates")
            if not isinstance(coords, Mapping):
                by_check[1].append(Finding("reference_log_coordinates_malformed", f"{path}.log_coordinates must be an object (§5.5.5)", check=1))
                continue
            for name in ("log_id", "leaf_index", "inclusion_proof"):
                if coords.get(name) is None:
                    by_check[1].append(Finding("reference_log_coordinates_malformed", f"{path}.log_coordinates needs {name} (§5.5.5)", check=1))
    return by_check


class StoreMembers:
    """The capsule ids of a store known by membership only (a store too large
    to list, e.g. a ledger's): ``verify(capsule, store=StoreMembers(...))``.

    Args:
        contains: whether a capsule id is in the store.
    """

    __slots__ = ("_contains",)

    def __init__(self, contains: Callable[[str], bool]) -> None:
        self._contains = contains

    def __contains__(self, capsule_id: object) -> bool:
        return isinstance(capsule_id, str) and self._contains(capsule_id)


def _store_ids(store: Iterable[Any] | StoreMembers | None) -> set[str] | frozenset[str] | StoreMembers | None:
    if store is None:
        return None
    if isinstance(store, (StoreMembers, set, frozenset)):
        return store  # a set given as is: not copied again for every capsule checked
    ids: set[str] = set()
    for item in store:
        if isinstance(item, Mapping):
            cid = item.get("capsule_id")
            if isinstance(cid, str):
                ids.add(cid)
        elif isinstance(item, str):
            ids.add(item)
    return ids


def verify(capsule: Any, store: Iterable[Any] | StoreMembers | None = None) -> VerificationResult:
    """Class-1 verification of one capsule (a parsed JSON object). Never raises.

    Args:
        capsule: the capsule, as parsed from JSON (any value is accepted).
        store: capsules or capsule ids, or a :class:`StoreMembers`; given, a
            chain parent missing from it is a finding (the store-level parent
            check).

    Returns:
        The findings, ``ok`` when none is an error; an exception inside a
        check becomes a ``verifier_internal_error`` finding.
    """
    findings: list[Finding] = []
    try:
        return _verify(capsule, store, findings)
    except Exception as exc:  # the verifier never throws (§6)
        findings.append(Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}"))
        return VerificationResult(ok=False, findings=findings)


def verify_for_seal(capsule: Mapping[str, Any], computed_id: str) -> VerificationResult:
    """The sealer's self-check: every Class-1 check, except that the id and the
    number rules are taken from the canonicalization the sealer just did on the
    same dict (recomputing them would re-run identical code on identical bytes).

    Args:
        capsule: the canonicalized capsule, ``capsule_id`` included.
        computed_id: the id the sealer computed from its canonical bytes.

    Returns:
        The findings, as :func:`verify`; never raises.
    """
    findings: list[Finding] = []
    try:
        return _verify(capsule, None, findings, computed_id=computed_id)
    except Exception as exc:  # the verifier never throws (§6)
        findings.append(Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}"))
        return VerificationResult(ok=False, findings=findings)


def _check1(capsule: Mapping[str, Any], findings: list[Finding], blocks: dict[str, Any], numbers_checked: bool,
            ) -> tuple[str | None, Any, bool]:
    add = findings.append
    for name in _REQUIRED:
        if name not in capsule:
            add(Finding("missing_required_field", f"{name} is required (§5.1)", check=1))
        elif not isinstance(capsule[name], str):
            add(Finding("field_not_string", f"{name} must be a string (§5.1)", check=1))
    cid = capsule.get("capsule_id")
    carried = cid if is_hex64(cid) else None
    if cid is not None and carried is None:
        add(Finding("capsule_id_malformed", "capsule_id must be 64 lowercase hex (§5.1)", check=1))
    action_type = capsule.get("action_type")
    if action_type is not None and action_type not in ("fyi", "decide"):
        add(Finding("action_type_invalid", "action_type must be 'fyi' or 'decide' (§5.1)", check=1))
    fv = capsule.get("format_version")
    if isinstance(fv, str) and fv != FORMAT_VERSION:
        add(Finding("unsupported_format_version", f"format_version {fv!r} is not supported; expected \"4\" (§2)", check=1))
    elif fv == FORMAT_VERSION:
        if "canonicalization_id" not in capsule:
            add(Finding("canonicalization_id_missing", "format 4 requires canonicalization_id 'jcs' (§2)", check=1))
        elif not isinstance(capsule["canonicalization_id"], str):
            add(Finding("canonicalization_id_not_string", "canonicalization_id must be a string (§2)", check=1))
        elif capsule["canonicalization_id"] != CANONICALIZATION_ID:
            add(Finding("canonicalization_profile_mismatch", "format 4 requires canonicalization_id 'jcs' (§2)", check=1))
    for name in _BLOCKS:
        if name in capsule and not _is_map(capsule[name]):
            add(Finding("block_not_object", f"{name} must be an object when present", check=1))
    for name in ("domain", "provenance"):
        if name in capsule and not isinstance(capsule[name], str):
            add(Finding(f"{name}_not_string", f"{name} must be a string when present", check=1))
    if "constraints" in capsule and not isinstance(capsule["constraints"], list):
        add(Finding("constraints_not_array", "constraints must be an array when present (§8.1)", check=1))
    floats: list[str] = []
    unsafe: list[str] = []
    canonical = False  # every member canonical -05 JSON, no key outside the BMP: the id needs no second walk
    if not numbers_checked:
        try:
            canonical = not _scan(capsule) and type(capsule) is dict and not _PLAIN_PATH
        except _Bad:
            _bad_numbers(capsule, "", floats, unsafe)
    for path in floats:
        add(Finding("float_in_digest_field", f"floating-point value at {path} (§2)", check=1))
    for path in unsafe:
        add(Finding("unsafe_integer_in_digest_field", f"integer outside ±{MAX_SAFE_INTEGER} at {path} (§2)", check=1))
    disposition = blocks["disposition"]
    if disposition is not None:
        approver = disposition.get("approver")
        if approver is None:
            add(Finding("missing_required_field", "disposition.approver is required (§5.5)", check=1))
        elif not isinstance(approver, str):
            add(Finding("field_not_string", "disposition.approver must be a string (§5.5)", check=1))
        elif approver not in APPROVERS:
            add(Finding("approver_invalid", f"disposition.approver must be human|policy|counterparty, not {approver!r} (§5.5)", check=1))
        if "decision" not in disposition:
            add(Finding("missing_required_field", "disposition.decision is required (§5.5)", check=1))
        human = disposition.get("human_disposed")
        if not isinstance(human, bool):
            add(Finding("field_not_bool", "disposition.human_disposed is required and boolean (§5.5)", check=1))
        elif human and approver != "human":
            add(Finding("dishonest_human_disposed", "human_disposed is true but the approver is not human (§5.5)", severity="warning"))
    if "epoch_id" in capsule and not isinstance(capsule["epoch_id"], str):
        add(Finding("field_not_string", "epoch_id must be a string when present (§5.1)", check=1))
    for block_name, member in _STRING_MEMBERS:
        block = blocks[block_name]
        if block is not None and member in block and not isinstance(block[member], str):
            add(Finding("field_not_string", f"{block_name}.{member} must be a string when present", check=1))
    return carried, fv, canonical


def _verify(
    capsule: Any, store: Iterable[Any] | StoreMembers | None, findings: list[Finding], *, computed_id: str | None = None
) -> VerificationResult:
    if not isinstance(capsule, Mapping):
        # a SealedRecord (what seal() returns) is the likeliest: say where its capsule is
        from .record import SealedRecord  # here: importing capseal (and so this module) stays light

        where = "; verify record.capsule" if isinstance(capsule, SealedRecord) else ""
        findings.append(Finding("not_an_object", f"a capsule is a JSON object, not a {type(capsule).__name__}{where}",
                                check=1))
        return VerificationResult(ok=False, findings=findings)
    add = findings.append
    blocks = {name: _block(capsule, name) for name in ("effect", "disposition", "chain", "cross_party", "assurance", "provenance_mode")}
    effect = blocks["effect"]
    disposition = blocks["disposition"]
    chain = blocks["chain"]
    cross_party = blocks["cross_party"]
    refs = _references(capsule, chain)

    # ---- check 1: structure
    carried, fv, canonical = _check1(capsule, findings, blocks, computed_id is not None)
    findings.extend(refs[1])

    # ---- check 2: identity (profile validated first; no id computed otherwise)
    recomputed: str | None = None
    if carried is not None and fv == FORMAT_VERSION and capsule.get("canonicalization_id") == CANONICALIZATION_ID:
        try:
            recomputed = computed_id if computed_id is not None else \
                _capsule_id_scanned(capsule) if canonical else capsule_id(dict(capsule))
        except (FloatInDigestError, UnsafeIntegerError):
            recomputed = None  # already reported by check 1
        except Exception as exc:
            add(Finding("capsule_id_uncomputable", f"{type(exc).__name__}: {exc}", check=2))
        if recomputed is not None and recomputed != carried:
            add(Finding("capsule_id_mismatch", f"recomputed {recomputed} != carried {carried}", check=2))

    # ---- check 3: a confirmed effect is bound to its response
    if effect is not None and effect.get("status") == "confirmed" and not is_hex64(effect.get("response_digest")):
        add(Finding("confirmed_without_response", "status 'confirmed' needs a 64-hex response_digest (§5.3)", check=3))
    effect_mode = derive_effect_mode(effect)

    # ---- check 4: never-dispatch verdicts have no dispatched effect
    verdict = disposition.get("verdict_class") if disposition else None
    if isinstance(verdict, str) and verdict in NEVER_DISPATCH and effect_mode != "not_applicable":
        add(Finding("verdict_effect_conflict", f"verdict_class {verdict!r} never dispatches, but effect_mode is {effect_mode!r} (§5.5.2)", check=4))

    # ---- check 5: effect_attestation matrix (planned carve included)
    attestation = effect.get("effect_attestation") if effect else None
    if effect_mode in ("confirmed", "dispatched_unconfirmed"):
        if attestation is None:
            add(Finding("effect_attestation_missing", f"effect_attestation is required for effect_mode {effect_mode!r} (§5.3)", check=5))
    elif attestation is not None:
        add(Finding("effect_attestation_present", "effect_attestation must be absent for effect_mode 'not_applicable' (§5.3)", check=5))

    # ---- check 6: chain
    if chain is not None:
        parent = chain.get("parent_capsule_id")
        if not is_hex64(parent):
            add(Finding("chain_parent_malformed", "chain.parent_capsule_id must be a 64-hex capsule id (§5.5.4)", check=6))
        if "relation" not in chain:
            add(Finding("missing_required_field", "chain.relation is required with a chain block (§5.5.4)", check=6))
        ids = _store_ids(store)
        if ids is None:
            add(Finding("chain_check_store_level", "parent existence and concurrent supersedes are store-level checks; no store given (§6)", severity="info", check=6))
        elif isinstance(parent, str) and parent not in ids:
            add(Finding("chain_parent_missing", f"chain parent {parent} is not in the store (§6)", check=6))
    findings.extend(refs[6])

    # ---- check 7: assurance rederived; overclaims reported
    derived: dict[str, str] = {
        "effect_mode": effect_mode,
        "attestation_mode": "self_attested",
        "ledger_mode": "chained" if chain is not None else "standalone",
    }
    rung = derive_cross_party_rung(cross_party)
    if cross_party is not None and rung is not None:
        derived["cross_party_rung"] = rung
    stated = capsule.get("assurance")
    if isinstance(stated, Mapping):
        _overclaims(stated, derived, rung, findings)

    # ---- check 8: unregistered values are informational
    for registry, block_name, member in _REGISTRY_FIELDS:
        block = blocks[block_name]
        value = block.get(member) if block is not None else None
        if not isinstance(value, str) or value in REGISTRIES[registry]:
            continue
        add(Finding("unknown_registry_value", f"{block_name}.{member}={value!r} is not a registered {registry} value; informational (§12)", severity="info", check=8))
        if registry == "effect_attestation":
            add(Finding("effect_attestation_graded_floor", "an unknown effect_attestation ranks no higher than 'runtime_claimed' (§5.3)", severity="info", check=8))
    findings.extend(refs[8])

    # ---- check 9: provenance_mode
    _provenance_mode(capsule, blocks["provenance_mode"], derived, findings)

    # ---- domain / provenance seeded values (informational, not a §6 check)
    domain = capsule.get("domain")
    if isinstance(domain, str) and domain not in DOMAINS and not domain.startswith("x-"):
        add(Finding("domain_unknown_value", f"domain={domain!r} is not a seeded value; informational", severity="info"))
    provenance = capsule.get("provenance")
    if isinstance(provenance, str) and provenance not in PROVENANCE_VALUES and not provenance.startswith("x-"):
        add(Finding("provenance_unknown_value", f"provenance={provenance!r} is not a seeded value; informational", severity="info"))

    ok = not any(f.severity == "error" for f in findings)
    return VerificationResult(ok=ok, findings=findings, derived=derived, capsule_id=recomputed)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _overclaims(stated: Mapping[str, Any], derived: dict[str, str], rung: str | None, findings: list[Finding]) -> None:
    add = findings.append
    claimed = _text(stated.get("effect_mode"))
    if claimed in EFFECT_MODE_RANK and EFFECT_MODE_RANK[claimed] > EFFECT_MODE_RANK[derived["effect_mode"]]:
        add(Finding("assurance_overclaim", f"claimed effect_mode {claimed!r}, derived {derived['effect_mode']!r} (§5.4)", check=7))
    claimed = _text(stated.get("attestation_mode"))
    if claimed in ATTESTATION_RANK and ATTESTATION_RANK[claimed] > 0:
        add(Finding("assurance_overclaim", f"claimed attestation_mode {claimed!r}; no Receipt verified at this layer (§5.4)", severity="info", check=7))
    claimed = _text(stated.get("ledger_mode"))
    if claimed in LEDGER_MODE_RANK and LEDGER_MODE_RANK[claimed] > LEDGER_MODE_RANK[derived["ledger_mode"]]:
        add(Finding("assurance_overclaim", f"claimed ledger_mode {claimed!r}, derived {derived['ledger_mode']!r} (§5.4)", severity="info", check=7))
    claimed = _text(stated.get("cross_party_rung"))
    have = CROSS_PARTY_RANK.get(rung, 0) if rung is not None else 0
    if claimed in CROSS_PARTY_RANK and CROSS_PARTY_RANK[claimed] > have:
        add(Finding("assurance_overclaim", f"claimed cross_party_rung {claimed!r}, derived {rung!r} (§5.4.1)", severity="info", check=7))


def _provenance_mode(capsule: Mapping[str, Any], pm: Mapping[str, Any] | None, derived: dict[str, str], findings: list[Finding]) -> None:
    add = findings.append
    if pm is None:
        return
    mode = pm.get("mode")
    if not isinstance(mode, str) or mode not in PROVENANCE_MODES:
        add(Finding("provenance_mode_invalid", f"provenance_mode.mode must be one of {sorted(PROVENANCE_MODES)}, not {mode!r} (§5.4.3)", check=9))
    else:
        derived["provenance_mode"] = mode
    if mode == "backfilled":
        for name in _BACKFILL_REQUIRED:
            if name not in pm or pm.get(name) in (None, ""):
                add(Finding("provenance_mode_missing_required_field", f"provenance_mode.{name} is required when backfilled (§5.4.3)", check=9))
        source_ref = pm.get("source_ref")
        if isinstance(source_ref, Mapping):
            for name in ("type", "digest_alg", "digest"):
                value = source_ref.get(name)
                if not isinstance(value, str) or not value:
                    add(Finding("provenance_mode_source_ref_malformed", f"provenance_mode.source_ref.{name} must be a non-empty string (§5.4.3)", check=9))
        elif "source_ref" in pm:
            add(Finding("provenance_mode_source_ref_malformed", "provenance_mode.source_ref must be an object (§5.4.3)", check=9))
        imported_at, asserted_at = pm.get("imported_at"), pm.get("source_asserted_at")
        if isinstance(imported_at, str) and isinstance(asserted_at, str) and imported_at == asserted_at:
            add(Finding("provenance_time_laundering_shape", "imported_at equals source_asserted_at on a backfilled record (§5.4.3)", check=9))
        time_rung = pm.get("time_rung")
        if time_rung is not None and (not isinstance(time_rung, str) or time_rung not in TIME_RUNGS):
            add(Finding("provenance_mode_invalid", f"provenance_mode.time_rung must be one of {sorted(TIME_RUNGS)}, not {time_rung!r} (§5.4.3)", check=9))
            time_rung = None
        witnessed = _has_time_corroboration(capsule.get("references"))
        if time_rung == "witnessed" and not witnessed:
            add(Finding("provenance_time_rung_overclaim", "time_rung 'witnessed' without a corroborates_source_time reference (§5.4.3)", check=9))
        derived["provenance_time_rung"] = "witnessed" if witnessed else "self_attested"
    elif mode == "contemporaneous":
        orphans = [
            name for name in (*_BACKFILL_REQUIRED, "time_rung")
            if name in pm and pm.get(name) is not None
        ]
        if orphans:
            add(Finding("provenance_mode_invalid", f"provenance_mode fields {orphans} only apply when backfilled (§5.4.3)", check=9))


def _has_time_corroboration(refs: Any) -> bool:
    if not isinstance(refs, list):
        return False
    for ref in refs:
        if (
            isinstance(ref, Mapping)
            and ref.get("citation_purpose") == "corroborates_source_time"
            and all(isinstance(ref.get(k), str) and ref.get(k) for k in ("type", "digest_alg", "digest"))
        ):
            return True
    return False


def verify_store(capsules: list[Any]) -> list[VerificationResult]:
    """Verify capsules in ledger order with the store-level chain checks (§6):
    parent existence, concurrent supersedes (the earliest wins) and the
    ``duplicates`` collapse. Never raises.

    Args:
        capsules: the capsules, as parsed from JSON, in ledger order.

    Returns:
        One result per capsule, in order; an exception in the store-level
        checks adds one more result holding a ``verifier_internal_error``.
    """
    ids = _store_ids(capsules) or set()
    results = [verify(c, store=ids) for c in capsules]
    try:
        _store_level(capsules, results)
    except Exception as exc:  # never throw
        results.append(VerificationResult(ok=False, findings=[Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}")]))
    return results


def _store_level(capsules: list[Any], results: list[VerificationResult]) -> None:
    seen_superseded: set[str] = set()
    by_id = {
        c["capsule_id"]: c for c in capsules
        if isinstance(c, Mapping) and isinstance(c.get("capsule_id"), str)
    }
    for capsule, result in zip(capsules, results):
        chain = _block(capsule, "chain") if isinstance(capsule, Mapping) else None
        if chain is None or not isinstance(chain.get("parent_capsule_id"), str):
            continue
        parent = chain["parent_capsule_id"]
        if chain.get("relation") == "supersedes":
            if parent in seen_superseded:
                result.findings.append(Finding("concurrent_supersedes", f"a later supersedes over {parent}; the earliest is authoritative (§5.5.4)", severity="info", check=6))
            else:
                seen_superseded.add(parent)
    for capsule, result in zip(capsules, results):
        chain = _block(capsule, "chain") if isinstance(capsule, Mapping) else None
        if chain is None or chain.get("relation") != "duplicates" or not isinstance(chain.get("parent_capsule_id"), str):
            continue
        parent_id = chain["parent_capsule_id"]
        result.findings.append(Finding("duplicate_collapsed", f"'duplicates' over {parent_id}: count the pair once, the contemporaneous parent governing (§5.4.3)", severity="info", check=9))
        parent = by_id.get(parent_id)
        pm = _block(parent, "provenance_mode") if isinstance(parent, Mapping) else None
        if pm is not None and pm.get("mode") == "backfilled":
            result.findings.append(Finding("duplicate_parent_not_contemporaneous", f"'duplicates' parent {parent_id} is itself backfilled (§5.4.3)", severity="info", check=9))
