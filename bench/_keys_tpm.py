"""swtpm P-256: raw ESAPI signatures/s and sealed records/s through ``Producer``.

``measure_rounds(n, rounds)`` is what ``bench/keys.py`` calls; ``python
bench/_keys_tpm.py [--n 1000] [--rounds 5]`` prints the same row alone.

* raw: ``ESAPI.sign`` in a loop on a private connection, nothing else — the
  floor swtpm itself sets; swtpm's CPU time per raw signature is printed
  (libtpms: 0.44–0.95 ms per ECDSA signature here, with the host's speed);
* sealed: records handed to ``Producer.submit()`` from 1 and 2 threads and
  counted after ``flush()`` (durable in a WAL ledger); the producer queues
  each signature straight on the TPM worker and verifies every one;
* swtpm busy: swtpm's CPU time over the wall time of the sealed arms — how
  much of the time the TPM had work (at 100 % capseal is never what it waits
  for).

The arms run in rounds with a rotating order (``_common.rotating_rounds``);
sealed/raw is the median of the per-round ratios. swtpm is started by
``hardware/swtpm.sh`` in a temp dir on a free port and stopped at the end.
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
import time
from pathlib import Path
from typing import Any

from _common import SealedArm, median, print_row, rotating_rounds, summarize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KEY_HANDLE, AK_HANDLE = 0x81000101, 0x81000102

os.environ.setdefault("TSS2_LOG", "all+NONE")


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


class RawESAPI:
    """TPM2_Sign through tpm2-pytss's ``ESAPI.sign`` on a private connection."""

    def __init__(self, tcti: str) -> None:
        from tpm2_pytss import ESAPI
        from tpm2_pytss.constants import TPM2_ALG, TPM2_RH, TPM2_ST
        from tpm2_pytss.types import TPMT_SIG_SCHEME, TPMT_TK_HASHCHECK

        self.ectx = ESAPI(tcti)
        self.key = self.ectx.tr_from_tpmpublic(KEY_HANDLE)
        self.scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.ECDSA)
        self.scheme.details.any.hashAlg = TPM2_ALG.SHA256
        self.ticket = TPMT_TK_HASHCHECK(tag=TPM2_ST.HASHCHECK, hierarchy=TPM2_RH.NULL)

    def rate(self, n: int) -> float:
        from tpm2_pytss.types import TPM2B_DIGEST

        digests = [TPM2B_DIGEST(hashlib.sha256(b"%d" % i).digest()) for i in range(n)]
        start = time.perf_counter()
        for d in digests:
            self.ectx.sign(self.key, d, self.scheme, self.ticket)
        return n / (time.perf_counter() - start)

    def close(self) -> None:
        self.ectx.close()


def measure_rounds(n: int, rounds: int) -> dict[str, Any]:
    """The swtpm P-256 row, in the format of ``bench/keys.py``."""
    sys.path.insert(0, str(ROOT))
    from capseal.keys import open_signer
    from capseal.keys.tpm import get_device, provision

    with tempfile.TemporaryDirectory(prefix="capseal-bench-tpm-") as tmp:
        tpm = _SwTPM(os.path.join(tmp, "swtpm"))
        try:
            provision(tpm.tcti, signing_handle=KEY_HANDLE, ak_handle=AK_HANDLE, alg="p256", force=True)
            raw = RawESAPI(tpm.tcti)
            signer = open_signer(f"tpm2:handle=0x{KEY_HANDLE:08x}?tcti={tpm.tcti}")
            sealed = SealedArm(signer, tmp, n)
            busy: list[float] = []
            cpu_per_sign: list[float] = []
            msg = os.urandom(120)

            def raw_arm() -> float:
                cpu0 = tpm.cpu_seconds()
                rate = raw.rate(n)
                cpu_per_sign.append((tpm.cpu_seconds() - cpu0) / n)
                return rate

            def sealed_arm(threads: int) -> float:
                cpu0, t0 = tpm.cpu_seconds(), time.perf_counter()
                rate = sealed.rate(threads)
                busy.append((tpm.cpu_seconds() - cpu0) / (time.perf_counter() - t0))
                return rate

            def sign_arm() -> float:
                start = time.perf_counter()
                for _ in range(n):
                    signer.sign(msg)
                return n / (time.perf_counter() - start)

            try:
                figures = rotating_rounds({"raw ESAPI.sign": raw_arm, "sign()": sign_arm,
                                           "sealed 1 thr": lambda: sealed_arm(1), "sealed 2 thr": lambda: sealed_arm(2)},
                                          rounds)
            finally:
                sealed.close()
                signer.close()
                raw.close()
                get_device(tpm.tcti).close()
        finally:
            tpm.stop()
    row = summarize("swtpm P-256", figures, ["raw ESAPI.sign"], ["sealed 1 thr", "sealed 2 thr"])
    row["swtpm_busy_median"] = median(busy)
    row["swtpm_cpu_per_sign_median"] = median(cpu_per_sign)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="signatures / records per arm and round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print_row(measure_rounds(args.n, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
