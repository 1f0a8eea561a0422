"""A token reached through a proxy module: OpenSC's ``pkcs11-spy``, a real
PKCS#11 module that forwards every call to the module named in ``PKCS11SPY``
(here SoftHSM2) and logs it.

Why it matters: capseal lets the direct ``C_Sign`` path keep the GIL across
quick calls only for SoftHSM2's own module (keys/_pkcs11_fast.py). Behind a
proxy the token still says "SoftHSM project", but the module in this process
is the proxy, which may block in ways SoftHSM2 never does (p11-kit's remote
proxy talks to another process). So: every call releases the GIL, the token
is still reported as a software device (that is what it is), signatures go
through the proxy, and sealing works.

Run in a child process: the proxy loads SoftHSM2 a second time into the same
process otherwise, and module state (initialisation, login) is per process.
pkcs11-spy writes every argument to its log, the PIN of ``C_Login`` included:
the log stays in the test's temp dir (a debugging tool, never for production)."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from capseal.keys.provision import create_key

_CHILD = r"""
import json, os, sys
from capseal import Producer, verify_ledger
from capseal.keys import open_signer
uri, ledger = sys.argv[1], sys.argv[2]
with open_signer(uri, pin=os.environ["CAPSEAL_TEST_PIN"]) as signer:
    with Producer("acme", "proxy-agent@1", signer, ledger) as producer:
        sealed = [producer.submit({"action_id": f"via-proxy-{i}", "action_type": "fyi"}) for i in range(40)]
        producer.flush()
        seqs = [p.result().seq for p in sealed]
    custody = signer.describe()
    fast = signer.direct_path
    print(json.dumps({
        "fast": fast is not None,
        "keeps_gil": fast.keeps_gil if fast is not None else None,
        "probing": [fast.probing["C_SignInit"], fast.probing["C_Sign"]] if fast is not None else None,
        "software_device": custody.get("software_device"),
        "manufacturer": custody.get("device", {}).get("manufacturer"),
        "seqs": seqs,
        "ledger_ok": verify_ledger(ledger).ok,
    }))
"""


def _spy() -> str:
    """Where opensc-pkcs11 put it (the same globs as hardware/install-deps.sh)."""
    for path in sorted(glob.glob("/usr/lib/*/pkcs11-spy.so") + glob.glob("/usr/lib/*/pkcs11/pkcs11-spy.so")):
        return path
    raise AssertionError("OpenSC's pkcs11-spy.so is not installed; run `make test` (it installs opensc-pkcs11)")


def test_a_token_behind_a_proxy_module_never_keeps_the_gil(softhsm: Any, tmp_path: Path) -> None:
    spy = _spy()
    with create_key(softhsm.uri(f"proxy-ed-{os.urandom(3).hex()}"), "ed25519", pin=softhsm.pin) as direct:
        label = direct.uri.split("object=")[1].split(";")[0].split("?")[0]
    log = tmp_path / "spy.log"
    env = {**os.environ, "PKCS11SPY": softhsm.module, "PKCS11SPY_OUTPUT": str(log),
           "SOFTHSM2_CONF": softhsm.conf, "CAPSEAL_TEST_PIN": softhsm.pin}
    env.pop("CAPSEAL_NO_DIRECT", None)  # the direct path's GIL choice behind a proxy is what is tested
    uri = f"pkcs11:token={softhsm.label};object={label}?module-path={spy}"
    proc = subprocess.run([sys.executable, "-c", _CHILD, uri, str(tmp_path / "l.db")], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the direct path is used, and past its would-be probes every call releases the GIL
    assert out["fast"] is True
    assert out["keeps_gil"] == {"C_SignInit": False, "C_Sign": False}
    assert out["probing"] == [False, False]
    # still SoftHSM2 underneath: reported as the software device it is
    assert out["software_device"] is True and out["manufacturer"] == "SoftHSM project"
    assert out["seqs"] == list(range(2, 42)) and out["ledger_ok"] is True  # the epoch boundary, then 40
    # the signatures went through the proxy (it logged each call), not around it:
    # the self-test, the epoch boundary and the 40 records
    calls = re.findall(r"^\d+: (C_\w+)$", log.read_text(errors="replace"), re.MULTILINE)
    assert calls.count("C_SignInit") == calls.count("C_Sign") == 42
