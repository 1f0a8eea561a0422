"""Rebuilding a flow from the ledger, for a lifecycle call whose parent was
sealed by another producer (a restart, a second worker): the base action id
exactly as the sealing producer held it, and what cannot be recovered said
so (see :mod:`capseal._internal.lifecycle`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..canonical import is_hex64
from ..errors import InputError
from .lifecycle import Flow, Flows

__all__ = ["CARRIED_RELATIONS", "base_action_id", "flow_of", "lifecycle_suffix", "rebuild_flow"]

#: The chain relations lifecycle calls write between the capsules of one flow.
CARRIED_RELATIONS = frozenset({"follows", "confirms", "supersedes"})

# a dispatched capsule chained to a dispatched capsule chained to …: a flow
# this long was not made by lifecycle calls, and the walk stops there
_MAX_STEPS = 64


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


def flow_of(parent: Any, parent_id: str, name: str, flows: Flows, known: Callable[[str], object],
            get: Callable[[str], Any]) -> Flow:
    """The flow ``parent`` belongs to: this producer's own, or rebuilt from its
    capsule exactly as the producer that sealed it held it.

    Args:
        parent: a SealedRecord, or the capsule id ``parent_id``.
        parent_id: its capsule id (checked).
        name: the argument's name, for errors.
        flows: this producer's flows.
        known: raises InputError for a record neither in the ledger nor on its way.
        get: the ledger's stored record with an id, or None.

    Raises:
        InputError: a parent this producer's ledger does not hold.
    """
    flow = flows.get(parent_id)
    if flow is not None:
        return flow

    def stored(capsule_id: str) -> Mapping[str, Any] | None:
        record = get(capsule_id) if is_hex64(capsule_id) else None
        return None if record is None else record.capsule

    capsule = getattr(parent, "capsule", None)
    if capsule is not None:  # a SealedRecord: a record of another ledger is refused as a chain to it is
        known(parent_id)
        return rebuild_flow(capsule, stored)
    found = stored(parent_id)
    if found is None:
        raise InputError(f"{name} {parent_id} is not in this producer's ledger")
    return rebuild_flow(found, stored)
