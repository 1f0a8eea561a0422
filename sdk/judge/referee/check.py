"""Checking a referee's ruling as the comparing node takes it (S4, counting). Never raises.

A ruling is taken only when it verifies under the referee's **announced** key:

* the referee's statement (``capseal-referee-statement/1``) is a judgment-store
  artifact whose bytes still give its id, signed by that key;
* its answer capsule resolves, is signed by that key, names the referee as its
  server in the ``referee`` role, and its ``response_digest`` is the answer
  digest the statement gives;
* for a ruling other than ``not_comparable``, the ``adjudication/v1`` passes
  :func:`capseal.judge.verify_judgment` under that key, cites the statement as
  its ``referee``, cites exactly the two halves as its parties, links to each
  with ``adjudicates`` and to the answer capsule with ``cites``, and says what
  the statement says (the verdict split into ``verdict`` and
  ``contradicted_party``, the divergence index);
* S4 — when the caller says what it asked (``expect``), the statement names
  that referee, that tier and that pair; a ruling sealed with another tier is
  refused.

Each failure is a named finding (``ruling_…``); what is checked is integrity
and agreement, never whether the ruling is right.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capseal.audit import KeyDirectory, check_signatures
from capseal.findings import Finding, HasFindings
from capseal.judge.store import JudgmentStore
from capseal.judge.verify import verify_judgment
from capseal.ledger import Ledger
from capseal.record import RECEIVED_CAPSULE

from .halves import serving_facts
from .ruling import split_verdict
from .vocab import ROLE_REFEREE, STATEMENT_VERSION, TIERS, VERDICT_NOT_COMPARABLE

__all__ = ["RulingReport", "verify_ruling"]

_STATEMENT_MEMBERS = {
    "statement_version", "referee_node_id", "selection_tier", "verdict", "twin_bracket_id", "request_digest",
    "halves", "divergence_index", "prefix_digest", "answer_capsule_id", "answer_digest", "capture_method",
    "model_hash", "weights_digest", "stated_at",
}


@dataclass
class RulingReport(HasFindings):
    """What the comparing node concluded about one ruling."""

    ok: bool
    statement_id: str | None
    ruling_id: str | None
    referee: str | None = None
    tier: int | None = None
    verdict: str | None = None
    because: str | None = None
    model_hash: str | None = None
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON.

        Returns:
            ``{ok, statement_id, ruling_id, referee, tier, verdict, because,
            findings, note}``.
        """
        return {"ok": self.ok, "statement_id": self.statement_id, "ruling_id": self.ruling_id, "referee": self.referee,
                "tier": self.tier, "verdict": self.verdict, "because": self.because,
                "findings": [f.to_dict() for f in self.findings],
                "note": "checked: signatures under the announced key, what it cites, what it says — not whether it is right"}


def _statement_problem(statement: Any) -> str | None:
    if not isinstance(statement, Mapping) or statement.get("statement_version") != STATEMENT_VERSION:
        return f"not a {STATEMENT_VERSION} statement"
    keys = set(statement)
    if _STATEMENT_MEMBERS - keys or keys - _STATEMENT_MEMBERS - {"not_comparable_because"}:
        return "the statement's members are not the ones a referee writes"
    halves = statement["halves"]
    if not (isinstance(halves, list) and len(halves) == 2
            and all(isinstance(h, Mapping) and set(h) == {"node_id", "capsule_id"} for h in halves)):
        return "halves are two {node_id, capsule_id}"
    if not isinstance(statement["verdict"], str) or not isinstance(statement["referee_node_id"], str):
        return "verdict and referee_node_id are strings"
    return None


def verify_ruling(
    store: JudgmentStore | Ledger,
    *,
    statement_id: str,
    ruling_id: str | None,
    referee_key: Any,
    expect: Mapping[str, Any] | None = None,
) -> RulingReport:
    """Check one referee ruling against the key its referee announced.

    Args:
        store: the judgment store (or ledger) holding it, the halves and the answer capsule.
        statement_id: the referee's signed statement.
        ruling_id: the ``adjudication/v1`` record id (None for ``not_comparable``).
        referee_key: the referee's announced public key (or PEM).
        expect: what was asked: ``referee``, ``tier`` and ``capsule_ids`` (any subset).

    Returns:
        A :class:`RulingReport`; ``ok`` only with no error finding.
    """
    report = RulingReport(False, statement_id, ruling_id)
    try:
        _verify(store if isinstance(store, JudgmentStore) else JudgmentStore(store), statement_id, ruling_id,
                referee_key, expect or {}, report)
    except Exception as exc:  # never raise
        report.findings.append(Finding("verifier_internal_error", f"{type(exc).__name__}: {exc}"))
    report.ok = not report.errors
    return report


def _verify(store: JudgmentStore, statement_id: str, ruling_id: str | None, referee_key: Any,
            expect: Mapping[str, Any], report: RulingReport) -> None:
    add = report.findings.append
    keys = [referee_key] if referee_key is not None else []
    if not keys:
        add(Finding("ruling_referee_key_unknown", "the referee announced no key: its ruling cannot count"))
        return
    stated = verify_judgment(statement_id, store, trusted_keys=keys)
    if not stated.ok:
        report.findings.extend(stated.findings)
        add(Finding("ruling_statement_tampered", "the referee's statement does not verify under its announced key "
                    "(its bytes changed after it was signed, or another key signed it)"))
        return
    statement = store.value(statement_id)
    problem = _statement_problem(statement)
    if problem is not None:
        add(Finding("ruling_statement_malformed", problem))
        return
    report.referee, report.verdict = statement["referee_node_id"], statement["verdict"]
    report.because, report.model_hash = statement.get("not_comparable_because"), statement.get("model_hash")
    tier = statement["selection_tier"]
    report.tier = tier if type(tier) is int else None
    if report.tier not in TIERS:
        add(Finding("ruling_tier_invalid", f"selection_tier {tier!r} is not 1 or 2"))
    _check_answer(store, statement, keys, add)
    _check_expected(statement, expect, add)
    if statement["verdict"] == VERDICT_NOT_COMPARABLE:
        if ruling_id is not None:
            add(Finding("ruling_not_comparable_sealed", "not_comparable has no adjudication/v1 token, yet one is named"))
        return
    if ruling_id is None:
        add(Finding("ruling_missing", f"a {statement['verdict']!r} ruling names its adjudication/v1 record"))
        return
    _check_adjudication(store, statement_id, ruling_id, statement, keys, stated.signer_kid, add, report)


def _check_answer(store: JudgmentStore, statement: Mapping[str, Any], keys: list[Any], add: Any) -> None:
    answer_id = statement["answer_capsule_id"]
    entry = store.entry(answer_id) if isinstance(answer_id, str) else None
    if entry is None or entry.record_type not in ("capsule", RECEIVED_CAPSULE):
        add(Finding("ruling_answer_missing", "the referee's answer capsule is not in this store"))
        return
    record = entry.record()
    capsule, envelopes = record.get("capsule"), record.get("envelopes", [])
    if not isinstance(capsule, Mapping):
        add(Finding("ruling_answer_missing", "the referee's answer row holds no capsule"))
        return
    try:
        store.target(answer_id)  # its bytes still give its id
    except Exception as exc:
        add(Finding("ruling_answer_tampered", f"the answer capsule does not give its id ({exc})"))
        return
    effect = capsule.get("effect")
    if not isinstance(effect, Mapping) or effect.get("response_digest") != statement["answer_digest"]:
        add(Finding("ruling_answer_digest_mismatch", "the answer capsule's response_digest is not the statement's answer digest"))
    facts = serving_facts(capsule)
    if facts.get("node_id") != statement["referee_node_id"] or facts.get("role") != ROLE_REFEREE:
        add(Finding("ruling_answer_not_the_referees", "the answer capsule does not name the referee as its server"))
    from capseal.keys import kid_for

    from .halves import announced_key

    want = kid_for(announced_key(keys[0]))
    verdict, kid, _ = check_signatures(capsule, envelopes if isinstance(envelopes, list) else [], KeyDirectory(keys))
    if verdict != "authored" or kid != want:
        add(Finding("ruling_answer_not_signed_by_referee", "the answer capsule is not signed by the referee's announced key"))


def _check_expected(statement: Mapping[str, Any], expect: Mapping[str, Any], add: Any) -> None:
    if "referee" in expect and statement["referee_node_id"] != expect["referee"]:
        add(Finding("ruling_referee_not_asked", f"signed by {statement['referee_node_id']!r}, asked {expect['referee']!r}"))
    if "tier" in expect and statement["selection_tier"] != expect["tier"]:
        add(Finding("ruling_tier_not_asked", f"sealed with tier {statement['selection_tier']!r}, asked from tier "
                    f"{expect['tier']!r}"))
    if "capsule_ids" in expect and sorted(h["capsule_id"] for h in statement["halves"]) != sorted(expect["capsule_ids"]):
        add(Finding("ruling_pair_mismatch", "the statement rules on other halves than the pair asked about"))


def _check_adjudication(store: JudgmentStore, statement_id: str, ruling_id: str, statement: Mapping[str, Any],
                        keys: list[Any], statement_kid: str | None, add: Any, report: RulingReport) -> None:
    judged = verify_judgment(ruling_id, store, trusted_keys=keys)
    if not judged.ok:
        report.findings.extend(judged.findings)
        add(Finding("ruling_unverified", "the adjudication/v1 does not verify under the referee's announced key"))
        return
    sealed = store.get(ruling_id)
    if sealed is None or sealed.body.get("record_version") != "adjudication/v1":
        add(Finding("ruling_not_an_adjudication", "the ruling record is not an adjudication/v1"))
        return
    body = sealed.body
    if judged.signer_kid != statement_kid:
        add(Finding("ruling_signers_differ", "the statement and the adjudication are signed by different keys"))
    referee = body.get("referee")
    if not isinstance(referee, Mapping) or referee.get("digest") != statement_id:
        add(Finding("ruling_statement_not_cited", "the adjudication's referee citation is not the statement"))
    halves = {h["capsule_id"]: h["node_id"] for h in statement["halves"]}
    parties = [str(p.get("digest")) for p in body.get("parties", []) if isinstance(p, Mapping)]
    if sorted(parties) != sorted(halves):
        add(Finding("ruling_half_mismatch", "the adjudication's parties are not the statement's two halves"))
    token, named = split_verdict(statement["verdict"])
    party = body.get("contradicted_party")
    if body.get("verdict") != token or (named is None) != (party is None) or (
            named is not None and halves.get(str(party)) != named):
        add(Finding("ruling_verdict_mismatch", f"the adjudication says {body.get('verdict')!r}"
                    f"{' against ' + str(party)[:16] + '…' if party else ''}; the statement says {statement['verdict']!r}"))
    divergence = statement["divergence_index"]
    if body.get("divergence_index") != (None if divergence is None else str(divergence)):
        add(Finding("ruling_divergence_mismatch", "the adjudication's divergence_index is not the statement's"))
    links = {(x.get("type"), x.get("target")) for x in sealed.links}
    wanted = {("adjudicates", c) for c in halves} | {("cites", statement["answer_capsule_id"])}
    if not wanted <= links:
        add(Finding("ruling_links_mismatch", "the adjudication does not link adjudicates to each half and cites to "
                    "the answer capsule"))

