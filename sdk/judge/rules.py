"""The refusal engine: every rule a judgment record must keep, each with a name.

Run before anything is sealed (``refuse``) and by the verifier (``check_body``,
which never raises). It applies, in order:

1. the -05 number rules to the whole body (no floats, no unsafe integers):
   a float under ``sampling`` is ``sampling_float`` (use ``pin.decimal_string`` or
   ``pin.micros``), elsewhere ``float_in_record``;
2. the shipped JSON Schema of the body's shape, interpreted at run time
   (``schema.py``), with each failed keyword turned into a named rule
   (schema path → rule); unnamed failures keep a generic ``schema_*`` name;
3. the rules the schemas cannot say:
   k ≤ n, unique case / claim ids, buckets that match verdicts, coverage counts
   traceable to claims, producer defects within their denominator, an
   adjudication's margin / margin_tau / divergence_index as decimal strings, a
   ``contradicted_party`` that is one of the parties, a rebuttal ``basis`` and a
   judge's ``model_id`` that say something (not whitespace only), an opaque ``rater_ref``,
   close refs that appear in ``evidence[]``, links only of the six types and
   ``adjudicates`` only on an ``adjudication`` record.

Why names: a caller (and a test) must be able to tell *which* rule a record
broke without parsing prose. The name is ``JudgmentRefusedError.rule`` and the
verifier's finding ``code``.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from capseal.canonical import MAX_DEPTH, check_json, check_structure, is_hex64
from capseal.errors import CanonicalizationError, FloatInDigestError, JudgmentRefusedError, UnsafeIntegerError

from ._rule_names import SCORE_MEMBER, rule_name
from .schema import Path, render_path, render_pointer, validator_for
from .vocab import EPISTEMIC_TYPES, LINK_TYPES, RESULT_SCHEMA, RESULT_VERSION, SHAPES

__all__ = [
    "Violation",
    "check_body",
    "refuse",
    "check_links",
    "raise_first",
    "epistemic_type_of",
    "schema_violations",
    "json_violations",
    "is_json",
    "SCORE_MEMBER",
]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Violation:
    """One broken rule. ``rule`` is stable; ``path`` is a JSONPath into the body."""

    rule: str
    path: str
    message: str
    severity: Severity = "error"
    pointer: str = ""

    def __str__(self) -> str:
        return f"{self.rule}: {self.message} (at {self.path})"


def raise_first(violations: Sequence[Violation], what: str = "judgment record") -> None:
    """Refuse on the first error-severity violation, if any.

    Args:
        violations: what a check found.
        what: what was checked (the message's start).

    Raises:
        JudgmentRefusedError: named by the first error's rule and path; the
            message counts the others.
    """
    errors = [v for v in violations if v.severity == "error"]
    if not errors:
        return
    first = errors[0]
    more = f" (+{len(errors) - 1} more: {', '.join(sorted({v.rule for v in errors[1:]}))})" if len(errors) > 1 else ""
    raise JudgmentRefusedError(f"{what} refused: {first.message}{more}", rule=first.rule, path=first.path)


def _at(body: Any, path: Path) -> Any:
    node = body
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def schema_violations(body: Any, schema: str, definition: str | None = None) -> list[Violation]:
    """Every failed keyword of a shipped schema, each as a named rule.

    Args:
        body: a JSON value (the number rules already passed: a non-JSON value
            is :func:`json_violations`' to report).
        schema: the schema's path under ``capseal/judge/schemas``.
        definition: one of its ``$defs`` to check against instead of the root.

    Returns:
        The violations, in schema order, each with its JSONPath and pointer.

    Raises:
        FileNotFoundError: no such schema ships.
        KeyError: no such definition.
    """
    out = []
    for err in validator_for(schema, definition).errors(body):
        at = _at(body, err.path)
        full = (*err.path, err.member) if err.keyword in ("required", "additionalProperties", "not") and err.member else err.path
        out.append(Violation(rule_name(err, at), render_path(full), err.message, pointer=render_pointer(full)))
    return out


def _ordered(violations: list[Violation]) -> list[Violation]:
    """Named rules first (they say what to fix), then the number rules, then the
    generic ``schema_*`` ones; order is kept within each group."""

    def rank(v: Violation) -> int:
        if v.rule.startswith("schema_"):
            return 2
        return 1 if v.rule in ("float_in_record", "unsafe_integer", "non_json_value") else 0

    return sorted(violations, key=rank)


def _number_violations(body: Any) -> list[Violation]:
    """The -05 number and JSON rules, nesting capped at ``MAX_DEPTH`` (the most
    the store writes): a non-JSON value, a non-string key or deeper nesting is
    ``non_json_value`` at its path, so no later check recurses into it."""
    try:
        check_json(body, max_depth=MAX_DEPTH)
    except FloatInDigestError as exc:
        rule = "sampling_float" if re.search(r"\.sampling(_params)?[.\[]", exc.path + ".") else "float_in_record"
        return [Violation(rule, exc.path, f"{exc} — a float drifts in serialization; use a decimal string or an integer (e.g. micros)")]
    except UnsafeIntegerError as exc:
        return [Violation("unsafe_integer", exc.path, str(exc))]
    except CanonicalizationError as exc:
        return [Violation("non_json_value", exc.path, str(exc))]
    return []


def json_violations(body: Any) -> list[Violation]:
    """The -05 number and JSON rules over ``body``. Never raises.

    It gives the first number problem, plus the first thing that is not JSON at
    all when the number rules stopped before it (``check_json`` stops at its
    first problem, and a non-string key behind a float would otherwise reach
    the schema walk).

    Args:
        body: any value.

    Returns:
        The violations (``float_in_record``/``sampling_float``,
        ``unsafe_integer``, ``non_json_value``). A caller that finds a
        ``non_json_value`` runs no schema walk or digest over ``body``.
    """
    out = _number_violations(body)
    if out and is_json(out):
        try:
            check_structure(body, max_depth=MAX_DEPTH)
        except CanonicalizationError as exc:
            out.append(Violation("non_json_value", exc.path, str(exc)))
    return out


def is_json(violations: Sequence[Violation]) -> bool:
    """Did the number rules find ``body`` to be JSON throughout?

    Args:
        violations: what :func:`json_violations` returned.

    Returns:
        False when one is ``non_json_value``.
    """
    return not any(v.rule == "non_json_value" for v in violations)


# --------------------------------------------------------------------------- body dispatch


def epistemic_type_of(body: Mapping[str, Any]) -> str | None:
    """The epistemic type a body's *shape* fixes.

    Judge-family shapes fix it as a schema ``const``. An Evidence Result has no
    such member: it is ``derived_metric`` when every claim was recomputed (a
    fixed function of cited inputs) and ``semantic_judgment`` as soon as one
    claim was judged — the weaker way of knowing decides, never the stronger.

    Args:
        body: a record body.

    Returns:
        The type, or None when the shape is unknown (or ``body`` is no mapping).
    """
    if not isinstance(body, Mapping):
        return None
    version = body.get("record_version")
    if isinstance(version, str) and version in SHAPES:
        return SHAPES[version].epistemic_type
    if body.get("result_version") == RESULT_VERSION:
        claims = body.get("claims")
        if isinstance(claims, list) and claims and all(isinstance(c, Mapping) and c.get("tier") == "recomputed" for c in claims):
            return "derived_metric"
        return "semantic_judgment"
    return None


def check_body(body: Any) -> list[Violation]:
    """Every violation of a judge-family body or an Evidence Result. Never raises.

    Args:
        body: the body.

    Returns:
        The violations: named rules first, then the number rules, then the
        generic ``schema_*`` ones (``checker_internal_error`` if the check
        itself failed).
    """
    try:
        return _check_body(body)
    except Exception as exc:  # a checker never raises
        return [Violation("checker_internal_error", "$", f"{type(exc).__name__}: {exc}")]


def refuse(body: Any) -> None:
    """Refuse a body that breaks a rule.

    Args:
        body: the body.

    Raises:
        JudgmentRefusedError: named by the first rule it breaks.
    """
    raise_first(check_body(body))


def _check_body(body: Any) -> list[Violation]:
    if not isinstance(body, Mapping):
        return [Violation("record_not_object", "$", "a judgment record is a JSON object")]
    out = json_violations(body)
    if not is_json(out):
        # not JSON (a non-string key, a non-JSON value, nesting deeper than the
        # store writes): the schema walk would fail on it, so this is the answer
        return out
    if "result_version" in body and "record_version" not in body:
        out += _vocabulary_first(schema_violations(body, RESULT_SCHEMA))
        out += _result_rules(body)
        return _ordered(out)
    version = body.get("record_version")
    shape = SHAPES.get(version) if isinstance(version, str) else None
    if shape is None:
        out.append(Violation("record_version_unknown", "$.record_version", f"{version!r} is not one of {sorted(SHAPES)} or {RESULT_VERSION!r}"))
        return out
    out += schema_violations(body, shape.schema)
    extra = _SHAPE_RULES.get(shape.record_version)
    if extra is not None:
        out += extra(body)
    out += _legacy_purposes(body, out)
    return _ordered(out)


_VERDICT_PAIRING = frozenset({"verdict_requires_sufficiency", "satisfied_verdict_not_evaluable", "contested_close_met"})


def _vocabulary_first(violations: list[Violation]) -> list[Violation]:
    """A verdict outside the vocabulary is ``claim_verdict_unknown`` only: the
    rules pairing a verdict with sufficiency or state speak of its tokens."""
    unknown = {v.path for v in violations if v.rule == "claim_verdict_unknown"}
    return [v for v in violations if not (v.rule in _VERDICT_PAIRING and v.path in unknown)]


def _legacy_purposes(body: Any, found: list[Violation]) -> list[Violation]:
    """A ``citation_purpose`` anywhere in a judge body is the retired name (or a
    Capsule field in the wrong place): reported as a defect on read."""
    seen = {v.path for v in found if v.rule == "legacy_citation_purpose"}
    out: list[Violation] = []

    def walk(node: Any, path: Path) -> None:
        if isinstance(node, Mapping):
            if "citation_purpose" in node:
                where = (*path, "citation_purpose")
                if render_path(where) not in seen:
                    out.append(Violation("legacy_citation_purpose", render_path(where), "judge citations state judge_purpose; citation_purpose is the retired name (ruled 2026-10-04)", pointer=render_pointer(where)))
            for k, v in node.items():
                walk(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, (*path, i))

    walk(body, ())
    return out


# --------------------------------------------------------------------------- rules schemas cannot say


def _k_of_n(body: Mapping[str, Any]) -> list[Violation]:
    out = []
    for i, clause in enumerate(_list(body.get("clauses"))):
        for name in ("agreement", "drift"):
            kn = clause.get(name) if isinstance(clause, Mapping) else None
            if isinstance(kn, Mapping) and type(kn.get("k")) is int and type(kn.get("n")) is int and kn["k"] > kn["n"]:
                out.append(Violation("k_exceeds_n", f"$.clauses[{i}].{name}", f"k={kn['k']} exceeds n={kn['n']} (a verifier MUST check k ≤ n, family §8)"))
    refs = [c.get("clause_ref") for c in _list(body.get("clauses")) if isinstance(c, Mapping)]
    for ref, count in Counter(r for r in refs if isinstance(r, str)).items():
        if count > 1:
            out.append(Violation("clause_ref_duplicate", "$.clauses", f"clause {ref!r} is tallied {count} times; one k of n per clause"))
    return out


def _unique_cases(body: Mapping[str, Any]) -> list[Violation]:
    ids = [c.get("case_id") for c in _list(body.get("cases")) if isinstance(c, Mapping)]
    return [
        Violation("case_id_duplicate", "$.cases", f"case {cid!r} appears {n} times; a case is judged once per report")
        for cid, n in Counter(i for i in ids if isinstance(i, str)).items()
        if n > 1
    ]


def _sample_cases(body: Mapping[str, Any]) -> list[Violation]:
    cases = [c for c in _list(body.get("cases")) if isinstance(c, str)]
    return [
        Violation("sample_case_duplicate", "$.cases", f"case {cid!r} is listed {n} times")
        for cid, n in Counter(cases).items()
        if n > 1
    ]


#: An exact decimal as ``pin.decimal_string`` writes it: ASCII digits, an
#: optional sign and fraction, no exponent, no NaN/Infinity.
_DECIMAL = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", re.ASCII)


def _says_nothing(text: str) -> bool:
    """True for a non-empty string with nothing to read: only whitespace
    (Unicode's, U+001C–001F included) and invisible control or format
    characters (a zero-width space, a BOM).

    Why: the schemas ask such fields for ``minLength: 1``, which a single
    space meets; a rebuttal's basis is prose that must never be empty, and a
    judge named by blanks is not pinned."""
    return bool(text) and all(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def _model_id(body: Mapping[str, Any], member: str) -> list[Violation]:
    """A judge pin's model_id that names no model (the schema's minLength
    failure is ``judge_unpinned`` already; blanks are the same thing)."""
    pin = body.get(member)
    model = pin.get("model_id") if isinstance(pin, Mapping) else None
    if isinstance(model, str) and _says_nothing(model):
        return [Violation("judge_unpinned", f"$.{member}.model_id", "model_id names the judge's model; this one is only whitespace or invisible characters")]
    return []


def _evaluation_report(body: Mapping[str, Any]) -> list[Violation]:
    return _unique_cases(body) + _model_id(body, "judge_pin")


def _adjudication_response(body: Mapping[str, Any]) -> list[Violation]:
    # a rebuttal's basis is non-empty prose; the schema's minLength 1 takes a
    # basis of one space (an empty one is rebuttal_basis_empty there, so a blank
    # one is named the same)
    basis = body.get("basis")
    if isinstance(basis, str) and _says_nothing(basis):
        return [Violation("rebuttal_basis_empty", "$.basis", "basis is the prose that says why the rebuttal disputes the ruling; this one is only whitespace or invisible characters")]
    return []


def _adjudication(body: Mapping[str, Any]) -> list[Violation]:
    out = _model_id(body, "basis")
    # the quantities are exact decimal strings; the schema asks only for a
    # non-empty string, which "high" or "1e5" would meet
    for name in ("margin", "margin_tau", "divergence_index"):
        value = body.get(name)
        if isinstance(value, str) and value and _DECIMAL.fullmatch(value) is None:
            out.append(Violation("decimal_string_malformed", f"$.{name}", f"{name} is an exact decimal string such as \"0.42\" (no exponent, no words), not {value!r:.40}"))
    digests = [p.get("digest") for p in _list(body.get("parties")) if isinstance(p, Mapping)]
    if len(digests) == 2 and digests[0] == digests[1]:
        out.append(Violation("parties_duplicate", "$.parties", "both parties cite the same record; a ruling over one party cites it once"))
    party = body.get("contradicted_party")
    if isinstance(party, str) and is_hex64(party) and party not in digests:
        out.append(Violation("contradicted_party_not_a_party", "$.contradicted_party", "contradicted_party names a digest that is not one of the cited parties"))
    referee = body.get("referee")
    if isinstance(referee, Mapping) and referee.get("digest") in digests:
        out.append(Violation("referee_not_independent", "$.referee", "the referee is one of the parties it rules on (a twin cannot referee itself)"))
    return out


def _contract_compile(body: Mapping[str, Any]) -> list[Violation]:
    """A compile never self-certifies: its human approval cites neither the
    contract nor a compiled skill (the approval is a record of its own)."""
    approval = body.get("human_approval")
    digest = approval.get("digest") if isinstance(approval, Mapping) else None
    if not isinstance(digest, str):
        return []
    contract = body.get("contract")
    cited = [("contract", contract.get("digest") if isinstance(contract, Mapping) else None)]
    cited += [(f"compiled_skill[{i}]", s.get("digest") if isinstance(s, Mapping) else None)
              for i, s in enumerate(_list(body.get("compiled_skill")))]
    return [Violation("human_approval_self_certifying", "$.human_approval",
                      f"human_approval cites the same content as {where} ({digest[:16]}…); cite the separate human approval record")
            for where, d in cited if d == digest]


_IDENTIFYING = re.compile(r"@|\s")


def _human_rating(body: Mapping[str, Any]) -> list[Violation]:
    ref = body.get("rater_ref")
    if isinstance(ref, str) and _IDENTIFYING.search(ref):
        return [Violation("rater_ref_identifying", "$.rater_ref", "rater_ref is an opaque principal reference, never a name or an email (family §5)")]
    return []


def _close(body: Mapping[str, Any]) -> list[Violation]:
    out = []
    for i, link in enumerate(_list(body.get("x-evidence-links"))):
        if isinstance(link, Mapping) and link.get("type") == "adjudicates":
            out.append(Violation("adjudicates_requires_adjudication", f'$["x-evidence-links"][{i}]', "only an adjudication record may carry an adjudicates link; a Close is a producer_claim"))
    return out


_SHAPE_RULES = {
    "calibration-summary/v1": _k_of_n,
    "evaluation-report/v1": _evaluation_report,
    "sample-manifest/v1": _sample_cases,
    "adjudication/v1": _adjudication,
    "adjudication-response/v1": _adjudication_response,
    "contract-compile/v1": _contract_compile,
    "human-rating/v1": _human_rating,
    "close/v1": _close,
}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _result_rules(body: Mapping[str, Any]) -> list[Violation]:
    """evidence-result-v0 §3, §4, §3.1, CloseClaim: the checker's cross-element rules."""
    out: list[Violation] = []
    claims = [c for c in _list(body.get("claims")) if isinstance(c, Mapping)]
    ids = [c.get("id") for c in claims]
    for cid, n in Counter(i for i in ids if isinstance(i, str)).items():
        if n > 1:
            out.append(Violation("claim_id_duplicate", "$.claims", f"claim id {cid!r} appears {n} times (ids are unique within a Result, §4)"))
    aggregate: Mapping[str, Any] = body["aggregate"] if isinstance(body.get("aggregate"), Mapping) else {}
    buckets: Mapping[str, Any] | None = aggregate["buckets"] if isinstance(aggregate.get("buckets"), Mapping) else None
    verdict_of: dict[str, Any] = {c["id"]: c.get("verdict") for c in claims if isinstance(c.get("id"), str)}
    if buckets is not None:
        seen: Counter[str] = Counter()
        for verdict in ("met", "not_met", "not_evaluable"):
            for j, cid in enumerate(_list(buckets.get(verdict))):
                if not isinstance(cid, str):
                    continue  # the schema reports a non-string entry
                seen[cid] += 1
                if cid not in verdict_of:
                    out.append(Violation("bucket_mismatch", f"$.aggregate.buckets.{verdict}[{j}]", f"bucket names {cid!r}, which is no claim in this Result"))
                elif verdict_of[cid] != verdict:
                    out.append(Violation("bucket_mismatch", f"$.aggregate.buckets.{verdict}[{j}]", f"claim {cid!r} is {verdict_of[cid]!r}, not {verdict!r}"))
        for cid in verdict_of:
            if seen[cid] != 1:
                out.append(Violation("bucket_mismatch", "$.aggregate.buckets", f"claim {cid!r} appears {seen[cid]} times in the buckets; exactly once"))
    coverage: Mapping[str, Any] | None = aggregate["coverage"] if isinstance(aggregate.get("coverage"), Mapping) else None
    if coverage is not None:
        pop = coverage.get("evaluated_population")
        if type(pop) is int and pop != len(claims):
            out.append(Violation("coverage_population_mismatch", "$.aggregate.coverage.evaluated_population", f"{pop} evaluated, but the Result holds {len(claims)} claims (every count traces to claims, §1)"))
        unknown = coverage.get("unknown_count")
        n_unknown = sum(1 for c in claims if c.get("sufficiency") == "UNKNOWN")
        if type(unknown) is int and unknown != n_unknown:
            out.append(Violation("coverage_unknown_mismatch", "$.aggregate.coverage.unknown_count", f"{unknown} unresolved, but {n_unknown} claims resolved UNKNOWN (§3)"))
        defects = coverage.get("producer_defects")
        if isinstance(defects, Mapping) and type(defects.get("count")) is int and type(defects.get("denominator")) is int:
            if defects["count"] > defects["denominator"]:
                out.append(Violation("producer_defects_over_denominator", "$.aggregate.coverage.producer_defects", f"count {defects['count']} exceeds denominator {defects['denominator']} (§3.1)"))
    for i, claim in enumerate(claims):
        close = claim.get("close")
        if not isinstance(close, Mapping):
            continue
        evidence = {e.get("digest") for e in _list(claim.get("evidence")) if isinstance(e, Mapping)}
        for name, rule in (("close_ref", "close_ref_not_in_evidence"), ("peer_close_ref", "peer_close_ref_not_in_evidence")):
            ref = close.get(name)
            if isinstance(ref, Mapping) and ref.get("digest") not in evidence:
                out.append(Violation(rule, f"$.claims[{i}].close.{name}", f"{name} must also appear in the claim's evidence[]"))
    return out


# --------------------------------------------------------------------------- links


def check_links(epistemic_type: Any, links: Iterable[Any], body: Mapping[str, Any] | None = None) -> list[Violation]:
    """The EL -00 §4.1/§5 link rules for a store header. Never raises.

    Links are ``{type, target}`` with one of the six types and a 64-hex
    target; ``adjudicates`` only on a record whose ``epistemic_type`` is
    ``adjudication`` and, given the record's ``body``, only to one of the
    parties it cites (an adjudication covers only its parties' claims: a link
    to anything else would claim a ruling the body never made).

    Args:
        epistemic_type: the record's epistemic type.
        links: the header's links.
        body: the record's body, when known.

    Returns:
        The violations (``epistemic_type_unknown``, ``link_malformed``,
        ``link_type_unknown``, ``link_target_malformed``,
        ``adjudicates_requires_adjudication``, ``adjudicates_not_a_party``).
    """
    out: list[Violation] = []
    parties = None
    if isinstance(body, Mapping):
        parties = {d for p in _list(body.get("parties")) if isinstance(p, Mapping) and isinstance(d := p.get("digest"), str)}
    if epistemic_type not in EPISTEMIC_TYPES:
        out.append(Violation("epistemic_type_unknown", "$.epistemic_type", f"{epistemic_type!r} is not one of the eight registered types"))
    if isinstance(links, (str, bytes, Mapping)) or not isinstance(links, Iterable):
        return [*out, Violation("link_malformed", "$.links", f"links are a list of {{type, target}}, not {type(links).__name__}")]
    for i, link in enumerate(links):
        path = f"$.links[{i}]"
        if not isinstance(link, Mapping) or set(link) != {"type", "target"}:
            out.append(Violation("link_malformed", path, "a link is exactly {type, target}"))
            continue
        if link["type"] not in LINK_TYPES:
            out.append(Violation("link_type_unknown", f"{path}.type", f"{link['type']!r} is not one of {list(LINK_TYPES)}; tokens are never overloaded"))
        if not is_hex64(link["target"]):
            out.append(Violation("link_target_malformed", f"{path}.target", "a link target is a 64-hex lowercase SHA-256 digest"))
        if link["type"] == "adjudicates" and epistemic_type != "adjudication":
            out.append(Violation("adjudicates_requires_adjudication", f"{path}.type", f"only an adjudication record may carry an adjudicates link; this record is {epistemic_type!r}"))
        elif link["type"] == "adjudicates" and parties is not None and link["target"] not in parties:
            out.append(Violation("adjudicates_not_a_party", f"{path}.target", "an adjudicates link points at one of the parties the adjudication cites"))
    return out
