"""``decidedBy``: walking the decision chain a stored jury verdict records.

Only recorded ``decision`` members are read. Which stage decided is never
inferred from the root equalling a sub-verdict, from attempt order or from
reasoning text: a record without a decision has ``decidedBy`` null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .defects import Findings
from .jury_nodes import normalise_status
from .model import DecidedBy
from .values import brief, json_equal

__all__ = ["Walk", "walk_decision", "individual_statuses", "direct_attempt"]

#: edges followed before the chain is called unreadable
MAX_EDGES = 65


@dataclass(frozen=True)
class Walk:
    """Where the chain stopped: who decided, whether on an individual rejection,
    at which node (and its path), with which decision kind (None: none read)."""

    decided_by: DecidedBy | None
    rejection: bool
    node: dict[str, Any]
    path: str
    kind: str | None


def individual_statuses(node: dict[str, Any]) -> list[str] | None:
    """The node's individual statuses (``individual``, else the values of
    ``individualByName``), normalised; None when they are unreadable.

    Args:
        node: a verdict node.

    Returns:
        The normalised statuses, or None when they are unreadable.
    """
    individual = node.get("individual")
    if isinstance(individual, list):
        entries = individual
    else:
        by_name = node.get("individualByName")
        if not isinstance(by_name, dict):
            return None
        entries = list(by_name.values())
    out: list[str] = []
    for entry in entries:
        status = entry.get("status") if isinstance(entry, dict) else None
        if not isinstance(status, str):
            return None
        out.append(normalise_status(status) or status)
    return out


def direct_attempt(node: dict[str, Any], tier: str) -> tuple[int, dict[str, Any]] | None:
    """The first direct attempt named ``tier`` whose relation is null or ``cascade_tier``.

    Args:
        node: a verdict node.
        tier: the tier name a decision names.

    Returns:
        ``(index, attempt)`` of the first match, or None.
    """
    attempts = node.get("compositeAttempts")
    if not isinstance(attempts, list):
        return None
    for j, attempt in enumerate(attempts):
        if isinstance(attempt, dict) and attempt.get("name") == tier and attempt.get("relation") in (None, "cascade_tier"):
            return j, attempt
    return None


def _follow(node: dict[str, Any], path: str, tier: str, decision_path: str, found: Findings) -> tuple[dict[str, Any], str] | None:
    """Check one ``tier_outcome`` edge; the child to move into, or None to stop."""
    hit = direct_attempt(node, tier)
    if hit is None:
        found.inconsistent(decision_path, "tier", f"the decision names tier {brief(tier)}, which the record does not hold")
        return None
    j, attempt = hit
    disposition = attempt.get("disposition")
    if disposition is None:
        found.undetermined()
    elif disposition != "used":
        found.inconsistent(decision_path, "basis", f"the adopted tier {brief(tier)} is recorded as {brief(disposition)}, not used")
    child = attempt.get("verdict")
    if not isinstance(child, dict):
        found.inconsistent(decision_path, "tier", f"the adopted tier {brief(tier)} records no verdict")
        return None
    same = json_equal(node.get("aggregated"), child.get("aggregated"))
    if same is None:
        found.undetermined()  # too deep (or cyclic) to compare
    elif not same:
        found.inconsistent(decision_path, "basis", f"the root's aggregate is not the outcome of tier {brief(tier)} it says it adopted")
    statuses = individual_statuses(child)
    policy = attempt.get("policy")
    if statuses is None:
        found.undetermined()
    elif policy == "REJECT_ON_ANY_FAIL" and "fail" not in statuses:
        found.inconsistent(decision_path, "basis", f"tier {brief(tier)} runs REJECT_ON_ANY_FAIL, which stops only on a fail, and none is recorded")
    elif policy == "ACCEPT_ON_ALL_PASS" and not all(s == "pass" for s in statuses):
        found.inconsistent(decision_path, "basis", f"tier {brief(tier)} runs ACCEPT_ON_ALL_PASS, which stops only when every judge passed")
    decision = child.get("decision")
    if isinstance(decision, dict) and decision.get("kind") == "undecided":
        found.inconsistent(decision_path, "basis", f"the adopted tier {brief(tier)} itself decided nothing")
    return child, f"{path}.compositeAttempts[{j}].verdict"


def walk_decision(root: dict[str, Any], found: Findings) -> Walk:
    """Follow ``decision`` from the root: ``own``/``undecided`` stop, ``tier`` with
    ``tier_outcome`` moves into that tier, ``individual_rejection`` stops there.

    Args:
        root: the stored verdict.
        found: where defects and undeterminable marks go.

    Returns:
        The Walk: who decided, whether on an individual rejection, and where the chain stopped.
    """
    node, path = root, "verdict"
    own_path: tuple[str, ...] = ()
    last_edge: str | None = None

    def via() -> DecidedBy | None:
        return DecidedBy(last_edge, own_path, "tier_outcome") if last_edge is not None else None

    for _ in range(MAX_EDGES):
        decision = node.get("decision")
        if decision is None:
            found.absent(path, "decision", "the record does not say which stage decided")
            if last_edge is not None:
                found.undetermined()
            return Walk(via(), False, node, path, None)
        if not isinstance(decision, dict):
            found.unparseable(path, "decision", f"a decision is an object, not {type(decision).__name__}")
            found.undetermined()
            return Walk(via(), False, node, path, None)
        at = f"{path}.decision"
        kind = decision.get("kind")
        if not isinstance(kind, str):
            if kind is None:
                found.absent(at, "kind", "the decision records no kind")
            else:
                found.unparseable(at, "kind", f"a decision kind is a token, not {type(kind).__name__}")
            found.undetermined()
            return Walk(via(), False, node, path, None)
        if kind in ("own", "undecided"):
            return Walk(via(), False, node, path, kind)
        if kind != "tier":
            found.unknown(at, "kind", f"decision kind {brief(kind)} is not a token this reader defines; kept as recorded")
            found.undetermined()
            return Walk(via(), False, node, path, kind)
        tier = decision.get("tier")
        if not isinstance(tier, str):
            found.absent(at, "tier", "a tier decision names its tier")
            found.undetermined()
            return Walk(via(), False, node, path, kind)
        tier_path = (*own_path, tier)
        basis = decision.get("basis")
        if not isinstance(basis, str):
            found.absent(at, "basis", "a tier decision records its basis")
            found.undetermined()
            return Walk(via(), False, node, path, kind)
        if basis == "individual_rejection":
            return Walk(DecidedBy(tier, tier_path, basis), True, node, path, kind)
        if basis != "tier_outcome":
            found.unknown(at, "basis", f"decision basis {brief(basis)} is not a token this reader defines; kept as recorded")
            found.undetermined()
            return Walk(DecidedBy(tier, tier_path, basis), False, node, path, kind)
        moved = _follow(node, path, tier, at, found)
        if moved is None:
            return Walk(DecidedBy(tier, tier_path, basis), False, node, path, kind)
        node, path = moved
        last_edge, own_path = tier, tier_path
    found.unparseable(path, "decision", f"the decision chain runs longer than {MAX_EDGES} edges; not followed")
    found.undetermined()
    return Walk(None, False, node, path, None)
