"""examples/interpret_consumer.py, imported as a module (its tally, pass_rate and describe)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "examples" / "interpret_consumer.py"
_spec = importlib.util.spec_from_file_location("interpret_consumer", _PATH)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

tally = _module.tally
pass_rate = _module.pass_rate
describe = _module.describe
