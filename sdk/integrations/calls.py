"""One tool call as a recorder holds it, and what the recorder reports about calls.

A :class:`ToolCall` is made by :meth:`ToolCallRecorder.start`; its outcome is
sealed by :meth:`ToolCall.confirmed`, :meth:`ToolCall.failed` or
:meth:`ToolCall.unobserved` (or their awaitable forms), once: a second outcome
for the same call is refused (reported, nothing sealed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from capseal import SealedRecord

__all__ = ["ABSENT", "ToolCall", "OpenCall", "SealFailure", "OPEN_REASONS"]


class _Absent:
    """What a hook did not see (never the same as a None it saw)."""

    def __repr__(self) -> str:
        return "<absent>"


#: passed for arguments or a response the hook could not see: recorded as absent, never guessed
ABSENT: Any = _Absent()

#: why a call is listed by :meth:`ToolCallRecorder.open_calls`
OPEN_REASONS = {
    "awaiting_outcome": "its planned capsule is sealed and no outcome has been reported",
    "outcome_not_sealed": "its outcome was reported, but sealing it failed",
    "outcome_unobserved": "it ended, but the hook could not see how (sealed as dispatched)",
    "unpaired": "another call still open had the same ids, so its end could not be paired",
}


@dataclass(frozen=True)
class OpenCall:
    """A call whose planned capsule is in the ledger without an outcome capsule
    that says how it ended."""

    tool: str
    ids: Mapping[str, Any]
    sequence: int
    action_id: str
    capsule_id: str
    reason: str  # a key of OPEN_REASONS


@dataclass(frozen=True)
class SealFailure:
    """Something of a tool call that was not recorded, as told to ``on_seal_error``.

    ``stage`` is ``planned`` (nothing of the call is recorded; ``blocked``
    says whether the tool was stopped), ``outcome`` (the planned capsule
    stays open) or ``pairing`` (an end that could not be paired with one
    start). ``error`` is the exception.
    """

    stage: str
    tool: str
    ids: Mapping[str, Any]
    error: Exception
    blocked: bool = False


class _Recorder(Protocol):
    """What a call needs of the recorder that made it (``ToolCallRecorder``)."""

    def finish(self, call: ToolCall, outcome: str, response: Any = ...) -> SealedRecord | None: ...

    async def afinish(self, call: ToolCall, outcome: str, response: Any = ...) -> SealedRecord | None: ...


class ToolCall:
    """One tool call: its planned capsule (None until sealed, or when sealing
    it failed) and its outcome capsule."""

    def __init__(self, recorder: _Recorder, *, tool: str, ids: Mapping[str, Any], sequence: int,
                 action_id: str) -> None:
        self._recorder = recorder
        self.tool = tool
        self.ids = ids
        self.sequence = sequence
        self.action_id = action_id
        #: the x-tool-call-v1 members every capsule of the call carries (set with the planned capsule)
        self.described: Mapping[str, Any] = {}
        #: the arguments' digest (None: absent, ``absent_request`` says why)
        self.request_digest: str | None = None
        self.absent_request: Mapping[str, str] = {}
        self.planned: SealedRecord | None = None
        self.outcome: SealedRecord | None = None
        #: started with a key another open call had too: its end cannot be paired
        self.ambiguous = False
        #: starting | open | unrecorded | closing | closed | outcome_not_sealed | outcome_unobserved | unpaired
        self.state = "starting"

    def __repr__(self) -> str:
        return f"<ToolCall {self.tool!r} #{self.sequence} {self.state}>"

    def confirmed(self, response: Any) -> SealedRecord | None:
        """The tool returned ``response``: seal the confirmed capsule.

        Args:
            response: what the tool returned (digested only; a value with no
                exact JSON form makes the outcome ``dispatched``: no
                confirmation without the response's digest).

        Returns:
            The outcome record, or None when nothing was sealed (reported, never raised).
        """
        return self._recorder.finish(self, "returned", response)

    def failed(self, response: Any = ABSENT, *, outcome: str = "raised") -> SealedRecord | None:
        """The call failed: seal the failed capsule.

        Args:
            response: the failure response the framework handed back, if any
                (digested only); :data:`ABSENT` when there was none to see.
            outcome: ``raised``, ``error_result`` or ``retry``.

        Returns:
            The outcome record, or None when nothing was sealed (reported).

        Raises:
            InputError: an unknown outcome.
        """
        return self._recorder.finish(self, outcome, response)

    def unobserved(self) -> SealedRecord | None:
        """The call ended and the hook cannot tell how: seal it ``dispatched``
        (it stays an open item).

        Returns:
            The outcome record, or None when nothing was sealed (reported).
        """
        return self._recorder.finish(self, "unobserved", ABSENT)

    async def aconfirmed(self, response: Any) -> SealedRecord | None:
        """:meth:`confirmed`, with the digest and the seal off the event loop."""
        return await self._recorder.afinish(self, "returned", response)

    async def afailed(self, response: Any = ABSENT, *, outcome: str = "raised") -> SealedRecord | None:
        """:meth:`failed`, with the digest and the seal off the event loop."""
        return await self._recorder.afinish(self, outcome, response)

    async def aunobserved(self) -> SealedRecord | None:
        """:meth:`unobserved`, with the seal off the event loop."""
        return await self._recorder.afinish(self, "unobserved", ABSENT)
