"""``capseal[openai-agents]``: OpenAI Agents SDK tool calls sealed as capsules.

:class:`CapsealRunHooks` is a ``RunHooks`` (``Runner.run(agent, …,
hooks=hooks)``): ``on_tool_start`` seals the planned capsule before a tool
runs, ``on_tool_end`` its outcome. A call is paired by its
``ToolContext.tool_call_id`` and the ``ToolContext`` the SDK hands both hooks.

The hooks alone see a tool that raised as a normal end (the SDK turns the
error into a message for the model), so failures are seen through the tool's
``failure_error_function``: make function tools with
:meth:`CapsealRunHooks.function_tool` (``agents.function_tool``'s arguments),
which installs the hooks' failure function around the one given (the SDK's
default one if none). For a tool made otherwise the hooks cannot tell a
failure from a result: its end is sealed ``dispatched`` (it ran; its outcome
is not recorded), never confirmed.

Runtime context offered to the allow-list: ``agent_name``,
``tool_namespace``. Fail-closed, ``on_tool_start`` raises
:class:`~capseal.errors.ToolCallBlockedError` before the tool runs, and the
run stops (the SDK raises its ``UserError`` from it). Hooks are awaited on the event loop; every seal runs off it.
"""

from __future__ import annotations

import inspect
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from capseal import Producer
from capseal.aio import AsyncProducer

from ._extras import require
from .calls import ABSENT, SealFailure
from .recorder import ToolCallRecorder

require("agents", "openai-agents", __name__)

from agents import RunHooks, default_tool_error_function  # noqa: E402
from agents import function_tool as _function_tool  # noqa: E402
from agents.tool_context import ToolContext  # noqa: E402

__all__ = ["CapsealRunHooks", "FRAMEWORK"]

FRAMEWORK = "openai-agents"


class CapsealRunHooks(RunHooks):  # type: ignore[type-arg]
    """Seals every local tool call of the runs it is given to (see the module docstring).

    Args:
        producer: the producer that seals (or a ``capseal.aio.AsyncProducer`` over it).
        fail_closed: stop a call before its tool runs when its planned capsule cannot be sealed.
        on_seal_error: called with each :class:`~capseal.integrations.SealFailure`.
        context: allow-listed runtime context (``agent_name``, ``tool_namespace``),
            each ``"clear"`` or ``"digest"``.
        irreversibility_class: written on every capsule.

    Raises:
        InputError: a bad argument.
    """

    def __init__(self, producer: Producer | AsyncProducer, *, fail_closed: bool = False,
                 on_seal_error: Callable[[SealFailure], object] | None = None,
                 context: Mapping[str, str] | None = None, irreversibility_class: str | None = None) -> None:
        super().__init__()
        self.recorder = ToolCallRecorder(producer, framework=FRAMEWORK, fail_closed=fail_closed,
                                         on_seal_error=on_seal_error, context=context,
                                         irreversibility_class=irreversibility_class)
        self._watched: set[str] = set()
        self._failed: dict[tuple[str, int], bool] = {}
        self._contexts: dict[tuple[str, int], Any] = {}  # kept alive while open, so id() names one context
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ tools

    def function_tool(self, func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
        """``agents.function_tool`` with the hooks' failure function installed
        around the one given in ``failure_error_function`` (or the SDK's
        default), so a tool that raised is sealed failed.

        Args:
            func: the tool function (or None, used as ``@hooks.function_tool(…)``).
            kwargs: ``agents.function_tool``'s keyword arguments.

        Returns:
            The ``FunctionTool`` (or a decorator making one).
        """
        inner = kwargs.pop("failure_error_function", default_tool_error_function)
        kwargs["failure_error_function"] = self.failure_error_function(inner)

        def make(fn: Callable[..., Any]) -> Any:
            tool = _function_tool(fn, **kwargs)
            with self._lock:
                self._watched.add(tool.name)
            return tool

        return make if func is None else make(func)

    def failure_error_function(self, inner: Callable[..., Any] | None = default_tool_error_function) -> Callable[..., Any]:
        """The failure function :meth:`function_tool` installs: marks the call
        failed, then returns what ``inner`` returns for the model (None: the
        error is raised on, as the SDK does without a failure function).

        Args:
            inner: the failure function to run (``agents.default_tool_error_function`` …).

        Returns:
            An async ``(ctx, error) -> str`` for ``failure_error_function=``.
        """
        async def failure(ctx: Any, error: Exception) -> Any:
            if inner is None:  # the error goes on up and on_tool_end never comes: sealed now
                if isinstance(ctx, ToolContext):
                    with self._lock:
                        self._contexts.pop(_key(ctx), None)
                    await self.recorder.afinish_key(_key(ctx), "raised")
                raise error
            if isinstance(ctx, ToolContext):
                with self._lock:
                    self._failed[_key(ctx)] = True
            message = inner(ctx, error)
            return await message if inspect.isawaitable(message) else message

        return failure

    # ------------------------------------------------------------------ hooks

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        """Seal the planned capsule (the SDK awaits this before the tool runs).

        Raises:
            ToolCallBlockedError: fail-closed, and it could not be sealed.
        """
        seen = {"agent_name": getattr(agent, "name", None), "tool_namespace": getattr(context, "tool_namespace", None)}
        seen = {k: v for k, v in seen.items() if v is not None}
        name = getattr(tool, "name", None) or getattr(context, "tool_name", None) or "?"
        if not isinstance(context, ToolContext):  # another tool family: no call id to pair by
            return
        key = _key(context)
        with self._lock:
            self._contexts[key] = context
        try:
            await self.recorder.astart(tool=name, arguments=_arguments(context.tool_arguments),
                                       ids={"tool_call_id": context.tool_call_id}, context=seen, key=key)
        except BaseException:
            with self._lock:
                self._contexts.pop(key, None)
            raise

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        """Seal the outcome: failed when the failure function saw an error,
        confirmed for a watched tool's result, else dispatched."""
        if not isinstance(context, ToolContext):
            return
        key = _key(context)
        with self._lock:
            failed = self._failed.pop(key, False)
            self._contexts.pop(key, None)
            watched = getattr(tool, "name", None) in self._watched
        if failed:
            await self.recorder.afinish_key(key, "raised", result)
        elif watched:
            await self.recorder.afinish_key(key, "returned", result)
        else:
            await self.recorder.afinish_key(key, "unobserved", ABSENT)


def _key(context: Any) -> tuple[str, int]:
    return str(context.tool_call_id), id(context)


def _arguments(raw: Any) -> Any:
    """The arguments the tool was called with: the SDK's JSON string, parsed
    (a string that is not JSON is digested as it is)."""
    if not isinstance(raw, str):
        return raw if raw is not None else ABSENT
    try:
        return json.loads(raw)
    except ValueError:
        return raw
