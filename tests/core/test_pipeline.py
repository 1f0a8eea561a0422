"""The signing pipeline ``Producer.submit()`` uses for tokens and TPMs: order is
kept, every device signature is still checked, a device fault fails only its
own record and writes nothing, and close()/flush() finish what was queued."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import (
    DeviceError,
    FloatInDigestError,
    LedgerClosedError,
    LedgerError,
    SignatureFailedError,
    SignerUnavailableError,
)
from capseal.keys import PendingSignature, SignatureResult, SoftwareSigner, generate_private_key


class FlakyDevice(SoftwareSigner):
    """A software key presented as an external device, with injectable faults
    (a real key; the faults are what a misbehaving token would do)."""

    external_device = True

    def __init__(self) -> None:
        super().__init__(generate_private_key("EdDSA"), uri="ephemeral:flaky-device", key_store="memory")
        self.fail_on: dict[int, str] = {}
        self.calls = 0
        self.lock = threading.Lock()

    def sign(self, data: bytes) -> SignatureResult:
        with self.lock:
            self.calls += 1
            fault = self.fail_on.get(self.calls)
        result = super().sign(data)
        if fault == "raise":
            raise DeviceError("CKR_DEVICE_ERROR (injected)")
        if fault == "garbage":
            return SignatureResult(bytes(64), result.kid, result.alg)
        return result


class _Queued(PendingSignature):
    """A signature queued on a device worker (a concurrent.futures Future)."""

    def __init__(self, fut: Future[Any]) -> None:
        self.fut = fut

    def result(self) -> Any:
        return self.fut.result()

    def cancel(self) -> None:
        self.fut.cancel()


class QueuedFlakyDevice(FlakyDevice):
    """The same, for a device with its own command queue (as the TPM backend
    is): ``begin_sign`` queues on one worker thread and returns at once."""

    queues_signatures = True

    def __init__(self) -> None:
        super().__init__()
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="device-queue")

    def begin_sign(self, data: bytes) -> PendingSignature:
        return _Queued(self.worker.submit(self.sign, data))

    def close(self) -> None:
        self.worker.shutdown()


def _interrupt_once(owner: Any, name: str) -> threading.Event:
    """The next call of ``owner.name`` is interrupted by a Ctrl-C (and puts
    the real one back); the calls after it run as usual. The event says it
    happened."""
    real, fired = getattr(owner, name), threading.Event()

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        setattr(owner, name, real)
        fired.set()
        raise KeyboardInterrupt

    setattr(owner, name, interrupted)
    return fired


@contextmanager
def _queued_producer(tmp_path: Path) -> Iterator[tuple[QueuedFlakyDevice, Producer, Any]]:
    """A producer on a device with its own command queue, one record
    ("before") already sealed through its pipeline: (device, producer,
    pipeline). Closes both."""
    device = QueuedFlakyDevice()
    try:
        with Producer("acme", "agent@1", device, tmp_path / "l.db") as producer:
            producer.submit({"action_id": "before", "action_type": "fyi"}).result()
            assert producer._pipeline is not None
            yield device, producer, producer._pipeline
    finally:
        device.close()


@pytest.fixture()
def make(request: pytest.FixtureRequest) -> Iterator[Callable[[], FlakyDevice]]:
    """Makes devices of the parametrized class; each is closed after the test."""
    made: list[FlakyDevice] = []

    def new() -> FlakyDevice:
        made.append(request.param())
        return made[-1]

    yield new
    for device in made:
        device.close()


DEVICES = pytest.mark.parametrize("make", [FlakyDevice, QueuedFlakyDevice], ids=["signing-thread", "device-queue"],
                                  indirect=True)


@DEVICES
def test_pipeline_keeps_order_and_checks_every_signature(make: Callable[[], FlakyDevice], tmp_path: Path) -> None:
    device = make()
    with Producer("acme", "agent@1", device, Ledger(tmp_path / "l.db")) as producer:
        first = producer.seal({"action_id": "sync-0", "action_type": "fyi"})  # sync path: epoch + 1 record
        start = device.calls
        device.fail_on = {start + 5: "raise", start + 9: "garbage"}
        pendings = [producer.submit({"action_id": f"p-{i}", "action_type": "fyi"}) for i in range(20)]
        producer.flush()
        outcomes: list[int | str | None] = []
        for p in pendings:
            try:
                outcomes.append(p.result().seq)
            except (DeviceError, SignatureFailedError) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes[4] == "DeviceError" and outcomes[8] == "SignatureFailedError"
        seqs = [o for o in outcomes if isinstance(o, int)]
        assert seqs == sorted(seqs) and len(seqs) == 18  # submit order is ledger order
        assert producer.ledger.count() == 2 + 18  # nothing written for the two failed signatures
        assert first.seq == 2
    report = capseal.verify_ledger(tmp_path / "l.db")
    assert report.ok and len(report.records) == 20


@DEVICES
def test_pipeline_refuses_bad_input_before_queueing(make: Callable[[], FlakyDevice], tmp_path: Path) -> None:
    device = make()
    with Producer("acme", "agent@1", device, tmp_path / "l.db") as producer:
        with pytest.raises(FloatInDigestError):
            producer.submit({"action_id": "f", "action_type": "fyi", "x-v": 0.1})
        calls = device.calls
        producer.flush()
        assert device.calls == calls and producer.ledger.count() == 0  # never reached the device or the ledger


@DEVICES
def test_close_finishes_the_queue(make: Callable[[], FlakyDevice], tmp_path: Path) -> None:
    device = make()
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    pendings = [producer.submit({"action_id": f"c-{i}", "action_type": "fyi"}) for i in range(50)]
    producer.close()
    assert all(p.result().seq is not None for p in pendings)
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.count() == 51


def test_pipeline_with_a_real_token(softhsm, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from capseal.keys.provision import create_key

    signer = create_key(softhsm.uri("pipeline-ed25519"), "EdDSA", pin=softhsm.pin)
    with Producer("acme", "agent@1", signer, tmp_path / "l.db") as producer:
        pendings = [producer.submit({"action_id": f"t-{i}", "action_type": "fyi"}) for i in range(200)]
        producer.flush()
        assert [p.result().seq for p in pendings] == list(range(2, 202))
    signer.close()
    assert capseal.verify_ledger(tmp_path / "l.db").ok


def test_seal_signs_on_the_calling_thread(tmp_path: Path) -> None:
    """seal() and the lifecycle calls sign and commit on the caller's thread;
    only submit() hands a device's signing to the pipeline."""
    device = FlakyDevice()
    with Producer("acme", "agent@1", device, tmp_path / "l.db") as producer:
        producer.seal({"action_id": "s", "action_type": "fyi"})
        producer.planned("p", effect_type="write_order")
        assert producer._pipeline is None
        assert not [t for t in threading.enumerate() if t.name.startswith("capseal-sign")]
        producer.submit({"action_id": "q", "action_type": "fyi"}).result()
        assert producer._pipeline is not None


def test_a_device_queue_needs_no_signing_thread(tmp_path: Path) -> None:
    """With ``queues_signatures`` the caller's thread queues each signature on
    the device and only the finishing thread waits for them; a signature that
    cannot even be queued fails its own record, in order, and writes nothing."""
    device = QueuedFlakyDevice()
    real_begin = device.begin_sign
    refuse = {3}
    count = 0

    def begin(data: bytes) -> PendingSignature:
        nonlocal count
        count += 1
        if count in refuse:
            raise DeviceError("device queue full (injected)")
        return real_begin(data)

    with Producer("acme", "agent@1", device, tmp_path / "l.db") as producer:
        device.begin_sign = begin  # type: ignore[method-assign]  # the submitted records' signatures only
        pendings = [producer.submit({"action_id": f"q-{i}", "action_type": "fyi"}) for i in range(6)]
        producer.flush()
        assert not [t for t in threading.enumerate() if t.name.startswith("capseal-sign")]
        assert [t.name for t in threading.enumerate() if t.name.startswith("capseal-finish")]
        with pytest.raises(DeviceError, match="injected"):
            pendings[2].result()
        seqs = [seq for i, p in enumerate(pendings) if i != 2 and (seq := p.result().seq) is not None]
        assert seqs == sorted(seqs) and len(seqs) == 5
        assert producer.ledger.count() == 1 + 5  # the epoch boundary and the five that were signed
    device.close()
    assert capseal.verify_ledger(tmp_path / "l.db").ok


def test_close_during_a_put_loses_nothing(tmp_path: Path) -> None:
    """close() while another thread's submit() is still handing its job to the
    device: the job goes in before the pipeline stops, and is sealed."""
    device = QueuedFlakyDevice()
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    try:
        producer.submit({"action_id": "first", "action_type": "fyi"}).result()
        pipeline = producer._pipeline
        assert pipeline is not None
        entered = threading.Event()
        real_begin = device.begin_sign

        def begin_until_closing(data: bytes) -> PendingSignature:
            entered.set()
            deadline = threading.Event()
            for _ in range(500):  # until close() has begun (a liveness guard of 5 s, not a timing)
                if pipeline._closed:
                    break
                deadline.wait(0.01)
            return real_begin(data)

        device.begin_sign = begin_until_closing  # type: ignore[method-assign]
        submitted: list[Any] = []
        caller = threading.Thread(target=lambda: submitted.append(producer.submit({"action_id": "late", "action_type": "fyi"})))
        caller.start()
        assert entered.wait(5)
        producer.close()  # while the put is under way
        caller.join()
        assert submitted[0].result(timeout=5).seq == 3  # the epoch boundary, "first", then this one
        with Ledger(tmp_path / "l.db") as ledger:
            assert ledger.count() == 3
    finally:
        producer.close()
        device.close()


def test_an_interrupt_while_queueing_is_the_callers(tmp_path: Path) -> None:
    """A KeyboardInterrupt while submit() hands the job to the device reaches
    the caller (it is not turned into a failed record), nothing is written,
    and flush() does not wait for a job that never was."""
    with _queued_producer(tmp_path) as (device, producer, pipeline):
        _interrupt_once(device, "begin_sign")
        with pytest.raises(KeyboardInterrupt):
            producer.submit({"action_id": "interrupted", "action_type": "fyi"})
        producer.flush(timeout=5)
        assert pipeline.drain(timeout=5)
        assert producer.submit({"action_id": "after", "action_type": "fyi"}).result(timeout=5).seq == 3
        assert producer.ledger.count() == 3


class _InterruptAfterPut:
    """The pipeline's finishing queue (the same object the finishing thread
    reads), with a KeyboardInterrupt arriving just after an item went in
    (CPython delivers a pending SIGINT right as a call returns)."""

    def __init__(self, inner: queue.SimpleQueue[Any]) -> None:
        self.inner, self.armed = inner, True
        self.get, self.get_nowait = inner.get, inner.get_nowait

    def put(self, item: Any) -> None:
        self.inner.put(item)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


def test_an_interrupt_just_after_queueing_withdraws_the_job_once(tmp_path: Path) -> None:
    """The job reached the queue, then the interrupt came: the caller gets
    KeyboardInterrupt, the job is withdrawn, and it is accounted for exactly
    once, so flush() neither hangs nor returns early."""
    with _queued_producer(tmp_path) as (_device, producer, pipeline):
        pipeline._to_finish = _InterruptAfterPut(pipeline._to_finish)
        with pytest.raises(KeyboardInterrupt):
            producer.submit({"action_id": "withdrawn", "action_type": "fyi"})
        assert pipeline.drain(timeout=5) and pipeline.outstanding == 0
        later = producer.submit({"action_id": "after", "action_type": "fyi"})
        assert pipeline.drain(timeout=5) and pipeline.outstanding == 0
        later.result(timeout=5)
    with Ledger(tmp_path / "l.db") as ledger:
        sealed = [e.action_id for e in ledger.entries()][1:]
    # withdrawn, as a rule; sealed only if the finishing thread took the job
    # in the instant before the interrupt was handled (the GIL decides) —
    # either way it was accounted for once, which the drains above show
    assert sealed in (["before", "after"], ["before", "withdrawn", "after"])


def test_a_put_that_outlasts_close_is_failed_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close() waits only so long (here 0.2 s instead of 30 s) for a put under
    way; a job that reaches the queue after the pipeline has stopped is
    failed with a typed error, never left unresolved, and nothing is written."""
    import capseal._internal.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "_CLOSE_WAIT", 0.2)
    device = QueuedFlakyDevice()
    release = threading.Event()
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    try:
        producer.submit({"action_id": "first", "action_type": "fyi"}).result()
        real_begin = device.begin_sign

        def begin_after_release(data: bytes) -> PendingSignature:
            assert release.wait(5)
            return real_begin(data)

        device.begin_sign = begin_after_release  # type: ignore[method-assign]
        submitted: list[Any] = []
        caller = threading.Thread(target=lambda: submitted.append(producer.submit({"action_id": "late", "action_type": "fyi"})))
        pipeline = producer._pipeline
        assert pipeline is not None
        caller.start()
        assert _until(lambda: pipeline._putting == 1)  # the put is under way (else close() may come first)
        producer.close()  # gives up on the put after 0.2 s and stops
        release.set()
        caller.join()
        with pytest.raises(LedgerClosedError, match="closed before this record was signed"):
            submitted[0].result(timeout=5)
        with Ledger(tmp_path / "l.db") as ledger:
            assert ledger.count() == 2  # the epoch boundary and "first"
    finally:
        release.set()
        device.close()


def test_a_fail_callback_that_raises_does_not_stop_the_pipeline() -> None:
    from capseal._internal.pipeline import SigningPipeline

    finished: list[int] = []

    def sign(job: int) -> int:
        if job % 2:
            raise DeviceError("odd jobs fail (injected)")
        return job

    def fail(job: int, exc: BaseException) -> None:
        raise RuntimeError("the callback itself breaks")

    pipeline = SigningPipeline("t", sign, lambda job, sig: finished.append(sig), fail)
    for job in range(10):
        pipeline.put(job)
    assert pipeline.drain(timeout=5)
    pipeline.close()
    assert finished == [0, 2, 4, 6, 8]


def test_flush_with_a_timeout_says_when_records_are_not_yet_signed(tmp_path: Path) -> None:
    """flush(timeout) on a slow device raises LedgerError instead of
    returning as if the records were durable; they are still written."""
    device = QueuedFlakyDevice()
    real_sign = device.sign
    go = threading.Event()

    def slow_sign(data: bytes) -> SignatureResult:
        go.wait(5)
        return real_sign(data)

    try:
        with Producer("acme", "agent@1", device, tmp_path / "l.db") as producer:
            producer.submit({"action_id": "first", "action_type": "fyi"}).result()
            device.sign = slow_sign  # type: ignore[method-assign]
            pendings = [producer.submit({"action_id": f"slow-{i}", "action_type": "fyi"}) for i in range(5)]
            with pytest.raises(LedgerError, match="not signed within 0.2 s"):
                producer.flush(timeout=0.2)
            go.set()
            producer.flush(timeout=10)
            assert [p.result(timeout=5).seq for p in pendings] == [3, 4, 5, 6, 7]
    finally:
        go.set()
        device.close()


def _blocked_pipeline(depth: int) -> tuple[Any, threading.Event, list[int]]:
    """A pipeline whose device signs nothing until ``go`` is set."""
    from capseal._internal.pipeline import SigningPipeline

    go = threading.Event()
    finished: list[int] = []

    def sign(job: int) -> int:
        assert go.wait(10)
        return job

    def fail(job: int, exc: BaseException) -> None:
        raise AssertionError(f"job {job} failed: {exc!r}")

    return SigningPipeline("t", sign, lambda job, sig: finished.append(sig), fail, depth=depth), go, finished


def _until(condition: Callable[[], bool]) -> bool:
    """Poll ``condition`` for up to 5 s (a liveness guard, not a timing)."""
    pause = threading.Event()
    for _ in range(500):
        if condition():
            return True
        pause.wait(0.01)
    return False


def test_a_full_pipeline_makes_callers_wait_and_loses_nothing() -> None:
    """With ``depth`` jobs under way the next put waits (a slow device pushes
    back on its callers instead of growing memory); once the device moves
    again it goes in, and every job finishes, in order."""
    pipeline, go, finished = _blocked_pipeline(depth=4)
    try:
        for job in range(4):
            pipeline.put(job)
        late = threading.Thread(target=pipeline.put, args=(4,))
        late.start()
        assert _until(lambda: pipeline._waiting_for_room == 1)
        assert pipeline.outstanding == 4  # the fifth is not in
        go.set()
        late.join(5)
        assert not late.is_alive()
        assert pipeline.drain(timeout=5)
        assert finished == [0, 1, 2, 3, 4]
    finally:
        go.set()
        pipeline.close()


def test_close_tells_a_caller_waiting_for_room_and_finishes_the_rest() -> None:
    pipeline, go, finished = _blocked_pipeline(depth=2)
    errors: list[BaseException] = []

    def put_late() -> None:
        try:
            pipeline.put(2)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    try:
        pipeline.put(0)
        pipeline.put(1)
        late = threading.Thread(target=put_late)
        late.start()
        assert _until(lambda: pipeline._waiting_for_room == 1)
        closing = threading.Thread(target=pipeline.close)
        closing.start()
        late.join(5)
        assert not late.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], LedgerClosedError)
        go.set()  # close() finishes what was put
        closing.join(10)
        assert not closing.is_alive()
        assert finished == [0, 1]
        assert pipeline.outstanding == 0
    finally:
        go.set()
        pipeline.close()


def test_many_callers_waiting_for_room_all_get_in() -> None:
    """Each finished job wakes one waiting caller (not all of them, every
    record): with six callers waiting on a pipeline of depth 2, every one
    of them gets in and every job finishes."""
    pipeline, go, finished = _blocked_pipeline(depth=2)
    try:
        pipeline.put(0)
        pipeline.put(1)
        callers = [threading.Thread(target=pipeline.put, args=(job,)) for job in range(2, 8)]
        for caller in callers:
            caller.start()
        assert _until(lambda: pipeline._waiting_for_room == 6)
        go.set()
        for caller in callers:
            caller.join(5)
            assert not caller.is_alive()
        assert pipeline.drain(timeout=5)
        assert sorted(finished) == list(range(8)) and finished[:2] == [0, 1]
        assert pipeline._waiting_for_room == 0 and pipeline.outstanding == 0
    finally:
        go.set()
        pipeline.close()


@pytest.mark.parametrize("make", [FlakyDevice, QueuedFlakyDevice], indirect=True, ids=["signing-thread", "device-queue"])
def test_close_with_a_timeout_gives_up_on_a_hung_device(make: Callable[[], FlakyDevice], tmp_path: Path) -> None:
    """A device call that never returns (PKCS#11 cannot cancel one) must not
    hold close() for ever: with a timeout, the records not yet signed fail
    with SignerUnavailableError — the one on the device too, whether a
    signing thread or the finishing thread waits for it — nothing is written
    for them, the ledger is closed, close() says how many; the threads end
    once the device answers."""
    device = make()
    real_sign = device.sign
    answer, on_device = threading.Event(), threading.Event()

    def hung_sign(data: bytes) -> SignatureResult:
        on_device.set()
        answer.wait(30)
        return real_sign(data)

    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    try:
        producer.submit({"action_id": "first", "action_type": "fyi"}).result()
        pipeline = producer._pipeline
        assert pipeline is not None
        device.sign = hung_sign  # type: ignore[method-assign]
        pendings = [producer.submit({"action_id": f"hung-{i}", "action_type": "fyi"}) for i in range(5)]
        assert on_device.wait(5)  # the first of them is on the device
        with pytest.raises(SignerUnavailableError, match=r": 5 submitted record\(s\) not signed 0.3 s into close\(\): not written$"):
            producer.close(timeout=0.3)
        for pending in pendings:
            with pytest.raises(SignerUnavailableError, match="gave up on the device 0.3 s in.*not written"):
                pending.result(timeout=5)
        assert pipeline.outstanding == 0
        with Ledger(tmp_path / "l.db") as ledger:
            assert ledger.count() == 2  # the epoch boundary and "first"
        answer.set()  # the device answers at last: the threads end, and still nothing is written
        for t in pipeline._threads:
            t.join(5)
            assert not t.is_alive()
        with Ledger(tmp_path / "l.db") as ledger:
            assert ledger.count() == 2
        producer.close(timeout=0.3)  # idempotent
    finally:
        answer.set()


def test_close_with_a_timeout_on_a_working_device_writes_everything(tmp_path: Path) -> None:
    device = FlakyDevice()
    with Producer("acme", "agent@1", device, tmp_path / "l.db") as producer:
        pendings = [producer.submit({"action_id": f"ok-{i}", "action_type": "fyi"}) for i in range(50)]
        producer.close(timeout=30)
    assert [p.result(timeout=5).seq for p in pendings] == list(range(2, 52))


def test_close_counts_exactly_when_the_device_answers_as_it_gives_up() -> None:
    """The device answers while close() is failing the jobs it gave up on:
    the threads find them claimed and leave them alone, so each job fails
    once, none is finished late, and the count close() returns is exact."""
    pipeline, go, finished = _blocked_pipeline(depth=8)
    failed: list[tuple[int, str]] = []

    def fail(job: int, exc: BaseException) -> None:
        failed.append((job, type(exc).__name__))
        if job == 0:  # the device answers now, and the signing thread runs through its queue
            go.set()
            assert _until(lambda: pipeline._to_sign.qsize() == 0)

    pipeline._fail = fail
    for job in range(3):
        pipeline.put(job)
    assert pipeline.close(timeout=0.3) == (3, 0)
    for t in pipeline._threads:
        t.join(5)
        assert not t.is_alive()
    assert failed == [(0, "SignerUnavailableError"), (1, "SignerUnavailableError"), (2, "SignerUnavailableError")]
    assert finished == [] and pipeline.outstanding == 0


def _waiting_in(thread: threading.Thread, function: str, module: str = "producer.py") -> bool:
    """True while ``thread`` runs (here: blocks on a lock) in ``module``'s ``function`` itself."""
    frame = sys._current_frames().get(thread.ident or -1)
    return frame is not None and frame.f_code.co_name == function and frame.f_code.co_filename.endswith(module)


def test_close_racing_the_first_submit_leaves_no_pipeline_running(tmp_path: Path) -> None:
    """The first submit() makes the pipeline; a close() at that moment used
    to miss it, leaving its threads running for ever. Now one goes first:
    either the submit is refused, or its record is sealed and the pipeline
    closed."""
    device = FlakyDevice()
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    outcome: list[Any] = []

    def submit() -> None:
        try:
            outcome.append(producer.submit({"action_id": "racing", "action_type": "fyi"}))
        except LedgerClosedError as exc:
            outcome.append(exc)

    with producer._epoch_lock:  # the submit stops just before it makes the pipeline
        caller = threading.Thread(target=submit)
        caller.start()
        assert _until(lambda: _waiting_in(caller, "_signing_pipeline", "device.py"))
        closer = threading.Thread(target=producer.close)
        closer.start()
        assert _until(lambda: _waiting_in(closer, "run", "pipeline.py"))  # CloseOnce.run, at the producer's lock
    caller.join(5)
    closer.join(5)
    assert not caller.is_alive() and not closer.is_alive()
    pipeline = producer._pipeline
    if isinstance(outcome[0], LedgerClosedError):
        assert pipeline is None
        expected = 0  # nothing: the epoch boundary is written only with the epoch's first record
    else:
        assert outcome[0].result(timeout=5).seq == 2
        expected = 2
    if pipeline is not None:
        for t in pipeline._threads:
            t.join(5)
            assert not t.is_alive()
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.count() == expected


def _finish_held(producer: Producer) -> tuple[Any, threading.Event, threading.Event]:
    """The producer's pipeline, with its finishing step held at ``release``
    (``entered`` set once a job is in it): a job already past the device."""
    pipeline = producer._pipeline
    assert pipeline is not None
    real_finish, entered, release = pipeline._finish, threading.Event(), threading.Event()

    def held_finish(job: Any, signature: Any) -> None:
        entered.set()
        assert release.wait(10)
        real_finish(job, signature)

    pipeline._finish = held_finish
    return pipeline, entered, release


def test_close_giving_up_on_the_device_lets_a_job_past_it_finish(tmp_path: Path) -> None:
    """A record already signed and being checked when close(timeout) gives
    up is not the device's to lose: close() lets it finish, it is written,
    and close() does not count it (it used to go unwritten and uncounted)."""
    device = FlakyDevice()
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    producer.submit({"action_id": "first", "action_type": "fyi"}).result()
    pipeline, entered, release = _finish_held(producer)
    pending = producer.submit({"action_id": "past-the-device", "action_type": "fyi"})
    assert entered.wait(5)
    errors: list[BaseException] = []

    def close() -> None:
        try:
            producer.close(timeout=0.2)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)

    closer = threading.Thread(target=close)
    closer.start()
    assert _until(lambda: pipeline._stopped)  # close() has given up on the device...
    release.set()  # ...and the job past it finishes
    closer.join(10)
    assert not closer.is_alive() and errors == []
    assert pending.result(timeout=5).seq == 3
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.count() == 3


def test_close_counts_a_job_past_the_device_that_does_not_finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import capseal._internal.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "_FINISHING_WAIT", 0.2)
    device = FlakyDevice()
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    producer.submit({"action_id": "first", "action_type": "fyi"}).result()
    _pipeline, entered, release = _finish_held(producer)
    try:
        pending = producer.submit({"action_id": "stuck-in-finishing", "action_type": "fyi"})
        assert entered.wait(5)
        with pytest.raises(SignerUnavailableError,
                           match=r"0 submitted record\(s\) .*; 1 signed record\(s\) still on their way to the ledger: "
                                 "they may still be written"):
            producer.close(timeout=0.2)
    finally:
        release.set()
    with pytest.raises(LedgerClosedError):
        pending.result(timeout=5)
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.count() == 2


def test_close_giving_up_drops_commands_still_queued_on_the_device(tmp_path: Path) -> None:
    """A device with its own queue (as a TPM): the commands close(timeout)
    gave up on are taken off the queue, so the device does not sign them for
    nothing once it answers; only the one it was running completes."""
    device = QueuedFlakyDevice()
    real_sign = device.sign
    answer, on_device = threading.Event(), threading.Event()
    signed_after_close: list[bytes] = []

    def hung_sign(data: bytes) -> SignatureResult:
        on_device.set()
        answer.wait(30)
        signed_after_close.append(data)
        return real_sign(data)

    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    try:
        producer.submit({"action_id": "first", "action_type": "fyi"}).result()
        device.sign = hung_sign  # type: ignore[method-assign]
        pendings = [producer.submit({"action_id": f"hung-{i}", "action_type": "fyi"}) for i in range(5)]
        assert on_device.wait(5)
        with pytest.raises(SignerUnavailableError, match=r": 5 submitted record\(s\) not signed"):
            producer.close(timeout=0.3)
        answer.set()
        device.worker.shutdown(wait=True)
        assert len(signed_after_close) == 1  # the command that was running; the other four were dropped
        for pending in pendings:
            with pytest.raises(SignerUnavailableError):
                pending.result(timeout=5)
    finally:
        answer.set()
        device.close()


def test_a_put_still_handing_over_when_close_gives_up_drops_its_command() -> None:
    """A put still inside begin() when close(timeout) gives up: its job is
    failed with the rest, and the command begin() queued is taken off the
    device's queue once begin() returns, so the device never signs it."""
    from capseal._internal.pipeline import SigningPipeline

    device = ThreadPoolExecutor(max_workers=1)
    hung, in_begin, release_begin = threading.Event(), threading.Event(), threading.Event()
    futures: list[Future[int]] = []
    ran: list[int] = []

    def device_sign(job: int) -> int:
        if job == 0:
            assert hung.wait(10)
        ran.append(job)
        return job

    def begin(job: int) -> _Queued:
        futures.append(device.submit(device_sign, job))
        if job == 1:
            in_begin.set()
            assert release_begin.wait(10)
        return _Queued(futures[-1])

    failed: list[int] = []
    pipeline = SigningPipeline("t", None, lambda job, sig: None, lambda job, exc: failed.append(job), begin=begin)
    try:
        pipeline.put(0)  # on the device, hung
        putter = threading.Thread(target=pipeline.put, args=(1,))
        putter.start()
        assert in_begin.wait(5)
        assert pipeline.close(timeout=0.2) == (2, 0)  # its wait for the put is bounded by the deadline too
        release_begin.set()
        putter.join(5)
        assert not putter.is_alive()
    finally:
        release_begin.set()
        hung.set()
        device.shutdown(wait=True)
    assert failed == [0, 1] and futures[1].cancelled() and ran == [0]


def test_close_reports_a_record_past_the_device_that_a_shared_ledger_may_still_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a ledger the producer does not own, a record still finishing when
    close(timeout) stops waiting for it is written afterwards: close() says
    it may be, not that it was lost."""
    import capseal._internal.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "_FINISHING_WAIT", 0.2)
    with Ledger(tmp_path / "l.db") as ledger:
        producer = Producer("acme", "agent@1", FlakyDevice(), ledger)
        producer.submit({"action_id": "first", "action_type": "fyi"}).result()
        _pipeline, entered, release = _finish_held(producer)
        try:
            pending = producer.submit({"action_id": "slow-to-finish", "action_type": "fyi"})
            assert entered.wait(5)
            with pytest.raises(SignerUnavailableError, match="0 submitted record.*1 signed record.*may still be written"):
                producer.close(timeout=0.2)
        finally:
            release.set()
        assert pending.result(timeout=5).seq == 3
        assert [e.action_id for e in ledger.entries()][1:] == ["first", "slow-to-finish"]


def test_drain_waits_for_what_was_put_before_it_not_for_an_empty_pipeline() -> None:
    """Another thread keeps the pipeline busy for good; drain() (so flush())
    still returns once the jobs put before it are done (it used to wait for
    an empty pipeline, which never came)."""
    from capseal._internal.pipeline import SigningPipeline

    stop = threading.Event()
    highest_put = [-1]
    finished: list[int] = []

    def sign(job: int) -> int:  # the device answers job j only once job j+1 is under way
        while not stop.is_set() and highest_put[0] <= job:
            stop.wait(0.001)
        return job

    pipeline = SigningPipeline("t", sign, lambda job, sig: finished.append(sig), lambda job, exc: None, depth=4)

    def feed() -> None:
        job = 0
        while not stop.is_set():
            pipeline.put(job)
            highest_put[0] = job
            job += 1

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        assert _until(lambda: len(finished) >= 3)
        mark = pipeline._seq
        assert pipeline.drain(timeout=10)
        assert set(range(mark)) <= set(finished)  # every job put before the drain is done
    finally:
        stop.set()
        feeder.join(5)
        pipeline.close()


def test_close_counts_a_put_that_lands_while_it_gives_up() -> None:
    """A put whose hand-over ends just as close(timeout) gives up on the
    device is counted with the rest (it used to sweep the queue itself,
    failing jobs with LedgerClosedError that close() never counted)."""
    from capseal._internal.pipeline import SigningPipeline

    device = ThreadPoolExecutor(max_workers=1)
    hung, in_begin, release_begin = threading.Event(), threading.Event(), threading.Event()
    failed: list[tuple[int, str]] = []

    def device_sign(job: int) -> int:
        if job == 0:
            assert hung.wait(10)
        return job

    def begin(job: int) -> _Queued:
        fut = device.submit(device_sign, job)
        if job == 3:
            in_begin.set()
            assert release_begin.wait(10)
        return _Queued(fut)

    pipeline = SigningPipeline("t", None, lambda job, sig: None, lambda job, exc: failed.append((job, type(exc).__name__)),
                               begin=begin)
    real_abandon = pipeline._abandon
    putter = threading.Thread(target=pipeline.put, args=(3,))

    def abandon_after_the_put(timeout: float | None) -> Any:
        release_begin.set()  # the put's hand-over ends between the wait and the claim
        putter.join(5)
        return real_abandon(timeout)

    pipeline._abandon = abandon_after_the_put  # type: ignore[method-assign]
    try:
        for job in range(3):
            pipeline.put(job)  # 0 hangs on the device; 1 and 2 wait behind it
        putter.start()
        assert in_begin.wait(5)
        assert pipeline.close(timeout=0.2) == (4, 0)
        assert sorted(failed) == [(j, "SignerUnavailableError") for j in range(4)]
    finally:
        release_begin.set()
        hung.set()
        device.shutdown(wait=True)


def test_seal_after_submit_on_one_thread_keeps_the_order(tmp_path: Path) -> None:
    """With a device, seal() after submit() on the same thread goes behind
    the submitted record (it used to sign on the caller's thread and reach
    the ledger first: a child written before its parent)."""
    device = FlakyDevice()
    real_sign, release = device.sign, threading.Event()

    def slow_sign(data: bytes) -> SignatureResult:
        assert release.wait(10)
        return real_sign(data)

    with Producer("acme", "agent@1", device, tmp_path / "l.db") as producer:
        producer.submit({"action_id": "warm", "action_type": "fyi"}).result()
        device.sign = slow_sign  # type: ignore[method-assign]
        parent = producer.submit({"action_id": "parent", "action_type": "fyi"})
        threading.Timer(0.2, release.set).start()  # the device answers after seal() has begun
        child = producer.seal({"action_id": "child", "action_type": "fyi"}, parent=parent.capsule_id)
        assert parent.result(timeout=5).seq == 3 and child.seq == 4
    with Ledger(tmp_path / "l.db") as ledger:
        assert [e.action_id for e in ledger.entries()][1:] == ["warm", "parent", "child"]


@pytest.mark.parametrize("where", ["_unregister", "_retire"], ids=["as-the-clean-up-starts", "inside-the-clean-up"])
def test_a_second_interrupt_in_puts_clean_up_leaves_nothing_half_done(tmp_path: Path, where: str) -> None:
    """Two Ctrl-Cs: the first while submit() hands the job over, the second
    as put() cleans up after it — at the clean-up's entry, or inside it as it
    retires the withdrawn job (nothing else retires a job then). The retry
    finishes the bookkeeping, once: the caller gets the interrupt, no place
    in the pipeline is lost, and flush() does not wait for the withdrawn job."""
    with _queued_producer(tmp_path) as (device, producer, pipeline):
        second = _interrupt_once(pipeline, where)  # what a signal at the call's entry does
        _interrupt_once(device, "begin_sign")
        with pytest.raises(KeyboardInterrupt):
            producer.submit({"action_id": "interrupted", "action_type": "fyi"})
        assert second.is_set()
        assert pipeline._putting == 0 and pipeline.outstanding == 0
        producer.flush(timeout=5)
        assert producer.submit({"action_id": "after", "action_type": "fyi"}).result(timeout=5).seq == 3


def test_close_with_a_timeout_counts_a_put_it_stopped_waiting_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """close(timeout) waits only so long for a put still handing its job over
    (here 0.2 s for 30 s); the device is fine and the threads end in time,
    yet that record cannot be finished: it is given up and counted, not
    failed behind close()'s back."""
    import capseal._internal.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "_CLOSE_WAIT", 0.2)
    device, release, got = QueuedFlakyDevice(), threading.Event(), []
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    try:
        producer.submit({"action_id": "first", "action_type": "fyi"}).result()
        pipeline = producer._pipeline
        assert pipeline is not None
        real_begin = device.begin_sign

        def begin_after_release(data: bytes) -> PendingSignature:
            assert release.wait(10)
            return real_begin(data)

        device.begin_sign = begin_after_release  # type: ignore[method-assign]
        caller = threading.Thread(target=lambda: got.append(producer.submit({"action_id": "late", "action_type": "fyi"})))
        caller.start()
        assert _until(lambda: pipeline._putting == 1)
        with pytest.raises(SignerUnavailableError, match=r": 1 submitted record\(s\) not signed"):
            producer.close(timeout=10)
        release.set()
        caller.join(5)
        with pytest.raises(SignerUnavailableError, match="gave up"):
            got[0].result(timeout=5)
    finally:
        release.set()
        device.close()


def test_a_second_close_returns_when_the_first_has_finished() -> None:
    """close() from two threads: the second does not return early, as if
    everything were done, while the first still waits for the device."""
    pipeline, go, finished = _blocked_pipeline(depth=4)
    pipeline.put(0)
    first = threading.Thread(target=pipeline.close)
    first.start()
    try:
        assert _until(lambda: pipeline._closed)
        assert pipeline.close(timeout=0.2) == (0, 1)  # not done yet: one job still on its way
        go.set()
        assert pipeline.close(timeout=5) == (0, 0)  # the first close's own outcome
        assert finished == [0]
    finally:
        go.set()
        first.join(5)


def test_close_giving_up_lets_records_the_device_already_signed_finish() -> None:
    """With a signing thread, a signature already made but still waiting for
    the finishing thread is past the device: close(timeout) lets it finish
    instead of failing it as unsigned."""
    from capseal._internal.pipeline import SigningPipeline

    signed: list[int] = []
    finished: list[int] = []
    failed: list[int] = []
    hold = threading.Event()

    def finish(job: int, signature: int) -> None:
        if job == 0:
            assert hold.wait(10)  # the finishing thread is slow on job 0
        finished.append(job)

    def sign(job: int) -> int:
        signed.append(job)
        return job

    pipeline = SigningPipeline("t", sign, finish, lambda job, exc: failed.append(job))
    pipeline.put(0)
    pipeline.put(1)
    assert _until(lambda: signed == [0, 1])  # the device answered both
    threading.Timer(0.5, hold.set).start()  # after close() has given up waiting
    assert pipeline.close(timeout=0.2) == (0, 0)
    assert finished == [0, 1] and failed == []


def test_a_drain_is_woken_when_its_jobs_are_done_not_at_every_job() -> None:
    """flush() after a burst waits on the pipeline; each finished job used to
    wake it (a GIL hand-off per record while the device worked). Now it is
    woken once the jobs before its mark are done."""
    pipeline, go, finished = _blocked_pipeline(depth=64)
    wakes = [0]
    real_notify_all = pipeline._lock.notify_all

    def counted_notify_all() -> None:
        wakes[0] += 1
        real_notify_all()

    try:
        for job in range(50):
            pipeline.put(job)
        pipeline._lock.notify_all = counted_notify_all
        drained: list[bool] = []
        drainer = threading.Thread(target=lambda: drained.append(pipeline.drain(timeout=10)))
        drainer.start()
        assert _until(lambda: bool(pipeline._drain_marks))
        go.set()
        drainer.join(10)
        assert drained == [True] and len(finished) == 50
        assert wakes[0] == 1
    finally:
        go.set()
        pipeline.close()


def test_giving_up_never_lets_the_stop_overtake_a_signed_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """close(timeout) gives up just as the signing thread hands over a job it
    has signed (left to the finishing thread): the finishing thread's stop
    comes behind that job, through the signing thread, so the job finishes
    (a stop put straight into the queue could overtake it, and it waited for
    ever)."""
    import capseal._internal.pipeline as pipeline_module
    from capseal._internal.pipeline import SigningPipeline

    monkeypatch.setattr(pipeline_module, "_FINISHING_WAIT", 5.0)
    done: list[tuple[str, int]] = []
    pipeline = SigningPipeline("t", lambda job: job, lambda job, sig: done.append(("ok", job)),
                               lambda job, exc: done.append(("fail", job)))
    inner, handing, gave_up = pipeline._to_finish, threading.Event(), threading.Event()

    class HandOverAfterGivingUp:  # the signing thread is preempted between marking the job signed and its put
        get, get_nowait = inner.get, inner.get_nowait

        def put(self, item: Any) -> None:
            if item is not pipeline_module._STOP and not handing.is_set():
                handing.set()
                assert gave_up.wait(5)
            inner.put(item)

    pipeline._to_finish = HandOverAfterGivingUp()  # type: ignore[assignment]
    real_abandon = pipeline._abandon

    def abandon(timeout: float | None) -> Any:
        threading.Timer(0.2, gave_up.set).start()  # the hand-over resumes while close() waits for it
        return real_abandon(timeout)

    pipeline._abandon = abandon  # type: ignore[method-assign]
    pipeline.put(0)
    assert handing.wait(5)
    assert pipeline.close(timeout=0.2) == (0, 0)
    assert done == [("ok", 0)] and pipeline.outstanding == 0


def test_a_close_interrupted_by_ctrl_c_is_done_by_the_next_close() -> None:
    pipeline, go, finished = _blocked_pipeline(depth=4)
    pipeline.put(0)
    _interrupt_once(pipeline._threads[0], "join")
    with pytest.raises(KeyboardInterrupt):
        pipeline.close()
    assert not pipeline._closing.done.is_set()  # not reported as done
    go.set()
    assert pipeline.close(timeout=5) == (0, 0)  # this one finishes the job
    assert finished == [0] and pipeline.outstanding == 0 and pipeline._closing.done.is_set()


def test_a_producer_close_interrupted_by_ctrl_c_is_done_by_the_next_close(tmp_path: Path) -> None:
    device = FlakyDevice()
    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    pending = producer.submit({"action_id": "a", "action_type": "fyi"})
    assert producer._pipeline is not None
    _interrupt_once(producer._pipeline, "close")
    with pytest.raises(KeyboardInterrupt):
        producer.close()
    assert not producer.ledger.closed
    producer.close(timeout=5)  # does it all
    assert producer.ledger.closed and pending.result(timeout=5).seq == 2


def test_a_second_producer_close_with_a_timeout_says_the_first_is_still_going(tmp_path: Path) -> None:
    device, go = FlakyDevice(), threading.Event()
    real_sign = device.sign

    def slow_sign(data: bytes) -> SignatureResult:
        assert go.wait(10)
        return real_sign(data)

    producer = Producer("acme", "agent@1", device, tmp_path / "l.db")
    producer.submit({"action_id": "a", "action_type": "fyi"}).result()
    device.sign = slow_sign  # type: ignore[method-assign]
    pending = producer.submit({"action_id": "b", "action_type": "fyi"})
    first = threading.Thread(target=producer.close)
    first.start()
    try:
        assert _until(lambda: producer._closing._running)
        with pytest.raises(LedgerError, match="close\\(\\) still under way in another thread after 0.3 s"):
            producer.close(timeout=0.3)
        assert not producer.ledger.closed
    finally:
        go.set()
        first.join(10)
    assert producer.ledger.closed and pending.result(timeout=5).seq == 3
    producer.close(timeout=0.3)  # after the first has finished: nothing to do, nothing raised


def _hung_device_pipeline(fail_hook: Callable[[int], None] | None = None) -> tuple[Any, threading.Event, list[int]]:
    """A pipeline whose device hangs until ``go``; its fail callback records
    each failed job (then calls ``fail_hook``)."""
    from capseal._internal.pipeline import SigningPipeline

    go, failed = threading.Event(), []

    def sign(job: int) -> int:
        assert go.wait(10)
        return job

    def fail(job: int, exc: BaseException) -> None:
        failed.append(job)
        if fail_hook is not None:
            fail_hook(job)

    return SigningPipeline("t", sign, lambda job, sig: None, fail, depth=8), go, failed


def test_a_close_interrupted_while_it_waits_after_giving_up_keeps_its_count() -> None:
    pipeline, go, failed = _hung_device_pipeline()
    pipeline.put(0)
    pipeline.put(1)
    _interrupt_once(pipeline, "_wait_done_before")
    try:
        with pytest.raises(KeyboardInterrupt):
            pipeline.close(timeout=0.2)
        assert sorted(failed) == [0, 1]
        assert pipeline.close(timeout=0.2) == (2, 0)  # the close that takes over reports both
    finally:
        go.set()


def test_a_close_interrupted_while_failing_what_it_gave_up_fails_the_rest_on_takeover(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import capseal._internal.pipeline as pipeline_module

    monkeypatch.setattr(pipeline_module, "_FINISHING_WAIT", 0.3)
    interrupted: list[int] = []

    def hook(job: int) -> None:
        if not interrupted:
            interrupted.append(job)
            raise KeyboardInterrupt  # a Ctrl-C inside the fail callback of the first job given up

    pipeline, go, failed = _hung_device_pipeline(hook)
    try:
        for job in range(3):
            pipeline.put(job)
        with pytest.raises(KeyboardInterrupt):
            pipeline.close(timeout=0.2)
        assert pipeline.close(timeout=0.2) == (3, 0)
        assert sorted(set(failed)) == [0, 1, 2] and pipeline.outstanding == 0
    finally:
        go.set()
    for t in pipeline._threads:
        t.join(5)
        assert not t.is_alive()
