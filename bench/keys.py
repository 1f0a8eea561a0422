"""Signing backends side by side, in one run: signs/s and sealed records/s.

Rows:
  * software Ed25519 (``UnsafeEphemeralSigner``) — the reference point;
  * SoftHSM2 Ed25519, P-256 and RSA-PSS keys through ``PKCS11Signer``;
  * swtpm P-256 (``bench/_keys_tpm.py``).

For each device the figures come from rounds (``--rounds``, default 5), each
round running every arm once, the order rotating (``_common.rotating_rounds``):
this host's speed drifts by a third or more over seconds, so a sealed rate is
only compared with the raw rate of its own round, and the medians are shown.

  * raw: the device alone, nothing else running. For a token, the higher of
    python-pkcs11's ``key.sign`` and the direct ``C_Sign`` capseal uses for
    Ed25519 and ECDSA (``keys/pkcs11/_direct.py``), both under the PKCS#11
    lock — the stricter baseline; for swtpm, ``ESAPI.sign`` on a private
    connection;
  * sealed: durable in a real ledger file (WAL, fsync on commit): records
    handed to ``Producer.submit()`` from one thread and from two, counted after
    ``flush()``; the better of the two is the round's sealed figure;
  * sealed/raw: the median of the per-round ratios, with its range;
  * CPU per record (SoftHSM2 Ed25519 with the signing process): the CPU this
    process (every thread) and the signing process used per record, summed
    over the rounds. On 2 vCPUs the two together bound the sealed rate: at
    best 2 s / (their sum) records per second.

The producer verifies every signature a device returns (design §3 principle 3;
Ed25519 about 0.05 ms with libsodium, 0.1 ms with
cryptography; P-256 about 0.1 ms). For SoftHSM2 Ed25519 one more arm
seals with that check switched off — in this benchmark only, through a private
attribute — so its cost is visible; capseal has no public way to skip it.
capseal makes the Ed25519 check with libsodium when the system has it
(``capseal._sodium``), else with cryptography; when it uses libsodium, one
more arm seals with the check made by cryptography (``bench/_fallback.py``):
the figure of a system without libsodium, in the same run.

The SoftHSM2 token is created by ``hardware/softhsm-token.sh`` in a temp dir;
swtpm is started by ``hardware/swtpm.sh`` on a free loopback port.

Usage: python bench/keys.py [--n 1000] [--rounds 5] [--json]
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from _common import (  # noqa: E402
    LABEL,
    PIN,
    CpuPerRecord,
    SealedArm,
    print_row,
    rotating_rounds,
    start_softhsm,
    summarize,
    typical_spec,
)
from _fallback import cryptography_check  # noqa: E402

from capseal import _sodium  # noqa: E402

spec = typical_spec  # the same capsule as bench/seal.py


def ops_rate(fn: Callable[[], Any], n: int) -> float:
    """``fn()`` n times, per second."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return n / (time.perf_counter() - start)


def best_rate(fn: Callable[[], Any], n: int, repeats: int = 3) -> float:
    """Best of ``repeats`` runs of :func:`ops_rate` (the software row only)."""
    fn()
    return max(ops_rate(fn, n) for _ in range(repeats))


def raw_signers(signer: Any) -> dict[str, Callable[[], Any]]:
    """One raw signature on the signer's own session and key handle, under the
    process-wide lock, nothing else: python-pkcs11's ``key.sign`` and, when
    the mechanism allows, the direct ``C_Sign`` capseal uses."""
    from capseal.keys.pkcs11 import P11_LOCK

    ts = signer.token_session
    mech = signer._mech  # bench: the signer's own mechanism, to time the bare calls it makes
    msg = os.urandom(120)  # a COSE Sig_structure over a capsule id is ~120 bytes
    payload = mech.prehash(msg).digest() if mech.prehash is not None else msg
    with P11_LOCK:
        session = ts.ensure()
        key = signer.key_object(session)

    def python_pkcs11() -> None:
        with P11_LOCK:
            key.sign(payload, mechanism=mech.mechanism, mechanism_param=mech.param)

    out: dict[str, Callable[[], Any]] = {"raw key.sign": python_pkcs11}
    fast = signer.direct_path
    if fast is not None:
        def direct() -> None:
            with P11_LOCK:
                if fast.sign(session.handle, key.handle, payload) is None:
                    raise RuntimeError("direct C_Sign failed")

        out["raw direct C_Sign"] = direct
    return out


def pipelined_rate(signer: Any, n: int) -> float:
    """Signatures per second with n requests queued at once (``begin_sign``), as
    the producer's pipeline queues them on a device with a command queue."""
    msg = os.urandom(120)
    start = time.perf_counter()
    pending = [signer.begin_sign(msg) for _ in range(n)]
    for p in pending:
        p.result()
    return n / (time.perf_counter() - start)


def softhsm_rows(n: int, rounds: int, tmp: str) -> list[dict[str, Any]]:
    start_softhsm(tmp)
    module = next(p for p in ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
                  if os.path.exists(p))
    return [softhsm_row(name, f"pkcs11:token={LABEL};object=bench-{alg}?module-path={module}", alg, count, r, tmp)
            for name, alg, count, r in (("SoftHSM2 Ed25519", "ed25519", n, rounds), ("SoftHSM2 P-256", "p256", n, rounds),
                                        ("SoftHSM2 RSA-PSS 3072", "rsa-pss", max(n // 4, 50), max(3, rounds // 2)))]


def softhsm_row(name: str, uri: str, alg: str, count: int, rounds: int, tmp: str) -> dict[str, Any]:
    from capseal.keys import open_signer
    from capseal.keys.pkcs11 import PKCS11Signer
    from capseal.keys.provision import create_key

    msg = os.urandom(120)
    with create_key(uri, alg, pin=PIN) as signer:
        assert isinstance(signer, PKCS11Signer)
        raws = raw_signers(signer)
        arms: dict[str, Callable[[], float]] = {label: partial(ops_rate, f, count) for label, f in raws.items()}
        arms["sign()"] = lambda: ops_rate(lambda: signer.sign(msg), count)
        opened = [SealedArm(signer, tmp, count)]
        arms["sealed 1 thr"] = lambda: opened[0].rate(1)
        arms["sealed 2 thr"] = lambda: opened[0].rate(2)
        raw_arms, other = list(raws), dict[str, list[str]]()
        process, cpu = None, None
        if alg == "ed25519":
            opened.append(SealedArm(signer, tmp, count, bench_only_skip_device_check=True))
            arms["sealed 1 thr, no device check (bench only)"] = lambda: opened[1].rate(1)
            process = open_signer(uri, pin=PIN, signing_process=True)
            assert isinstance(process, PKCS11Signer)
            # the device through the signing process, nothing else running: one more raw
            # arm, and the stricter baseline whenever it is the faster
            arms["raw via signing process (pipelined)"] = partial(pipelined_rate, process, count)
            raw_arms.append("raw via signing process (pipelined)")
            opened.append(SealedArm(process, tmp, count))
            arms["sealed 1 thr, signing process"] = lambda: opened[2].rate(1)
            arms["sealed 2 thr, signing process"] = lambda: opened[2].rate(2)
            measured = ["raw via signing process (pipelined)", "sealed 1 thr, signing process",
                        "sealed 2 thr, signing process"]
            if _sodium.verifier() is not None:
                opened.append(SealedArm(process, tmp, count))
                arms[FALLBACK_ARM] = lambda: _with_cryptography(opened[3])
                measured.append(FALLBACK_ARM)
                other["with signing_process=True, cryptography's check (no libsodium)"] = [FALLBACK_ARM]
            child = process.signing_process.child if process.signing_process is not None else None
            assert child is not None, "signing_process=True: the signing process runs"
            cpu = CpuPerRecord(child.proc.pid)
            for label in measured:
                arms[label] = cpu.wrap(label, arms[label], count)
            other["with signing_process=True"] = ["sealed 1 thr, signing process", "sealed 2 thr, signing process"]
        try:
            figures = rotating_rounds(arms, rounds)
        finally:
            for arm in opened:
                arm.close()
            if process is not None:
                process.close()
        row = summarize(name, figures, raw_arms, ["sealed 1 thr", "sealed 2 thr"], other)
        if cpu is not None:
            row["cpu_per_record_us"] = cpu.per_record_us()
        if signer.direct_path is not None:
            row["keeps_gil"] = signer.direct_path.keeps_gil
    return row


FALLBACK_ARM = "sealed 1 thr, signing process, cryptography's check"


def _with_cryptography(arm: SealedArm) -> float:
    """One sealed run with the device check made by cryptography, as on a
    system without libsodium (``bench/_fallback.py``)."""
    with cryptography_check():
        return arm.rate(1)


def software_row(n: int, tmp: str) -> dict[str, Any]:
    from capseal.keys import UnsafeEphemeralSigner

    software = UnsafeEphemeralSigner("EdDSA")
    msg = os.urandom(120)
    sealed = SealedArm(software, tmp, n)
    try:
        return {"backend": "software Ed25519", "sign()": best_rate(lambda: software.sign(msg), n),
                "sealed 1 thr": max(sealed.rate(1) for _ in range(2)),
                "sealed 2 thr": max(sealed.rate(2) for _ in range(2))}
    finally:
        sealed.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="operations per arm and round (RSA uses n/4)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="capseal-bench-keys-") as tmp:
        software = software_row(args.n, tmp)
        rows = softhsm_rows(args.n, args.rounds, tmp)
    import _keys_tpm  # noqa: E402  (a sibling script: swtpm rows)

    rows.append(_keys_tpm.measure_rounds(args.n, args.rounds))

    if args.json:
        print(json.dumps({"software": software, "rows": rows}, indent=1))
        return 0
    print(f"signing backends, n={args.n} per arm and round; sealed = durable in the ledger (submit + flush), "
          "every device signature verified")
    print(f"  software Ed25519 (best of runs): sign() {software['sign()']:.0f}/s, sealed "
          f"{software['sealed 1 thr']:.0f}/s from 1 thread, {software['sealed 2 thr']:.0f}/s from 2")
    print(f"  the producer's Ed25519 check of device signatures: {_sodium.ed25519_check()}"
          + ("" if _sodium.verifier() is not None else " (no libsodium: the arm comparing the two was left out)"))
    for row in rows:
        print_row(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
