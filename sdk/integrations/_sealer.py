"""Where the recorder's seals run: on the caller's thread, or off the event loop.

The one place the integrations touch the producer. A synchronous hook seals
on its own thread (``Producer.seal`` returns once the record is durable); an
asynchronous hook awaits the same call run on a small thread pool of its own,
so device signing and the ledger's fsync never run on the event loop, and
concurrent tool calls wait together for one group commit.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from capseal import Producer, SealedRecord

__all__ = ["Sealer"]

#: threads sealing for one recorder's asynchronous hooks at most (each waits on a commit, not the CPU)
MAX_THREADS = 32


class Sealer:
    """Seals specs with one producer, from synchronous or asynchronous code."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def seal(self, spec: dict[str, Any], parent: SealedRecord | None, relation: str) -> SealedRecord:
        """Seal ``spec`` (chained to ``parent`` with ``relation`` when given) on this thread."""
        if parent is None:
            return self.producer.seal(spec)
        return self.producer.seal(spec, parent=parent, relation=relation)

    async def aseal(self, spec: dict[str, Any], parent: SealedRecord | None, relation: str) -> SealedRecord:
        """As :meth:`seal`, awaited: the seal runs on the pool, never on the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor(), partial(self.seal, spec, parent, relation))

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
