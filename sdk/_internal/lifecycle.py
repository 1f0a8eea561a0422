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

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..canonical import is_hex64, json_digest
from ..errors import InputError, shown
from .inputs import texts

__all__ = ["Flow", "Flows", "lifecycle_suffix", "rebuild_flow", "CARRIED_RELATIONS", "NOT_GIVEN", "planned",
           "dispatched", "after_dispatch", "confirmed", "failed", "refused", "resolved"]

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


# ---------------------------------------------------------------------------- the flows a producer holds


class Flows:
    """The flows of the planned and dispatched capsules this producer sealed,
    by capsule id (a flow is forgotten when its action is finished)."""

    def __init__(self) -> None:
        self._flows: dict[str, Flow] = {}
        self._lock = threading.Lock()

    def get(self, capsule_id: str) -> Flow | None:
        with self._lock:
            return self._flows.get(capsule_id)

    def remember(self, capsule_id: str, flow: Flow) -> None:
        with self._lock:
            self._flows[capsule_id] = flow

    def forget(self, capsule_id: str) -> None:
        with self._lock:
            self._flows.pop(capsule_id, None)


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


# ---------------------------------------------------------------------------- the specs of lifecycle calls


class _NotGiven:
    """The default of a lifecycle call's ``request``: not given (None means none)."""

    def __repr__(self) -> str:
        return "<not given>"


NOT_GIVEN: Any = _NotGiven()


def as_mapping(key: str, value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object.

    Raises:
        InputError: it is not (never the TypeError of ``**value``).
    """
    if not isinstance(value, Mapping):
        raise InputError(f"{key} is a JSON object of extra members; got {type(value).__name__}")
    return value


def merge_members(key: str, built: Mapping[str, Any], value: Any) -> Mapping[str, Any]:
    """The caller's members of block ``key``.

    Raises:
        InputError: one contradicts what the call built.
    """
    given = as_mapping(key, value)
    for member, item in given.items():
        if member in built and item != built[member]:
            raise InputError(f"{key}.{member}={shown(item)} contradicts what this call records "
                             f"({shown(built[member])}); use the call's own parameters")
    return given


def with_extras(spec: dict[str, Any], extras: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's extra members added to the spec a lifecycle call built.

    An extra block the call builds itself (planned()'s ``effect``, refused()'s
    ``disposition``) is merged member by member, and a member that
    contradicts the call is refused: replacing the block wholesale would let
    planned() seal a confirmed effect, or refused() lose its verdict class.

    Raises:
        InputError: an extra member contradicts the call.
    """
    for key, value in extras.items():
        if value is None:
            continue
        built = spec.get(key)
        if isinstance(built, dict):
            value = {**built, **merge_members(key, built, value)}
        spec[key] = value
    return spec


def chained(spec: dict[str, Any], parent_id: str, relation: str) -> dict[str, Any]:
    """``spec`` chained to ``parent_id`` with ``relation``.

    Raises:
        InputError: the caller gave a chain of its own.
    """
    if "chain" in spec:
        raise InputError("the chain is set by the lifecycle call; seal() takes an explicit chain")
    spec["chain"] = {"parent_capsule_id": parent_id, "relation": relation}
    return spec


def effect(flow: Flow, status: str, attestation: str, *, request: Any = NOT_GIVEN, response: Any = None) -> dict[str, Any]:
    """The effect block of a dispatched, confirmed or failed capsule of ``flow``.

    ``request`` given: its digest; None: no request digest; not given: the
    flow's (the request given to ``planned()``, or the dispatched capsule's).

    Raises:
        InputError: not given, and the flow's request digest cannot be known.
        CanonicalizationError: ``request`` or ``response`` is not canonical JSON.
    """
    block: dict[str, Any] = {"status": status}
    if flow.effect_type is not None:
        block["type"] = flow.effect_type
    if request is not NOT_GIVEN and request is not None:
        request_digest: str | None = json_digest(request, path="request")
    elif flow.request_known or request is None:  # None: the caller says there is no request to digest
        request_digest = flow.request_digest
    else:
        raise InputError(
            f"the request digest of this {status} capsule cannot be recovered: its flow starts at a planned "
            "capsule this producer did not seal (a planned capsule never carries its request's digest, -05 §5.3)",
            hint="pass request= (the request actually sent), or request=None to seal it without a request digest")
    if request_digest is not None:
        block["request_digest"] = request_digest
    if response is not None:
        block["response_digest"] = json_digest(response, path="response")
    if flow.external_ref is not None:
        block["external_ref"] = flow.external_ref
    if flow.irreversibility_class is not None:
        block["irreversibility_class"] = flow.irreversibility_class
    block["effect_attestation"] = attestation
    return block


def planned(action_id: str, *, effect_type: str | None, request: Any, irreversibility_class: str | None,
            external_ref: str | None, action_type: str, extra: Mapping[str, Any]) -> tuple[dict[str, Any], Flow]:
    """The spec of a planned capsule (no digests on a planned effect, -05
    §5.3) and the flow its next capsule continues (with the request's digest).

    Raises:
        InputError, CanonicalizationError: a bad argument, named.
    """
    texts(action_id=action_id, action_type=action_type)
    texts(optional=True, effect_type=effect_type, irreversibility_class=irreversibility_class,
          external_ref=external_ref)
    block: dict[str, Any] = {"status": "planned"}
    if effect_type is not None:
        block["type"] = effect_type
    if irreversibility_class is not None:
        block["irreversibility_class"] = irreversibility_class
    if external_ref is not None:
        block["external_ref"] = external_ref
    request_digest = json_digest(request, path="request") if request is not None else None
    spec = with_extras({"action_id": action_id, "action_type": action_type, "effect": block}, extra)
    return spec, Flow(action_id, effect_type, request_digest, irreversibility_class, external_ref)


def dispatched(flow: Flow, parent_id: str, *, request: Any, effect_attestation: str, action_id: str | None,
               extra: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a dispatched capsule of ``flow`` (follows its parent)."""
    texts(effect_attestation=effect_attestation)
    texts(optional=True, action_id=action_id)
    block = effect(flow, "dispatched", effect_attestation, request=request)
    spec = with_extras({"action_id": action_id or f"{flow.base_action_id}/dispatched", "action_type": "decide",
                        "effect": block}, extra)
    return chained(spec, parent_id, "follows")


def after_dispatch(flow: Flow, capsule: Mapping[str, Any]) -> Flow:
    """The flow the next capsule continues after a dispatched ``capsule``: the
    digest of the request actually sent (-05 §5.3), not the planned one."""
    return replace(flow, request_digest=capsule["effect"].get("request_digest"), request_known=True)


def confirmed(flow: Flow, parent_id: str, *, response: Any, request: Any, effect_attestation: str,
              action_id: str | None, verdict_class: str | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a confirmed capsule of ``flow`` (confirms its parent);
    ``response`` is the response actually received (never None: -05 §5.3)."""
    texts(effect_attestation=effect_attestation)
    texts(optional=True, action_id=action_id, verdict_class=verdict_class)
    block = effect(flow, "confirmed", effect_attestation, request=request, response=response)
    spec = with_extras({"action_id": action_id or f"{flow.base_action_id}/confirmed", "action_type": "decide",
                        "effect": block}, extra)
    if verdict_class is not None:
        given = merge_members("disposition", {"verdict_class": verdict_class}, spec.get("disposition", {}))
        spec["disposition"] = {"decision": "accept", "approver": "policy", "human_disposed": False, **given,
                               "verdict_class": verdict_class}
    return chained(spec, parent_id, "confirms")


def failed(flow: Flow, parent_id: str, *, response: Any, request: Any, effect_attestation: str,
           verdict_class: str, action_id: str | None, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a failed capsule of ``flow`` (follows its parent)."""
    texts(effect_attestation=effect_attestation, verdict_class=verdict_class)
    texts(optional=True, action_id=action_id)
    block = effect(flow, "failed", effect_attestation, request=request, response=response)
    spec = with_extras({"action_id": action_id or f"{flow.base_action_id}/failed", "action_type": "decide",
                        "effect": block}, extra)
    spec["disposition"] = {"decision": "accept", "approver": "policy", "human_disposed": False,
                           "verdict_class": verdict_class, **as_mapping("disposition", spec.get("disposition", {}))}
    return chained(spec, parent_id, "follows")


def refused(flow: Flow | None, parent_id: str | None, *, verdict_class: str, action_id: str | None, decision: str,
            approver: str, human_disposed: bool, reason: Any, authority: str | None,
            extra: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a refusal (no effect dispatched; -05 §5.5.3 wants a
    capsule for every verdict), following ``parent_id`` when given.

    Raises:
        InputError: no parent and no ``action_id``.
    """
    texts(verdict_class=verdict_class, decision=decision, approver=approver)
    texts(optional=True, action_id=action_id, authority=authority)
    disposition: dict[str, Any] = {"decision": decision, "approver": approver, "human_disposed": human_disposed,
                                   "verdict_class": verdict_class}
    if reason is not None:
        disposition["reason_digest"] = json_digest(reason, path="reason")
    if authority is not None:
        disposition["authority"] = authority
    if flow is not None:
        base = action_id or f"{flow.base_action_id}/{verdict_class}"
    elif action_id is None:
        raise InputError("refused() needs action_id when there is no parent")
    else:
        base = action_id
    spec = with_extras({"action_id": base, "action_type": "decide", "disposition": disposition}, extra)
    return chained(spec, parent_id, "follows") if parent_id is not None else spec


def resolved(flow: Flow, open_id: str, *, decision: str, approver: str, human_disposed: bool | None,
             verdict_class: str, action_id: str | None, reason: Any, extra: Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a resolution closing the open item ``open_id`` (supersedes
    it, -05 §5.5.4); ``human_disposed`` follows ``approver`` unless given."""
    texts(decision=decision, approver=approver, verdict_class=verdict_class)
    texts(optional=True, action_id=action_id)
    if human_disposed is None:
        human_disposed = approver == "human"
    disposition: dict[str, Any] = {"decision": decision, "approver": approver, "human_disposed": human_disposed,
                                   "verdict_class": verdict_class}
    if reason is not None:
        disposition["reason_digest"] = json_digest(reason, path="reason")
    spec = with_extras({"action_id": action_id or f"{flow.base_action_id}/{verdict_class}", "action_type": "decide",
                        "disposition": disposition}, extra)
    return chained(spec, open_id, "supersedes")
