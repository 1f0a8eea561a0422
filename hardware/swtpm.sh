#!/usr/bin/env bash
# Start or stop a software TPM 2.0 (swtpm) on loopback TCP with its own state
# directory. For development and CI only: capseal labels swtpm a software TPM.
#
#   hardware/swtpm.sh start STATE_DIR [PORT]   -> prints TCTI=..., SWTPM_PID=..., SWTPM_PORT=...
#   hardware/swtpm.sh stop STATE_DIR            -> stops it by the PID in STATE_DIR/swtpm.pid
#
# Without PORT a free loopback port pair (PORT, PORT+1 for control) is chosen.
# Restarting with the same STATE_DIR and PORT keeps keys and persistent handles.
set -euo pipefail
cmd="${1:?usage: swtpm.sh start|stop STATE_DIR [PORT]}"
state="${2:?usage: swtpm.sh start|stop STATE_DIR [PORT]}"
mkdir -p "$state"
state="$(cd "$state" && pwd)"
pidfile="$state/swtpm.pid"

free_port() {
  python3 - <<'PY'
import random, socket
# Outside the kernel's range for outgoing connections' own ports: a client
# that keeps reconnecting while swtpm is stopped could otherwise be given the
# port itself and connect to itself (TCP self-connect), read its own command
# back as the TPM's answer, and hold the port a restart needs.
try:
    lo, hi = (int(v) for v in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
except (OSError, ValueError):
    lo, hi = 32768, 60999
ranges = [r for r in ((10000, lo - 3), (hi + 1, 65533)) if r[1] - r[0] >= 100] or [(20000, 60000)]
for _ in range(500):
    p = random.randint(*random.choice(ranges))
    ok = True
    for q in (p, p + 1):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", q))
        except OSError:
            ok = False
        finally:
            s.close()
    if ok:
        print(p)
        break
PY
}

case "$cmd" in
  start)
    command -v swtpm >/dev/null || { echo "swtpm.sh: swtpm not installed (apt-get install swtpm swtpm-tools)" >&2; exit 2; }
    port="${3:-}"
    tries=0
    while :; do
      p="${port:-$(free_port)}"
      rm -f "$pidfile"
      if swtpm socket --tpm2 --tpmstate dir="$state" \
          --server type=tcp,port="$p",bindaddr=127.0.0.1 \
          --ctrl type=tcp,port="$((p + 1))",bindaddr=127.0.0.1 \
          --flags not-need-init,startup-clear \
          --pid file="$pidfile" --log file="$state/swtpm.log",level=1 --daemon 2>>"$state/swtpm.err"; then
        break
      fi
      tries=$((tries + 1))
      if [ -n "$port" ] || [ "$tries" -ge 5 ]; then echo "swtpm.sh: could not start swtpm on port $p" >&2; exit 1; fi
    done
    for _ in $(seq 1 100); do [ -s "$pidfile" ] && break; sleep 0.05; done
    # wait until the command port accepts connections
    for _ in $(seq 1 100); do
      (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null && break
      sleep 0.05
    done
    echo "TCTI=swtpm:host=127.0.0.1,port=$p"
    echo "SWTPM_PID=$(cat "$pidfile")"
    echo "SWTPM_PORT=$p"
    ;;
  stop)
    if [ -s "$pidfile" ]; then
      pid="$(cat "$pidfile")"
      kill "$pid" 2>/dev/null || true
      # gone, or a zombie nobody reaps (its ports are already released)
      for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" = "Z" ] && break
        sleep 0.05
      done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$pidfile"
    fi
    ;;
  *) echo "usage: swtpm.sh start|stop STATE_DIR [PORT]" >&2; exit 2 ;;
esac
