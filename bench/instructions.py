"""Instructions per record on fixed workloads, counted by valgrind's callgrind.

Why: on this shared host wall-clock figures swing by a third or more with
what the other tenants run; an instruction count is the same whatever else
the machine does, so two versions of capseal compare exactly (run this on
each). Each workload seals the typical capsule of ``bench/seal.py`` with a
software Ed25519 key and a fixed clock; it runs twice, with ``--small`` and
``--large`` records, and the difference of the two totals over the
difference of the counts is printed (start-up and the epoch boundary cancel
out). The workloads:

  * ``no-ledger``: the seal path on one thread, no ledger;
  * ``seal``: ``seal()`` from one thread, one commit per record;
  * ``submit``: ``submit()`` from one thread, then ``flush()``;
  * ``threads``: ``seal()`` from 4 threads at once (callgrind runs one
    thread at a time, so the groups differ from a real run's);
  * ``softhsm``: ``seal()`` from one thread with an Ed25519 key on a
    SoftHSM2 token (made by hardware/softhsm-token.sh in a temp dir), in
    this process: SoftHSM2's signing is counted too, the same instructions
    for any version of capseal;
  * ``softhsm-process``: the same through the signing process
    (``signing_process=True``): only this process is counted, the child
    that signs is not.

Instructions are not time: C code such as a signature runs more of them per
cycle than the interpreter does. SHA-256 is counted without the CPU's SHA
instructions (valgrind does not emulate them).

Usage: python bench/instructions.py [--small 200] [--large 700] [workload ...]
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any

WORKLOADS = ("no-ledger", "seal", "submit", "threads", "softhsm", "softhsm-process")
_TOKEN_URI = "CAPSEAL_BENCH_IR_URI"  # the SoftHSM2 key's URI, handed to the counted process


def run_workload(name: str, n: int) -> None:
    """Seal ``n`` records the way workload ``name`` does (under callgrind)."""
    from _common import typical_spec

    from capseal import Producer
    from capseal.keys import UnsafeEphemeralSigner

    signer: Any = UnsafeEphemeralSigner()
    if name.startswith("softhsm"):
        from _common import PIN

        from capseal.keys import open_signer

        signer = open_signer(os.environ[_TOKEN_URI], pin=PIN, signing_process=name == "softhsm-process")
    with tempfile.TemporaryDirectory(prefix="capseal-bench-ir-") as tmp:
        producer = Producer("acme", "buyer-agent@1.4", signer, os.path.join(tmp, "l.db"),
                            clock=lambda: "2026-12-01T00:00:00Z", epoch_id="epoch-fixed")
        parent = producer.seal(typical_spec(-1)).capsule_id
        specs = [typical_spec(i, chained=True, parent=parent) for i in range(n)]
        if name == "no-ledger":
            old: Any = producer  # before the producer's split, the same path had other names
            sign, prepare = (producer._sign_here, producer._prepare) if hasattr(producer, "_sign_here") else \
                (old._sign, old._assemble)
            for spec in specs:
                sign(prepare(spec))  # private on purpose: the path without the ledger
        elif name in ("seal", "softhsm", "softhsm-process"):
            for spec in specs:
                producer.seal(spec)
        elif name == "submit":
            for spec in specs:
                producer.submit(spec)
            producer.flush()
        else:
            def work(mine: list[dict[str, object]]) -> None:
                for spec in mine:
                    producer.seal(spec)

            pool = [threading.Thread(target=work, args=(specs[t::4],)) for t in range(4)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        producer.close()
    signer.close()


def softhsm_key(tmp: str) -> str:
    """A new SoftHSM2 token in ``tmp`` with an Ed25519 key on it: the key's URI
    (``SOFTHSM2_CONF`` is set in this process's environment, so the counted
    processes find the token)."""
    from _common import LABEL, PIN, start_softhsm

    from capseal.keys.provision import create_key

    start_softhsm(tmp)
    module = next(p for p in ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
                  if os.path.exists(p))
    uri = f"pkcs11:token={LABEL};object=bench-ir-ed25519?module-path={module}"
    create_key(uri, "ed25519", pin=PIN).close()
    return uri


def count(name: str, n: int) -> int:
    """Instructions callgrind counts for the whole process of ``name`` with ``n`` records."""
    with tempfile.TemporaryDirectory(prefix="capseal-bench-cg-") as tmp:
        env = dict(os.environ, PYTHONHASHSEED="0")
        done = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out",
                               sys.executable, __file__, "--run", name, str(n)],
                              env=env, capture_output=True, text=True, check=False)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None:
            raise SystemExit(f"{name} with {n} records failed under callgrind:\n{done.stderr[-2000:]}")
        return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--large", type=int, default=700)
    ap.add_argument("--run", nargs=2, metavar=("WORKLOAD", "N"), help=argparse.SUPPRESS)
    ap.add_argument("workloads", nargs="*", help=f"any of {', '.join(WORKLOADS)} (default: all)")
    args = ap.parse_args(argv)
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    if args.run is not None:
        run_workload(args.run[0], int(args.run[1]))
        return 0
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    print(f"instructions per record (callgrind; {args.large} records minus {args.small}, over the difference)")
    with tempfile.TemporaryDirectory(prefix="capseal-bench-ir-token-") as tmp:
        for name in args.workloads or WORKLOADS:
            if name.startswith("softhsm") and _TOKEN_URI not in os.environ:
                os.environ[_TOKEN_URI] = softhsm_key(tmp)
            small, large = count(name, args.small), count(name, args.large)
            print(f"  {name:<16} {(large - small) / (args.large - args.small):>12,.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
