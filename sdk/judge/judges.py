"""Three ways of judging an act, each ending in a judgment record.

1. :class:`RulesJudge` — tier ``recomputed``. Each requirement is a function of
   named, cited inputs (resolved from the store by digest). The result is an
   Evidence Result whose claims carry the code identity of the rules, read from
   their source at check time. Nothing in it depends on a clock or a model, so
   anyone holding the inputs re-runs it: :meth:`RulesJudge.recompute` rebuilds
   the record from what it cites and yields the same record digest.
2. :class:`ModelJudge` — tier ``judged``. A judge model pinned by ``model_id``,
   prompt digest (from the prompt's bytes) and sampling; the model call is an
   injected callable, so any framework or a local model can sit behind it. Its
   record is an ``evaluation-report/v1``; a confidence or score the model
   returns is never recorded (the family has no field for it).
3. Blind human ratings — :func:`blind_packet` is what a rater sees (never the
   model's verdict); each rating is a ``human-rating/v1``; :func:`agreement` and
   :func:`drift` count k of n per clause for a ``calibration-summary/v1``.

None of these says the judgment is *right*: a verifier checks integrity, shape,
type and citations; a recomputed row can be re-run, a judged one stays the
judge's signed statement.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from capseal.canonical import raw_digest
from capseal.errors import JudgmentRefusedError

from .citation import Target, as_mapping, computed, listed
from .pin import JudgePin, bytes_of
from .result import Claim, EvidenceResult, ResultBuilder, code_identity
from .shapes import Case, ClauseTally, EvaluationReport, KOfN
from .store import JudgmentStore, SealedJudgment
from .vocab import CASE_VERDICTS, GRADES, RESULT_VERSION

__all__ = [
    "Requirement",
    "RulesJudge",
    "JudgeRequest",
    "CaseInput",
    "ModelJudge",
    "blind_packet",
    "agreement",
    "drift",
    "clause_tally",
]

#: What a rule returns: a verdict, or that the inputs do not allow one.
OUTCOMES = {
    "met": ("SATISFIED", "met"),
    "not_met": ("SATISFIED", "not_met"),
    "insufficient": ("INSUFFICIENT", "not_evaluable"),
    "unknown": ("UNKNOWN", "not_evaluable"),
}


def _frozen(value: Any) -> Any:
    """A private deep copy: whatever a rule or a model callable does to what it
    is given, the stored content (and so every digest) stays as it was."""
    return copy.deepcopy(value)


@dataclass(frozen=True)
class Requirement:
    """One contract requirement judged by a rule over named cited inputs.

    ``rule(values)`` receives ``{name: content}`` for each name in ``inputs`` and
    returns ``"met"``, ``"not_met"``, ``"insufficient"`` or ``"unknown"``. It
    must be a pure function of those values (no clock, no I/O, no randomness):
    that is what lets a stranger re-run it."""

    requirement_ref: str
    inputs: tuple[str, ...]
    rule: Callable[[Mapping[str, Any]], str]


class RulesJudge:
    """Tier ``recomputed``: a fixed function of cited inputs, no model, no human.

    Args:
        name: the judge's name (its code identity's name).
        contract_ref: the contract its requirements come from.
        requirements: one :class:`Requirement` per requirement, each once.
        grade: its claims' grade; only ``self-attested`` (nothing else backs a
            hash capseal computed of its own source).

    Raises:
        JudgmentRefusedError: a grade above ``self-attested``
            (``claim_grade_without_proof``) or unknown, a requirement of the
            wrong type, or one given twice (``claim_id_duplicate``).
    """

    def __init__(self, *, name: str, contract_ref: str, requirements: Sequence[Requirement], grade: str = "self-attested") -> None:
        if grade not in GRADES:
            raise JudgmentRefusedError(f"grade {grade!r} is not one of {list(GRADES)}", rule="schema_enum_mismatch", path="$.claims[*].grade")
        if grade != "self-attested":
            raise JudgmentRefusedError(
                f"a RulesJudge attaches no proof to its claims and its code identity is capseal's own (self-attested) hash of the "
                f"source, so nothing backs grade {grade!r}: its claims are self-attested",
                rule="claim_grade_without_proof", path="$.claims[*].grade")
        requirements = listed(requirements, "requirements")
        for i, r in enumerate(requirements):
            if not isinstance(r, Requirement):
                raise JudgmentRefusedError(f"requirements[{i}] is a Requirement, not {type(r).__name__}", rule="schema_type_mismatch", path=f"$.requirements[{i}]")
        refs = [r.requirement_ref for r in requirements]
        if len(set(refs)) != len(refs):
            raise JudgmentRefusedError("each requirement is judged once", rule="claim_id_duplicate")
        self.name = name
        self.contract_ref = contract_ref
        self.requirements = {r.requirement_ref: r for r in requirements}
        self.grade = grade

    def implementation(self, requirement: Requirement, captured_at: str) -> Any:
        """The code identity of this judge and one requirement's rule.

        Args:
            requirement: the requirement.
            captured_at: when it is read (RFC 3339 UTC).

        Returns:
            The identity read from the source files now, or None when a source
            cannot be read.
        """
        return code_identity(RulesJudge, requirement.rule, name=self.name, captured_at=captured_at)

    def judge(self, inputs: Mapping[str, Target], *, store: JudgmentStore, as_of: str) -> EvidenceResult:
        """Judge every requirement over ``inputs``.

        A missing input gives sufficiency GAP (verdict ``not_evaluable``), never
        a guess; a rule whose code cannot be named is withheld and counted, never
        relabelled.

        Args:
            inputs: input name → Target.
            store: where the inputs' content is read.
            as_of: the result's ``generated_at`` (RFC 3339 UTC).

        Returns:
            The Evidence Result.

        Raises:
            JudgmentRefusedError: ``rule_input_missing`` for an input a
                requirement needs that is not given, ``rule_outcome_unknown`` for a
                rule that returns another token, or a rule of the Result's shape.
            Exception: whatever a requirement's rule raises.
        """
        builder = ResultBuilder(generated_at=as_of)
        for ref, req in self.requirements.items():
            missing = [n for n in req.inputs if n not in inputs]
            if missing:
                raise JudgmentRefusedError(f"requirement {ref!r} needs inputs {missing}", rule="rule_input_missing")
            targets = [inputs[n] for n in req.inputs]
            implementation = self.implementation(req, as_of)
            if implementation is None:
                builder.withhold_recomputed()
                continue
            sufficiency, verdict = self._outcome(req, targets, store)
            builder.add(Claim.of(
                id=f"claim-{ref}", contract_ref=self.contract_ref, requirement_ref=ref, tier="recomputed",
                grade=self.grade, sufficiency=sufficiency, verdict=verdict, evidence=targets, implementation=implementation,
            ))
        return builder.build()

    @staticmethod
    def _outcome(req: Requirement, targets: list[Target], store: JudgmentStore) -> tuple[str, str]:
        if not all(store.has(t.digest) for t in targets):
            return "GAP", "not_evaluable"
        values = {name: _frozen(store.value(t.digest)) for name, t in zip(req.inputs, targets)}
        outcome = req.rule(values)
        if outcome not in OUTCOMES:
            raise JudgmentRefusedError(f"rule for {req.requirement_ref!r} returned {outcome!r}; one of {sorted(OUTCOMES)}", rule="rule_outcome_unknown")
        return OUTCOMES[outcome]

    def recompute(self, record: SealedJudgment | EvidenceResult | Mapping[str, Any], *, store: JudgmentStore) -> EvidenceResult:
        """Re-run the rules over exactly what ``record`` cites (resolved from the
        store by digest) at its own ``generated_at``.

        Equal record digests mean the same code over the same inputs gave the
        same claims.

        Args:
            record: the Evidence Result (a ``SealedJudgment``, an
                ``EvidenceResult`` or its body).
            store: where its inputs are resolved.

        Returns:
            The recomputed Evidence Result.

        Raises:
            JudgmentRefusedError: not an Evidence Result
                (``record_not_object``, ``record_version_mismatch``), a claim with
                no rule here or with another number of inputs
                (``rule_input_missing``), or as :meth:`judge`.
        """
        result = _evidence_result(record)
        inputs: dict[str, Target] = {}
        for claim in result.claims:
            req = self.requirements.get(claim.requirement_ref)
            if req is None:
                raise JudgmentRefusedError(f"no rule for requirement {claim.requirement_ref!r}", rule="rule_input_missing")
            digests = [e.digest for e in claim.evidence]
            if len(digests) != len(req.inputs):
                raise JudgmentRefusedError(f"claim {claim.id!r} cites {len(digests)} inputs; the rule reads {len(req.inputs)}", rule="rule_input_missing")
            for name, digest in zip(req.inputs, digests):
                inputs[name] = store.target(digest) if store.has(digest) else Target.recorded(type="input", digest=digest, kind="json", content=None)
        return self.judge(inputs, store=store, as_of=result.generated_at)


def _evidence_result(record: Any) -> EvidenceResult:
    """``record`` read as an Evidence Result (refused by rule name when it is not one)."""
    if isinstance(record, EvidenceResult):
        return record
    body = record.body if isinstance(record, SealedJudgment) else record
    if not isinstance(body, Mapping):
        raise JudgmentRefusedError(f"recompute re-runs an Evidence Result (a SealedJudgment, an EvidenceResult or its body), not {type(body).__name__}",
                                   rule="record_not_object")
    version = body.get("result_version", body.get("record_version"))
    if version != RESULT_VERSION:
        raise JudgmentRefusedError(f"recompute re-runs an Evidence Result ({RESULT_VERSION}), not {version!r}", rule="record_version_mismatch", path="$.result_version")
    return EvidenceResult.from_body(dict(body))


# --------------------------------------------------------------------------- judge model


@dataclass(frozen=True)
class JudgeRequest:
    """What the injected model callable is given for one case (``prompt`` as the
    ModelJudge was given it: text, or bytes)."""

    model_id: str
    prompt: str | bytes
    sampling: Mapping[str, Any]
    case_id: str
    rubric: Any
    acts: tuple[Any, ...]


@dataclass(frozen=True)
class CaseInput:
    """One case to judge: the acts it rests on and the rubric (method) it is judged against."""

    case_id: str
    acts: tuple[Target, ...]
    method: Target


JudgeCall = Callable[[JudgeRequest], Any]


class ModelJudge:
    """Tier ``judged``: a pinned judge model behind an injected callable.

    ``call(request)`` returns ``{"verdict": …}`` (other members — a rationale, a
    confidence — are not recorded) or a bare verdict string. A verdict outside
    met / not_met / not_evaluable is refused, never coerced.

    Args:
        pin: the judge's pin.
        prompt: what the pin was made from: its text (digested as UTF-8) or
            its bytes; either way its digest must be the pin's
            ``prompt_digest``.
        call: the judge model, request → answer.
        contract_ref: the contract its reports judge against.

    Raises:
        JudgmentRefusedError: ``judge_unpinned`` (no JudgePin),
            ``prompt_digest_mismatch``, ``judge_call_not_callable``, or a
            prompt that is neither text nor bytes.
    """

    def __init__(self, *, pin: JudgePin, prompt: str | bytes, call: JudgeCall, contract_ref: str) -> None:
        if not isinstance(pin, JudgePin):
            raise JudgmentRefusedError(f"a model judge is pinned by a JudgePin (JudgePin.pin(...)), not {type(pin).__name__}", rule="judge_unpinned", path="$.judge_pin")
        data = bytes_of(prompt, "prompt", path="$.judge_pin.prompt_digest")
        if pin.prompt_digest.digest != raw_digest(data):
            raise JudgmentRefusedError("the prompt given is not the prompt the pin names", rule="prompt_digest_mismatch", path="$.judge_pin.prompt_digest")
        if not callable(call):
            raise JudgmentRefusedError(f"call is the judge model as a callable (request → answer), not {type(call).__name__}", rule="judge_call_not_callable")
        self.pin = pin
        self.prompt: str | bytes = prompt if isinstance(prompt, str) else data
        self.call = call
        self.contract_ref = contract_ref

    def verdict(self, case: CaseInput, *, store: JudgmentStore) -> str:
        """Ask the model about one case.

        Args:
            case: the case.
            store: where its acts and rubric are read.

        Returns:
            The verdict token.

        Raises:
            JudgmentRefusedError: ``judge_answer_not_a_verdict``; a digest the
                store does not resolve.
            Exception: whatever the injected callable raises.
        """
        request = JudgeRequest(
            model_id=self.pin.model_id, prompt=self.prompt, sampling=MappingProxyType(dict(self.pin.sampling)),
            case_id=case.case_id, rubric=_frozen(store.value(case.method.digest)),
            acts=tuple(_frozen(store.value(t.digest)) for t in case.acts),
        )
        answer = self.call(request)
        verdict = answer.get("verdict") if isinstance(answer, Mapping) else answer
        if verdict not in CASE_VERDICTS:
            raise JudgmentRefusedError(f"the judge answered {verdict!r} for case {case.case_id!r}; a verdict is one of {list(CASE_VERDICTS)}", rule="judge_answer_not_a_verdict")
        return str(verdict)

    def judge(self, cases: Sequence[CaseInput], *, record_id: str, generated_at: str, store: JudgmentStore) -> EvaluationReport:
        """An ``evaluation-report/v1`` with one case per input, every case citing its
        acts (``grounds``) and its rubric (``method``).

        Args:
            cases: the cases.
            record_id: the report's id.
            generated_at: when (RFC 3339 UTC).
            store: where the cases' acts and rubrics are read.

        Returns:
            The report (not yet sealed).

        Raises:
            JudgmentRefusedError: as :meth:`verdict`, or a rule of the shape.
            Exception: whatever the injected callable raises.
        """
        return EvaluationReport(
            record_id=record_id, generated_at=generated_at, contract_ref=self.contract_ref, judge_pin=self.pin,
            cases=[Case.of(c.case_id, self.verdict(c, store=store), acts=c.acts, method=c.method) for c in cases],
        )


# --------------------------------------------------------------------------- blind human ratings and calibration


def blind_packet(*, case_id: str, acts: Sequence[Target], criterion: Any) -> dict[str, Any]:
    """What a rater is shown: the case, the acts by digest, the criterion — and,
    by construction, not the model's verdict (``model_verdict_shown: false``).

    Args:
        case_id: the case (non-empty).
        acts: the acts, as Targets.
        criterion: what the rater judges against (JSON).

    Returns:
        The packet, a JSON object to cite with ``Target.of_json``.

    Raises:
        JudgmentRefusedError: an empty case id, acts that are not a list of
            Targets.
    """
    if not isinstance(case_id, str) or not case_id:
        raise JudgmentRefusedError("a blind packet names its case by a non-empty case_id", rule="schema_too_short", path="$.case_id")
    acts = listed(acts, "acts")
    acts = [computed(t, f"acts[{i}]") for i, t in enumerate(acts)]
    return {"case_id": case_id, "acts": [t.digest for t in acts], "criterion": criterion, "model_verdict_shown": False}


@dataclass
class _Tally:
    k: int = 0
    n: int = 0


def agreement(judge: Mapping[str, str], humans: Iterable[tuple[str, str]]) -> KOfN:
    """Agreement k of n between a judge and human raters.

    Over every (case_id, human label) whose case the judge also decided, k
    counts equal labels. A human label that is not a verdict token is not
    comparable and stays out of n; nothing becomes a rate here.

    Args:
        judge: case id → the judge's verdict.
        humans: (case id, label) pairs.

    Returns:
        The count pair.

    Raises:
        JudgmentRefusedError: a judge map that is not a mapping, or a pair
            that is not one.
    """
    judge = as_mapping(judge, "judge")
    tally = _Tally()
    for i, pair in enumerate(listed(humans, "humans")):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise JudgmentRefusedError(f"humans[{i}] is a (case_id, label) pair, not {type(pair).__name__}",
                                       rule="schema_type_mismatch", path=f"$.humans[{i}]")
        case_id, label = pair
        if case_id in judge and label in CASE_VERDICTS:
            tally.n += 1
            tally.k += int(judge[case_id] == label)
    return KOfN.of(tally.k, tally.n)


def drift(first: Mapping[str, str], rerun: Mapping[str, str]) -> KOfN:
    """Drift k of n: of the cases judged twice under the same pin, k changed
    verdict.

    Args:
        first: case id → verdict of the first run.
        rerun: case id → verdict of the second.

    Returns:
        The count pair.

    Raises:
        JudgmentRefusedError: either is not a mapping.
    """
    first, rerun = as_mapping(first, "first"), as_mapping(rerun, "rerun")
    both = [c for c in first if c in rerun]
    return KOfN.of(sum(1 for c in both if first[c] != rerun[c]), len(both))


def clause_tally(clause_ref: str, *, agreement: KOfN, drift: KOfN) -> ClauseTally:
    """One clause's agreement and drift, for a ``calibration-summary/v1``.

    Args:
        clause_ref: the clause.
        agreement: its agreement (:func:`agreement`).
        drift: its drift (:func:`drift`).

    Returns:
        The tally.

    Raises:
        JudgmentRefusedError: a rule of the tally's shape.
    """
    return ClauseTally(clause_ref=clause_ref, agreement=agreement, drift=drift)
