"""Running a test scenario in a process made with ``os.fork()``.

The scenario runs under SIGALRM with the default action (pytest-timeout
installs a handler of its own, which would not end the process), so a hang
kills the forked process instead of the suite; it reports through a pipe as
JSON and leaves with ``os._exit``, never returning into pytest."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from capseal.errors import EvidenceError, ForkedProcessError, LedgerError, SignerUnavailableError


def describe(exc: BaseException) -> dict[str, Any]:
    """An exception as the parent sees it: its type, message and families."""
    return {"type": type(exc).__name__, "message": str(exc), "forked": isinstance(exc, ForkedProcessError),
            "ledger_error": isinstance(exc, LedgerError), "unavailable": isinstance(exc, SignerUnavailableError),
            "evidence_error": isinstance(exc, EvidenceError)}


def attempt(call: Callable[[], Any]) -> dict[str, Any] | str:
    """What ``call()`` did: the error it raised (:func:`describe`), or "returned"."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        return describe(exc)
    return "returned"


class ForkedChild:
    """A forked process running one scenario."""

    def __init__(self, scenario: Callable[[], Any], alarm: int = 20) -> None:
        read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the fork: never returns into pytest
            try:
                os.close(read)
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.alarm(alarm)
                try:
                    report: Any = {"value": scenario()}
                except BaseException as exc:  # noqa: BLE001 - reported to the parent
                    report = {"error": describe(exc)}
                os.write(write, json.dumps(report).encode())
            finally:
                os._exit(0)
        os.close(write)
        self._read = read

    def outcome(self) -> tuple[int, Any]:
        """Its exit code (-SIGALRM: it hung) and its report (None if it wrote none)."""
        chunks = []
        while chunk := os.read(self._read, 65536):
            chunks.append(chunk)
        os.close(self._read)
        _, status = os.waitpid(self.pid, 0)
        data = b"".join(chunks)
        return os.waitstatus_to_exitcode(status), json.loads(data) if data else None

    def result(self) -> Any:
        """What the scenario returned; fails the test if it hung or raised."""
        code, report = self.outcome()
        assert code != -signal.SIGALRM, "the fork hung (killed by its alarm)"
        assert code == 0 and report is not None, f"the fork ended with {code}"
        assert "error" not in report, f"the fork's scenario raised {report['error']}"
        return report["value"]


def in_child(scenario: Callable[[], Any], alarm: int = 20) -> Any:
    return ForkedChild(scenario, alarm).result()


@contextmanager
def held_elsewhere(lock: Any) -> Iterator[None]:
    """``lock`` held by another thread for the duration, as a call or a
    transaction that does not return would hold it."""
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            inside.set()
            leave.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(5)
    try:
        yield
    finally:
        leave.set()
        holder.join()
