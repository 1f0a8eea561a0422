"""The capsules of one tool call, and what of a call may enter them.

A tool call is sealed as two capsules (``x-tool-call`` effects):

* ``<action_id>`` — ``planned``, before the tool runs: no digests and no
  effect attestation (-05 §5.3);
* ``<action_id>/confirmed`` (chained ``confirms``) with the digest of the
  arguments the tool ran with and of the response it returned, or
  ``<action_id>/failed`` (chained ``follows``, verdict ``errored``) with the
  arguments' digest and, when the framework handed one back, the failure
  response's; or, when the hook saw the call end but not how,
  ``<action_id>/dispatched`` (chained ``follows``): it ran, its outcome is
  not recorded.

Every capsule of a call carries the :data:`EXTENSION` member, clear-safe
values only: the framework, the tool's name, the ids the framework gave the
call, the recorder's sequence number, the outcome kind, what is absent and
why, and the runtime context the caller allow-listed. Nothing else of the
runtime context ever enters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from capseal.canonical import json_digest
from capseal.errors import InputError

from .values import NotExactJSON, exact_json

__all__ = ["EFFECT_TYPE", "EXTENSION", "EFFECT_ATTESTATION", "CONTEXT_MODES", "OUTCOMES", "allowed_context",
           "context_members", "status_of", "planned_spec", "outcome_spec"]

#: the effect type of a tool call: outside the -05 registry, so namespaced
EFFECT_TYPE = "x-tool-call"
#: the capsule member describing the call (clear-safe values only)
EXTENSION = "x-tool-call-v1"
#: who saw the outcome: the agent's runtime, reporting on its own tool
EFFECT_ATTESTATION = "runtime_claimed"
#: how an allow-listed context field enters: its exact JSON value, or only its digest
CONTEXT_MODES = ("clear", "digest")
#: the outcome kinds a hook reports: what happened to the call, as far as the hook saw
OUTCOMES = (
    "returned",       # the tool returned a result
    "error_result",   # the framework handed back an error result (isError, status="error")
    "raised",         # the tool raised
    "retry",          # the tool asked the model to try again
    "unobserved",     # it ended, and the hook could not see how
)


def allowed_context(allow: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's allow-list of runtime-context fields, checked.

    Args:
        allow: field name -> ``"clear"`` or ``"digest"`` (None: nothing enters).

    Returns:
        A copy.

    Raises:
        InputError: not a mapping of names to one of :data:`CONTEXT_MODES`.
    """
    if allow is None:
        return {}
    if not isinstance(allow, Mapping):
        raise InputError(f"context is a mapping of field names to 'clear' or 'digest'; got {type(allow).__name__}")
    out: dict[str, str] = {}
    for name, mode in allow.items():
        if not isinstance(name, str) or not name:
            raise InputError(f"context field names are non-empty strings; got {name!r}")
        if mode not in CONTEXT_MODES:
            raise InputError(f"context[{name!r}] is {mode!r}; each allow-listed field is 'clear' or 'digest'")
        out[name] = mode
    return out


def context_members(seen: Mapping[str, Any], allow: Mapping[str, str]) -> dict[str, Any]:
    """What of the runtime context a hook saw enters the capsule: only the
    allow-listed fields, each in clear or as a digest. A field that cannot be
    written as exact JSON is named under ``absent`` instead.

    Args:
        seen: the fields the hook saw (field name -> value).
        allow: the allow-list (see :func:`allowed_context`).

    Returns:
        Members for the extension: ``context``, ``context_digests`` and
        ``absent`` (each only when not empty).
    """
    clear: dict[str, Any] = {}
    digests: dict[str, str] = {}
    absent: dict[str, str] = {}
    for name, mode in allow.items():
        if name not in seen:
            continue
        try:
            value = exact_json(seen[name], f"context[{name!r}]")
            if mode == "clear":
                clear[name] = value
            else:
                digests[name] = json_digest(value)
        except (NotExactJSON, InputError, RecursionError):
            absent[f"context.{name}"] = "not_json"
    out: dict[str, Any] = {}
    if clear:
        out["context"] = clear
    if digests:
        out["context_digests"] = digests
    if absent:
        out["absent"] = absent
    return out


def _extension(described: Mapping[str, Any], outcome: str | None, absent: Mapping[str, str]) -> dict[str, Any]:
    block = dict(described)
    if outcome is not None:
        block["outcome"] = outcome
    missing = {**block.get("absent", {}), **absent}
    block.pop("absent", None)
    if missing:
        block["absent"] = missing
    return block


def status_of(outcome: str, response_digest: str | None) -> str:
    """The effect status an outcome is sealed with: ``confirmed`` only for a
    returned result whose digest was taken, ``failed`` for every failure,
    else ``dispatched`` (it ran; its outcome is not recorded).

    Raises:
        InputError: not one of :data:`OUTCOMES`.
    """
    if outcome == "returned":
        return "confirmed" if response_digest is not None else "dispatched"
    if outcome in ("error_result", "raised", "retry"):
        return "failed"
    if outcome == "unobserved":
        return "dispatched"
    raise InputError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")


def planned_spec(action_id: str, described: Mapping[str, Any], irreversibility_class: str | None) -> dict[str, Any]:
    """The spec of a call's planned capsule.

    Args:
        action_id: the call's action id.
        described: the extension's members (framework, tool, ids, sequence, context).
        irreversibility_class: carried by every capsule of the call, when given.

    Returns:
        The spec for ``Producer.seal``.
    """
    effect: dict[str, Any] = {"status": "planned", "type": EFFECT_TYPE}
    if irreversibility_class is not None:
        effect["irreversibility_class"] = irreversibility_class
    return {"action_id": action_id, "action_type": "decide", "effect": effect,
            EXTENSION: _extension(described, None, {})}


def outcome_spec(action_id: str, described: Mapping[str, Any], irreversibility_class: str | None, outcome: str, *,
                 request_digest: str | None, response_digest: str | None,
                 absent: Mapping[str, str]) -> tuple[dict[str, Any], str]:
    """The spec of a call's outcome capsule and its chain relation to the planned one.

    Args:
        action_id: the call's (planned) action id; the outcome's is ``<action_id>/<status>``.
        described: as for :func:`planned_spec`.
        irreversibility_class: as for :func:`planned_spec`.
        outcome: one of :data:`OUTCOMES`.
        request_digest: the arguments' digest, or None (absent; ``absent`` says why).
        response_digest: the response's digest, or None (a returned call
            without one is sealed ``dispatched``: no confirmation without the
            response's digest, -05 §5.3).
        absent: what is absent and why (``request_digest`` -> ``not_json`` …).

    Returns:
        ``(spec, relation)``.
    """
    status = status_of(outcome, response_digest)
    relation = "confirms" if status == "confirmed" else "follows"
    effect: dict[str, Any] = {"status": status, "type": EFFECT_TYPE}
    if request_digest is not None:
        effect["request_digest"] = request_digest
    if response_digest is not None and status in ("confirmed", "failed"):
        effect["response_digest"] = response_digest
    if irreversibility_class is not None:
        effect["irreversibility_class"] = irreversibility_class
    effect["effect_attestation"] = EFFECT_ATTESTATION
    spec: dict[str, Any] = {"action_id": f"{action_id}/{status}", "action_type": "decide", "effect": effect,
                            EXTENSION: _extension(described, outcome, absent)}
    if status == "failed":
        spec["disposition"] = {"decision": "accept", "approver": "policy", "human_disposed": False,
                               "verdict_class": "errored"}
    return spec, relation
