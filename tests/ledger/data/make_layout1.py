"""How ``layout1.sqlite3`` was made: run with the capseal of commit ad9e51a
(the last one writing the first layout), ``python make_layout1.py layout1.sqlite3``.
Kept for the record; the tests read the file, they never run this."""

from __future__ import annotations

import os
import sqlite3
import sys

from capseal import Producer
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import LedgerEntry


def main(out: str) -> None:
    for suffix in ("", "-wal", "-shm", "-head"):
        if os.path.exists(out + suffix):
            os.unlink(out + suffix)
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), out, epoch_id="old-epoch") as p:
        first = p.seal({"action_id": "old-1", "action_type": "fyi"})
        p.seal({"action_id": "old-2", "action_type": "fyi"}, parent=first.capsule_id)
        p.seal({"action_id": "nul\x00one", "action_type": "fyi"})
        p.ledger.append(LedgerEntry(f"{7:064x}", "note", "producer_claim", b'{"action_id":"note-7","n":7}',
                                    action_id="note-7"))
        p.ledger.add_evidence(first.capsule_id, {"kind": "test-evidence", "n": 1})
    db = sqlite3.connect(out)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # everything in the one file (still in WAL mode)
    db.execute("VACUUM")
    db.close()
    for suffix in ("-wal", "-shm", "-head"):  # the head file stays behind: the file alone is the fixture
        if os.path.exists(out + suffix):
            os.unlink(out + suffix)


if __name__ == "__main__":
    main(sys.argv[1])
