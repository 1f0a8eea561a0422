"""What capseal leaves of the host application's environment and output:
importing capseal (and using its TPM backend) changes nothing in
``os.environ`` (``TSS2_LOG`` is the application's, and the TSS reads it),
yet an expected miss (a key looked for at an empty handle) prints nothing
to stderr; and no message or hint points at a file of the repository, which
a pip user does not have. Against a real swtpm."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from capseal.errors import KeyURIError
from capseal.keys.pkcs11 import parse_pkcs11_uri, resolve_module
from capseal.keys.provision import create_key, list_keys
from capseal.keys.tpm import unreachable_fix

ROOT = Path(__file__).resolve().parents[3]
KEY = 0x81000F03  # this module's own handle on the session swtpm

_SCRIPT = r"""
import os, sys
before = dict(os.environ)
import capseal, capseal.keys, capseal.attest
assert dict(os.environ) == before, "import capseal, capseal.keys, capseal.attest changed os.environ"
from capseal.errors import KeyNotFoundError
from capseal.keys import open_signer
import capseal.attest.tpm
from capseal.keys.tpm import TPMSigner, get_device  # every leaf of the TPM backend loads
tcti = sys.argv[1]
with open_signer(f"tpm2:handle={sys.argv[2]}?tcti={tcti}") as signer:
    signer.sign(b"m")
try:
    open_signer(f"tpm2:handle=0x81000f7f?tcti={tcti}")
except KeyNotFoundError:
    pass
else:
    raise AssertionError("a key at an empty handle opened")
changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
assert not changed, f"using the TPM backend changed os.environ: {sorted(changed)}"
print("ok")
"""


def test_capseal_leaves_tss2_log_to_the_application_and_prints_nothing_on_a_miss(swtpm: Any) -> None:
    if not [k for k in list_keys(f"tpm2:?tcti={swtpm.tcti}") if k.get("handle") == f"0x{KEY:08x}"]:
        create_key(f"tpm2:handle=0x{KEY:08x}?tcti={swtpm.tcti}", "p256").close()
    env = {k: v for k, v in os.environ.items() if k != "TSS2_LOG"}  # the test suite's own setting left out
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, swtpm.tcti, f"0x{KEY:08x}"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    # with TSS2_LOG unset the TSS prints its errors: a handle capseal looks up is asked for first
    assert proc.stderr == "", proc.stderr


def _message_strings(path: Path) -> list[str]:
    """String constants of a module that are not docstrings (messages, hints, help)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docstrings]


def test_no_message_points_at_a_file_of_the_repository() -> None:
    offenders = []
    for folder in ("keys", "sdk", "attest"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for text in _message_strings(path):
                if "hardware/" in text or "README" in text or "tpm.md" in text:
                    offenders.append(f"{path.relative_to(ROOT)}: {text[:80]!r}")
    assert not offenders, offenders
    hint = unreachable_fix("swtpm:host=127.0.0.1,port=2321")
    assert "swtpm socket --tpm2" in hint and "hardware/" not in hint
    try:
        resolve_module(parse_pkcs11_uri("pkcs11:token=agents"))
    except KeyURIError as exc:
        assert "/usr/lib/softhsm/libsofthsm2.so" in exc.hint and "hardware/" not in exc.hint
    else:
        raise AssertionError("a URI that names no module resolved")
