"""``Producer``: the API agent frameworks call to seal capsules.

A producer seals for one operator and one agent (developer) identity. Each
capsule goes one way, whichever thread signs it (:mod:`capseal._internal`):

1. ``sealing.assemble`` — the spec plus what the producer writes about itself,
   and the assurance derived from the capsule's own evidence;
2. ``sealing.prepare`` — canonical bytes, the strict -05 model, the capsule id,
   capseal's own Class-1 check, the bytes to sign (every refusal of the
   caller's input happens here, before anything is signed or queued);
3. the signature, on this thread or, for a token or TPM with records under
   way, on the signing pipeline (``pipeline``);
4. ``sealing.complete`` — the device's answer checked (a token's or TPM's
   against the key) and the record assembled;
5. ``writer.enqueue`` — into the ledger in order (an epoch's boundary with its
   first record, a chain parent before its child); ``seal()`` returns once
   the record is durable.

Lifecycle calls (``planned``, ``dispatched``, …) are inherited from
``capseal._internal.lifecycle``, which builds their spec; they seal it the
same way. A producer belongs to the process
that opened it: in a forked process, sealing, submitting and flushing raise
LedgerForkedError before anything is signed or queued, and ``close()``
returns at once without writing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from capseal.keys import Signer, SignerSelfTest

from . import process
from ._internal import inputs, sealing
from ._internal.device import DeviceSealing
from ._internal.lifecycle import Flow, Flows, LifecycleCalls, Parent, capsule_ref
from ._internal.pipeline import CloseOnce, CloseOutcome, SigningPipeline
from ._internal.rebuild import flow_of
from ._internal.sealing import CUSTODY_MEMBER, Identity, Prepared
from ._internal.writer import OrderedWriter, PendingRecord
from ._version import __version__
from .arguments import timeout as timeout_arg
from .errors import DuplicateRecordError, InputError, LedgerClosedError, LedgerError, SignerUnavailableError, shown
from .ledger import Ledger
from .record import SealedRecord, epistemic_type_for_capsule

__all__ = ["Producer", "PendingRecord", "epistemic_type_for_capsule", "CUSTODY_MEMBER", "SDK_NAME"]

SDK_NAME = f"capseal/{__version__}"

log = logging.getLogger("capseal")


class Producer(LifecycleCalls):
    """Seals -05 capsules for one operator and one agent (developer) identity.

    On construction the producer runs a signer self-test and opens an epoch:
    an epoch-boundary capsule describing the signing key as observed
    (custody statement), written with the epoch's first record. Use it as a
    context manager, or call :meth:`close`.

    Args:
        operator: the tenant the capsules are sealed for.
        developer: the agent identity and version (``buyer-agent@1.4``).
        signer: a :class:`capseal.keys.Signer` (``open_signer(uri)``).
        ledger: a path (an embedded SQLite ledger is made there) or a :class:`Ledger`.
        epoch_id: the id of the epoch it opens (default: a new one).
        model_id: with ``provider``: the model, in the epoch boundary's ``model_attestation``.
        provider: with ``model_id``.
        clock: returns each capsule's RFC 3339 UTC timestamp.
        verify_signatures: ``"device"`` checks every signature a token or TPM
            makes against the key before it is written; ``"always"`` checks
            software signatures too.
        cite_epoch: each capsule cites the epoch boundary (``ran_under``), the
            platform record a TPM quote binds (``capseal.attest.attach`` sets it).
        continue_epoch: carry on the last epoch this operator and developer
            opened in the ledger when its boundary describes exactly what is
            observed now (key, custody statement, model, capseal version),
            else open a new one; a configuration that did not change is the
            same epoch (-05 §5.2).

    Raises:
        InputError: a bad argument (named), an epoch id opened before, or a
            clock whose time no capsule could carry; nothing is created.
        LedgerError: no ledger can be opened at the path.
        SignerError: the signer's self-test failed.
    """

    def __init__(self, operator: str, developer: str, signer: Signer, ledger: str | os.PathLike[str] | Ledger, *,
                 epoch_id: str | None = None, model_id: str | None = None, provider: str | None = None,
                 clock: Callable[[], str] = sealing.utc_now, verify_signatures: str = "device",
                 cite_epoch: bool = False, continue_epoch: bool = False) -> None:
        ledger_path = inputs.producer_arguments(operator, developer, signer, ledger, epoch_id, model_id, provider, clock,
                               verify_signatures, continue_epoch)
        self.operator, self.developer, self.signer = operator, developer, signer
        self.cite_epoch = cite_epoch
        self._identity = Identity(operator, developer)
        self._clock = clock
        self._check_every_signature = verify_signatures == "always" or getattr(signer, "external_device", False)
        self._model = (model_id, provider)
        self._flows = Flows()
        self._closed = False
        self._epoch_lock = threading.Lock()
        self._closing = CloseOnce(self._epoch_lock)  # see close()
        # everything given is checked before a ledger file is made: the signer,
        # and the boundary capsule this producer opens its epoch with
        SignerSelfTest.run(signer)
        first_epoch = self._new_epoch_id() if epoch_id is None else epoch_id
        sealing.canonical(sealing.assemble(self._identity, self._boundary_spec(first_epoch, None), own=True,
                                           epoch_id=first_epoch, timestamp=sealing.read_clock(clock)))
        self._owns_ledger = ledger_path is not None
        self.ledger = Ledger(ledger_path) if ledger_path is not None else _as_ledger(ledger)
        self._writer = OrderedWriter(self.ledger, f"{operator}\x1f{developer}", self._epoch_lock)
        self._device = DeviceSealing(signer, self._writer, verify=self._check_every_signature, lock=self._epoch_lock,
                                     closed=lambda: self._closed)
        try:
            if not (continue_epoch and self._continue_epoch()):
                self._prepare_epoch(first_epoch)
        except BaseException:
            if self._owns_ledger:
                self.ledger.close()
            raise
        # what it was given is written at exit if the program does not close it
        process.close_at_exit("producers", self, _close_at_exit)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ epochs

    @property
    def epoch_id(self) -> str:
        """The open epoch's id (every capsule sealed now carries it)."""
        return self._writer.epoch_id

    @property
    def epoch_record(self) -> SealedRecord:
        """The open epoch's boundary capsule record."""
        record = self._writer.epoch_record
        assert record is not None  # opened in __init__
        return record

    @property
    def epoch_opened(self) -> bool:
        """True once the current epoch's boundary capsule is in the ledger queue."""
        return self._writer.epoch_opened

    def rotate_epoch(self, epoch_id: str | None = None) -> SealedRecord:
        """Start a new epoch (call when the configuration or key changes); its
        boundary capsule is appended with the epoch's first record.

        Args:
            epoch_id: the new epoch's id (default: a new one).

        Returns:
            The new boundary capsule record (not yet in the ledger).

        Raises:
            InputError: a bad id, or one opened before (the open epoch stays open).
            SignerError: the device could not sign the boundary capsule (the
                open epoch stays open).
            LedgerForkedError: called in a process forked from the producer's.
            LedgerError: the ledger cannot be read, or the call came from an
                observer with records still to commit (it waits for them first).
        """
        inputs.epoch(epoch_id)
        self.flush()
        return self._prepare_epoch(self._new_epoch_id() if epoch_id is None else epoch_id)

    def _new_epoch_id(self) -> str:
        stamp = sealing.read_clock(self._clock).replace("-", "").replace(":", "")
        return f"epoch-{stamp}-{os.urandom(4).hex()}"

    def _boundary_spec(self, epoch_id: str, previous: str | None) -> dict[str, Any]:
        return sealing.boundary_spec(epoch_id, previous, self.signer.describe(), SDK_NAME, self._model)

    def _prepare_epoch(self, epoch_id: str) -> SealedRecord:
        """Sign the boundary capsule of epoch ``epoch_id`` now, then open that
        epoch; the boundary goes into the ledger with the epoch's first record."""
        if self.ledger.has_action_id(f"{epoch_id}/opens"):
            raise InputError(f"epoch_id {epoch_id!r} was opened before in {self.ledger.path.name}; an epoch id is "
                             "never reused (-05 §5.2): give a new one, or none and capseal makes one")
        previous = self.ledger.last_tagged("epoch_boundary", self._writer.stream)
        spec = self._boundary_spec(epoch_id, None if previous is None else previous.record_id)
        record = self._sign_here(self._prepare(spec, own=True, epoch_id=epoch_id))
        self._writer.open_epoch(epoch_id, record, self._writer.entry(record, tag="epoch_boundary"))
        return record

    def _continue_epoch(self) -> bool:
        """Carry on this stream's last epoch if its boundary's
        ``model_attestation`` (the custody statement with the kid, the model,
        capseal's version) is the one this producer would write now; False,
        changing nothing, when there is none or it differs."""
        previous = self.ledger.last_tagged("epoch_boundary", self._writer.stream)
        if previous is None:
            return False
        boundary = SealedRecord.from_json(previous.record(), seq=previous.seq)
        epoch_id = boundary.capsule.get("epoch_id")
        if not isinstance(epoch_id, str):
            return False
        if boundary.capsule.get("model_attestation") != self._boundary_spec(epoch_id, None)["model_attestation"]:
            return False
        self._writer.open_epoch(epoch_id, boundary, None)  # nothing armed: it is in the ledger already
        return True

    # ------------------------------------------------------------------ sealing

    def seal(self, spec: Mapping[str, Any], *, parent: Parent | None = None, relation: str = "follows") -> SealedRecord:
        """Seal any -05 capsule from a partial ``spec``.

        The producer writes spec_version, format_version, canonicalization_id,
        operator, developer, timestamp, epoch_id, assurance and capsule_id.

        Args:
            spec: the capsule's other members.
            parent: adds ``chain: {parent_capsule_id, relation}``.
            relation: the chain relation to ``parent``.

        Returns:
            The sealed record (with its ledger ``seq``), once it is durable.

        Raises:
            InputError: a spec no honest capsule can come from, named by a
                subclass where one fits (CanonicalizationError,
                CapsuleValidationError, AssuranceError), a member the producer
                writes itself, or a chain parent this ledger does not hold;
                nothing is signed or written.
            SealAbortedError: capseal's own verifier refused the capsule.
            SignerError: the device failed (DeviceError,
                SignerUnavailableError), the key has no COSE algorithm
                (UnsupportedAlgorithmError), or its signature does not verify
                (SignatureFailedError); nothing is written.
            DuplicateRecordError: its action_id is already in the ledger.
            LedgerClosedError: the producer (or the ledger) is closed.
            LedgerForkedError: called in a process forked from the producer's.
            LedgerError: the ledger could not write it, or the call came from
                an observer (it would wait on its own commit).
        """
        return self._seal(lambda: self._body(spec, parent, relation))

    def check(self, spec: Mapping[str, Any], *, parent: Parent | None = None, relation: str = "follows") -> dict[str, Any]:
        """Every refusal :meth:`seal` would make of ``spec``, raised the same
        way, with nothing signed or written (so a caller holding several specs
        can refuse them all before sealing any).

        Args:
            spec: the capsule's other members, as for :meth:`seal`.
            parent: as for :meth:`seal`.
            relation: as for :meth:`seal`.

        Returns:
            The capsule as it would be sealed now, without its signature.

        Raises:
            InputError, SealAbortedError, DuplicateRecordError: as :meth:`seal`.
            LedgerError: the ledger cannot be read (LedgerClosedError,
                LedgerForkedError).
        """
        body = self._body(spec, parent, relation)
        self._writer.parent_known(body)
        capsule, _, _ = sealing.canonical(self._assemble(body))
        if self.ledger.has_action_id(capsule["action_id"]):
            raise DuplicateRecordError(f"action_id {capsule['action_id']!r} is already in {self.ledger.path.name}")
        return capsule

    def submit(self, spec: Mapping[str, Any], *, parent: Parent | None = None, relation: str = "follows") -> PendingRecord:
        """Like :meth:`seal`, but return once the record is queued; it is
        durable when ``result()`` returns (or after :meth:`flush`). The ledger
        commits queued records in groups, one fsync each, and a token's or
        TPM's signing overlaps capseal's own work.

        Args:
            spec: the capsule's other members, as for :meth:`seal`.
            parent: as for :meth:`seal` (a record still pending is fine: it
                is written first).
            relation: as for :meth:`seal`.

        Returns:
            A :class:`PendingRecord`; its ``result()`` raises the device's or
            the ledger's refusal (SignerError, DuplicateRecordError,
            LedgerError), and nothing is written for that record.

        Raises:
            InputError, SealAbortedError, LedgerClosedError, LedgerForkedError:
                at once, as :meth:`seal`, before anything is queued.
            SignerError, DuplicateRecordError: at once with a software key,
                which signs and queues on this thread (a token's or TPM's
                refusal comes from ``result()``).
        """
        self._refuse_if_forked("Producer.submit()")  # before the signer or the pipeline
        body = self._body(spec, parent, relation)
        parent_record = self._writer.parent_known(body)
        if getattr(self.signer, "external_device", False):
            return self._submit_pipelined(body, parent_record)
        return self._submit(body, wake=True, parent=parent_record)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted record is durable (or refused).

        Args:
            timeout: seconds to wait at most (None: no limit).

        Raises:
            InputError: ``timeout`` is not a number of seconds.
            LedgerForkedError: called in a process forked from the producer's.
            LedgerError: not done within ``timeout`` (the records stay queued
                and are still written), or called from an observer with
                records still to commit.
        """
        timeout = timeout_arg(timeout)
        self._refuse_if_forked("Producer.flush()")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._pipeline is not None and not self._pipeline.drain(timeout):
            raise LedgerError(f"submitted records not signed within {timeout} s")
        self.ledger.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _refuse_if_forked(self, what: str) -> None:
        self.ledger.refuse_if_forked(what)

    @staticmethod
    def _body(spec: Mapping[str, Any], parent: Parent | None, relation: str) -> dict[str, Any]:
        if type(spec) is not dict and not isinstance(spec, Mapping):  # the ABC check only for what is not a dict
            raise InputError(f"a capsule spec is a JSON object, not {shown(spec)}")
        inputs.text("relation", relation)
        body = dict(spec)
        if parent is not None:
            if "chain" in body:
                raise InputError("give the chain either as spec['chain'] or as parent=, not both")
            body["chain"] = {"parent_capsule_id": capsule_ref(parent), "relation": relation}
        return body

    def _assemble(self, spec: Mapping[str, Any], *, own: bool = False, epoch_id: str | None = None) -> dict[str, Any]:
        epoch = self._writer.epoch_id if epoch_id is None else epoch_id  # read once: rotate_epoch() may run meanwhile
        boundary = self._writer.epoch_record
        cite = boundary.capsule_id if self.cite_epoch and boundary is not None else None
        return sealing.assemble(self._identity, spec, epoch_id=epoch, timestamp=sealing.read_clock(self._clock),
                                cite=cite, own=own)

    def _prepare(self, spec: Mapping[str, Any], *, own: bool = False, epoch_id: str | None = None) -> Prepared:
        """Steps 1 and 2: every refusal of the caller's input happens here."""
        return sealing.prepare(self._assemble(spec, own=own, epoch_id=epoch_id), self.signer)

    def _sign_here(self, prepared: Prepared) -> SealedRecord:
        """Steps 3 and 4 on this thread."""
        verify = self._check_every_signature
        signature = sealing.signature_now(self.signer, prepared, verify=verify)
        return sealing.complete(self.signer, prepared, signature, verify=verify)

    def _seal(self, make: Callable[[], dict[str, Any]]) -> SealedRecord:
        with self.ledger.arriving():  # a thread committing meanwhile lets this record join its commit
            spec = make()
            parent = self._writer.parent_known(spec)
            self._refuse_if_forked("Producer.seal()")  # before anything is signed or queued
            self.ledger.refuse_inside_commit("seal()")
            # a token or TPM with submitted records on their way: behind them, so one thread's records stay in order
            busy = self._pipeline is not None and self._pipeline.busy
            pending = self._submit_pipelined(spec, parent) if busy else self._submit(spec, wake=False, parent=parent)
        return pending.result()

    def _submit(self, spec: dict[str, Any], *, wake: bool = True, parent: PendingRecord | None = None) -> PendingRecord:
        """The whole path on this thread."""
        if self._closed:
            raise LedgerClosedError("this producer is closed")
        record = self._sign_here(self._prepare(spec))
        pending = PendingRecord(record.capsule_id, record, self._writer.enqueue(record, wake=wake, parent=parent))
        return self._writer.keep_findable(pending)

    def _submit_pipelined(self, spec: dict[str, Any], parent: PendingRecord | None = None) -> PendingRecord:
        """Steps 1 and 2 here, the rest on the device's signing pipeline."""
        if self._closed:
            raise LedgerClosedError("this producer is closed")
        prepared = self._prepare(spec)
        pending = PendingRecord(prepared.capsule_id)
        self._device.put(prepared, pending, parent)
        return self._writer.keep_findable(pending)  # once queued (a put that failed left nothing to wait for)

    @property
    def _pipeline(self) -> SigningPipeline | None:
        return self._device.pipeline

    # ------------------------------------------------------------------ observers and closing

    def add_observer(self, callback: Callable[[SealedRecord], object]) -> None:
        """Call ``callback(record)`` after each record is durable.

        It runs on the committing thread: it must not block nor wait for a
        commit (``seal``, ``close``, and ``flush`` or ``result`` with anything
        still to commit raise LedgerError there; ``submit`` is fine); its
        errors never undo a seal. Each record is kept alive until its group
        commits; when the id is enough, use :meth:`add_id_observer`.

        Args:
            callback: called with each durable :class:`SealedRecord`; what it
                returns is ignored.
        """
        self._writer.add_observer(callback)

    def add_id_observer(self, callback: Callable[[str, int, bool], object]) -> None:
        """Call ``callback(capsule_id, seq, epoch_boundary)`` after each record
        is durable (the batch evidence worker uses it). Same rules as
        :meth:`add_observer`, but nothing of the record waits for its commit.

        Args:
            callback: called with the record's capsule id, its ledger seq, and
                whether it is an epoch boundary; what it returns is ignored.
        """
        self._writer.add_id_observer(callback)

    def _unwritten(self) -> list[Any]:
        """The ledger appends of this producer's records not yet durable or refused."""
        return self._writer.unwritten()

    def close(self, timeout: float | None = None) -> None:
        """Finish what was submitted (it becomes durable), then release the ledger.

        Args:
            timeout: seconds to wait at most for a token or TPM to sign what is
                queued (a call into a PKCS#11 token cannot be cancelled).

        Raises:
            InputError: ``timeout`` is not a number of seconds.
            SignerUnavailableError: the time ran out: the records the device had
                not signed failed (nothing written for them), the ledger was
                closed all the same; the message says how many failed and how
                many, past the device, may still be written.
            LedgerError: called from an observer (it would wait on its own
                commit), or another thread's close() still under way after
                ``timeout``.
        """
        timeout = timeout_arg(timeout)
        if self.ledger.forked:  # this copy is let go of: nothing is waited for or written
            self._closed = True
            if self._owns_ledger:
                self.ledger.close()
            return
        deadline = None if timeout is None else time.monotonic() + timeout

        def start() -> None:  # under the epoch lock: a first submit() making the pipeline goes before or after
            busy = self._pipeline is not None and self._pipeline.busy
            if self._owns_ledger or self._writer.has_id_observers or busy or self._unwritten():
                self.ledger.refuse_inside_commit("Producer.close()")  # before anything is closed
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
        # a shared ledger: its owner closes it, but what this producer submitted becomes durable now
        self.ledger.wait(self._unwritten(), None)
        self._writer.stop_id_observers()
        return outcome

    # ------------------------------------------------------------------ what the lifecycle calls need

    def _seal_flow(self, spec: dict[str, Any]) -> SealedRecord:
        """Seal a lifecycle capsule, its chain parent checked as seal() checks it."""
        return self._seal(lambda: spec)

    def _flow(self, parent: Parent, name: str = "parent") -> Flow:
        """The flow ``parent`` belongs to (see :func:`capseal._internal.rebuild.flow_of`)."""
        self._refuse_if_forked("Producer: sealing a lifecycle capsule")
        return flow_of(parent, capsule_ref(parent, name), name, self._flows, self._writer.known, self.ledger.get)


def _as_ledger(ledger: object) -> Ledger:
    assert isinstance(ledger, Ledger)
    return ledger


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
