"""``capseal[pydantic-ai]``: pydantic-ai tool calls sealed as capsules.

:class:`CapsealCapability` is a capability (``Agent(…,
capabilities=[CapsealCapability(producer)])``) in the innermost tier, so its
hooks are the last to run before a tool and the first after it:

* ``before_tool_execute`` seals the planned capsule, digesting the validated
  arguments the tool is called with;
* ``on_tool_execute_error`` seals a failed capsule (the tool raised) and
  raises the error on, for other capabilities to recover or not;
* ``after_tool_execute`` seals the confirmed capsule with the result's
  digest;
* ``wrap_tool_execute`` seals a failed capsule for a call that ended by
  asking the model to retry (``ModelRetry``) or by ``ToolFailed``, which the
  error hook never sees. A call deferred or cancelled stays open.

A call is paired by the run's ``run_id``, its ``run_step`` and the call's
``tool_call_id``: pydantic-ai's ``TestModel`` reuses one call id in every
step and run.

Runtime context offered to the allow-list: ``model_name``, ``retry``.
Fail-closed, ``before_tool_execute`` raises
:class:`~capseal.errors.ToolCallBlockedError` before the tool runs, and the
run stops with it. Every seal runs off the event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from capseal import Producer
from capseal.aio import AsyncProducer

from ._extras import require
from .calls import SealFailure
from .recorder import ToolCallRecorder

require("pydantic_ai", "pydantic-ai", __name__)

from pydantic_ai.capabilities import AbstractCapability  # noqa: E402
from pydantic_ai.capabilities.abstract import CapabilityOrdering  # noqa: E402
from pydantic_ai.exceptions import ModelRetry, ToolFailed, ToolFailedError, ToolRetryError  # noqa: E402

__all__ = ["CapsealCapability", "FRAMEWORK"]

FRAMEWORK = "pydantic-ai"

#: how a call may end without the error hook seeing it: asking for a retry, or failing on purpose
_RETRIES = (ModelRetry, ToolRetryError)
_FAILURES = (ToolFailed, ToolFailedError)


@dataclass(init=False)
class CapsealCapability(AbstractCapability[Any]):
    """Seals every tool call of the agent's runs (see the module docstring).

    Args:
        producer: the producer that seals (or a ``capseal.aio.AsyncProducer`` over it).
        fail_closed: stop a call before its tool runs when its planned capsule cannot be sealed.
        on_seal_error: called with each :class:`~capseal.integrations.SealFailure`.
        context: allow-listed runtime context (``model_name``, ``retry``),
            each ``"clear"`` or ``"digest"``.
        irreversibility_class: written on every capsule.

    Raises:
        InputError: a bad argument.
    """

    def __init__(self, producer: Producer | AsyncProducer, *, fail_closed: bool = False,
                 on_seal_error: Callable[[SealFailure], object] | None = None,
                 context: Mapping[str, str] | None = None, irreversibility_class: str | None = None) -> None:
        self.recorder = ToolCallRecorder(producer, framework=FRAMEWORK, fail_closed=fail_closed,
                                         on_seal_error=on_seal_error, context=context,
                                         irreversibility_class=irreversibility_class)

    def get_ordering(self) -> CapabilityOrdering:
        """Innermost: the arguments as the tool gets them, its result or error as it gives them."""
        return CapabilityOrdering(position="innermost")

    async def before_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any) -> Any:
        """Seal the planned capsule; the arguments pass unchanged.

        Raises:
            ToolCallBlockedError: fail-closed, and it could not be sealed.
        """
        model = getattr(ctx, "model", None)
        seen = {"model_name": getattr(model, "model_name", None), "retry": getattr(ctx, "retry", None)}
        await self.recorder.astart(tool=call.tool_name, arguments=args, key=_key(ctx, call),
                                   ids={"run_id": ctx.run_id, "run_step": ctx.run_step,
                                        "tool_call_id": call.tool_call_id},
                                   context={k: v for k, v in seen.items() if v is not None})
        return args

    async def after_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, result: Any) -> Any:
        """Seal the confirmed capsule (nothing, for a call already sealed failed); the result passes unchanged."""
        found = self._open(ctx, call)
        if found is not None:
            await self.recorder.afinish(found, "returned", result)
        return result

    async def on_tool_execute_error(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, error: Exception) -> Any:
        """Seal a failed capsule, then raise ``error`` on (the error itself never enters).

        Raises:
            the error given.
        """
        found = self._open(ctx, call)
        if found is not None:
            await self.recorder.afinish(found, "raised")
        raise error

    async def wrap_tool_execute(self, ctx: Any, *, call: Any, tool_def: Any, args: Any, handler: Any) -> Any:
        """Run the call's lifecycle; seal a failed capsule for a retry or a
        ``ToolFailed`` that ended it.

        Raises:
            what the lifecycle raised.
        """
        try:
            return await handler(args)
        except (*_RETRIES, *_FAILURES) as exc:
            found = self._open(ctx, call)
            if found is not None:
                await self.recorder.afinish(found, "retry" if isinstance(exc, _RETRIES) else "raised")
            raise

    def _open(self, ctx: Any, call: Any) -> Any:
        """The started call this hook ends (once), or None: never started
        here, or already sealed by an earlier hook."""
        key = _key(ctx, call)
        if not self.recorder.has_key(key):
            return None
        return self.recorder.call_for(key)


def _key(ctx: Any, call: Any) -> tuple[Any, ...]:
    return ctx.run_id, ctx.run_step, call.tool_call_id
