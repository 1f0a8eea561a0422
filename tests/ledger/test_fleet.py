"""A fleet on one PostgreSQL ledger: 8 producer processes seal 2,000 records
each while 50 of them, chosen at random, are killed with SIGKILL mid-run and
replaced (with CAPSEAL_FLEET_FULL=1; by default 600 records each and 20
kills). Every acknowledged record is there, the chains are whole and every
signature verifies.

Producers are forked from one process that has capseal imported (a new
interpreter per kill would cost more than the test): each child opens its own
Producer and writes the capsule ids it was acknowledged (after ``flush()``)
to a file of its own, one write per batch."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import capseal
from capseal import Ledger
from tests.conftest import PostgresServer

# CAPSEAL_FLEET_FULL=1: the full form, 8 x 2,000 records and 50 kills; by default a
# reduced one that keeps the suite fast (the same checks, fewer records and kills)
FULL = os.environ.get("CAPSEAL_FLEET_FULL") == "1"
SLOTS, PER_SLOT, KILLS, BATCH = (8, 2000, 50, 50) if FULL else (8, 600, 20, 50)

_SPAWNER = r"""
import os, signal, sys
from capseal import Producer
from capseal.keys import UnsafeEphemeralSigner
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
url, acks, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
for line in sys.stdin:
    slot, incarnation, want = line.split()
    want = int(want)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(os.path.join(acks, f"{slot}-{incarnation}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with Producer("acme", f"fleet-{slot}@1", UnsafeEphemeralSigner(), url) as p:
                done = 0
                while done < want:
                    n = min(batch, want - done)
                    pending = [p.submit({"action_id": f"{slot}-{incarnation}-{done + k}", "action_type": "fyi"})
                               for k in range(n)]
                    p.flush()
                    os.write(fd, "".join(x.capsule_id + "\n" for x in pending).encode())
                    done += n
            os.write(fd, b"DONE\n")
            code = 0
        finally:
            os._exit(code)
    print(pid, flush=True)
"""


def _acked(path: Path) -> tuple[list[str], bool]:
    """The ids a child acknowledged (a partial last line was not), and whether it finished."""
    try:
        lines = path.read_text().split("\n")[:-1]
    except FileNotFoundError:
        return [], False
    return [x for x in lines if x != "DONE"], "DONE" in lines


def test_eight_producers_and_fifty_sigkills_lose_nothing(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.new_url()
    Ledger(url).close()
    acks = tmp_path / "acks"
    acks.mkdir()
    spawner = subprocess.Popen([sys.executable, "-c", _SPAWNER, url, str(acks), str(BATCH)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert spawner.stdin is not None and spawner.stdout is not None
    rng = random.Random(20261201)
    incarnations = [0] * SLOTS
    pids = [0] * SLOTS

    def acked(slot: int) -> list[str]:
        return [cid for n in range(incarnations[slot] + 1) for cid in _acked(acks / f"{slot}-{n}")[0]]

    def start(slot: int) -> None:
        spawner.stdin.write(f"{slot} {incarnations[slot]} {PER_SLOT - len(acked(slot))}\n")  # type: ignore[union-attr]
        spawner.stdin.flush()  # type: ignore[union-attr]
        pids[slot] = int(spawner.stdout.readline())  # type: ignore[union-attr]

    def finished(slot: int) -> bool:
        return _acked(acks / f"{slot}-{incarnations[slot]}")[1]

    kills = 0
    try:
        for slot in range(SLOTS):
            start(slot)
        deadline = time.monotonic() + 240
        while kills < KILLS:
            assert time.monotonic() < deadline, f"{kills} kills so far"
            time.sleep(rng.uniform(0.02, 0.12))
            alive = [s for s in range(SLOTS) if not finished(s)]
            if not alive:
                break
            slot = rng.choice(alive)
            try:
                os.kill(pids[slot], signal.SIGKILL)  # mid-seal, mid-commit, or still opening its producer
            except ProcessLookupError:  # it finished meanwhile
                continue
            kills += 1
            incarnations[slot] += 1
            start(slot)
        while not all(finished(s) for s in range(SLOTS)):
            assert time.monotonic() < deadline, "the fleet did not finish"
            time.sleep(0.05)
    finally:
        spawner.stdin.close()
        spawner.wait(timeout=60)
    assert kills == KILLS, f"the fleet finished after {kills} kills: make the kills come faster"
    acknowledged = {slot: acked(slot) for slot in range(SLOTS)}
    assert all(len(ids) == PER_SLOT for ids in acknowledged.values()), {s: len(i) for s, i in acknowledged.items()}
    with Ledger(url, readonly=True) as ledger:
        stored = {e.record_id for e in ledger.entries()}
        missing = [cid for ids in acknowledged.values() for cid in ids if cid not in stored]
        assert not missing, f"{len(missing)} acknowledged records lost"
        assert ledger.check_chain() == []
    report = capseal.verify_ledger(url)  # every signature, every producer's epoch chain
    assert report.ok, [(r.seq, [f.code for f in r.findings]) for r in report.records if not r.ok][:5]
    assert report.counts()["records"] >= SLOTS * PER_SLOT
