"""``capseal interpret LEDGER|FILE [--json] [--id ID]``: what every judgment record says.

Every judgment record of a ledger (or the records of one file) is read, and its
interpretation printed beside the original; each verdict about one subject is
also listed as an *item*. An experiment file (items carrying a ``verdict``) is
printed back re-exported, an ``interpretation`` beside each verdict.

Exit codes: 0 when every record was read (whatever it says), 1 when one reads
CONTRADICTED, 2 when the input could not be read. It reads what records say;
whether they are authentic is ``capseal verify``'s question.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ...errors import InputError

__all__ = ["add_parser", "cmd_interpret"]

EXIT_OK, EXIT_CONTRADICTED, EXIT_ERROR = 0, 1, 2


def add_parser(sub: Any) -> None:
    """Register the ``interpret`` subcommand.

    Args:
        sub: ``build_parser()``'s subparsers.

    Returns:
        None.
    """
    p = sub.add_parser("interpret", help="read what every judgment record of a ledger (or a file) says")
    p.add_argument("source", metavar="LEDGER|FILE", help="a capseal ledger, or a JSON / JSON Lines file of records")
    p.add_argument("--json", action="store_true", help="machine-readable: every record and item with its interpretation")
    p.add_argument("--id", help="only the record with this record id (its digest or its record_id)")
    p.set_defaults(fn=cmd_interpret)


def _matches(record: Any, wanted: str) -> bool:
    header = record.header or {}
    body = record.original
    if isinstance(body, dict) and isinstance(body.get("record"), dict):
        body = body["record"]
    return wanted in (header.get("record_id"), body.get("record_id") if isinstance(body, dict) else None)


def _safe(text: str) -> str:
    """Text any terminal encoding can print (an unpaired surrogate as its escape)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def cmd_interpret(args: argparse.Namespace) -> int:
    """Run ``capseal interpret``.

    Args:
        args: ``source``, ``json`` and ``id`` as parsed.

    Returns:
        0 when every record was read, 1 when one reads CONTRADICTED.

    Raises:
        InputError: the source cannot be read, or no record has the id asked for.
    """
    from ...judge.interpret import read_source

    source = read_source(args.source)
    records = [r for r in source.records if args.id is None or _matches(r, args.id)]
    if args.id is not None and not records:
        raise InputError(f"{args.source}: no judgment record has id {args.id!r}")
    items = [item for r in records for item in r.reading.items]
    contradicted = any(r.reading.interpretation.reading_support == "CONTRADICTED" for r in records) or any(
        item.interpretation.reading_support == "CONTRADICTED" for item in items)
    if args.json:
        if source.document is not None and args.id is None:
            out: Any = source.document
        else:
            out = {"interpretVersion": 1, "source": str(args.source),
                   "records": [{"header": r.header, "record": r.original, "interpretation": r.reading.interpretation.to_json()}
                               for r in records],
                   "items": [item.to_json() for item in items]}
        print(json.dumps(out, indent=2, ensure_ascii=True))
    else:
        if not records:
            print(f"{args.source}: no judgment record")
        for r in records:
            i = r.reading.interpretation
            where = f"{r.header['seq']:>6}  {r.header['record_type']:<28} {str(r.header['record_id'])[:16]}…" if r.header else "  file"
            print(f"{where}  {i.reading or '-'} ({i.reading_support})")
            print(f"        {i.summary}")
            for item in r.reading.items:
                print(f"        item {_safe(item.slug)}: {item.interpretation.reading or '-'} ({item.interpretation.reading_support})")
    return EXIT_CONTRADICTED if contradicted else EXIT_OK
