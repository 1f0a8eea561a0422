"""What a pip user gets: the sdist and wheel built from a clean copy of the
source tree, and the wheel installed with no extras into a fresh virtual
environment outside the repository.

The wheel must carry the licence, the vendored schemas' provenance and the
type marker; the sdist must carry a complete, runnable test tree (or none);
the installed package must run the quickstart, answer ``capseal --version``,
import every public module, and name the missing extra for ``pkcs11:`` and
``tpm2:`` keys, for ``tpm provision`` and for each agent-framework adapter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

from capseal import __version__

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

#: what is never part of a clean copy of the source tree
_NOT_SOURCE = {".git", ".venv", "build", "dist", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
               ".hypothesis", ".work"}


def _source_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in _NOT_SOURCE or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and not path.name.endswith((".pyc", ".db", ".db-wal", ".db-shm")):
            files.append(rel)
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """An sdist and a wheel built from a copy of the tracked source tree."""
    work = tmp_path_factory.mktemp("packaging")
    src = work / "src"
    for rel in _source_files(ROOT):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    dist = work / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = dist.glob("capseal-*.whl")
    (sdist,) = dist.glob("capseal-*.tar.gz")
    yield {"src": src, "wheel": wheel, "sdist": sdist, "work": work}


def test_the_wheel_carries_licence_provenance_types_and_honest_metadata(built: dict[str, Path]) -> None:
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
        info = f"capseal-{__version__}.dist-info"
        metadata = Parser().parsestr(wheel.read(f"{info}/METADATA").decode())
    assert f"{info}/licenses/LICENSE" in names
    assert "capseal/judge/schemas/PROVENANCE.md" in names
    assert {"capseal/py.typed", "capseal/keys/py.typed", "capseal/attest/py.typed"} <= names
    assert not any(n.startswith(("tests/", "hardware/", "bench/")) for n in names)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata["Version"] == __version__
    requires = metadata.get_all("Requires-Dist") or []
    # a library takes ranges (the test extra pins the published reference verifier on purpose)
    library = [r for r in requires if 'extra == "test"' not in r and 'extra == "dev"' not in r]
    assert not [r for r in library if "==" in r.split(";")[0]], library
    assert any(r.startswith("python-pkcs11") and "<0.11" in r for r in requires)
    assert not [r for r in requires if r.startswith(("pycose", "cbor2")) and "extra" not in r]  # test-only
    classifiers = metadata.get_all("Classifier") or []
    assert {f"Programming Language :: Python :: 3.{v}" for v in (10, 11, 12, 13)} <= set(classifiers)
    assert metadata.get_all("Project-URL")
    description = metadata.get_payload()
    assert "make test" in description and "## From a clone of the repository" in description


def test_the_sdist_carries_the_whole_runnable_test_tree(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as sdist:
        top = f"capseal-{__version__}"
        names = {n[len(top) + 1:] for n in sdist.getnames() if n.startswith(top + "/")}
    wanted = {str(rel) for rel in _source_files(built["src"])
              if rel.parts[0] in ("tests", "hardware", "examples", "bench", ".ci")}
    assert wanted and wanted <= names, sorted(wanted - names)[:20]
    assert {"LICENSE", "Makefile", "README.md", "pyproject.toml"} <= names
    assert not any(n.endswith((".pyc", ".db")) or "__pycache__" in n for n in names)


def _python_versions() -> list[str]:
    """This interpreter, and each other CPython 3.10-3.13 the machine has (the classifiers' versions)."""
    found = [sys.executable]
    for minor in (10, 11, 12, 13):
        if sys.version_info[:2] == (3, minor):
            continue
        installed = sorted(Path.home().glob(f".pyenv/versions/3.{minor}.*/bin/python3.{minor}"))
        exe = str(installed[-1]) if installed else shutil.which(f"python3.{minor}")
        if exe is not None:
            found.append(exe)
    return found


_PUBLIC_MODULES = ["capseal", "capseal.errors", "capseal.keys", "capseal.attest", "capseal.judge", "capseal.integrations"]

_EXTRAS_PROBE = textwrap.dedent("""
    import importlib, sys
    for name in sys.argv[1:]:
        importlib.import_module(name)
    from capseal.errors import MissingExtraError
    from capseal.keys import open_signer
    for uri, extra in (("pkcs11:token=t;object=k?module-path=/usr/lib/softhsm/libsofthsm2.so", "capseal[pkcs11]"),
                       ("tpm2:handle=0x81000101?tcti=device:/dev/tpmrm0", "capseal[tpm]")):
        try:
            open_signer(uri)
        except MissingExtraError as exc:
            assert extra in str(exc), str(exc)
        else:
            raise SystemExit(f"{uri}: no MissingExtraError")
    for adapter, extra in (("langchain", "capseal[langchain]"), ("openai_agents", "capseal[openai-agents]"),
                           ("mcp", "capseal[mcp]"), ("pydantic_ai", "capseal[pydantic-ai]")):
        try:
            importlib.import_module(f"capseal.integrations.{adapter}")
        except MissingExtraError as exc:
            assert extra in str(exc), str(exc)
        else:
            raise SystemExit(f"capseal.integrations.{adapter}: no MissingExtraError")
    print("extras named")
""")


@pytest.mark.parametrize("python", _python_versions(), ids=lambda p: Path(p).name)
def test_the_wheel_installed_without_extras_works_outside_the_repository(built: dict[str, Path], python: str,
                                                                         tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    py, capseal_cli = venv / "bin" / "python", venv / "bin" / "capseal"
    install = subprocess.run([str(py), "-m", "pip", "install", "-q", str(built["wheel"])],
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    quickstart = shutil.copy(built["src"] / "examples" / "quickstart.py", outside / "quickstart.py")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(args), capture_output=True, text=True, timeout=300, cwd=outside, env=env)

    where = run(str(py), "-c", "import capseal, sys; print(capseal.__file__)")
    assert str(venv) in where.stdout, where.stdout + where.stderr  # the installed copy, not the repository's
    started = run(str(py), str(quickstart))
    assert started.returncode == 0 and "ledger ok: True" in started.stdout, started.stdout + started.stderr
    version = run(str(capseal_cli), "--version")
    assert version.stdout.strip() == f"capseal {__version__}"
    probe = run(str(py), "-c", _EXTRAS_PROBE, *_PUBLIC_MODULES)
    assert probe.returncode == 0 and "extras named" in probe.stdout, probe.stdout + probe.stderr
    provision = run(str(capseal_cli), "tpm", "provision", "--tcti", "device:/dev/null")
    assert provision.returncode == 2, provision.stdout + provision.stderr
    assert "capseal[tpm]" in provision.stderr and "internal error" not in provision.stderr, provision.stderr
    assert "Traceback" not in provision.stderr


def test_every_package_of_the_source_tree_is_in_the_wheel(built: dict[str, Path]) -> None:
    """A package missing from pyproject's list installs as a broken import
    (the editable install used by the tests finds it anyway)."""
    with zipfile.ZipFile(built["wheel"]) as wheel:
        shipped = {n for n in wheel.namelist() if n.endswith("/__init__.py")}
    roots = {"sdk": "capseal", "keys": "capseal/keys", "attest": "capseal/attest"}
    for folder, installed in roots.items():
        for init in (built["src"] / folder).rglob("__init__.py"):
            rel = init.relative_to(built["src"] / folder).as_posix()
            assert f"{installed}/{rel}" in shipped, f"{folder}/{rel} is not in the wheel"
