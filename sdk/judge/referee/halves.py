"""One twin's half: its sealed capseal record and the answer it served (V1, V2).

A serving node seals its half with :func:`seal_half`: an ``inference_completion``
capsule whose ``effect.request_digest`` is the JSON digest of the request it
answered and whose ``effect.response_digest`` is the JSON digest of the body it
served. The body is the answer text itself (a JSON string) or an
OpenAI-compatible chat completion, whose text is ``choices[0].message.content``.
What it served on is signed in ``model_attestation.compute_attestation``:
``decoding`` (``temperature`` as an integer or a decimal string, ``seed``) and
the ``x-twin-serving-v1`` member (``node_id``, ``role``, ``model_hash``,
``weights_digest``).

:func:`load_half` is V1 on the comparing node: the record must pass its own
checks (its id recomputes, capseal's Class-1 verifier finds no error), be
signed by the key its serving node announced, and the answer must be the body
the record signs. A half that fails is refused (``PairRefusedError``), never
ruled on. :func:`answer_problem` is the same body check as the ruling reads
it (V1/V2: a provider's half without its body holds no answer; any other half
without its body is checked as ``{}``).

*Sampled* is read two ways (the rules' two paths): :func:`sampled_on_request`
takes the host's temperature and counts only a number above 0;
:func:`sampled_on_ruling` reads the record's decoding and generation
temperatures and the request body's, each as a number or a numeric string
(a boolean says nothing; a negative temperature is not sampled).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from cryptography.hazmat.primitives import serialization

from capseal.audit import KeyDirectory, check_signatures
from capseal.canonical import capsule_id, json_digest
from capseal.errors import CanonicalizationError, PairRefusedError, RefereeInputError
from capseal.record import SealedRecord
from capseal.verify import verify

from .vocab import ROLE_PROVIDER, SERVING_MEMBER

__all__ = [
    "check_id", "Half", "HostView", "load_half", "answer_text", "answer_problem", "announced_key", "sampled_on_request",
    "sampled_on_ruling", "serving_facts", "seal_half", "record_parts",
]

MAX_ID = 256


def check_id(value: Any, what: str, path: str, *, empty: bool = False) -> str:
    """A node id or bracket id as the rules key pairs by: a string of at most
    ``MAX_ID`` characters, valid Unicode (no lone surrogate), without control
    characters (NUL included); empty only when ``empty``.

    Args:
        value: the id.
        what: its name, for messages.
        path: where it is, for messages.
        empty: whether an empty string is allowed.

    Returns:
        The id.

    Raises:
        RefereeInputError: anything else, naming ``what`` and ``path``.
    """
    if not isinstance(value, str):
        raise RefereeInputError(f"{what} is a string, not {type(value).__name__}", path=path)
    if not value and not empty:
        raise RefereeInputError(f"{what} is a non-empty string", path=path)
    if len(value) > MAX_ID:
        raise RefereeInputError(f"{what} is at most {MAX_ID} characters, not {len(value)}", path=path)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RefereeInputError(f"{what} is not valid Unicode (a lone surrogate)", path=path) from None
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value):
        raise RefereeInputError(f"{what} holds a control character", path=path)
    return value


_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity)", re.I)


@dataclass(frozen=True)
class HostView:
    """What the comparing node's host says of a half (the request path's facts):
    who served it, on which model and weights, at which temperature. ``None``
    for a fact the host does not know."""

    node_id: str
    model_hash: str | None
    weights_digest: str | None
    temperature: Any = None


@dataclass(frozen=True)
class Half:
    """A half that passed V1: its record, its answer, and who signed it."""

    capsule: dict[str, Any]
    envelopes: tuple[dict[str, Any], ...]
    body: Any
    text: str
    host: HostView
    signer_kid: str
    #: the request the twins answered, when it was disclosed; None otherwise
    request: Any = None
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def capsule_id(self) -> str:
        """The half's capsule id."""
        return str(self.capsule["capsule_id"])

    @property
    def node_id(self) -> str:
        """The node that served it."""
        return self.host.node_id

    @property
    def request_digest(self) -> str | None:
        """The request digest its record signs."""
        effect = self.capsule.get("effect")
        value = effect.get("request_digest") if isinstance(effect, Mapping) else None
        return value if isinstance(value, str) and value else None

    def record_json(self) -> dict[str, Any]:
        """The half's record as stored.

        Returns:
            ``{"record_version": "capseal-record/1", "capsule", "envelopes"}``.
        """
        return {"record_version": "capseal-record/1", "capsule": self.capsule, "envelopes": list(self.envelopes)}


def record_parts(record: Any, path: str = "$") -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """The capsule and envelopes of a sealed record: a :class:`SealedRecord`, its
    JSON (``capseal-record/1``), or a bare capsule carrying its inline signature.

    Args:
        record: the record.
        path: where it is, for messages.

    Returns:
        ``(capsule, envelopes)``, copies.

    Raises:
        PairRefusedError: anything else (rule V1, ``half_forged``).
    """
    if isinstance(record, SealedRecord):
        return dict(record.capsule), tuple(e.to_json() for e in record.envelopes)
    if isinstance(record, Mapping) and record.get("record_version") == "capseal-record/1":
        capsule, envelopes = record.get("capsule"), record.get("envelopes", [])
        if isinstance(capsule, Mapping) and isinstance(envelopes, list) and all(isinstance(e, Mapping) for e in envelopes):
            return dict(capsule), tuple(dict(e) for e in envelopes)
    elif isinstance(record, Mapping) and "capsule_id" in record:
        return dict(record), ()
    raise PairRefusedError("a half's record is a sealed capseal record (capseal-record/1) or a capsule",
                           rule="V1", reason="half_forged", path=path)


def announced_key(value: Any, path: str = "$") -> Any:
    """A public key from a PEM string (or a key object), for a roster entry.

    Args:
        value: the PEM text or a public key.
        path: where it is, for messages.

    Returns:
        The public key.

    Raises:
        RefereeInputError: not a PEM public key.
    """
    if hasattr(value, "public_bytes"):
        return value
    if isinstance(value, str):
        try:
            return serialization.load_pem_public_key(value.encode("utf-8"))
        except (ValueError, TypeError, UnicodeEncodeError) as exc:
            raise RefereeInputError(f"announced_key is not a PEM public key ({exc})", path=path) from None
    raise RefereeInputError(f"announced_key is a PEM public key, not {type(value).__name__}", path=path)


def serving_facts(capsule: Mapping[str, Any]) -> dict[str, Any]:
    """What a record signs of its serving: ``node_id``, ``role``, ``model_hash``,
    ``weights_digest`` (from ``x-twin-serving-v1``), ``temperature`` and ``seed``
    (from ``decoding``) and ``generation_temperature`` (``generation_parameters``).

    Args:
        capsule: the record's capsule.

    Returns:
        The facts it signs; a fact it does not carry is absent.
    """
    ma = capsule.get("model_attestation")
    ca = ma.get("compute_attestation") if isinstance(ma, Mapping) else None
    if not isinstance(ca, Mapping):
        return {}
    out: dict[str, Any] = {}
    serving = ca.get(SERVING_MEMBER)
    if isinstance(serving, Mapping):
        for key in ("node_id", "role", "model_hash", "weights_digest", "capture_method"):
            value = serving.get(key)
            if isinstance(value, str) and value:
                out[key] = value
    decoding = ca.get("decoding")
    if isinstance(decoding, Mapping):
        if "temperature" in decoding:
            out["temperature"] = decoding["temperature"]
        if type(decoding.get("seed")) is int:
            out["seed"] = decoding["seed"]
    generation = ca.get("generation_parameters")
    if isinstance(generation, Mapping) and "temperature" in generation:
        out["generation_temperature"] = generation["temperature"]
    return out


def _above_zero(value: Any, *, strings: bool) -> bool:
    if isinstance(value, bool):  # a boolean says nothing about sampling
        return False
    if isinstance(value, (int, float, Decimal)):
        try:
            return Decimal(value) > 0 if not isinstance(value, float) else value > 0
        except InvalidOperation:
            return False
    if strings and isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        try:
            return Decimal(value.strip()) > 0
        except InvalidOperation:
            return False
    return False


def sampled_on_request(temperature: Any) -> bool:
    """Request path (G3): whether the host's temperature says sampled.

    Args:
        temperature: the host's temperature for the half.

    Returns:
        True iff it is a number (not a boolean) above 0.
    """
    return _above_zero(temperature, strings=False)


def sampled_on_ruling(half: Half) -> bool:
    """Ruling path (V3): whether the half was sampled.

    Args:
        half: the half.

    Returns:
        True iff the record's decoding temperature, its generation temperature
        or the request body's temperature is a number or a numeric string above 0.
    """
    request_t = half.request.get("temperature") if isinstance(half.request, Mapping) else None
    return any(_above_zero(v, strings=True) for v in (half.facts.get("temperature"),
                                                        half.facts.get("generation_temperature"), request_t))


def answer_text(body: Any) -> str | None:
    """The text of a served body.

    Args:
        body: the body served.

    Returns:
        The body itself when it is a string, else a chat completion's
        ``choices[0].message.content``; None when it has none.
    """
    if isinstance(body, str):
        return body
    if isinstance(body, Mapping):
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
            message = choices[0].get("message")
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, str):
                return content
    return None


def answer_problem(capsule: Mapping[str, Any], body: Any, text: str | None = None) -> str | None:
    """V1/V2 on one half's answer. A half without its body that is not a
    provider's is checked against its ``response_digest`` as ``{}``.

    Args:
        capsule: the half's capsule.
        body: the body held (None: none).
        text: the text held beside it, when any.

    Returns:
        None when the answer is the body its record signs,
        ``"no_requester_transcript"`` for a provider's half that holds no body
        (V2), else ``"answer_not_the_signed_body"`` (V1).
    """
    role = serving_facts(capsule).get("role")
    if role == ROLE_PROVIDER and (body is None or body == {}):
        return "no_requester_transcript"
    effect = capsule.get("effect")
    declared = effect.get("response_digest") if isinstance(effect, Mapping) else None
    try:
        recomputed = json_digest({} if body is None else body)
    except CanonicalizationError:
        return "answer_not_the_signed_body"
    if not isinstance(declared, str) or declared != recomputed:
        return "answer_not_the_signed_body"
    served = answer_text(body)
    if text is not None and served is not None and served != text:
        return "answer_not_the_signed_body"
    return None


def _refuse(message: str, reason: str, path: str) -> PairRefusedError:
    return PairRefusedError(message, rule="V1", reason=reason, path=path)


def load_half(
    record: Any,
    *,
    node_id: str,
    announced: Any,
    text: str | None = None,
    body: Any = None,
    request: Any = None,
    host: HostView | None = None,
    path: str = "$",
) -> Half:
    """Check one half as the comparing node holds it (V1) and return it.

    Args:
        record: the half's sealed record (see :func:`record_parts`).
        node_id: the node that served it (the record must not name another).
        announced: the key that node announced (PEM or a public key); None
            refuses the half, since its record cannot be checked.
        text: the answer text held; with no ``body`` it is the body itself.
        body: the served body (a string or a chat completion), when held.
        request: the request the twins answered, when disclosed.
        host: the host's view of the half (request path); default: the record's facts.
        path: where the half is, for messages.

    Returns:
        A :class:`Half`.

    Raises:
        PairRefusedError: rule V1 — ``half_forged`` (the record fails its own
            checks or its signature does not verify), ``half_unverified`` (not
            signed by the announced key, or none announced) or
            ``answer_not_the_signed_body``.
    """
    check_id(node_id, "node_id", f"{path}.node_id")
    capsule, envelopes = record_parts(record, f"{path}.record")
    try:
        recomputed = capsule_id(capsule)
    except (CanonicalizationError, TypeError, ValueError) as exc:
        raise _refuse(f"the record cannot be canonicalized ({exc})", "half_forged", f"{path}.record") from None
    if capsule.get("capsule_id") != recomputed:
        raise _refuse("the record's capsule_id is not the digest of its bytes (it changed after sealing)",
                      "half_forged", f"{path}.record")
    errors = [f.code for f in verify(capsule).findings if f.severity == "error"]
    if errors:
        raise _refuse(f"the record fails its own checks: {', '.join(errors)}", "half_forged", f"{path}.record")
    if announced is None:
        raise _refuse(f"{node_id} announced no key, so its record cannot be checked", "half_unverified", path)
    key = announced_key(announced, f"{path}.announced_key")
    from capseal.keys import kid_for

    want = kid_for(key)
    verdict, kid, _ = check_signatures(capsule, list(envelopes), KeyDirectory([key]))
    if verdict == "invalid":
        raise _refuse("the record's signature does not verify", "half_forged", f"{path}.record")
    if verdict != "authored" or kid != want:
        raise _refuse(f"the record is not signed by the key {node_id} announced ({want[:16]}…)", "half_unverified",
                      f"{path}.record")
    facts = serving_facts(capsule)
    if facts.get("node_id", node_id) != node_id:
        raise _refuse(f"the record says {facts['node_id']!r} served it, not {node_id!r}", "half_unverified",
                      f"{path}.node_id")
    if body is None:
        if text is None:
            raise _refuse("the half holds no answer (neither its text nor its body)", "answer_not_the_signed_body",
                          f"{path}.text")
        body = text
    served = answer_text(body)
    if text is None:
        text = served
    if not isinstance(text, str) or served is None:
        raise _refuse("the body has no answer text (a string, or choices[0].message.content)",
                      "answer_not_the_signed_body", f"{path}.body")
    problem = answer_problem(capsule, body, text)
    if problem is not None:
        raise _refuse("the answer is not the body its record signs (its digest is not the record's response_digest, "
                      "or the text is not the body's)", "answer_not_the_signed_body", f"{path}.text")
    view = host or HostView(node_id, facts.get("model_hash"), facts.get("weights_digest"), facts.get("temperature"))
    return Half(capsule=capsule, envelopes=envelopes, body=body, text=text, host=view, signer_kid=want,
                request=request, facts=facts)


def seal_half(
    producer: Any,
    *,
    action_id: str,
    node_id: str,
    request: Any,
    body: Any,
    model_hash: str | None,
    weights_digest: str | None,
    temperature: int | str = 0,
    seed: int | None = None,
    role: str = ROLE_PROVIDER,
    model_id: str | None = None,
    capture_method: str | None = None,
) -> SealedRecord:
    """Seal a serving node's record of one answer (a half, or a referee's re-answer).

    Args:
        producer: the serving node's :class:`capseal.Producer` (its own key).
        action_id: the record's action id (unique in that node's ledger).
        node_id: the serving node.
        request: the request body answered (its JSON digest is signed).
        body: the body served: the answer text, or a chat completion.
        model_hash: the served model's identity hash, if known.
        weights_digest: the served weights' digest, if known.
        temperature: the decoding temperature, an integer or a decimal string.
        seed: the decoding seed, if any.
        role: ``provider`` (a twin) or ``referee``.
        model_id: the model's name for ``model_attestation`` (default: the hash).
        capture_method: how the answer was captured (a referee's re-answer).

    Returns:
        The sealed record (durable in the producer's ledger).

    Raises:
        capseal.errors.InputError: a float temperature or any value a capsule cannot carry.
    """
    if isinstance(temperature, float) or isinstance(temperature, bool):
        raise RefereeInputError("temperature is an integer or a decimal string such as \"0.7\" (no floats in a capsule)",
                                path="$.temperature")
    serving: dict[str, Any] = {"node_id": node_id, "role": role}
    for key, value in (("model_hash", model_hash), ("weights_digest", weights_digest), ("capture_method", capture_method)):
        if value is not None:
            serving[key] = value
    decoding: dict[str, Any] = {"temperature": temperature}
    if seed is not None:
        decoding["seed"] = seed
    spec = {
        "action_id": action_id,
        "action_type": "fyi",
        "effect": {
            "status": "confirmed", "type": "inference_completion", "effect_attestation": "runtime_claimed",
            "request_digest": json_digest(request), "response_digest": json_digest(body),
        },
        "model_attestation": {
            "model_id": model_id or model_hash or "unknown-model", "provider": node_id,
            "compute_attestation": {"decoding": decoding, SERVING_MEMBER: serving},
        },
    }
    record: SealedRecord = producer.seal(spec)
    return record

