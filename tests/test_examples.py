"""Every script in examples/ runs, and what it prints is checked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: example file -> regular expressions its output must match (each must appear)
EXPECTED: dict[str, list[str]] = {
    "demo.py": [
        r"sealed   po-7 +planned +effect_mode=not_applicable",
        r"sealed   po-7/confirmed +confirmed +effect_mode=confirmed +ledger_mode=chained",
        r"sealed   pay-9 +denied",
        r"sealed   pay-10/resolved +resolved .*ledger_mode=chained",
        r"refused  overclaim: assurance\.attestation_mode='anchored' overclaims",
        r"refused  float: floating-point value 59\.7 at \$\[\"x-invoice\"\]\.amount",
        r"ledger   capsules\.db: 7 records \(nothing written for the refusals\)",
        r"evidence hardware_evidence=None",
        r"capseal  verify_ledger: ok=True, 7 records, signatures 7 authored",
        r"reference agent-action-capsule 0\.12\.0: ok=True, 7/7 signatures authored",
    ],
    "quickstart.py": [
        r"^[0-9a-f]{64} \{'attestation_mode': 'self_attested', 'effect_mode': 'confirmed', 'ledger_mode': 'chained'\}$",
        r"^hardware_evidence: None$",
        r"^ledger ok: True$",
    ],
}


def _scripts() -> list[str]:
    return sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


#: examples whose output is checked by a dedicated test file (which must name them)
CHECKED_ELSEWHERE: dict[str, str] = {"judge_three_ways.py": "judge"}


def test_every_example_has_expectations() -> None:
    tests_dir = Path(__file__).parent
    for name in _scripts():
        if name in EXPECTED:
            continue
        where = CHECKED_ELSEWHERE.get(name)
        assert where is not None, f"{name} has no output checks"
        checkers = [p for p in (tests_dir / where).rglob("test_*.py") if name in p.read_text()]
        assert checkers, f"{name} is said to be checked in tests/{where}, but no test there runs it"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_and_prints(name: str, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for pattern in EXPECTED[name]:
        assert re.search(pattern, proc.stdout, re.M), f"{name}: {pattern!r} not in output:\n{proc.stdout}"
