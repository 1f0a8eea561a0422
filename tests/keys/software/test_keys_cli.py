"""The key commands as an operator meets them, through real ``capseal``
subprocesses (a real SoftHSM2 token, a real swtpm): a text form by default
and ``--json``; ``keys show --outfile`` and ``tpm provision --ak-pem``; a
missing key exits 1; ``keys delete`` asks first (or takes ``--yes``); the TPM
commands take ``CAPSEAL_TCTI`` / ``TPM2TOOLS_TCTI``; doctor says an unknown
scheme is unknown, gives ``chmod 600`` for a key file others can read and
checks (or says it did not check) a TPM key's auth value; a missing extra is
named once, never an internal error; PIN hints name the CLI's options."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

CAPSEAL = str(Path(sys.executable).with_name("capseal"))
SIGN, AK = "0x81000f21", "0x81000f22"  # this module's own handles on the session swtpm


def capseal(*args: str, env: dict[str, str] | None = None, stdin: Any = subprocess.DEVNULL,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("CAPSEAL_PIN", "CAPSEAL_TCTI", "TPM2TOOLS_TCTI")}
    full.update(env or {})
    return subprocess.run([CAPSEAL, *args], capture_output=True, text=True, env=full, timeout=120, stdin=stdin,
                          cwd=cwd, check=False)


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return proc


def test_file_key_commands_have_a_text_form_and_json(tmp_path: Path) -> None:
    key = tmp_path / "seal.pem"
    uri = f"file:{key}"
    text = _ok(capseal("keys", "create", uri, "--alg", "ed25519")).stdout
    assert text.startswith("created EdDSA key\n") and f"uri: {uri}\n" in text and "kid: " in text
    assert "software device: yes" in text and "-----BEGIN PUBLIC KEY-----" in text
    with_json = json.loads(_ok(capseal("keys", "show", uri, "--json")).stdout)
    shown = _ok(capseal("keys", "show", uri)).stdout
    assert f"kid: {with_json['kid']}" in shown and with_json["public_key_pem"] in shown and "{" not in shown
    listed = _ok(capseal("keys", "list", f"file:{tmp_path}")).stdout
    assert listed.split() == ["EdDSA", f"{with_json['kid'][:16]}…", uri]
    assert json.loads(_ok(capseal("keys", "list", f"file:{tmp_path}", "--json")).stdout)[0]["kid"] == with_json["kid"]
    doctor = _ok(capseal("doctor", uri)).stdout
    assert doctor.startswith("[ok] key file: EdDSA key ")
    assert json.loads(_ok(capseal("doctor", uri, "--json")).stdout)[0]["ok"] is True

    # --outfile: the PEM for verify --trust; written again unchanged, never over another file
    pem = tmp_path / "seal.pub.pem"
    for _ in range(2):
        out = _ok(capseal("keys", "show", uri, "--outfile", str(pem)))
        assert pem.read_text() == with_json["public_key_pem"] and f"written to {pem}" in out.stderr
    other = tmp_path / "other.txt"
    other.write_text("mine\n")
    refused = capseal("keys", "show", uri, "--outfile", str(other))
    assert refused.returncode == 2 and "not overwritten" in refused.stderr and other.read_text() == "mine\n"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"action_id": "a-1", "action_type": "decide", "disposition": {
        "decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "executed"}}))
    _ok(capseal("seal", str(spec), "--key", uri, "--ledger", str(tmp_path / "l.db"), "--operator", "acme",
                "--developer", "agent@1"))
    _ok(capseal("verify", str(tmp_path / "l.db"), "--trust", str(pem)))


def test_missing_keys_exit_1_and_an_empty_directory_exits_0(softhsm: Any, swtpm: Any, tmp_path: Path) -> None:
    env = {"CAPSEAL_PIN": softhsm.pin}
    for args in (("keys", "list", "file:/nonexistent"), ("keys", "show", f"file:{tmp_path}/missing.pem"),
                 ("keys", "list", softhsm.uri("no-such-key")), ("keys", "show", softhsm.uri("no-such-key")),
                 ("keys", "list", f"tpm2:handle=0x81000f2f?tcti={swtpm.tcti}"),
                 ("keys", "show", f"tpm2:handle=0x81000f2f?tcti={swtpm.tcti}")):
        proc = capseal(*args, env=env)
        assert proc.returncode == 1, (args, proc.returncode, proc.stderr)
        assert "capseal: error: " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    (tmp_path / "empty").mkdir()
    empty = _ok(capseal("keys", "list", f"file:{tmp_path / 'empty'}"))
    assert empty.stdout.startswith("no keys at ")
    assert json.loads(_ok(capseal("keys", "list", f"file:{tmp_path / 'empty'}", "--json")).stdout) == []
    missing_token = capseal("keys", "list", softhsm.uri(label="no-such-token"), env=env)
    assert missing_token.returncode == 2  # no device to ask: could not run


def _delete_on_a_terminal(uri: str, answer: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``keys delete`` with a terminal for its question, answered ``answer``."""
    main, side = pty.openpty()
    try:
        os.write(main, answer.encode() + b"\n")
        return capseal("keys", "delete", uri, stdin=side, env=env)
    finally:
        os.close(main)
        os.close(side)


def test_keys_delete_asks_first_and_deletes_only_the_key_named(softhsm: Any, swtpm: Any, tmp_path: Path) -> None:
    key = tmp_path / "old.pem"
    uri = f"file:{key}"
    _ok(capseal("keys", "create", uri, "--alg", "p256"))
    no_terminal = capseal("keys", "delete", uri)
    assert no_terminal.returncode == 2 and "pass --yes" in no_terminal.stderr and key.exists()
    kept = _delete_on_a_terminal(uri, "n")
    assert kept.returncode == 1 and "This cannot be undone" in kept.stderr and "nothing deleted" in kept.stderr
    assert key.exists()
    gone = _delete_on_a_terminal(uri, "yes")
    assert gone.returncode == 0 and gone.stdout.startswith(f"deleted {uri} (ES256, kid ") and not key.exists()
    not_a_key = tmp_path / "notes.pem"
    not_a_key.write_text("not a key\n")
    not_a_key.chmod(0o600)
    refused = capseal("keys", "delete", f"file:{not_a_key}", "--yes")
    assert refused.returncode == 2 and not_a_key.exists(), refused.stderr

    env = {"CAPSEAL_PIN": softhsm.pin}
    label = f"del-{os.urandom(3).hex()}"
    for name in (label, f"{label}-keep"):
        _ok(capseal("keys", "create", softhsm.uri(name), "--alg", "ed25519", env=env))
    several = capseal("keys", "delete", softhsm.uri(), "--yes", env=env)
    assert several.returncode == 2 and "names" in several.stderr and "keys" in several.stderr
    result = json.loads(_ok(capseal("keys", "delete", softhsm.uri(label), "--yes", "--json", env=env)).stdout)
    assert result["deleted"] == ["private key", "public key"]
    assert capseal("keys", "list", softhsm.uri(label), env=env).returncode == 1  # gone
    assert _ok(capseal("keys", "list", softhsm.uri(f"{label}-keep"), env=env)).stdout.count("\n") == 1  # kept

    handle = f"tpm2:handle=0x81000f23?tcti={swtpm.tcti}"
    if capseal("keys", "list", handle).returncode == 1:
        _ok(capseal("keys", "create", handle, "--alg", "p256"))
    _ok(capseal("keys", "delete", handle, "--yes"))
    assert capseal("keys", "list", handle).returncode == 1
    keyfile = tmp_path / "k.tss"
    _ok(capseal("keys", "create", f"tpm2:keyfile={keyfile}?tcti={swtpm.tcti}", "--alg", "p256"))
    _ok(capseal("keys", "delete", f"tpm2:keyfile={keyfile}?tcti={swtpm.tcti}", "--yes"))
    assert not keyfile.exists()


def test_tpm_commands_take_the_tcti_from_the_environment(swtpm: Any, tmp_path: Path) -> None:
    ak_pem = tmp_path / "ak.pem"
    provisioned = _ok(capseal("tpm", "provision", "--handle", SIGN, "--ak-handle", AK, "--force", "--ak-pem",
                              str(ak_pem), env={"CAPSEAL_TCTI": swtpm.tcti}))
    assert f"TPM {swtpm.tcti}" in provisioned.stdout and f"signing key: {SIGN} ES256 kid " in provisioned.stdout
    assert f"written to {ak_pem}" in provisioned.stdout and f"--ak {ak_pem}" in provisioned.stdout
    listed = json.loads(_ok(capseal("keys", "list", "tpm2:", "--json", env={"TPM2TOOLS_TCTI": swtpm.tcti})).stdout)
    ak = next(e for e in listed if e["handle"] == AK)
    assert ak["role"] == "attestation-key" and ak_pem.read_text() == ak["public_key_pem"]
    serialization.load_pem_public_key(ak_pem.read_bytes())  # what verify --ak reads
    shown = _ok(capseal("keys", "show", f"tpm2:handle={SIGN}", env={"CAPSEAL_TCTI": swtpm.tcti}))
    assert "software device: yes" in shown.stdout
    # CAPSEAL_TCTI comes first; the URI's own tcti= wins over both; a bad one is named
    both = {"CAPSEAL_TCTI": swtpm.tcti, "TPM2TOOLS_TCTI": "swtpm:host=127.0.0.1,port=1"}
    _ok(capseal("keys", "show", f"tpm2:handle={SIGN}", env=both))
    _ok(capseal("keys", "show", f"tpm2:handle={SIGN}?tcti={swtpm.tcti}", env={"CAPSEAL_TCTI": "device:/nonexistent"}))
    doctor = _ok(capseal("doctor", env={"CAPSEAL_TCTI": swtpm.tcti}))
    assert f"[ok] TPM answers: {swtpm.tcti}" in doctor.stdout
    bad = capseal("keys", "list", "tpm2:", env={"CAPSEAL_TCTI": "cmd:touch /tmp/x"})
    assert bad.returncode == 2 and "environment variable CAPSEAL_TCTI" in bad.stderr, bad.stderr


def test_token_init_has_a_text_form(tmp_path: Path) -> None:
    made = _ok(capseal("token", "init", "--dir", str(tmp_path / "tok"), "--label", "text-form"))
    assert made.stdout.startswith("created SoftHSM2 token 'text-form' (serial ")
    assert "uri: pkcs11:token=text-form?module-path=" in made.stdout and "export SOFTHSM2_CONF=" in made.stdout
    assert f"user PIN: generated into {tmp_path / 'tok' / 'user-pin'}" in made.stdout
    assert (tmp_path / "tok" / "user-pin").read_text().strip() not in made.stdout


def test_doctor_names_an_unknown_scheme_and_a_readable_key_files_fix(tmp_path: Path) -> None:
    unknown = capseal("doctor", "pkcs12:token=x")
    assert unknown.returncode == 1 and "unknown key URI scheme 'pkcs12'" in unknown.stdout
    assert "TPM" not in unknown.stdout  # it ran the TPM checks
    key = tmp_path / "open.pem"
    _ok(capseal("keys", "create", f"file:{key}", "--alg", "ed25519"))
    key.chmod(0o644)
    readable = capseal("doctor", f"file:{key}")
    assert readable.returncode == 1 and f"fix: chmod 600 {key}" in readable.stdout, readable.stdout


def test_doctor_checks_a_tpm_keys_auth_value_or_says_it_did_not(fresh_swtpm: Any, tmp_path: Path) -> None:
    tcti = fresh_swtpm.tcti  # dictionary-attack tries are used up here
    empty = f"tpm2:handle=0x81000f31?tcti={tcti}"
    _ok(capseal("keys", "create", empty, "--alg", "p256"))
    plain = _ok(capseal("doctor", empty))
    assert "[ok] TPM key auth value: the empty auth value works" in plain.stdout, plain.stdout
    authed = f"tpm2:handle=0x81000f32?tcti={tcti}"
    secret = "doctor-auth-Tz4~9"
    _ok(capseal("keys", "create", authed, "--alg", "p256", env={"CAPSEAL_PIN": secret}))
    unchecked = capseal("doctor", authed)
    assert unchecked.returncode == 0 and "[not checked] TPM key auth value: not checked" in unchecked.stdout
    assert "fix: give its auth value with CAPSEAL_PIN, --pin-file FILE or --pin-prompt" in unchecked.stdout
    assert "0 of 3 failed authorizations" in unchecked.stdout  # nothing was tried
    right = _ok(capseal("doctor", authed, env={"CAPSEAL_PIN": secret}))
    assert "[ok] TPM key auth value: the auth value given works" in right.stdout
    wrong = capseal("doctor", authed, env={"CAPSEAL_PIN": "doctor-wrong-Tz4"})
    assert wrong.returncode == 1 and "[FAIL] TPM key auth value" in wrong.stdout and "lockout" in wrong.stdout
    after = capseal("doctor", authed, env={"CAPSEAL_PIN": "doctor-wrong-Tz4"})
    assert "1 of 3 failed authorizations" in after.stdout and "[not checked] TPM key auth value" not in after.stdout
    for proc in (unchecked, right, wrong, after):
        assert secret not in proc.stdout + proc.stderr


_WITHOUT = r"""
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if the extra were not installed: its import fails, find_spec finds nothing
sys.argv = ["capseal"] + sys.argv[2:]
from capseal.cli import main
sys.exit(main())
"""


def _without(extra: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _WITHOUT, extra, *args], capture_output=True, text=True, timeout=120,
                          check=False)


def test_a_missing_extra_is_named_once(softhsm: Any, swtpm: Any, tmp_path: Path) -> None:
    provision = _without("tpm2_pytss", "tpm", "provision", "--tcti", swtpm.tcti)
    assert provision.returncode == 2 and "internal error" not in provision.stderr, provision.stderr
    assert "pip install 'capseal[tpm]'" in provision.stderr and "tpm2_pytss" in provision.stderr
    token = _without("pkcs11", "token", "init", "--dir", str(tmp_path / "t"), "--label", "x")
    assert token.returncode == 2 and "pip install 'capseal[pkcs11]'" in token.stderr, token.stderr
    assert not (tmp_path / "t").exists()
    shown = _without("pkcs11", "keys", "show", softhsm.uri("k"))
    error = shown.stderr.splitlines()[0]
    assert shown.returncode == 2 and error.count("pip install") == 1 and error.count("python-pkcs11") == 1, error
    doctor = _without("pkcs11", "doctor", softhsm.uri("k"))
    assert doctor.returncode == 1 and doctor.stdout.count("pip install 'capseal[pkcs11]'") == 1, doctor.stdout
    assert "[FAIL] python package pkcs11: not installed" in doctor.stdout


def test_pin_hints_name_the_clis_options(softhsm: Any, tmp_path: Path) -> None:
    from capseal.errors import PinIncorrectError
    from capseal.keys import open_signer

    needs = capseal("keys", "show", softhsm.uri("any"))
    assert needs.returncode == 2 and "--pin-file" in needs.stderr and "pin=" not in needs.stderr, needs.stderr
    key = tmp_path / "enc.pem"
    _ok(capseal("keys", "create", f"file:{key}", "--alg", "ed25519", env={"CAPSEAL_PIN": "enc-pass-Wq2"}))
    encrypted = capseal("keys", "show", f"file:{key}")
    assert encrypted.returncode == 2 and "--pin-file" in encrypted.stderr and "as pin" not in encrypted.stderr
    try:  # a program that calls the API is told about pin=
        open_signer(f"file:{key}")
    except PinIncorrectError as exc:
        assert "pin=" in str(exc) and "--pin-file" not in str(exc)
    else:
        raise AssertionError("an encrypted key opened without its passphrase")
