"""Crash safety: a child sealing into the ledger is killed with SIGKILL at random
points; every record it had acknowledged is there, nothing is torn, and the
ledger verifies. The child prints a capsule id only after the call that made it
durable has returned (``seal()``, or ``flush()`` after pipelined ``submit()``)."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import capseal
from capseal import Ledger

CHILD = r"""
import sys, threading
from capseal import Producer
from capseal.keys import UnsafeEphemeralSigner

path, mode, run = sys.argv[1], sys.argv[2], sys.argv[3]
out = sys.stdout
lock = threading.Lock()

def ack(ids):
    with lock:
        out.write("".join(f"{i}\n" for i in ids))
        out.flush()

with Producer("acme", "crash-agent@1", UnsafeEphemeralSigner(), path) as p:
    ack(["READY"])
    if mode == "sync":
        i = 0
        while True:
            planned = p.planned(f"{run}-{i}", effect_type="write_order", request={"i": i})
            done = p.confirmed(planned, response={"ok": i})
            ack([planned.capsule_id, done.capsule_id])
            i += 1
    elif mode == "pipelined":
        i = 0
        while True:
            pending = [p.submit({"action_id": f"{run}-{i}-{k}", "action_type": "fyi"}) for k in range(25)]
            p.flush()
            ack([x.capsule_id for x in pending])
            i += 1
    else:
        def worker(t):
            i = 0
            while True:
                r = p.seal({"action_id": f"{run}-{t}-{i}", "action_type": "fyi"})
                ack([r.capsule_id])
                i += 1
        for t in range(4):
            threading.Thread(target=worker, args=(t,), daemon=True).start()
        threading.Event().wait()
"""

RUNS = 54


def _read_available(fd: int, deadline: float) -> bytes:
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
        if b"READY\n" in data:
            break
    return data


def test_sigkill_never_loses_an_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    rng = random.Random(20261130)
    acknowledged: set[str] = set()
    modes = ["sync", "pipelined", "threads"]
    for run in range(RUNS):
        mode = modes[run % 3]
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), mode, f"r{run}"], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        head = _read_available(fd, time.monotonic() + 30)
        assert b"READY" in head, f"child did not start: {head!r}"
        time.sleep(rng.uniform(0.0, 0.12))  # kill at a random point: mid-seal, mid-commit, mid-fsync
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        rest = proc.stdout.read()
        proc.stdout.close()
        lines = (head + rest).decode().split("\n")
        complete = lines[:-1]  # a partial last line was never acknowledged
        acknowledged.update(x for x in complete if x and x != "READY")
        with Ledger(path) as ledger:
            missing = [cid for cid in acknowledged if ledger.entry(cid) is None]
            assert not missing, f"run {run} ({mode}): {len(missing)} acknowledged records lost"
            assert ledger.check_chain() == [], f"run {run} ({mode}): chain broken"
    assert len(acknowledged) > RUNS  # the children did real work before dying
    report = capseal.verify_ledger(path)
    assert report.ok, [(r.seq, [f.code for f in r.findings]) for r in report.records if not r.ok][:5]
    with Ledger(path) as ledger:
        assert ledger.count() >= len(acknowledged)
