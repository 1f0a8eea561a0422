"""Whether a stored jury verdict's recorded facts back its reading.

Three checks, after the decision walk: the rejection check (a decision that
stopped on an individual rejection), the undecided check, and the closed-form
check of the root's *own* evidence block against the root's status and reason
code. Evidence found elsewhere in the tree is never used. Each contradiction is
one INCONSISTENT defect; a fact the check needs that is absent, or a rule that
is not closed-form, marks the reading undeterminable.
"""

from __future__ import annotations

from typing import Any

from .defects import Findings
from .jury_decision import Walk, direct_attempt, individual_statuses
from .jury_nodes import block_present, normalise_status
from .model import Evidence
from .values import brief, is_number, json_equal
from .vocab import REASON_FAMILY, STATUSES

__all__ = ["check_support"]

_ROOT = "verdict.aggregated"


def _rejection(walk: Walk, found: Findings) -> None:
    node, decision_path = walk.node, f"{walk.path}.decision"
    decision = node.get("decision")
    tier = decision.get("tier") if isinstance(decision, dict) else None
    hit = direct_attempt(node, tier) if isinstance(tier, str) else None
    if hit is None:
        found.inconsistent(decision_path, "tier", f"the rejection is said to be established in tier {brief(tier)}, which the record does not hold")
        return
    _, attempt = hit
    disposition, reason = attempt.get("disposition"), attempt.get("dispositionReason")
    if disposition is None or reason is None:
        found.undetermined()
    else:
        if disposition != "stage_failed" or reason == "execution_failed":
            found.inconsistent(decision_path, "basis", f"a rejection stops on a stage whose reduction failed over a genuine FAIL; "
                               f"this one is {brief(disposition)} / {brief(reason)}")
        if reason not in ("child_undecided", "undeclared_not_applicable"):
            found.undetermined()
    policy = attempt.get("policy")
    if policy is None:
        found.undetermined()
    elif policy != "REJECT_ON_ANY_FAIL":
        found.inconsistent(decision_path, "basis", f"only a REJECT_ON_ANY_FAIL tier stops on an individual rejection; this one runs {brief(policy)}")
    child = attempt.get("verdict")
    if not isinstance(child, dict):
        found.inconsistent(decision_path, "tier", "the rejecting tier records no verdict")
        return
    statuses = individual_statuses(child)
    if statuses is None:
        found.undetermined()
    elif "fail" not in statuses:
        found.inconsistent(decision_path, "basis", "no judge of the rejecting tier failed: a broken stage on its own justifies nothing")
    mine, theirs = node.get("aggregated"), child.get("aggregated")
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        found.undetermined()
        return
    if reason == "child_undecided":
        same = json_equal(mine, theirs)
        if same is None:
            found.undetermined()
        elif not same:
            found.inconsistent(decision_path, "basis", "a child_undecided rejection carries the tier's own aggregate, and this one differs")
    elif reason == "undeclared_not_applicable":
        status = theirs.get("status")
        if isinstance(status, str) and normalise_status(status) != "not_applicable":
            found.inconsistent(decision_path, "basis", f"an undeclared_not_applicable tier reduced to not_applicable, not {brief(status)}")
        if mine.get("reasonCode") != "stage_failed":
            found.inconsistent(decision_path, "basis", "the root of an undeclared_not_applicable rejection records reason code stage_failed")


def _undecided(walk: Walk, found: Findings) -> None:
    aggregated = walk.node.get("aggregated")
    decision_path = f"{walk.path}.decision"
    if not isinstance(aggregated, dict):
        found.undetermined()
        return
    if normalise_status(aggregated.get("status")) != "error":
        found.inconsistent(decision_path, "kind", "an undecided decision is a machinery error, and the aggregate is not an error")
        return
    code = aggregated.get("reasonCode")
    if not isinstance(code, str) or code not in REASON_FAMILY:
        found.undetermined()
    elif REASON_FAMILY[code] != "MACHINERY":
        found.inconsistent(decision_path, "kind", f"an undecided decision is a machinery error; {brief(code)} is not one")


def _expected(e: Evidence, aggregated: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """``(outcome, status, code)`` the root evidence implies: outcome is
    ``expect``, ``tie``, ``missing`` (status then names the member) or ``open``."""
    if e.get("strategy") is None:
        return "missing", "strategy", None
    na_policy, na_count = e.get("notApplicablePolicy"), e.get("notApplicableCount") or 0
    error_policy, error_count = e.get("errorPolicy"), e.get("errorCount") or 0
    if na_policy == "refuse" and na_count > 0:
        return "expect", "error", "not_applicable_refused"
    if error_policy == "propagate" and error_count > 0:
        return "expect", "error", "errors_propagated"
    causes = e.get("errorCodeCounts")
    if error_policy == "treatAsFail" and error_count > 0 and causes is not None:
        if not causes or any(code not in REASON_FAMILY or REASON_FAMILY[code] == "MACHINERY" for code, _ in causes):
            return "expect", "error", "errors_propagated"
    eligible = e.get("eligibleCount")
    if eligible is None:
        return "missing", "eligibleCount", None
    if eligible == 0:
        if na_policy == "exclude" and na_count > 0 and na_count == e.get("inputCount"):
            return "expect", "not_applicable", None
        return "expect", "abstain", None
    strategy = e.get("strategy")
    passes, fails = e.get("passCount"), e.get("failCount")
    if strategy in ("consensus", "majority"):
        if passes is None:
            return "missing", "passCount", None
        if fails is None:
            return "missing", "failCount", None
        if strategy == "consensus":
            return "expect", "pass" if passes == eligible else "fail" if fails == eligible else "abstain", None
        if passes == fails:
            return "tie", None, None
        return "expect", "pass" if passes > fails else "fail", None
    if strategy == "allMustPass":
        if fails is None:
            return "missing", "failCount", None
        return "expect", "pass" if fails == 0 else "fail", None
    if strategy in ("average", "weightedAverage", "median", "conjunctive"):
        threshold = e.get("threshold")
        if threshold is None:
            return "missing", "threshold", None
        score = aggregated.get("score")
        if not is_number(score):
            return "open", None, None
        return "expect", "pass" if score >= threshold else "fail", None
    return "open", None, None


def _closed_form(e: Evidence, aggregated: dict[str, Any], status: str | None, code: str | None, found: Findings) -> None:
    if status is None or status not in STATUSES:
        found.undetermined()
        return
    outcome, want, want_code = _expected(e, aggregated)
    if outcome == "missing":
        found.absent(_ROOT, f"metadata.aggregation.{want}", f"the closed-form rule needs {want}")
        found.undetermined()
    elif outcome == "open":
        found.undetermined()
    elif outcome == "tie":
        if status not in ("pass", "fail", "abstain"):
            found.inconsistent(_ROOT, "status", f"a tied majority reduces to pass, fail or abstain, not {brief(status)}")
    else:
        if want != status:
            found.inconsistent(_ROOT, "status", f"the root's own evidence gives {brief(want)}; the root records {brief(status)}")
        if want_code is not None and code is not None and want_code != code:
            found.inconsistent(_ROOT, "reasonCode", f"the root's own evidence gives reason code {brief(want_code)}; the root records {brief(code)}")


def check_support(root: dict[str, Any], walk: Walk, evidence: Evidence | None, status: str | None, code: str | None,
                  found: Findings) -> None:
    """Run the support checks of a stored verdict whose decision walk gave ``walk``
    (``evidence``, ``status``, ``code``: the root aggregate's, as read).

    Args:
        root: the stored verdict object.
        walk: the decision walk's result.
        evidence: the root's evidence as read.
        status: the root status as read.
        code: the root reason code as read.
        found: where defects and undeterminable marks go.

    Returns:
        None; the checks record their findings in ``found``.
    """
    if walk.rejection:
        _rejection(walk, found)
    if walk.kind == "undecided":
        _undecided(walk, found)
    own = walk.kind in (None, "own")
    aggregated = root.get("aggregated")
    if not isinstance(aggregated, dict):
        found.undetermined()
        return
    if evidence is None:
        if own and not walk.rejection:
            if not block_present(aggregated):
                found.absent(_ROOT, "metadata.aggregation", "the root records no evidence block, so its reduction cannot be checked")
            found.undetermined()
        return
    _closed_form(evidence, aggregated, status, code, found)
