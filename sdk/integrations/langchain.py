"""``capseal[langchain]``: LangChain tool calls sealed as capsules.

Two ways in; use one of them for an agent, not both (each seals every call):

* :class:`CapsealCallbackHandler`, a ``BaseCallbackHandler`` for any
  runnable (``config={"callbacks": [handler]}``): ``on_tool_start`` seals
  the planned capsule; ``on_tool_end`` the confirmed one, or a failed one
  when the output is a ``ToolMessage`` with ``status="error"`` (a tool error
  LangChain handled, ``handle_tool_error``); ``on_tool_error`` a failed one
  (the tool raised). A call is paired by its ``run_id``, and the
  ``tool_call_id`` at the end must be the start's. In an async run LangChain
  runs this (synchronous) handler off the event loop. A call interrupted
  (``interrupt()``, the tool paused for input) or cancelled stays open.
* :class:`CapsealMiddleware`, a LangChain 1.x agent middleware
  (``create_agent(…, middleware=[CapsealMiddleware(producer)])``) whose
  ``wrap_tool_call`` / ``awrap_tool_call`` hold the call from start to end.

Runtime context the handler offers to the allow-list: ``tags``,
``metadata``, ``parent_run_id``; the middleware offers none. Fail-closed
(``fail_closed=True``), a call whose planned capsule cannot be sealed raises
:class:`~capseal.errors.ToolCallBlockedError` before its tool runs (the
handler sets LangChain's ``raise_error`` for that); an agent built with
``create_agent`` then stops with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from uuid import UUID

from capseal import Producer
from capseal.aio import AsyncProducer

from ._extras import require
from .calls import ABSENT, SealFailure
from .recorder import ToolCallRecorder

require("langchain_core", "langchain", __name__)
require("langchain.agents.middleware", "langchain", __name__)

from langchain.agents.middleware import AgentMiddleware  # noqa: E402
from langchain_core.callbacks import BaseCallbackHandler  # noqa: E402
from langchain_core.messages import ToolMessage  # noqa: E402

__all__ = ["CapsealCallbackHandler", "CapsealMiddleware", "FRAMEWORK"]

FRAMEWORK = "langchain"


def _recorder(producer: Producer | AsyncProducer, fail_closed: bool, on_seal_error: Callable[[SealFailure], object] | None,
              context: Mapping[str, str] | None, irreversibility_class: str | None) -> ToolCallRecorder:
    return ToolCallRecorder(producer, framework=FRAMEWORK, fail_closed=fail_closed, on_seal_error=on_seal_error,
                            context=context, irreversibility_class=irreversibility_class)


def _tool_message_in(result: Any, tool_call_id: str | None) -> ToolMessage | None:
    """The ToolMessage a tool's result carries for ``tool_call_id``: the result
    itself, or one in a ``Command``'s ``update["messages"]``."""
    if isinstance(result, ToolMessage):
        return result
    update = getattr(result, "update", None)
    messages = update.get("messages") if isinstance(update, Mapping) else None
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, ToolMessage) and message.tool_call_id == tool_call_id:
            return message
    return None


def _outcome(message: ToolMessage | None) -> tuple[str, Any]:
    """(outcome, response) of a call that returned ``message`` (None: none seen)."""
    if message is None:
        return "unobserved", ABSENT
    return ("error_result" if message.status == "error" else "returned"), message.content


class CapsealCallbackHandler(BaseCallbackHandler):
    """Seals every tool call a LangChain run reports (see the module docstring).

    Args:
        producer: the producer that seals (or a ``capseal.aio.AsyncProducer`` over it).
        fail_closed: stop a call before its tool runs when its planned capsule cannot be sealed.
        on_seal_error: called with each :class:`~capseal.integrations.SealFailure`.
        context: allow-listed runtime context (``tags``, ``metadata``,
            ``parent_run_id``), each ``"clear"`` or ``"digest"``.
        irreversibility_class: written on every capsule.

    Raises:
        InputError: a bad argument.
    """

    def __init__(self, producer: Producer | AsyncProducer, *, fail_closed: bool = False,
                 on_seal_error: Callable[[SealFailure], object] | None = None,
                 context: Mapping[str, str] | None = None, irreversibility_class: str | None = None) -> None:
        super().__init__()
        self.recorder = _recorder(producer, fail_closed, on_seal_error, context, irreversibility_class)
        self.raise_error = fail_closed  # LangChain passes a handler's error on only when this is set

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, tags: list[str] | None = None,
                      metadata: dict[str, Any] | None = None, inputs: dict[str, Any] | None = None,
                      **kwargs: Any) -> None:
        """Seal the planned capsule (LangChain calls this before the tool runs).

        Raises:
            ToolCallBlockedError: fail-closed, and it could not be sealed.
        """
        name = (serialized or {}).get("name") or kwargs.get("name") or "?"
        seen: dict[str, Any] = {"tags": tags, "metadata": metadata}
        if parent_run_id is not None:
            seen["parent_run_id"] = str(parent_run_id)
        self.recorder.start(tool=name, arguments=inputs if inputs is not None else input_str,
                            ids={"run_id": str(run_id), "tool_call_id": kwargs.get("tool_call_id")},
                            context={k: v for k, v in seen.items() if v is not None}, key=run_id)

    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        """Seal the outcome: confirmed, or failed for an error ``ToolMessage``."""
        call = self.recorder.call_for(run_id)
        if call is None:
            return
        expected = call.ids.get("tool_call_id")
        if expected is None:  # no tool call id: LangChain hands back the tool's own output
            self.recorder.finish(call, "returned", output)
            return
        message = _tool_message_in(output, expected)
        if message is not None and message.tool_call_id != expected:
            self.recorder.unpaired(call, f"its end names tool_call_id {message.tool_call_id!r}, its start {expected!r}")
            return
        self.recorder.finish(call, *_outcome(message))

    def on_tool_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None,
                      **kwargs: Any) -> None:
        """Seal a failed capsule: the tool raised (the error itself never
        enters). An interrupt (the tool paused for input) or a cancellation
        is no failure the hook saw: the call stays open."""
        call = self.recorder.call_for(run_id)
        if call is None or isinstance(error, _PAUSES) or not isinstance(error, Exception):
            return
        given = kwargs.get("tool_call_id")
        if given is not None and given != call.ids.get("tool_call_id"):
            self.recorder.unpaired(call, f"its end names tool_call_id {given!r}, its start "
                                         f"{call.ids.get('tool_call_id')!r}")
            return
        self.recorder.finish(call, "raised")


class CapsealMiddleware(AgentMiddleware):  # type: ignore[type-arg]
    """A LangChain 1.x agent middleware sealing every tool call it wraps.

    Args: as :class:`CapsealCallbackHandler` (no runtime context is offered).
    """

    def __init__(self, producer: Producer | AsyncProducer, *, fail_closed: bool = False,
                 on_seal_error: Callable[[SealFailure], object] | None = None,
                 context: Mapping[str, str] | None = None, irreversibility_class: str | None = None) -> None:
        super().__init__()
        self.recorder = _recorder(producer, fail_closed, on_seal_error, context, irreversibility_class)

    @staticmethod
    def _described(request: Any) -> dict[str, Any]:
        tool_call = request.tool_call
        return {"tool": tool_call.get("name", "?"), "arguments": tool_call.get("args", ABSENT),
                "ids": {"tool_call_id": tool_call.get("id")}}

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Seal the planned capsule, run the tool, seal its outcome.

        Raises:
            ToolCallBlockedError: fail-closed, and the planned capsule could not be sealed.
            whatever the tool raised (after its failed capsule).
        """
        call = self.recorder.start(**self._described(request))
        try:
            result = handler(request)
        except _PAUSES:
            raise  # an interrupt: the call is not over, and stays open
        except Exception:
            call.failed(outcome="raised")
            raise
        self.recorder.finish(call, *_outcome(_tool_message_in(result, call.ids.get("tool_call_id"))))
        return result

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """:meth:`wrap_tool_call` for async runs, sealing off the event loop."""
        call = await self.recorder.astart(**self._described(request))
        try:
            result = await handler(request)
        except _PAUSES:
            raise
        except Exception:
            await call.afailed(outcome="raised")
            raise
        await self.recorder.afinish(call, *_outcome(_tool_message_in(result, call.ids.get("tool_call_id"))))
        return result


def _pause_types() -> tuple[type[BaseException], ...]:
    try:
        from langgraph.errors import GraphBubbleUp
    except ImportError:  # pragma: no cover - langchain 1.x brings langgraph
        return ()
    return (GraphBubbleUp,)


_PAUSES = _pause_types()
