"""``capseal referee``: rule a case file, re-ask a pair, show a book.

    capseal referee rule CASE.json [--book BOOK] [--key URI] [--json]
    capseal referee reask CASE.json --book BOOK [--key URI] [--json]
    capseal referee book show BOOK [--json]

``rule`` runs one case file through the same code the API uses
(``capseal.judge.referee.run_case``) and prints the rules' answer
``{"counts_against", "referee_calls", "row"}`` (``--json``: that object alone,
on one line). ``reask`` is the operator asking again about the case's pair
(after ``no_eligible_referee`` it selects again; a spent pair makes no call).
Exit status: 0 whatever the ruling, 1 for a refused pair, 2 for a file that
could not be read as a case (or another error).

``BOOK`` is a capseal ledger; without ``--book`` a temporary one is used and
discarded. Book rows are signed with ``--key`` (the book keeper's key), or with
a one-off key when none is given (said on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import CapsealError, CaseFileError, LedgerError, PairRefusedError

__all__ = ["add_parser"]

EXIT_OK, EXIT_REFUSED, EXIT_UNREADABLE = 0, 1, 2

_PAIR_STATE = {
    "halves_agree": "both halves present, agreeing",
    "halves_disagree": "both halves present, disagreeing",
    "one_half_unavailable": "one half unavailable (an orphan: a defined state, not tampering)",
}


def add_parser(sub: Any) -> None:
    """Add ``capseal referee`` to the CLI.

    Args:
        sub: the top-level subparsers (``build_parser``'s).
    """
    ref = sub.add_parser("referee", help="twins and a referee: rule case files, re-ask pairs, show a book")
    cmds = ref.add_subparsers(dest="referee_cmd", required=True)
    p = cmds.add_parser("rule", help="run one rule case file and print the rules' answer")
    p.add_argument("case", metavar="CASE.json")
    p.add_argument("--book", help="the book (a capseal ledger) to keep the outcome in (default: a temporary one)")
    p.add_argument("--key", help="the book keeper's signing key URI (default: a one-off key)")
    p.add_argument("--json", action="store_true", help='print only {"counts_against", "referee_calls", "row"}')
    p.set_defaults(fn=cmd_rule, reask=False)
    p = cmds.add_parser("reask", help="the operator asks again about a case's pair")
    p.add_argument("case", metavar="PAIR", help="the case file naming the pair (CASE.json)")
    p.add_argument("--book", required=True, help="the book the pair is kept in")
    p.add_argument("--key", help="the book keeper's signing key URI (default: a one-off key)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_rule, reask=True)
    book = cmds.add_parser("book", help="the book of pairs").add_subparsers(dest="book_cmd", required=True)
    p = book.add_parser("show", help="every pair's latest row, and the halves held without their twin")
    p.add_argument("book", metavar="BOOK")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_book_show)


def _err(message: str) -> None:
    print(f"capseal: error: {message}", file=sys.stderr)


@contextlib.contextmanager
def _book_at(path: str | None, key: str | None) -> Iterator[Any]:
    from capseal.judge.referee import Book
    from capseal.keys import UnsafeEphemeralSigner, open_signer

    signer = open_signer(key) if key else UnsafeEphemeralSigner()
    if key is None and path is not None:
        print("capseal: note: book rows are signed with a one-off key (pass --key to sign them with a kept key)",
              file=sys.stderr)
    try:
        with contextlib.ExitStack() as stack:
            where = Path(path) if path else Path(stack.enter_context(tempfile.TemporaryDirectory())) / "book.db"
            book = Book(where, signer)
            stack.callback(book.close)
            yield book
    finally:
        signer.close()


def cmd_rule(args: argparse.Namespace) -> int:
    """``rule`` and ``reask``: one case through ``run_case``; returns the exit status."""
    from capseal.judge.referee import load_case, run_case

    try:
        case = load_case(args.case)
    except CaseFileError as exc:
        _err(str(exc))
        return EXIT_UNREADABLE
    try:
        with _book_at(args.book, args.key) as book:
            answer = run_case(case, book, reask=args.reask)
    except PairRefusedError as exc:
        _err(f"pair refused ({exc.rule}): {exc}")
        return EXIT_REFUSED
    except CaseFileError as exc:
        _err(str(exc))
        return EXIT_UNREADABLE
    except CapsealError as exc:
        _err(str(exc))
        return EXIT_UNREADABLE
    result = answer.to_json()
    if args.json:
        print(json.dumps(result, sort_keys=True, separators=(",", ":")))
        return EXIT_OK
    pair = answer.pair
    comparison = pair.comparison()
    split = "" if comparison.same else f" (they split at word {comparison.divergence_index})"
    print(f"pair     {pair.pair_id[:16]}…  bracket={pair.twin_bracket_id!r}  {', '.join(pair.key[2])}")
    print(f"state    {_PAIR_STATE[pair.state]}{split}")
    if answer.ineligible:
        print("not eligible  " + ", ".join(f"{n}: {why}" for n, why in sorted(answer.ineligible.items())))
    if answer.selection is not None and answer.selection.tier is not None:
        print(f"selected tier {answer.selection.tier} from {', '.join(answer.selection.pool)}")
    if answer.refusal:
        print(f"call     {answer.refusal}")
    if answer.ruling is not None and answer.ruling.ok:
        ids = answer.book_row.ruling_id if answer.book_row is not None else None
        print(f"ruling   {ids or answer.ruling.statement_id} signed by {answer.ruling.referee}'s announced key "
              "(checked: signatures, citations, tier, what it says — not whether it is right)")
    print(f"answer   {json.dumps(result, sort_keys=True, separators=(',', ':'))}")
    return EXIT_OK


def cmd_book_show(args: argparse.Namespace) -> int:
    """``book show``: every pair's latest row and the orphans; returns the exit status."""
    from capseal.audit import KeyDirectory
    from capseal.judge.referee import Book
    from capseal.judge.referee.book import verify_entry
    from capseal.ledger import Ledger

    try:
        ledger = Ledger(args.book, readonly=True)
    except (LedgerError, OSError) as exc:
        _err(f"cannot read the book {args.book}: {exc}")
        return EXIT_UNREADABLE
    try:
        book = Book(ledger)
        rows, orphans = book.rows(), book.orphans()
        latest: dict[str, Any] = {}
        counts: dict[str, int] = {}
        for r in rows:
            latest[r.pair_id] = r
            counts[r.pair_id] = counts.get(r.pair_id, 0) + 1
        checked = {r.record_id: verify_entry(e, ledger=ledger, keys=KeyDirectory()).ok
                   for r in latest.values() if (e := ledger.entry(r.record_id)) is not None}
    except LedgerError as exc:
        _err(str(exc))
        return EXIT_UNREADABLE
    finally:
        ledger.close()
    pairs = [{**r.to_json(), "rows": counts[pid], "verified": checked.get(r.record_id, False)} for pid, r in latest.items()]
    if args.json:
        print(json.dumps({"pairs": pairs, "orphans": [h.to_json() for h in orphans]}, sort_keys=True, indent=2))
        return EXIT_OK
    print(f"{len(pairs)} pair(s), {len(orphans)} half(s) held without their twin")
    for p in pairs:
        bracket, nodes = p["pair"]["twin_bracket_id"], ", ".join(p["pair"]["node_ids"])
        flags = ["spent" if p["called"] else "call not spent"]
        if "in_flight" in p:
            flags.append(f"the call to {p['in_flight']['referee']} did not return (spent, never retried)")
        if not p["verified"]:
            flags.append("ROW DOES NOT VERIFY")
        print(f"{p['pair_id'][:16]}…  bracket={bracket!r}  {nodes}  {_PAIR_STATE[p['pair_state']]}")
        print(f"    {json.dumps(p['row'], sort_keys=True)}  at {p['at']}  ({'; '.join(flags)}; {p['rows']} row(s))")
    for h in orphans:
        print(f"orphan   bracket={h.twin_bracket_id!r}  {h.node_id}  {h.capsule_id[:16]}…  {_PAIR_STATE['one_half_unavailable']}")
    return EXIT_OK
