#!/usr/bin/env bash
# Create a SoftHSM2 token in a private directory (no global state: its own
# SOFTHSM2_CONF and token store). For development and CI only: SoftHSM2 keeps
# keys in files and capseal labels it a software device.
#
# Usage: hardware/softhsm-token.sh DIR [LABEL] [USER_PIN] [SO_PIN]
# Prints KEY=VALUE lines: SOFTHSM2_CONF, PKCS11_MODULE, TOKEN_LABEL.
# (The PINs are not printed; pass them to the script and keep them. They go on
# softhsm2-util's command line, which every user can read in /proc while it runs:
# test PINs only. `capseal token init` keeps PINs off command lines.)
set -euo pipefail
dir="${1:?usage: softhsm-token.sh DIR [LABEL] [USER_PIN] [SO_PIN]}"
label="${2:-capseal-dev}"
user_pin="${3:-1234}"
so_pin="${4:-12345678}"
mkdir -p "$dir/tokens"
dir="$(cd "$dir" && pwd)"
cat > "$dir/softhsm2.conf" <<CONF
directories.tokendir = $dir/tokens
objectstore.backend = file
log.level = ERROR
slots.removable = false
CONF
export SOFTHSM2_CONF="$dir/softhsm2.conf"
module=""
for m in /usr/lib/softhsm/libsofthsm2.so /usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so \
         /usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so /usr/local/lib/softhsm/libsofthsm2.so; do
  [ -e "$m" ] && { module="$m"; break; }
done
[ -n "$module" ] || { echo "softhsm-token.sh: libsofthsm2.so not found (apt-get install softhsm2)" >&2; exit 2; }
# the slot id is random after --free: always select the token by label
softhsm2-util --init-token --free --label "$label" --so-pin "$so_pin" --pin "$user_pin" >/dev/null
echo "SOFTHSM2_CONF=$SOFTHSM2_CONF"
echo "PKCS11_MODULE=$module"
echo "TOKEN_LABEL=$label"
