"""What the agent examples print: each tool call as its ledger holds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from capseal import verify_ledger
from capseal.integrations import EFFECT_TYPE, EXTENSION
from capseal.ledger import Ledger


def print_tool_calls(path: Path, open_calls: list[Any]) -> None:
    """One line per tool call (its planned capsule and the outcome chained to
    it, with the digests: the arguments and results themselves are not in
    the ledger), the calls left open, and the ledger's verdict."""
    with Ledger(path, readonly=True) as ledger:
        capsules = [r.capsule for r in ledger.records()]
    outcomes = {c["chain"]["parent_capsule_id"]: c for c in capsules if "chain" in c}
    for capsule in capsules:
        effect = capsule.get("effect", {})
        if effect.get("type") != EFFECT_TYPE or effect["status"] != "planned":
            continue
        call = capsule[EXTENSION]
        outcome = outcomes.get(capsule["capsule_id"])
        ended = outcome["effect"] if outcome is not None else {"status": "(open)"}
        digests = "  ".join(f"{k.split('_')[0]} {ended[k][:12]}…" for k in ("request_digest", "response_digest")
                            if k in ended)
        print(f"call {_call_id(call)!s:<9} {call['tool']:<13} "
              f"planned → {ended['status']:<10} {digests}".rstrip())
    print(f"open calls: {len(open_calls)}")
    report = verify_ledger(path)
    signers = ", ".join(sorted({r.signature for r in report.records}))
    print(f"ledger ok: {report.ok}, {len(report.records)} records, signatures {signers}")


def _call_id(call: dict[str, Any]) -> Any:
    """The id the framework gave the call (a tool call id, an MCP request id)."""
    ids = call.get("ids", {})
    return ids.get("tool_call_id", ids.get("request_id", f"#{call['sequence']}"))
