"""A capsule from a caller's spec, in three steps with nothing shared between
calls, so the caller's thread and the signing pipeline run the same code:

1. :func:`assemble` — the spec plus what the producer writes about itself
   (format, identity, timestamp, epoch, an epoch citation) and the assurance
   derived from the capsule's own evidence (a caller's claim that differs is
   refused);
2. :func:`prepare` — the canonical bytes (floats and unsafe integers refused
   with their JSON path), the strict -05 model, the capsule id and capseal's
   own Class-1 check (an error finding aborts); then the bytes to sign;
3. :func:`complete` — the device's answer checked (and, for a token or TPM,
   verified against the key) and the sealed record assembled.

Every refusal of the caller's input happens in steps 1 and 2, before anything
is signed or queued.

Step 2 serializes the capsule once (:func:`capseal._internal.form.capsule_form`):
the bytes hashed, the capsule's own copy and its stored row all come from
that one walk. With ``CAPSEAL_NO_DIRECT=1`` in the environment when capseal
is imported, the plain path runs instead (``canonical_bytes``, ``json.loads``
of them, and the row serialized from the sealed record): the two give the
same bytes, and the test suite passes on either.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ..assurance import derive_assurance, enforce_claim
from ..canonical import MAX_DEPTH, canonical_bytes
from ..envelope import PROFILE, Envelope, ToBeSigned, complete_envelope, prepare_envelope
from ..errors import InputError, SealAbortedError, shown
from ..model import check_timestamp, validate_capsule
from ..record import SealedRecord, stored_body
from ..verify import verify_for_seal
from ..vocab import CANONICALIZATION_ID, FORMAT_VERSION, SPEC_VERSION
from .form import CapsuleForm, capsule_form
from .switch import plain_path

if TYPE_CHECKING:
    from capseal.keys import SignatureResult, Signer

__all__ = ["Identity", "Prepared", "assemble", "prepare", "complete", "signature_now", "boundary_spec",
           "refuse_reserved", "read_clock", "check_clock", "utc_now", "CUSTODY_MEMBER"]

CUSTODY_MEMBER = "x-capseal-key-custody"

#: the plain path (see the module docstring)
PLAIN_PATH = plain_path()

#: Members the producer writes itself; a spec may repeat them only with the same value.
_PRODUCER_OWNED = ("spec_version", "format_version", "canonicalization_id", "operator", "developer")
_NEVER_IN_SPEC = ("capsule_id", "signature", "key_id", "timestamp")
_WRITTEN_BY_PRODUCER = frozenset((*_PRODUCER_OWNED, *_NEVER_IN_SPEC, "epoch_id"))


@dataclass(frozen=True)
class Identity:
    """What a producer writes about itself into every capsule."""

    operator: str
    developer: str

    def owned(self, key: str) -> str:
        return {
            "spec_version": SPEC_VERSION,
            "format_version": FORMAT_VERSION,
            "canonicalization_id": CANONICALIZATION_ID,
            "operator": self.operator,
            "developer": self.developer,
        }[key]


@dataclass(frozen=True)
class Prepared:
    """A capsule ready to sign: its own copy (as the canonical bytes that
    were hashed parse back, so a caller changing its dicts changes nothing
    sealed), its serialized form and the envelope's bytes to be signed."""

    capsule: dict[str, Any]
    tbs: ToBeSigned
    form: CapsuleForm | None  # None on the plain path

    @property
    def capsule_id(self) -> str:
        return str(self.capsule["capsule_id"])


def refuse_reserved(spec: Mapping[str, Any]) -> None:
    """Refuse what only the producer writes about itself: the epoch-boundary
    verdict, the ``epoch_opens`` chain relation and the ``x-capseal-*``
    members of ``compute_attestation`` (the custody statement).

    Why: custody is observed, never asserted; a spec claiming a token's
    custody, or opening an epoch, would read exactly like the producer's own.

    Raises:
        InputError: the spec writes one of them.
    """
    # type(x) is dict first: a plain dict is a Mapping, and the ABC check costs more than the rest of this
    disposition = spec.get("disposition")
    if (type(disposition) is dict or isinstance(disposition, Mapping)) and \
            disposition.get("verdict_class") == "epoch_boundary":
        raise InputError("verdict_class 'epoch_boundary' is written by the producer when it opens an epoch "
                         "(Producer() or rotate_epoch()), never from a spec")
    chain = spec.get("chain")
    if (type(chain) is dict or isinstance(chain, Mapping)) and chain.get("relation") == "epoch_opens":
        # the epoch this capsule is sealed in was opened by the producer's boundary
        # capsule; a second capsule saying it opens an epoch contradicts it
        raise InputError("chain.relation 'epoch_opens' is written by the producer on the capsule that opens an "
                         "epoch (rotate_epoch()), never from a spec or a seal(relation=...)")
    attestation = spec.get("model_attestation")
    if attestation is None:
        return
    compute = attestation.get("compute_attestation") if isinstance(attestation, Mapping) else None
    if isinstance(compute, Mapping):
        for key in compute:
            if isinstance(key, str) and key.startswith("x-capseal-"):
                raise InputError(f"model_attestation.compute_attestation[{shown(key)}] is written by the producer "
                                 "(what it observed of its key), never from a spec")


def assemble(identity: Identity, spec: Mapping[str, Any], *, epoch_id: str, timestamp: str,
             cite: str | None = None, own: bool = False) -> dict[str, Any]:
    """Step 1: the capsule a spec makes, with its derived ``assurance``.

    Args:
        identity: the producer's operator and developer.
        spec: the caller's members (anything -05 allows but what the producer writes).
        epoch_id: the open epoch.
        timestamp: the capsule's RFC 3339 UTC time (the producer's clock).
        cite: a capsule id to cite ``ran_under`` (the epoch boundary), or None.
        own: the producer's own capsule (an epoch boundary): its reserved members are allowed.

    Returns:
        The capsule, without ``capsule_id``.

    Raises:
        InputError: a member the producer writes, or a value that contradicts it.
        AssuranceOverclaimError, AssuranceMismatchError: a claimed assurance the evidence does not give.
    """
    if not own:
        refuse_reserved(spec)
    # a plain dict naming none of the members the producer writes needs none of the checks of each
    if type(spec) is not dict or not _WRITTEN_BY_PRODUCER.isdisjoint(spec):
        for key in _NEVER_IN_SPEC:
            if key in spec:
                raise InputError(f"{key} is written by the producer; leave it out of the spec")
        for key in _PRODUCER_OWNED:
            if key in spec and spec[key] != identity.owned(key):
                raise InputError(f"{key}={shown(spec[key])} does not match this producer ({identity.owned(key)!r})")
        if "epoch_id" in spec and spec["epoch_id"] != epoch_id:
            raise InputError(f"epoch_id {shown(spec['epoch_id'])} is not the open epoch {epoch_id!r}; "
                             "epoch ids are never back-filled")
    capsule: dict[str, Any] = {
        "spec_version": SPEC_VERSION,
        "format_version": FORMAT_VERSION,
        "canonicalization_id": CANONICALIZATION_ID,
        "operator": identity.operator,
        "developer": identity.developer,
        "timestamp": timestamp,
        "epoch_id": epoch_id,
    }
    if type(spec) is dict:
        capsule.update(spec)
        claimed = capsule.pop("assurance", None)
    else:
        for key, value in spec.items():
            if key != "assurance":
                capsule[key] = value
        claimed = spec.get("assurance")
    if cite is not None:
        _cite(capsule, cite)
    derived = derive_assurance(capsule)
    enforce_claim(claimed, derived)
    capsule["assurance"] = derived
    return capsule


def _cite(capsule: dict[str, Any], target: str) -> None:
    """Add a ``ran_under`` reference to ``target`` unless the capsule names it
    already (as its chain parent, which a reference must not repeat: -05
    §5.5.5, or as a reference)."""
    chain = capsule.get("chain")
    if isinstance(chain, Mapping) and chain.get("parent_capsule_id") == target:
        return
    refs = list(capsule.get("references") or [])
    if any(isinstance(r, Mapping) and r.get("digest") == target for r in refs):
        return
    refs.append({"type": "agent-action-capsule", "digest_alg": "SHA-256", "digest": target,
                 "citation_purpose": "ran_under"})
    capsule["references"] = refs


def canonical(capsule: Mapping[str, Any]) -> tuple[dict[str, Any], bytes, CapsuleForm | None]:
    """The canonical form of an assembled capsule: its own copy with
    ``capsule_id``, checked by the strict model and capseal's Class-1
    verifier, the raw 32-byte id, and the capsule serialized (the bytes
    hashed, and the parts of its stored form; None on the plain path).

    Raises:
        CanonicalizationError: a float, an unsafe integer, a non-JSON value (with its path).
        CapsuleValidationError: a -05 rule the model enforces.
        SealAbortedError: capseal's own verifier found an error.
    """
    form: CapsuleForm | None
    if PLAIN_PATH:
        form, preimage = None, canonical_bytes(capsule, max_depth=MAX_DEPTH)
        own = json.loads(preimage)
    else:
        form = capsule_form(capsule, max_depth=MAX_DEPTH)  # typed errors naming the JSON path
        own, preimage = form.value, form.data
    validate_capsule(own)
    cid_raw = hashlib.sha256(preimage).digest()
    own["capsule_id"] = cid_raw.hex()
    result = verify_for_seal(own, own["capsule_id"])
    if not result.ok:
        raise SealAbortedError(
            "capseal's verifier refused the capsule: " + "; ".join(str(f) for f in result.errors), result.errors
        )
    return own, cid_raw, form


def prepare(capsule: Mapping[str, Any], signer: Signer) -> Prepared:
    """Step 2: :func:`canonical`, then the envelope's bytes to be signed by ``signer``.

    Raises:
        as :func:`canonical`; UnsupportedAlgorithmError for a key no COSE algorithm names.
    """
    own, cid_raw, form = canonical(capsule)
    return Prepared(own, prepare_envelope(signer, cid_raw), form)


def signature_now(signer: Signer, prepared: Prepared, *, verify: bool) -> SignatureResult:
    """Sign on this thread. With ``verify`` (a token or TPM) the backend's own
    check is skipped, since :func:`complete` checks the signature.

    Raises:
        SignerError: the device failed.
    """
    tbs = prepared.tbs.tbs
    return signer.begin_sign(tbs).result() if verify else signer.sign(tbs)


def complete(signer: Signer, prepared: Prepared, signature: SignatureResult, *, verify: bool) -> SealedRecord:
    """Step 3: the sealed record, the device's answer checked (with ``verify``:
    the signature over the exact bytes signed, against the key).

    The AAC profile envelope travels inline (``signature``/``key_id``), as the
    reference verifier reads it; every envelope is also in ``envelopes``.

    Raises:
        SignatureFailedError: a wrong key, algorithm or length, or (``verify``) a signature that does not verify.
    """
    envelope = complete_envelope(signer, prepared.tbs, signature, verify=verify)
    capsule = prepared.capsule
    envelopes = (envelope,)
    sig_hex = kid = None
    if envelope.profile == PROFILE:
        capsule["signature"] = sig_hex = envelope.cose.hex()
        capsule["key_id"] = kid = envelope.kid
    if prepared.form is None:  # the plain path: the row is serialized from the record when it is written
        return SealedRecord(capsule, envelopes)
    # the row from the parts serialized once, when the writer asks (they are immutable: a caller
    # changing the returned capsule changes nothing stored)
    return SealedRecord.sealed(capsule, envelopes,
                               partial(_stored, prepared.form, capsule["capsule_id"], sig_hex, kid, envelopes))


def _stored(form: CapsuleForm, capsule_id: str, signature: str | None, key_id: str | None,
            envelopes: tuple[Envelope, ...]) -> bytes:
    return stored_body(form.stored_text(capsule_id, signature, key_id), envelopes)


def boundary_spec(epoch_id: str, previous: str | None, custody: Mapping[str, Any], producer_name: str,
                  model: tuple[str | None, str | None]) -> dict[str, Any]:
    """The spec of the capsule that opens epoch ``epoch_id``.

    Args:
        epoch_id: the epoch it opens.
        previous: the stream's last boundary (chained ``epoch_opens``), or None.
        custody: the custody statement observed of the signing key.
        producer_name: ``capseal/<version>``.
        model: ``(model_id, provider)``, both or neither.

    Returns:
        The spec (``action_id`` ``<epoch_id>/opens``, ``fyi``, verdict ``epoch_boundary``).
    """
    compute: dict[str, Any] = {CUSTODY_MEMBER: dict(custody), "x-capseal-producer": producer_name}
    attestation: dict[str, Any] = {"compute_attestation": compute}
    model_id, provider = model
    if model_id is not None or provider is not None:
        attestation.update(model_id=model_id, provider=provider)
    spec: dict[str, Any] = {
        "action_id": f"{epoch_id}/opens",
        "action_type": "fyi",
        "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False,
                        "verdict_class": "epoch_boundary"},
        "model_attestation": attestation,
    }
    if previous is not None:
        spec["chain"] = {"parent_capsule_id": previous, "relation": "epoch_opens"}
    return spec


# ---------------------------------------------------------------------------- the clock


def read_clock(clock: Callable[[], str]) -> str:
    """The clock's time.

    Raises:
        InputError: the clock returned something other than a string (its format is checked with the capsule).
    """
    stamp = clock()
    if not isinstance(stamp, str):
        raise InputError(f"clock() returned a {type(stamp).__name__}, not an RFC 3339 UTC timestamp string")
    return stamp


def check_clock(clock: Callable[[], str]) -> None:
    """Ask ``clock`` once, before anything is created.

    Raises:
        InputError: what it returns could be no capsule's timestamp.
    """
    stamp = read_clock(clock)
    try:
        check_timestamp(stamp)
    except ValueError as exc:
        raise InputError(f"clock() returned {shown(stamp, 40)}, which {exc}") from None


_last_stamp: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """RFC 3339 UTC, whole seconds (the ledger's seq orders records within a second)."""
    global _last_stamp
    now = int(time.time())
    if _last_stamp[0] != now:
        _last_stamp = (now, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    return _last_stamp[1]
