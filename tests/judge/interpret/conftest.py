"""Fixtures for the interpret tests: the stored jury verdicts and a sealed ledger of every judgment kind."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capseal.keys import UnsafeEphemeralSigner

from .world import Sealed, build, stored_verdict

EXAMPLE_ONE = "example-0-17-cascade.verdict.json"
EXAMPLE_TWO = "bud-ddd-9b68576e-review-derived-brief.verdict.json"
A068E50A = "bud-ddd-a068e50a-merged-spring-batch.verdict.json"
A36A7598C = "bud-ddd-36a7598c-merged-spring-batch.verdict.json"
BUD_EVAL = "bud-eval-7e423de9-rest-service-fewshot.verdict.json"
ACP_13 = "pr-review-polyglot-20260820-210100-grok-ACP-13.verdict.json"
BOUNDARY = "boundary-rejection-0.17.json"
COMPOSITE = "composite-verdict-0.17.json"
ALL_STORED = (EXAMPLE_ONE, EXAMPLE_TWO, A068E50A, A36A7598C, BUD_EVAL, ACP_13, BOUNDARY, COMPOSITE)


def stored(name: str) -> Any:
    """A fresh parsed copy of a stored verdict (a test may damage it)."""
    return copy.deepcopy(stored_verdict(name))


@pytest.fixture(scope="session")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sealed]:
    """A ledger of every judgment kind capseal writes (read-only for the tests that share it)."""
    path: Path = tmp_path_factory.mktemp("interpret") / "judged.db"
    yield build(path, UnsafeEphemeralSigner())
