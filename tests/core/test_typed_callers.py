"""capseal ships py.typed: a caller type-checked with mypy against capseal as
installed gets capseal's own types for the public names, and no error for
the README's uses of them.

Why a tree of links: the editable install in .venv is found through an
import hook mypy does not run (mypy alone sees ``capseal`` only as a missing
import), so the test lays the packages out as the wheel does (pyproject's
``[tool.setuptools.package-dir]``) and points mypy at that, as
``.ci/mypy.sh`` does for ``make lint``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CALLER = '''
from pathlib import Path

from capseal import Producer, verify_ledger
from capseal.attest import AttestationKey, BatchEvidence, TPMQuoter, attach
from capseal.keys import UnsafeEphemeralSigner


def seal_and_check(path: Path) -> bool:
    with Producer(operator="acme", developer="buyer-agent@1.4", signer=UnsafeEphemeralSigner(), ledger=path) as p:
        planned = p.planned("po-7", effect_type="write_order", request={"sku": "A-100"})
        p.confirmed(planned, response={"order_id": "O-5531"})
    return verify_ledger(path).ok


def evidence(producer: Producer) -> BatchEvidence:
    return attach(producer, TPMQuoter(AttestationKey("tpm2:handle=0x81000102")))


reveal_type(verify_ledger)
reveal_type(attach)
reveal_type(AttestationKey)
'''


def _installed_layout(site: Path) -> None:
    """``capseal`` as the wheel installs it, made of links to the sources."""
    package = site / "capseal"
    package.mkdir(parents=True)
    for item in (ROOT / "sdk").iterdir():
        if item.name != "__pycache__":
            (package / item.name).symlink_to(item)
    (package / "keys").symlink_to(ROOT / "keys")
    (package / "attest").symlink_to(ROOT / "attest")


def test_public_names_have_their_types_for_a_typed_caller(tmp_path: Path) -> None:
    """``from capseal import verify_ledger`` was typed ``object`` (the module's
    lazy ``__getattr__``), so ``verify_ledger(path)`` was a mypy error
    ("object" not callable) for every typed caller; capseal.attest's lazily
    loaded names (attach, AttestationKey, TPMQuoter, …) were ``Any``."""
    _installed_layout(tmp_path / "site")
    (tmp_path / "caller.py").write_text(CALLER)
    (tmp_path / "mypy.ini").write_text("[mypy]\n")  # not the project's: it ignores missing imports
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--follow-imports=silent",
         "--cache-dir", str(tmp_path / "cache"), "caller.py"],
        cwd=tmp_path, env={"MYPYPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    revealed = [line.split("Revealed type is ", 1)[1] for line in out.splitlines() if "Revealed type is" in line]
    assert len(revealed) == 3, out
    assert "-> capseal.audit.LedgerReport" in revealed[0]
    assert "-> capseal.attest.batch.BatchEvidence" in revealed[1]
    assert "-> capseal.attest.tpm.AttestationKey" in revealed[2]
