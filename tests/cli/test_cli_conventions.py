"""The command-line conventions people expect, through real ``capseal``
processes: ``--version`` and ``python -m capseal``, logging levels, environment
defaults, a start-up that imports little, Ctrl-C as exit 130 with one line, a
text and a JSON form of ``seal``, and repeated ``seal`` runs that continue an
unchanged epoch instead of opening one per run."""

from __future__ import annotations

import json
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capseal import __version__

CLI = str(Path(sys.executable).parent / "capseal")


def run(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, input=stdin,
                          env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


@pytest.fixture()
def key(tmp_path: Path) -> Path:
    path = tmp_path / "k.pem"
    assert run("keys", "create", f"file:{path}", "--alg", "ed25519").returncode == 0
    return path


def _spec(tmp_path: Path, action_id: str) -> Path:
    spec = tmp_path / f"{action_id}.json"
    spec.write_text(json.dumps({"action_id": action_id, "action_type": "fyi"}))
    return spec


def _count(ledger: Path) -> int:
    with sqlite3.connect(ledger) as db:
        return int(db.execute("SELECT count(*) FROM records").fetchone()[0])


def test_version_from_the_command_and_from_python_m() -> None:
    assert run("--version").stdout.strip() == f"capseal {__version__}"
    proc = subprocess.run([sys.executable, "-m", "capseal", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"capseal {__version__}"


def test_help_loads_neither_the_producer_nor_pydantic_nor_sqlite() -> None:
    probe = ("import sys; import capseal.cli as c; c.build_parser().format_help(); "
             "print(sorted(m for m in ('pydantic', 'sqlite3', 'capseal.producer', 'capseal.ledger', 'capseal.model', "
             "'capseal.keys', 'cryptography') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"
    assert run("seal", "--help").returncode == 0


def test_environment_defaults_stand_in_for_the_options_given_every_time(tmp_path: Path, key: Path) -> None:
    ledger = tmp_path / "l.db"
    env = {"CAPSEAL_KEY": f"file:{key}", "CAPSEAL_LEDGER": str(ledger), "CAPSEAL_OPERATOR": "acme",
           "CAPSEAL_DEVELOPER": "agent@1"}
    proc = run("seal", str(_spec(tmp_path, "e-1")), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    capsule = json.loads(proc.stdout)
    assert (capsule["operator"], capsule["developer"]) == ("acme", "agent@1")
    assert run("seal", str(_spec(tmp_path, "e-2")), "--operator", "other", env=env).returncode == 0  # an option wins
    missing = run("seal", str(_spec(tmp_path, "e-3")), env={"CAPSEAL_KEY": "", "CAPSEAL_LEDGER": str(ledger),
                                                           "CAPSEAL_OPERATOR": "acme", "CAPSEAL_DEVELOPER": "a@1"})
    assert missing.returncode == 2 and "--key" in missing.stderr  # empty is unset


def test_log_levels_from_v_from_the_option_and_from_the_environment(tmp_path: Path, key: Path) -> None:
    base = ["--key", f"file:{key}", "--ledger", str(tmp_path / "l.db"), "--operator", "acme", "--developer", "a@1"]
    quiet = run("seal", str(_spec(tmp_path, "q-1")), *base)
    assert quiet.returncode == 0 and "INFO" not in quiet.stderr
    for args, env in ((["-v"], {}), (["--log-level", "info"], {}), ([], {"CAPSEAL_LOG_LEVEL": "info"})):
        proc = run(*args, "seal", str(_spec(tmp_path, f"v-{len(args)}-{len(env)}")), *base, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "capseal: INFO: capseal.cli: opened EdDSA key" in proc.stderr
    bad = run("seal", str(_spec(tmp_path, "b-1")), *base, env={"CAPSEAL_LOG_LEVEL": "loud"})
    assert bad.returncode == 2 and "CAPSEAL_LOG_LEVEL" in bad.stderr


def test_seal_prints_text_and_json(tmp_path: Path, key: Path) -> None:
    base = ["--key", f"file:{key}", "--ledger", str(tmp_path / "l.db"), "--operator", "acme", "--developer", "a@1"]
    text = run("seal", str(_spec(tmp_path, "t-1")), *base)
    assert text.returncode == 0
    first, summary = text.stdout.splitlines()
    assert first.startswith("sealed  t-1  ") and "1 record(s) sealed into" in summary
    as_json = run("seal", str(_spec(tmp_path, "t-2")), *base, "--json")
    assert json.loads(as_json.stdout)["action_id"] == "t-2"


def test_repeated_seals_continue_an_unchanged_epoch(tmp_path: Path, key: Path) -> None:
    ledger = tmp_path / "l.db"
    base = ["--key", f"file:{key}", "--ledger", str(ledger), "--operator", "acme", "--developer", "a@1"]
    epochs = []
    for i in range(3):
        proc = run("seal", str(_spec(tmp_path, f"c-{i}")), *base, "--continue-epoch", "--json")
        assert proc.returncode == 0, proc.stderr
        epochs.append(json.loads(proc.stdout)["epoch_id"])
    assert len(set(epochs)) == 1 and _count(ledger) == 4  # one boundary, three records
    again = run("seal", str(_spec(tmp_path, "n-1")), *base, "--json")  # the default: a new epoch per run
    assert json.loads(again.stdout)["epoch_id"] not in epochs and _count(ledger) == 6
    other_key = tmp_path / "k2.pem"
    assert run("keys", "create", f"file:{other_key}", "--alg", "ed25519").returncode == 0
    changed = run("seal", str(_spec(tmp_path, "k-1")), "--key", f"file:{other_key}", *base[2:], "--continue-epoch",
                  "--json")
    assert json.loads(changed.stdout)["epoch_id"] not in epochs  # another key: custody changed, a new epoch
    assert run("verify", str(ledger), "--json").returncode in (0, 1)  # readable; trust is checked elsewhere
    report = json.loads(run("verify", str(ledger), "--json").stdout)
    assert all(f["severity"] != "error" for r in report["records"] for f in r["findings"])


#: x86-64 system call numbers, as /proc/<pid>/syscall gives them
_READ, _NANOSLEEP, _CLOCK_NANOSLEEP = 0, 35, 230


def _wait_until_blocked_in(proc: subprocess.Popen[str], calls: set[int], first_arg: str | None = None) -> None:
    """Wait until ``proc`` sits in one of the system calls ``calls`` (a
    fixed delay can end before a loaded machine has started it); elsewhere
    than Linux on x86-64, wait a fixed 1.5 s."""
    if platform.machine() != "x86_64" or not os.path.exists(f"/proc/{proc.pid}/syscall"):
        time.sleep(1.5)
        return
    deadline, seen = time.monotonic() + 60, 0
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/syscall", encoding="ascii") as f:
                fields = f.read().split()
        except OSError:
            fields = []
        blocked = bool(fields) and fields[0].isdigit() and int(fields[0]) in calls \
            and (first_arg is None or fields[1] == first_arg)
        seen = seen + 1 if blocked else 0
        if seen >= 3:  # there a while, not passing through
            return
        time.sleep(0.05)
    raise AssertionError(f"the process never waited in system calls {sorted(calls)}")


def _interrupted(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_ctrl_c_while_reading_the_spec_exits_130_with_one_line(tmp_path: Path, key: Path) -> None:
    proc = subprocess.Popen([CLI, "seal", "-", "--key", f"file:{key}", "--ledger", str(tmp_path / "l.db"),
                             "--operator", "acme", "--developer", "a@1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_blocked_in(proc, {_READ}, first_arg="0x0")  # started, waiting for the spec on stdin
    code, err = _interrupted(proc)
    assert (code, err) == (130, "capseal: interrupted\n")


def test_ctrl_c_while_the_ledger_is_locked_at_start_up_exits_130(tmp_path: Path, key: Path) -> None:
    ledger = tmp_path / "l.db"
    assert run("seal", str(_spec(tmp_path, "l-1")), "--key", f"file:{key}", "--ledger", str(ledger),
               "--operator", "acme", "--developer", "a@1").returncode == 0
    holder = sqlite3.connect(ledger, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # the producer's start-up waits on this lock
    try:
        proc = subprocess.Popen([CLI, "seal", str(_spec(tmp_path, "l-2")), "--key", f"file:{key}", "--ledger",
                                 str(ledger), "--operator", "acme", "--developer", "a@1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_until_blocked_in(proc, {_NANOSLEEP, _CLOCK_NANOSLEEP})  # started, waiting for the lock
        code, err = _interrupted(proc)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert (code, err) == (130, "capseal: interrupted\n")
    assert _count(ledger) == 2
