"""Shared fixtures: a real SoftHSM2 token, a real swtpm and a real PostgreSQL
server, each in a temp dir.

All are started by the project's own scripts in ``hardware/``. When a tool is
missing these tests *fail* (they never skip): ``make test`` installs
everything they need. At the end of the run a summary line says how many
SoftHSM2, swtpm and PostgreSQL tests ran.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HARDWARE = ROOT / "hardware"
VECTORS = Path(__file__).resolve().parent / "vectors"

os.environ.setdefault("TSS2_LOG", "all+NONE")  # expected TPM failures must not spam stderr

# A suite started in the background of a shell without job control (`make test &` in a script)
# inherits SIGINT ignored, and so would every process it starts: the Ctrl-C tests need it live.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Hypothesis: a fixed profile so the suite's time stays bounded on 2 cores.
try:
    from hypothesis import HealthCheck, settings

    settings.register_profile("capseal", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "capseal"))
except ImportError:  # pragma: no cover
    pass


def _run(args: list[str], **kw: object) -> dict[str, str]:
    proc = subprocess.run(args, check=False, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}\n"
                    "Run `make test` (it installs softhsm2, swtpm and the Python extras).")
    out: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if "=" in line:
            k, _, v = line.partition("=")
            out[k.strip()] = v.strip()
    return out


def _require(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed; run `make test` (hardware tests never skip)")


# PINs that cannot turn up by chance in hex, base64 or JSON output (a 4-digit
# PIN once did: tests assert that no output contains the PIN)
TEST_PIN, TEST_SO_PIN = "test-pin-Qx~7", "test-so-pin-Jw~3"


@dataclass
class SoftHSM:
    """A private SoftHSM2 token (module, config, label and PINs)."""

    dir: Path
    conf: str
    module: str
    label: str
    pin: str = TEST_PIN
    so_pin: str = TEST_SO_PIN
    extra_tokens: list[str] = field(default_factory=list)

    def uri(self, obj: str | None = None, *, label: str | None = None, pin_in_uri: bool = False, **attrs: str) -> str:
        path = [f"token={label or self.label}"]
        if obj is not None:
            path.append(f"object={obj}")
        path += [f"{k}={v}" for k, v in attrs.items()]
        query = f"module-path={self.module}"
        if pin_in_uri:
            query += f"&pin-value={self.pin}"
        return "pkcs11:" + ";".join(path) + "?" + query

    def add_token(self, label: str, pin: str = TEST_PIN) -> None:
        subprocess.run(
            ["softhsm2-util", "--init-token", "--free", "--label", label, "--so-pin", self.so_pin, "--pin", pin],
            check=True, capture_output=True, env={**os.environ, "SOFTHSM2_CONF": self.conf},
        )
        self.extra_tokens.append(label)


@pytest.fixture(scope="session")
def softhsm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftHSM]:
    """One SoftHSM2 token for the session, under a private SOFTHSM2_CONF."""
    _require("softhsm2-util")
    d = tmp_path_factory.mktemp("softhsm")
    env = _run([str(HARDWARE / "softhsm-token.sh"), str(d), "capseal-test", TEST_PIN, TEST_SO_PIN])
    os.environ["SOFTHSM2_CONF"] = env["SOFTHSM2_CONF"]  # read by SoftHSM2 at C_Initialize
    yield SoftHSM(dir=d, conf=env["SOFTHSM2_CONF"], module=env["PKCS11_MODULE"], label=env["TOKEN_LABEL"])


@dataclass
class SwTPM:
    """A running swtpm on loopback; ``stop()``/``start()`` keep its state."""

    state: Path
    port: int
    pid: int

    @property
    def tcti(self) -> str:
        return f"swtpm:host=127.0.0.1,port={self.port}"

    def stop(self) -> None:
        subprocess.run([str(HARDWARE / "swtpm.sh"), "stop", str(self.state)], check=True, capture_output=True)

    def start(self) -> None:
        env = _run([str(HARDWARE / "swtpm.sh"), "start", str(self.state), str(self.port)])
        self.pid = int(env["SWTPM_PID"])


def _start_swtpm(state: Path) -> SwTPM:
    _require("swtpm")
    env = _run([str(HARDWARE / "swtpm.sh"), "start", str(state)])
    return SwTPM(state=state, port=int(env["SWTPM_PORT"]), pid=int(env["SWTPM_PID"]))


@pytest.fixture(scope="session")
def swtpm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SwTPM]:
    """One swtpm for the session (fresh state: all-zero PCRs, no EK cert)."""
    tpm = _start_swtpm(tmp_path_factory.mktemp("swtpm"))
    try:
        yield tpm
    finally:
        tpm.stop()


@pytest.fixture()
def fresh_swtpm(tmp_path: Path) -> Iterator[SwTPM]:
    """A swtpm of its own, for tests that fill slots, lock out or restart it."""
    tpm = _start_swtpm(tmp_path / "swtpm")
    try:
        yield tpm
    finally:
        tpm.stop()


@pytest.fixture()
def python() -> str:
    return sys.executable


@dataclass
class PostgresServer:
    """A private PostgreSQL server (hardware/postgres.sh) on a Unix socket;
    each :meth:`new_url` is an empty schema of the database ``capseal_test``."""

    dir: Path
    host: str
    port: int
    user: str
    password: str
    pid: int
    database: str = "capseal_test"
    made: list[str] = field(default_factory=list)

    def url(self, schema: str | None = None, *, password: str | None = None, database: str | None = None) -> str:
        """The URL of ``database`` (this one by default), its ``schema`` (else public)."""
        query = f"host={self.host}&port={self.port}"
        if schema is not None:
            query += f"&options=-csearch_path%3D{schema}"
        return f"postgresql://{self.user}:{self.password if password is None else password}@/{database or self.database}?{query}"

    def admin(self) -> object:
        """An autocommit psycopg connection to the test database, as its superuser."""
        import psycopg

        return psycopg.connect(self.url(), autocommit=True)

    def new_url(self) -> str:
        """The URL of a new, empty schema (a ledger not made yet)."""
        name = f"t{len(self.made)}_{os.getpid()}_{os.urandom(3).hex()}"
        with self.admin() as conn:  # type: ignore[attr-defined]
            conn.execute(f"CREATE SCHEMA {name}")
        self.made.append(name)
        return self.url(name)

    def crash(self) -> None:
        """``pg_ctl stop -m immediate``: the server stops as in a crash (no shutdown checkpoint)."""
        subprocess.run([str(HARDWARE / "postgres.sh"), "crash", str(self.dir)], check=True, capture_output=True)

    def start(self) -> None:
        """Start it again on the same data (crash recovery after :meth:`crash`)."""
        self.pid = int(_run([str(HARDWARE / "postgres.sh"), "start", str(self.dir)])["PG_PID"])


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session, with a database ``capseal_test``."""
    d = tmp_path_factory.mktemp("postgres")
    env = _run([str(HARDWARE / "postgres.sh"), "start", str(d)])
    server = PostgresServer(dir=d, host=env["PGHOST"], port=int(env["PGPORT"]), user=env["PGUSER"],
                            password=env["PGPASSWORD"], pid=int(env["PG_PID"]))
    try:
        import psycopg

        with psycopg.connect(server.url(database="postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {server.database}")
        yield server
    finally:
        subprocess.run([str(HARDWARE / "postgres.sh"), "stop", str(d)], check=False, capture_output=True)


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> object:
    """Each ledger engine in turn (tests.engines.Engine): a file, and a schema on the session's server."""
    from tests.engines import Engine

    server = request.getfixturevalue("postgres") if request.param == "postgres" else None
    return Engine(request.param, tmp_path, server)


_HW_COUNTS: dict[str, dict[str, int]] = {"softhsm": {}, "swtpm": {}, "postgres": {}}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    for marker in ("softhsm", "swtpm", "postgres"):
        if marker in report.keywords:
            counts = _HW_COUNTS[marker]
            counts[report.outcome] = counts.get(report.outcome, 0) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "softhsm" in fixtures:
            item.add_marker(pytest.mark.softhsm)
        if "swtpm" in fixtures or "fresh_swtpm" in fixtures:
            item.add_marker(pytest.mark.swtpm)
        callspec = getattr(item, "callspec", None)
        if "postgres" in fixtures or (callspec is not None and callspec.params.get("engine") == "postgres"):
            item.add_marker(pytest.mark.postgres)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    tr = terminalreporter
    tr.section("device and server tests (SoftHSM2 token and swtpm: software devices, run for real; real PostgreSQL)")
    for marker, label in (("softhsm", "SoftHSM2"), ("swtpm", "swtpm"), ("postgres", "PostgreSQL")):
        counts = _HW_COUNTS[marker]
        ran = sum(counts.values())
        tr.write_line(
            f"{label}: {ran} ran — {counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, "
            f"{counts.get('skipped', 0)} skipped"
        )


@pytest.fixture(autouse=True)
def _library_pin_hints() -> Iterator[None]:
    """A test that runs the CLI in this process marks the process as the CLI
    (PIN hints then name its options, see capseal.keys.secret.caller_is_cli):
    each test starts as a library caller again."""
    yield
    from capseal.keys.secret import caller_is_cli

    caller_is_cli(False)
