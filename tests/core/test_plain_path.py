"""The plain-path switch: with ``CAPSEAL_NO_DIRECT=1`` the sealer serializes
the plain way (canonical_bytes, json.loads, the row from the record), and
the ledger rows are the same bytes as the one-walk path writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_SEAL = r"""
import sys
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from capseal import Producer
from capseal._internal import sealing
from capseal.keys import SoftwareSigner

key = SoftwareSigner(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
specs = [
    {"action_id": "a-1", "action_type": "decide",
     "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "executed"},
     "effect": {"status": "confirmed", "type": "write_order", "response_digest": "b" * 64,
                "effect_attestation": "gate_executed"}},
    {"action_id": "a-2 \u00e9\U0001f600", "action_type": "fyi",
     "x-ext": {"\U0001f600k": [1, {"\ue000": None, "a": True}], "capsule": "", "key": -9007199254740991}},
]
with Producer("acme", "plain@1", key, sys.argv[1], epoch_id="epoch-1", clock=lambda: "2026-12-01T00:00:00Z") as p:
    print(sealing.PLAIN_PATH)
    for spec in specs:
        record = p.seal(spec)
        print(p.ledger.entry(record.capsule_id).body.hex())
"""


def _rows(tmp_path: Path, name: str, plain: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "CAPSEAL_NO_DIRECT"}
    if plain:
        env["CAPSEAL_NO_DIRECT"] = "1"
    out = subprocess.run([sys.executable, "-c", _SEAL, str(tmp_path / name)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == str(plain)
    return lines[1:]


def test_the_plain_path_writes_the_same_rows(tmp_path: Path) -> None:
    plain, direct = _rows(tmp_path, "plain.db", True), _rows(tmp_path, "direct.db", False)
    assert len(plain) == 2
    assert plain == direct


_FLAGS = r"""
import importlib
from capseal.keys.direct import direct_calls_allowed
flags = [getattr(importlib.import_module(m), a) for m, a in
         [("capseal.envelope", "_PLAIN_PATH"), ("capseal.verify", "_PLAIN_PATH"), ("capseal._internal.sealing", "PLAIN_PATH")]]
print(*flags, not direct_calls_allowed())
"""


def test_every_fast_path_reads_the_switch_the_same_way() -> None:
    """The sealer's, the envelope's and the verifier's fast paths go off for
    the same values of ``CAPSEAL_NO_DIRECT`` as the backends' (any value but
    empty or ``0``)."""
    for value, plain in (("1", True), ("yes", True), ("0", False), ("", False)):
        env = {**os.environ, "CAPSEAL_NO_DIRECT": value}
        out = subprocess.run([sys.executable, "-c", _FLAGS], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(plain)] * 4, (value, out.stdout)
