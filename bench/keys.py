"""Signing backends side by side, in one run: signs/s and sealed records/s.

Rows:
  * software Ed25519 (``UnsafeEphemeralSigner``) — the reference point;
  * SoftHSM2 Ed25519, P-256 and RSA-PSS keys through ``PKCS11Signer``, with the
    raw ``C_Sign`` rate (python-pkcs11 called directly under the same lock, the
    floor the token sets) beside capseal's ``sign()`` and sealed records;
  * TPM rows from ``bench/_keys_tpm.py`` when that file exists
    (``run(n) -> [(label, signs_per_s, sealed_per_s)]``).

"Sealed" means durable in a real ledger file (WAL, fsync on commit): records
are handed over with ``Producer.submit()`` and counted after ``flush()``, from
one thread and from two. Two threads matter for a token: python-pkcs11
releases the GIL inside ``C_Sign``, so one thread's canonicalisation, checks
and ledger work can overlap the other's signature (the PKCS#11 lock still
lets only one call into the module at a time; contended calls are made by
one worker thread, see ``_pkcs11_session._TokenWorker``). One more line
repeats two threads with ``sys.setswitchinterval(0.0005)``, an operator
setting (restored at once) that hands the GIL back sooner after each call.

The producer verifies every signature a device returns (``external_device``,
design §3.3): for Ed25519 one verify, about 0.13 ms. One extra line measures
SoftHSM2 Ed25519 with that check skipped — in this benchmark only, through a
wrapper marked as such — so its cost is visible; capseal itself never skips it.

The SoftHSM2 token is created by ``hardware/softhsm-token.sh`` in a temp dir.

Usage: python bench/keys.py [--n 1000] [--json]
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import submit_rate, typical_spec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PIN, SO_PIN, LABEL = "bench-pin-1234", "bench-so-5678", "capseal-bench"


spec = typical_spec  # the same capsule as bench/seal.py


def best_rate(fn: Callable[[int], Any], n: int, repeats: int = 3) -> float:
    """Best of ``repeats`` runs of ``fn(i)`` for i in range(n), per second (the machine is shared)."""
    fn(-1)
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(n):
            fn(i)
        best = max(best, n / (time.perf_counter() - start))
    return best


_counter = iter(range(10**12))
_counter_lock = threading.Lock()


def _next() -> int:
    with _counter_lock:
        return next(_counter)


def sealed_rate(signer: Any, tmp: str, n: int, threads: int, repeats: int = 2) -> float:
    """Durable records per second: ``threads`` threads submit n records in all, then flush."""
    from capseal import Producer

    with Producer("acme", "bench-agent@1", signer, os.path.join(tmp, f"l-{_next()}.db")) as producer:
        producer.seal(spec(-_next() - 1))  # the epoch boundary and first commit are not measured
        return submit_rate(producer, n, threads, _next, repeats)


def start_softhsm(tmp: str) -> dict[str, str]:
    out = subprocess.run([str(ROOT / "hardware" / "softhsm-token.sh"), os.path.join(tmp, "softhsm"), LABEL, PIN, SO_PIN],
                         check=True, capture_output=True, text=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    os.environ["SOFTHSM2_CONF"] = env["SOFTHSM2_CONF"]  # read by SoftHSM2 at C_Initialize
    return env


def raw_c_sign_rate(signer: Any, n: int) -> float:
    """python-pkcs11 ``key.sign`` on the signer's own key handle, under the
    process-wide lock, nothing else: what the token itself allows."""
    from capseal.keys._pkcs11_session import P11_LOCK

    ts = signer.token_session
    mech = signer._mech
    msg = os.urandom(120)  # a COSE Sig_structure over a capsule id is ~120 bytes
    payload = mech.prehash(msg).digest() if mech.prehash is not None else msg
    with P11_LOCK:
        key = signer._key(ts, ts.ensure())

    def one(_: int) -> None:
        with P11_LOCK:
            key.sign(payload, mechanism=mech.mechanism, mechanism_param=mech.param)

    return best_rate(one, n)


class _BenchOnlySkipDeviceCheck:
    """Bench-only wrapper: presents a token signer as *not* external, so the
    producer skips its per-signature verify. Used for one labelled line."""

    def __new__(cls, inner: Any) -> Any:
        from capseal.keys import Signer

        class Unchecked(Signer):
            external_device = False
            alg = property(lambda self: inner.alg)
            public_key = property(lambda self: inner.public_key)
            uri = property(lambda self: inner.uri)
            kid = property(lambda self: inner.kid)

            def sign(self, data: bytes) -> Any:
                return inner.sign(data)

            def describe(self) -> dict[str, Any]:
                return inner.describe()

        return Unchecked()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="operations per measurement (RSA uses n/4)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    n = args.n
    rows: list[dict[str, Any]] = []
    extra: dict[str, float] = {}
    msg = os.urandom(120)

    with tempfile.TemporaryDirectory(prefix="capseal-bench-keys-") as tmp:
        start_softhsm(tmp)
        module = next(p for p in ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
                      if os.path.exists(p))
        from capseal.keys import UnsafeEphemeralSigner
        from capseal.keys.provision import create_key

        software = UnsafeEphemeralSigner("EdDSA")
        rows.append({"backend": "software Ed25519", "signs_per_s": best_rate(lambda i: software.sign(msg), n),
                     "raw_c_sign_per_s": None,
                     "sealed_1t_per_s": sealed_rate(software, tmp, n, 1),
                     "sealed_2t_per_s": sealed_rate(software, tmp, n, 2)})

        for name, alg, count in (("SoftHSM2 Ed25519", "ed25519", n), ("SoftHSM2 P-256", "p256", n),
                                 ("SoftHSM2 RSA-PSS 3072", "rsa-pss", max(n // 4, 50))):
            uri = f"pkcs11:token={LABEL};object=bench-{alg}?module-path={module}"
            with create_key(uri, alg, pin=PIN) as signer:
                row: dict[str, Any] = {"backend": name,
                       "raw_c_sign_per_s": raw_c_sign_rate(signer, count),
                       "signs_per_s": best_rate(lambda i: signer.sign(msg), count),
                       "sealed_1t_per_s": sealed_rate(signer, tmp, count, 1),
                       "sealed_2t_per_s": sealed_rate(signer, tmp, count, 2)}
                rows.append(row)
                if alg == "ed25519":
                    unchecked = _BenchOnlySkipDeviceCheck(signer)
                    extra["softhsm_ed25519_sealed_2t_no_device_check_per_s"] = sealed_rate(unchecked, tmp, count, 2)
                    extra["softhsm_ed25519_sealed_1t_no_device_check_per_s"] = sealed_rate(unchecked, tmp, count, 1)
                    # an operator setting, restored at once: a thread coming
                    # back from C_Sign gets the GIL sooner (capseal never sets it)
                    previous = sys.getswitchinterval()
                    sys.setswitchinterval(0.0005)
                    try:
                        extra["softhsm_ed25519_sealed_2t_switch_0_5ms_per_s"] = sealed_rate(signer, tmp, count, 2)
                    finally:
                        sys.setswitchinterval(previous)

    tpm_rows: list[tuple[str, float, float]] = []
    tpm_error = None
    tpm_file = Path(__file__).with_name("_keys_tpm.py")
    if tpm_file.exists():
        try:
            spec_ = importlib.util.spec_from_file_location("_keys_tpm", tpm_file)
            assert spec_ is not None and spec_.loader is not None
            mod = importlib.util.module_from_spec(spec_)
            spec_.loader.exec_module(mod)
            tpm_rows = list(mod.run(n))
        except Exception as exc:  # report, do not hide the other figures
            tpm_error = f"{type(exc).__name__}: {exc}"

    for row in rows:
        raw = row["raw_c_sign_per_s"]
        best_sealed = max(row["sealed_1t_per_s"], row["sealed_2t_per_s"])
        row["sealed_vs_raw"] = best_sealed / raw if raw else None

    if args.json:
        print(json.dumps({"rows": rows, "extra": extra, "tpm": tpm_rows, "tpm_error": tpm_error}, indent=1))
        return 0
    print(f"signing backends, n={n} (RSA n/4), best of runs; sealed = durable in the ledger (submit + flush)")
    print(f"  {'backend':<24}{'raw C_Sign/s':>13}{'sign()/s':>10}{'sealed/s 1 thr':>16}{'sealed/s 2 thr':>16}{'sealed/raw':>12}")
    for row in rows:
        raw = f"{row['raw_c_sign_per_s']:.0f}" if row["raw_c_sign_per_s"] else "—"
        ratio = f"{row['sealed_vs_raw'] * 100:.0f} %" if row["sealed_vs_raw"] else "—"
        print(f"  {row['backend']:<24}{raw:>13}{row['signs_per_s']:>10.0f}{row['sealed_1t_per_s']:>16.0f}"
              f"{row['sealed_2t_per_s']:>16.0f}{ratio:>12}")
    print("  SoftHSM2 Ed25519 without the producer's per-signature device check (bench only; capseal always checks):")
    print(f"    sealed/s 1 thr {extra['softhsm_ed25519_sealed_1t_no_device_check_per_s']:.0f}, "
          f"2 thr {extra['softhsm_ed25519_sealed_2t_no_device_check_per_s']:.0f}")
    print("  SoftHSM2 Ed25519, 2 threads, sys.setswitchinterval(0.0005) (an operator setting; capseal never sets it):")
    print(f"    sealed/s 2 thr {extra['softhsm_ed25519_sealed_2t_switch_0_5ms_per_s']:.0f}")
    if tpm_rows:
        for label, signs, sealed in tpm_rows:
            print(f"  {label:<24}{'':>13}{signs:>10.0f}{sealed:>16.0f}")
    elif tpm_error:
        print(f"  TPM: bench/_keys_tpm.py failed: {tpm_error}")
    else:
        print("  TPM: bench/_keys_tpm.py not present")
    return 0


if __name__ == "__main__":
    sys.exit(main())
