"""The rule that makes the boundary visible: a package's public modules are
exactly those its ``__init__`` docstring lists (as ``name`` or
:mod:`package.name`); every other module of it has a leading underscore."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"capseal": ROOT / "sdk", "capseal.keys": ROOT / "keys", "capseal.attest": ROOT / "attest"}
#: packages whose folder sits elsewhere: listed by their parent, checked on their own
ELSEWHERE = {"capseal": {"keys", "attest"}}


def _packages() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for name, folder in FOLDERS.items():
        for init in folder.rglob("__init__.py"):
            parts = init.parent.relative_to(folder).parts
            if any(p.startswith("_") for p in parts):
                continue
            found[".".join([name, *parts])] = init.parent
    return found


def _children(folder: Path) -> set[str]:
    names = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    return {n for n in names if not n.startswith("_")}


def _listed(package: str, folder: Path) -> set[str]:
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    plain = set(re.findall(r"``([a-z_][a-z0-9_]*)``", doc))
    qualified = {m.split(".")[-1] for m in re.findall(r":mod:`~?" + re.escape(package) + r"\.([a-z0-9_.]+)`", doc)}
    return plain | qualified


PACKAGES = _packages()


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_a_packages_docstring_lists_each_public_module_it_has(package: str) -> None:
    folder = PACKAGES[package]
    public = _children(folder) | ELSEWHERE.get(package, set())
    missing = sorted(public - _listed(package, folder))
    assert missing == [], f"{package}: public modules its docstring does not list: {missing}"


def test_the_check_reads_a_listing() -> None:
    assert {"producer", "aio", "ledger", "cli"} <= _listed("capseal", PACKAGES["capseal"])
    assert "recorder" in _listed("capseal.integrations", PACKAGES["capseal.integrations"])
