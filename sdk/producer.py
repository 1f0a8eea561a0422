"""``Producer``: the API agent frameworks call to seal capsules.

The sealing path, in order (design §3). Every step that can refuse runs before
anything is signed or written, so a refusal leaves the ledger as it was:

1. assemble the capsule from the caller's spec and the producer's identity;
2. derive ``assurance`` from the capsule's own evidence; a caller's claim that
   differs is refused (AssuranceOverclaimError / AssuranceMismatchError);
3. canonicalize (floats and unsafe integers refused with their JSON path);
4. validate against the strict -05 model (producer MUSTs);
5. compute ``capsule_id`` and run capseal's Class-1 verifier: an error aborts;
6. sign the COSE_Sign1 envelope; signatures from a token or TPM are verified
   against the key's public key before use;
7. append to the ledger; the call returns once the record is durable.

A producer belongs to the process that opened it (its ledger's SQLite
connections, its signing pipeline's threads). In a process forked from that
one, sealing, submitting and flushing raise LedgerForkedError before anything
is signed or queued, and ``close()`` returns at once without writing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from capseal.keys import SignatureResult, Signer, SignerSelfTest

from . import _inputs, process
from ._args import timeout as timeout_arg
from ._lifecycle import Flow, rebuild_flow
from ._version import __version__
from .assurance import derive_assurance, enforce_claim
from .canonical import MAX_DEPTH, canonical_bytes, is_hex64, json_digest
from .envelope import PROFILE, Envelope, ToBeSigned, complete_envelope, prepare_envelope, sign_envelope
from .errors import (
    DuplicateRecordError,
    InputError,
    LedgerClosedError,
    LedgerError,
    SealAbortedError,
    SignerUnavailableError,
    shown,
)
from .ledger import Ledger, LedgerEntry, PendingAppend, StoredEntry
from .model import _timestamp, validate_capsule
from .pipeline import CloseOnce, CloseOutcome, SigningPipeline
from .record import SealedRecord, epistemic_type_for_capsule
from .verify import verify_for_seal
from .vocab import CANONICALIZATION_ID, FORMAT_VERSION, SPEC_VERSION

__all__ = ["Producer", "PendingRecord", "epistemic_type_for_capsule", "CUSTODY_MEMBER", "SDK_NAME"]

SDK_NAME = f"capseal/{__version__}"

log = logging.getLogger("capseal")
CUSTODY_MEMBER = "x-capseal-key-custody"

#: Members the producer writes itself; a spec may repeat them only with the same value.
_PRODUCER_OWNED = ("spec_version", "format_version", "canonicalization_id", "operator", "developer")
_NEVER_IN_SPEC = ("capsule_id", "signature", "key_id", "timestamp")


def _refuse_reserved(spec: Mapping[str, Any]) -> None:
    """Refuse what only the producer writes about itself: the epoch-boundary
    verdict, the ``epoch_opens`` chain relation and the ``x-capseal-*`` members of ``compute_attestation`` (the
    custody statement). Why: custody is observed, never asserted (design §3.4);
    a caller's spec claiming a token's custody, or opening an epoch, would
    read exactly like the producer's own."""
    disposition = spec.get("disposition")
    if isinstance(disposition, Mapping) and disposition.get("verdict_class") == "epoch_boundary":
        raise InputError("verdict_class 'epoch_boundary' is written by the producer when it opens an epoch "
                         "(Producer() or rotate_epoch()), never from a spec")
    chain = spec.get("chain")
    if isinstance(chain, Mapping) and chain.get("relation") == "epoch_opens":
        # the epoch this capsule is sealed in was opened by the producer's boundary
        # capsule; a second capsule saying it opens an epoch contradicts it
        raise InputError("chain.relation 'epoch_opens' is written by the producer on the capsule that opens an "
                         "epoch (rotate_epoch()), never from a spec or a seal(relation=...)")
    attestation = spec.get("model_attestation")
    compute = attestation.get("compute_attestation") if isinstance(attestation, Mapping) else None
    if isinstance(compute, Mapping):
        for key in compute:
            if isinstance(key, str) and key.startswith("x-capseal-"):
                raise InputError(f"model_attestation.compute_attestation[{shown(key)}] is written by the producer (what it "
                                 "observed of its key), never from a spec")


def _check_epoch_id(epoch_id: Any) -> None:
    """None (a new id is made) or a non-empty string with no control
    characters and a UTF-8 form. Why: ``""`` quietly got a generated id, and
    an integer was refused only by the capsule model, after the ledger file
    was made."""
    if epoch_id is not None:
        try:
            _inputs.identity("epoch_id", epoch_id)
        except InputError as exc:
            raise InputError(f"epoch_id is a non-empty string, or None for a new one ({exc})") from None


def _read_clock(clock: Callable[[], str]) -> str:
    """The clock's time; a non-string is refused here (its format is checked
    with the capsule), not left to fail as an AttributeError further on."""
    stamp = clock()
    if not isinstance(stamp, str):
        raise InputError(f"clock() returned a {type(stamp).__name__}, not an RFC 3339 UTC timestamp string")
    return stamp


def _check_clock(clock: Callable[[], str]) -> None:
    """Ask ``clock`` once and refuse (InputError) what no capsule could carry.
    Why here: the first capsule (the epoch boundary) is assembled after the
    ledger file is made, so a clock returning a number or a local time left
    an empty ledger behind its refusal."""
    stamp = _read_clock(clock)
    try:
        _timestamp(stamp)
    except ValueError as exc:
        raise InputError(f"clock() returned {shown(stamp, 40)}, which {exc}") from None


_last_stamp: tuple[int, str] = (-1, "")


def _utc_now() -> str:
    """RFC 3339 UTC, whole seconds (the ledger's seq orders records within a second)."""
    global _last_stamp
    now = int(time.time())
    if _last_stamp[0] != now:
        _last_stamp = (now, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)))
    return _last_stamp[1]


class PendingRecord:
    """A record on its way into the ledger (see :meth:`Producer.submit`).

    ``result()`` returns the sealed record once it is durable, or raises what
    refused it: the device (a signature that failed or did not verify) or the
    ledger (e.g. DuplicateRecordError for a reused action_id). Nothing is
    written for a refused record."""

    __slots__ = ("capsule_id", "_record", "_pending", "_error", "_ready")

    def __init__(self, capsule_id: str, record: SealedRecord | None = None, pending: PendingAppend | None = None) -> None:
        self.capsule_id = capsule_id
        self._record = record
        self._pending = pending
        self._error: BaseException | None = None
        self._ready = threading.Event()
        if record is not None:
            self._ready.set()

    def _resolve(self, record: SealedRecord, pending: PendingAppend) -> None:
        self._record, self._pending = record, pending
        self._ready.set()

    def _settled(self) -> bool:
        """Refused, or appended and done (durable or refused by the ledger)."""
        pending = self._pending
        return self._error is not None or (pending is not None and pending.done)

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self._ready.set()

    def result(self, timeout: float | None = None) -> SealedRecord:
        timeout = timeout_arg(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._ready.wait(timeout):
            raise LedgerError(f"record {self.capsule_id[:16]}… not signed within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._record is not None and self._pending is not None
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        stored = self._pending.result(remaining)
        return SealedRecord(self._record.capsule, self._record.envelopes, None, seq=stored.seq)


class _NotGiven:
    """The default of a lifecycle call's ``request``: not given (None means none)."""

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN: Any = _NotGiven()


class Producer:
    """Seals -05 capsules for one operator and one agent (developer) identity.

    ``ledger`` is a path (an embedded SQLite ledger is created) or a
    :class:`Ledger`. On construction the producer runs a signer self-test and
    opens an epoch: an epoch-boundary capsule describing the signing key as
    observed (custody statement). Use as a context manager, or call close().

    ``signer`` is a :class:`capseal.keys.Signer` (``open_signer(uri)``).
    ``epoch_id`` names the epoch it opens (default: a new one; an id already
    opened in the ledger is refused). ``model_id`` and ``provider``, given
    together, go into the epoch boundary's ``model_attestation``. ``clock`` returns each
    capsule's RFC 3339 UTC timestamp. ``verify_signatures``: ``"device"``
    checks every signature a token or TPM makes against the key's public key
    before it is written; ``"always"`` checks software signatures too.
    ``cite_epoch`` makes each capsule cite the epoch boundary (``ran_under``),
    the platform record a TPM quote binds; ``capseal.attest.attach`` sets it.
    ``continue_epoch`` carries on the last epoch this operator and developer
    opened in the ledger instead of opening a new one, when its boundary
    describes exactly what is observed now (the same key, custody statement,
    model and capseal version); otherwise a new epoch is opened as usual.
    Why: a configuration that did not change is the same epoch (-05 §5.2),
    and a CLI sealing one record per run doubled the ledger with boundaries.
    """

    def __init__(
        self,
        operator: str,
        developer: str,
        signer: Signer,
        ledger: str | os.PathLike[str] | Ledger,
        *,
        epoch_id: str | None = None,
        model_id: str | None = None,
        provider: str | None = None,
        clock: Callable[[], str] = _utc_now,
        verify_signatures: str = "device",
        cite_epoch: bool = False,
        continue_epoch: bool = False,
    ) -> None:
        _inputs.identity("operator", operator)
        _inputs.identity("developer", developer)
        if verify_signatures not in ("device", "always"):
            raise InputError("verify_signatures is 'device' (tokens and TPMs) or 'always'")
        if not callable(clock):
            raise InputError("clock is a function returning an RFC 3339 UTC timestamp")
        _check_clock(clock)  # before the ledger is opened: a bad clock left an empty ledger file behind
        # before the ledger is opened (a file would be created for nothing); only the
        # type is named: a key URI passed here may carry its PIN
        if not isinstance(signer, Signer):
            raise InputError(f"signer is a capseal.keys.Signer, not a {type(signer).__name__} "
                             "(capseal.keys.open_signer(uri) opens one from a key URI)")
        if not isinstance(ledger, (str, os.PathLike, Ledger)):
            raise InputError(f"ledger is a file path or a capseal.Ledger, not a {type(ledger).__name__}")
        ledger_path = None if isinstance(ledger, Ledger) else _inputs.ledger_path(ledger)
        _check_epoch_id(epoch_id)
        if continue_epoch and epoch_id is not None:
            raise InputError("give epoch_id (a new epoch) or continue_epoch=True (the last one), not both")
        if (model_id is None) != (provider is None):  # the model's own refusal named only the missing one's type
            raise InputError("model_id and provider are given together or not at all "
                             "(model_attestation holds both or neither)")
        _inputs.text("model_id", model_id, optional=True)
        _inputs.text("provider", provider, optional=True)
        if isinstance(ledger, Ledger) and ledger._forked:  # before the signer's self-test
            raise ledger._fork_error("Producer()")
        self.operator = operator
        self.developer = developer
        self.signer = signer
        self._clock = clock
        self._check_every_signature = verify_signatures == "always" or getattr(signer, "external_device", False)
        self._owns_ledger = ledger_path is not None
        self._stream = f"{operator}\x1f{developer}"
        self._flows: dict[str, Flow] = {}
        self._flows_lock = threading.Lock()
        self._observers: list[Callable[[SealedRecord], object]] = []
        self._id_observers: list[Callable[[str, int, bool], object]] = []
        self._closed = False
        self._model = (model_id, provider)
        # -05 §5.5.5 ran_under: each capsule cites the epoch-boundary capsule
        # (the platform record a TPM quote binds); see capseal.attest.
        self.cite_epoch = cite_epoch
        self._epoch_lock = threading.Lock()
        self._pipeline: SigningPipeline | None = None
        self._closing = CloseOnce(self._epoch_lock)  # see close()
        self._epoch_entry: LedgerEntry | None = None
        self._epoch_sent: PendingAppend | None = None  # the boundary while its pair is on the way
        self._recent: dict[str, PendingRecord] = {}  # see _keep_findable
        self._recent_lock = threading.Lock()
        # everything given is checked before a ledger file is made: the signer,
        # and the boundary capsule this producer opens its epoch with
        SignerSelfTest.run(signer)
        first_epoch = self._new_epoch_id() if epoch_id is None else epoch_id
        self._prepare(self._assemble(self._boundary_spec(first_epoch, None), own=True, epoch_id=first_epoch))
        if isinstance(ledger, Ledger):
            self.ledger = ledger
        else:
            assert ledger_path is not None
            self.ledger = Ledger(ledger_path)
        try:
            if not (continue_epoch and self._continue_epoch()):
                self._prepare_epoch(first_epoch)
        except BaseException:
            if self._owns_ledger:
                self.ledger.close()
            raise
        # what it was given is written at exit if the program does not close it
        process.close_at_exit("producers", self, _close_at_exit)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Finish what was submitted (it becomes durable), then release the ledger.

        ``timeout`` (seconds) bounds the wait for a token or TPM to sign what
        is queued. Why: a call into a PKCS#11 token cannot be cancelled, so a
        hung token would hold close() for ever. When it runs out, the records
        the device has not signed fail (their ``result()`` raises
        SignerUnavailableError and nothing is written for them; a TPM's
        commands for them are dropped from its queue), records already past
        the device are let finish, the ledger is closed all the same, and
        close() then raises SignerUnavailableError saying how many failed
        (and how many, past the device but slow to finish, may still be
        written)."""
        timeout = timeout_arg(timeout)
        if self.ledger._forked:  # see Ledger.close: this copy is let go of, nothing is waited for or written
            self._closed = True
            if self._owns_ledger:
                self.ledger.close()
            return
        deadline = None if timeout is None else time.monotonic() + timeout

        def start() -> None:  # under _epoch_lock: a first submit() making the pipeline now goes before or after
            # close() waits for a commit then (a record still in the pipeline will need one too)
            busy = self._pipeline is not None and self._pipeline.busy
            if self._owns_ledger or self._id_observers or busy or self._unwritten():
                self.ledger._refuse_inside_commit("Producer.close()")  # before anything is closed
            self._closed = True

        try:
            outcome = self._closing.run(lambda: self._close(timeout), deadline, start)
        except TimeoutError:
            raise LedgerError(f"close() still under way in another thread after {timeout} s") from None
        if outcome is not None and (outcome.given_up or outcome.finishing):
            said = [f"{outcome.given_up} submitted record(s) not signed {timeout:.3g} s into close(): not written"]
            if outcome.finishing:
                said.append(f"{outcome.finishing} signed record(s) still on their way to the ledger: they may "
                            "still be written")
            raise SignerUnavailableError(f"{self.signer.describe_short()}: " + "; ".join(said))

    def _close(self, timeout: float | None) -> CloseOutcome | None:
        """The steps of close() (each can be repeated): the pipeline, then the ledger."""
        pipeline = self._pipeline  # made before start() closed us, or never
        outcome = pipeline.close(timeout) if pipeline is not None else None
        if self._owns_ledger:
            self.ledger.close()
            return outcome
        # a shared ledger: its owner closes it, but what this producer submitted
        # becomes durable now, as close() says (it returned with them queued)
        self.ledger._wait(self._unwritten(), None)
        if self._id_observers:  # report what was submitted, then stop listening
            self.ledger.flush()
            self.ledger.remove_commit_listener(self._on_commit)
        return outcome

    def _unwritten(self) -> list[PendingAppend]:
        """The ledger appends of this producer's records not yet durable or
        refused (every record not settled is still in ``_recent``)."""
        with self._recent_lock:
            pending = [r._pending for r in self._recent.values()]
        return [p for p in pending if p is not None and not p.done]

    def add_observer(self, callback: Callable[[SealedRecord], object]) -> None:
        """Call ``callback(record)`` after each record is durable. It must not
        block, nor wait for a commit: the commit runs the callback, so
        ``seal``, ``close``, and ``flush`` or ``result`` with anything still
        to commit raise LedgerError there, before anything is queued or
        closed (``submit`` is fine);
        errors in it never undo a seal. Each record is kept alive until
        its group commits, for this; when the id is enough, use
        :meth:`add_id_observer`."""
        self._observers.append(callback)

    def add_id_observer(self, callback: Callable[[str, int, bool], object]) -> None:
        """Call ``callback(capsule_id, seq, epoch_boundary)`` after each record
        is durable (the batch evidence worker). Same rules as
        :meth:`add_observer`, but nothing of the record waits for its commit:
        the ledger reports each committed group once (``add_commit_listener``).
        Why it exists: keeping every record (or a callback per record) alive
        through its group-commit window cost full-speed sealing 10–20 % of its
        throughput in allocator and GC work, most of what batch evidence cost
        before it used this."""
        if not self._id_observers:
            self.ledger.add_commit_listener(self._on_commit)
        self._id_observers.append(callback)

    def _on_commit(self, entries: list[StoredEntry]) -> None:
        """The ledger's commit listener: this producer's capsules, to the id observers."""
        stream = self._stream
        for e in entries:
            if e.stream == stream and e.record_type == "capsule":
                self._dispatch_ids(e.record_id, e.seq, e.tag == "epoch_boundary")

    def _now(self) -> str:
        return _read_clock(self._clock)

    def _new_epoch_id(self) -> str:
        stamp = self._now().replace("-", "").replace(":", "")
        return f"epoch-{stamp}-{os.urandom(4).hex()}"

    def _prepare_epoch(self, epoch_id: str) -> SealedRecord:
        """Sign the boundary capsule of epoch ``epoch_id`` now, then open that
        epoch (``epoch_id``, ``epoch_record`` and the armed boundary change
        together, under the epoch lock: a record assembled meanwhile on another
        thread is in one epoch or the other, never in an epoch whose boundary
        is not armed). The boundary is appended to the ledger together with
        the first record of the epoch, so opening a producer and sealing
        nothing leaves the ledger unchanged; a refusal here changes nothing."""
        if self.ledger.has_action_id(f"{epoch_id}/opens"):
            raise InputError(f"epoch_id {epoch_id!r} was opened before in {self.ledger.path.name}; an epoch id is "
                             "never reused (-05 §5.2): give a new one, or none and capseal makes one")
        previous = self.ledger.last_tagged("epoch_boundary", self._stream)
        spec = self._boundary_spec(epoch_id, None if previous is None else previous.record_id)
        record = self._sign(self._assemble(spec, own=True, epoch_id=epoch_id))
        entry = self._entry(record, tag="epoch_boundary")
        with self._epoch_lock:
            self.epoch_id, self.epoch_record, self._epoch_entry = epoch_id, record, entry
        return record

    def _continue_epoch(self) -> bool:
        """Carry on this stream's last epoch if its boundary capsule's
        ``model_attestation`` is the one this producer would write now (which
        holds the custody statement observed of the signer, with its kid);
        False, changing nothing, when there is none or it differs."""
        previous = self.ledger.last_tagged("epoch_boundary", self._stream)
        if previous is None:
            return False
        boundary = SealedRecord.from_json(previous.record(), seq=previous.seq)
        epoch_id = boundary.capsule.get("epoch_id")
        if not isinstance(epoch_id, str):
            return False
        if boundary.capsule.get("model_attestation") != self._boundary_spec(epoch_id, None)["model_attestation"]:
            return False
        with self._epoch_lock:  # nothing armed: the boundary is in the ledger already
            self.epoch_id, self.epoch_record, self._epoch_entry = epoch_id, boundary, None
        return True

    def _boundary_spec(self, epoch_id: str, previous: str | None) -> dict[str, Any]:
        """The spec of the capsule that opens epoch ``epoch_id``, chained
        ``epoch_opens`` to ``previous`` (the stream's last boundary), if any."""
        compute: dict[str, Any] = {CUSTODY_MEMBER: self.signer.describe(), "x-capseal-producer": SDK_NAME}
        attestation: dict[str, Any] = {"compute_attestation": compute}
        model_id, provider = self._model
        if model_id is not None or provider is not None:
            attestation.update(model_id=model_id, provider=provider)
        spec: dict[str, Any] = {
            "action_id": f"{epoch_id}/opens",
            "action_type": "fyi",
            "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "epoch_boundary"},
            "model_attestation": attestation,
        }
        if previous is not None:
            spec["chain"] = {"parent_capsule_id": previous, "relation": "epoch_opens"}
        return spec

    def rotate_epoch(self, epoch_id: str | None = None) -> SealedRecord:
        """Start a new epoch (call when the configuration or key changes). The
        new boundary capsule is appended with the epoch's first record."""
        _check_epoch_id(epoch_id)
        self.flush()
        return self._prepare_epoch(self._new_epoch_id() if epoch_id is None else epoch_id)  # refused: the open epoch stays open

    # ------------------------------------------------------------------ the general seal

    def seal(self, spec: Mapping[str, Any], *, parent: SealedRecord | str | None = None, relation: str = "follows") -> SealedRecord:
        """Seal any -05 capsule from a partial ``spec``.

        The producer writes spec_version, format_version, canonicalization_id,
        operator, developer, timestamp, epoch_id, assurance and capsule_id.
        ``parent`` adds ``chain: {parent_capsule_id, relation}``. Returns once
        the record is durable in the ledger (this thread signs and commits;
        with a token or TPM that has submitted records still on their way,
        the record goes through the signing pipeline behind them, so order is
        kept).
        """
        body = self._body(spec, parent, relation)
        return self._seal(body, self._parent_known(body))

    def check(self, spec: Mapping[str, Any], *, parent: SealedRecord | str | None = None,
              relation: str = "follows") -> dict[str, Any]:
        """Every refusal :meth:`seal` would make of ``spec`` (malformed input,
        an overclaim, a float, a chain parent this ledger lacks, an action id
        it holds), raised the same way, with nothing signed or written.
        Returns the capsule as it would be sealed now, without its signature.

        Why: a caller holding several specs (``capseal seal`` on an array) can
        refuse them all before sealing any, without knowing the steps sealing
        takes."""
        body = self._body(spec, parent, relation)
        self._parent_known(body)
        capsule, _ = self._prepare(self._assemble(body))
        if self.ledger.has_action_id(capsule["action_id"]):
            raise DuplicateRecordError(f"action_id {capsule['action_id']!r} is already in {self.ledger.path.name}")
        return capsule

    def submit(self, spec: Mapping[str, Any], *, parent: SealedRecord | str | None = None, relation: str = "follows") -> PendingRecord:
        """Like :meth:`seal`, but return once the record is queued. Every
        refusal of the input (malformed spec, overclaim, float …) is raised
        here, before anything is queued; a device or ledger refusal (a signature
        that fails or does not verify, a duplicate action id) is raised by
        ``result()``, and nothing is written for it. The record is acknowledged
        — durable — only when ``result()`` returns (or after :meth:`flush`);
        meanwhile the ledger commits queued records in groups, one fsync each,
        and a token's or TPM's signing overlaps capseal's own work.
        """
        if self.ledger._forked:  # before the signer or the pipeline (its threads are not in this process)
            raise self.ledger._fork_error("Producer.submit()")
        body = self._body(spec, parent, relation)
        parent_record = self._parent_known(body)
        if getattr(self.signer, "external_device", False):
            return self._submit_pipelined(body, parent_record)
        return self._submit(body, wake=True, parent=parent_record)

    def _parent_known(self, body: dict[str, Any]) -> PendingRecord | None:
        """Refuse a chain parent that is neither in this ledger nor submitted
        by this producer: -05 §6 check 6 makes a missing parent an error, so
        the producer would write a record its own ledger verifier fails.
        Returns the parent's PendingRecord when it is still on its way (it is
        not waited for: the child is written only if the parent is, see
        :meth:`_enqueue`), looked up once here and carried to the ledger."""
        chain = body.get("chain")
        parent = chain.get("parent_capsule_id") if isinstance(chain, Mapping) else None
        if not isinstance(parent, str) or len(parent) != 64 or parent == self.epoch_record.capsule_id:
            return None  # no chain, a malformed one (refused with its own message later), or the epoch's boundary
        return self._known(parent)

    def _known(self, parent: str) -> PendingRecord | None:
        """``parent``'s PendingRecord while it is on its way, None once it is
        in the ledger; InputError when it is neither."""
        on_its_way = self._recent.get(parent)
        if on_its_way is not None or self.ledger.has_record(parent):
            return on_its_way
        raise InputError(f"chain parent {parent[:16]}… is not in {self.ledger.path.name}: a chain names a record "
                         "of the same ledger (-05 §6 check 6)")

    def _keep_findable(self, pending: PendingRecord) -> PendingRecord:
        """Keep a submitted record findable by id while it is on its way: a
        child chained to it is accepted before the parent is durable, and
        written only if the parent is. Records that are done (durable: the
        ledger finds them; or refused) leave from the front, so this holds
        about as many records as are under way, as the ledger's queue does."""
        with self._recent_lock:
            recent = self._recent
            recent[pending.capsule_id] = pending
            while recent:
                first = next(iter(recent.values()))
                if not first._settled():
                    break
                del recent[first.capsule_id]
        return pending

    @staticmethod
    def _body(spec: Mapping[str, Any], parent: SealedRecord | str | None, relation: str) -> dict[str, Any]:
        if not isinstance(spec, Mapping):
            raise InputError(f"a capsule spec is a JSON object, not {shown(spec)}")
        _inputs.text("relation", relation)
        body = dict(spec)
        if parent is not None:
            if "chain" in body:
                raise InputError("give the chain either as spec['chain'] or as parent=, not both")
            body["chain"] = {"parent_capsule_id": _id_of(parent), "relation": relation}
        return body

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted record is durable (or refused); with
        ``timeout``, raise LedgerError when that takes longer (the records
        stay queued and are still written)."""
        timeout = timeout_arg(timeout)
        if self.ledger._forked:
            raise self.ledger._fork_error("Producer.flush()")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pipeline is not None and not self._pipeline.drain(timeout):
            raise LedgerError(f"submitted records not signed within {timeout} s")
        self.ledger.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))

    @property
    def epoch_opened(self) -> bool:
        """True once the current epoch's boundary capsule is in the ledger queue."""
        return self._epoch_entry is None

    def _seal(self, spec: dict[str, Any], parent: PendingRecord | None = None) -> SealedRecord:
        if self.ledger._forked:  # before anything is signed or queued
            raise self.ledger._fork_error("Producer.seal()")
        self.ledger._refuse_inside_commit("seal()")  # before anything is signed or queued
        if self._pipeline is not None and self._pipeline.busy:
            # a token or TPM with submitted records still on their way: this one
            # goes behind them, so one thread's records reach the ledger in the
            # order it made them (otherwise it signs here: ~150 µs less CPU)
            return self._submit_pipelined(spec, parent).result()
        return self._submit(spec, wake=False, parent=parent).result()

    def _entry(self, record: SealedRecord, *, tag: str | None = None) -> LedgerEntry:
        capsule = record.capsule
        return LedgerEntry(
            record_id=record.capsule_id,
            record_type="capsule",
            epistemic_type=epistemic_type_for_capsule(capsule),
            body=record.body_bytes(),
            action_id=capsule["action_id"],
            stream=self._stream,
            tag=tag,
        )

    def _submit(self, spec: dict[str, Any], *, wake: bool = True, parent: PendingRecord | None = None) -> PendingRecord:
        if self._closed:
            raise LedgerClosedError("this producer is closed")
        record = self._sign(self._assemble(spec))  # every refusal happens here, before the ledger
        return self._keep_findable(PendingRecord(record.capsule_id, record, self._enqueue(record, wake=wake,
                                                                                          parent=parent)))

    def _enqueue(self, record: SealedRecord, *, wake: bool, parent: PendingRecord | None = None) -> PendingAppend:
        """Hand ``record`` to the ledger: the epoch's first record together
        with the epoch boundary (both or neither); a later record of the epoch
        queued behind that pair while it is on its way, and refused with it
        if it is refused (the boundary is then armed again for the next
        record); a chained record only if its parent is written. Nothing here
        waits for a commit: this runs on the signing pipeline's finishing
        thread and in observers too."""
        entry = self._entry(record)
        callback = partial(self._notify_sealed, record) if self._observers else None
        after = self._parent_append(record, parent)
        with self._epoch_lock:
            sent = self._epoch_sent
            if sent is not None:
                if sent.stored is not None:
                    self._epoch_sent = None
                elif sent.error is not None:  # refused with its first record: it goes in with the next one
                    self._epoch_sent = None
                    if self._epoch_entry is None:
                        self._epoch_entry = sent.entry
                else:
                    after += (sent,)  # on its way: behind it, and only if it is written
            return self._enqueue_now(record, entry, callback, after, wake)

    def _enqueue_now(self, record: SealedRecord, entry: LedgerEntry, callback: Any,
                     after: tuple[PendingAppend, ...], wake: bool) -> PendingAppend:
        """``_enqueue`` under the epoch lock."""
        armed = self._epoch_entry
        epoch = record.capsule.get("epoch_id")
        if epoch != self.epoch_id:  # assembled before a rotation: its own epoch's boundary must go in first
            opens = f"{epoch}/opens"
            if not any(a.entry.action_id == opens for a in after) and not self.ledger.has_action_id(opens):
                raise LedgerError(f"record {record.capsule_id[:16]}… not written: its epoch {epoch!r} was rotated "
                                  "before its boundary was written; seal it again")
            return self.ledger.submit(entry, callback, wake=wake, after=after)
        if armed is None:
            return self.ledger.submit(entry, callback, wake=wake, after=after)
        # the boundary is written only with the epoch's first record (a duplicate
        # action id refuses both): checked here too, so a refusal keeps it armed
        if self.ledger.has_action_id(str(armed.action_id)):
            raise InputError(f"epoch {self.epoch_id!r} was opened by another producer of {self.ledger.path.name} "
                             "meanwhile; an epoch id is never reused (-05 §5.2): call rotate_epoch()")
        capsule = record.capsule
        if self.ledger.has_action_id(capsule["action_id"]) or self.ledger.has_record(record.capsule_id):
            raise DuplicateRecordError(f"action_id {capsule['action_id']!r} (or this capsule) is already in "
                                       f"{self.ledger.path.name}")
        lead, pending = self.ledger.submit_pair(armed, entry, self._notify_epoch if self._observers else None,
                                                callback, wake=wake, after=after)
        self._epoch_entry, self._epoch_sent = None, lead
        return pending

    @staticmethod
    def _parent_append(record: SealedRecord, parent: PendingRecord | None) -> tuple[PendingAppend, ...]:
        """The ledger append of ``record``'s chain parent while it may not be
        durable yet (``parent``: the parent's PendingRecord, looked up when the
        record was accepted); the record is refused now if the parent already
        was."""
        if parent is None:
            return ()
        append = parent._pending
        error = parent._error if parent._error is not None else (append.error if append is not None else None)
        if error is not None:
            raise LedgerError(f"record {record.capsule_id[:16]}… not written: its chain parent "
                              f"{parent.capsule_id[:16]}… was refused ({error})")
        return () if append is None else (append,)

    def _submit_pipelined(self, spec: dict[str, Any], parent: PendingRecord | None = None) -> PendingRecord:
        """submit() for a token or TPM: prepare here, sign on the pipeline's
        signing thread (a TPM: queued on its own worker), check and append on
        the pipeline's finishing thread."""
        if self._closed:
            raise LedgerClosedError("this producer is closed")
        capsule, cid_raw = self._prepare(self._assemble(spec))  # every input refusal happens here
        tbs = prepare_envelope(self.signer, cid_raw)
        pending = PendingRecord(capsule["capsule_id"])
        if self._pipeline is None:
            with self._epoch_lock:
                if self._closed:  # close() ran meanwhile: nobody would close a pipeline made now
                    raise LedgerClosedError("this producer is closed")
                if self._pipeline is None:
                    signer = self.signer
                    queued = getattr(signer, "queues_signatures", False)
                    self._pipeline = SigningPipeline(
                        signer.kid[:16],
                        sign=None if queued else (lambda job: signer.sign(job[1].tbs)),
                        begin=(lambda job: signer.begin_sign(job[1].tbs)) if queued else None,
                        finish=self._finish_pipelined,
                        fail=lambda job, exc: job[2]._fail(exc),
                    )
        self._pipeline.put((capsule, tbs, pending, parent))
        return self._keep_findable(pending)  # once queued (a put that failed left nothing to wait for)

    def _finish_pipelined(self, job: tuple[dict[str, Any], ToBeSigned, PendingRecord, PendingRecord | None],
                          signature: SignatureResult) -> None:
        capsule, tbs, pending, parent = job
        envelope = complete_envelope(self.signer, tbs, signature, verify=self._check_every_signature)
        record = self._record(capsule, envelope)
        pending._resolve(record, self._enqueue(record, wake=True, parent=parent))

    def _notify_sealed(self, record: SealedRecord, stored: StoredEntry) -> None:
        # the record as sealed (what the caller gets back), not re-parsed from
        # the stored JSON: parsing cost ~27 us per record on the committing thread
        self._dispatch(SealedRecord(record.capsule, record.envelopes, None, seq=stored.seq))

    def _notify_epoch(self, stored: StoredEntry) -> None:
        self._dispatch(SealedRecord.from_json(stored.record(), seq=stored.seq))

    def _dispatch(self, record: SealedRecord) -> None:
        for callback in self._observers:
            try:
                callback(record)
            except Exception:  # an observer never undoes a durable seal
                pass

    def _dispatch_ids(self, capsule_id: str, seq: int, epoch_boundary: bool) -> None:
        for callback in self._id_observers:
            try:
                callback(capsule_id, seq, epoch_boundary)
            except Exception:  # an observer never undoes a durable seal
                pass

    def _assemble(self, spec: dict[str, Any], *, own: bool = False, epoch_id: str | None = None) -> dict[str, Any]:
        if not own:
            _refuse_reserved(spec)
        for key in _NEVER_IN_SPEC:
            if key in spec:
                raise InputError(f"{key} is written by the producer; leave it out of the spec")
        for key in _PRODUCER_OWNED:
            if key in spec and spec[key] != self._owned(key):
                raise InputError(f"{key}={shown(spec[key])} does not match this producer ({self._owned(key)!r})")
        epoch = self.epoch_id if epoch_id is None else epoch_id  # read once: rotate_epoch() may run meanwhile
        if "epoch_id" in spec and spec["epoch_id"] != epoch:
            raise InputError(f"epoch_id {shown(spec['epoch_id'])} is not the open epoch {epoch!r}; epoch ids are never back-filled")
        claimed = spec.get("assurance")
        capsule: dict[str, Any] = {
            "spec_version": SPEC_VERSION,
            "format_version": FORMAT_VERSION,
            "canonicalization_id": CANONICALIZATION_ID,
            "operator": self.operator,
            "developer": self.developer,
            "timestamp": self._now(),
            "epoch_id": epoch,
        }
        for key, value in spec.items():
            if key != "assurance":
                capsule[key] = value
        if self.cite_epoch and getattr(self, "epoch_record", None) is not None:
            self._add_epoch_citation(capsule)
        derived = derive_assurance(capsule)
        enforce_claim(claimed, derived)
        capsule["assurance"] = derived
        return capsule

    def _add_epoch_citation(self, capsule: dict[str, Any]) -> None:
        epoch_cid = self.epoch_record.capsule_id
        chain = capsule.get("chain")
        if isinstance(chain, Mapping) and chain.get("parent_capsule_id") == epoch_cid:
            return  # a reference must not name the chain parent (-05 §5.5.5)
        refs = list(capsule.get("references") or [])
        if any(isinstance(r, Mapping) and r.get("digest") == epoch_cid for r in refs):
            return
        refs.append({"type": "agent-action-capsule", "digest_alg": "SHA-256", "digest": epoch_cid, "citation_purpose": "ran_under"})
        capsule["references"] = refs

    def _owned(self, key: str) -> str:
        return {
            "spec_version": SPEC_VERSION,
            "format_version": FORMAT_VERSION,
            "canonicalization_id": CANONICALIZATION_ID,
            "operator": self.operator,
            "developer": self.developer,
        }[key]

    def _prepare(self, capsule: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        """Canonicalize, validate, compute the id and run the Class-1 self-check.

        Returns a capsule of its own, parsed back from the canonical bytes
        that were hashed. Why: the spec's nested objects are the caller's;
        one changed after ``submit()`` returned (or after ``seal()``, through
        the returned record) would otherwise be stored and signed-for with a
        body that no longer hashes to its capsule_id. The copy also turns
        tuples into the lists a verifier reads. About 10 µs a record."""
        preimage = canonical_bytes(capsule, max_depth=MAX_DEPTH)  # typed errors naming the JSON path
        capsule = json.loads(preimage)
        validate_capsule(capsule)
        cid_raw = hashlib.sha256(preimage).digest()
        cid = cid_raw.hex()
        capsule["capsule_id"] = cid
        result = verify_for_seal(capsule, cid)
        if not result.ok:
            raise SealAbortedError(
                "capseal's verifier refused the capsule: " + "; ".join(str(f) for f in result.errors), result.errors
            )
        return capsule, cid_raw

    @staticmethod
    def _record(capsule: dict[str, Any], envelope: Envelope) -> SealedRecord:
        if envelope.profile == PROFILE:  # the AAC profile travels inline, as the reference reads it
            capsule["signature"] = envelope.cose.hex()
            capsule["key_id"] = envelope.kid
        return SealedRecord(capsule, (envelope,))

    def _sign(self, capsule: dict[str, Any]) -> SealedRecord:
        capsule, cid_raw = self._prepare(capsule)
        return self._record(capsule, sign_envelope(self.signer, cid_raw, verify=self._check_every_signature))

    # ------------------------------------------------------------------ lifecycle helpers

    def _common(self, spec: dict[str, Any], extras: Mapping[str, Any]) -> dict[str, Any]:
        """Add the caller's extra members to the spec a lifecycle call built.

        An extra block the call builds itself (planned()'s ``effect``,
        refused()'s ``disposition``) is merged member by member, and a member
        that contradicts the call is refused. Why: replacing the block
        wholesale let planned() seal a confirmed effect and made refused()
        lose its verdict_class and reason_digest (-05 §5.5.3)."""
        for key, value in extras.items():
            if value is None:
                continue
            built = spec.get(key)
            if isinstance(built, dict):
                value = {**built, **_merge_members(key, built, value)}
            spec[key] = value
        return spec

    def planned(
        self,
        action_id: str,
        *,
        effect_type: str | None = None,
        request: Any = None,
        irreversibility_class: str | None = None,
        external_ref: str | None = None,
        action_type: str = "decide",
        **extra: Any,
    ) -> SealedRecord:
        """Seal that an action is planned. Planned effects carry no digests
        (-05 §5.3); ``request`` is digested now and used by the next capsule."""
        _strings(action_id=action_id, action_type=action_type)
        _strings(optional=True, effect_type=effect_type, irreversibility_class=irreversibility_class,
                 external_ref=external_ref)
        effect: dict[str, Any] = {"status": "planned"}
        if effect_type is not None:
            effect["type"] = effect_type
        if irreversibility_class is not None:
            effect["irreversibility_class"] = irreversibility_class
        if external_ref is not None:
            effect["external_ref"] = external_ref
        request_digest = json_digest(request, path="request") if request is not None else None
        record = self._seal_flow(self._common({"action_id": action_id, "action_type": action_type, "effect": effect}, extra))
        self._remember(record, Flow(action_id, effect_type, request_digest, irreversibility_class, external_ref))
        return record

    def dispatched(
        self,
        parent: SealedRecord | str,
        *,
        request: Any = _NOT_GIVEN,
        effect_attestation: str = "runtime_claimed",
        action_id: str | None = None,
        **extra: Any,
    ) -> SealedRecord:
        """Seal that the action was dispatched (follows its parent).

        ``request`` is the request actually sent (digested into
        ``request_digest``). Left out, the digest of the request given to
        ``planned()`` is used; when the planned capsule was sealed by another
        producer (another process, or before a restart) that digest cannot be
        recovered, and InputError asks for ``request=`` (or ``request=None``
        to seal without a request digest)."""
        _strings(effect_attestation=effect_attestation)
        _strings(optional=True, action_id=action_id)
        flow = self._flow(parent)
        effect = self._effect(flow, "dispatched", effect_attestation, request=request)
        spec = self._common({"action_id": action_id or f"{flow.base_action_id}/dispatched", "action_type": "decide", "effect": effect}, extra)
        record = self._seal_flow(self._chain(spec, parent, "follows"))
        # the next capsule digests the request actually sent (-05 §5.3), not the planned one
        self._remember(record, replace(flow, request_digest=record.capsule["effect"].get("request_digest"), request_known=True))
        return record

    def confirmed(
        self,
        parent: SealedRecord | str,
        *,
        response: Any,
        request: Any = _NOT_GIVEN,
        effect_attestation: str = "runtime_claimed",
        action_id: str | None = None,
        verdict_class: str | None = None,
        **extra: Any,
    ) -> SealedRecord:
        """Seal that the effect is confirmed by ``response`` (the response actually
        received; its digest is computed here). Chains with ``confirms``.
        ``request`` as for :meth:`dispatched`."""
        if response is None:
            raise InputError("confirmed() needs the response actually received (-05 §5.3)")
        _strings(effect_attestation=effect_attestation)
        _strings(optional=True, action_id=action_id, verdict_class=verdict_class)
        flow = self._flow(parent)
        effect = self._effect(flow, "confirmed", effect_attestation, request=request, response=response)
        spec = self._common({"action_id": action_id or f"{flow.base_action_id}/confirmed", "action_type": "decide", "effect": effect}, extra)
        if verdict_class is not None:
            given = _merge_members("disposition", {"verdict_class": verdict_class}, spec.get("disposition", {}))
            spec["disposition"] = {"decision": "accept", "approver": "policy", "human_disposed": False, **given,
                                   "verdict_class": verdict_class}
        record = self._seal_flow(self._chain(spec, parent, "confirms"))
        self._forget(parent)
        return record

    def failed(
        self,
        parent: SealedRecord | str,
        *,
        response: Any = None,
        request: Any = _NOT_GIVEN,
        effect_attestation: str = "runtime_claimed",
        verdict_class: str = "errored",
        action_id: str | None = None,
        **extra: Any,
    ) -> SealedRecord:
        """Seal that the dispatched action failed (optionally digesting the
        failure response). Follows its parent. ``request`` as for
        :meth:`dispatched`."""
        _strings(effect_attestation=effect_attestation, verdict_class=verdict_class)
        _strings(optional=True, action_id=action_id)
        flow = self._flow(parent)
        effect = self._effect(flow, "failed", effect_attestation, request=request, response=response)
        spec = self._common({"action_id": action_id or f"{flow.base_action_id}/failed", "action_type": "decide", "effect": effect}, extra)
        spec["disposition"] = {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": verdict_class,
                               **_mapping("disposition", spec.get("disposition", {}))}
        record = self._seal_flow(self._chain(spec, parent, "follows"))
        self._forget(parent)
        return record

    def refused(
        self,
        parent: SealedRecord | str | None = None,
        *,
        verdict_class: str,
        action_id: str | None = None,
        decision: str = "reject",
        approver: str = "policy",
        human_disposed: bool = False,
        reason: Any = None,
        authority: str | None = None,
        **extra: Any,
    ) -> SealedRecord:
        """Seal a refusal (blocked, denied, timeout before dispatch, …): -05
        §5.5.3 requires a capsule for every verdict. No effect is dispatched.
        ``reason`` (a JSON object) is recorded as ``reason_digest`` only."""
        _strings(verdict_class=verdict_class, decision=decision, approver=approver)
        _strings(optional=True, action_id=action_id, authority=authority)
        disposition: dict[str, Any] = {"decision": decision, "approver": approver, "human_disposed": human_disposed, "verdict_class": verdict_class}
        if reason is not None:
            disposition["reason_digest"] = json_digest(reason, path="reason")
        if authority is not None:
            disposition["authority"] = authority
        if parent is not None:
            flow = self._flow(parent)
            base = action_id or f"{flow.base_action_id}/{verdict_class}"
        elif action_id is None:
            raise InputError("refused() needs action_id when there is no parent")
        else:
            base = action_id
        spec = self._common({"action_id": base, "action_type": "decide", "disposition": disposition}, extra)
        record = self._seal_flow(self._chain(spec, parent, "follows") if parent is not None else spec)
        if parent is not None:
            self._forget(parent)
        return record

    def resolved(
        self,
        open_record: SealedRecord | str,
        *,
        decision: str,
        approver: str,
        human_disposed: bool | None = None,
        verdict_class: str = "resolved",
        action_id: str | None = None,
        reason: Any = None,
        **extra: Any,
    ) -> SealedRecord:
        """Close an open item (deferred, needs_decision, hitl_dispatched, …) with
        a new capsule chained ``supersedes`` (-05 §5.5.4).

        ``approver`` has no default: ``"human"`` makes ``human_disposed`` true,
        which -05 §5.5 allows only when a human actually acted, so the caller
        says who did."""
        _strings(decision=decision, approver=approver, verdict_class=verdict_class)
        _strings(optional=True, action_id=action_id)
        if human_disposed is None:
            human_disposed = approver == "human"
        disposition: dict[str, Any] = {"decision": decision, "approver": approver, "human_disposed": human_disposed, "verdict_class": verdict_class}
        if reason is not None:
            disposition["reason_digest"] = json_digest(reason, path="reason")
        base = self._flow(open_record, "open_record").base_action_id
        spec = self._common({"action_id": action_id or f"{base}/{verdict_class}", "action_type": "decide", "disposition": disposition}, extra)
        return self._seal_flow(self._chain(spec, open_record, "supersedes"))

    # ------------------------------------------------------------------ flow bookkeeping

    def _chain(self, spec: dict[str, Any], parent: SealedRecord | str, relation: str) -> dict[str, Any]:
        if "chain" in spec:
            raise InputError("the chain is set by the lifecycle call; seal() takes an explicit chain")
        spec["chain"] = {"parent_capsule_id": _id_of(parent), "relation": relation}
        return spec

    def _seal_flow(self, spec: dict[str, Any]) -> SealedRecord:
        """Seal a lifecycle capsule, its chain parent checked as seal() checks
        it. Why: a SealedRecord parent was taken on trust, so a record of
        another ledger (or producer) gave a capsule chained to a parent this
        ledger does not hold, which -05 §6 check 6 fails."""
        return self._seal(spec, self._parent_known(spec))

    def _remember(self, record: SealedRecord, flow: Flow) -> None:
        with self._flows_lock:
            self._flows[record.capsule_id] = flow

    def _forget(self, parent: SealedRecord | str) -> None:
        with self._flows_lock:
            self._flows.pop(_id_of(parent), None)

    def _flow(self, parent: SealedRecord | str, name: str = "parent") -> Flow:
        """The flow ``parent`` belongs to: this producer's own, or rebuilt from
        the capsule (the one given, else the ledger's), exactly as the producer
        that sealed it held it (see :mod:`._lifecycle`)."""
        if self.ledger._forked:  # the lifecycle calls come here first: refused before the lock below
            raise self.ledger._fork_error("Producer: sealing a lifecycle capsule")
        pid = _id_of(parent, name)
        with self._flows_lock:
            flow = self._flows.get(pid)
        if flow is not None:
            return flow
        if isinstance(parent, SealedRecord):
            self._known(pid)  # a record of another ledger: refused as a chain to it is, before its flow is read
            capsule = parent.capsule
        else:
            capsule = self._capsule_from_ledger(pid, name)
        return rebuild_flow(capsule, self._stored_capsule)

    def _stored_capsule(self, capsule_id: str) -> dict[str, Any] | None:
        record = self.ledger.get(capsule_id) if is_hex64(capsule_id) else None
        return None if record is None else record.capsule

    def _capsule_from_ledger(self, capsule_id: str, name: str = "parent") -> dict[str, Any]:
        capsule = self._stored_capsule(capsule_id)
        if capsule is None:
            raise InputError(f"{name} {capsule_id} is not in this producer's ledger")
        return capsule

    @staticmethod
    def _effect(flow: Flow, status: str, attestation: str, *, request: Any = _NOT_GIVEN,
                response: Any = None) -> dict[str, Any]:
        effect: dict[str, Any] = {"status": status}
        if flow.effect_type is not None:
            effect["type"] = flow.effect_type
        if request is not _NOT_GIVEN and request is not None:
            request_digest: str | None = json_digest(request, path="request")
        elif flow.request_known or request is None:  # None: the caller says there is no request to digest
            request_digest = flow.request_digest
        else:
            raise InputError(
                f"the request digest of this {status} capsule cannot be recovered: its flow starts at a planned "
                "capsule this producer did not seal (a planned capsule never carries its request's digest, -05 §5.3)",
                hint="pass request= (the request actually sent), or request=None to seal it without a request digest")
        if request_digest is not None:
            effect["request_digest"] = request_digest
        if response is not None:
            effect["response_digest"] = json_digest(response, path="response")
        if flow.external_ref is not None:
            effect["external_ref"] = flow.external_ref
        if flow.irreversibility_class is not None:
            effect["irreversibility_class"] = flow.irreversibility_class
        effect["effect_attestation"] = attestation
        return effect


def _mapping(key: str, value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else InputError (not the TypeError of ``**value``)."""
    if not isinstance(value, Mapping):
        raise InputError(f"{key} is a JSON object of extra members; got {type(value).__name__}")
    return value


def _merge_members(key: str, built: Mapping[str, Any], value: Any) -> Mapping[str, Any]:
    """The caller's members of block ``key``, refused where one contradicts what the call built."""
    given = _mapping(key, value)
    for member, item in given.items():
        if member in built and item != built[member]:
            raise InputError(f"{key}.{member}={shown(item)} contradicts what this call records ({shown(built[member])}); "
                             "use the call's own parameters")
    return given


def _close_at_exit(producer: Producer, deadline: float) -> None:
    """At exit: close a producer the program left open, which makes what was
    submitted durable, with a warning saying how much (it should have been
    closed); records a device has not signed by ``deadline`` fail."""
    if producer._closed:
        return
    where = producer.ledger.path.name
    pipeline = producer._pipeline
    unwritten = (pipeline.outstanding if pipeline is not None else 0) + len(producer._unwritten())
    if unwritten:
        log.warning("capseal: %d submitted record(s) for %s were not yet durable at exit; closing the producer "
                    "writes them (call close() or flush() before the program ends)", unwritten, where)
    try:
        producer.close(timeout=max(0.0, deadline - time.monotonic()))
    except Exception as exc:  # noqa: BLE001 - the exit goes on to the ledgers and devices
        log.warning("capseal: closing the producer for %s at exit: %s: %s", where, type(exc).__name__, exc)


def _strings(*, optional: bool = False, **named: Any) -> None:
    """Each named argument is a string with a UTF-8 form (or None, when
    ``optional``); InputError naming the first that is not."""
    for name, value in named.items():
        _inputs.text(name, value, optional=optional)


def _id_of(parent: SealedRecord | str, name: str = "parent") -> str:
    return _inputs.capsule_ref(name, parent)

