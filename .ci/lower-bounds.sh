#!/usr/bin/env bash
# The fast paths that read a dependency's internals (python-pkcs11's session and
# mechanism objects, tpm2-pytss's ESAPI, the JCS fast path checked against
# rfc8785) are tested at the lowest versions pyproject.toml admits, listed in
# .ci/lower-bounds.txt. When .venv already has exactly those versions, the main
# run tested them and nothing more is done; otherwise a second environment is
# built at the lower bounds and the fast-path tests run there.
set -euo pipefail
cd "$(dirname "$0")/.."
bounds=.ci/lower-bounds.txt
differ=()
while read -r req; do
  case "$req" in ''|'#'*) continue;; esac
  name=${req%%==*}; want=${req##*==}
  have=$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || echo none)
  [ "$have" = "$want" ] || differ+=("$name $have (lower bound $want)")
done < "$bounds"
if [ ${#differ[@]} -eq 0 ]; then
  echo "lower bounds: .venv has exactly $(grep -v '^#' "$bounds" | tr '\n' ' ')— the run above tested them"
  exit 0
fi
echo "lower bounds: ${differ[*]}; testing the fast paths at the lower bounds in .venv-lower"
[ -x .venv-lower/bin/python ] || "${PYTHON:-python3}" -m venv .venv-lower
.venv-lower/bin/python -m pip install -q -c "$bounds" -e ".[test,pkcs11,tpm]"
.venv-lower/bin/python -m pytest -q -p no:cacheprovider \
  tests/core/test_canonical.py tests/keys/pkcs11/test_pkcs11_fast.py tests/keys/pkcs11/test_pkcs11_signer.py \
  tests/keys/pkcs11/test_pkcs11_signing_process.py \
  tests/keys/tpm/test_tpm_signer.py tests/keys/tpm/test_tpm_device.py
