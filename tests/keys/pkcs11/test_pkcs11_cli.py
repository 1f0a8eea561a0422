"""The operator CLI against real SoftHSM2 tokens, run as a subprocess
(``.venv/bin/capseal``) with the PIN in ``CAPSEAL_PIN``, never on the
command line: ``token init``, ``keys create|show|list``, ``doctor``, ``seal``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CAPSEAL = str(Path(sys.executable).with_name("capseal"))


def capseal(*args: str, pin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("CAPSEAL_PIN", None)
    if pin is not None:
        full_env["CAPSEAL_PIN"] = pin
    return subprocess.run([CAPSEAL, *args], capture_output=True, text=True, env=full_env, timeout=120, check=False)


def test_create_show_list_doctor_seal(softhsm: Any, tmp_path: Path) -> None:
    label = f"cli-{os.urandom(3).hex()}"
    # a token of its own: the listing below exits 1 for any key it cannot read, and
    # other files' tests leave such keys on the session's token in any order
    token = f"cli-tok-{os.urandom(3).hex()}"
    softhsm.add_token(token)
    uri = softhsm.uri(label, label=token)

    created = capseal("keys", "create", uri, "--alg", "ed25519", "--json", pin=softhsm.pin)
    assert created.returncode == 0, created.stderr
    info = json.loads(created.stdout)
    assert info["alg"] == "EdDSA" and info["custody"]["software_device"] is True

    shown = capseal("keys", "show", uri, "--json", pin=softhsm.pin)
    assert shown.returncode == 0, shown.stderr
    show = json.loads(shown.stdout)
    assert show["kid"] == info["kid"] and show["public_key_pem"].startswith("-----BEGIN PUBLIC KEY-----")
    custody = show["custody"]
    assert custody["software_device"] is True and custody["backend"] == "pkcs11"
    attrs = custody["key_attributes"]
    assert attrs["CKA_SENSITIVE"] is True and attrs["CKA_NEVER_EXTRACTABLE"] is True
    assert attrs["CKA_EXTRACTABLE"] is False and attrs["CKA_LOCAL"] is True
    assert attrs["CKA_LABEL"] == label

    listed = capseal("keys", "list", softhsm.uri(label=token), "--json", pin=softhsm.pin)
    assert listed.returncode == 0, listed.stderr
    mine = [k for k in json.loads(listed.stdout) if k["label"] == label]
    assert len(mine) == 1 and mine[0]["kid"] == info["kid"] and mine[0]["alg"] == "EdDSA"

    again = capseal("keys", "create", uri, "--alg", "ed25519", pin=softhsm.pin)
    assert again.returncode == 2 and "already exists" in again.stderr  # never overwritten

    doctor = capseal("doctor", uri, pin=softhsm.pin)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    for check in ("PKCS#11 module loads", "token present", "PIN works", "key found", "key protected"):
        assert f"[ok] {check}" in doctor.stdout

    wrong = "cli-wrong-pin-31337"
    bad = capseal("doctor", uri, pin=wrong)
    assert bad.returncode == 1 and "[FAIL] PIN works" in bad.stdout and "fix:" in bad.stdout
    assert wrong not in bad.stdout + bad.stderr

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"action_id": "po-1", "action_type": "decide",
                                "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False,
                                                "verdict_class": "executed"}}))
    ledger = tmp_path / "ledger.db"
    sealed = capseal("seal", str(spec), "--key", uri, "--ledger", str(ledger), "--operator", "acme",
                     "--developer", "agent@1", "--json", pin=softhsm.pin)
    assert sealed.returncode == 0, sealed.stderr
    assert json.loads(sealed.stdout)["key_id"] == info["kid"]
    verified = capseal("verify", str(ledger))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    for proc in (created, shown, listed, again, doctor, sealed):
        assert softhsm.pin not in proc.stdout + proc.stderr


def test_errors_are_one_line_and_typed(softhsm: Any) -> None:
    missing = capseal("keys", "show", softhsm.uri("k", label="no-such-token"), pin=softhsm.pin)
    assert missing.returncode == 2 and "no-such-token" in missing.stderr and "Traceback" not in missing.stderr
    nokey = capseal("keys", "show", softhsm.uri("no-such-key"), pin=softhsm.pin)
    # the token answered and the key is not on it: exit 1 (not ok), as a missing object; a missing token is 2
    assert nokey.returncode == 1 and "no-such-key" in nokey.stderr and softhsm.label in nokey.stderr
    broken = capseal("doctor", softhsm.uri("k"), pin=softhsm.pin, env={"SOFTHSM2_CONF": "/nonexistent/softhsm2.conf"})
    assert broken.returncode == 1 and "[FAIL] PKCS#11 module loads" in broken.stdout
    assert "SOFTHSM2_CONF" in broken.stdout


def test_token_init_then_keys_with_pin_source(softhsm: Any, tmp_path: Path) -> None:
    user_pin, so_pin = "init-user-2468", "init-so-13579"
    made = capseal("token", "init", "--dir", str(tmp_path / "tok"), "--label", "dev-token", "--so-pin-env", "SO_PIN",
                   "--json", pin=user_pin, env={"SO_PIN": so_pin})
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    assert info["label"] == "dev-token" and Path(info["softhsm2_conf"]).is_file() and info["serial"]
    assert user_pin not in made.stdout + made.stderr and so_pin not in made.stdout + made.stderr
    env = {"SOFTHSM2_CONF": info["softhsm2_conf"]}
    uri = info["uri"].replace("?", ";object=seal-key?")
    created = capseal("keys", "create", uri, "--alg", "p256", "--json", pin=user_pin, env=env)
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["custody"]["device"]["token_label"] == "dev-token"

    # no PINs given: both are generated into 0600 files, and pin-source= in the URI works without CAPSEAL_PIN
    auto = capseal("token", "init", "--dir", str(tmp_path / "auto"), "--label", "auto-token", "--json")
    assert auto.returncode == 0, auto.stderr
    auto_info = json.loads(auto.stdout)
    pin_file = Path(auto_info["pin_source"])
    assert oct(pin_file.stat().st_mode & 0o777) == "0o600" and Path(auto_info["so_pin_file"]).is_file()
    assert pin_file.read_text().strip() not in auto.stdout
    auto_uri = auto_info["uri"].replace("?", ";object=k?")
    auto_env = {"SOFTHSM2_CONF": auto_info["softhsm2_conf"]}
    assert capseal("keys", "create", auto_uri, "--alg", "ed25519", env=auto_env).returncode == 0
    doctor = capseal("doctor", auto_uri, env=auto_env)
    assert doctor.returncode == 0 and "[ok] PIN works" in doctor.stdout, doctor.stdout

    dup = capseal("token", "init", "--dir", str(tmp_path / "tok"), "--label", "dev-token", "--so-pin-env", "SO_PIN",
                  pin=user_pin, env={"SO_PIN": so_pin})
    assert dup.returncode == 2 and "already exists" in dup.stderr


@pytest.mark.parametrize("alg", ["p256", "rsa-pss"])
def test_keys_create_other_algorithms(alg: str, softhsm: Any) -> None:
    uri = softhsm.uri(f"cli-{alg}-{os.urandom(3).hex()}")
    created = capseal("keys", "create", uri, "--alg", alg, "--json", pin=softhsm.pin)
    assert created.returncode == 0, created.stderr
    info = json.loads(created.stdout)
    assert info["alg"] == {"p256": "ES256", "rsa-pss": "PS256"}[alg]
    assert info["custody"]["key_attributes"]["CKA_NEVER_EXTRACTABLE"] is True


def test_token_init_checks_everything_before_writing(tmp_path: Path) -> None:
    """A second run in the same --dir, a bad PIN, an unset --so-pin-env and a
    module off the allow-list are typed errors; none of them writes a file."""
    first = capseal("token", "init", "--dir", str(tmp_path / "tok"), "--label", "first")
    assert first.returncode == 0, first.stderr
    pin_files = {p: p.read_bytes() for p in (tmp_path / "tok" / "user-pin", tmp_path / "tok" / "so-pin")}
    again = capseal("token", "init", "--dir", str(tmp_path / "tok"), "--label", "second")
    assert again.returncode == 2 and "internal error" not in again.stderr, again.stderr
    assert "user-pin already exists" in again.stderr and "never overwrites" in again.stderr
    assert {p: p.read_bytes() for p in pin_files} == pin_files

    refusals = [
        (["--label", "short-pin", "--pin-env", "USER_PIN"], {"USER_PIN": "123"}, "4 to 255"),
        (["--label", "empty-so", "--so-pin-env", "SO_PIN"], {"SO_PIN": ""}, "SO_PIN is empty"),
        (["--label", "unset-so", "--so-pin-env", "CAPSEAL_TEST_UNSET_SO"], {}, "CAPSEAL_TEST_UNSET_SO is not set"),
        (["--label", "x" * 33], {}, "1 to 32 bytes"),
        (["--label", "not-allowed"], {"CAPSEAL_PKCS11_MODULES": "/nonexistent/libpkcs11.so"}, "allow-list"),
    ]
    for i, (args, env, needle) in enumerate(refusals):
        target = tmp_path / f"refused-{i}"
        proc = capseal("token", "init", "--dir", str(target), *args, env=env)
        assert proc.returncode == 2 and needle in proc.stderr and "internal error" not in proc.stderr, proc.stderr
        assert not target.exists(), (args, sorted(p.name for p in target.rglob("*")))


def test_doctor_reads_the_module_path_as_the_uri_parser_does(softhsm: Any) -> None:
    """The doctor's system check took the text after the first "module-path="
    anywhere in the URI: inside an object label it checked a file that the URI
    does not name, and inside a pin-value it printed that part of the PIN."""
    from capseal.keys.doctor import run_doctor

    def module_check(uri: str) -> Any:
        (check,) = [c for c in run_doctor(uri) if c.name == "PKCS#11 module"]
        return check

    in_label = f"pkcs11:token=no-such-token-dr;object=module-path=x?module-path={softhsm.module}"
    check = module_check(in_label)
    assert check.ok and check.detail == f"{softhsm.module} is readable", check
    in_pin = f"pkcs11:token=no-such-token-dr?pin-value=module-path=Zq7SECRET&module-path={softhsm.module}"
    checks = run_doctor(in_pin)
    assert module_check(in_pin).ok
    assert not any("Zq7SECRET" in c.detail + c.fix for c in checks), checks


def test_token_init_into_a_file_is_a_typed_error(tmp_path: Path) -> None:
    """--dir naming a file (or a path under one): a one-line error naming the
    directory, exit 2. It was "internal error: NotADirectoryError" from the
    CLI, and a bare OSError from init_softhsm_token."""
    from capseal.errors import InputError
    from capseal.keys.pkcs11 import init_softhsm_token

    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    for target in (afile, afile / "sub"):
        proc = capseal("token", "init", "--dir", str(target), "--label", "x")
        assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr
        assert str(target) in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        with pytest.raises(InputError, match="directory"):
            init_softhsm_token(target, "x")
    assert afile.read_text() == "not a directory\n"


def _own_token(tmp_path: Path, user_pin: str) -> tuple[str, dict[str, str], Path]:
    """A `capseal token init` token of the test's own (its softhsm2.conf is
    read by the CLI subprocesses only): its URI, env and conf file."""
    made = capseal("token", "init", "--dir", str(tmp_path / "tok"), "--label", "no-mech", "--so-pin-env", "SO_PIN",
                   "--json", pin=user_pin, env={"SO_PIN": "no-mech-so-97531"})
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    return info["uri"], {"SOFTHSM2_CONF": info["softhsm2_conf"]}, Path(info["softhsm2_conf"])


def test_keys_create_refuses_an_algorithm_the_token_cannot_sign_with_before_making_a_key(tmp_path: Path) -> None:
    """A token that generates RSA (or Ed25519) keys but cannot sign PSS (or
    EdDSA) with them, as many smart cards: `keys create` generated the pair,
    then failed with a bare "the token has neither CKM_SHA256_RSA_PKCS_PSS nor
    CKM_RSA_PKCS_PSS" naming no token, and left the new key on it without
    saying so (a second try: "already exists"). Now it checks the token's
    mechanisms first and writes nothing; and for a key already there that the
    token cannot sign with, the doctor's fix is no longer "create it"."""
    user_pin = "no-mech-pin-8642"
    uri, env, conf = _own_token(tmp_path, user_pin)
    made_before = capseal("keys", "create", uri.replace("?", ";object=old-rsa?"), "--alg", "rsa-pss", pin=user_pin, env=env)
    assert made_before.returncode == 0, made_before.stderr
    off = ["CKM_EDDSA", "CKM_RSA_PKCS_PSS", "CKM_SHA1_RSA_PKCS_PSS", "CKM_SHA224_RSA_PKCS_PSS",
           "CKM_SHA256_RSA_PKCS_PSS", "CKM_SHA384_RSA_PKCS_PSS", "CKM_SHA512_RSA_PKCS_PSS"]
    # SoftHSM2 2.6.1 ignored the first name after the "-": an unknown one goes first
    conf.write_text(conf.read_text() + "slots.mechanisms = -CKM_NONE," + ",".join(off) + "\n")

    for alg, label, missing in (("rsa-pss", "new-rsa", "CKM_RSA_PKCS_PSS"), ("ed25519", "new-ed", "CKM_EDDSA")):
        proc = capseal("keys", "create", uri.replace("?", f";object={label}?"), "--alg", alg, pin=user_pin, env=env)
        assert proc.returncode == 2 and "internal error" not in proc.stderr, proc.stderr
        assert missing in proc.stderr and "'no-mech'" in proc.stderr and "nothing was created" in proc.stderr, proc.stderr
        assert "hint:" in proc.stderr
    listed = capseal("keys", "list", uri, "--json", pin=user_pin, env=env)
    assert listed.returncode == 0, listed.stderr
    assert [k["label"] for k in json.loads(listed.stdout)] == ["old-rsa"]
    assert capseal("keys", "create", uri.replace("?", ";object=new-p256?"), "--alg", "p256",
                   pin=user_pin, env=env).returncode == 0  # what the hint suggests works

    doctor = capseal("doctor", uri.replace("?", ";object=old-rsa?"), pin=user_pin, env=env)
    assert doctor.returncode == 1 and "[FAIL] key found" in doctor.stdout, doctor.stdout
    assert "CKM_RSA_PKCS_PSS" in doctor.stdout and "old-rsa" in doctor.stdout
    assert "create it" not in doctor.stdout, doctor.stdout
    for proc in (made_before, listed, doctor):
        assert user_pin not in proc.stdout + proc.stderr


def test_doctor_reports_an_unreadable_pin_as_a_check_after_the_others(softhsm: Any, tmp_path: Path) -> None:
    """`capseal doctor URI --pin-file F` with F readable by every user (or an
    unset --pin-env) exited 2 with that one error and ran no check: module,
    config and token went unreported. Now the checks that need no PIN run and
    "PIN works" fails with the refusal and its fix; exit 1 (something failed)."""
    pin_file = tmp_path / "token.pin"
    pin_file.write_text(softhsm.pin + "\n")
    pin_file.chmod(0o644)
    uri = softhsm.uri("any-key")
    for args in (["--pin-file", str(pin_file)], ["--pin-env", "CAPSEAL_TEST_UNSET_PIN_VAR"]):
        proc = capseal("doctor", uri, *args)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        for check in ("PKCS#11 module loads", "token present"):
            assert f"[ok] {check}" in proc.stdout, proc.stdout
        assert "[FAIL] PIN works" in proc.stdout and "key found" not in proc.stdout, proc.stdout
        assert ("chmod 600" in proc.stdout) if "--pin-file" in args else ("is not set" in proc.stdout), proc.stdout
        assert softhsm.pin not in proc.stdout + proc.stderr
    as_json = capseal("doctor", uri, "--json", "--pin-file", str(pin_file))
    assert as_json.returncode == 1 and json.loads(as_json.stdout)[-1]["name"] == "PIN works", as_json.stdout


def test_doctor_fix_for_a_uri_naming_no_module_is_to_name_one(softhsm: Any) -> None:
    """A pkcs11 URI without module-path/module-name: the detail said "add
    ?module-path=…" but the fix line said "install the module", which an
    operator with the module installed cannot act on."""
    proc = capseal("doctor", f"pkcs11:token={softhsm.label};object=k", pin=softhsm.pin)
    assert proc.returncode == 1 and "[FAIL] PKCS#11 module loads" in proc.stdout, proc.stdout
    fix = proc.stdout.split("[FAIL] PKCS#11 module loads", 1)[1].split("fix:", 1)[1].splitlines()[0]
    assert "module-path=" in fix and "install" not in fix, fix


def test_doctor_checks_the_module_file_and_softhsm_config_for_module_name(softhsm: Any) -> None:
    """With module-name= instead of module-path=, check 2 (the module file,
    and for SoftHSM2 that SOFTHSM2_CONF exists) was skipped altogether."""
    uri = f"pkcs11:token={softhsm.label};object=k?module-name=softhsm2"
    good = capseal("doctor", uri, pin=softhsm.pin)
    assert "[ok] PKCS#11 module: " in good.stdout and "libsofthsm2.so is readable" in good.stdout, good.stdout
    assert f"[ok] SoftHSM2 config: {softhsm.conf} exists" in good.stdout, good.stdout
    broken = capseal("doctor", uri, pin=softhsm.pin, env={"SOFTHSM2_CONF": "/nonexistent/softhsm2.conf"})
    assert broken.returncode == 1 and "[FAIL] SoftHSM2 config: /nonexistent/softhsm2.conf is missing" in broken.stdout


def test_token_init_env_line_survives_a_directory_with_a_space(tmp_path: Path) -> None:
    """The printed "env" is pasted after `export`; with a --dir holding a
    space it was unquoted, and the shell split it (SOFTHSM2_CONF got the
    part before the space)."""
    made = capseal("token", "init", "--dir", str(tmp_path / "my tokens"), "--label", "spaced", "--json")
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    shell = subprocess.run(["bash", "-c", f'export {info["env"]}; printf %s "$SOFTHSM2_CONF"'],
                           capture_output=True, text=True, check=True)
    assert shell.stdout == info["softhsm2_conf"]
