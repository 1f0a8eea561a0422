"""capseal.aio: awaitable producer calls that never block the event loop,
share the ledger's group commit, raise a refused input from the await with
nothing written, and a PendingRecord whose future asyncio can wait on."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from capseal import Ledger, Producer, verify_ledger
from capseal.aio import AsyncProducer
from capseal.errors import DuplicateRecordError, FloatInDigestError, InputError
from capseal.keys import SignatureResult, SoftwareSigner, UnsafeEphemeralSigner, generate_private_key


class SlowDevice(SoftwareSigner):
    """A real software key whose device takes ``delay`` seconds per signature
    (as a token or a TPM does), on whatever thread calls it."""

    external_device = True  # checked against the key like a token's signature

    def __init__(self, delay: float) -> None:
        super().__init__(generate_private_key("EdDSA"), uri="unsafe-ephemeral:", key_store="memory")
        self.delay = delay
        self.threads: set[str] = set()

    def sign(self, data: bytes) -> SignatureResult:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        return super().sign(data)


def test_lifecycle_calls_awaited_seal_a_verified_ledger(tmp_path: Path) -> None:
    async def main() -> list[str]:
        async with AsyncProducer(Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db")) as p:
            planned = await p.planned("call-1", effect_type="x-tool-call", request={"q": "a"})
            done = await p.confirmed(planned, response={"answer": 42})
            other = await p.planned("call-2", effect_type="x-tool-call")
            failed = await p.failed(await p.dispatched(other, request=None), response={"error": "boom"})
            return [r.capsule["action_id"] for r in (planned, done, other, failed)]

    assert asyncio.run(main()) == ["call-1", "call-1/confirmed", "call-2", "call-2/failed"]
    assert verify_ledger(tmp_path / "l.db").ok


def test_a_refused_input_raises_from_the_await_and_nothing_is_written(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncProducer(Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db")) as p:
            await p.seal({"action_id": "first", "action_type": "fyi"})
            with pytest.raises(FloatInDigestError):
                await p.planned("f-1", request={"amount": 1.5})
            with pytest.raises(InputError):
                await p.seal({"action_id": "bad", "action_type": "fyi", "x-n": 2**60})
            with pytest.raises(DuplicateRecordError):
                await p.seal({"action_id": "first", "action_type": "fyi"})
            await p.flush()

    asyncio.run(main())
    with Ledger(tmp_path / "l.db", readonly=True) as ledger:
        assert ledger.count() == 2  # the epoch boundary and "first"


def test_the_event_loop_keeps_running_while_a_slow_device_signs(tmp_path: Path) -> None:
    """Twelve seals on a device taking 0.2 s each: were the signatures on the
    loop, a 10 ms heartbeat would miss a beat by 0.2 s twelve times. Two
    such beats are let pass: a loaded machine can stall a thread that long."""
    device = SlowDevice(0.2)
    late: list[float] = []

    async def heartbeat(stop: asyncio.Event) -> None:
        while not stop.is_set():
            before = time.monotonic()
            await asyncio.sleep(0.01)
            late.append(time.monotonic() - before - 0.01)

    async def main() -> None:
        stop = asyncio.Event()
        beat = asyncio.create_task(heartbeat(stop))
        async with await AsyncProducer.open("acme", "agent@1", device, tmp_path / "l.db") as p:  # self-test off the loop
            await asyncio.gather(*(p.seal({"action_id": f"s-{i}", "action_type": "fyi"}) for i in range(12)))
        stop.set()
        await beat

    asyncio.run(main())
    assert "MainThread" not in device.threads
    assert len(late) > 12 and sum(beat >= 0.15 for beat in late) <= 2, sorted(late)[-5:]


def test_calls_in_flight_share_the_ledgers_commits(tmp_path: Path) -> None:
    groups: list[int] = []

    async def main() -> None:
        producer = Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db")
        producer.ledger.add_commit_listener(lambda entries: groups.append(len(entries)))
        async with AsyncProducer(producer) as p:
            await asyncio.gather(*(p.seal({"action_id": f"g-{i}", "action_type": "fyi"}) for i in range(60)))

    asyncio.run(main())
    assert sum(groups) == 61 and len(groups) < 61 and max(groups) > 1, groups


def test_a_pending_records_future_is_awaitable(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncProducer(Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db")) as p:
            pending = await p.submit({"action_id": "sub-1", "action_type": "fyi"})
            record = await asyncio.wrap_future(pending.future)
            assert record.capsule_id == pending.capsule_id and record.seq == 2
            again = await p.submit({"action_id": "sub-1", "action_type": "fyi"})  # refused by the ledger
            with pytest.raises(DuplicateRecordError):
                await asyncio.wrap_future(again.future)
            assert again.future is again.future  # one future per record

    asyncio.run(main())


def test_an_async_producer_wraps_only_a_producer(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="wraps a capseal.Producer"):
        AsyncProducer("capsules.db")  # type: ignore[arg-type]
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        with pytest.raises(InputError, match="max_in_flight"):
            AsyncProducer(producer, max_in_flight=0)
