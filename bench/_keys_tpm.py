"""swtpm P-256: raw ESAPI signatures/s and sealed records/s through ``Producer``.

``run(n) -> [(label, signs_per_s, sealed_per_s)]`` is what ``bench/keys.py``
calls; ``python bench/_keys_tpm.py [--n 2000]`` prints the same rows plus the
detail behind them (capseal ``sign()`` rate, swtpm CPU per signature).

* raw ESAPI: ``ESAPI.sign`` in a loop on a private connection, nothing else —
  the floor swtpm itself sets (libtpms spends ~0.6–0.9 ms of CPU per ECDSA
  signature, so ~1,100–1,600/s on an idle core);
* sealed: records handed to ``Producer.submit()`` from 1 and 2 threads and
  counted after ``flush()`` (durable in a WAL ledger). The producer verifies
  every device signature. With two threads one thread's canonicalisation,
  checks and ledger work run while the other's signature is in the TPM (the
  TPM worker releases the GIL while it waits on the socket).
* the last row repeats 2 threads with ``sys.setswitchinterval(0.0005)``
  (restored afterwards): the TPM worker then gets the GIL back sooner after
  each signature. An operator setting, labelled as such; capseal never sets it.

The machine is shared (2 cores, other work running), so each figure is the
best of a few runs; swtpm needs one core to itself at these rates.

swtpm is started by ``hardware/swtpm.sh`` in a temp dir on a free port and
stopped at the end.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import argparse
import hashlib
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
KEY_HANDLE, AK_HANDLE = 0x81000101, 0x81000102

os.environ.setdefault("TSS2_LOG", "all+NONE")


spec = typical_spec  # the same capsule as bench/seal.py


def _best(fn: Callable[[], float], repeats: int) -> float:
    return max(fn() for _ in range(repeats))


class _SwTPM:
    def __init__(self, state: str) -> None:
        out = subprocess.run([str(ROOT / "hardware" / "swtpm.sh"), "start", state], check=True,
                             capture_output=True, text=True).stdout
        env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        self.state, self.tcti, self.pid = state, env["TCTI"], int(env["SWTPM_PID"])

    def cpu_seconds(self) -> float:
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            return float("nan")

    def stop(self) -> None:
        subprocess.run([str(ROOT / "hardware" / "swtpm.sh"), "stop", self.state], check=False, capture_output=True)


def raw_esapi_rate(tcti: str, n: int) -> float:
    """TPM2_Sign through tpm2-pytss's ESAPI.sign on a private connection."""
    from tpm2_pytss import ESAPI
    from tpm2_pytss.constants import TPM2_ALG, TPM2_RH, TPM2_ST
    from tpm2_pytss.types import TPM2B_DIGEST, TPMT_SIG_SCHEME, TPMT_TK_HASHCHECK

    ectx = ESAPI(tcti)
    try:
        key = ectx.tr_from_tpmpublic(KEY_HANDLE)
        scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.ECDSA)
        scheme.details.any.hashAlg = TPM2_ALG.SHA256
        ticket = TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL)
        digests = [TPM2B_DIGEST(hashlib.sha256(b"%d" % i).digest()) for i in range(n)]

        def once() -> float:
            start = time.perf_counter()
            for d in digests:
                ectx.sign(key, d, scheme, ticket)
            return n / (time.perf_counter() - start)

        return _best(once, 3)
    finally:
        ectx.close()


def signer_rate(signer: Any, n: int) -> float:
    msg = os.urandom(120)  # a COSE Sig_structure over a capsule id is ~120 bytes

    def once() -> float:
        start = time.perf_counter()
        for _ in range(n):
            signer.sign(msg)
        return n / (time.perf_counter() - start)

    return _best(once, 2)


def sealed_rate(signer: Any, ledger: str, n: int, threads: int, repeats: int = 2) -> float:
    """Durable records per second: ``threads`` threads submit n records in all, then flush."""
    from capseal import Producer

    counter = iter(range(10**9))
    lock = threading.Lock()

    def next_id() -> int:
        with lock:
            return next(counter)

    with Producer("acme", "bench-agent@1", signer, ledger) as producer:
        producer.seal(spec(-1))  # the epoch boundary and first commit are not measured
        return submit_rate(producer, n, threads, next_id, repeats)


def measure(n: int) -> dict[str, Any]:
    """Every figure, in one swtpm session."""
    sys.path.insert(0, str(ROOT))
    from capseal.keys import open_signer
    from capseal.keys._tpm import provision
    from capseal.keys._tpm_device import get_device

    with tempfile.TemporaryDirectory(prefix="capseal-bench-tpm-") as tmp:
        tpm = _SwTPM(os.path.join(tmp, "swtpm"))
        try:
            provision(tpm.tcti, signing_handle=KEY_HANDLE, ak_handle=AK_HANDLE, alg="p256", force=True)
            cpu0 = tpm.cpu_seconds()
            raw = raw_esapi_rate(tpm.tcti, n)
            swtpm_ms = 1000 * (tpm.cpu_seconds() - cpu0) / (3 * n)
            signer = open_signer(f"tpm2:handle=0x{KEY_HANDLE:08x}?tcti={tpm.tcti}")
            try:
                sign_rate = signer_rate(signer, n)
                sealed_1 = sealed_rate(signer, os.path.join(tmp, "l1.db"), n, 1)
                sealed_2 = sealed_rate(signer, os.path.join(tmp, "l2.db"), n, 2)
                before = sys.getswitchinterval()
                sys.setswitchinterval(0.0005)
                try:
                    sealed_2_tuned = sealed_rate(signer, os.path.join(tmp, "l3.db"), n, 2)
                finally:
                    sys.setswitchinterval(before)
            finally:
                signer.close()
                get_device(tpm.tcti).close()
        finally:
            tpm.stop()
    return {"n": n, "raw_esapi_signs_per_s": raw, "swtpm_cpu_ms_per_sign": swtpm_ms,
            "capseal_sign_per_s": sign_rate, "sealed_1t_per_s": sealed_1, "sealed_2t_per_s": sealed_2,
            "sealed_2t_switch_0p5ms_per_s": sealed_2_tuned}


def rows_of(m: dict[str, Any]) -> list[tuple[str, float, float]]:
    raw = m["raw_esapi_signs_per_s"]
    return [
        ("swtpm P-256, 1 thread", raw, m["sealed_1t_per_s"]),
        ("swtpm P-256, 2 threads", raw, m["sealed_2t_per_s"]),
        ("swtpm P-256, 2 thr, GIL switch 0.5 ms", raw, m["sealed_2t_switch_0p5ms_per_s"]),
    ]


def run(n: int) -> list[tuple[str, float, float]]:
    """Rows for bench/keys.py: (label, raw ESAPI signs/s, sealed records/s)."""
    return rows_of(measure(n))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="signatures / records per measurement")
    args = ap.parse_args(argv)
    m = measure(args.n)
    print(f"swtpm P-256, n={m['n']}, best of runs; sealed = durable in the ledger (submit + flush), "
          "every device signature verified by the producer")
    print(f"  raw ESAPI TPM2_Sign:        {m['raw_esapi_signs_per_s']:>7.0f} signs/s "
          f"(swtpm CPU {m['swtpm_cpu_ms_per_sign']:.2f} ms per signature)")
    print(f"  capseal TPMSigner.sign():   {m['capseal_sign_per_s']:>7.0f} signs/s (through the TPM worker thread)")
    print(f"  {'label':<40}{'signs/s':>10}{'sealed/s':>10}{'sealed/raw':>12}")
    for label, signs, sealed in rows_of(m):
        print(f"  {label:<40}{signs:>10.0f}{sealed:>10.0f}{100 * sealed / signs:>11.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
