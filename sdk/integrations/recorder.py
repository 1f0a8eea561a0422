"""``ToolCallRecorder``: tool calls into capsules, for any agent framework.

An adapter tells the recorder when a call starts (before the tool runs) and
how it ended. The recorder seals the planned capsule at the start, waiting
until it is durable, and the outcome capsule at the end, chained to it (see
:mod:`capseal.integrations.capsules`).

Pairing. A call's end is matched to its start by the framework's own ids,
never by order: a hook holding the :class:`~capseal.integrations.ToolCall`
handle between the two (a middleware, a decorator) finishes it directly;
callback hooks pass the same ``key`` (the ids that name the call: a run id,
a call id, a step) at both ends. A key reused while its first call is still
open makes both unpairable: their ends are refused (reported as
:class:`~capseal.errors.ToolCallPairingError`) and they stay open. A call
whose outcome never came stays open too, listed by :meth:`open_calls`, and
never closed by a guess.

Never breaking the agent. A seal that fails is logged and reported to
``on_seal_error``; the tool call goes on. With ``fail_closed=True`` a call
whose planned capsule cannot be sealed is stopped before the tool runs
(:class:`~capseal.errors.ToolCallBlockedError`). In neither mode is an
outcome sealed without its planned capsule, or a capsule sealed that says
more than the hook saw.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Hashable, Mapping
from functools import partial
from typing import Any

from capseal import Producer, SealedRecord
from capseal.aio import AsyncProducer
from capseal.errors import InputError, ToolCallBlockedError, ToolCallPairingError

from ._sealer import Sealable, Sealer
from .calls import ABSENT, OpenCall, SealFailure, ToolCall
from .capsules import OUTCOMES, allowed_context, context_members, outcome_spec, planned_spec
from .values import digest_of, exact_json

__all__ = ["ToolCallRecorder"]

log = logging.getLogger("capseal.integrations")

_OPEN_STATES = {"open": "awaiting_outcome", "closing": "awaiting_outcome", "outcome_not_sealed": "outcome_not_sealed",
                "outcome_unobserved": "outcome_unobserved", "unpaired": "unpaired"}


class ToolCallRecorder:
    """Seals each tool call an adapter reports (see the module docstring).

    Args:
        producer: the :class:`capseal.Producer` that seals, or a
            :class:`capseal.aio.AsyncProducer` over it for the asynchronous
            hooks to share (the recorder never closes either).
        framework: the framework's name, written in every capsule (``langchain`` …).
        fail_closed: stop a call before its tool runs when its planned capsule
            cannot be sealed (default: record what can be, and let it run).
        on_seal_error: called with a :class:`SealFailure` for each thing not
            recorded, from the hook's thread or the sealing pool's (keep it
            quick); its own errors are logged and ignored.
        context: the runtime-context fields allowed into the capsules, each
            ``"clear"`` or ``"digest"`` (default: none enters).
        irreversibility_class: written on every capsule of every call, when given.

    Raises:
        InputError: a bad argument, named.
    """

    def __init__(self, producer: Producer | AsyncProducer, *, framework: str, fail_closed: bool = False,
                 on_seal_error: Callable[[SealFailure], object] | None = None,
                 context: Mapping[str, str] | None = None, irreversibility_class: str | None = None) -> None:
        if not isinstance(framework, str) or not framework or "/" in framework:
            raise InputError(f"framework is a non-empty name without '/'; got {framework!r}")
        if on_seal_error is not None and not callable(on_seal_error):
            raise InputError("on_seal_error is a callable taking a SealFailure")
        if irreversibility_class is not None and not isinstance(irreversibility_class, str):
            raise InputError(f"irreversibility_class is a string; got {type(irreversibility_class).__name__}")
        self._sealer = Sealer(producer)  # refuses anything but a Producer or an AsyncProducer
        self.producer = self._sealer.producer
        self.framework = framework
        self.fail_closed = bool(fail_closed)
        self.on_seal_error = on_seal_error
        self.context = allowed_context(context)
        self.irreversibility_class = irreversibility_class
        self._tag = os.urandom(6).hex()  # action ids unique across recorders and restarts
        self._sequence = itertools.count(1)
        self._lock = threading.Lock()
        self._by_key: dict[Hashable, list[ToolCall]] = {}
        self._open: dict[int, ToolCall] = {}

    # ------------------------------------------------------------------ starting

    def start(self, *, tool: str, arguments: Any = ABSENT, ids: Mapping[str, Any] | None = None,
              context: Mapping[str, Any] | None = None, key: Hashable | None = None) -> ToolCall:
        """A call is about to run: seal its planned capsule (durable on return).

        Args:
            tool: the tool's name.
            arguments: what the tool will run with (digested only; the digest
                goes into the outcome capsule); :data:`ABSENT` if unseen.
            ids: the ids the framework gave the call (written in clear).
            context: the runtime context the hook saw (only allow-listed fields enter).
            key: pair the end by this key (:meth:`finish_key`), else by the handle.

        Returns:
            The call (``planned`` is None when its capsule could not be sealed).

        Raises:
            ToolCallBlockedError: fail-closed, and the planned capsule could not be sealed.
        """
        call = self._begin(tool, ids, key)
        try:
            record = self._sealer.seal(partial(self._planned, call, arguments, context))
        except Exception as exc:  # noqa: BLE001 - never break the agent: reported instead
            self._planned_failed(call, exc)
        else:
            self._opened(call, record)
        return call

    async def astart(self, *, tool: str, arguments: Any = ABSENT, ids: Mapping[str, Any] | None = None,
                     context: Mapping[str, Any] | None = None, key: Hashable | None = None) -> ToolCall:
        """:meth:`start`, with the digests and the seal off the event loop (same
        arguments, returns and raises)."""
        call = self._begin(tool, ids, key)
        try:
            record = await self._sealer.aseal(partial(self._planned, call, arguments, context))
        except Exception as exc:  # noqa: BLE001
            self._planned_failed(call, exc)
        else:
            self._opened(call, record)
        return call

    def _begin(self, tool: Any, ids: Mapping[str, Any] | None, key: Hashable | None) -> ToolCall:
        name = tool if isinstance(tool, str) and tool else str(tool)
        clear_ids = _ids(ids)
        with self._lock:
            sequence = next(self._sequence)
        call = ToolCall(self, tool=name, ids=clear_ids, sequence=sequence,
                        action_id=f"{self.framework}/{self._tag}/{sequence}")
        if key is not None:
            self._index(key, call)
        return call

    def _planned(self, call: ToolCall, arguments: Any, context: Mapping[str, Any] | None) -> Sealable:
        """The planned capsule's spec, and what the outcome will carry (the
        arguments' digest): made where the seal runs, off the event loop."""
        if arguments is ABSENT:
            call.request_digest, call.absent_request = None, {"request_digest": "not_seen"}
        else:
            call.request_digest, reason = digest_of(arguments)
            call.absent_request = {} if reason is None else {"request_digest": reason}
        described: dict[str, Any] = {"framework": self.framework, "tool": call.tool}
        if call.ids:
            described["ids"] = call.ids
        described["sequence"] = call.sequence
        described.update(context_members(context or {}, self.context))
        call.described = described
        return planned_spec(call.action_id, described, self.irreversibility_class), None, "follows"

    def _index(self, key: Hashable, call: ToolCall) -> None:
        with self._lock:
            calls = self._by_key.setdefault(key, [])
            calls.append(call)
            if len(calls) > 1:  # the same ids for two calls at once: neither end can be paired
                for other in calls:
                    other.ambiguous = True
                    if other.state == "open":
                        other.state = "unpaired"

    def _opened(self, call: ToolCall, record: SealedRecord | None) -> None:
        assert record is not None  # a planned capsule always has a spec to seal
        with self._lock:
            call.planned = record
            call.state = "unpaired" if call.ambiguous else "open"
            self._open[call.sequence] = call

    def _planned_failed(self, call: ToolCall, exc: Exception) -> None:
        with self._lock:
            call.state = "unrecorded"
        blocked = self.fail_closed
        self._report("planned", call, exc, blocked=blocked)
        if blocked:
            self._drop_key_of(call)
            raise ToolCallBlockedError(f"tool call {call.tool!r} was stopped before it ran: its planned capsule "
                                       f"could not be sealed ({type(exc).__name__}: {exc})") from exc

    # ------------------------------------------------------------------ finishing

    def finish(self, call: ToolCall, outcome: str, response: Any = ABSENT) -> SealedRecord | None:
        """Seal how ``call`` ended (the handle's methods call this).

        Args:
            call: the call, from :meth:`start`.
            outcome: one of ``returned``, ``error_result``, ``raised``, ``retry``, ``unobserved``.
            response: the result or failure response (digested only); :data:`ABSENT` if unseen.

        Returns:
            The outcome record, or None when nothing was sealed (reported).

        Raises:
            InputError: an unknown outcome.
        """
        _outcome(outcome)
        try:
            record = self._sealer.seal(partial(self._prepare_finish, call, outcome, response))
        except Exception as exc:  # noqa: BLE001
            self._finish_failed(call, exc)
            return None
        return None if record is None else self._closed(call, record)

    async def afinish(self, call: ToolCall, outcome: str, response: Any = ABSENT) -> SealedRecord | None:
        """:meth:`finish`, with the digests and the seal off the event loop."""
        _outcome(outcome)
        try:
            record = await self._sealer.aseal(partial(self._prepare_finish, call, outcome, response))
        except Exception as exc:  # noqa: BLE001
            self._finish_failed(call, exc)
            return None
        return None if record is None else self._closed(call, record)

    def _prepare_finish(self, call: ToolCall, outcome: str, response: Any) -> Sealable | None:
        """The outcome capsule's spec, or None when there is none to seal
        (reported): made where the seal runs, off the event loop."""
        with self._lock:
            state = call.state
            if state in ("open", "outcome_not_sealed") and call.planned is not None:
                call.state = "closing"
        if state == "unrecorded":
            return None  # its planned capsule was not sealed (reported then): no outcome without it
        if state not in ("open", "outcome_not_sealed") or call.planned is None:
            self._report("pairing", call, ToolCallPairingError(
                f"an end of tool call {call.tool!r} #{call.sequence} came while it was {state}: not sealed"))
            return None
        absent = dict(call.absent_request)
        response_digest = None
        if outcome != "unobserved":
            if response is ABSENT:
                absent["response_digest"] = "not_seen"
            else:
                response_digest, reason = digest_of(response)
                if reason is not None:
                    absent["response_digest"] = reason
        spec, relation = outcome_spec(call.action_id, call.described, self.irreversibility_class, outcome,
                                      request_digest=call.request_digest, response_digest=response_digest,
                                      absent=absent)
        return spec, call.planned, relation

    def _closed(self, call: ToolCall, record: SealedRecord) -> SealedRecord:
        dispatched = record.capsule.get("effect", {}).get("status") == "dispatched"
        with self._lock:
            call.outcome = record
            if dispatched:
                call.state = "outcome_unobserved"
            else:
                call.state = "closed"
                self._open.pop(call.sequence, None)
        return record

    def _finish_failed(self, call: ToolCall, exc: Exception) -> None:
        with self._lock:
            call.state = "outcome_not_sealed"
        self._report("outcome", call, exc)

    # ------------------------------------------------------------------ keyed ends

    def call_for(self, key: Hashable) -> ToolCall | None:
        """The one call started with ``key`` and not yet ended by it; each end
        is paired once, so it leaves the key's index.

        Args:
            key: the key the call was started with.

        Returns:
            The call, or None: no call was started with ``key``, or more than
            one still open was (reported as a ToolCallPairingError, never guessed).
        """
        with self._lock:
            calls = self._by_key.get(key)
            if not calls:
                found: ToolCall | None = None
                problem = "no start was seen for it"
            elif len(calls) == 1 and not calls[0].ambiguous:
                found, problem = calls.pop(), ""
            else:
                calls.pop()  # one of the ends expected for this key came; which call's cannot be told
                found, problem = None, "another call still open had the same ids"
            if calls is not None and not calls:
                del self._by_key[key]
        if found is None:
            self._report("pairing", None, ToolCallPairingError(f"a tool call's end could not be paired: {problem}; "
                                                               "nothing was sealed for it"), key=key)
        return found

    def has_key(self, key: Hashable) -> bool:
        """Whether a call started with ``key`` still waits for its end.

        Args:
            key: the key a call may have been started with.

        Returns:
            True while its end has not been paired.
        """
        with self._lock:
            return bool(self._by_key.get(key))

    def finish_key(self, key: Hashable, outcome: str, response: Any = ABSENT) -> SealedRecord | None:
        """:meth:`finish` for the call started with ``key``.

        Args:
            key: the key the call was started with (see :meth:`call_for`).
            outcome: as for :meth:`finish`.
            response: as for :meth:`finish`.

        Returns:
            The outcome record, or None when nothing was sealed (reported).

        Raises:
            InputError: an unknown outcome.
        """
        call = self.call_for(key)
        return None if call is None else self.finish(call, outcome, response)

    async def afinish_key(self, key: Hashable, outcome: str, response: Any = ABSENT) -> SealedRecord | None:
        """:meth:`afinish` for the call started with ``key`` (see :meth:`call_for`)."""
        call = self.call_for(key)
        return None if call is None else await self.afinish(call, outcome, response)

    def unpaired(self, call: ToolCall, reason: str) -> None:
        """An end that names ``call`` but does not match it (its ids differ
        from the start's): nothing is sealed, ``call`` stays open, and the
        mismatch is reported.

        Args:
            call: the call the end was matched to.
            reason: what did not match.
        """
        with self._lock:
            if call.state == "open":
                call.state = "unpaired"
        self._report("pairing", call, ToolCallPairingError(f"an end of tool call {call.tool!r} #{call.sequence} "
                                                           f"could not be paired: {reason}; nothing was sealed"))

    def _drop_key_of(self, call: ToolCall) -> None:
        with self._lock:
            for key, calls in list(self._by_key.items()):
                if call in calls:
                    calls.remove(call)
                    if not calls:
                        del self._by_key[key]

    # ------------------------------------------------------------------ reporting

    def open_calls(self) -> list[OpenCall]:
        """The calls whose planned capsule is in the ledger and whose outcome is
        not: still awaited, sealed as unobserved, unpaired, or failed to seal.
        ``capseal verify`` reports the same calls as open items.

        Returns:
            :class:`OpenCall` entries, oldest first (``reason``: a key of ``OPEN_REASONS``).
        """
        with self._lock:
            calls = sorted(self._open.values(), key=lambda c: c.sequence)
            return [OpenCall(c.tool, c.ids, c.sequence, c.action_id, c.planned.capsule_id,
                             _OPEN_STATES.get(c.state, "awaiting_outcome"))
                    for c in calls if c.planned is not None]

    def _report(self, stage: str, call: ToolCall | None, error: Exception, *, blocked: bool = False,
                key: Hashable | None = None) -> None:
        tool = call.tool if call is not None else "?"
        ids = call.ids if call is not None else {}
        what = f"tool call {tool!r} #{call.sequence}" if call is not None else "a tool call"
        said = {"planned": "its planned capsule was not sealed, nothing of it is recorded",
                "outcome": "its outcome was not sealed, its planned capsule stays open",
                "pairing": "an end was not paired"}[stage]
        log.warning("capseal: %s: %s%s: %s: %s", what, said, " (stopped before it ran)" if blocked else "",
                    type(error).__name__, error)
        if self.on_seal_error is None:
            return
        try:
            self.on_seal_error(SealFailure(stage, tool, ids, error, blocked))
        except Exception as exc:  # noqa: BLE001 - the callback never breaks the agent
            log.warning("capseal: on_seal_error raised %s: %s", type(exc).__name__, exc)

    def close(self) -> None:
        """Release the threads that seal for asynchronous hooks (the producer stays open)."""
        self._sealer.close()


def _outcome(outcome: str) -> None:
    if outcome not in OUTCOMES:
        raise InputError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")


def _ids(ids: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ids a framework gave a call, as clear JSON; an id it did not give is left out."""
    if ids is None:
        return {}
    if not isinstance(ids, Mapping):
        raise InputError(f"ids is a mapping of id names to values; got {type(ids).__name__}")
    out: dict[str, Any] = {}
    for name, value in ids.items():
        if value is None or value is ABSENT:
            continue
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            value = str(value)  # a UUID, say
        out[str(name)] = exact_json(value)
    return out
