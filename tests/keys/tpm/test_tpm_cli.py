"""The operator CLI against a real swtpm, run as a subprocess: `capseal tpm
provision` (signing key + attestation key, refusing to overwrite without
--force), `keys show|list|create` on tpm2: URIs, `doctor`, and `seal`/`verify`
with a TPM key."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from capseal.keys.tpm import verify_certify

CAPSEAL = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "capseal")
KEY, AK = "0x81000b01", "0x81000b02"  # a range of our own on the shared session swtpm


def capseal(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([CAPSEAL, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TSS2_LOG": "all+NONE"})
    if check and proc.returncode != 0:
        pytest.fail(f"capseal {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    assert "Traceback" not in proc.stderr
    return proc


@pytest.fixture(scope="module")
def provisioned(swtpm: Any) -> dict[str, Any]:
    out = capseal("tpm", "provision", "--tcti", swtpm.tcti, "--handle", KEY, "--ak-handle", AK, "--force", "--json")
    return json.loads(out.stdout)


def test_provision_prints_handles_keys_and_names(provisioned: dict[str, Any], swtpm: Any) -> None:
    info = provisioned
    assert info["tcti"] == swtpm.tcti and info["software_device"] is True
    sk, ak = info["signing_key"], info["attestation_key"]
    assert (sk["handle"], ak["handle"]) == (KEY, AK)
    assert sk["alg"] == "ES256" and sk["role"] == "signing-key" and sk["public_key_pem"].startswith("-----BEGIN PUBLIC KEY")
    assert ak["role"] == "attestation-key" and ak["template"] == "ecc256:ecdsa-sha256:null"
    assert ak["attributes"]["restricted"] and ak["attributes"]["fixedTPM"] and ak["attributes"]["sign"]
    assert len(sk["name"]) == len(ak["name"]) == 68  # sha256 nameAlg + digest
    assert sk["uri"] == f"tpm2:handle={KEY}?tcti={swtpm.tcti}&ak-handle={AK}"
    certify = info["custody"]["tpm_certify"]
    assert certify["key_name"] == sk["name"] and certify["ak_name"] == ak["name"]
    assert verify_certify(certify) == []


def test_provision_refuses_to_overwrite_without_force(provisioned: dict[str, Any], swtpm: Any) -> None:
    again = capseal("tpm", "provision", "--tcti", swtpm.tcti, "--handle", KEY, "--ak-handle", AK, check=False)
    assert again.returncode == 2
    assert "already has keys" in again.stderr and "--force" in again.stderr and KEY in again.stderr
    shown = json.loads(capseal("keys", "show", provisioned["signing_key"]["uri"], "--json").stdout)
    assert shown["kid"] == provisioned["signing_key"]["kid"]  # still the same key
    eddsa = capseal("tpm", "provision", "--tcti", swtpm.tcti, "--handle", "0x81000b05", "--ak-handle", "0x81000b06",
                    "--alg", "ed25519", check=False)
    assert eddsa.returncode == 2 and "TPM_ALG_EDDSA" in eddsa.stderr


def test_keys_show_and_list(provisioned: dict[str, Any], swtpm: Any) -> None:
    uri = provisioned["signing_key"]["uri"]
    shown = json.loads(capseal("keys", "show", uri, "--json").stdout)
    assert shown["uri"] == uri and shown["alg"] == "ES256"
    assert shown["public_key_pem"] == provisioned["signing_key"]["public_key_pem"]
    custody = shown["custody"]
    assert custody["software_device"] is True and custody["backend"] == "tpm2"
    assert custody["key_attributes"]["fixedTPM"] and custody["key_attributes"]["sensitiveDataOrigin"]
    assert verify_certify(custody["tpm_certify"]) == []
    text = capseal("keys", "show", uri).stdout
    assert "-----BEGIN PUBLIC KEY-----" in text and f"kid: {shown['kid']}" in text

    listed = {e["handle"]: e for e in json.loads(capseal("keys", "list", f"tpm2:?tcti={swtpm.tcti}", "--json").stdout)}
    assert listed[KEY]["kid"] == shown["kid"] and listed[AK]["role"] == "attestation-key"
    # a URI naming a handle lists that key only (the handle was ignored: every key was listed)
    one = json.loads(capseal("keys", "list", f"tpm2:handle={KEY}?tcti={swtpm.tcti}", "--json").stdout)
    assert [e["handle"] for e in one] == [KEY] and one[0]["kid"] == shown["kid"]
    nothing = capseal("keys", "list", f"tpm2:handle=0x81000b7f?tcti={swtpm.tcti}", "--json", check=False)
    assert json.loads(nothing.stdout) == [] and nothing.returncode == 1  # a key the URI names is missing: not ok

    missing = capseal("keys", "show", f"tpm2:handle=0x81000b7f?tcti={swtpm.tcti}", check=False)
    assert missing.returncode == 1 and "no key at persistent handle 0x81000b7f" in missing.stderr  # missing: not ok
    assert swtpm.tcti in missing.stderr


def test_keys_create_key_file(swtpm: Any, tmp_path: Path) -> None:
    path = tmp_path / "seal.tss"
    uri = f"tpm2:keyfile={path}?tcti={swtpm.tcti}"
    created = json.loads(capseal("keys", "create", uri, "--alg", "p256", "--json").stdout)
    assert created["alg"] == "ES256" and created["custody"]["key_store"] == "tpm2-keyfile"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().startswith("-----BEGIN TSS2 PRIVATE KEY-----")
    again = capseal("keys", "create", uri, "--alg", "p256", check=False)
    assert again.returncode == 2 and "never overwrites" in again.stderr
    nowhere = capseal("keys", "create", f"tpm2:keyfile={tmp_path / 'no' / 'such' / 'k.tss'}?tcti={swtpm.tcti}",
                      "--alg", "p256", check=False)
    assert nowhere.returncode == 2 and "cannot write key file" in nowhere.stderr


def test_doctor_checks_the_tpm_and_key(provisioned: dict[str, Any], swtpm: Any) -> None:
    out = capseal("doctor", provisioned["signing_key"]["uri"], "--json", check=False)
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert out.returncode == 0, checks
    assert "software TPM" in checks["TPM answers"]["detail"]
    for name in ("TPM answers", "TPM lockout", "TPM object slots", "TPM key", "TPM key algorithm", "TPM attestation key"):
        assert checks[name]["ok"], checks[name]
    bad = capseal("doctor", f"tpm2:handle=0x81000b7f?tcti={swtpm.tcti}", "--json", check=False)
    failed = {c["name"]: c for c in json.loads(bad.stdout) if not c["ok"]}
    assert bad.returncode == 1 and "TPM key" in failed
    assert failed["TPM key"]["fix"] == f"capseal keys create 'tpm2:handle=0x81000b7f?tcti={swtpm.tcti}' --alg p256"


def test_seal_and_verify_with_a_tpm_key(provisioned: dict[str, Any], tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"action_id": "po-1", "action_type": "fyi"}, {"action_id": "po-2", "action_type": "fyi"}]))
    ledger = tmp_path / "l.db"
    capseal("seal", str(spec), "--key", provisioned["signing_key"]["uri"], "--ledger", str(ledger),
            "--operator", "acme", "--developer", "agent@1")
    verified = capseal("verify", str(ledger), "--json", check=False)
    report = json.loads(verified.stdout)
    assert verified.returncode == 0 and report["ok"] and report["counts"]["records"] == 3


# ---------------------------------------------------------------------------- review fixes


def test_missing_key_hint_creates_just_that_key_on_a_provisioned_tpm(fresh_swtpm: Any) -> None:
    """The "no key at handle" hint (keys show and doctor) is `keys create` for
    that handle: on a provisioned TPM it works and leaves the AK alone, where
    the old hint (`tpm provision --handle`) refused, and its --force would
    have replaced the pinned AK."""
    tcti = fresh_swtpm.tcti
    first = json.loads(capseal("tpm", "provision", "--tcti", tcti, "--json").stdout)
    missing = f"tpm2:handle=0x81000103?tcti={tcti}"
    expected = f"capseal keys create '{missing}' --alg p256"
    shown = capseal("keys", "show", missing, check=False)
    assert shown.returncode == 1 and f"hint: Create one: {expected}" in shown.stderr  # a missing key: not ok
    doctor = json.loads(capseal("doctor", missing, "--json", check=False).stdout)
    assert [c["fix"] for c in doctor if c["name"] == "TPM key"] == [expected]
    created = capseal(*shlex.split(expected)[1:], "--json")  # the hint, run as written
    assert json.loads(created.stdout)["uri"] == missing
    listed = {e["handle"]: e for e in json.loads(capseal("keys", "list", f"tpm2:?tcti={tcti}", "--json").stdout)}
    assert listed["0x81000102"]["name"] == first["attestation_key"]["name"]  # the pinned AK is untouched


def test_bad_tpm_arguments_are_typed_errors_not_tracebacks(swtpm: Any) -> None:
    """A key file path with a NUL byte, a handle that is not a number and an
    empty TCTI: exit 2 with a message naming the problem, no internal error."""
    nul = capseal("keys", "show", f"tpm2:keyfile=%00k.tss?tcti={swtpm.tcti}", check=False)
    assert nul.returncode == 2 and "NUL byte" in nul.stderr and "internal error" not in nul.stderr
    for option, value in (("--handle", "zz"), ("--ak-handle", "0x8100_0102")):
        bad = capseal("tpm", "provision", "--tcti", swtpm.tcti, option, value, check=False)
        assert bad.returncode == 2 and f"{option} {value!r} is not a TPM handle" in bad.stderr, bad.stderr
        assert "internal error" not in bad.stderr
    empty = capseal("tpm", "provision", "--tcti", "", check=False)
    assert empty.returncode == 2 and "--tcti is empty" in empty.stderr


def test_read_keyfile_refuses_a_nul_path_with_a_typed_error() -> None:
    from capseal.errors import KeyURIError
    from capseal.keys.tpm._objects import read_keyfile  # the reader itself: a NUL no URI parser lets through

    with pytest.raises(KeyURIError, match="not a usable path"):
        read_keyfile("/tmp/a\x00b.tss")


@pytest.mark.parametrize("public", [b"\x00\x04abcd", b"\x00\x00", b"\x00"])
def test_a_key_file_with_a_garbled_public_area_is_a_typed_error(swtpm: Any, tmp_path: Path, public: bytes) -> None:
    """Before: `keys list` on such a file ended in "internal error: ValueError:
    unsupported digest algorithm" (or a raw TSS2_Exception from the API)."""
    from capseal.errors import KeyURIError
    from capseal.keys import open_signer
    from capseal.keys.provision import list_keys
    from capseal.keys.tpm import TPMKeyFile

    path = tmp_path / "garbled.tss"
    path.write_bytes(TPMKeyFile(public=public, private=b"\x00\x02ab").to_pem())
    uri = f"tpm2:keyfile={path}?tcti={swtpm.tcti}"
    for call in (lambda: list_keys(uri), lambda: open_signer(uri)):
        with pytest.raises(KeyURIError, match="not a TPM2B_PUBLIC"):
            call()
    listed = capseal("keys", "list", uri, check=False)
    assert listed.returncode == 2 and "not a TPM2B_PUBLIC" in listed.stderr and "internal error" not in listed.stderr


def test_auth_value_refusals_tell_the_operator_how_to_give_it(fresh_swtpm: Any, tmp_path: Path) -> None:
    """A key with an auth value and no PIN at the CLI: for a key file the
    error said "pass it as pin= (or a secrets handler)" (a Python argument),
    and doctor printed no fix line; a key at a handle, which gets the empty
    auth value tried, failed with "wrong or missing pin" and no hint, though
    each such refusal counts toward the TPM's dictionary-attack lockout.
    Now both name CAPSEAL_PIN / --pin-file / --pin-prompt, and the refusal
    the TPM counted says so. (A fresh swtpm: this uses up a lockout try.)"""
    secret = "auth-cli-Kz8~41"
    keyfile = tmp_path / "authed.tss"
    env = {**os.environ, "TSS2_LOG": "all+NONE", "CAPSEAL_PIN": secret}
    for uri in (f"tpm2:keyfile={keyfile}?tcti={fresh_swtpm.tcti}", f"tpm2:handle=0x81000b21?tcti={fresh_swtpm.tcti}"):
        made = subprocess.run([CAPSEAL, "keys", "create", uri, "--alg", "p256", "--json"], capture_output=True, text=True,
                              timeout=120, env=env)
        assert made.returncode == 0, made.stderr
        assert json.loads(made.stdout)["custody"]["key_attributes"]["noDA"] is False

    no_pin = capseal("keys", "show", f"tpm2:keyfile={keyfile}?tcti={fresh_swtpm.tcti}", check=False)
    assert no_pin.returncode == 2 and "nothing was sent to the TPM" in no_pin.stderr, no_pin.stderr
    assert "CAPSEAL_PIN" in no_pin.stderr and "--pin-file" in no_pin.stderr, no_pin.stderr
    doctor = capseal("doctor", f"tpm2:keyfile={keyfile}?tcti={fresh_swtpm.tcti}", check=False)
    assert doctor.returncode == 1 and "[FAIL] TPM key" in doctor.stdout, doctor.stdout
    assert "fix: give it with CAPSEAL_PIN" in doctor.stdout, doctor.stdout
    assert "0 of 3 failed authorizations" in doctor.stdout  # refused before the TPM saw it

    at_handle = capseal("keys", "show", f"tpm2:handle=0x81000b21?tcti={fresh_swtpm.tcti}", check=False)
    assert at_handle.returncode == 2 and "refused its auth value" in at_handle.stderr, at_handle.stderr
    assert "hint:" in at_handle.stderr and "CAPSEAL_PIN" in at_handle.stderr, at_handle.stderr
    assert "dictionary-attack lockout" in at_handle.stderr, at_handle.stderr
    after = capseal("doctor", "--tcti", fresh_swtpm.tcti, check=False)
    assert "1 of 3 failed authorizations" in after.stdout, after.stdout
    for proc in (no_pin, doctor, at_handle, after):
        assert secret not in proc.stdout + proc.stderr


def test_an_unreachable_tpm_error_says_how_to_reach_it(fresh_swtpm: Any) -> None:
    """`capseal tpm provision` / `keys show` with no TPM behind the TCTI
    hinted only "Is the TPM (or swtpm) running and is the TCTI right?": now
    the hint is the doctor's fix for that kind of TCTI (a device that does
    not exist, a simulator to start), and the command changed nothing."""
    fresh_swtpm.stop()
    try:
        down = capseal("tpm", "provision", "--tcti", fresh_swtpm.tcti, check=False)
        assert down.returncode == 2 and "not reachable" in down.stderr, down.stderr
        assert "hint: start the TPM simulator" in down.stderr and "swtpm socket --tpm2" in down.stderr, down.stderr
        assert "hardware/" not in down.stderr  # a pip user has no such script
        missing = capseal("keys", "show", "tpm2:handle=0x81000101?tcti=device:/nonexistent/tpmrm9", check=False)
        assert missing.returncode == 2, missing.stderr
        assert "hint: /nonexistent/tpmrm9 does not exist" in missing.stderr and "firmware" in missing.stderr, missing.stderr
    finally:
        fresh_swtpm.start()
    listed = json.loads(capseal("keys", "list", f"tpm2:?tcti={fresh_swtpm.tcti}", "--json").stdout)
    assert listed == []  # the refused provision persisted nothing


def test_keys_create_with_a_relative_key_file_prints_a_uri_that_works_from_anywhere(swtpm: Any, tmp_path: Path) -> None:
    """`keys create 'tpm2:keyfile=seal.tss…'` printed tpm2:keyfile=seal.tss and
    recorded "seal.tss" in the custody statement: a service (or this
    operator) in another directory could not open the key with the URI it
    was told to use. Now the URI and custody name the absolute path."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    made = subprocess.run([CAPSEAL, "keys", "create", f"tpm2:keyfile=seal.tss?tcti={swtpm.tcti}", "--alg", "p256", "--json"],
                          capture_output=True, text=True, timeout=120, cwd=work, env={**os.environ, "TSS2_LOG": "all+NONE"})
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    assert info["uri"] == f"tpm2:keyfile={work / 'seal.tss'}?tcti={swtpm.tcti}", info["uri"]
    assert info["custody"]["tpm_key"]["keyfile"] == str(work / "seal.tss")
    shown = subprocess.run([CAPSEAL, "keys", "show", info["uri"], "--json"], capture_output=True, text=True,
                           timeout=120, cwd=elsewhere, env={**os.environ, "TSS2_LOG": "all+NONE"})
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["kid"] == info["kid"]
