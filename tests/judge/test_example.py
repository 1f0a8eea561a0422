"""examples/judge_three_ways.py runs (software key, temp ledger) and prints the
three judgment records and what a verifier says of each."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "judge_three_ways.py"


def test_judge_three_ways_runs_and_prints(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = proc.stdout
    act = re.search(r"^act capsule ([0-9a-f]{64}) sealed", out, re.M)
    assert act is not None
    sections = {
        "1 rules (tier recomputed)": ("judge:evidence-result/v0", "derived_metric"),
        "2 judge model (tier judged)": ("judge:evaluation-report/v1", "semantic_judgment"),
        "3 blind humans + calibration (k of n)": ("judge:calibration-summary/v1", "derived_metric"),
    }
    for title, (record_type, etype) in sections.items():
        block = out.split(f"== {title}\n", 1)[1]
        cited = act[1][:12] if title[0] in "12" else "[0-9a-f]{12}"  # the act; the calibration cites the report and ratings
        assert re.match(rf"record {re.escape(record_type)}  id=[0-9a-f]{{64}}\n  epistemic_type={etype}  links=\['cites:{cited}", block), block[:300]
        verdict = re.search(r"^verifier: ok=(\w+) signature=(\w+) signer=([0-9a-f]{16}) pinned=(\w+) type=(\w+) findings=\[\]$", block, re.M)
        assert verdict is not None and verdict.groups()[:2] == ("True", "authored") and verdict[4] == "True" and verdict[5] == etype
    assert '"tier": "recomputed"' in out and '"judge_purpose": "method"' in out and '"blind": true' not in out  # bodies are printed
    assert "recompute(): same record digest = True" in out
    assert len(re.findall(r"human rating [0-9a-f]{16} blind=True label=met epistemic_type=human_report verifier ok=True", out)) == 2
    assert "agreement 2 of 2, drift 0 of 1" in out
    assert "confidence" in out and '"confidence"' not in out  # returned by the model, never recorded
    assert "act capsule unchanged after judging: True (digest True)" in out
    assert re.search(r"verify_ledger: ok=True pinned=True \{'records': 14, 'ok': 14, 'not_ok': 0, 'signature:authored': 14\}", out)


def test_judge_three_ways_keeps_its_ledger_when_asked(tmp_path: Path) -> None:
    ledger = tmp_path / "judged.db"
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--ledger", str(ledger)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    from capseal.audit import verify_ledger

    report = verify_ledger(ledger)
    assert report.ok and {r.record_type for r in report.records} >= {
        "capsule", "judge:artifact/v1", "judge:evidence-result/v0", "judge:evaluation-report/v1",
        "judge:human-rating/v1", "judge:calibration-summary/v1",
    }
    count = len(report.records)
    again = subprocess.run([sys.executable, str(EXAMPLE), "--ledger", str(ledger)], capture_output=True, text=True, timeout=120)
    # a second run would seal the same act again: refused up front, not a traceback half-way
    assert again.returncode == 2 and "judged.db exists; give a new file" in again.stderr and "Traceback" not in again.stderr
    assert len(verify_ledger(ledger).records) == count
