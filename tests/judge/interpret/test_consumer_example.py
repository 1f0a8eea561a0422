"""examples/interpret_consumer.py (the published consumer example, only its file
loading added) runs over ``capseal interpret --json`` output of a ledger holding evaluation
reports, an adjudication, human ratings, a calibration summary, an Evidence Result and
referee rows, and prints a full reading including every recorded check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "interpret_consumer.py"
CLI = str(Path(sys.executable).parent / "capseal")


def test_interpret_consumer_runs_over_capseal_interpret_output(sealed: Any, tmp_path: Path) -> None:
    out = tmp_path / "readings.json"
    proc = subprocess.run([CLI, "interpret", str(sealed.path), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out.write_text(proc.stdout)
    items = json.loads(proc.stdout)["items"]
    types = {i["recordType"] for i in items}
    assert {"judge:evaluation-report/v1", "judge:adjudication/v1", "judge:human-rating/v1", "judge:evidence-result/v0",
            "referee:book-row"} <= types
    run = subprocess.run([sys.executable, str(EXAMPLE), str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    for item in items:  # every item described, in order, with its reading and support
        i = item["interpretation"]
        assert f"{item['itemSlug']}: {i['reading']} ({i['readingSupport']}); decided by " in run.stdout
        assert f"  {i['summary']}" in lines
    recorded = [f"      [{'x' if c['passed'] else ' '}] {c['name']}: {c['detail']}"
                for item in items for s in [item["interpretation"]["root"], *item["interpretation"]["stages"]]
                for j in s["judges"] for c in j["checks"]]
    printed = [line for line in lines if line.startswith("      [")]
    assert printed == recorded and len(printed) >= 14  # every recorded check, once per seat
    assert "      [ ] sufficiency: GAP" in printed and "      [x] blind: blind: true" in printed
    assert lines[-2] == "tally: {'excluded': 1, 'instrumentFailures': 2, 'nonPasses': 4, 'passes': 5}"
    assert lines[-1] == f"pass rate: {5 / 9}"


def test_interpret_consumer_reads_standard_input(sealed: Any) -> None:
    proc = subprocess.run([CLI, "interpret", str(sealed.path), "--json", "--id", "er-A-1009"], capture_output=True, text=True, timeout=120)
    run = subprocess.run([sys.executable, str(EXAMPLE), "-"], input=proc.stdout, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-2:] == ["tally: {'nonPasses': 1, 'passes': 1}", "pass rate: 0.5"]
