"""The platform record per epoch, and wiring evidence into a Producer.

Each epoch opens with an epoch-boundary capsule (``fyi``, ``verdict_class:
epoch_boundary``) that describes the signing key as observed. Its slot gets a
quote over its *own* id: that quote is the platform record of the epoch. The
later capsules of the epoch cite the boundary with ``references[]``
``{type: "agent-action-capsule", digest_alg: "SHA-256", digest: <its id>,
citation_purpose: "ran_under"}`` (``Producer(cite_epoch=True)`` writes that),
and their own slots get batch quotes over Merkle roots.

Why cite the boundary and not the quote: a quote over a capsule's id cannot be
inside that capsule (or any capsule sealed before the quote exists); the
boundary's id is known when the later capsules are sealed, and -05 §5.5.5
``ran_under`` is the registered way to say "this action ran under the
conditions that record attests" — without re-deriving them, and without
upgrading any grade of the citing capsule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .batch import BatchEvidence
from .quoter import Quoter, TPMQuoter

if TYPE_CHECKING:
    from capseal.producer import Producer

__all__ = ["attach", "is_epoch_boundary"]


def is_epoch_boundary(record: Any) -> bool:
    """Whether a record is an epoch-boundary capsule (the record that gets its own quote).

    Args:
        record: a sealed record (anything else is not one).

    Returns:
        True for an ``fyi`` capsule whose disposition's verdict_class is ``epoch_boundary``.
    """
    capsule = getattr(record, "capsule", None)
    if not isinstance(capsule, Mapping):
        return False
    disposition = capsule.get("disposition")
    return (
        capsule.get("action_type") == "fyi"
        and isinstance(disposition, Mapping)
        and disposition.get("verdict_class") == "epoch_boundary"
    )


def attach(
    producer: Producer,
    quoter: Quoter | str,
    *,
    max_records: int = 512,
    max_delay: float = 0.25,
    cite_epoch: bool = True,
    pcrs: str | None = None,
    on_batch: Callable[[list[str], float], None] | None = None,
) -> BatchEvidence:
    """Give ``producer``'s records hardware evidence. Subscribes the batch
    worker as an observer (the seal path only enqueues ids), quotes each
    epoch-boundary capsule over its own id when it lands, batches the rest,
    and — with ``cite_epoch`` — makes later capsules cite the boundary
    (``ran_under``). Close the returned worker before the producer::

        evidence = attach(producer, "tpm2:handle=0x81000102?tcti=…")
        …
        producer.flush(); evidence.close(); producer.close()

    Args:
        producer: the producer whose records get evidence.
        quoter: a quoter or an AK ``tpm2:`` URI.
        max_records: a batch is quoted once this many records wait.
        max_delay: seconds the oldest waiting record may wait before its batch is quoted.
        cite_epoch: make later capsules cite the epoch boundary.
        pcrs: the PCR selection of a quoter made from a URI (default sha256:0-7).
        on_batch: called with each batch's ids and the seconds it took.

    Returns:
        The batch worker.

    Raises:
        EvidenceError: the AK cannot be used (from a URI).
        InputError: a bad option (``max_records``, ``max_delay``, ``pcrs``).
    """
    if isinstance(quoter, str):
        quoter = TPMQuoter(quoter, pcrs=pcrs) if pcrs else TPMQuoter(quoter)
    worker = BatchEvidence(producer.ledger, quoter, max_records=max_records, max_delay=max_delay,
                           solo_if=is_epoch_boundary, on_batch=on_batch)
    if cite_epoch:
        producer.cite_epoch = True
    producer.add_id_observer(worker.observe_id)
    if producer.epoch_opened:
        # the boundary was queued before we attached: quote it once it is durable
        producer.flush()
        boundary = producer.ledger.get(producer.epoch_record.capsule_id)
        if boundary is not None and boundary.hardware_evidence is None:
            worker.observe(boundary)
    return worker
