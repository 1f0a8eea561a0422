"""No capseal frame holds a PIN, passphrase or TPM auth value where an error
reporter that captures frame locals would see it: every PIN is held in
capseal's secret type from the moment it is read (a ``--pin-file``, a
``pin-source`` file, ``CAPSEAL_PIN``, ``pin=``, a URI's ``pin-value``, a
secrets handler), so a captured local shows only its redacted form. Each
case is a real failing call, watched frame by frame (tests/secret_frames.py),
with software keys, a real SoftHSM2 token and a real swtpm."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from capseal import cli
from capseal.errors import CapsealError
from capseal.keys import open_signer
from capseal.keys.provision import create_key

from ...secret_frames import shows, watching


def _leaks(secret: str, call: Callable[[], Any], error: type[BaseException] = CapsealError) -> list[str]:
    """The frames that showed ``secret`` while ``call`` failed with ``error``."""
    with watching(secret) as found:
        with pytest.raises(error) as info:
            call()
    for text in (str(info.value), repr(info.value)):
        assert not shows(text, secret), text
    return found


def _cli(*argv: str) -> None:
    """The CLI in this process (so its frames are watched); a refusal exits 2."""
    code = cli.main(list(argv))
    if code != 0:
        raise CapsealError(f"capseal exited {code}")


def _pin_file(path: Path, pin: str, mode: int = 0o600) -> str:
    path.write_text(pin + "\n")
    path.chmod(mode)
    return str(path)


def test_software_key_passphrases_never_sit_in_a_frame(tmp_path: Path, monkeypatch: Any) -> None:
    found: list[str] = []
    uri = f"file:{tmp_path / 'enc.pem'}"
    create_key(uri, "ed25519", pin="right-passphrase-Zr7").close()
    found += _leaks("wrong-passphrase-Aq1", lambda: open_signer(uri, pin="wrong-passphrase-Aq1"))
    found += _leaks("wrong-passphrase-Bq2",
                  lambda: open_signer(uri, secrets_handler=lambda _prompt: "wrong-passphrase-Bq2"))
    exposed = _pin_file(tmp_path / "exposed.pin", "file-passphrase-Cq3", 0o644)  # refused: others can read it
    found += _leaks("file-passphrase-Cq3", lambda: _cli("keys", "show", uri, "--pin-file", exposed))
    wrong = _pin_file(tmp_path / "wrong.pin", "file-passphrase-Dq4")
    found += _leaks("file-passphrase-Dq4", lambda: _cli("keys", "show", uri, "--pin-file", wrong))
    monkeypatch.setenv("CAPSEAL_PIN", "env-passphrase-Eq5")
    found += _leaks("env-passphrase-Eq5", lambda: _cli("keys", "show", uri))
    found += _leaks("env-passphrase-Eq5", lambda: _cli("keys", "create", f"file:{tmp_path}/no/such/dir.pem",
                                                    "--alg", "ed25519"))
    assert found == [], "\n".join(found)



def test_pkcs11_pins_never_sit_in_a_frame(softhsm: Any, tmp_path: Path, monkeypatch: Any) -> None:
    found: list[str] = []
    with create_key(softhsm.uri(f"locals-{os.urandom(3).hex()}"), "ed25519", pin=softhsm.pin) as made:
        uri = made.uri
    plain = uri.split("?", 1)
    found += _leaks("wrong-pin-Fq6", lambda: open_signer(uri, pin="wrong-pin-Fq6"))
    found += _leaks("wrong-pin-Gq7", lambda: open_signer(f"{plain[0]}?{plain[1]}&pin-value=wrong-pin-Gq7"))
    found += _leaks("wrong-pin-Hq8", lambda: open_signer(uri, secrets_handler=lambda _prompt: "wrong-pin-Hq8"))
    exposed = _pin_file(tmp_path / "exposed.pin", "source-pin-Iq9", 0o644)
    found += _leaks("source-pin-Iq9", lambda: open_signer(f"{plain[0]}?{plain[1]}&pin-source=file:{exposed}"))
    wrong = _pin_file(tmp_path / "wrong.pin", "source-pin-Jr1")
    found += _leaks("source-pin-Jr1", lambda: open_signer(f"{plain[0]}?{plain[1]}&pin-source=file:{wrong}"))
    # the right PIN, and then something else fails: the PIN the token took is held all the while
    missing = softhsm.uri("no-such-key")
    found += _leaks(softhsm.pin, lambda: open_signer(missing, pin=softhsm.pin))
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")  # the signing process cannot start
    found += _leaks(softhsm.pin, lambda: open_signer(uri, pin=softhsm.pin, signing_process=True))
    monkeypatch.undo()
    right = _pin_file(tmp_path / "right.pin", softhsm.pin)
    found += _leaks(softhsm.pin, lambda: _cli("keys", "show", missing, "--pin-file", right))
    found += _leaks("source-pin-Jr1", lambda: _cli("keys", "list", softhsm.uri(), "--pin-file", wrong))
    monkeypatch.setenv("CAPSEAL_PIN", "env-pin-Kr2")
    found += _leaks("env-pin-Kr2", lambda: _cli("doctor", uri))
    (tmp_path / "a-file").write_text("")
    found += _leaks("env-pin-Kr2", lambda: _cli("token", "init", "--dir", str(tmp_path / "a-file"),
                                              "--label", "locals"))  # refused: --dir is a file
    assert found == [], "\n".join(found)



def test_tpm_auth_values_never_sit_in_a_frame(fresh_swtpm: Any, tmp_path: Path, monkeypatch: Any) -> None:
    tcti = fresh_swtpm.tcti  # a TPM of its own: its worker thread starts while the frames are watched
    keyfile = f"tpm2:keyfile={tmp_path / 'auth.tss'}?tcti={tcti}"
    with watching("right-auth-Lr3") as found:
        create_key(keyfile, "p256", pin="right-auth-Lr3").close()
    found += _leaks("wrong-auth-Mr4", lambda: open_signer(keyfile, pin="wrong-auth-Mr4").sign(b"m"))
    found += _leaks("wrong-auth-Nr5",
                  lambda: open_signer(keyfile, secrets_handler=lambda _prompt: "wrong-auth-Nr5").sign(b"m"))
    long_auth = "too-long-auth-Or6-" + "x" * 60
    found += _leaks(long_auth, lambda: create_key(f"tpm2:handle=0x81000f10?tcti={tcti}", "p256", pin=long_auth))
    found += _leaks("any-auth-Pr7", lambda: open_signer(f"tpm2:handle=0x81000f11?tcti={tcti}", pin="any-auth-Pr7"))
    exposed = _pin_file(tmp_path / "exposed.pin", "file-auth-Qr8", 0o644)
    found += _leaks("file-auth-Qr8", lambda: _cli("keys", "show", keyfile, "--pin-file", exposed))
    monkeypatch.setenv("CAPSEAL_PIN", "env-auth-Rr9")
    found += _leaks("env-auth-Rr9", lambda: _cli("keys", "show", f"tpm2:handle=0x81000f12?tcti={tcti}"))
    assert found == [], "\n".join(found)
