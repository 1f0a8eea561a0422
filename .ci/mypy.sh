#!/usr/bin/env bash
# Type-check capseal, tests/, bench/ and examples/ against capseal's own types (make lint).
#
# Why not plain `mypy sdk keys attest tests`: pyproject maps capseal -> sdk/,
# capseal.keys -> keys/, capseal.attest -> attest/ ([tool.setuptools.package-dir]),
# and the editable install in .venv is found through an import hook mypy does not
# run, so mypy never saw a module named `capseal`: every `capseal` name in tests/,
# bench/ and sdk's own absolute imports was a missing import, i.e. Any.
#
# So this lays capseal out as the wheel installs it, as links to the sources
# (build/mypy-path/capseal/* -> sdk/*, capseal/keys -> keys/, capseal/attest -> attest/),
# rebuilt on every run so a new module is seen at once, and puts it on MYPYPATH.
# mypy reports capseal's files under the link tree; the paths are rewritten back
# to sdk/, keys/ and attest/ so an error names the file to edit.
set -euo pipefail
cd "$(dirname "$0")/.."

MYPY="${MYPY:-.venv/bin/mypy}"
TREE=build/mypy-path  # build/ is git-ignored

rm -rf "$TREE"
mkdir -p "$TREE/capseal"
for item in sdk/*; do
  case "$(basename "$item")" in __pycache__) continue ;; esac
  ln -s "$PWD/$item" "$TREE/capseal/$(basename "$item")"
done
ln -s "$PWD/keys" "$TREE/capseal/keys"
ln -s "$PWD/attest" "$TREE/capseal/attest"

to_sources() {
  sed -e "s#^$TREE/capseal/keys/#keys/#" -e "s#^$TREE/capseal/attest/#attest/#" -e "s#^$TREE/capseal/#sdk/#"
}

export MYPYPATH="$TREE"
status=0
# the package under its real name, with tests/ (a package: imports tests.conftest etc.)
"$MYPY" -p capseal -p tests 2>&1 | to_sources || status=1
# the package alone, strict: what a typed caller of capseal relies on
"$MYPY" --strict -p capseal 2>&1 | to_sources || status=1
# bench/ is a folder of scripts (they import _common as a top-level module): a run of its own,
# silent about capseal's own errors (the run above reports them; here they came out twice)
"$MYPY" --follow-imports=silent bench 2>&1 | to_sources || status=1
# examples/ likewise: scripts a user copies from, checked against capseal's types
"$MYPY" --follow-imports=silent examples 2>&1 | to_sources || status=1
exit $status
