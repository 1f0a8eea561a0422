"""The boundary: no import cycles among capseal's modules, and a private
module (its name, or a package on its path, starts with ``_``) is imported
only by its own public package — never by another package of capseal (the
CLI and the core included), nor by the examples. Read from the sources'
import statements (function-level and type-checking imports count)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"capseal": ROOT / "sdk", "capseal.keys": ROOT / "keys", "capseal.attest": ROOT / "attest"}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()
PACKAGES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _private(name: str) -> bool:
    return any(p.startswith("_") and not p.startswith("__") for p in name.split("."))


def owner(name: str) -> str:
    """The nearest public package a module belongs to (capseal._internal.sealing -> capseal)."""
    parts = name.split(".")
    private = [i for i, part in enumerate(parts) if _private(part)]
    if private:  # everything from the first private name on belongs to the package above it
        parts = parts[: private[0]]
    while len(parts) > 1 and ".".join(parts) not in PACKAGES:
        parts.pop()
    return ".".join(parts)


def imports(name: str, path: Path) -> Iterator[str]:
    here = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here.split(".")
            if node.level > 1:
                base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else [])) if node.level else (node.module or "")
            for alias in node.names:
                yield f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module


def _edges() -> dict[str, set[str]]:
    return {name: {t for t in imports(name, path) if t in MODULES and t != name} for name, path in MODULES.items()}


def test_no_module_imports_another_packages_private_module() -> None:
    crossings = sorted(f"{name} -> {target}" for name, targets in _edges().items() for target in targets
                       if _private(target) and owner(target) != owner(name))
    assert crossings == []


def test_every_import_of_capseal_names_a_module_that_exists() -> None:
    """A module moved or renamed leaves no import of its old path behind: a
    function-level import of one fails only when its function runs (and a
    verifier catching ImportError would report a check it skipped)."""
    dangling = sorted(f"{name} -> {target}" for name, path in MODULES.items() for target in imports(name, path)
                      if target.startswith("capseal.") and target not in MODULES)
    assert dangling == []


def test_the_examples_use_only_public_modules() -> None:
    for path in sorted((ROOT / "examples").glob("*.py")):
        private = [t for t in imports("examples", path) if t.startswith("capseal") and _private(t)]
        assert private == [], f"{path.name}: {private}"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), less a
    package ``__init__`` and its own child re-exporting each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [c for c in found if not (len(c) == 2 and any(a in PACKAGES and b.startswith(a + ".")
                                                         for a, b in (c, c[::-1])))]


def test_no_import_cycles() -> None:
    assert cycles(_edges()) == []


def test_the_checker_sees_a_crossing_and_a_cycle() -> None:
    """The checks can fail: the rules read a known crossing and a known
    cycle in synthetic edges as such."""
    assert owner("capseal.keys._pkcs11_session") == "capseal.keys"
    assert owner("capseal._internal.sealing") == "capseal"
    assert owner("capseal._internal.cli.seal") == "capseal"
    assert owner("capseal.keys.tpm._device") == "capseal.keys.tpm"
    assert _private("capseal._internal.sealing") and not _private("capseal.keys.custody")
    assert owner("capseal.cli") != owner("capseal.keys._pin")
    synthetic = {"capseal.producer": {"capseal.ledger._commit"}, "capseal.ledger._commit": {"capseal.producer"}}
    assert cycles(synthetic) == [["capseal.ledger._commit", "capseal.producer"]]
    assert cycles({"capseal.a": {"capseal.b"}, "capseal.b": set()}) == []
