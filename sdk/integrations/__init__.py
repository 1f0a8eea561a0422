"""Agent frameworks' tool calls sealed as capsules: a planned capsule before the
tool runs, and a confirmed or failed one after it, chained to it.

Public modules:

* :mod:`capseal.integrations.recorder` — :class:`ToolCallRecorder`, the
  framework-free core every adapter drives (pairing, open calls, failures);
* :mod:`capseal.integrations.calls` — :class:`ToolCall`, :class:`OpenCall`,
  :class:`SealFailure`, :data:`ABSENT`;
* :mod:`capseal.integrations.capsules` — the capsules of one call
  (``x-tool-call`` effects, the ``x-tool-call-v1`` member);
* :mod:`capseal.integrations.values` — tool arguments and results as exact
  JSON (a float as Python's shortest round-trip ``repr`` string);
* :mod:`capseal.integrations.langchain` — ``capseal[langchain]``: a callback
  handler and a ``wrap_tool_call`` agent middleware;
* :mod:`capseal.integrations.openai_agents` — ``capseal[openai-agents]``:
  ``RunHooks`` and the tool failure function they see failures through;
* :mod:`capseal.integrations.mcp` — ``capseal[mcp]``: a server middleware
  for ``tools/call`` and a tool decorator;
* :mod:`capseal.integrations.pydantic_ai` — ``capseal[pydantic-ai]``: a
  capability.

Importing this package imports no framework; each adapter module imports its
framework, and raises :class:`~capseal.errors.MissingExtraError` naming the
extra to install when it is missing.

What of a tool call enters a capsule (-05 §14: deny by default, classify
every field). The adapters' allow-list is the ``context`` argument; nothing
else of the runtime context enters:

============================================  ===========  ==========================================
field                                         class        where
============================================  ===========  ==========================================
framework name, tool name                     clear-safe   ``x-tool-call-v1.framework``, ``.tool``
ids the framework gave the call (run id,      clear-safe   ``x-tool-call-v1.ids``
call id, step, request id)
the recorder's sequence number, outcome kind  clear-safe   ``x-tool-call-v1.sequence``, ``.outcome``
what is absent, and why                       clear-safe   ``x-tool-call-v1.absent``
tool arguments                                digest-only  ``effect.request_digest`` (outcome capsule)
tool result, failure response                 digest-only  ``effect.response_digest`` (outcome capsule)
runtime context an adapter offers (tags,      never-enters unless allow-listed: ``"clear"`` into
metadata, agent or model name, client info)                ``x-tool-call-v1.context``, ``"digest"``
                                                           into ``.context_digests``
exception messages and types, tracebacks,     never-enters —
conversation, state, dependencies, sessions,
user identity, secrets
============================================  ===========  ==========================================
"""

from __future__ import annotations

from .calls import ABSENT, OPEN_REASONS, OpenCall, SealFailure, ToolCall
from .capsules import EFFECT_TYPE, EXTENSION
from .recorder import ToolCallRecorder
from .values import exact_float, exact_json

__all__ = ["ToolCallRecorder", "ToolCall", "OpenCall", "SealFailure", "ABSENT", "OPEN_REASONS", "EFFECT_TYPE",
           "EXTENSION", "exact_json", "exact_float"]
