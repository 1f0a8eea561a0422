"""A comparing node in a process of its own, for the crash tests (run as a script).

    python child.py hang CASE BOOK BOOK_KEY MARKER     # writes MARKER once inside the call, then hangs
    python child.py churn CASE BOOK BOOK_KEY MARKER    # rules the case's halves under bracket-0, -1, … until killed,
                                                       # writing MARKER.<n> as its n-th call starts

Both use the same code as the API (``case.halves()``, ``Referee``); only the
transport of ``hang`` never returns.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from capseal.judge.referee import Book, Referee, ReplayTransport, load_case, make_pair
from capseal.judge.referee.case import open_seats
from capseal.keys import FileSigner


def main(argv: list[str]) -> int:
    mode, case_path, book_path, key_path, marker = argv
    case = load_case(case_path)
    with Book(book_path, FileSigner(key_path)) as book, open_seats(case, book) as seats:
        replay = ReplayTransport({n: s.get("reanswer") for n, s in case.referee.items()})

        def hang(referee: str, request: dict[str, Any]) -> Any:
            Path(marker).write_text("in the call")
            while True:
                time.sleep(60)

        calls = [0]

        def counted(referee: str, request: dict[str, Any]) -> Any:
            calls[0] += 1
            Path(f"{marker}.{calls[0]}").write_text("calling")
            return replay(referee, request)

        referee = Referee(book, roster=case.roster, settings=case.settings, transport=hang if mode == "hang" else counted,
                          seats=seats, history=case.history, clock=lambda: case.now)
        pair = case.halves()
        if mode == "hang":
            referee.consider(pair)
            return 1  # never reached
        i = 0
        while True:
            referee.consider(make_pair(f"bracket-{i}", pair.request_digest, pair.halves, request=pair.request))
            i += 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
