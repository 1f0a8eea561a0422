"""A fleet of producers on one ledger, PostgreSQL beside SQLite, in one run.

Prints:
  * durable sealed records/s for 1, 2, 4 and 8 producer processes sealing
    into one ledger (each process one Producer, 4 threads each, every seal
    waited for: durable on return), into PostgreSQL and into SQLite;
  * the seal rate with the ledger already holding 0, 100k and 1M records
    (one process, 4 threads), both engines: the median of rounds that
    rotate the order of the sizes, each rate counted after a warm-up (the
    rate a producer keeps up, not the first seconds after the server or the
    file was opened; the big ledgers' files read into the page cache
    first), with its ratio to the fresh ledger's, and the producer's CPU
    and (SQLite) the bytes it wrote to storage a record;
  * ``capseal verify`` of the 100k and 1M ledgers (run first, on the
    ledgers as built, their files read into the page cache first):
    records/s and the peak memory of the verifying process and its workers
    (ru_maxrss of the children), both engines.

The big ledgers are built fast: the bench generates the rows itself (each a
real capsule, with its own capsule id, signed by one key, hash-chained) as an
export (JSON lines), in worker processes, and imports it with
``Ledger.import_jsonl`` (which checks every hash) into each engine; the first
rows are a real producer's (its epoch boundary). The PostgreSQL server is a
private one started by hardware/postgres.sh (stopped at the end).

Beside each verify rate the bench prints the floor's: the same rows read
from the same ledger and only their signatures checked (one Ed25519 verify a
record, with cryptography, as the verifier makes it), in as many processes as
there are CPUs; the ratio says how much of the time goes to the checks other
than the signature.

Usage: python bench/fleet.py [--quick] [--seconds 4] [--rounds 3] [--json] [--only PART] [--engine E] [--keep DIR]
  --quick: ledgers of 10k and 50k records instead of 100k and 1M, 2 s per rate.
  --rounds N: rounds of the seal-rate curve.
  --only fleet|seal|verify: run only that part (repeatable); the big ledgers
      are built for seal and verify.
  --engine postgres|sqlite: only that engine (repeatable).
  --keep DIR: build the big ledgers (and the PostgreSQL server's data) in
      DIR, and reuse the ones already there on the next run (each seal
      curve appends to them: the sizes they held are printed).
"""

from __future__ import annotations

import argparse
import io
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capseal import Ledger, Producer
from capseal.canonical import capsule_id
from capseal.envelope import sign_envelope
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import row_hash
from capseal.record import storage_json

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- the server


class Server:
    """A private PostgreSQL server (hardware/postgres.sh) in a directory (kept
    between runs with ``keep``: started again on the data already there)."""

    def __init__(self, tmp: Path, *, keep: bool = False) -> None:
        self.dir, self.keep = tmp / "pg", keep
        out = subprocess.run([str(ROOT / "hardware" / "postgres.sh"), "start", str(self.dir)], check=True,
                             capture_output=True, text=True).stdout
        env = dict(line.split("=", 1) for line in out.split())
        self.base = f"postgresql://{env['PGUSER']}:{env['PGPASSWORD']}@/%s?host={env['PGHOST']}&port={env['PGPORT']}"
        self.data = Path(env["PGDATA"])
        import psycopg

        with psycopg.connect(self.base % "postgres", autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'bench'").fetchone() is None:
                conn.execute("CREATE DATABASE bench")
        self.n = 0

    def new_url(self) -> str:
        """An empty schema of the bench database."""
        self.n += 1
        return self.schema_url(f"b{os.urandom(4).hex()}" if self.keep else f"b{self.n}", fresh=True)

    def schema_url(self, name: str, *, fresh: bool) -> str:
        """The URL of schema ``name`` of the bench database (emptied first when ``fresh``)."""
        import psycopg

        with psycopg.connect(self.base % "bench", autocommit=True) as conn:
            if fresh:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {name}")
        return (self.base % "bench") + f"&options=-csearch_path%3D{name}"

    def drop(self, url: str) -> None:
        """Drop the schema of ``url`` (a ledger of this server's no longer needed)."""
        import psycopg

        with psycopg.connect(self.base % "bench", autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {url.rsplit('%3D', 1)[1]} CASCADE")

    def stop(self) -> None:
        """Stop the server: its data deleted, or kept (``keep``) for the next run."""
        subprocess.run([str(ROOT / "hardware" / "postgres.sh"), "halt" if self.keep else "stop", str(self.dir)],
                       check=False, capture_output=True)


# ---------------------------------------------------------------- sealing rates

def _seal_for(target: str, who: str, seconds: float, threads: int, out: Any, warm: float = 0.0) -> None:
    """One producer process: ``threads`` threads sealing for ``warm`` then
    ``seconds`` seconds; writes the records sealed in the last ``seconds``,
    and this process's CPU seconds (user+sys) and bytes written to storage
    in them."""
    with Producer("acme", f"{who}@1", UnsafeEphemeralSigner(), target) as p:
        p.seal({"action_id": f"{who}-warm", "action_type": "fyi"})
        start = time.monotonic() + warm
        stop = start + seconds
        counts = [0] * threads

        def run(t: int) -> None:
            i = counted = 0
            while (now := time.monotonic()) < stop:
                p.seal({"action_id": f"{who}-{t}-{i}", "action_type": "fyi"})
                i += 1
                counted += now >= start
            counts[t] = counted

        workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        time.sleep(max(0.0, start - time.monotonic()))
        before = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(max(0.0, stop - time.monotonic()))
        after = resource.getrusage(resource.RUSAGE_SELF)
        for w in workers:
            w.join()
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    out.put((sum(counts), cpu, (after.ru_oublock - before.ru_oublock) * 512))


@dataclass
class Run:
    """A sealing run's figures: records/s, and per record the producers' CPU
    microseconds and kB they wrote to storage (counted after the warm-up; for
    PostgreSQL the server writes, not the producers)."""

    rate: float
    cpu_us: float
    written_kb: float


def fleet_run(target: str, processes: int, seconds: float, threads: int = 4, warm: float = 0.0) -> Run:
    """``processes`` producer processes sealing into one ledger (after
    ``warm`` seconds of sealing not counted: the counted window's rate; else
    the whole run's, the processes' start included)."""
    Ledger(target).close()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_seal_for, args=(target, f"p{k}-{os.urandom(2).hex()}", seconds, threads, q, warm))
             for k in range(processes)]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    results = [q.get(timeout=warm + seconds + 120) for _ in procs]
    for proc in procs:
        proc.join()
    total = sum(r[0] for r in results)
    rate = total / seconds if warm else total / max(time.monotonic() - start, seconds)
    per = max(total, 1)
    return Run(rate, sum(r[1] for r in results) / per * 1e6, sum(r[2] for r in results) / per / 1024)


def fleet_rate(target: str, processes: int, seconds: float, threads: int = 4) -> float:
    """Durable sealed records/s of ``processes`` producer processes on one ledger (see :func:`fleet_run`)."""
    return fleet_run(target, processes, seconds, threads).rate


def size_of(target: str) -> int:
    """The records the ledger at ``target`` holds now."""
    with Ledger(target, readonly=True) as ledger:
        return ledger.count()


# ---------------------------------------------------------------- big ledgers

_GEN: dict[str, Any] = {}


def _bodies(span: tuple[int, int]) -> list[tuple[str, bytes]]:
    """Records ``start..stop`` of the generated part: (capsule id, body)."""
    template, signer = _GEN["template"], _GEN["signer"]
    out = []
    for i in range(*span):
        capsule = {k: v for k, v in template["capsule"].items() if k not in ("capsule_id", "signature", "key_id")}
        capsule["action_id"] = f"gen-{i}"
        cid = capsule_id(capsule)
        env = sign_envelope(signer, bytes.fromhex(cid))
        capsule.update(capsule_id=cid, signature=env.cose.hex(), key_id=env.kid)
        record = {**template, "capsule": capsule, "envelopes": [env.to_json()]}
        out.append((cid, storage_json(record)))
    return out


def build_export(n: int, path: Path, tmp: Path) -> float:
    """An export of ``n`` records: a real producer's first rows, then generated ones. Seconds taken."""
    start = time.monotonic()
    signer = UnsafeEphemeralSigner()
    seed = tmp / f"seed-{n}.db"
    with Producer("acme", "fleet-gen@1", signer, seed) as p:
        p.seal({"action_id": "gen-seed", "action_type": "fyi"})
    buf = io.BytesIO()
    with Ledger(seed, readonly=True) as ledger:
        ledger.export_jsonl(buf)
    lines = buf.getvalue().splitlines()
    last = json.loads(lines[-1])
    _GEN.update(template=last["record"], signer=signer)
    header0 = last["header"]
    prev, seq = header0["row_hash"], header0["seq"]
    spans = [(i, min(i + 2000, n - seq)) for i in range(0, n - seq, 2000)]
    with path.open("wb") as out, multiprocessing.get_context("fork").Pool() as pool:
        for line in lines:
            out.write(line + b"\n")
        for chunk in pool.imap(_bodies, spans):
            for cid, body in chunk:
                seq += 1
                header = {"seq": seq, "record_id": cid, "record_type": "capsule", "epistemic_type":
                          header0["epistemic_type"], "links": [], "nonce": os.urandom(16).hex()}
                h = row_hash(prev, header, body)
                full = {**header, "action_id": json.loads(body)["capsule"]["action_id"], "stream": header0["stream"],
                        "tag": None, "prev_hash": prev, "row_hash": h}
                out.write(b'{"header":' + storage_json(full) + b',"kind":"record","record":' + body + b"}\n")
                prev = h
    return time.monotonic() - start


def import_into(export: Path, target: str) -> float:
    """Seconds ``Ledger.import_jsonl`` takes to build ``target`` from ``export``."""
    start = time.monotonic()
    with export.open("rb") as src:
        Ledger.import_jsonl(src, target).close()
    return time.monotonic() - start


_MEASURE = r"""
import resource, subprocess, sys, time
start = time.monotonic()
proc = subprocess.run([sys.executable, "-m", "capseal", "verify", sys.argv[1]], capture_output=True, text=True)
took = time.monotonic() - start
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(took, used.ru_maxrss, proc.returncode, used.ru_utime + used.ru_stime)
print(proc.stdout[:4000])
"""


def verify_rate(target: str, n: int) -> tuple[float, float, bool, float]:
    """``capseal verify`` of ``target``, run from a fresh process: (records/s,
    peak MB of the verifying process and its workers (their largest
    ru_maxrss), whether it said every record is ok, CPU microseconds per
    record of the process and its workers, user and system)."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE, target], capture_output=True, text=True, check=True)
    head, _, report = proc.stdout.partition("\n")
    took, peak, code, cpu = head.split()
    ok = code == "0" and f"{n} records, {n} ok" in report
    if not ok:
        print(report[-2000:], file=sys.stderr)
    return n / float(took), int(peak) / 1024, ok, float(cpu) / n * 1e6


# ---------------------------------------------------------------- the floor of a verify

_FLOOR: dict[bytes, Any] = {}


def _floor_batch(bodies: list[bytes]) -> int:
    """Parse each body and check its inline Ed25519 signature, nothing else: how many verified."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from capseal.cose import sig_structure
    from capseal.envelope import profile_protected

    keys = _FLOOR
    good = 0
    for body in bodies:
        capsule = json.loads(body)["capsule"]
        kid = bytes.fromhex(capsule["key_id"])
        key = keys.get(kid)
        if key is None:
            key = keys[kid] = Ed25519PublicKey.from_public_bytes(kid)
        sig = bytes.fromhex(capsule["signature"])[-64:]
        try:
            key.verify(sig, sig_structure(profile_protected(kid), bytes.fromhex(capsule["capsule_id"])))
            good += 1
        except InvalidSignature:
            pass
    return good


def _floor_main(target: str) -> None:
    """The floor of a verify of ``target`` (run in a fresh process): the rows
    read in this process, in batches; parsed and their signature checked in
    one worker process per CPU. Prints seconds taken and signatures verified."""
    start = time.monotonic()
    good = 0
    with Ledger(target, readonly=True) as ledger, multiprocessing.get_context("fork").Pool() as pool:
        def batches() -> Any:
            batch: list[bytes] = []
            for e in ledger.entries(batch=2000):
                if e.record_type == "capsule":
                    batch.append(e.body)
                    if len(batch) >= 2000:
                        yield batch
                        batch = []
            if batch:
                yield batch

        for n in pool.imap(_floor_batch, batches()):
            good += n
    print(time.monotonic() - start, good)


def floor_rate(target: str, n: int) -> float:
    """Records/s of the floor (:func:`_floor_main`) over ``target``'s ``n`` records."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--floor", target], capture_output=True,
                          text=True, check=True)
    took, _good = proc.stdout.split()
    return n / float(took)


# ---------------------------------------------------------------- the run

class Ledgers:
    """The big ledgers of the run: built once (a run with ``--keep`` reuses the
    ones a previous run built), one per engine and size."""

    def __init__(self, tmp: Path, server: Server | None, keep: bool) -> None:
        self.tmp, self.server, self.keep = tmp, server, keep

    def get(self, name: str, size: int, export: Any) -> tuple[str, float | None]:
        """The ledger of ``size`` records in engine ``name``: (target, seconds its import took, None when reused)."""
        done = self.tmp / f"built-{name}-{size}"
        if name == "sqlite":
            target = str(self.tmp / f"ledger-{size}.db")
            if not (self.keep and done.exists()):
                for suffix in ("", "-wal", "-shm", "-head"):
                    Path(target + suffix).unlink(missing_ok=True)
        else:
            assert self.server is not None
            reuse = self.keep and done.exists()
            target = self.server.schema_url(f"ledger_{size}", fresh=not reuse)
        if self.keep and done.exists():
            return target, None
        took = import_into(export(), target)
        done.write_text(target)
        return target, took

    def release(self, name: str, target: str) -> None:
        """Let a ledger go unless it is kept."""
        if self.keep:
            return
        if name == "sqlite":
            for suffix in ("", "-wal", "-shm", "-head"):
                Path(target + suffix).unlink(missing_ok=True)
        elif self.server is not None:
            self.server.drop(target)


def read_through(paths: list[Path]) -> tuple[float, float]:
    """Read every file under ``paths`` once (into the page cache): (GB read, seconds)."""
    start, total = time.monotonic(), 0
    files = [p for path in paths for p in ([path] if path.is_file() else sorted(path.rglob("*")))]
    for path in files:
        try:
            with path.open("rb", buffering=0) as f:
                while chunk := f.read(1 << 24):
                    total += len(chunk)
        except OSError:  # a file gone meanwhile (a server's temporary one), or a directory
            continue
    return total / 1e9, time.monotonic() - start


def seal_curve(name: str, new: Callable[[], str], discard: Callable[[str], None], big: dict[int, str], *,
               seconds: float, warm: float, rounds: int, files: list[Path]) -> dict[str, Any]:
    """The seal rate against the ledger's size: a fresh ledger (a new one
    each round) and each big one, in ``rounds`` rounds that rotate the order
    of the sizes (a machine that slows down mid-run slows each size alike);
    each rate counted after ``warm`` seconds of sealing. Prints the median
    of each size, its ratio to the fresh ledger's, and the median CPU and
    bytes written per record.

    ``files`` (the big ledgers' files, or the server's data) are read once
    first, so that every size starts from the page cache, as a ledger in use
    does: a host may drop file pages left idle (this one's DAMON pages out
    what was not touched for a minute), and a big ledger idle while the other
    engine ran would otherwise be read back from the disk in its first
    rounds."""
    gb, took = read_through(files)
    print(f"seal   {name:<8} read {gb:.1f} GB of the ledgers' files first, in {took:.0f} s", flush=True)
    sizes = [0, *big]
    runs: dict[int, list[Run]] = {size: [] for size in sizes}
    held: dict[int, list[int]] = {size: [] for size in sizes}
    for r in range(rounds):
        for size in sizes[r % len(sizes):] + sizes[:r % len(sizes)]:
            target = big[size] if size else new()
            held[size].append(size_of(target) if size else 0)
            runs[size].append(fleet_run(target, 1, seconds, warm=warm))
            if not size:
                discard(target)
    out: dict[str, Any] = {}
    base = statistics.median(run.rate for run in runs[0])
    for size in sizes:
        rate = statistics.median(run.rate for run in runs[size])
        cpu = statistics.median(run.cpu_us for run in runs[size])
        written = statistics.median(run.written_kb for run in runs[size])
        out[f"seal_{name}_at_{size}_per_s"] = rate
        out[f"seal_{name}_at_{size}_cpu_us_per_record"] = cpu
        what = "a fresh ledger" if not size else f"{min(held[size]):,}-{max(held[size]):,} records"
        disk = f"{written:.1f} kB written a record" if name == "sqlite" else "the server writes"
        print(f"seal   {name:<8} ledger at {size:>9,}: {rate:8.0f} durable records/s, {rate / base:.2f}x the fresh "
              f"ledger's (median of {rounds} rotating rounds: {', '.join(f'{run.rate:.0f}' for run in runs[size])}; "
              f"{what}; 1 process x 4 threads, {seconds:g} s counted after {warm:g} s); the producer's "
              f"{cpu:.0f} us CPU and {disk}", flush=True)
        if name == "sqlite":
            out[f"seal_{name}_at_{size}_kb_written_per_record"] = written
    return out


def verify_figures(name: str, size: int, target: str) -> dict[str, Any]:
    """``capseal verify`` of the ledger at ``target`` beside its floor; prints and returns the figures."""
    n = size_of(target)
    load, cpus = os.getloadavg()[0], os.cpu_count() or 1
    rate, peak, ok, cpu = verify_rate(target, n)
    floor = floor_rate(target, n)
    print(f"verify {name:<8} {n:,} records: {rate:8.0f} records/s, peak memory {peak:.0f} MB "
          f"(ru_maxrss of capseal verify and its workers){'' if ok else '  NOT OK'}; "
          f"{cpu:.0f} us CPU a record (user+sys, all its processes; {cpus} CPUs: "
          f"{cpus * 1e6 / cpu:,.0f} records/s if they were all its own; load "
          f"average {load:.1f} at the start); floor {floor:,.0f} records/s (rows read, parsed, "
          f"signature checked), verify at {rate / floor:.0%} of it", flush=True)
    return {f"verify_{name}_{size}_per_s": rate, f"verify_{name}_{size}_peak_mb": peak,
            f"verify_{name}_{size}_floor_per_s": floor, f"verify_{name}_{size}_cpu_us_per_record": cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small ledgers (10k, 50k), 2 s per rate")
    ap.add_argument("--seconds", type=float, default=None, help="seconds each sealing rate runs")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the seal-rate curve (median printed)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", action="append", choices=("fleet", "seal", "verify"),
                    help="run only this part (repeatable; default: all)")
    ap.add_argument("--engine", action="append", choices=("postgres", "sqlite"),
                    help="only this engine (repeatable; default: both)")
    ap.add_argument("--keep", metavar="DIR", help="build the big ledgers in DIR and reuse them on the next run")
    ap.add_argument("--floor", metavar="LEDGER", help=argparse.SUPPRESS)  # the floor's own process
    args = ap.parse_args(argv)
    if args.floor:
        _floor_main(args.floor)
        return 0
    parts = set(args.only or ("fleet", "seal", "verify"))
    wanted = args.engine or ["postgres", "sqlite"]
    sizes = (10_000, 50_000) if args.quick else (100_000, 1_000_000)
    seconds = args.seconds or (2.0 if args.quick else 4.0)
    warm = 1.0 if args.quick else 2.0
    rounds = args.rounds
    out: dict[str, Any] = {"sizes": sizes, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="capseal-fleet-") as tmpdir:
        tmp = Path(args.keep) if args.keep else Path(tmpdir)
        tmp.mkdir(parents=True, exist_ok=True)
        server = Server(tmp, keep=bool(args.keep)) if "postgres" in wanted else None
        try:
            fresh: dict[str, Any] = {"postgres": server.new_url if server else None,
                                     "sqlite": lambda: str(tmp / f"l-{os.urandom(4).hex()}.db")}
            engines = {name: fresh[name] for name in wanted}

            def discard(target: str) -> None:
                if target.startswith("postgresql:"):
                    assert server is not None
                    server.drop(target)
                else:
                    for suffix in ("", "-wal", "-shm", "-head"):
                        Path(target + suffix).unlink(missing_ok=True)

            if "fleet" in parts:
                for name, new in engines.items():
                    for procs in (1, 2, 4, 8):
                        target = new()
                        out[f"fleet_{name}_{procs}p_per_s"] = fleet_rate(target, procs, seconds)
                        discard(target)
                        print(f"fleet  {name:<8} {procs} producer process(es) x 4 threads: "
                              f"{out[f'fleet_{name}_{procs}p_per_s']:8.0f} durable records/s", flush=True)
            ledgers = Ledgers(tmp, server, bool(args.keep))
            targets: dict[tuple[str, int], str] = {}
            for size in sizes if parts & {"seal", "verify"} else ():
                export = tmp / f"export-{size}.jsonl"

                def built(size: int = size, export: Path = export) -> Path:
                    if not export.exists():
                        took = build_export(size, export, tmp)
                        print(f"built  an export of {size:,} records in {took:.0f} s (rows generated in worker "
                              "processes: real capsules, each its own id and signature, one key, hash-chained)",
                              flush=True)
                    return export

                for name in engines:
                    target, took = ledgers.get(name, size, built)
                    targets[name, size] = target
                    if took is not None:
                        print(f"import {name:<8} {size:,} records by Ledger.import_jsonl in {took:.0f} s "
                              f"({size / took:,.0f} rows/s)", flush=True)
                if not args.keep:
                    export.unlink(missing_ok=True)

            def files_of(name: str) -> list[Path]:
                if name == "postgres":
                    assert server is not None
                    return [server.data]
                return [Path(targets[name, size] + suffix) for size in sizes for suffix in ("", "-wal")]

            if "verify" in parts:  # first: the big ledgers as built (the seal curve adds to them)
                for name in engines:
                    gb, took = read_through(files_of(name))
                    print(f"verify {name:<8} read {gb:.1f} GB of the ledgers' files first, in {took:.0f} s",
                          flush=True)
                    for size in sizes:
                        out.update(verify_figures(name, size, targets[name, size]))
            if "seal" in parts:
                for name, new in engines.items():
                    files = files_of(name)
                    out.update(seal_curve(name, new, discard, {size: targets[name, size] for size in sizes},
                                          seconds=seconds, warm=warm, rounds=rounds, files=files))
            for (name, _), target in targets.items():
                ledgers.release(name, target)
        finally:
            if server is not None:
                server.stop()
    if args.json:
        print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in out.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
