"""`capseal doctor` on a real swtpm: it reads the DA lockout bit (not the
"lockout password set" bit), never changes the TPM (another process's
transient objects survive and are reported), and checks one TCTI throughout."""

from __future__ import annotations

import grp
import json
import os
import pwd
import socket
from pathlib import Path
from typing import Any

import pytest
from tpm2_pytss import ESAPI
from tpm2_pytss.constants import ESYS_TR
from tpm2_pytss.types import TPM2B_AUTH, TPM2B_SENSITIVE_CREATE

from capseal.errors import PinIncorrectError, PinLockedError
from capseal.keys import open_signer
from capseal.keys.doctor import run_doctor
from capseal.keys.tpm import create_key, doctor_checks, get_device, srk_template


def _by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_lockout_check_reads_in_lockout_not_lockout_auth_set(fresh_swtpm: Any, tmp_path: Path) -> None:
    """A lockout password alone is not a lockout (the old check read that bit,
    0x4, and failed); three wrong PINs on a DA-protected key are (0x200, which
    the old check missed)."""
    tcti = fresh_swtpm.tcti
    with ESAPI(tcti) as ectx:
        ectx.hierarchy_change_auth(ESYS_TR.LOCKOUT, TPM2B_AUTH(b"lockout-pw"))
    lockout = _by_name(doctor_checks(None, tcti=tcti))["TPM lockout"]
    assert lockout.ok, lockout
    assert "not in dictionary-attack lockout (0 of 3 failed authorizations" in lockout.detail

    uri = f"tpm2:keyfile={tmp_path / 'da.tss'}?tcti={tcti}"
    create_key(uri, "p256", pin="right-pin").close()  # with an auth value: DA-protected
    try:
        for _ in range(3):
            with pytest.raises(PinIncorrectError):
                open_signer(uri, pin="wrong-pin").sign(b"x")
        with pytest.raises(PinLockedError):
            open_signer(uri, pin="wrong-pin").sign(b"x")
    finally:
        get_device(tcti).close()
    lockout = _by_name(doctor_checks(None, tcti=tcti))["TPM lockout"]
    assert not lockout.ok and f"TPM {tcti} is in dictionary-attack lockout" in lockout.detail
    assert "tpm2_dictionarylockout -c -p LOCKOUT_PASSWORD" in lockout.fix and tcti in lockout.fix


def test_doctor_reports_another_process_objects_and_leaves_them_loaded(fresh_swtpm: Any) -> None:
    """Another connection holds all three transient slots: doctor says so (a
    FAIL naming the handles and the fix) and the objects are still there
    afterwards. It used to connect like a signer, flushing them first, so the
    slot check could never fail and doctor destroyed the other's work."""
    tcti = fresh_swtpm.tcti
    other = ESAPI(tcti)
    try:
        held = [other.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)[0] for _ in range(3)]
        handles = [f"0x{other.tr_get_tpm_handle(tr):08x}" for tr in held]
        slots = _by_name(doctor_checks(None, tcti=tcti))["TPM object slots"]
        assert not slots.ok
        assert f"3 transient object(s) on TPM {tcti} that capseal did not load: {', '.join(handles)}" in slots.detail
        assert "stop it" in slots.fix and "tpm2_flushcontext -t" in slots.fix
        for tr in held:
            other.read_public(tr)  # still loaded: doctor flushed nothing
            other.flush_context(tr)
    finally:
        other.close()
    assert _by_name(doctor_checks(None, tcti=tcti))["TPM object slots"].ok


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_doctor_uses_one_tcti_for_every_check(swtpm: Any) -> None:
    """--tcti and the URI's tcti= must agree (else one FAIL and no TPM checks);
    the URI's TCTI comes from the URI parser (a key file path containing
    "tcti=" is not the TCTI); the fix for a simulator that does not answer
    talks about the simulator, not /dev/tpmrm0 and the tss group."""
    uri = f"tpm2:handle=0x81000101?tcti={swtpm.tcti}"
    other = f"mssim:host=127.0.0.1,port={_closed_port()}"
    names = [c.name for c in run_doctor(uri, tcti=other)]
    refusal = [c for c in run_doctor(uri, tcti=other) if c.name == "TPM TCTI"]
    assert len(refusal) == 1 and not refusal[0].ok and other in refusal[0].detail and swtpm.tcti in refusal[0].detail
    assert "TPM answers" not in names and "TPM device" not in names

    tricky = f"tpm2:keyfile=/nonexistent/tcti=device:/dev/tpm9?tcti={swtpm.tcti}"
    checks = _by_name(run_doctor(tricky))
    assert "TPM device" not in checks  # no device check for a "device:/dev/tpm9…" read out of the path
    assert checks["TPM answers"].ok and swtpm.tcti in checks["TPM answers"].detail

    down = _by_name(run_doctor(None, tcti=other))["TPM answers"]
    assert not down.ok and other in down.fix
    assert "/dev/tpmrm0" not in down.fix and "tss" not in down.fix
    empty = _by_name(run_doctor(None, tcti=""))
    assert not empty["TPM TCTI"].ok and "TPM answers" not in empty


def _tss_check_as(uid: int, gid: int, groups: list[int]) -> dict[str, Any]:
    """The doctor's "tss group" check run in a fork that dropped to ``uid``
    with exactly these groups (the process's groups, as a login gives them)."""
    from capseal.keys.doctor import _tss_group_check

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            os.write(write_end, json.dumps(_tss_group_check().to_dict()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(data)
    return result


def test_tss_group_check_says_only_what_is_so() -> None:
    """The check said "user root is in group tss" for root, who is not (it
    passed any uid 0), and passed a user listed in the group whose session
    started before (usermod -aG needs a new login), so it said ok while the
    device could not be opened. Now it says which of these holds."""
    tss = grp.getgrnam("tss")  # made by the swtpm packages `make deps` installs
    (check,) = [c for c in run_doctor(tcti="device:/nonexistent/tpmrm0") if c.name == "tss group"]
    user = pwd.getpwuid(os.getuid()).pw_name
    has_group = tss.gr_gid in os.getgroups() or os.getegid() == tss.gr_gid
    assert check.ok == (has_group or os.geteuid() == 0), check
    if "is in group tss" in check.detail or "has group tss" in check.detail:
        assert has_group or user in tss.gr_mem, check
    if os.geteuid() == 0:  # as root, also look from a user's side
        nobody = pwd.getpwnam("nobody")
        with_group = _tss_check_as(nobody.pw_uid, nobody.pw_gid, [tss.gr_gid])
        assert with_group["ok"] and "has group tss" in with_group["detail"], with_group
        without = _tss_check_as(nobody.pw_uid, nobody.pw_gid, [])
        assert not without["ok"] and "is not in group tss" in without["detail"], without
        assert "usermod -aG tss nobody" in without["fix"], without
