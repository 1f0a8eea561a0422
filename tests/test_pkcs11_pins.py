"""PINs that must never reach a token, against a real SoftHSM2 token: an empty
PIN, one that is not UTF-8, one of the wrong type, from every source (``pin=``,
pin-value, pin-source, a secrets handler, and the CLI's CAPSEAL_PIN,
``--pin-file``, ``--pin-env``, ``--pin-prompt``). Each is a typed error naming
the source, holding no part of the PIN and no chained exception — and the
token's failed-login counter has not moved (SoftHSM2 sets
CKF_USER_PIN_COUNT_LOW after a refused login)."""

from __future__ import annotations

import argparse
import ctypes
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pkcs11.constants import TokenFlag

from capseal.errors import PinIncorrectError, SignerUnavailableError
from capseal.keys import open_signer
from capseal.keys._pkcs11_session import P11_LOCK, _find_tokens, load_module, open_token, release_token
from capseal.keys._pkcs11_uri import PKCS11URI, parse_pkcs11_uri, read_pin_source

from .secret_files import write_secret

CAPSEAL = str(Path(sys.executable).with_name("capseal"))
PIN = "pins-8302-ok"
SECRET = "Zq7SECRETtail"  # the part of a bad PIN that must never show


@pytest.fixture()
def token(softhsm: Any) -> dict[str, str]:
    """A token of its own, so its failed-login flag is this test's."""
    label = f"pins-{os.urandom(3).hex()}"
    softhsm.add_token(label, pin=PIN)
    return {"label": label, "uri": softhsm.uri("k", label=label), "module": softhsm.module}


def _login_failed(token: dict[str, str]) -> bool:
    """Whether the token has refused a login (read afresh from the token)."""
    module = load_module(token["module"])
    with P11_LOCK:
        (found,) = _find_tokens(module, PKCS11URI(token=token["label"]))  # C_GetTokenInfo now
        return bool(found.flags & TokenFlag.USER_PIN_COUNT_LOW)


def _assert_refused_locally(err: pytest.ExceptionInfo[PinIncorrectError], source: str, *secrets: str) -> None:
    exc = err.value
    assert "refused before it reached the token" in str(exc) and source in str(exc), str(exc)
    assert exc.__cause__ is None and exc.__context__ is None
    for secret in secrets:
        assert secret not in str(exc) and secret not in repr(exc) and secret not in repr(exc.args)


@pytest.mark.parametrize(
    ("pin", "secret"),
    [("", None), (f"ab\udcff{SECRET}", SECRET), (SECRET.encode(), SECRET), (8302, "8302")],
)
def test_api_refuses_unusable_pins_before_the_token(pin: Any, secret: str | None, token: dict[str, str]) -> None:
    with pytest.raises(PinIncorrectError) as err:
        open_signer(token["uri"], pin=pin)
    _assert_refused_locally(err, f"pin= for token {token['label']!r}", *([secret] if secret else []))
    assert not _login_failed(token)


def test_every_pin_source_is_checked_and_named(token: dict[str, str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.pin"
    write_secret(empty, "\n")  # one newline is dropped: nothing left
    with pytest.raises(PinIncorrectError) as err:
        open_signer(token["uri"] + "&pin-value=")
    _assert_refused_locally(err, "pin-value")
    with pytest.raises(PinIncorrectError) as err:
        open_signer(token["uri"] + f"&pin-source={empty}")
    _assert_refused_locally(err, f"pin-source {empty}")
    with pytest.raises(PinIncorrectError) as err:
        open_signer(token["uri"], secrets_handler=lambda prompt: "")
    _assert_refused_locally(err, "secrets_handler")
    assert not _login_failed(token)


# ---------------------------------------------------------------------- the CLI


def capseal(*args: str, env: dict[bytes, bytes] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environb.items() if k != b"CAPSEAL_PIN"}
    full.update(env or {})
    return subprocess.run([CAPSEAL, *args], capture_output=True, text=True, env=full, timeout=60, check=False, **kw)


def _assert_cli_refused(proc: subprocess.CompletedProcess[str], source: str, *secrets: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert source in proc.stderr and "internal error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for secret in secrets:
        assert secret not in proc.stdout + proc.stderr


def test_cli_refuses_empty_and_non_utf8_pins(token: dict[str, str], tmp_path: Path) -> None:
    empty, latin1 = tmp_path / "empty.pin", tmp_path / "latin1.pin"
    write_secret(empty, b"")
    write_secret(latin1, b"caf\xe9" + SECRET.encode() + b"\n")
    # named with --pin-env, an empty variable is refused; the default CAPSEAL_PIN set but empty
    # (an unset secret in compose or systemd) means no PIN, as for a key that needs none
    _assert_cli_refused(capseal("keys", "show", token["uri"], "--pin-env", "CAPSEAL_PIN", env={b"CAPSEAL_PIN": b""}),
                        "environment variable CAPSEAL_PIN is empty")
    no_pin = capseal("keys", "show", token["uri"], env={b"CAPSEAL_PIN": b""})
    assert no_pin.returncode == 2 and "empty" not in no_pin.stderr and "Traceback" not in no_pin.stderr
    _assert_cli_refused(capseal("keys", "show", token["uri"], "--pin-file", str(empty)), f"PIN file {empty} is empty")
    _assert_cli_refused(capseal("keys", "show", token["uri"], "--pin-file", str(latin1)), f"PIN file {latin1}", SECRET, "caf")
    _assert_cli_refused(capseal("keys", "show", token["uri"], env={b"CAPSEAL_PIN": b"caf\xe9" + SECRET.encode()}),
                        "environment variable CAPSEAL_PIN is not valid UTF-8", SECRET, "caf")
    assert not _login_failed(token)


def test_cli_pin_file_drops_one_newline_like_pin_source(tmp_path: Path) -> None:
    """One trailing line break is the file's, as for a URI's pin-source; a PIN
    still holding one after that (a file with a blank line at its end) is
    refused before any login, never sent with a line break in it."""
    from capseal._internal.cli import read_pin as _read_pin
    from capseal.errors import PinIncorrectError

    f = tmp_path / "pin"
    for tail in ("\n", "\r\n", " \n"):
        write_secret(f, PIN + tail)
        read = _read_pin(argparse.Namespace(pin_file=str(f)))
        assert read is not None and PIN not in repr(read)  # a Secret from the moment it is read
        assert read.reveal() == read_pin_source(str(f)).reveal() == PIN + tail[:-2 if tail.endswith("\r\n") else -1]
    for tail in ("\n\n", "\r\n\r\n", "\t\n"):
        write_secret(f, PIN + tail)
        with pytest.raises(PinIncorrectError, match="control character") as exc_info:
            _read_pin(argparse.Namespace(pin_file=str(f)))
        assert PIN not in str(exc_info.value) and exc_info.value.__cause__ is None


def test_cli_pin_env_unset_and_prompt_without_terminal(token: dict[str, str]) -> None:
    unset = capseal("keys", "show", token["uri"], "--pin-env", "CAPSEAL_TEST_NO_SUCH_VAR")
    _assert_cli_refused(unset, "CAPSEAL_TEST_NO_SUCH_VAR")
    no_tty = capseal("keys", "show", token["uri"], "--pin-prompt", stdin=subprocess.DEVNULL)
    _assert_cli_refused(no_tty, "--pin-prompt needs a terminal")


def _at_prompt(args: list[str], keys: bytes) -> tuple[int, str]:
    """Run the CLI on a pseudo-terminal, type ``keys`` once it asks for the PIN."""
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        env = {k: v for k, v in os.environ.items() if k != "CAPSEAL_PIN"}
        os.execve(CAPSEAL, [CAPSEAL, *args], env)
    out, sent, deadline = b"", False, time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
        if not sent and b"PIN" in out:
            os.write(fd, keys)
            sent = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@pytest.mark.parametrize(("keys", "needle"), [(b"\x04", "no PIN entered"), (b"\n", "the PIN prompt is empty")])
def test_cli_prompt_end_of_input_and_empty(keys: bytes, needle: str, token: dict[str, str]) -> None:
    code, out = _at_prompt(["keys", "show", token["uri"], "--pin-prompt"], keys)
    assert code == 2 and needle in out and "internal error" not in out, out
    assert not _login_failed(token)


def test_an_empty_default_pin_variable_is_as_if_unset(monkeypatch: Any) -> None:
    """CAPSEAL_PIN set but empty (an unset secret in compose or systemd) is no
    PIN: the CLI goes on to --pin-prompt as if it were unset (here: no
    terminal, so that is refused), and returns None without one."""
    from capseal._internal.cli import CLIError as _CLIError
    from capseal._internal.cli import read_pin as _read_pin

    monkeypatch.setenv("CAPSEAL_PIN", "")
    assert _read_pin(argparse.Namespace()) is None
    with pytest.raises(_CLIError, match="--pin-prompt needs a terminal"):
        _read_pin(argparse.Namespace(pin_prompt=True))


# ---------------------------------------------------------------------- sessions a refused login leaves


class _SessionInfo(ctypes.Structure):
    _fields_ = [("slotID", ctypes.c_ulong), ("state", ctypes.c_ulong), ("flags", ctypes.c_ulong),
                ("ulDeviceError", ctypes.c_ulong)]


def _open_sessions(token: dict[str, str]) -> int:
    """How many sessions this process has open on the token. SoftHSM2 reports
    no session count (``ulSessionCount`` is CK_UNAVAILABLE_INFORMATION), but
    answers ``C_GetSessionInfo`` for every open handle and numbers handles
    from 1, reusing freed numbers: every handle up to a bound is asked."""
    module = load_module(token["module"])
    dll = ctypes.CDLL(module.real)  # the module python-pkcs11 loaded: the same library state
    dll.C_GetSessionInfo.argtypes = [ctypes.c_ulong, ctypes.POINTER(_SessionInfo)]
    dll.C_GetSessionInfo.restype = ctypes.c_ulong
    with P11_LOCK:
        (found,) = _find_tokens(module, PKCS11URI(token=token["label"]))
        slot, info, count = found.slot.slot_id, _SessionInfo(), 0
        for handle in range(1, 4096):
            if dll.C_GetSessionInfo(handle, ctypes.byref(info)) == 0 and info.slotID == slot:
                count += 1
    return count


def test_a_refused_pin_leaves_no_session_open(token: dict[str, str]) -> None:
    """Each wrong PIN used to leave the session python-pkcs11 opened for the
    login behind: on a real HSM, retries used up its sessions until not even
    the right PIN could open one."""
    before = _open_sessions(token)
    for _ in range(3):
        with pytest.raises(PinIncorrectError) as err:
            open_signer(token["uri"], pin=f"wrong-{SECRET}")
        assert repr(token["label"]) in str(err.value) and SECRET not in str(err.value)
        assert err.value.__cause__ is None and err.value.__context__ is None
    assert _open_sessions(token) == before
    ts = open_token(parse_pkcs11_uri(token["uri"]), pin=PIN)  # the right PIN still logs in
    try:
        assert _open_sessions(token) == before + 1
    finally:
        release_token(ts)
    assert _open_sessions(token) == before


def test_a_login_held_by_other_code_does_not_vouch_for_a_pin(token: dict[str, str]) -> None:
    """Other code in this process (here python-pkcs11 itself) holds a login on
    the token, so the token answers ``UserAlreadyLoggedIn`` to any PIN: a
    wrong one was taken as the PIN this process logged in with — kept for
    reconnects and sent to a signing process, whose login the token then
    counts as a failed one. Now a PIN the token cannot check is refused, and
    the session opened to try it is closed."""
    module = load_module(token["module"])
    with P11_LOCK:
        (found,) = _find_tokens(module, PKCS11URI(token=token["label"]))
        other = found.open(user_pin=PIN)
    try:
        before = _open_sessions(token)
        with pytest.raises(SignerUnavailableError) as err:  # not PinIncorrectError: the right PIN gets it too
            open_token(parse_pkcs11_uri(token["uri"]), pin=f"wrong-{SECRET}")
        assert repr(token["label"]) in str(err.value) and "already logged in" in str(err.value)
        assert SECRET not in str(err.value) and err.value.__context__ is None
        assert _open_sessions(token) == before
        assert not _login_failed(token)  # the wrong PIN never reached the token
        with pytest.raises(SignerUnavailableError, match="already logged in"):
            open_token(parse_pkcs11_uri(token["uri"]), pin=PIN)
        assert _open_sessions(token) == before
    finally:
        with P11_LOCK:
            other.close()
