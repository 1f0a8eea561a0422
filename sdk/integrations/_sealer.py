"""Where the recorder's seals run: on the caller's thread, or off the event loop.

The one place the integrations touch the producer. A seal is given as a
*preparation*: a callable returning ``(spec, parent, relation)``, or None
when there is nothing to seal, since a spec's digests (of a tool's arguments
or result, however large) are work too. A synchronous hook prepares and seals
on its own thread (``Producer.seal`` returns once the record is durable). An
asynchronous hook prepares on a small thread pool of the sealer's own and
seals through :class:`capseal.aio.AsyncProducer` (the one given, or one made
over the producer), so digests, device signing and the ledger's fsync never
run on the event loop, and concurrent tool calls wait together for one group
commit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from capseal import Producer, SealedRecord
from capseal.aio import AsyncProducer
from capseal.errors import InputError

__all__ = ["Sealer", "Sealable", "PREPARING_THREADS"]

#: a spec to seal, the chain parent (or None) and the relation to it
Sealable = tuple[dict[str, Any], SealedRecord | None, str]

#: threads making asynchronous hooks' specs (digests: CPU work, so a few)
PREPARING_THREADS = 4


class Sealer:
    """Seals prepared specs with one producer, from synchronous or asynchronous code.

    Args:
        producer: a :class:`capseal.Producer`, or a :class:`capseal.aio.AsyncProducer`
            (whose pool the asynchronous seals then share).

    Raises:
        InputError: neither.
    """

    def __init__(self, producer: Producer | AsyncProducer) -> None:
        self._aio: AsyncProducer | None = None
        if isinstance(producer, AsyncProducer):
            self.producer, self._aio = producer.producer, producer
        elif isinstance(producer, Producer):
            self.producer = producer
        else:
            raise InputError(f"producer is a capseal.Producer or capseal.aio.AsyncProducer; got "
                             f"{type(producer).__name__}")
        self._own_aio = self._aio is None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def seal(self, prepare: Callable[[], Sealable | None]) -> SealedRecord | None:
        """Prepare and seal on this thread; the record once durable, or None
        when ``prepare`` found nothing to seal.

        Raises:
            what preparing or sealing raised (InputError, SignerError, LedgerError …).
        """
        prepared = prepare()
        if prepared is None:
            return None
        spec, parent, relation = prepared
        if parent is None:
            return self.producer.seal(spec)
        return self.producer.seal(spec, parent=parent, relation=relation)

    async def aseal(self, prepare: Callable[[], Sealable | None]) -> SealedRecord | None:
        """:meth:`seal`, awaited: prepared on the sealer's pool, sealed through
        the AsyncProducer, neither on the event loop."""
        pool, aio = self._executors()
        prepared = await asyncio.get_running_loop().run_in_executor(pool, prepare)
        if prepared is None:
            return None
        spec, parent, relation = prepared
        return await aio.seal(spec, parent=parent, relation=relation)

    def _executors(self) -> tuple[ThreadPoolExecutor, AsyncProducer]:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=PREPARING_THREADS, thread_name_prefix="capseal-tool-calls")
            if self._aio is None:
                self._aio = AsyncProducer(self.producer)
            return self._pool, self._aio

    def close(self) -> None:
        """Let the pool's threads go once what they are preparing is done. The
        producer, and an AsyncProducer given, stay open; one made here is let
        go of (its idle threads end with it: closing it would close the
        producer)."""
        with self._lock:
            pool, self._pool = self._pool, None
            if self._own_aio:
                self._aio = None
        if pool is not None:
            pool.shutdown(wait=True)
