"""The sealed record ``capseal-record/1``: a capsule, its envelopes, and the
hardware-evidence slot kept *beside* the capsule.

The slot is ``None`` until a TPM quote is taken. It is never ``{}`` and never
inside the capsule: anything inside is hashed into ``capsule_id``, and a quote
over the id cannot be part of what it covers. Adding evidence returns a new
record with the same capsule and id.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .canonical import sorted_json
from .envelope import PROFILE, Envelope
from .errors import InputError, MalformedJSONError

__all__ = ["RECORD_VERSION", "RECEIVED_CAPSULE", "SealedRecord", "storage_json", "dumps_canonical",
           "epistemic_type_for_capsule"]

#: The ledger record type of a capsule record kept as received from another
#: producer (a twin's half, a counterparty's record): stored byte for byte,
#: checked on its own, never part of this ledger's own chains or action ids.
RECEIVED_CAPSULE = "capsule:received"

RECORD_VERSION = "capseal-record/1"


def storage_json(value: Any) -> bytes:
    """Compact, key-sorted UTF-8 JSON: a fixed point of parse→dump for the
    float-free values capseal stores, so stored bytes re-export identically.

    This is storage JSON, not RFC 8785 (see :func:`capseal.canonical.canonical_bytes`).

    Args:
        value: a JSON value.

    Returns:
        Its UTF-8 bytes.

    Raises:
        TypeError: a value that is not JSON.
        ValueError: a value that contains itself.
    """
    return sorted_json(value).encode("utf-8")


def stored_body(capsule_text: str, envelopes: Sequence[Envelope]) -> bytes:
    """A record's stored form (:meth:`SealedRecord.body_bytes`) from its
    capsule's sorted JSON text, so a capsule serialized once is not encoded again.

    Args:
        capsule_text: :func:`storage_json` of the capsule, as text.
        envelopes: the record's envelopes.

    Returns:
        The bytes :meth:`SealedRecord.body_bytes` gives for that capsule and those envelopes.
    """
    return (f'{{"capsule":{capsule_text},"envelopes":{sorted_json([e.to_json() for e in envelopes])},'
            f'"record_version":{sorted_json(RECORD_VERSION)}}}').encode()


#: The earlier name of :func:`storage_json`, kept for callers that import it;
#: it was never RFC 8785 (that is :func:`capseal.canonical.canonical_bytes`).
dumps_canonical = storage_json


def strict_json(raw: bytes | str, where: str) -> Any:
    """JSON read one way only: a duplicate member (which parsers resolve
    differently: Python keeps the last, others the first), NaN or Infinity,
    or nesting too deep to read is MalformedJSONError naming ``where``.

    Args:
        raw: the JSON text or its UTF-8 bytes.
        where: what the bytes are, for the message (``"record 7"``).

    Returns:
        The parsed value.

    Raises:
        MalformedJSONError: not valid JSON, a duplicate member, NaN or
            Infinity, or nesting too deep.
    """

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise MalformedJSONError(f"{where}: duplicate member {k!r}")
            out[k] = v
        return out

    try:
        return json.loads(raw, object_pairs_hook=no_duplicates, parse_constant=_no_constant)
    except MalformedJSONError:
        raise
    except RecursionError:
        raise MalformedJSONError(f"{where} nests too deeply to be read") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedJSONError(f"{where} is not valid JSON: {exc}") from None


def _no_constant(name: str) -> Any:
    raise MalformedJSONError(f"{name} is not JSON")


@dataclass(frozen=True)
class SealedRecord:
    """A sealed capsule as stored and returned. Treat ``capsule`` as read-only:
    the ledger keeps its own bytes, so editing the dict changes nothing stored."""

    capsule: dict[str, Any]
    envelopes: tuple[Envelope, ...] = ()
    hardware_evidence: dict[str, Any] | None = None
    seq: int | None = field(default=None, compare=False)
    # the stored form from the sealer's serialization, made on first use (not carried by replace())
    _body: bytes | Callable[[], bytes] | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def sealed(cls, capsule: dict[str, Any], envelopes: tuple[Envelope, ...],
               body: bytes | Callable[[], bytes]) -> SealedRecord:
        """A record fresh from the sealer, its stored form made from the
        serialization the sealer did (a record never written makes none).

        Args:
            capsule, envelopes: the record's.
            body: :meth:`body_bytes` of them (:func:`stored_body`), or what
                makes them when first asked for.

        Returns:
            The record; :meth:`body_bytes` returns ``body`` (made once).
        """
        record = cls(capsule, envelopes)
        object.__setattr__(record, "_body", body)
        return record

    @property
    def capsule_id(self) -> str:
        return str(self.capsule["capsule_id"])

    @property
    def profile_envelope(self) -> Envelope | None:
        for env in self.envelopes:
            if env.profile == PROFILE:
                return env
        return None

    def to_json(self) -> dict[str, Any]:
        """The record as a ``capseal-record/1`` JSON object.

        Returns:
            ``record_version``, ``capsule``, ``envelopes`` and ``hardware_evidence``.
        """
        return {
            "record_version": RECORD_VERSION,
            "capsule": self.capsule,
            "envelopes": [e.to_json() for e in self.envelopes],
            "hardware_evidence": self.hardware_evidence,
        }

    def body_bytes(self) -> bytes:
        """Stored form without the evidence slot (evidence rows are kept apart).

        Returns:
            The record's storage JSON bytes (:func:`storage_json`).
        """
        body = self._body
        if body is not None:
            if not isinstance(body, bytes):
                body = body()
                object.__setattr__(self, "_body", body)
            return body
        return storage_json(
            {"record_version": RECORD_VERSION, "capsule": self.capsule, "envelopes": [e.to_json() for e in self.envelopes]}
        )

    def with_evidence(self, evidence: dict[str, Any] | None) -> SealedRecord:
        """The same capsule and envelopes with the evidence slot set.

        Args:
            evidence: a filled hardware-evidence object, or None to empty the slot.

        Returns:
            A new record (this one is unchanged).

        Raises:
            InputError: ``evidence`` is ``{}`` (a ValueError).
        """
        if evidence is not None and not evidence:
            raise InputError("evidence= (hardware_evidence) is a filled quote or None, never {}")
        return replace(self, hardware_evidence=evidence)

    @classmethod
    def from_json(cls, data: Any, *, seq: int | None = None) -> SealedRecord:
        """Read a record from its parsed ``capseal-record/1`` JSON.

        Args:
            data: the parsed JSON object.
            seq: its ledger seq, when read from a ledger.

        Returns:
            The record (the capsule is not verified here).

        Raises:
            MalformedJSONError: not a ``capseal-record/1`` object, a malformed
                envelope, or an evidence slot that is neither null nor filled.
        """
        if not isinstance(data, dict) or data.get("record_version") != RECORD_VERSION:
            raise MalformedJSONError(f"not a {RECORD_VERSION} record")
        capsule = data.get("capsule")
        envelopes = data.get("envelopes", [])
        if not isinstance(capsule, dict) or not isinstance(envelopes, list):
            raise MalformedJSONError(f"{RECORD_VERSION}: capsule must be an object and envelopes an array")
        try:
            envs = tuple(Envelope.from_json(e) for e in envelopes)
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedJSONError(f"{RECORD_VERSION}: malformed envelope ({exc})") from None
        evidence = data.get("hardware_evidence")
        if evidence is not None and (not isinstance(evidence, dict) or not evidence):
            raise MalformedJSONError(f"{RECORD_VERSION}: hardware_evidence must be null or a filled object")
        return cls(capsule=capsule, envelopes=envs, hardware_evidence=evidence, seq=seq)


def epistemic_type_for_capsule(capsule: Mapping[str, Any]) -> str:
    """EL -00 §4.1 type of a capsule, from its shape, fixed at commit.

    An effect confirmed by the gate that executed it records an observed event;
    everything else a producer seals about its own agent is a producer claim.

    Args:
        capsule: the capsule.

    Returns:
        ``"observed_event"`` or ``"producer_claim"``.
    """
    effect = capsule.get("effect")
    if isinstance(effect, Mapping) and effect.get("status") == "confirmed" and effect.get("effect_attestation") == "gate_executed":
        return "observed_event"
    return "producer_claim"
