"""What every benchmark seals: one typical capsule (effect + disposition +
constraints, and a chain when asked), so figures from different scripts compare."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: the bench token's user PIN, security officer's PIN and label
PIN, SO_PIN, LABEL = "bench-pin-Qx~7", "bench-so-Jw~3", "capseal-bench"


def start_softhsm(tmp: str) -> dict[str, str]:
    """A new SoftHSM2 token in ``tmp`` (hardware/softhsm-token.sh); its
    ``SOFTHSM2_CONF`` is set in this process's environment (SoftHSM2 reads it
    at C_Initialize, and the processes started from here inherit it)."""
    out = subprocess.run([str(ROOT / "hardware" / "softhsm-token.sh"), os.path.join(tmp, "softhsm"), LABEL, PIN, SO_PIN],
                         check=True, capture_output=True, text=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    os.environ["SOFTHSM2_CONF"] = env["SOFTHSM2_CONF"]
    return env

PARENT = "1" * 64


def typical_spec(i: int, *, chained: bool = False, parent: str = PARENT) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "action_id": f"act-{i}",
        "action_type": "decide",
        "effect": {
            "status": "confirmed", "type": "write_order",
            "request_digest": "a" * 64, "response_digest": "b" * 64,
            "irreversibility_class": "one_way_recoverable", "effect_attestation": "gate_executed",
        },
        "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "executed"},
        "constraints": [
            {"id": "com.example.amount_ceiling", "check_type": "com.example.threshold", "result": "pass",
             "severity": "high", "blocking": True, "evidence_digest": "c" * 64},
        ],
    }
    if chained:
        spec["chain"] = {"parent_capsule_id": parent, "relation": "follows"}
    return spec


def threaded_rate(call: Callable[[int], Any], n: int, threads: int, next_id: Callable[[], int],
                  repeats: int = 2, after: Callable[[], Any] | None = None) -> float:
    """Records per second when ``threads`` threads make ``n`` calls in all of
    ``call(next_id())`` (then ``after()``, e.g. a flush); best of ``repeats``."""
    per = n // threads
    best = 0.0
    for _ in range(repeats):
        def work() -> None:
            for _ in range(per):
                call(next_id())

        pool = [threading.Thread(target=work) for _ in range(threads)]
        start = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if after is not None:
            after()
        best = max(best, per * threads / (time.perf_counter() - start))
    return best


def submit_rate(producer: Any, n: int, threads: int, next_id: Callable[[], int], repeats: int = 2) -> float:
    """Durable records per second: ``submit()`` typical capsules, then ``flush()``."""
    return threaded_rate(lambda i: producer.submit(typical_spec(i)), n, threads, next_id, repeats, after=producer.flush)


def rotating_rounds(arms: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run every arm once per round, starting each round one arm further on.

    Why: this host's speed drifts by a third or more over seconds (other
    tenants); an arm always run first, or always last, would be favoured, and
    a ratio of two figures taken minutes apart would measure the drift. Each
    round's figures are neighbours in time, so per-round ratios compare like
    with like; report their median."""
    names = list(arms)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(arms[name]())
    return out


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) another process has used so far, from
    ``/proc`` (clock ticks: 10 ms, so sum it over many records)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuPerRecord:
    """Wraps arms to add up the CPU they cost, in this process (all threads)
    and in a helper process, per record over every round.

    Why: on this 2-vCPU host a sealed rate is bounded by the CPU each record
    costs both processes together; printing that cost, next to the rates,
    shows where a gap to the raw rate comes from instead of estimating it."""

    def __init__(self, child_pid: int) -> None:
        self.child_pid = child_pid
        self.totals: dict[str, list[float]] = {}  # arm: [own CPU s, child CPU s, records]

    def wrap(self, name: str, arm: Callable[[], float], records: int) -> Callable[[], float]:
        def measured() -> float:
            own, child = time.process_time(), process_cpu(self.child_pid)
            rate = arm()
            total = self.totals.setdefault(name, [0.0, 0.0, 0])
            total[0] += time.process_time() - own
            total[1] += process_cpu(self.child_pid) - child
            total[2] += records
            return rate
        return measured

    def per_record_us(self) -> dict[str, tuple[float, float]]:
        """Arm: (µs of this process's CPU, µs of the helper's) per record."""
        return {name: (1e6 * own / n, 1e6 * child / n) for name, (own, child, n) in self.totals.items()}


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


_ids = iter(range(10**12))
_ids_lock = threading.Lock()


def next_id() -> int:
    """Distinct action ids across every arm of a run."""
    with _ids_lock:
        return next(_ids)


class SealedArm:
    """One producer on its own ledger, kept open across rounds (the epoch
    boundary and the first commit are not measured): ``rate(threads)`` submits
    n records from that many threads and flushes.

    ``bench_only_skip_device_check`` turns off the producer's check of every
    device signature (a private switch, used by one labelled benchmark arm so
    the check's cost is visible; capseal has no public way to skip it)."""

    def __init__(self, signer: Any, tmp: str, n: int, *, bench_only_skip_device_check: bool = False) -> None:
        from capseal import Producer

        self.n = n
        self.producer = Producer("acme", "bench-agent@1", signer, os.path.join(tmp, f"l-{next_id()}.db"))
        self.producer.seal(typical_spec(-next_id() - 1))
        if bench_only_skip_device_check:
            self.producer._check_every_signature = False  # records signed on the caller's thread
            device = getattr(self.producer, "_device", None)  # and those the pipeline signs (its own copy)
            if device is not None:
                device.verify = False

    def rate(self, threads: int) -> float:
        return submit_rate(self.producer, self.n, threads, next_id, repeats=1)

    def close(self) -> None:
        self.producer.close()


def summarize(name: str, figures: dict[str, list[float]], raw_arms: list[str], sealed_arms: list[str],
              other_sealed: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Medians per arm, and the median and range of the per-round ratio
    best sealed / best raw; ``other_sealed`` names more groups of sealed arms,
    each given its own ratio against the same raw figures."""
    rounds = len(next(iter(figures.values())))

    def ratios(arms: list[str]) -> list[float]:
        return [max(figures[a][r] for a in arms) / max(figures[a][r] for a in raw_arms) for r in range(rounds)]

    main = ratios(sealed_arms)
    others = {label: ratios(arms) for label, arms in (other_sealed or {}).items()}
    return {"backend": name, "rounds": rounds, "median": {arm: median(v) for arm, v in figures.items()},
            "per_round": figures, "sealed_vs_raw_median": median(main),
            "sealed_vs_raw_range": [min(main), max(main)],
            "other_ratios": {label: [median(v), min(v), max(v)] for label, v in others.items()}}


def print_row(row: dict[str, Any]) -> None:
    lo, hi = row["sealed_vs_raw_range"]
    print(f"  {row['backend']}: {row['rounds']} rounds, medians; sealed/raw {100 * row['sealed_vs_raw_median']:.0f} % "
          f"(per-round range {100 * lo:.0f}–{100 * hi:.0f} %)")
    for label, (mid, lo, hi) in row.get("other_ratios", {}).items():
        print(f"    {label}: sealed/raw {100 * mid:.0f} % (per-round range {100 * lo:.0f}–{100 * hi:.0f} %)")
    for arm, value in row["median"].items():
        print(f"    {arm:<46}{value:>8.0f} /s")
    if "keeps_gil" in row:
        kept = [call for call, keep in row["keeps_gil"].items() if keep]
        print(f"    {'direct path keeps the GIL across':<46}{', '.join(kept) or 'neither call':>8}")
    for arm, (own, child) in row.get("cpu_per_record_us", {}).items():
        print(f"    CPU per record, {arm}: this process {own:.0f} µs, signing process {child:.0f} µs")
    if "swtpm_busy_median" in row:
        print(f"    {'swtpm busy while sealing (CPU / wall)':<46}{100 * row['swtpm_busy_median']:>7.0f} %")
    if "swtpm_cpu_per_sign_median" in row:
        print(f"    {'swtpm CPU per raw signature':<46}{1e6 * row['swtpm_cpu_per_sign_median']:>6.0f} µs")
