#!/usr/bin/env bash
# Install what capseal's demo and tests need, only what is missing, then the
# Python environment (.venv). Idempotent; safe to run on every `make`.
#
#   system (Debian/Ubuntu): softhsm2 swtpm swtpm-tools tpm2-tools libtss2-dev pkg-config gcc
#     opensc-pkcs11 (its pkcs11-spy proxy module: tests/keys/pkcs11/test_pkcs11_proxy.py)
#     libsodium23 (the producer's Ed25519 check of device signatures: sdk/_sodium.py, capseal._sodium)
#     postgresql (the server the PostgreSQL ledger's tests start: hardware/postgres.sh), libpq5 (psycopg's libpq)
#   python: .venv with capseal[test,pkcs11,tpm,dev] (test brings psycopg) (tpm2-pytss builds from source: ~30 s once)
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v softhsm2-util >/dev/null 2>&1 || need+=(softhsm2)
command -v swtpm >/dev/null 2>&1 || need+=(swtpm)
command -v swtpm_setup >/dev/null 2>&1 || need+=(swtpm-tools)
command -v tpm2_getcap >/dev/null 2>&1 || need+=(tpm2-tools)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
pkg-config --exists tss2-esys tss2-tctildr 2>/dev/null || need+=(libtss2-dev)
[ -e /usr/lib/softhsm/libsofthsm2.so ] || [ -e /usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so ] \
  || [ -e /usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so ] || need+=(softhsm2)
if ! compgen -G "/usr/lib/*/libsodium.so.2[36]" >/dev/null && ! compgen -G "/usr/lib/libsodium.so.2[36]" >/dev/null; then
  # Debian 12 / Ubuntu 24.04 ship libsodium23; later releases libsodium26
  if apt-cache show libsodium23 >/dev/null 2>&1; then need+=(libsodium23); else need+=(libsodium26); fi
fi
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
compgen -G "/usr/lib/*/libpq.so.5" >/dev/null || compgen -G "/usr/lib/libpq.so.5" >/dev/null || need+=(libpq5)
compgen -G "/usr/lib/*/pkcs11-spy.so" >/dev/null || compgen -G "/usr/lib/*/pkcs11/pkcs11-spy.so" >/dev/null \
  || need+=(opensc-pkcs11)

if [ ${#need[@]} -gt 0 ]; then
  # de-duplicate
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  echo "capseal: installing system packages: ${need[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
      echo "capseal: need root (or sudo) to install: ${need[*]}" >&2; exit 1; fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "capseal: creating .venv"
  "$PY" -m venv .venv
fi
stamp=".venv/.capseal-deps-$(sha256sum pyproject.toml | cut -c1-16)"
if [ ! -f "$stamp" ] || ! .venv/bin/python -c "import capseal, capseal.keys, pkcs11, tpm2_pytss, agent_action_capsule, psycopg" 2>/dev/null; then
  echo "capseal: installing Python packages into .venv (tpm2-pytss compiles once, ~30 s)"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -e ".[test,pkcs11,tpm,dev]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import capseal, capseal.keys, pkcs11, tpm2_pytss, agent_action_capsule, psycopg"
  rm -f .venv/.capseal-deps-*
  touch "$stamp"
fi
