#!/usr/bin/env bash
# Start or stop a private PostgreSQL server: initdb in a directory of its own,
# listening only on a Unix socket in that directory (no TCP port), password
# logins (scram-sha-256). For development and CI.
#
#   hardware/postgres.sh start DIR   -> prints PGHOST=..., PGPORT=..., PGUSER=..., PGPASSWORD=..., PGDATA=..., PG_PID=...
#   hardware/postgres.sh crash DIR   -> pg_ctl stop -m immediate (no shutdown checkpoint: as a crash); data kept
#   hardware/postgres.sh halt DIR    -> pg_ctl stop -m fast (a clean shutdown); data kept
#   hardware/postgres.sh stop DIR    -> stops it by its PID and deletes its data
#
# Starting again after crash (or stop without deleting) recovers the same data.
# PostgreSQL refuses to run as root: run as root (CI), the server runs as the
# unprivileged `postgres` user (the Debian package's), in a directory under
# /tmp that user owns (DIR itself may sit in a directory it cannot enter);
# DIR/base names that directory.
set -euo pipefail
cmd="${1:?usage: postgres.sh start|crash|halt|stop DIR}"
dir="${2:?usage: postgres.sh start|crash|halt|stop DIR}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"

bindir=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) /usr/local/pgsql/bin; do
  [ -x "$d/initdb" ] && { bindir="$d"; break; }
done
if [ -z "$bindir" ] && command -v initdb >/dev/null 2>&1; then bindir="$(dirname "$(command -v initdb)")"; fi
[ -n "$bindir" ] || { echo "postgres.sh: PostgreSQL is not installed (apt-get install postgresql)" >&2; exit 2; }

as_server() {  # run a PostgreSQL program as the user the server runs as
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ -s "$dir/base" ]; then
  base="$(cat "$dir/base")"
elif [ "$(id -u)" -eq 0 ]; then
  id postgres >/dev/null 2>&1 || { echo "postgres.sh: as root the server runs as the 'postgres' user, which does not exist (apt-get install postgresql)" >&2; exit 2; }
  base="$(mktemp -d /tmp/capseal-pg.XXXXXX)"
  chown postgres: "$base"
  echo "$base" > "$dir/base"
else
  base="$dir/pg"
  mkdir -p "$base"
  echo "$base" > "$dir/base"
fi
data="$base/data"
sock="$base/sock"
port=5432  # the socket's name only: it sits in a directory of its own

pid_of() { [ -s "$data/postmaster.pid" ] && head -1 "$data/postmaster.pid" || true; }

case "$cmd" in
  start)
    if [ ! -s "$data/PG_VERSION" ]; then
      password="$(head -c 18 /dev/urandom | base64 | tr '+/' 'xy')"
      umask 077
      printf '%s\n' "$password" > "$dir/password"
      pwfile="$base/pwfile"
      printf '%s\n' "$password" > "$pwfile"
      [ "$(id -u)" -eq 0 ] && chown postgres: "$pwfile"
      as_server mkdir -p "$sock"
      as_server "$bindir/initdb" -D "$data" -U postgres --pwfile="$pwfile" --auth-local=scram-sha-256 \
        --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 --no-instructions --no-sync >"$dir/initdb.log" 2>&1 \
        || { rm -f "$pwfile"; echo "postgres.sh: initdb failed (see $dir/initdb.log)" >&2; exit 1; }
      rm -f "$pwfile"
    fi
    if [ -z "$(pid_of)" ] || ! kill -0 "$(pid_of)" 2>/dev/null; then
      as_server "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 \
        -o "-c listen_addresses='' -c unix_socket_directories='$sock' -c port=$port -c max_connections=300 -c shared_buffers=64MB -c fsync=on -c synchronous_commit=on" \
        start >/dev/null || { echo "postgres.sh: the server did not start (see $base/server.log)" >&2; exit 1; }
    fi
    echo "PGHOST=$sock"
    echo "PGPORT=$port"
    echo "PGUSER=postgres"
    echo "PGPASSWORD=$(cat "$dir/password")"
    echo "PGDATA=$data"
    echo "PG_PID=$(pid_of)"
    ;;
  crash)
    as_server "$bindir/pg_ctl" -D "$data" stop -m immediate -w >/dev/null
    ;;
  halt)
    as_server "$bindir/pg_ctl" -D "$data" stop -m fast -w >/dev/null
    ;;
  stop)
    pid="$(pid_of)"
    if [ -n "$pid" ]; then
      kill -QUIT "$pid" 2>/dev/null || true  # immediate shutdown: its data is deleted next, no checkpoint needed
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      kill -KILL "$pid" 2>/dev/null || true
    fi
    case "$base" in /tmp/capseal-pg.*|"$dir"/pg) rm -rf "$base" ;; esac
    rm -f "$dir/base" "$dir/password"
    ;;
  *) echo "usage: postgres.sh start|crash|halt|stop DIR" >&2; exit 2 ;;
esac
