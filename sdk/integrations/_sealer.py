"""Where the recorder's seals run: on the caller's thread, or off the event loop.

The one place the integrations touch the producer. A seal is given as a
*preparation*: a callable returning ``(spec, parent, relation)``, or None
when there is nothing to seal, since a spec's digests (of a tool's arguments
or result, however large) are work too. A synchronous hook prepares and seals
on its own thread (``Producer.seal`` returns once the record is durable); an
asynchronous hook awaits the same work run on a thread pool of the sealer's
own, so digests, device signing and the ledger's fsync never run on the
event loop, and concurrent tool calls wait together for one group commit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from capseal import Producer, SealedRecord

__all__ = ["Sealer", "Sealable", "MAX_THREADS"]

#: a spec to seal, the chain parent (or None) and the relation to it
Sealable = tuple[dict[str, Any], SealedRecord | None, str]

#: threads sealing for one recorder's asynchronous hooks at most (each mostly waits on a commit)
MAX_THREADS = 32


class Sealer:
    """Seals prepared specs with one producer, from synchronous or asynchronous code."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
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
        """:meth:`seal`, awaited: both steps run on the pool, never on the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), partial(self.seal, prepare))

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="capseal-tool-calls")
            return self._pool

    def close(self) -> None:
        """Let the pool's threads go once what they are sealing is done."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
