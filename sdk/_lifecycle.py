"""What one action's capsules carry from one to the next (its *flow*), and how
to rebuild that from the ledger when the producer that sealed the earlier
capsule is not the one sealing the next (a restart, a second worker).

A flow starts at ``planned()`` (or at any capsule a lifecycle call is given as
its parent) and names its later capsules ``<base>/dispatched``,
``<base>/confirmed``, ``<base>/failed`` or ``<base>/<verdict_class>``. Rebuilt
from a stored capsule, the base is exactly what the sealing producer held:
a ``dispatched`` capsule carries on its parent's flow (its parent is looked
up), and any other capsule's base is its action id with only the suffix a
lifecycle call adds for that kind of capsule removed — never cut at the first
``/``, so ``run-1/call-2`` stays one action.

What cannot be rebuilt is said so: a planned capsule never carries the digest
of its request (-05 §5.3), so a flow rebuilt from one has ``request_known``
False, and the next call must be given the request again (or told there is
none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Flow", "lifecycle_suffix", "rebuild_flow", "CARRIED_RELATIONS"]

#: The chain relations lifecycle calls write between the capsules of one flow.
CARRIED_RELATIONS = frozenset({"follows", "confirms", "supersedes"})

# a dispatched capsule chained to a dispatched capsule chained to …: a flow
# this long was not made by lifecycle calls, and the walk stops there
_MAX_STEPS = 64


@dataclass(frozen=True)
class Flow:
    """What the producer remembers between the capsules of one action."""

    base_action_id: str
    effect_type: str | None
    request_digest: str | None
    irreversibility_class: str | None
    external_ref: str | None
    #: False when the request's digest cannot be known (see the module docstring)
    request_known: bool = True


def _block(capsule: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = capsule.get(name)
    return value if isinstance(value, Mapping) else {}


def lifecycle_suffix(capsule: Mapping[str, Any]) -> str | None:
    """The suffix a lifecycle call adds to its flow's base action id for a
    capsule like this one (``/dispatched``, ``/confirmed``, ``/failed`` for an
    effect; ``/<verdict_class>`` for a refusal or resolution), or None (a
    planned capsule, or one no lifecycle call makes)."""
    effect = capsule.get("effect")
    if isinstance(effect, Mapping):
        status = effect.get("status")
        return f"/{status}" if isinstance(status, str) and status != "planned" else None
    verdict = _block(capsule, "disposition").get("verdict_class")
    return f"/{verdict}" if isinstance(verdict, str) else None


def _parent_id(capsule: Mapping[str, Any]) -> str | None:
    chain = _block(capsule, "chain")
    parent = chain.get("parent_capsule_id")
    return parent if isinstance(parent, str) and chain.get("relation") in CARRIED_RELATIONS else None


def base_action_id(capsule: Mapping[str, Any], lookup: Callable[[str], Mapping[str, Any] | None]) -> str:
    """The base action id of the flow ``capsule`` belongs to.

    Args:
        capsule: a stored capsule.
        lookup: returns the stored capsule with a given id, or None.

    Returns:
        The base the producer that sealed ``capsule`` held for its flow.
    """
    current = capsule
    for _ in range(_MAX_STEPS):
        parent_id = _parent_id(current)
        if parent_id is not None and _block(current, "effect").get("status") == "dispatched":
            parent = lookup(parent_id)
            if parent is not None:  # dispatched() carries on the flow of its parent
                current = parent
                continue
        break
    action_id = str(current.get("action_id", ""))
    suffix = lifecycle_suffix(current)
    if _parent_id(current) is not None and suffix and action_id.endswith(suffix) and len(action_id) > len(suffix):
        return action_id[: -len(suffix)]
    return action_id


def rebuild_flow(capsule: Mapping[str, Any], lookup: Callable[[str], Mapping[str, Any] | None]) -> Flow:
    """The flow ``capsule`` continues, rebuilt from stored capsules.

    Args:
        capsule: the parent a lifecycle call was given (a stored capsule).
        lookup: returns the stored capsule with a given id, or None.

    Returns:
        The flow, with ``request_known`` False when ``capsule`` is planned
        (its request's digest was never written).
    """
    effect = _block(capsule, "effect")

    def member(name: str) -> str | None:
        value = effect.get(name)
        return value if isinstance(value, str) else None

    planned = effect.get("status") == "planned"
    return Flow(
        base_action_id(capsule, lookup),
        member("type"),
        None if planned else member("request_digest"),
        member("irreversibility_class"),
        member("external_ref"),
        request_known=not planned,
    )
