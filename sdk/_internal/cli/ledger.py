"""``capseal ledger show|export|import``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import EXIT_NOT_OK, EXIT_OK, emit

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Add ``ledger`` to the CLI's subparsers."""
    ledger = sub.add_parser("ledger", help="inspect, export and import ledgers").add_subparsers(dest="ledger_cmd", required=True)
    p = ledger.add_parser("show", help="list records")
    p.add_argument("ledger")
    p.add_argument("--id", help="only this record id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_ledger_show)
    p = ledger.add_parser("export", help="export to JSON Lines")
    p.add_argument("ledger")
    p.add_argument("-o", "--output", help="output file (default stdout)")
    p.add_argument("--json", action="store_true", help="a JSON summary (on stderr when the export goes to stdout)")
    p.set_defaults(fn=cmd_ledger_export)
    p = ledger.add_parser("import", help="build a new ledger from a JSON Lines export")
    p.add_argument("jsonl")
    p.add_argument("ledger")
    p.add_argument("--json", action="store_true", help="a JSON summary")
    p.set_defaults(fn=cmd_ledger_import)



def cmd_ledger_show(args: argparse.Namespace) -> int:
    """Exit 1 when ``--id`` names no record, or a row is damaged (each shown as such)."""
    from ...ledger import Ledger

    damaged: list[str] = []
    with Ledger(args.ledger, readonly=True) as ledger:
        if args.id:
            found = ledger.entry(args.id)
            entries = [found] if found is not None else []
        else:
            entries = list(ledger.entries(damaged=damaged))
        rows = []
        for e in entries:
            item: dict[str, Any] = {"header": e.header()}
            try:
                item["record"] = None if e.damage else e.record()
            except (ValueError, RecursionError) as exc:
                item["record"] = None
                item["damage"] = f"its body is not JSON ({exc})"
            if e.damage:
                item["damage"] = e.damage
            if e.record_type == "capsule" and "damage" not in item:
                item["hardware_evidence"] = ledger.current_evidence(e.record_id)
            rows.append(item)
    missing = bool(args.id) and not rows
    bad = damaged + [f"seq {item['header']['seq']}: {item['damage']}" for item in rows if "damage" in item]
    if args.json:
        emit(rows)
    else:
        for item in rows:
            _print_ledger_row(item)
    if missing:
        print(f"capseal: no record {args.id} in {args.ledger}", file=sys.stderr)
    for problem in bad:
        print(f"capseal: damaged: {problem} (capseal verify reports the ledger in full)", file=sys.stderr)
    return EXIT_NOT_OK if missing or bad else EXIT_OK


def _print_ledger_row(item: dict[str, Any]) -> None:
    h = item["header"]
    if "damage" in item:
        print(f"{h['seq']:>6}  {h['record_type']:<10} DAMAGED: {item['damage']}")
        return
    rec = item["record"]
    cap = rec.get("capsule", {}) if isinstance(rec, dict) else {}
    verdict = (cap.get("disposition") or {}).get("verdict_class", "")
    status = (cap.get("effect") or {}).get("status", "")
    ev = "evidence" if item.get("hardware_evidence") else "no-evidence"
    print(f"{h['seq']:>6}  {h['record_type']:<10} {h['record_id'][:16]}…  {h['epistemic_type']:<15} "
          f"{cap.get('action_id', ''):<32} {status:<10} {verdict:<14} {ev if h['record_type'] == 'capsule' else ''}")


def cmd_ledger_export(args: argparse.Namespace) -> int:
    from ...ledger import Ledger

    with Ledger(args.ledger, readonly=True) as ledger:
        if args.output in (None, "-"):
            n = ledger.export_jsonl(sys.stdout.buffer)
        else:
            with open(args.output, "wb") as fh:
                n = ledger.export_jsonl(fh)
    to_stdout = args.output in (None, "-")
    if args.json:  # the summary on stdout, unless the export itself went there
        summary = json.dumps({"ledger": args.ledger, "output": args.output or "-", "lines": n})
        print(summary, file=sys.stderr if to_stdout else sys.stdout)
    else:
        print(f"exported {n} lines", file=sys.stderr)
    return EXIT_OK


def cmd_ledger_import(args: argparse.Namespace) -> int:
    from ...ledger import Ledger

    with open(args.jsonl, "rb") as fh, Ledger.import_jsonl(fh, args.ledger) as ledger:
        n = ledger.count()
    if args.json:
        emit({"ledger": args.ledger, "source": args.jsonl, "records": n})
    else:
        print(f"imported {n} records into {args.ledger}", file=sys.stderr)
    return EXIT_OK
