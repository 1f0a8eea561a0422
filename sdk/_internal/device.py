"""Sealing on a token or TPM: records are prepared on the caller's thread,
signed on the signing pipeline's signing thread (a TPM: queued on its own
worker), then completed (the signature checked against the key) and handed to
the ordered writer on the pipeline's finishing thread — the same
``sealing.complete`` a seal on the caller's thread runs."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import LedgerClosedError
from . import sealing
from .pipeline import SigningPipeline
from .sealing import Prepared
from .writer import OrderedWriter, PendingRecord

if TYPE_CHECKING:
    from capseal.keys import SignatureResult, Signer

__all__ = ["DeviceSealing"]

_Job = tuple[Prepared, PendingRecord, "PendingRecord | None"]


class DeviceSealing:
    """One producer's signing pipeline, made on first use.

    Args:
        signer: the token or TPM signer.
        writer: the producer's ordered writer.
        verify: check each signature against the key before it is written.
        lock: the producer's lock (held while the pipeline is made, and by close()).
        closed: whether the producer is closed (then no pipeline is made).
    """

    def __init__(self, signer: Signer, writer: OrderedWriter, *, verify: bool, lock: threading.Lock,
                 closed: Callable[[], bool]) -> None:
        self.signer, self.writer, self.verify = signer, writer, verify
        self._lock, self._closed = lock, closed
        self.pipeline: SigningPipeline | None = None

    def put(self, prepared: Prepared, pending: PendingRecord, parent: PendingRecord | None) -> None:
        """Queue a prepared record; ``pending`` learns its outcome.

        Raises:
            LedgerClosedError: the producer closed.
            SignerUnavailableError: the pipeline is closing.
        """
        self._signing_pipeline().put((prepared, pending, parent))

    def _signing_pipeline(self) -> SigningPipeline:
        if self.pipeline is None:
            with self._lock:
                if self._closed():  # close() ran meanwhile: nobody would close a pipeline made now
                    raise LedgerClosedError("this producer is closed")
                if self.pipeline is None:
                    signer = self.signer
                    queued = getattr(signer, "queues_signatures", False)
                    self.pipeline = SigningPipeline(
                        signer.kid[:16],
                        sign=None if queued else (lambda job: signer.sign(job[0].tbs.tbs)),
                        begin=(lambda job: signer.begin_sign(job[0].tbs.tbs)) if queued else None,
                        finish=self._finish,
                        fail=lambda job, exc: job[1].fail(exc),
                    )
        return self.pipeline

    def _finish(self, job: _Job, signature: SignatureResult) -> None:
        prepared, pending, parent = job
        record = sealing.complete(self.signer, prepared, signature, verify=self.verify)
        pending.resolve(record, self.writer.enqueue(record, wake=True, parent=parent))
