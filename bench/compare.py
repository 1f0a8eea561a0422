"""Two commits side by side: each bench of this folder run from the sources of
a base commit and of the working tree, alternately, in one run.

Each side runs its own copy of the bench scripts (the scripts may reach
into what their commit provides) against its own capseal, laid out as the
wheel installs it (links to ``sdk/``, ``keys/``, ``attest/``) and put first
on ``PYTHONPATH``, so the editable install of the working tree is not what
the base side imports. Both share this interpreter and its packages.

Rounds alternate base/head and swap who goes first, so a drift of the
machine's speed over the run weighs on both. Prints, per figure both sides
report, the median of each and head/base (above 1: head is faster, or for a
figure where less is better, such as CPU per record, slower — the figure's
name says which it is).

With ``--scripts base`` both sides run the base commit's bench scripts (for
a bench whose output changed between the two), each against its own capseal;
with ``--scripts head``, the working tree's (which then must still run on
the base commit's capseal).

Usage: python bench/compare.py --base REV [--bench seal,keys] [--rounds 3] [--n N] [--scripts own|base|head]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` unpacked into ``into`` (``git archive``: no worktree registered)."""
    into.mkdir(parents=True)
    archive = into.parent / f"{into.name}.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, stdout=out)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    archive.unlink()
    return into


def layout(source: Path, into: Path) -> Path:
    """A directory holding ``capseal`` as the wheel lays it out, as links into ``source``."""
    package = into / "capseal"
    package.mkdir(parents=True)
    for item in (source / "sdk").iterdir():
        if item.name != "__pycache__":
            (package / item.name).symlink_to(item)
    (package / "keys").symlink_to(source / "keys")
    (package / "attest").symlink_to(source / "attest")
    return into


def figures(value: Any, prefix: str = "") -> dict[str, float]:
    """Every number in a bench's JSON output, by its path (rows by their name)."""
    out: dict[str, float] = {}
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        return {prefix: float(value)}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(figures(item, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            name = next((str(item[k]) for k in ("name", "backend", "label", "arm") if isinstance(item, dict)
                         and isinstance(item.get(k), str)), str(i))
            out.update(figures(item, f"{prefix}[{name}]"))
    return out


def run_bench(source: Path, path_dir: Path, bench: str, extra: list[str], scripts: Path | None = None) -> dict[str, float]:
    folder = (scripts or source) / "bench"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path_dir), str(folder)])}
    done = subprocess.run([sys.executable, str(folder / f"{bench}.py"), "--json", *extra],
                          cwd=source, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{bench}.py from {source} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    start = done.stdout.find("{")
    return figures(json.loads(done.stdout[start:]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare the working tree with")
    ap.add_argument("--bench", default="seal,keys", help="comma-separated bench names of this folder")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each bench per side")
    ap.add_argument("--n", type=int, help="passed to each bench as --n")
    ap.add_argument("--scripts", choices=("own", "base", "head"), default="own",
                    help="whose bench scripts each side runs: its own, the base commit's or the working tree's")
    args = ap.parse_args(argv)
    extra = ["--n", str(args.n)] if args.n else []
    head_rev = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                              text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="capseal-compare-") as tmp:
        base_src = export(args.base, Path(tmp) / "base")
        sides = {"base": (base_src, layout(base_src, Path(tmp) / "base-path")),
                 "head": (ROOT, layout(ROOT, Path(tmp) / "head-path"))}
        for bench in args.bench.split(","):
            runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
            for r in range(args.rounds):
                order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
                for side in order:
                    source, path_dir = sides[side]
                    scripts = {"base": base_src, "head": ROOT}.get(args.scripts)
                    runs[side].append(run_bench(source, path_dir, bench, extra, scripts))
            common = sorted(set.intersection(*(set(f) for f in runs["base"] + runs["head"])))
            print(f"{bench}.py ({args.scripts} scripts): base {args.base} vs head {head_rev}, "
                  f"medians of {args.rounds} alternating runs each")
            for name in common:
                base = median(f[name] for f in runs["base"])
                head = median(f[name] for f in runs["head"])
                ratio = f"{head / base:6.2f}x" if base else "     -"
                print(f"  {name:58s} base {base:11.2f}  head {head:11.2f}  head/base {ratio}")
            only = sorted(set().union(*(set(f) for f in runs["head"])) - set(common))
            if only:
                print(f"  (only one side reports: {', '.join(only)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
