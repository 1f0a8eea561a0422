"""capseal.judge — judgment records kept apart from evidence.

Evidence says what was done, by whom, and that the bytes have not changed; a
judgment says whether it was right. They are separate records: a judgment cites
what it judges *by digest* and never edits it; its ``epistemic_type`` is fixed
by its shape when it is committed and never upgraded; a verifier checks its
signature, shape, type and citations — never whether it is correct.

>>> from capseal.judge import JudgmentStore, JudgePin, EvaluationReport, Case, verify_judgment  # doctest: +SKIP
>>> store = JudgmentStore(ledger, signer)                                         # doctest: +SKIP
>>> rubric = store.put_json(rubric_doc, type="rubric")                            # doctest: +SKIP
>>> pin = JudgePin.pin(model_id="judge@1", prompt=prompt_bytes, sampling={"temperature_micros": 0})  # doctest: +SKIP
>>> report = EvaluationReport(record_id="er-1", generated_at=now, contract_ref="ec:x@1",
...                           judge_pin=pin, cases=[Case.of("c1", "met", acts=[act], method=rubric)])  # doctest: +SKIP
>>> sealed = store.seal(report)                                                   # doctest: +SKIP
>>> verify_judgment(sealed, store).ok                                             # doctest: +SKIP
True

Public modules (everything else here is private: its names are exported by
these):

* ``vocab`` (closed sets), ``schema`` (shipped schemas, interpreted), ``rules``
  (the refusal engine);
* ``citation``, ``pin``, ``links`` (what a record cites and how);
* ``shapes``, ``result``, ``extension`` (typed builders);
* ``envelope``, ``store``, ``verify`` (seal, keep, check);
* ``judges`` (three ways of judging);
* ``referee`` (a package: twins and a referee);
* ``interpret`` (a package: what a verdict means, read-only, for every record
  here and for stored jury verdicts).
"""

from .citation import Citation, DigestRef, Target
from .envelope import CONTENT_TYPE
from .extension import (
    ExpertProtocolParameters,
    JudgeAnswer,
    JudgmentMember,
    ModelJudgeParameters,
    check_judgment_capsule,
    judgment_capsule_spec,
    judgment_member,
    refuse_judgment_capsule,
)
from .interpret import interpret, pass_rate, summarise, tally
from .judges import (
    CaseInput,
    JudgeRequest,
    ModelJudge,
    Requirement,
    RulesJudge,
    agreement,
    blind_packet,
    clause_tally,
    drift,
)
from .links import Link, link
from .pin import JudgePin, decimal_string, micros
from .result import Claim, EvidenceResult, Implementation, ResultBuilder, code_identity
from .rules import Violation, check_body, check_links, epistemic_type_of, refuse
from .schema import parity
from .shapes import (
    Adjudication,
    AdjudicationResponse,
    CalibrationSummary,
    Case,
    ClauseTally,
    Close,
    ContractCompile,
    EvaluationReport,
    HumanRating,
    JudgeRecord,
    KOfN,
    Period,
    Reconcile,
    ReconcileTallies,
    SampleManifest,
    parse_record,
)
from .store import JudgmentStore, SealedJudgment
from .verify import JudgmentReport, verify_entry, verify_judgment
from .vocab import EPISTEMIC_TYPES, LINK_TYPES, SHAPES

__all__ = [
    "Target", "Citation", "DigestRef", "Link", "link", "JudgePin", "decimal_string", "micros",
    "JudgeRecord", "EvaluationReport", "Case", "Adjudication", "AdjudicationResponse", "HumanRating",
    "CalibrationSummary", "ClauseTally", "KOfN", "SampleManifest", "ContractCompile", "Close", "Period",
    "Reconcile", "ReconcileTallies", "parse_record",
    "EvidenceResult", "Claim", "Implementation", "ResultBuilder", "code_identity",
    "JudgmentMember", "ModelJudgeParameters", "ExpertProtocolParameters", "JudgeAnswer", "judgment_member",
    "judgment_capsule_spec", "check_judgment_capsule", "refuse_judgment_capsule",
    "Violation", "check_body", "check_links", "refuse", "epistemic_type_of", "parity",
    "JudgmentStore", "SealedJudgment", "JudgmentReport", "verify_judgment", "verify_entry", "CONTENT_TYPE",
    "Requirement", "RulesJudge", "ModelJudge", "CaseInput", "JudgeRequest", "blind_packet", "agreement", "drift", "clause_tally",
    "EPISTEMIC_TYPES", "LINK_TYPES", "SHAPES",
    "interpret", "summarise", "tally", "pass_rate",
]
