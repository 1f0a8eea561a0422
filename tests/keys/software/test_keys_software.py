"""Software keys, the URI registry and plain COSE_Sign1 envelopes (ES256/PS256),
checked with pycose and scitt-cose as independent verifiers."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import capseal
from capseal import Producer
from capseal.envelope import PLAIN, PROFILE, verify_cose_sign1
from capseal.errors import KeyNotFoundError, KeyURIError, PinIncorrectError
from capseal.keys import (
    FileSigner,
    UnsafeEphemeralSigner,
    generate_private_key,
    kid_for,
    open_signer,
    redact_uri,
    write_pkcs8,
)
from capseal.keys.provision import create_key

from ...cose_checks import assert_envelope_verifies_independently
from ...secret_files import write_secret


@pytest.mark.parametrize("alg", ["EdDSA", "ES256", "PS256"])
def test_envelopes_verify_with_independent_libraries(tmp_path: Path, alg: str) -> None:
    signer = UnsafeEphemeralSigner(alg)
    with Producer("acme", "agent@1", signer, tmp_path / "l.db") as producer:
        record = producer.seal({"action_id": "a", "action_type": "fyi"})
    env = record.envelopes[0]
    assert env.alg == alg and env.kid == signer.kid == kid_for(signer.public_key)
    if alg == "EdDSA":
        assert env.profile == PROFILE and record.capsule["signature"] == env.cose.hex()
    else:
        assert env.profile == PLAIN and "signature" not in record.capsule  # never inline: the reference would call it invalid
    assert_envelope_verifies_independently(env.cose, signer.public_key_pem(), bytes.fromhex(record.capsule_id), alg)
    assert verify_cose_sign1(env.cose, signer.public_key, payload=bytes.fromhex(record.capsule_id)).ok
    tampered = bytearray(env.cose)
    tampered[-1] ^= 1
    assert not verify_cose_sign1(bytes(tampered), signer.public_key).ok
    # the ledger learns the public key from the epoch custody statement and checks the envelope
    report = capseal.verify_ledger(tmp_path / "l.db")
    assert report.ok and all(r.signature == "authored" for r in report.records)


def test_encrypted_file_key_and_pin_hygiene(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "correct-horse-battery-staple"
    path = tmp_path / "k.pem"
    write_pkcs8(generate_private_key("ES256"), path, passphrase=secret.encode())
    signer = open_signer(f"file:{path}", pin=secret)
    assert signer.alg == "ES256"
    with pytest.raises(PinIncorrectError) as wrong:
        open_signer(f"file:{path}", pin="not-it")
    with pytest.raises(PinIncorrectError) as missing:
        FileSigner(path)
    assert open_signer(f"file:{path}", secrets_handler=lambda prompt: secret).kid == signer.kid
    for text in (str(wrong.value), repr(wrong.value), str(missing.value), repr(signer), str(signer.describe()), caplog.text):
        assert secret not in text and "not-it" not in text
    assert signer.describe()["encrypted"] is True and signer.describe()["file_mode"] == "0600"


def test_file_key_errors(tmp_path: Path) -> None:
    with pytest.raises(KeyNotFoundError, match="no key file"):
        open_signer(f"file:{tmp_path}/absent.pem")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(KeyNotFoundError, match="not a PEM private key"):
        open_signer(f"file:{tmp_path}/junk.pem")
    with pytest.raises(FileExistsError):
        write_pkcs8(generate_private_key("EdDSA"), tmp_path / "junk.pem")  # never overwrites


def test_registry_and_redaction() -> None:
    with pytest.raises(KeyURIError, match="unknown key URI scheme"):
        open_signer("gpg:whatever")
    with pytest.raises(KeyURIError):
        open_signer("no-scheme-here")
    uri = "pkcs11:token=t;object=k?module-path=/m.so&pin-value=1234"
    assert "1234" not in redact_uri(uri) and "pin-value=***" in redact_uri(uri)


def test_cli_keys_file_roundtrip(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    cli = Path(sys.executable).parent / "capseal"
    created = json.loads(subprocess.run([str(cli), "keys", "create", f"file:{tmp_path}/a.pem", "--alg", "p256", "--json"],
                                        check=True, capture_output=True, text=True).stdout)
    shown = json.loads(subprocess.run([str(cli), "keys", "show", f"file:{tmp_path}/a.pem", "--json"],
                                      check=True, capture_output=True, text=True).stdout)
    listed = json.loads(subprocess.run([str(cli), "keys", "list", f"file:{tmp_path}", "--json"], check=True, capture_output=True,
                                       text=True).stdout)
    assert created["kid"] == shown["kid"] == listed[0]["kid"] and shown["alg"] == "ES256"
    assert shown["custody"]["software_device"] is True


def test_file_key_passphrase_that_is_not_text_is_a_typed_error_that_never_holds_it(tmp_path: Path) -> None:
    """A passphrase that is bytes, not a str or not UTF-8 (a lone surrogate
    from os.fsdecode) was an AttributeError or a UnicodeEncodeError whose args
    hold the whole passphrase; create_key then left nothing, and must still."""
    path = tmp_path / "k.pem"
    write_pkcs8(generate_private_key("ES256"), path, passphrase=b"s3cret")
    tries = [({"pin": b"s3cret"}, "pin="), ({"pin": "s3cret\udcff"}, "pin="),
             ({"secrets_handler": lambda prompt: 1234}, "secrets_handler"),
             ({"secrets_handler": lambda prompt: "s3cret\udcff"}, "secrets_handler")]
    for kwargs, source in tries:
        with pytest.raises(PinIncorrectError, match=source) as err:
            open_signer(f"file:{path}", **kwargs)  # type: ignore[arg-type]
        assert err.value.__cause__ is None and err.value.__context__ is None
        assert "s3cret" not in repr(err.value.args) and "s3cret" not in str(err.value)
    with pytest.raises(PinIncorrectError) as err:
        create_key(f"file:{tmp_path}/new.pem", "p256", pin="x\udcffs3cret")
    assert "s3cret" not in repr(err.value.args) and not (tmp_path / "new.pem").exists()


def test_file_uri_with_a_nul_byte_is_a_key_uri_error(tmp_path: Path) -> None:
    """``%00`` decodes to a NUL, which no path holds: open and create raised
    a bare ValueError ('embedded null byte') from the OS call."""
    for uri in (f"file:{tmp_path}/a%00b.pem", f"file:{tmp_path}/a\x00b.pem"):
        with pytest.raises(KeyURIError, match="NUL"):
            open_signer(uri)
        with pytest.raises(KeyURIError, match="NUL"):
            create_key(uri, "ed25519")
    assert list(tmp_path.iterdir()) == []


def test_file_signer_uri_opens_the_same_key_again(tmp_path: Path) -> None:
    """A signer's uri (printed by keys create/show/list, sealed nowhere else)
    was ``file:`` + the raw path: a '?' in the name made it a refused query,
    a '%41' in the name opened another file, 'pA.pem'."""
    import json
    import subprocess
    import sys

    for name, encoded in (("a?b.pem", "a%3Fb.pem"), ("p%41.pem", "p%2541.pem"), ("c d#e.pem", "c%20d%23e.pem")):
        write_pkcs8(generate_private_key("EdDSA"), tmp_path / name)
        signer = open_signer(f"file:{tmp_path}/{encoded}")
        assert open_signer(signer.uri).kid == signer.kid
    (tmp_path / "p%41.pem").rename(tmp_path / "p%41.x")  # leave one .pem, whose listed uri must open it
    (tmp_path / "a?b.pem").unlink()
    cli = Path(sys.executable).parent / "capseal"
    listed = json.loads(subprocess.run([str(cli), "keys", "list", f"file:{tmp_path}", "--json"], check=True,
                                       capture_output=True, text=True).stdout)
    assert [open_signer(k["uri"]).kid for k in listed] == [k["kid"] for k in listed] != []


def test_unsupported_file_key_says_what_is_wrong_with_it(tmp_path: Path) -> None:
    """RSA under 2048 bits and curves other than P-256/P-384 were refused as
    'keys of type RSAPublicKey/ECPublicKey are not supported', which reads as
    if RSA or EC keys were not supported at all."""
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    from capseal.errors import UnsupportedAlgorithmError

    write_pkcs8(rsa.generate_private_key(public_exponent=65537, key_size=1024), tmp_path / "rsa.pem")
    write_pkcs8(ec.generate_private_key(ec.SECP256K1()), tmp_path / "k1.pem")
    with pytest.raises(UnsupportedAlgorithmError, match="1024.*2048"):
        open_signer(f"file:{tmp_path}/rsa.pem")
    with pytest.raises(UnsupportedAlgorithmError, match="secp256k1.*P-256"):
        open_signer(f"file:{tmp_path}/k1.pem")


def test_secrets_handler_is_asked_for_any_encrypted_pem(tmp_path: Path) -> None:
    """The handler was asked only when 'ENCRYPTED PRIVATE KEY' was in the
    first 64 bytes: an encrypted traditional PEM (Proc-Type: 4,ENCRYPTED, as
    openssl ec/rsa -aes256 writes) or a PKCS#8 PEM after text (Bag
    Attributes from openssl pkcs12) was refused as 'pass its passphrase'."""
    from cryptography.hazmat.primitives import serialization

    key = generate_private_key("ES256")
    enc = serialization.BestAvailableEncryption(b"pw")
    write_secret(tmp_path / "trad.pem",
                   key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, enc))
    write_secret(tmp_path / "bag.pem", b"Bag Attributes\n    localKeyID: 01 02 03 04 05 06 07 08 09 0A\n"
                   b"Key Attributes: <No Attributes>\n"
                   + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc))
    prompts: list[str] = []

    def handler(prompt: str) -> str:
        prompts.append(prompt)
        return "pw"

    for name in ("trad.pem", "bag.pem"):
        signer = open_signer(f"file:{tmp_path}/{name}", secrets_handler=handler)
        assert signer.kid == kid_for(key.public_key())
    assert len(prompts) == 2


def test_keys_create_file_refusals_are_typed_and_change_nothing(tmp_path: Path) -> None:
    """An existing file, a symlink planted at the path (even a dangling one)
    and a missing directory: create_key raised bare FileExistsError /
    FileNotFoundError, which the CLI printed as 'internal error'."""
    import subprocess
    import sys

    write_pkcs8(generate_private_key("EdDSA"), tmp_path / "old.pem")
    before = (tmp_path / "old.pem").read_bytes()
    (tmp_path / "link.pem").symlink_to(tmp_path / "target.pem")
    with pytest.raises(KeyURIError, match="already exists.*never overwrites"):
        create_key(f"file:{tmp_path}/old.pem", "ed25519")
    with pytest.raises(KeyURIError, match="already exists"):
        create_key(f"file:{tmp_path}/link.pem", "ed25519")
    with pytest.raises(KeyURIError, match="cannot write key file"):
        create_key(f"file:{tmp_path}/no-dir/k.pem", "ed25519")
    assert (tmp_path / "old.pem").read_bytes() == before and not (tmp_path / "target.pem").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.pem", "old.pem"]
    cli = Path(sys.executable).parent / "capseal"
    run = subprocess.run([str(cli), "keys", "create", f"file:{tmp_path}/old.pem", "--alg", "p256"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "internal error" not in run.stderr and "already exists" in run.stderr


def test_a_key_file_that_cannot_be_written_in_full_is_not_left_behind(tmp_path: Path) -> None:
    """A write that fails part-way (disk full; here a file-size limit in a
    child process) left a truncated PEM at the path: it loads as 'not a PEM
    private key' and blocks creating the key again ('already exists')."""
    import subprocess
    import sys

    child = (
        "import resource, signal, sys\n"
        "from capseal.errors import KeyURIError\n"
        "from capseal.keys.provision import create_key\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "try:\n"
        "    create_key(sys.argv[1], 'rsa-pss')\n"
        "except KeyURIError as exc:\n"
        "    print(exc)\n"
    )
    run = subprocess.run([sys.executable, "-c", child, f"file:{tmp_path}/k.pem"], capture_output=True, text=True)
    assert run.returncode == 0 and "cannot write key file" in run.stdout, run.stderr
    assert list(tmp_path.iterdir()) == []


_READ_IN_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # the old code read /dev/zero until memory ran out
from capseal.errors import CapsealError
from capseal.keys import open_signer
from capseal.keys.secret import read_pin_file
try:
    eval(sys.argv[1])
except CapsealError as exc:
    print(type(exc).__name__ + ": " + str(exc))
"""


@pytest.mark.parametrize(("call", "error"), [
    ("open_signer('file:/dev/zero')", "KeyNotFoundError: key file /dev/zero holds more than"),
    ("open_signer('file:{huge}')", "KeyNotFoundError: key file {huge} holds more than"),
    ("open_signer('tpm2:keyfile=/dev/zero')", "KeyNotFoundError: TPM key file /dev/zero holds more than"),
    ("read_pin_file('/dev/zero', 'pin-source /dev/zero')", "KeyURIError: pin-source /dev/zero holds more than"),
])
def test_a_key_or_pin_file_is_read_up_to_a_bound(tmp_path: Path, call: str, error: str) -> None:
    """A key or PIN "file" that never ends (/dev/zero) was read until memory
    ran out (here: MemoryError under a 1 GiB limit); a huge file was read
    whole. Each is now refused after a bounded read, with a typed error
    naming the file. (Pipes still work: only the size is bounded.)"""
    import subprocess
    import sys

    huge = tmp_path / "key.pem"
    with open(huge, "wb") as fh:
        fh.truncate(64 << 20)
    proc = subprocess.run([sys.executable, "-c", _READ_IN_CHILD, call.format(huge=huge)], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.startswith(error.format(huge=huge)), (proc.stdout, proc.stderr[-300:])


def test_file_uris_say_what_is_wrong_and_round_trip_any_file_name(tmp_path: Path) -> None:
    """A query or fragment was refused as "not a file: key URI: file:…",
    naming nothing wrong; and a file name that is not UTF-8 (percent-encoded
    by the URI capseal prints) was read back as U+FFFD: another file."""
    from capseal.keys._software import FileSigner, file_uri

    with pytest.raises(KeyURIError, match="query"):
        FileSigner.path_of("file:/etc/k.pem?pin=1")
    with pytest.raises(KeyURIError, match="fragment"):
        FileSigner.path_of("file:/etc/k.pem#x")
    odd = os.fsdecode(bytes(tmp_path) + b"/k\xff.pem")  # a name that is not UTF-8
    assert FileSigner.path_of(file_uri(odd)) == odd
    created = create_key(file_uri(odd), "ed25519")
    assert os.path.exists(odd) and created.uri == file_uri(odd)
    assert open_signer(created.uri).kid == created.kid


@pytest.mark.parametrize(("mode", "said"), [
    (0o644, "can be read by every user of this host (mode 0644)"),
    (0o604, "can be read by every user of this host (mode 0604)"),
    (0o602, "can be changed by every user of this host (mode 0602)"),
    (0o666, "can be read and changed by every user of this host (mode 0666)"),
    (0o620, "can be changed by its group (mode 0620)"),
    (0o640, "is owned by this user and readable by its group (mode 0640)"),
])
def test_a_key_file_other_users_can_use_is_refused(tmp_path: Path, mode: int, said: str) -> None:
    """A private key file every user of the host could read (the default
    umask's 0644) was loaded and signed with; its mode only showed in the
    custody statement. It is now refused as OpenSSH refuses one, with the
    fix, and nothing is sealed; the same key at 0600 or 0400 opens."""
    from capseal.errors import SecretFileExposedError

    path = tmp_path / "k.pem"
    write_pkcs8(generate_private_key("EdDSA"), path)
    key_pem = path.read_text()
    path.chmod(mode)
    with pytest.raises(SecretFileExposedError) as caught:
        open_signer(f"file:{path}")
    message = str(caught.value)
    assert message == f"key file {path} {said}: whoever can read it can sign as this key; refused, as OpenSSH refuses such a key"
    assert caught.value.hint == f"chmod 600 {path}"
    assert key_pem.splitlines()[1] not in message + repr(caught.value)
    for ok in (0o600, 0o400):
        path.chmod(ok)
        assert open_signer(f"file:{path}").describe()["file_mode"] == f"{ok:04o}"


def test_the_exposure_rule_spares_a_service_group_and_pipes() -> None:
    """Group read is refused only on the user's own file (OpenSSH's rule):
    ``root:capseal 0640`` is how a key is kept for a service's group. A
    pipe (``file:/dev/stdin``) is private to its two ends and not checked."""
    import stat

    from capseal.keys.secret import exposure

    def status(kind: int, mode: int, uid: int) -> os.stat_result:
        return os.stat_result((kind | mode, 1, 1, 1, uid, 0, 100, 0, 0, 0))

    me, other = os.getuid(), os.getuid() + 1
    assert exposure(status(stat.S_IFREG, 0o640, other)) is None
    assert exposure(status(stat.S_IFREG, 0o640, me)) is not None
    assert exposure(status(stat.S_IFREG, 0o660, other)) == "can be changed by its group (mode 0660)"
    assert exposure(status(stat.S_IFREG, 0o644, other)) == "can be read by every user of this host (mode 0644)"
    assert exposure(status(stat.S_IFIFO, 0o666, me)) is None
    assert exposure(status(stat.S_IFREG, 0o600, me)) is None


def test_a_relative_file_uri_is_refused_and_printed_uris_are_absolute(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``file:k.pem`` opened whichever k.pem the working directory held (RFC
    8089 paths are absolute), and a key opened by a relative path printed a
    relative URI that named another file from another directory."""
    write_pkcs8(generate_private_key("EdDSA"), tmp_path / "k.pem")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KeyURIError, match=r"absolute path \(RFC 8089\)"):
        open_signer("file:k.pem")
    with pytest.raises(KeyURIError, match="absolute path"):
        create_key("file:new.pem", "ed25519")
    assert not (tmp_path / "new.pem").exists()
    signer = FileSigner("k.pem")
    assert signer.uri == f"file:{tmp_path}/k.pem"
    monkeypatch.chdir("/")
    assert open_signer(signer.uri).kid == signer.kid
