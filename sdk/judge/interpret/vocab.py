"""The tokens the reader knows, for stored jury verdicts and for capseal's records.

Jury verdicts (the agent-judge 0.13–0.17 wire tokens): a token outside these
tables is carried as recorded with an UNKNOWN_VOCABULARY defect, never refused.
Capseal's records: the verdict tokens of the judge family, the Evidence Result,
the referee rows and the mesh verdict record, and how each is read.
"""

from __future__ import annotations

__all__ = [
    "STATUSES",
    "STATUS_BY_ENUM",
    "REASON_FAMILY",
    "DECISION_KINDS",
    "DECISION_BASES",
    "RELATIONS",
    "POLICIES",
    "DISPOSITIONS",
    "DISPOSITION_REASONS",
    "FAILURE_CODES",
    "KEY_SOURCES",
    "ERROR_POLICIES",
    "NOT_APPLICABLE_POLICIES",
    "STRATEGIES",
    "JURY_READING",
    "CAPSEAL_READING",
    "PHRASES",
    "UNKNOWN_STATUS_PHRASE",
]

#: judgment ``status`` wire tokens
STATUSES = ("pass", "fail", "abstain", "not_applicable", "error")
#: the 0.13 form: upper-case enum names, read as their wire tokens
STATUS_BY_ENUM = {s.upper(): s for s in STATUSES}

#: judgment ``reasonCode`` tokens and their origin family (None: no family)
REASON_FAMILY: dict[str, str | None] = {
    "judge_failed": "JUDGE", "judge_metadata_unreadable": "JUDGE", "judge_reported": "JUDGE",
    "undeclared_not_applicable": "JUDGE",
    "errors_propagated": "WRAPPER",
    "not_applicable_refused": "MACHINERY", "aggregation_failed": "MACHINERY", "stage_failed": "MACHINERY",
    "no_tier_decided": "MACHINERY",
    "subject_empty": None,
}

DECISION_KINDS = ("own", "tier", "undecided")
DECISION_BASES = ("tier_outcome", "individual_rejection")
RELATIONS = ("cascade_tier", "meta_member")
POLICIES = ("REJECT_ON_ANY_FAIL", "ACCEPT_ON_ALL_PASS", "FINAL_TIER")
DISPOSITIONS = ("used", "stage_failed")
DISPOSITION_REASONS = ("execution_failed", "child_undecided", "undeclared_not_applicable")
FAILURE_CODES = ("jury_execution_failed",)
KEY_SOURCES = ("DECLARED", "DEDUPLICATED", "POSITIONAL")
ERROR_POLICIES = ("propagate", "treatAsFail", "treatAsAbstain", "ignore")
NOT_APPLICABLE_POLICIES = ("refuse", "exclude", "treatAsFail")
#: strategies whose rule the support check knows in closed form
STRATEGIES = ("consensus", "majority", "allMustPass", "average", "weightedAverage", "median", "conjunctive")

#: a jury status read as a reading (first match of the reading rules, after an individual rejection)
JURY_READING = {
    "error": "NOT_ASSESSED", "not_applicable": "NOT_APPLICABLE", "fail": "REJECTED", "pass": "ACCEPTED",
    "abstain": "UNDECIDED",
}

#: a capseal verdict token read as a reading (an Evidence Result claim's only under SATISFIED)
CAPSEAL_READING = {
    "met": "ACCEPTED", "not_met": "REJECTED", "not_evaluable": "UNDECIDED",
    "corroborated": "ACCEPTED", "contradicted": "REJECTED", "inconclusive": "UNDECIDED",
    "not_comparable": "NOT_APPLICABLE",
}

#: how the summary says a recorded status; any other token is "recorded status <token>"
PHRASES = {
    "pass": "passed", "fail": "failed", "abstain": "abstained", "not_applicable": "was not applicable",
    "error": "errored",
    "met": "was met", "not_met": "was not met", "not_evaluable": "was not evaluable",
    "corroborated": "was corroborated", "contradicted": "was contradicted", "inconclusive": "was inconclusive",
    "not_comparable": "was not comparable", "not_adjudicated": "was not adjudicated",
}
UNKNOWN_STATUS_PHRASE = "recorded status"

