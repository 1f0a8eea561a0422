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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..canonical import json_digest
from ..errors import InputError, shown
from ..record import SealedRecord
from .inputs import capsule_ref as checked_capsule_ref
from .inputs import texts

__all__ = ["Flow", "Flows", "LifecycleCalls", "NOT_GIVEN", "Parent", "planned_spec", "dispatched_spec",
           "after_dispatch", "confirmed_spec", "failed_spec", "refused_spec", "resolved_spec", "capsule_ref"]

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


def planned_spec(action_id: str, *, effect_type: str | None, request: Any, irreversibility_class: str | None,
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


def dispatched_spec(flow: Flow, parent_id: str, *, request: Any, effect_attestation: str, action_id: str | None,
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


def confirmed_spec(flow: Flow, parent_id: str, *, response: Any, request: Any, effect_attestation: str,
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


def failed_spec(flow: Flow, parent_id: str, *, response: Any, request: Any, effect_attestation: str,
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


def refused_spec(flow: Flow | None, parent_id: str | None, *, verdict_class: str, action_id: str | None, decision: str,
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


def resolved_spec(flow: Flow, open_id: str, *, decision: str, approver: str, human_disposed: bool | None,
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


# ---------------------------------------------------------------------------- the lifecycle calls of a producer

Parent = SealedRecord | str


def capsule_ref(parent: Parent, name: str = "parent") -> str:
    """The capsule id of ``parent`` (a SealedRecord or an id), checked; InputError naming ``name``."""
    return checked_capsule_ref(name, parent)


class LifecycleCalls:
    """The six lifecycle calls of :class:`capseal.Producer`: each builds its
    capsule's spec here and seals it through the producer (``_seal_flow``),
    which also finds the flow of a parent (``_flow``)."""

    _flows: Flows

    def _seal_flow(self, spec: dict[str, Any]) -> SealedRecord:
        raise NotImplementedError  # the producer's

    def _flow(self, parent: Parent, name: str = "parent") -> Flow:
        raise NotImplementedError  # the producer's

    def planned(self, action_id: str, *, effect_type: str | None = None, request: Any = None,
                irreversibility_class: str | None = None, external_ref: str | None = None,
                action_type: str = "decide", **extra: Any) -> SealedRecord:
        """Seal that an action is planned (no digests on a planned effect, -05 §5.3).

        Args:
            action_id: the action's id (later capsules are named ``<action_id>/dispatched`` …).
            effect_type: a registered or namespaced (``x-…``) effect type.
            request: the request to be sent; digested now, used by the next capsule.
            irreversibility_class, external_ref: carried by every capsule of the flow.
            action_type: ``decide`` or ``fyi``.
            extra: other capsule members (a block the call builds is merged member by member).

        Returns:
            The sealed record, once durable.

        Raises:
            InputError: a bad argument (named), and as :meth:`seal`.
        """
        spec, flow = planned_spec(action_id, effect_type=effect_type, request=request,
                                  irreversibility_class=irreversibility_class, external_ref=external_ref,
                                  action_type=action_type, extra=extra)
        record = self._seal_flow(spec)
        self._flows.remember(record.capsule_id, flow)
        return record

    def dispatched(self, parent: Parent, *, request: Any = NOT_GIVEN, effect_attestation: str = "runtime_claimed",
                   action_id: str | None = None, **extra: Any) -> SealedRecord:
        """Seal that the action was dispatched (follows ``parent``).

        Args:
            parent: the planned record (or its capsule id).
            request: the request actually sent. Left out: the request given to
                ``planned()``; when the planned capsule was sealed by another
                producer (another process, or before a restart) that cannot be
                recovered and InputError asks for ``request=`` (``request=None``
                seals without a request digest).
            effect_attestation: who saw the effect (``runtime_claimed`` …).
            action_id: default ``<base>/dispatched``.
            extra: other capsule members, as for :meth:`planned`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError: a parent this ledger does not hold, a request that
                cannot be recovered, a bad argument; and as :meth:`seal`.
        """
        flow = self._flow(parent)
        spec = dispatched_spec(flow, capsule_ref(parent), request=request, effect_attestation=effect_attestation,
                               action_id=action_id, extra=extra)
        record = self._seal_flow(spec)
        self._flows.remember(record.capsule_id, after_dispatch(flow, record.capsule))
        return record

    def confirmed(self, parent: Parent, *, response: Any, request: Any = NOT_GIVEN,
                  effect_attestation: str = "runtime_claimed", action_id: str | None = None,
                  verdict_class: str | None = None, **extra: Any) -> SealedRecord:
        """Seal that the effect is confirmed by ``response``, the response
        actually received (its digest is computed here); chains ``confirms``.

        Args:
            parent: the dispatched record (or its capsule id).
            response: the response actually received (not None).
            request: as for :meth:`dispatched`.
            effect_attestation: who saw the effect (``runtime_claimed`` …).
            action_id: default ``<base>/confirmed``.
            verdict_class: when given, a ``disposition`` with this verdict class.
            extra: other capsule members, as for :meth:`planned`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError: no response; and as :meth:`dispatched`.
        """
        if response is None:
            raise InputError("confirmed() needs the response actually received (-05 §5.3)")
        flow = self._flow(parent)
        spec = confirmed_spec(flow, capsule_ref(parent), response=response, request=request,
                              effect_attestation=effect_attestation, action_id=action_id,
                              verdict_class=verdict_class, extra=extra)
        record = self._seal_flow(spec)
        self._flows.forget(capsule_ref(parent))
        return record

    def failed(self, parent: Parent, *, response: Any = None, request: Any = NOT_GIVEN,
               effect_attestation: str = "runtime_claimed", verdict_class: str = "errored",
               action_id: str | None = None, **extra: Any) -> SealedRecord:
        """Seal that the dispatched action failed (optionally digesting the
        failure response); follows ``parent``.

        Args:
            parent: the dispatched record (or its capsule id).
            response: the failure response, if any (digested).
            request: as for :meth:`dispatched`.
            effect_attestation: who saw the effect (``runtime_claimed`` …).
            verdict_class: why it failed (default ``errored``).
            action_id: default ``<base>/failed``.
            extra: other capsule members, as for :meth:`planned`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError: and the rest as :meth:`dispatched`.
        """
        flow = self._flow(parent)
        spec = failed_spec(flow, capsule_ref(parent), response=response, request=request,
                           effect_attestation=effect_attestation, verdict_class=verdict_class,
                           action_id=action_id, extra=extra)
        record = self._seal_flow(spec)
        self._flows.forget(capsule_ref(parent))
        return record

    def refused(self, parent: Parent | None = None, *, verdict_class: str, action_id: str | None = None,
                decision: str = "reject", approver: str = "policy", human_disposed: bool = False,
                reason: Any = None, authority: str | None = None, **extra: Any) -> SealedRecord:
        """Seal a refusal (blocked, denied, timeout before dispatch, …): -05
        §5.5.3 wants a capsule for every verdict. No effect is dispatched.

        Args:
            parent: the record refused (follows it), or None with ``action_id``.
            verdict_class: why (``denied``, ``blocked``, …).
            action_id: default ``<base>/<verdict_class>``; required without ``parent``.
            decision: the decision recorded (default ``reject``).
            approver: who decided (default ``policy``).
            human_disposed: True only when a human actually decided.
            reason: a JSON object, recorded as ``reason_digest`` only.
            authority: recorded as ``disposition.authority`` when given.
            extra: other capsule members, as for :meth:`planned`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError: no parent and no ``action_id``; and as :meth:`seal`.
        """
        flow = self._flow(parent) if parent is not None else None
        spec = refused_spec(flow, None if parent is None else capsule_ref(parent), verdict_class=verdict_class,
                            action_id=action_id, decision=decision, approver=approver,
                            human_disposed=human_disposed, reason=reason, authority=authority, extra=extra)
        record = self._seal_flow(spec)
        if parent is not None:
            self._flows.forget(capsule_ref(parent))
        return record

    def resolved(self, open_record: Parent, *, decision: str, approver: str, human_disposed: bool | None = None,
                 verdict_class: str = "resolved", action_id: str | None = None, reason: Any = None,
                 **extra: Any) -> SealedRecord:
        """Close an open item (deferred, needs_decision, hitl_dispatched, …)
        with a new capsule chained ``supersedes`` (-05 §5.5.4).

        ``approver`` has no default: ``"human"`` makes ``human_disposed``
        true, which -05 §5.5 allows only when a human actually acted, so the
        caller says who did.

        Args:
            open_record: the open record (or its capsule id) this closes.
            decision: the decision recorded.
            approver: who decided (``human``, ``policy`` …).
            human_disposed: default: True exactly when ``approver`` is ``human``.
            verdict_class: default ``resolved``.
            action_id: default ``<base>/<verdict_class>``.
            reason: a JSON object, recorded as ``reason_digest`` only.
            extra: other capsule members, as for :meth:`planned`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError: and the rest as :meth:`seal`.
        """
        flow = self._flow(open_record, "open_record")
        spec = resolved_spec(flow, capsule_ref(open_record, "open_record"), decision=decision, approver=approver,
                             human_disposed=human_disposed, verdict_class=verdict_class, action_id=action_id,
                             reason=reason, extra=extra)
        return self._seal_flow(spec)
