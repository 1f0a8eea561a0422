"""Fixtures for the referee tests: a world of nodes with their own keys."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .world import World


@pytest.fixture()
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.close()
