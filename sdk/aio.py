"""capseal.aio — the producer API for asyncio, never blocking the event loop.

>>> from capseal import Producer
>>> from capseal.aio import AsyncProducer
>>> async with await AsyncProducer.open("acme", "agent@1", signer, "capsules.db") as producer:  # doctest: +SKIP
...     planned = await producer.planned("call-7", effect_type="x-tool-call", request=args)
...     done = await producer.confirmed(planned, response=result)

Every call runs the synchronous producer's call on a thread of the async
producer's own pool, so nothing that waits — a token's or TPM's signature,
the ledger's fsync, a lock another process holds — runs on the event loop.
Many calls in flight at once each wait on their own thread, so the ledger's
group commit writes them together (one fsync for all that are waiting). A
refused input raises from the ``await``, as the synchronous call raises it:
before anything is signed or queued.

:meth:`AsyncProducer.submit` returns a :class:`capseal.PendingRecord`, whose
:attr:`~capseal.PendingRecord.future` is a ``concurrent.futures.Future``:
``await asyncio.wrap_future(pending.future)`` waits for durability.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ._internal.lifecycle import Parent
from .arguments import count
from .errors import InputError
from .producer import PendingRecord, Producer
from .record import SealedRecord

__all__ = ["AsyncProducer"]

T = TypeVar("T")


class AsyncProducer:
    """Awaitable calls over a :class:`capseal.Producer`.

    Args:
        producer: the producer sealed with (its ledger and signer).
        max_in_flight: how many calls may wait at once (threads of the pool);
            more calls queue for a thread, none blocks the event loop.

    Raises:
        InputError: ``producer`` is not a Producer, or ``max_in_flight`` is not a count.
    """

    def __init__(self, producer: Producer, *, max_in_flight: int = 64) -> None:
        if not isinstance(producer, Producer):
            raise InputError(f"AsyncProducer wraps a capseal.Producer, not a {type(producer).__name__}")
        self.producer = producer
        self._pool = ThreadPoolExecutor(count(max_in_flight, "max_in_flight"), thread_name_prefix="capseal-aio")

    @classmethod
    async def open(cls, *args: Any, max_in_flight: int = 64, **kwargs: Any) -> AsyncProducer:
        """Make the :class:`capseal.Producer` (the same arguments) off the
        event loop — its signer self-test and ledger opening wait on the
        device and the file — and wrap it.

        Args:
            args: the :class:`capseal.Producer` arguments.
            max_in_flight: as for :class:`AsyncProducer`.
            kwargs: the :class:`capseal.Producer` keyword arguments.

        Returns:
            The async producer, its producer open.

        Raises:
            InputError, LedgerError, SignerError: as :class:`capseal.Producer`;
                InputError also for a bad ``max_in_flight``.
        """
        loop = asyncio.get_running_loop()
        producer = await loop.run_in_executor(None, functools.partial(Producer, *args, **kwargs))
        return cls(producer, max_in_flight=max_in_flight)

    async def _run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(call, *args, **kwargs))

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ the general seal

    async def seal(self, spec: Mapping[str, Any], *, parent: Parent | None = None,
                   relation: str = "follows") -> SealedRecord:
        """:meth:`capseal.Producer.seal`, awaited.

        Args:
            spec: the capsule's other members.
            parent: adds ``chain: {parent_capsule_id, relation}``.
            relation: the chain relation to ``parent``.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.seal`.
        """
        return await self._run(self.producer.seal, spec, parent=parent, relation=relation)

    async def check(self, spec: Mapping[str, Any], *, parent: Parent | None = None,
                    relation: str = "follows") -> dict[str, Any]:
        """:meth:`capseal.Producer.check`, awaited.

        Args:
            spec: the capsule's other members.
            parent: adds ``chain: {parent_capsule_id, relation}``.
            relation: the chain relation to ``parent``.

        Returns:
            The capsule as it would be sealed now, without its signature.

        Raises:
            InputError, SealAbortedError, DuplicateRecordError, LedgerError:
                as :meth:`capseal.Producer.check`.
        """
        return await self._run(self.producer.check, spec, parent=parent, relation=relation)

    async def submit(self, spec: Mapping[str, Any], *, parent: Parent | None = None,
                     relation: str = "follows") -> PendingRecord:
        """:meth:`capseal.Producer.submit`, awaited: the record once queued
        (a device whose queue is full makes this wait, off the loop).

        Args:
            spec: the capsule's other members.
            parent: adds ``chain: {parent_capsule_id, relation}``.
            relation: the chain relation to ``parent``.

        Returns:
            A :class:`capseal.PendingRecord`.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.submit`.
        """
        return await self._run(self.producer.submit, spec, parent=parent, relation=relation)

    async def flush(self, timeout: float | None = None) -> None:
        """:meth:`capseal.Producer.flush`, awaited.

        Args:
            timeout: seconds to wait at most (None: no limit).

        Raises:
            InputError, LedgerError: as :meth:`capseal.Producer.flush`.
        """
        await self._run(self.producer.flush, timeout)

    async def close(self, timeout: float | None = None) -> None:
        """:meth:`capseal.Producer.close`, awaited; then the pool's threads end
        (also when close raises).

        Args:
            timeout: seconds to wait at most for a token or TPM to sign what is queued.

        Raises:
            InputError, SignerUnavailableError, LedgerError: as
                :meth:`capseal.Producer.close`.
        """
        try:
            await self._run(self.producer.close, timeout)
        finally:
            self._pool.shutdown(wait=False)

    async def rotate_epoch(self, epoch_id: str | None = None) -> SealedRecord:
        """:meth:`capseal.Producer.rotate_epoch`, awaited.

        Args:
            epoch_id: the new epoch's id (default: a new one).

        Returns:
            The new boundary capsule record (not yet in the ledger).

        Raises:
            InputError, SignerError, LedgerError: as
                :meth:`capseal.Producer.rotate_epoch`.
        """
        return await self._run(self.producer.rotate_epoch, epoch_id)

    # ------------------------------------------------------------------ lifecycle calls

    async def planned(self, action_id: str, **kwargs: Any) -> SealedRecord:
        """:meth:`capseal.Producer.planned`, awaited (the same arguments).

        Args:
            action_id: the action's id.
            kwargs: the keyword arguments of :meth:`capseal.Producer.planned`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.planned`.
        """
        return await self._run(self.producer.planned, action_id, **kwargs)

    async def dispatched(self, parent: Parent, **kwargs: Any) -> SealedRecord:
        """:meth:`capseal.Producer.dispatched`, awaited (the same arguments).

        Args:
            parent: the planned record (or its capsule id).
            kwargs: the keyword arguments of :meth:`capseal.Producer.dispatched`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.dispatched`.
        """
        return await self._run(self.producer.dispatched, parent, **kwargs)

    async def confirmed(self, parent: Parent, **kwargs: Any) -> SealedRecord:
        """:meth:`capseal.Producer.confirmed`, awaited (the same arguments).

        Args:
            parent: the dispatched record (or its capsule id).
            kwargs: the keyword arguments of :meth:`capseal.Producer.confirmed`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.confirmed`.
        """
        return await self._run(self.producer.confirmed, parent, **kwargs)

    async def failed(self, parent: Parent, **kwargs: Any) -> SealedRecord:
        """:meth:`capseal.Producer.failed`, awaited (the same arguments).

        Args:
            parent: the dispatched record (or its capsule id).
            kwargs: the keyword arguments of :meth:`capseal.Producer.failed`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.failed`.
        """
        return await self._run(self.producer.failed, parent, **kwargs)

    async def refused(self, parent: Parent | None = None, **kwargs: Any) -> SealedRecord:
        """:meth:`capseal.Producer.refused`, awaited (the same arguments).

        Args:
            parent: the record refused, or None.
            kwargs: the keyword arguments of :meth:`capseal.Producer.refused`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.refused`.
        """
        return await self._run(self.producer.refused, parent, **kwargs)

    async def resolved(self, open_record: Parent, **kwargs: Any) -> SealedRecord:
        """:meth:`capseal.Producer.resolved`, awaited (the same arguments).

        Args:
            open_record: the open record (or its capsule id).
            kwargs: the keyword arguments of :meth:`capseal.Producer.resolved`.

        Returns:
            The sealed record, once durable.

        Raises:
            InputError, SealAbortedError, SignerError, DuplicateRecordError,
                LedgerError: as :meth:`capseal.Producer.resolved`.
        """
        return await self._run(self.producer.resolved, open_record, **kwargs)
